"""Lab 12 spec: an FP8 (e4m3) KV cache with scales, its Triton decode kernel, and cascade
attention over a shared prefix.

Expected values come from the test's own oracles, never from the code under test:

* the e4m3 grid is PyTorch's ``torch.float8_e4m3fn`` (every byte 0..255 viewed as e4m3 and
  widened to float64); rounding is to the nearest grid value, ties to the even byte (the
  OCP 8-bit floating point specification, "OFP8", 2023), saturating at ±448;
* attention comes from the dense float64 reference in ``common.reference``, applied to the
  dequantised cache ``grid[byte] * scale``.

Poison: unused slots of an fp8 cache hold the byte 0x7F (e4m3's NaN; Triton's interpreter
widens it to 480, so there it shows as a wrong number, on a GPU as NaN) and, per
token-head, a NaN scale; suffix padding in the cascade is NaN.

Run:  LAB_IMPL=starter pytest labs/lab-12-fp8-kv-and-cascade -q   (grades starter.py)
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common.loader import load_impl
from common.paged import blocks_needed, build_paged_kv
from common.reference import reference_attention, reference_decode
from common.testing import (
    BadInputs,
    assert_close,
    assert_no_races,
    assert_value_error_names,
    bad_input_test,
    basic_value_test,
    called_on_copies,
    head_counts,
    host_syncs,
    kernel_memory,
    sm90_compile_test,
    strided_view,
    tolerance,
)
from common.triton_env import DEVICE

impl = called_on_copies(load_impl(__file__), writes={
    "reshape_and_cache_fp8": (2, 3, 5, 6, "k_cache", "v_cache", "k_scale", "v_scale")})

F64 = dict(atol=1e-12, rtol=1e-12)
ATOL32, RTOL32 = tolerance("float32")
F32 = dict(atol=ATOL32, rtol=RTOL32)
E4M3_MAX = 448.0
NAN_BYTE = 0x7F

# The oracle grid: PyTorch's float8_e4m3fn, every byte, in float64 (NaN at 0x7F and 0xFF).
GRID = (torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
        .double().numpy())
FINITE = np.flatnonzero(np.isfinite(GRID))

SATURATION = ("values beyond 448 * scale must saturate to ±448 (the largest e4m3 value): "
              "clip x / scale to [-448, 448] before rounding")
NAN_ON_OVERFLOW = ("a value beyond 448 * scale became the NaN byte 0x7F/0xFF: e4m3 has no "
                   "infinity, so an unclipped overflow rounds onto the NaN pattern. Clip first")
GIVEN_SCALE = (" (the scale here is given, as a calibrated k_scale is: a given scale does "
               "not bound the data, so clip whatever the scale's origin)")
FLUSHED = ("it equals the values with every overflow set to 0: saturating means clamping to "
           "±448, not dropping the value")
TRUNCATION = ("it equals rounding toward zero (truncating the mantissa): round to the NEAREST "
              "grid value, ties to an even mantissa (np.rint), or the error doubles and is biased")
SWAPPED = "it equals attention with k_scale and v_scale swapped"
MODULO_HEADS = ("it equals attention where query head h reads KV head h % num_kv_heads: a "
                "group is consecutive query heads, KV head h // (num_heads // num_kv_heads)")
K_TWICE = ("it equals attention with k_scale applied twice: fold it into the score scale OR "
           "multiply the keys by it, not both")
V_FORGOTTEN = "it equals attention over V without v_scale: multiply the output by v_scale"
V_IN_L = ("it equals attention whose denominator l also carries v_scale: per token-head, "
          "v_scale weights the rows of V in P @ V only; l sums the unscaled p")
AS_INTEGERS = ("it equals attention over the byte values 0..255 as integers: bitcast the uint8 "
               "bytes to tl.float8e4nv (.to(tl.float8e4nv, bitcast=True)) before widening")
NO_RESCALE = ("it equals the prefix and suffix outputs averaged without their weights: merge "
              "with w_x = exp(lse_x - lse), lse = log(exp(lse_p) + exp(lse_s)) (lab 04's rule)")
PREFIX_TWICE = "it equals attention with the prefix counted twice (merged in once too many)"
BY_KEY_COUNT = ("it equals each side weighted by its share of the keys, P / (P + n): then "
                "where the prefix ends changes the answer. Weight by exp(lse_x - lse), the "
                "share of the softmax mass, and the merge is exact at every split point")
LSE_HINT = "lse = m + log(l) in natural log; merged: log(exp(lse_prefix) + exp(lse_suffix))"


# ---- the oracles --------------------------------------------------------------------------


def nearest_e4m3(y: np.ndarray) -> np.ndarray:
    """Float64 ``y`` (already divided by its scale) rounded to the e4m3 grid: clipped to
    ±448, then the nearest finite grid value, ties to the even byte."""
    y = np.clip(np.asarray(y, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    dist = np.abs(y[..., None] - GRID[FINITE])  # [..., 254]
    best = dist.min(axis=-1, keepdims=True)
    tied = dist == best
    even = tied & (FINITE % 2 == 0)
    pick = np.where(even.any(axis=-1), np.argmax(even, axis=-1), np.argmax(tied, axis=-1))
    return GRID[FINITE][pick]


def oracle_bytes(y: np.ndarray) -> np.ndarray:
    """The e4m3 byte of each float64 ``y`` (PyTorch's conversion, after clipping)."""
    clipped = torch.tensor(np.clip(y, -E4M3_MAX, E4M3_MAX), dtype=torch.float64)
    return clipped.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def decoded(bits) -> np.ndarray:
    """The grid values of the bytes ``bits`` (checked to be uint8)."""
    bits = np.asarray(bits)
    assert bits.dtype == np.uint8, f"the quantised bytes must be uint8, got {bits.dtype}"
    return GRID[bits]


def outlier_kv(rng: np.random.Generator, tokens: int = 64, heads: int = 2,
               head_dim: int = 32, token_factor: float = 1000.0) -> np.ndarray:
    """K with outliers: most channels ~N(0, 1), two outlier channels ~20x, and the first
    token ``token_factor`` times larger (1000x by default: an extreme, to show the mechanism)."""
    x = rng.standard_normal((tokens, heads, head_dim))
    x[..., [1, head_dim - 3]] *= 20.0
    x[:1] *= token_factor
    return x


# ---- e4m3 in numpy ------------------------------------------------------------------------


@pytest.mark.points(2)
@given(seed=st.integers(0, 2**16), spread=st.sampled_from([1e-3, 0.3, 1.0, 40.0]))
@basic_value_test
def test_quantize_rounds_each_value_to_the_nearest_e4m3_value(seed, spread):
    """Per-tensor scale; values spanning the subnormals to 448."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 2, 8)) * spread
    bits, scale = impl.quantize_kv(x)
    scale = np.float64(np.asarray(scale).reshape(()))
    want = nearest_e4m3(x / scale)
    y = np.clip(x / scale, -E4M3_MAX, E4M3_MAX)
    positive = GRID[:127]  # bytes 0..126 in increasing order
    truncated = np.sign(y) * positive[np.searchsorted(positive, np.abs(y), side="right") - 1]
    flushed = np.where(np.abs(x / scale) > E4M3_MAX, 0.0, want)  # float32 scale: a hair over
    assert_close(decoded(bits), want, what="the e4m3 values of quantize_kv(x)",
                 wrong_answers={TRUNCATION: truncated, FLUSHED: flushed}, atol=0, rtol=0)


@pytest.mark.points(1)
def test_ties_round_to_the_even_mantissa():
    """Halfway between two grid values: 1.0625 sits between 1.0 and 1.125 (-> 1.0, even),
    1.1875 between 1.125 and 1.25 (-> 1.25, even); 232 between 224 and 240 (-> 224)."""
    x = np.array([[1.0625, 1.1875, 232.0, -1.0625]])
    bits, _ = impl.quantize_kv(x, np.float32(1.0))
    assert_close(decoded(bits), np.array([[1.0, 1.25, 224.0, -1.0]]), what="ties", atol=0,
                 rtol=0, hint="round half to even (np.rint), as IEEE and OFP8 do")


@pytest.mark.points(1)
@given(seed=st.integers(0, 2**16), spread=st.sampled_from([1e-4, 1.0, 300.0]))
def test_the_per_tensor_scale_is_amax_over_448(seed, spread):
    x = np.random.default_rng(seed).standard_normal((5, 3, 7)) * spread
    _, scale = impl.quantize_kv(x, per="tensor")
    scale = np.asarray(scale)
    amax = np.abs(x).max()
    assert scale.size == 1, f"per='tensor' returns one scale, got shape {scale.shape}"
    assert_close(scale.reshape(()), np.float32(amax / 448), what="the per-tensor scale",
                 rtol=1e-7, atol=0, wrong_answers={
                     "it equals amax / 240: 240 is the max of e4m3fnuz (AMD's variant); "
                     "float8_e4m3fn reaches 448": np.float32(amax / 240),
                     "it equals amax / 127, an int8 scale": np.float32(amax / 127)})


@pytest.mark.points(1)
def test_the_per_token_head_scale_is_each_rows_amax_over_448():
    rng = np.random.default_rng(3)
    x = outlier_kv(rng, tokens=6, heads=3, head_dim=8)
    x[2, 1] = 0.0  # an all-zero row: any positive scale will do, it must not be 0 or NaN
    _, scale = impl.quantize_kv(x, per="token_head")
    scale = np.asarray(scale, dtype=np.float64)
    assert scale.shape == (6, 3), f"per='token_head' gives one scale per [token, head]: shape " \
        f"(6, 3), got {scale.shape}"
    assert np.isfinite(scale).all() and (scale > 0).all(), (
        f"every scale must be finite and > 0 (an all-zero row too), got {scale[2, 1]}")
    want = np.abs(x).max(axis=-1) / 448
    ok = np.ones_like(want, dtype=bool)
    ok[2, 1] = False
    one = np.full(ok.sum(), np.abs(x).max() / 448, dtype=np.float32)
    assert_close(scale[ok], want[ok].astype(np.float32), what="the per-token-head scales",
                 rtol=1e-7, atol=0, hint="amax over the head_dim axis only, per token and head",
                 wrong_answers={"it equals one scale for the whole tensor: per token-head, "
                                "each [token, head] row gets its own amax / 448": one})


@pytest.mark.points(2)
@given(seed=st.integers(0, 2**16), per=st.sampled_from(["tensor", "token_head"]))
def test_the_round_trip_error_is_at_most_half_a_grid_step(seed, per):
    """OFP8 e4m3 has 3 mantissa bits: a normal value is off by at most 2^-4 of itself; below
    the smallest normal 2^-6 the grid step is 2^-9, so at most 2^-10 (times the scale)."""
    x = outlier_kv(np.random.default_rng(seed), tokens=8)
    bits, scale = impl.quantize_kv(x, per=per)
    scale = np.asarray(scale, dtype=np.float64)
    back = impl.dequantize_kv(bits, scale)
    s = scale if scale.ndim == 0 else scale[..., None]
    bound = np.maximum(2.0**-4 * np.abs(x), 2.0**-10 * s) * (1 + 1e-9)
    err = np.abs(np.asarray(back) - x)
    worst = np.unravel_index(int(np.argmax(err / bound)), x.shape)
    assert (err <= bound).all(), (
        f"per={per!r}: |dequantize(quantize(x)) - x| = {err[worst]:.3g} at {worst} exceeds "
        f"half a grid step ({bound[worst]:.3g}): round to the nearest value, and dequantize as "
        "grid[byte] * scale")


@pytest.mark.points(2)
def test_values_beyond_448_times_the_scale_saturate_and_never_become_nan():
    x = np.array([[447.0, 460.0, 465.0, 500.0, 1e4, 3e38, -470.0, -1e6]])
    bits, _ = impl.quantize_kv(x, np.float32(1.0))
    bits = np.asarray(bits)
    assert bits.dtype == np.uint8, f"bytes must be uint8, got {bits.dtype}"
    values = GRID[bits]
    want = np.array([[448.0, 448.0, 448.0, 448.0, 448.0, 448.0, -448.0, -448.0]])
    nan_bytes = np.isin(bits, [0x7F, 0xFF])
    assert_close(values, want, what="quantize_kv of values past 448", atol=0, rtol=0,
                 nan_hint=(NAN_ON_OVERFLOW + GIVEN_SCALE) if nan_bytes.any() else SATURATION,
                 wrong_answers={FLUSHED: np.where(np.abs(x) > 464, 0.0, want)}, hint=SATURATION)


@pytest.mark.points(1)
def test_a_float32_scale_just_below_amax_over_448_still_never_overflows():
    """``scale = float32(amax / 448)`` may round down, putting ``amax / scale`` a hair above
    448: the largest value must still come back as ±448, not NaN (round to nearest brings it
    back: the next grid value, 480, lies past the midpoint 464)."""
    rng = np.random.default_rng(11)
    found = 0
    for _ in range(200):
        x = rng.standard_normal((4, 1, 8)) * 10
        amax = np.abs(x).max()
        if amax / np.float64(np.float32(amax / 448)) > 448:
            found += 1
            bits, _ = impl.quantize_kv(x)
            assert not np.isin(np.asarray(bits), [0x7F, 0xFF]).any(), NAN_ON_OVERFLOW
    assert found, "test setup: no case with amax / scale > 448 was drawn"


@pytest.mark.points(1)
def test_dequantize_multiplies_the_grid_value_by_the_scale():
    rng = np.random.default_rng(4)
    bits = rng.choice(FINITE, size=(3, 2, 8)).astype(np.uint8)
    scale = np.array([[0.5, 2.0], [0.25, 4.0], [1.5, 0.125]], dtype=np.float32)
    got = impl.dequantize_kv(bits, scale)
    want = GRID[bits] * scale[..., None]
    assert_close(got, want, what="dequantize_kv per token-head", **F64, wrong_answers={
        "it equals grid / scale: the scale multiplies (x ≈ grid[byte] * scale)":
            GRID[bits] / scale[..., None]})
    got = impl.dequantize_kv(bits, np.float32(0.75))
    assert_close(got, GRID[bits] * 0.75, what="dequantize_kv per tensor", **F64)


@pytest.mark.points(2)
def test_per_token_head_scales_keep_an_outlier_token_from_crushing_the_others():
    """K with two outlier channels (20x) and an outlier first token (1000x). One scale for the
    tensor is set by that token, so every other token's small channels fall into e4m3's
    subnormals; a scale per token-head confines the damage to the token itself. bf16 and
    fp16, for comparison, keep 8 and 11 significant bits whatever the neighbours."""
    x = outlier_kv(np.random.default_rng(5))
    rest = np.s_[1:]  # every token but the outlier
    errors = {}
    for per in ("tensor", "token_head"):
        bits, scale = impl.quantize_kv(x, per=per)
        back = np.asarray(impl.dequantize_kv(bits, scale))
        errors[per] = float(np.linalg.norm(back[rest] - x[rest]) / np.linalg.norm(x[rest]))
    bf16 = torch.tensor(x).to(torch.bfloat16).double().numpy()
    errors["bf16"] = float(np.linalg.norm(bf16[rest] - x[rest]) / np.linalg.norm(x[rest]))
    summary = ", ".join(f"{k}: {v:.2%}" for k, v in errors.items())
    assert errors["token_head"] < 2.0**-4, f"per token-head error too large ({summary})"
    assert errors["tensor"] > 1.5 * errors["token_head"], (
        f"relative error of the non-outlier tokens ({summary}): a per-tensor scale is set by "
        "the outlier token, so it should hurt the rest clearly more than per token-head "
        "scales do. Does quantize_kv honour per=?")


BAD_NUMPY_CALLS: BadInputs = {
    "quantize: per is neither 'tensor' nor 'token_head'": (
        "per", lambda: impl.quantize_kv(np.ones((2, 4)), per="channel")),
    "quantize: a per-token-head scale of the wrong shape": (
        "scale", lambda: impl.quantize_kv(np.ones((3, 2, 4)), np.ones(3, np.float32),
                                          per="token_head")),
    "quantize: a per-tensor scale with several elements": (
        "scale", lambda: impl.quantize_kv(np.ones((3, 2, 4)), np.ones(2, np.float32))),
    "quantize: a zero scale": (
        "scale", lambda: impl.quantize_kv(np.ones((3, 4)), np.float32(0.0))),
    "quantize: integer x": ("x", lambda: impl.quantize_kv(np.ones((3, 4), np.int32))),
    "dequantize: float bits": ("bits", lambda: impl.dequantize_kv(np.ones((3, 4)), 1.0)),
    "dequantize: scale of the wrong shape": (
        "scale", lambda: impl.dequantize_kv(np.ones((3, 2, 4), np.uint8), np.ones(3))),
}

test_bad_numpy_input_raises_a_value_error_that_names_the_argument = bad_input_test(
    BAD_NUMPY_CALLS, points=0.5)


# ---- the write path ------------------------------------------------------------------------


def empty_fp8_cache(num_blocks: int, block_size: int, kv_heads: int, head_dim: int):
    """Poisoned uint8 caches (every byte 0x7F, e4m3's NaN) and NaN per-token-head scales."""
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = np.full(shape, NAN_BYTE, dtype=np.uint8)
    scales = np.full(shape[:3], np.nan, dtype=np.float32)
    return k_cache, k_cache.copy(), scales, scales.copy()


@pytest.mark.points(2)
@given(block_size=st.sampled_from([1, 3, 16]), n=st.integers(1, 20), heads=head_counts(),
       per=st.sampled_from(["tensor", "token_head"]), seed=st.integers(0, 2**16))
def test_reshape_and_cache_fp8_quantises_each_token_into_its_slot_and_nothing_else(
    block_size, n, heads, per, seed
):
    rng = np.random.default_rng(seed)
    _, kv_heads = heads
    head_dim = 8
    num_blocks = blocks_needed(n, block_size) + 2
    k_cache, v_cache, k_scales, v_scales = empty_fp8_cache(num_blocks, block_size, kv_heads,
                                                           head_dim)
    slots = rng.permutation(num_blocks * block_size)[:n]
    k = outlier_kv(rng, n, kv_heads, head_dim)
    v = 3 * rng.standard_normal((n, kv_heads, head_dim))
    if per == "tensor":  # calibrated beforehand, k_scale != v_scale
        k_scale, v_scale = np.float32([np.abs(k).max() / 448]), np.float32([np.abs(v).max() / 448])
    else:
        k_scale, v_scale = k_scales, v_scales
    before = k_cache.copy()
    result = impl.reshape_and_cache_fp8(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    assert result is None, "reshape_and_cache_fp8 writes in place and returns None"

    block, offset = np.divmod(slots, block_size)
    written = np.zeros(k_cache.shape[:2], dtype=bool)
    written[block, offset] = True
    for name, cache, scales, new in (("k", k_cache, k_scale, k), ("v", v_cache, v_scale, v)):
        assert (cache[~written] == before[~written]).all(), (
            f"{name}_cache changed outside the slots of slot_mapping: slot s is block "
            "s // block_size, offset s % block_size")
        if per == "tensor":
            s = np.float64(scales[0])
            want_scale = np.full((n, kv_heads), s)
        else:
            want_scale = np.abs(new).max(axis=-1).astype(np.float64) / 448
            stored = scales[block, offset].astype(np.float64)
            assert_close(stored, want_scale.astype(np.float32), what=f"{name}_scale at the slots",
                         rtol=1e-7, atol=0, hint="per token-head: amax / 448 of each row, "
                         "stored at [block, offset, head] beside the bytes",
                         nan_hint="the scales were never stored: per token-head, each token's "
                         "scales go into k_scale / v_scale at its slot, beside its bytes")
            assert np.isnan(scales[~written]).all(), (
                f"{name}_scale changed outside the written slots")
            want_scale = stored
        want = oracle_bytes(new / want_scale[..., None])
        assert_close(GRID[cache[block, offset]], GRID[want],
                     what=f"the e4m3 values written to {name}_cache", atol=0, rtol=0,
                     hint="quantise with the scale you store (per token-head) or are given "
                          "(per tensor), then write the bytes at [block, offset]")


@pytest.mark.points(1)
def test_a_padding_token_with_slot_minus_one_is_skipped():
    """vLLM pads a batch with tokens whose slot is -1; they must not be written (and -1 is
    not "the last slot")."""
    rng = np.random.default_rng(6)
    k_cache, v_cache, _, _ = empty_fp8_cache(2, 4, 1, 8)
    k, v = rng.standard_normal((3, 1, 8)), rng.standard_normal((3, 1, 8))
    scale = np.float32([0.01])
    impl.reshape_and_cache_fp8(k, v, k_cache, v_cache, np.array([5, -1, 2]), scale, scale)
    touched = (k_cache != NAN_BYTE).any(axis=(2, 3))
    assert touched.sum() == 2 and touched[1, 1] and touched[0, 2], (
        f"slots 5 and 2 should be written, nothing else; written (block, offset): "
        f"{np.argwhere(touched).tolist()}. Skip tokens whose slot is -1")


def _caches():
    k_cache, v_cache, _, _ = empty_fp8_cache(2, 4, 2, 8)
    scale = np.float32([0.1])
    return k_cache, v_cache, scale, scale


def _float16_caches():
    k_cache, v_cache = _caches()[:2]
    return k_cache.astype(np.float16), v_cache


def _tokens(n: int = 2):
    return np.ones((n, 2, 8)), np.ones((n, 2, 8))


BAD_WRITE_CALLS: BadInputs = {
    "a float16 cache": ("k_cache", lambda: impl.reshape_and_cache_fp8(
        *_tokens(), *_float16_caches(), np.array([0, 1]), *_caches()[2:])),
    "a slot outside the cache": ("slot_mapping", lambda: impl.reshape_and_cache_fp8(
        *_tokens(), *_caches()[:2], np.array([0, 8]), *_caches()[2:])),
    "k_scale of the wrong shape": ("k_scale", lambda: impl.reshape_and_cache_fp8(
        *_tokens(), *_caches()[:2], np.array([0, 1]), np.ones((2, 4), np.float32),
        np.ones((2, 4, 2), np.float32))),
    "a float64 v_scale": ("v_scale", lambda: impl.reshape_and_cache_fp8(
        *_tokens(), *_caches()[:2], np.array([0, 1]), np.float32([0.1]), np.array([0.1]))),
    "k with the wrong head_dim": (r"\bk\b", lambda: impl.reshape_and_cache_fp8(
        np.ones((2, 2, 5)), np.ones((2, 2, 5)), *_caches()[:2], np.array([0, 1]),
        *_caches()[2:])),
}


test_bad_cache_write_raises_a_value_error_that_names_the_argument = bad_input_test(
    BAD_WRITE_CALLS, points=0.5)


# ---- the Triton kernel over the fp8 cache ---------------------------------------------------


def fp8_paged_case(rng: np.random.Generator, lens: list[int], num_heads: int, kv_heads: int,
                   head_dim: int, block_size: int, per: str, padding: str = "poisoned") -> dict:
    """A random decode step over a paged fp8 cache, built with the oracle (never the code
    under test). V is 8x larger than K, so ``k_scale != v_scale``. Returns the uint8 caches,
    the scales (``[1]`` or per slot), tables, lengths, q and the dequantised dense K/V."""
    ks = [outlier_kv(rng, n, kv_heads, head_dim, token_factor=3.0) * 0.5 for n in lens]
    vs = [8 * rng.standard_normal((n, kv_heads, head_dim)) for n in lens]
    if per == "tensor":
        k_amax = max(float(np.abs(k).max()) for k in ks if k.size)
        v_amax = max(float(np.abs(v).max()) for v in vs if v.size)
        k_sc = [np.full((n, kv_heads), np.float32(k_amax / 448)) for n in lens]
        v_sc = [np.full((n, kv_heads), np.float32(v_amax / 448)) for n in lens]
    else:
        k_sc = [(np.abs(k).max(axis=-1) / 448).astype(np.float32) for k in ks]
        v_sc = [(np.abs(v).max(axis=-1) / 448).astype(np.float32) for v in vs]
    k_bytes = [oracle_bytes(k / s[..., None].astype(np.float64)) for k, s in zip(ks, k_sc)]
    v_bytes = [oracle_bytes(v / s[..., None].astype(np.float64)) for v, s in zip(vs, v_sc)]
    # The bytes and the scale as one float row, so one build places both in the same slot.
    rows_k = [np.concatenate([b, s[..., None]], -1) for b, s in zip(k_bytes, k_sc)]
    rows_v = [np.concatenate([b, s[..., None]], -1) for b, s in zip(v_bytes, v_sc)]
    paged = build_paged_kv(rows_k, rows_v, block_size, rng=rng, padding=padding)
    k_cache = np.where(np.isnan(paged.k_cache[..., :-1]), NAN_BYTE, paged.k_cache[..., :-1])
    v_cache = np.where(np.isnan(paged.v_cache[..., :-1]), NAN_BYTE, paged.v_cache[..., :-1])
    case = {
        "q": rng.standard_normal((len(lens), num_heads, head_dim)).astype(np.float32),
        "k_cache": k_cache.astype(np.uint8), "v_cache": v_cache.astype(np.uint8),
        "block_tables": paged.block_tables, "seq_lens": paged.seq_lens,
        "k_bytes": k_bytes, "v_bytes": v_bytes, "k_sc": k_sc, "v_sc": v_sc, "per": per,
    }
    if per == "tensor":
        case["k_scale"], case["v_scale"] = np.float32([k_amax / 448]), np.float32([v_amax / 448])
    else:
        case["k_scale"] = paged.k_cache[..., -1].astype(np.float32)  # NaN in unused slots
        case["v_scale"] = paged.v_cache[..., -1].astype(np.float32)
    return case


def fp8_expected(case: dict, b: int, scale: float | None = None, *, k_scale_power: int = 1,
                 v_scale_power: int = 1, swap: bool = False, as_integers: bool = False,
                 modulo_heads: bool = False):
    """Reference (out, lse) of sequence b over the dequantised cache, or a mistake's."""
    grid = (lambda b_: b_.astype(np.float64)) if as_integers else (lambda b_: GRID[b_])
    k_sc, v_sc = case["k_sc"][b].astype(np.float64), case["v_sc"][b].astype(np.float64)
    if swap:
        k_sc, v_sc = v_sc, k_sc
    k = grid(case["k_bytes"][b]) * (k_sc ** k_scale_power)[..., None]
    v = grid(case["v_bytes"][b]) * (v_sc ** v_scale_power)[..., None]
    if modulo_heads:  # query head h reads KV head h % KVH: one KV head per query head
        heads = np.arange(case["q"].shape[1]) % k.shape[1]
        k, v = k[:, heads], v[:, heads]
    return reference_decode(case["q"][b].astype(np.float64), k, v, scale=scale)


def fp8_wrong_answers(case: dict, b: int, scale: float | None = None) -> dict:
    answers = {
        SWAPPED: fp8_expected(case, b, scale, swap=True)[0],
        K_TWICE: fp8_expected(case, b, scale, k_scale_power=2)[0],
        V_FORGOTTEN: fp8_expected(case, b, scale, v_scale_power=0)[0],
        AS_INTEGERS: fp8_expected(case, b, scale, as_integers=True)[0],
    }
    if case["q"].shape[1] > case["k_bytes"][b].shape[1] > 1:  # GQA: the mapping shows
        answers[MODULO_HEADS] = fp8_expected(case, b, scale, modulo_heads=True)[0]
    if case["per"] == "token_head":
        answers[V_IN_L] = v_scale_in_l_answer(case, b, scale)
    return answers


def v_scale_in_l_answer(case: dict, b: int, scale: float | None) -> np.ndarray:
    """Per token-head, with l summing p * v_scale: out = sum_j p_j s_j v_j / sum_j p_j s_j."""
    k = GRID[case["k_bytes"][b]] * case["k_sc"][b].astype(np.float64)[..., None]
    q = case["q"][b].astype(np.float64)
    num_heads, kv_heads = q.shape[0], k.shape[1]
    heads = np.arange(num_heads) // (num_heads // kv_heads)
    s = np.einsum("hd,nhd->hn", q, k[:, heads]) * (scale or 1 / math.sqrt(q.shape[1]))
    p = np.exp(s - s.max(axis=1, keepdims=True)) * case["v_sc"][b][:, heads].T
    return np.einsum("hn,nhd->hd", p / p.sum(axis=1, keepdims=True),
                     GRID[case["v_bytes"][b]][:, heads])


def run_fp8_kernel(case: dict, scale: float | None = None, *, block_n: int | None = None,
                   max_seq_len: int | None = None, layout: str | None = None,
                   q_dtype=torch.float32, reports: list | None = None):
    """Run paged_decode_fp8_triton on DEVICE; numpy float64 (out, lse)."""
    tensors = [torch.tensor(case["q"], dtype=q_dtype, device=DEVICE),
               torch.tensor(case["k_cache"], device=DEVICE),
               torch.tensor(case["v_cache"], device=DEVICE),
               torch.tensor(case["block_tables"], dtype=torch.int32, device=DEVICE)]
    if layout is not None:
        tensors = [strided_view(t, layout) for t in tensors]
    scales = [torch.tensor(case[name], device=DEVICE) for name in ("k_scale", "v_scale")]
    if layout is not None:
        scales = [strided_view(s, layout) for s in scales]
    seq_lens = torch.tensor(case["seq_lens"], dtype=torch.int32, device=DEVICE)
    args = (*tensors, seq_lens, *scales)
    kwargs = {"scale": scale, "block_n": block_n, "max_seq_len": max_seq_len}
    if reports is None:
        result = impl.paged_decode_fp8_triton(*args, **kwargs)
    else:
        result, launches = kernel_memory(impl.paged_decode_fp8_triton, *args, **kwargs)
        reports.extend(launches)
    assert isinstance(result, tuple) and len(result) == 2, (
        "paged_decode_fp8_triton returns the pair (out, lse)")
    out, lse = result
    assert tuple(out.shape) == case["q"].shape, f"out has shape {tuple(out.shape)}"
    assert tuple(lse.shape) == case["q"].shape[:2], f"lse has shape {tuple(lse.shape)}"
    return out.detach().cpu().double().numpy(), lse.detach().cpu().double().numpy()


def check_fp8_case(case: dict, out: np.ndarray, lse: np.ndarray, scale: float | None = None,
                   tol: dict = F32, label: str = "") -> None:
    __tracebackhide__ = True
    for b in range(len(case["seq_lens"])):
        want_out, want_lse = fp8_expected(case, b, scale)
        n = int(case["seq_lens"][b])
        wrong = fp8_wrong_answers(case, b, scale) if n else {}
        assert_close(out[b], want_out, what=f"out of sequence {b} (seq_len {n}{label})",
                     wrong_answers=wrong, nan_hint=FP8_NAN, hint=FP8_HINT, **tol)
        assert_close(lse[b], want_lse, what=f"lse of sequence {b}{label}", hint=LSE_HINT, **tol)


FP8_NAN = ("NaN reached the output: unused slots hold NaN scales (per token-head) and the "
           "byte 0x7F, e4m3's NaN. Mask the K/V loads AND the scale loads with pos < seq_len "
           "(other=0), and guard l = 0 for an empty sequence")
FP8_HINT = ("per tensor: k_scale in the score scale (qk_scale * k_scale), v_scale on the "
            "finished output; per token-head: k_scale[j] on score column j, v_scale[j] on "
            "weight column j in P @ V only. Unused slots hold 0x7F, which the interpreter "
            "reads as 480: mask the loads")

FP8_CASES = [
    # (num_heads, kv_heads, head_dim, block_size, lens, block_n)
    pytest.param(4, 2, 16, 16, [5, 40], 32, id="gqa-block16-tile32"),
    pytest.param(4, 1, 16, 3, [33, 0], 32, id="mqa-block3-empty-tile32"),
    pytest.param(2, 2, 24, 48, [50, 7], 64, id="mha-block48-headdim24-tile64"),
]


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("per", ["tensor", "token_head"])
@pytest.mark.parametrize("num_heads, kv_heads, head_dim, block_size, lens, block_n", FP8_CASES)
@basic_value_test
def test_triton_fp8_kernel_equals_attention_over_the_dequantised_cache(
    per, num_heads, kv_heads, head_dim, block_size, lens, block_n
):
    """k_scale != v_scale (V is 8x larger), so a swapped, doubled or forgotten scale shows."""
    rng = np.random.default_rng(num_heads * 7 + block_size)
    case = fp8_paged_case(rng, lens, num_heads, kv_heads, head_dim, block_size, per)
    scale = 0.8 / math.sqrt(head_dim)
    out, lse = run_fp8_kernel(case, scale, block_n=block_n)
    check_fp8_case(case, out, lse, scale, label=f", per {per}")


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("num_heads, kv_heads", [(8, 2), (32, 1)], ids=["8q-2kv", "32q-1kv"])
def test_triton_fp8_kernel_packs_every_group_into_one_tile(num_heads, kv_heads):
    case = fp8_paged_case(np.random.default_rng(num_heads), [21], num_heads, kv_heads, 16, 4,
                          "token_head")
    out, lse = run_fp8_kernel(case)
    check_fp8_case(case, out, lse, label=f", {num_heads}q/{kv_heads}kv")


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("per", ["tensor", "token_head"])
def test_triton_fp8_kernel_never_reads_a_slot_the_sequence_does_not_own(per):
    """The same cache with other garbage where the poison was: nothing may change."""
    rng = np.random.default_rng(9)
    case = fp8_paged_case(rng, [6, 19], 4, 2, 16, 8, per)
    out, lse = run_fp8_kernel(case)
    check_fp8_case(case, out, lse, label=f", per {per}")
    owned = np.zeros(case["k_cache"].shape[:2], dtype=bool)
    for b, n in enumerate(case["seq_lens"]):
        t = np.arange(n)
        owned[case["block_tables"][b, t // 8], t % 8] = True
    for name in ("k_cache", "v_cache"):
        case[name][~owned] = rng.choice(FINITE, size=case[name][~owned].shape)
    if per == "token_head":
        for name in ("k_scale", "v_scale"):
            case[name][~owned] = 50.0
    out2, lse2 = run_fp8_kernel(case)
    hint = "the output changed when bytes or scales this sequence does not own changed"
    assert_close(out2, out, what="out", hint=hint, **F32)
    assert_close(lse2, lse, what="lse", hint=hint, **F32)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_triton_fp8_kernel_reads_strided_views_through_their_strides(layout):
    """"sliced": every other row of a bigger storage, at an offset (0 bytes between the
    cache rows, NaN between the scale rows)."""
    rng = np.random.default_rng(13)
    case = fp8_paged_case(rng, [13, 30], 4, 2, 16, 4, "token_head")
    reports: list = []
    out, lse = run_fp8_kernel(case, layout=layout, reports=reports)
    check_fp8_case(case, out, lse, label=f", {layout} views")
    assert_no_races(reports, "paged_decode_fp8_triton")


@pytest.mark.triton
@pytest.mark.points(2)
def test_triton_fp8_kernel_reads_each_cached_byte_once_half_of_bf16():
    """One byte per cached element, each loaded once per (sequence, KV head): a bf16 cache
    of the same tokens is 2 bytes an element, so the fp8 decode reads half the bytes."""
    rng = np.random.default_rng(14)
    lens, kv_heads, head_dim = [9, 40], 2, 16
    case = fp8_paged_case(rng, lens, 8, kv_heads, head_dim, 16, "tensor")
    reports: list = []
    run_fp8_kernel(case, reports=reports)
    loads = {}
    for report in reports:
        for name, count in report["loads"].items():
            loads[name] = loads.get(name, 0) + count
    elements = sum(lens) * kv_heads * head_dim
    for name in ("k_cache", "v_cache"):
        got = loads.get(f"{name}_ptr", 0)  # the kernel's parameter (its signature is given)
        assert got == elements, (
            f"{name}: {got} elements loaded, expected {elements} = sum(seq_lens) x KVH x d: "
            f"every cached byte once ({elements} B, where a bf16 cache would need "
            f"{2 * elements} B). More means a program per query head (pack the group into the "
            "rows of one tile) or loads past seq_len / of the padded head dim")


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_fp8_kernel_with_a_float16_query_returns_float16_and_a_float32_lse():
    case = fp8_paged_case(np.random.default_rng(15), [3, 37], 4, 1, 32, 8, "tensor")
    case["q"] = case["q"].astype(np.float16).astype(np.float32)
    out, lse = run_fp8_kernel(case, q_dtype=torch.float16)
    check_fp8_case(case, out, lse, tol=dict(zip(("atol", "rtol"), tolerance("float16"))),
                   label=", q float16")
    q = torch.tensor(case["q"], dtype=torch.float16, device=DEVICE)
    result = impl.paged_decode_fp8_triton(
        q, *(torch.tensor(case[n], device=DEVICE) for n in ("k_cache", "v_cache")),
        torch.tensor(case["block_tables"], device=DEVICE),
        torch.tensor(case["seq_lens"], dtype=torch.int32, device=DEVICE),
        *(torch.tensor(case[n], device=DEVICE) for n in ("k_scale", "v_scale")))
    assert result[0].dtype == torch.float16 and result[1].dtype == torch.float32, (
        f"out must be in q's dtype (float16) and lse float32, got {result[0].dtype}, "
        f"{result[1].dtype}")


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_fp8_launcher_makes_no_host_sync_when_max_seq_len_is_given():
    """The per-tensor scales live on the device (vLLM keeps them as tensors): the kernel
    loads them; .item() on the host would stall the stream every step."""
    case = fp8_paged_case(np.random.default_rng(16), [6, 19], 4, 1, 16, 4, "tensor")
    args = (torch.tensor(case["q"], device=DEVICE),
            *(torch.tensor(case[n], device=DEVICE) for n in ("k_cache", "v_cache")),
            torch.tensor(case["block_tables"], device=DEVICE),
            torch.tensor(case["seq_lens"], dtype=torch.int32, device=DEVICE),
            *(torch.tensor(case[n], device=DEVICE) for n in ("k_scale", "v_scale")))
    (out, lse), syncs = host_syncs(impl.paged_decode_fp8_triton, *args, max_seq_len=19)
    assert syncs == [], (
        f"with max_seq_len given the launcher must not read device tensors on the host: "
        f"{syncs}. Pass k_scale and v_scale to the kernel as tensors and load them there")
    check_fp8_case(case, out.double().numpy(), lse.double().numpy())


def _fp8_call(cache_dtype=torch.uint8, k_scale=None, v_scale=None, **kwargs) -> None:
    q = torch.zeros(1, 2, 16, device=DEVICE)
    cache = torch.zeros(4, 4, 2, 16, dtype=cache_dtype, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    impl.paged_decode_fp8_triton(
        q, cache, cache.clone(), torch.zeros(1, 2, dtype=torch.int32, device=DEVICE),
        torch.tensor([5], dtype=torch.int32, device=DEVICE),
        one if k_scale is None else k_scale, one if v_scale is None else v_scale, **kwargs)


BAD_TRITON_CALLS: BadInputs = {
    "a float16 cache": ("k_cache", functools.partial(_fp8_call, torch.float16)),
    "k_scale of the wrong shape": (
        "k_scale", functools.partial(_fp8_call, k_scale=torch.ones(4, 4, device=DEVICE))),
    "a float64 v_scale": (
        "v_scale", functools.partial(_fp8_call, v_scale=torch.ones(1, dtype=torch.float64,
                                                                   device=DEVICE))),
    "block_n not a power of two": ("block_n", functools.partial(_fp8_call, block_n=48)),
    "block_tables too narrow for max_seq_len": (
        "block_tables", functools.partial(_fp8_call, max_seq_len=9)),
}

@pytest.mark.triton
@pytest.mark.points(1)
def test_an_fp8_tile_of_fewer_than_32_keys_is_refused():
    """vLLM's Triton decode keeps fp8 tiles at >= 32 keys (16 for bf16): an fp8 MMA
    contracts 32 elements, and in P @ V the keys are that dimension."""
    _fp8_call(block_n=32)  # the smallest fp8 tile: accepted
    assert_value_error_names(functools.partial(_fp8_call, block_n=16), "block_n",
                             "block_n=16 on an fp8 cache (tiles need >= 32 keys)")


test_triton_fp8_launcher_rejects_bad_input_with_a_value_error_naming_the_argument = (
    bad_input_test(BAD_TRITON_CALLS, points=0.5, marks=(pytest.mark.triton,)))


def fp8_decode_at_size(device, dtype, lens: list[int], num_heads: int, kv_heads: int,
                       per: str, block_size: int = 16, max_seq_len: int | None = None) -> None:
    """The fp8 kernel on ``device`` at ``dtype`` against the float64 reference."""
    __tracebackhide__ = True
    case = fp8_paged_case(np.random.default_rng(20), lens, num_heads, kv_heads, 128,
                          block_size, per)
    args = (torch.tensor(case["q"], device=device).to(dtype),
            *(torch.tensor(case[n], device=device) for n in ("k_cache", "v_cache")),
            torch.tensor(case["block_tables"], dtype=torch.int32, device=device),
            torch.tensor(case["seq_lens"], dtype=torch.int32, device=device),
            *(torch.tensor(case[n], device=device) for n in ("k_scale", "v_scale")))
    out, lse = impl.paged_decode_fp8_triton(*args, max_seq_len=max_seq_len or max(lens))
    assert out.dtype == dtype, f"out must be in q's dtype {dtype}, got {out.dtype}"
    case["q"] = args[0].float().cpu().numpy()  # the reference sees the rounded query
    check_fp8_case(case, out.double().cpu().numpy(), lse.double().cpu().numpy(),
                   tol=dict(zip(("atol", "rtol"), tolerance(dtype))), label=f", {dtype}")


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("per", ["tensor", "token_head"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_triton_fp8_kernel_on_a_gpu_at_llama_size_matches_the_reference(dtype, per):
    """d 128, GQA 32/8 (Llama-3-8B), block 16, a batch of 1 to 2,100 tokens, the
    launcher's own tiles."""
    fp8_decode_at_size("cuda", dtype, [1, 16, 17, 555, 2100], 32, 8, per)


# ---- cascade attention ----------------------------------------------------------------------


def cascade_case(rng: np.random.Generator, batch: int, prefix_len: int, suffix_lens: list[int],
                 num_heads: int, kv_heads: int, head_dim: int, head_dim_v: int | None = None):
    """q, the shared prefix and NaN-padded suffixes, and each request's full dense K/V."""
    dv = head_dim_v or head_dim
    width = max(suffix_lens, default=0) + 1
    q = rng.standard_normal((batch, num_heads, head_dim))
    pk = 1.5 * rng.standard_normal((prefix_len, kv_heads, head_dim))
    pv = rng.standard_normal((prefix_len, kv_heads, dv))
    sk = np.full((batch, width, kv_heads, head_dim), np.nan)
    sv = np.full((batch, width, kv_heads, dv), np.nan)
    for b, n in enumerate(suffix_lens):
        sk[b, :n] = 1.5 * rng.standard_normal((n, kv_heads, head_dim))
        sv[b, :n] = rng.standard_normal((n, kv_heads, dv))
    return q, pk, pv, sk, sv, np.array(suffix_lens)


def cascade_expected(q, pk, pv, sk, sv, lens, b, scale=None, prefix_copies: int = 1):
    k = np.concatenate([pk] * prefix_copies + [sk[b, : lens[b]]])
    v = np.concatenate([pv] * prefix_copies + [sv[b, : lens[b]]])
    return reference_attention(q[b][None], k, v, scale=scale)


def cascade_mistakes(q, pk, pv, sk, sv, lens, b, scale=None) -> dict:
    answers = {PREFIX_TWICE: cascade_expected(q, pk, pv, sk, sv, lens, b, scale, 2)[0][0]}
    if len(pk) and lens[b]:
        out_p = reference_attention(q[b][None], pk, pv, scale=scale)[0][0]
        out_s = reference_attention(q[b][None], sk[b, : lens[b]], sv[b, : lens[b]],
                                    scale=scale)[0][0]
        answers[NO_RESCALE] = (out_p + out_s) / 2
        answers[BY_KEY_COUNT] = (len(pk) * out_p + lens[b] * out_s) / (len(pk) + lens[b])
    return answers


@st.composite
def cascade_cases(draw, max_batch: int = 5):
    num_heads, kv_heads = draw(head_counts())
    batch = draw(st.integers(1, max_batch))
    prefix_len = draw(st.sampled_from([0, 1, 7, 20]))
    lens = [draw(st.integers(0, 9)) for _ in range(batch)]
    head_dim = draw(st.sampled_from([4, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return cascade_case(rng, batch, prefix_len, lens, num_heads, kv_heads, head_dim)


@pytest.mark.points(3)
@given(case=cascade_cases())
@basic_value_test
def test_cascade_equals_attention_over_prefix_plus_suffix_for_every_request(case):
    q, pk, pv, sk, sv, lens = case
    out, lse = impl.cascade_attention(q, pk, pv, sk, sv, lens)
    assert np.asarray(out).shape == (q.shape[0], q.shape[1], pv.shape[2]), (
        f"out has shape {np.asarray(out).shape}, expected [B, H, dv]")
    for b in range(q.shape[0]):
        want_out, want_lse = cascade_expected(q, pk, pv, sk, sv, lens, b)
        assert_close(out[b], want_out[0], what=f"out of request {b} (prefix {len(pk)}, suffix "
                     f"{lens[b]})", wrong_answers=cascade_mistakes(q, pk, pv, sk, sv, lens, b),
                     nan_hint="NaN reached the output: suffix slots past suffix_lens[b] are NaN "
                     "padding (read only the first suffix_lens[b]); an empty prefix or suffix "
                     "has lse -inf and must get weight 0, not exp(-inf - -inf)", **F64)
        assert_close(lse[b], want_lse[0], what=f"lse of request {b}", hint=LSE_HINT, **F64)


@pytest.mark.points(2)
@given(total=st.integers(1, 24), requests=st.integers(1, 6), data=st.data())
def test_any_split_point_and_any_number_of_sharing_requests_give_the_same_answer(
    total, requests, data
):
    """Requests that share their first ``total`` tokens: calling the first ``split`` of them
    the prefix and the rest part of every suffix must not change a single value."""
    split = data.draw(st.integers(0, total), label="split")
    own = [data.draw(st.integers(0, 5), label="own") for _ in range(requests)]
    rng = np.random.default_rng(total * 31 + split)
    shared_k, shared_v = rng.standard_normal((2, total, 2, 8))
    q = rng.standard_normal((requests, 4, 8))
    width = total - split + max(own) + 1
    sk = np.full((requests, width, 2, 8), np.nan)
    sv = np.full_like(sk, np.nan)
    dense = []
    for b, n in enumerate(own):
        k_own, v_own = rng.standard_normal((2, n, 2, 8))
        sk[b, : total - split + n] = np.concatenate([shared_k[split:], k_own])
        sv[b, : total - split + n] = np.concatenate([shared_v[split:], v_own])
        dense.append((np.concatenate([shared_k, k_own]), np.concatenate([shared_v, v_own])))
    lens = np.array([total - split + n for n in own])
    out, lse = impl.cascade_attention(q, shared_k[:split], shared_v[:split], sk, sv, lens)
    for b, (k, v) in enumerate(dense):
        want_out, want_lse = reference_attention(q[b][None], k, v)
        assert_close(out[b], want_out[0], what=f"out of request {b} (split at {split} of "
                     f"{total} shared tokens, {requests} requests)",
                     hint="the merge must be exact wherever the prefix ends", **F64)
        assert_close(lse[b], want_lse[0], what=f"lse of request {b}", **F64)


@pytest.mark.points(1)
def test_attention_states_serves_every_query_from_one_pass_over_the_keys():
    rng = np.random.default_rng(17)
    q, k, v = rng.standard_normal((5, 6, 8)), rng.standard_normal((11, 3, 8)), \
        rng.standard_normal((11, 3, 4))
    out, lse = impl.attention_states(q, k, v)
    want_out, want_lse = reference_attention(q, k, v)
    assert_close(out, want_out, what="attention_states out [N, H, dv]", **F64,
                 hint="query head h reads KV head h // (H // KVH); all N queries see all L keys")
    assert_close(lse, want_lse, what="attention_states lse [N, H]", hint=LSE_HINT, **F64)
    out, lse = impl.attention_states(q, k[:0], v[:0])
    assert_close(out, np.zeros((5, 6, 4)), what="out over no keys", **F64)
    assert_close(lse, np.full((5, 6), -np.inf), what="lse over no keys", **F64)


@pytest.mark.points(1)
def test_merge_states_of_two_halves_equals_attention_over_both_and_ignores_an_empty_side():
    rng = np.random.default_rng(18)
    q, k, v = rng.standard_normal((1, 2, 8)), 2 * rng.standard_normal((9, 1, 8)), \
        rng.standard_normal((9, 1, 8))
    a, b = reference_attention(q, k[:4], v[:4]), reference_attention(q, k[4:], v[4:])
    out, lse = impl.merge_states(a[0], a[1], b[0], b[1])
    want = reference_attention(q, k, v)
    assert_close(out, want[0], what="merged out", wrong_answers={
        NO_RESCALE: (a[0] + b[0]) / 2}, **F64)
    assert_close(lse, want[1], what="merged lse", hint=LSE_HINT, **F64)
    empty = (np.zeros_like(a[0]), np.full_like(a[1], -np.inf))
    out, lse = impl.merge_states(*a, *empty)
    assert_close(out, a[0], what="merged with an empty side", nan_hint="NaN from the empty "
                 "side: its weight is exp(-inf - lse) = 0; guard the max when both are -inf",
                 **F64)
    out, lse = impl.merge_states(*empty, *empty)
    assert_close(out, empty[0], what="two empty sides: out", **F64)
    assert_close(lse, empty[1], what="two empty sides: lse", **F64)


@pytest.mark.points(1)
def test_cascade_reads_the_prefix_once_where_per_request_decode_reads_it_per_request():
    """Llama-3-8B-like, one layer: 8 KV heads x d 128, bf16; 32 requests share a 2,000-token
    system prompt and have 100 tokens each of their own."""
    row = 2 * 8 * 128 * 2  # K and V of one token
    cascade, per_request = impl.cascade_kv_bytes(2000, [100] * 32, 8, 128, 2)
    once = "" if cascade != per_request else (
        "the cascade counted the shared prefix once per request, as per-request decode does: "
        "its point is that one pass reads the prefix ONCE for all requests; ")
    assert (cascade, per_request) == ((2000 + 3200) * row, (32 * 2000 + 3200) * row), (
        f"{once}got (cascade {cascade}, per-request {per_request}) bytes; expected the prefix once "
        f"plus every suffix ({(2000 + 3200) * row}) vs the prefix once per request plus every "
        f"suffix ({(32 * 2000 + 3200) * row})")


BAD_CASCADE_CALLS: BadInputs = {
    "suffix_lens longer than the suffix buffer": ("suffix_lens", lambda: impl.cascade_attention(
        np.zeros((2, 2, 4)), np.zeros((3, 1, 4)), np.zeros((3, 1, 4)), np.zeros((2, 5, 1, 4)),
        np.zeros((2, 5, 1, 4)), np.array([2, 6]))),
    "suffix_k for another batch size": ("suffix_k", lambda: impl.cascade_attention(
        np.zeros((2, 2, 4)), np.zeros((3, 1, 4)), np.zeros((3, 1, 4)), np.zeros((3, 5, 1, 4)),
        np.zeros((3, 5, 1, 4)), np.array([2, 2]))),
    "prefix_k with another head_dim": ("prefix_k", lambda: impl.cascade_attention(
        np.zeros((2, 2, 4)), np.zeros((3, 1, 6)), np.zeros((3, 1, 4)), np.zeros((2, 5, 1, 4)),
        np.zeros((2, 5, 1, 4)), np.array([2, 2]))),
    "num_heads not a multiple of num_kv_heads": ("num_kv_heads", lambda: impl.cascade_attention(
        np.zeros((2, 3, 4)), np.zeros((3, 2, 4)), np.zeros((3, 2, 4)), np.zeros((2, 5, 2, 4)),
        np.zeros((2, 5, 2, 4)), np.array([2, 2]))),
    "attention_states: v with another number of keys": ("v", lambda: impl.attention_states(
        np.zeros((2, 2, 4)), np.zeros((3, 1, 4)), np.zeros((4, 1, 4)))),
    "attention_states: 2-D q": ("q", lambda: impl.attention_states(
        np.zeros((2, 4)), np.zeros((3, 1, 4)), np.zeros((3, 1, 4)))),
}

test_bad_cascade_input_raises_a_value_error_that_names_the_argument = bad_input_test(
    BAD_CASCADE_CALLS, points=0.5)


# ---- compiled for an H100 on the CPU (bench/student_compile.py) -------------------------------
test_kernel_compiles_for_sm_90_with_ieee_dots_no_spills_and_64_bit_offsets = sm90_compile_test(
    __file__)  # None where bench/ is absent (the grader's copy): nothing to collect
