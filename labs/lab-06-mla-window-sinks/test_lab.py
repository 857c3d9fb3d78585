"""Lab 06 spec: KV bytes per token, MLA decode (naive, absorbed, Triton), sliding-window and
attention-sink decode (numpy and Triton).

Every expected value comes from the dense float64 reference in ``common.reference`` (its
``window`` and ``sinks`` options) or from MLA's definition written out here (per-head keys
and values up-projected from the latent). Caches come from ``common.paged.build_paged_kv``:
shuffled blocks and NaN in every slot past a sequence's length and in every unreferenced
block. The windowed tests also fill every block that lies wholly before a window with NaN
and point its block-table entry at a NaN block (vLLM points such entries at its null
block), so a window that is not a loop bound shows up as NaN.

Run:  LAB_IMPL=starter pytest labs/lab-06-mla-window-sinks -q   (grades starter.py)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common.loader import load_impl
from common.paged import build_paged_kv, random_kv, random_paged_decode, zero_paged_decode_torch
from common.reference import reference_decode
from common.testing import (
    ACC_IN_FP16,
    HEAD_RATIOS,
    LAYOUTS,
    ODD_HEAD_DIMS,
    P_NOT_CAST,
    SCALE_IGNORED,
    SCALE_ZERO_AS_DEFAULT,
    BadInputs,
    assert_close,
    assert_loads_in_bounds,
    assert_no_races,
    bad_input_test,
    basic_value_test,
    called_on_copies,
    cancelling,
    host_syncs,
    kernel_memory,
    peak_memory,
    raised_as,
    sm90_compile_test,
    strided_view,
    tolerance,
)
from common.triton_env import DEVICE, on_interpreter

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))

F64 = dict(atol=1e-12, rtol=1e-12)
ATOL32, RTOL32 = tolerance("float32")
F32 = dict(atol=ATOL32, rtol=RTOL32)

# ---- the misconceptions the tests name ---------------------------------------------------

WINDOW_TOO_LONG = (
    "it equals attention over window + 1 tokens: your window starts one token early. The "
    "new token sees its `window` most recent tokens, itself included: positions "
    "seq_len - window ... seq_len - 1. FlashAttention spells this window_size=(window - 1, 0) "
    "(its left number excludes the token itself); Hugging Face's and vLLM's sliding_window "
    "is the window itself"
)
WINDOW_TOO_SHORT = (
    "it equals attention over window - 1 tokens: your window starts one token late (or "
    "leaves the new token out). The window includes the new token: positions "
    "seq_len - window ... seq_len - 1"
)
WINDOW_IGNORED = "it equals attention over the whole context: the window was not applied"
WINDOW_NAN = (
    "NaN reached the output: you read a block that lies wholly before the window (through a "
    "mask over the whole context, or a window that starts one token early: window + 1 "
    "tokens). The tests fill those blocks with NaN and point their table entries at a NaN "
    "block, as vLLM points them at its null block once it has freed them. Start the loop at "
    "the block holding position seq_len - window; never read a table entry before it"
)
SINK_IGNORED = (
    "it equals attention without the sink: a sink is one more term exp(sink) in each "
    "head's softmax denominator (start that head's state at m = sink, l = 1)"
)
SINK_AS_VALUE = (
    "the sink was counted as a value: your output adds the sink's weight times a token's V "
    "(that is StreamingLLM's sink token, a real token kept in the cache). gpt-oss's sink is "
    "a learned logit with no value: it enlarges the denominator and adds nothing to acc"
)
SINK_SCALED = (
    "it equals attention with the sink multiplied by the softmax scale: a sink is already "
    "a logit in the units of the scaled scores (in a base-2 kernel it is multiplied by "
    "log2(e), and by nothing else)"
)
SINK_NATURAL_LOG = (
    "it equals attention with the sink left in natural-log units next to base-2 scores: a "
    "base-2 kernel multiplies the sink by log2(e), as it does the scaled scores"
)
ROPE_ABSORBED = (
    "it equals attention without the RoPE score q_pe · k_pe: only the latent part can be "
    "absorbed. RoPE rotates each key by its position, so no fixed matrix can be folded "
    "between q and the latent for that part: k_pe is cached as its own rotated key, shared "
    "by every head, and its score q_pe · k_pe is added to q_latent · c_kv"
)
MLA_SCALE = (
    "it equals attention with a softmax scale you chose: MLA takes the model's scale as an "
    "argument (DeepSeek-V3's is 1/sqrt(d_nope + d_rope) = 1/sqrt(192), times a YaRN factor, "
    "not 1/sqrt of the 576-wide absorbed key)"
)
KERNEL_NAN = (
    "NaN reached the kernel's output. Slots past seq_len, unreferenced blocks and blocks "
    "before the window are NaN: start the loop at the window's first token, mask the "
    "block-table and cache loads with pos < seq_len and other=0 (NaN * 0 = NaN in tl.dot); "
    "or a slot stepped with a stride it assumed instead of the cache's own (the tests pad "
    "the rows and slots with NaN: pass and use every cache stride)"
)
LSE_HINT = "lse = m + log(l) in natural log, per query head, with the sink in l"


# ---- helpers: the reference and the wrong answers ----------------------------------------


def window_wrong_answers(q, k, v, window, sinks=None, scale=None) -> dict:
    """The off-by-one windows and the missing window, where they differ from the right one."""
    def out_with(w):
        return reference_decode(q, k, v, window=w, sinks=sinks, scale=scale)[0]

    answers = {}
    if len(k) > window:
        answers[WINDOW_TOO_LONG] = out_with(window + 1)
        answers[WINDOW_IGNORED] = out_with(None)
    if 1 < window <= len(k):
        answers[WINDOW_TOO_SHORT] = out_with(window - 1)
    elif window == 1 and len(k):  # window - 1 = 0 tokens: nothing attended, out = 0
        answers[WINDOW_TOO_SHORT] = np.zeros_like(out_with(1))
    return answers


def sink_wrong_answers(q, k, v, sinks, window=None, scale=None) -> dict:
    """The classic sink mistakes: ignored, scaled like a score, counted as a value."""
    ignored = reference_decode(q, k, v, window=window, scale=scale)[0]
    as_value = {}
    out, lse = reference_decode(q, k, v, window=window, sinks=sinks, scale=scale)
    if len(k):
        group = q.shape[0] // k.shape[1]
        heads = np.arange(q.shape[0]) // group
        weight = np.exp(sinks - lse)[:, None]  # the sink's share of the softmax
        start = 0 if window is None else max(len(k) - window, 0)
        for token in sorted({0, start}):  # StreamingLLM's first token, or the window's
            as_value[f"{SINK_AS_VALUE} (here: token {token}'s V)"] = out + weight * v[token, heads]
    # With one visible token the two mistakes give the same numbers: name both.
    same = [name for name, wrong in as_value.items() if np.allclose(wrong, ignored)]
    answers = {SINK_IGNORED + (f"; or {same[0]}" if same else ""): ignored}
    answers.update({name: wrong for name, wrong in as_value.items() if name not in same})
    scale_used = 1 / math.sqrt(q.shape[1]) if scale is None else scale
    answers[SINK_SCALED] = reference_decode(q, k, v, window=window, sinks=sinks * scale_used,
                                           scale=scale)[0]
    answers[SINK_NATURAL_LOG] = reference_decode(q, k, v, window=window,
                                                 sinks=sinks * math.log(2), scale=scale)[0]
    return answers


def poison_before_windows(paged, window: int | None):
    """NaN in every block wholly before its sequence's window; their table entries point
    at an unreferenced NaN block (vLLM's null block). The slots before the window in the
    block it starts in are NaN too: a tile that starts at that block's first slot and
    masks the scores still multiplies P = 0 by a NaN value (0 * NaN = NaN)."""
    if window is None:
        return paged
    null_block = int(paged.unused_blocks[0])
    for b, n in enumerate(paged.seq_lens):
        first = max(int(n) - window, 0)
        block = paged.block_tables[b, first // paged.block_size]
        paged.k_cache[block, : first % paged.block_size] = np.nan
        paged.v_cache[block, : first % paged.block_size] = np.nan
        for logical in range(max(int(n) - window, 0) // paged.block_size):
            block = paged.block_tables[b, logical]
            paged.k_cache[block] = np.nan
            paged.v_cache[block] = np.nan
            paged.block_tables[b, logical] = null_block
    return paged


def rounded(x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """x rounded to dtype and back to float64 (what a float32 kernel actually sees)."""
    return np.asarray(x, dtype=dtype).astype(np.float64)


@st.composite
def window_lengths(draw, block_size: int, max_len: int = 48) -> tuple[int, int]:
    """(seq_len, window): windows of 1, inside one block, over several blocks, longer than
    the sequence, or any; lengths of one, a multiple of the block, one past, or any."""
    seq_len = draw(st.sampled_from([
        1, block_size * draw(st.integers(1, max(1, max_len // block_size))),
        block_size * draw(st.integers(1, max(1, max_len // block_size - 1))) + 1,
        draw(st.integers(2, max_len)),
    ]))
    kind = draw(st.sampled_from(["one", "inside_a_block", "several_blocks", "longer", "any"]))
    window = {
        "one": 1,
        "inside_a_block": draw(st.integers(1, max(1, block_size - 1))),
        "several_blocks": draw(st.integers(block_size + 1, 3 * block_size + 1)),
        "longer": seq_len + draw(st.integers(0, 5)),
        "any": draw(st.integers(1, max_len)),
    }[kind]
    return seq_len, window


@st.composite
def window_cases(draw, heads=st.sampled_from(HEAD_RATIOS), head_dims=(1, 4, 8)):
    """(q [H, d], k, v [L, KVH, d], window, paged cache of one sequence, poisoned)."""
    num_heads, num_kv_heads = draw(heads)
    head_dim = draw(st.sampled_from(head_dims))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    seq_len, window = draw(window_lengths(block_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    (q,), (k,), (v,), paged = random_paged_decode(rng, [seq_len], num_heads, num_kv_heads,
                                                  head_dim, block_size)
    return q, k, v, window, poison_before_windows(paged, window)


def run_decode(fn, q, paged, *args, **kwargs):
    """Call a numpy decode function on sequence 0 of a paged cache."""
    return fn(q, paged.k_cache, paged.v_cache, paged.block_tables[0], int(paged.seq_lens[0]),
              *args, **kwargs)


# ---- 1. bytes per token --------------------------------------------------------------------

REAL_MODELS = [
    # (kind, layers, head_dim, heads, kv_heads, kv_lora_rank, rope_dim, bytes), expected bytes
    pytest.param(("gqa", 80, 128, 64, 8, None, None, 2), 2 * 80 * 8 * 128 * 2,
                 id="llama3-70b-gqa-320KiB"),
    pytest.param(("mha", 80, 128, 64, None, None, None, 2), 2 * 80 * 64 * 128 * 2,
                 id="llama3-70b-shape-as-mha"),
    pytest.param(("mqa", 80, 128, 64, None, None, None, 2), 2 * 80 * 128 * 2,
                 id="llama3-70b-shape-as-mqa"),
    pytest.param(("mla", 61, 128, 128, None, 512, 64, 2), 61 * (512 + 64) * 2,
                 id="deepseek-v3-mla-70272B"),
    pytest.param(("gqa", 32, 128, 32, 8, None, None, 2), 2 * 32 * 8 * 128 * 2,
                 id="mistral-7b-gqa"),
    pytest.param(("gqa", 36, 64, 64, 8, None, None, 2), 2 * 36 * 8 * 64 * 2,
                 id="gpt-oss-120b-gqa"),
    pytest.param(("mla", 61, 128, 128, None, 512, 64, 1), 61 * (512 + 64),
                 id="deepseek-v3-mla-fp8"),
]


@pytest.mark.points(2)
@pytest.mark.parametrize("args, expected", REAL_MODELS)
def test_kv_bytes_per_token_of_real_model_configurations(args, expected):
    kind, layers, head_dim, heads, kv_heads, rank, rope, nbytes = args
    got = impl.kv_bytes_per_token(kind, layers, head_dim, heads, num_kv_heads=kv_heads,
                                  kv_lora_rank=rank, rope_dim=rope, bytes_per_element=nbytes)
    hint = {
        "mha": "MHA caches a K and a V vector per head: 2 x layers x heads x head_dim x bytes",
        "mqa": "MQA caches one K and one V head shared by every query head",
        "gqa": "GQA caches a K and a V vector per KV head (num_kv_heads, not num_heads)",
        "mla": "MLA caches ONE latent row per token and layer, kv_lora_rank + rope_dim wide, "
               "read as both K and V: no factor 2, and no heads",
    }[kind]
    assert isinstance(got, int | np.integer), f"return an int, got {type(got).__name__}"
    if kind == "mla" and got == 2 * expected:
        raise AssertionError(f"MLA: got {got} = 2 x {expected}: the latent is not a K plus a "
                             "V, it is one row per token and layer, read as both")
    assert got == expected, f"{kind}: got {got} bytes per token, expected {expected}. {hint}"


@pytest.mark.points(1)
@given(
    layers=st.integers(1, 100),
    head_dim=st.integers(1, 256),
    group=st.sampled_from([1, 2, 4, 8]),
    kv_heads=st.integers(1, 16),
    rank=st.integers(1, 1024),
    rope=st.integers(0, 128),
    nbytes=st.sampled_from([1, 2, 4]),
)
def test_kv_bytes_per_token_follows_each_family_formula(
    layers, head_dim, group, kv_heads, rank, rope, nbytes
):
    heads = kv_heads * group
    want = {
        "mha": 2 * layers * heads * head_dim * nbytes,
        "mqa": 2 * layers * head_dim * nbytes,
        "gqa": 2 * layers * kv_heads * head_dim * nbytes,
        "mla": layers * (rank + rope) * nbytes,
    }
    for kind, expected in want.items():
        got = impl.kv_bytes_per_token(kind, layers, head_dim, heads, num_kv_heads=kv_heads
                                      if kind == "gqa" else None, kv_lora_rank=rank,
                                      rope_dim=rope, bytes_per_element=nbytes)
        assert got == expected, (
            f"{kind} with {layers} layers, {heads} heads ({kv_heads} KV heads), head_dim "
            f"{head_dim}, kv_lora_rank {rank}, rope_dim {rope}, {nbytes} B: got {got}, "
            f"expected {expected}"
        )


# ---- 2. MLA decode in numpy ----------------------------------------------------------------


def mla_case(rng, num_heads, d_nope, d_rope, d_c, dv, length):
    """Random MLA inputs; weights scaled so the scores stay moderate."""
    return dict(
        q_nope=rng.standard_normal((num_heads, d_nope)),
        q_pe=rng.standard_normal((num_heads, d_rope)),
        c_kv=rng.standard_normal((length, d_c)),
        k_pe=rng.standard_normal((length, d_rope)),
        w_uk=rng.standard_normal((num_heads, d_c, d_nope)) / math.sqrt(d_c),
        w_uv=rng.standard_normal((num_heads, d_c, dv)) / math.sqrt(d_c),
    )


def mla_per_head_kv(case, with_rope=True):
    """MLA's definition: per-head keys [L, H, d_nope (+ d_rope)] and values [L, H, dv]."""
    k = np.einsum("lc,hcn->lhn", case["c_kv"], case["w_uk"])
    if with_rope:
        length, heads = k.shape[:2]
        k_pe = np.broadcast_to(case["k_pe"][:, None], (length, heads, case["k_pe"].shape[1]))
        k = np.concatenate([k, k_pe], axis=-1)
    return k, np.einsum("lc,hcv->lhv", case["c_kv"], case["w_uv"])


def mla_reference(case, scale):
    k, v = mla_per_head_kv(case)
    q = np.concatenate([case["q_nope"], case["q_pe"]], axis=-1)
    return reference_decode(q, k, v, scale=scale)


def mla_wrong_answers(case, scale) -> dict:
    k, v = mla_per_head_kv(case, with_rope=False)
    answers = {ROPE_ABSORBED: reference_decode(case["q_nope"], k, v, scale=scale)[0]}
    d_nope, d_rope, d_c = case["q_nope"].shape[1], case["q_pe"].shape[1], case["c_kv"].shape[1]
    for width in sorted({d_nope + d_rope, d_c + d_rope}):
        answers[f"{MLA_SCALE} (yours: 1/sqrt({width}))"] = mla_reference(
            case, 1 / math.sqrt(width))[0]
    return answers


@st.composite
def mla_cases(draw):
    num_heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    shape = dict(
        num_heads=num_heads,
        d_nope=draw(st.sampled_from([4, 8, 16])),
        d_rope=draw(st.sampled_from([2, 4, 8])),
        d_c=draw(st.sampled_from([8, 16, 32])),
        dv=draw(st.sampled_from([4, 8, 12])),
        length=draw(st.sampled_from([0, 1, 7, 33])),
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([0.5, 1.0])) / math.sqrt(shape["d_nope"] + shape["d_rope"])
    return mla_case(rng, **shape), scale


def check_mla_result(result, case, scale, name):
    assert isinstance(result, tuple) and len(result) == 2, f"{name} must return (out, lse)"
    out, lse = result
    want_out, want_lse = mla_reference(case, scale)
    assert_close(out, want_out, what=f"{name} out (L = {len(case['c_kv'])})",
                 wrong_answers=mla_wrong_answers(case, scale), **F64)
    assert_close(lse, want_lse, what=f"{name} lse", hint=LSE_HINT, **F64)


@pytest.mark.points(2)
@given(case=mla_cases())
def test_naive_mla_equals_attention_with_per_head_keys_and_values(case):
    case, scale = case
    check_mla_result(impl.mla_decode_naive(**case, scale=scale), case, scale, "mla_decode_naive")


@pytest.mark.points(3)
@given(case=mla_cases())
def test_absorbed_mla_equals_naive_mla_and_the_reference(case):
    """Folding w_uk into the query and w_uv after the weighted sum changes nothing but the
    order of the products: the three agree to 1e-12 in float64."""
    case, scale = case
    absorbed = impl.mla_decode_absorbed(**case, scale=scale)
    check_mla_result(absorbed, case, scale, "mla_decode_absorbed")
    naive = impl.mla_decode_naive(**case, scale=scale)
    assert_close(absorbed[0], naive[0], what="absorbed vs naive out", **F64)


@pytest.mark.points(3)
def test_absorbed_mla_never_builds_per_head_keys_or_values():
    """The point of absorption: attention runs over the [L, d_c + d_rope] latent rows every
    head shares. Building per-head keys [L, H, d_nope] (or values [L, H, dv], which is what
    applying w_uv before the weighted sum does) costs H times the latent's memory.

    Measured by common.testing.peak_memory: tracemalloc in a plain run; under the grader
    the sandboxed worker's resident high-water mark, read from outside it. The arrays
    it looks for are 32 MiB, so glibc maps them fresh and they always count."""
    rng = np.random.default_rng(3)
    num_heads, d_nope, d_rope, d_c, dv, length = 16, 32, 16, 32, 32, 8192
    case = mla_case(rng, num_heads, d_nope, d_rope, d_c, dv, length)
    scale = 1 / math.sqrt(d_nope + d_rope)
    per_head = length * num_heads * min(d_nope, dv) * 8  # one [L, H, d] float64 array
    result, peak = peak_memory(impl.mla_decode_absorbed, **case, scale=scale)
    check_mla_result(result, case, scale, "mla_decode_absorbed")
    assert peak < per_head * 3 // 4, (  # room for the inputs' copies the grader counts
        f"mla_decode_absorbed allocated {peak:,} bytes at its peak; one per-head [L={length}, "
        f"H={num_heads}, d=32] float64 array is {per_head:,}. The absorbed form never builds "
        "per-head keys (fold w_uk into the query: q_latent = q_nope · w_ukᵀ) nor per-head "
        "values (apply w_uv to the [H, d_c] weighted sum of the latents, after it)"
    )


# ---- 3. sliding windows in numpy -------------------------------------------------------------


@pytest.mark.points(3)
@given(case=window_cases())
def test_window_decode_sees_exactly_the_window_most_recent_tokens(case):
    """Windows of 1, inside a block, over several blocks and longer than the sequence; every
    head ratio; the blocks before the window are NaN."""
    q, k, v, window, paged = case
    out, lse = run_decode(impl.window_decode_attention, q, paged, window)
    want_out, want_lse = reference_decode(q, k, v, window=window)
    assert_close(out, want_out, what=f"out (seq_len {len(k)}, window {window}, block size "
                 f"{paged.block_size})", wrong_answers=window_wrong_answers(q, k, v, window),
                 nan_hint=WINDOW_NAN, **F64)
    assert_close(lse, want_lse, what="lse", hint=LSE_HINT, nan_hint=WINDOW_NAN, **F64)


@pytest.mark.points(1)
def test_a_window_of_one_returns_the_new_tokens_own_value():
    rng = np.random.default_rng(4)
    (k,), (v,) = random_kv(rng, [13], 2, 8)
    paged = poison_before_windows(build_paged_kv([k], [v], 4, rng=rng), 1)
    q = rng.standard_normal((4, 8))
    out, lse = run_decode(impl.window_decode_attention, q, paged, 1)
    heads = np.arange(4) // 2
    assert_close(out, v[-1, heads], what="out with window 1", nan_hint=WINDOW_NAN,
                 wrong_answers=window_wrong_answers(q, k, v, 1), **F64)
    assert_close(lse, np.einsum("hd,hd->h", q, k[-1, heads]) / math.sqrt(8),
                 what="lse with window 1 (the one score)", **F64)


@pytest.mark.points(1)
def test_a_window_longer_than_the_sequence_is_plain_decode():
    rng = np.random.default_rng(5)
    (k,), (v,) = random_kv(rng, [10], 1, 4)
    paged = build_paged_kv([k], [v], 3, rng=rng)
    q = rng.standard_normal((2, 4))
    for window in (10, 11, 1000):
        out, lse = run_decode(impl.window_decode_attention, q, paged, window)
        want_out, want_lse = reference_decode(q, k, v)
        assert_close(out, want_out, what=f"out with window {window} >= seq_len 10", **F64)
        assert_close(lse, want_lse, what=f"lse with window {window}", **F64)


@pytest.mark.points(2)
def test_table_entries_before_the_window_may_be_padding_and_are_never_read():
    """vLLM frees the blocks that fell out of a sliding window; their table entries then
    name nothing useful. Here they are -1 (the cache's last block, what -1 indexes in numpy,
    is NaN) or a block number far past the cache: reading one is an error."""
    rng = np.random.default_rng(6)
    block_size, seq_len, window = 4, 30, 9  # the window is positions 21..29: blocks 5..7
    (k,), (v,) = random_kv(rng, [seq_len], 1, 4)
    paged = build_paged_kv([k], [v], block_size, rng=rng, extra_blocks=1, shuffle=False)
    paged.k_cache[-1] = paged.v_cache[-1] = np.nan
    table = paged.block_tables[0].copy()
    table[:5] = [-1, 10**6, -1, 10**6, -1]
    q = rng.standard_normal((2, 4))
    out, lse = impl.window_decode_attention(q, paged.k_cache, paged.v_cache, table, seq_len,
                                            window)
    want_out, want_lse = reference_decode(q, k, v, window=window)
    assert_close(out, want_out, what="out with -1 before the window", nan_hint=WINDOW_NAN,
                 wrong_answers=window_wrong_answers(q, k, v, window), **F64)
    assert_close(lse, want_lse, what="lse", nan_hint=WINDOW_NAN, **F64)


@pytest.mark.points(1)
@pytest.mark.parametrize("head_dim", ODD_HEAD_DIMS)
def test_window_decode_with_odd_head_dims_uses_the_default_scale(head_dim):
    rng = np.random.default_rng(head_dim)
    (k,), (v,) = random_kv(rng, [21], 2, head_dim)
    paged = poison_before_windows(build_paged_kv([k], [v], 4, rng=rng, padding="poisoned"), 7)
    q = rng.standard_normal((4, head_dim))
    out, _ = run_decode(impl.window_decode_attention, q, paged, 7)
    assert_close(out, reference_decode(q, k, v, window=7)[0], what=f"out (head_dim {head_dim})",
                 nan_hint=WINDOW_NAN, hint="scale = 1 / sqrt(head_dim) by default", **F64)


# ---- 4. attention sinks in numpy -------------------------------------------------------------


@pytest.mark.points(3)
@given(case=window_cases(heads=st.sampled_from([(1, 1), (4, 2), (8, 1), (6, 3), (32, 8)])),
       windowed=st.booleans(), sink_size=st.sampled_from([0.0, 2.0, 6.0]))
def test_sinks_join_the_denominator_and_add_no_value(case, windowed, sink_size):
    """With and without a window. The sinks are per head, some of them large enough to
    take most of the weight."""
    q, k, v, window, paged = case
    if not windowed:  # the whole context: a cache without the window's poison
        window, paged = None, build_paged_kv([k], [v], paged.block_size, rng=0,
                                             padding="poisoned")
    rng = np.random.default_rng(len(k) + q.shape[0])
    sinks = sink_size + 2 * rng.standard_normal(q.shape[0])
    out, lse = run_decode(impl.sink_decode_attention, q, paged, sinks, window=window)
    want_out, want_lse = reference_decode(q, k, v, window=window, sinks=sinks)
    wrong = sink_wrong_answers(q, k, v, sinks, window)
    if window is not None:
        wrong.update(window_wrong_answers(q, k, v, window, sinks))
    assert_close(out, want_out, what=f"out with sinks (window {window}, seq_len {len(k)})",
                 wrong_answers=wrong, nan_hint=WINDOW_NAN, **F64)
    assert_close(lse, want_lse, what="lse with sinks", hint=LSE_HINT + ": log(sum exp(s) + "
                 "exp(sink))", nan_hint=WINDOW_NAN, **F64)


@pytest.mark.points(1)
def test_a_sink_of_minus_infinity_is_no_sink_and_an_empty_context_gives_the_sink_as_lse():
    rng = np.random.default_rng(7)
    (k,), (v,) = random_kv(rng, [9], 2, 4)
    paged = build_paged_kv([k, k[:0]], [v, v[:0]], 4, rng=rng, padding="poisoned")
    q = rng.standard_normal((4, 4))
    out, lse = run_decode(impl.sink_decode_attention, q, paged, np.full(4, -np.inf))
    want_out, want_lse = reference_decode(q, k, v)
    assert_close(out, want_out, what="out with sinks = -inf", **F64)
    assert_close(lse, want_lse, what="lse with sinks = -inf", **F64)

    sinks = np.array([0.5, -1.0, 3.0, -np.inf])
    out, lse = impl.sink_decode_attention(q, paged.k_cache, paged.v_cache, paged.block_tables[1],
                                          0, sinks)
    assert_close(out, np.zeros((4, 4)), what="out of an empty context with sinks",
                 hint="nothing to attend: output 0 (the sink has no value)", **F64)
    assert_close(lse, sinks, what="lse of an empty context with sinks",
                 hint="the denominator is exp(sink) alone, so lse = sink", **F64)



@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_window_and_sink_decode_take_the_scale_keyword(scale):
    """``scale=`` of window_decode_attention and sink_decode_attention (with and without a
    window): the scores are scaled, the sink logits are not."""
    rng = np.random.default_rng(17)
    (k,), (v,) = random_kv(rng, [13], 2, 8)
    paged = build_paged_kv([k], [v], 4, rng=rng, padding="poisoned")
    q, sinks = rng.standard_normal((4, 8)), np.array([0.5, -1.0, 2.0, -np.inf])
    wrong_name = SCALE_ZERO_AS_DEFAULT if scale == 0 else SCALE_IGNORED
    cases = [("window_decode_attention(window=5)", impl.window_decode_attention, (5,),
              {"window": 5}),
             ("sink_decode_attention", impl.sink_decode_attention, (sinks,), {"sinks": sinks}),
             ("sink_decode_attention(window=5)", impl.sink_decode_attention, (sinks, 5),
              {"sinks": sinks, "window": 5})]  # fmt: skip
    for what, fn, args, ref in cases:
        out, lse = run_decode(fn, q, paged, *args, scale=scale)
        want_out, want_lse = reference_decode(q, k, v, scale=scale, **ref)
        default_out, _ = reference_decode(q, k, v, **ref)
        assert_close(out, want_out, what=f"{what} out (scale={scale})",
                     wrong_answers={wrong_name: default_out}, **F64)  # fmt: skip
        assert_close(lse, want_lse, what=f"{what} lse (scale={scale})", **F64)

# ---- 5. Triton: window and sinks in lab 01's kernel -----------------------------------------


def run_window_triton(q, paged, window=None, sinks=None, scale=None, *, dtype=torch.float32,
                      block_n=None, max_seq_len=None, layout=None, reports=None, **extra):
    """``layout``: q, the caches and the block table as ``strided_view``s; ``reports``: a
    list that gets ``kernel_memory``'s per-launch reports."""
    t = paged.to_torch(dtype, DEVICE)
    q_t = torch.tensor(q, dtype=dtype, device=DEVICE)
    sinks_t = None if sinks is None else torch.tensor(sinks, dtype=torch.float32, device=DEVICE)
    tensors = [q_t, t["k_cache"], t["v_cache"], t["block_tables"]]
    if layout is not None:
        tensors = [strided_view(x, layout) for x in tensors]
    args = (*tensors, t["seq_lens"], window, sinks_t)
    kwargs = {"scale": scale, "block_n": block_n, "max_seq_len": max_seq_len, **extra}
    with raised_as(P_NOT_CAST, when="must be same dtype"):
        if reports is None:
            result = impl.paged_decode_window_sink_triton(*args, **kwargs)
        else:
            result, launches = kernel_memory(impl.paged_decode_window_sink_triton, *args,
                                             **kwargs)
            reports.extend(launches)
    assert isinstance(result, tuple) and len(result) == 2, (
        "paged_decode_window_sink_triton must return the pair (out, lse)")
    out, lse = result
    assert tuple(out.shape) == q.shape and tuple(lse.shape) == q.shape[:2], (
        f"out {tuple(out.shape)} and lse {tuple(lse.shape)}: expected {q.shape} and "
        f"{q.shape[:2]}")
    return out.detach().cpu().double().numpy(), lse.detach().cpu().double().numpy()


def window_triton_case(rng, num_heads, num_kv_heads, head_dim, block_size, lens, window,
                       with_sinks, dtype=np.float32):
    ks, vs = random_kv(rng, lens, num_kv_heads, head_dim)
    ks, vs = [rounded(k, dtype) for k in ks], [rounded(v, dtype) for v in vs]
    paged = build_paged_kv(ks, vs, block_size, rng=rng, padding="poisoned")
    q = rounded(rng.standard_normal((len(lens), num_heads, head_dim)), dtype)
    sinks = rounded(1.0 + 2 * rng.standard_normal(num_heads)) if with_sinks else None
    return q, ks, vs, poison_before_windows(paged, window), sinks


def check_window_triton(out, lse, q, ks, vs, window, sinks, tol, scale=None, hint=""):
    for b in range(len(ks)):
        want_out, want_lse = reference_decode(q[b], ks[b], vs[b], window=window, sinks=sinks,
                                              scale=scale)
        wrong = {}
        if window is not None:
            wrong.update(window_wrong_answers(q[b], ks[b], vs[b], window, sinks, scale))
        if sinks is not None:
            wrong.update(sink_wrong_answers(q[b], ks[b], vs[b], sinks, window, scale))
        what = f"sequence {b} (seq_len {len(ks[b])}, window {window}, sinks {sinks is not None})"
        assert_close(out[b], want_out, what=f"out of {what}", wrong_answers=wrong,
                     nan_hint=KERNEL_NAN, hint=hint, **tol)
        assert_close(lse[b], want_lse, what=f"lse of {what}", hint=LSE_HINT, **tol)


WINDOW_TRITON_CASES = [
    # num_heads, num_kv_heads, head_dim, block_size, lens, window, sinks, block_n
    pytest.param(4, 2, 16, 4, [23, 5], 6, False, 16, id="window-over-2-blocks-tile16"),
    pytest.param(4, 2, 16, 4, [23, 5], 6, True, 32, id="window-and-sinks-tile32"),
    pytest.param(4, 1, 16, 3, [40, 2], 1, True, 16, id="window-1-block3-tile16"),
    pytest.param(2, 2, 16, 16, [37], 5, False, 16, id="window-inside-a-block-of-16"),
    pytest.param(2, 2, 16, 16, [37], 20, True, 32, id="window-20-block16-tile32"),
    pytest.param(4, 2, 16, 48, [50, 7], 30, True, 16, id="block48-larger-than-tile"),
    pytest.param(2, 1, 16, 1, [30], 12, False, 32, id="block-size-1-tile32"),
    pytest.param(4, 2, 16, 4, [9, 0], 100, True, 16, id="window-longer-than-seq-empty-seq"),
    pytest.param(4, 2, 16, 4, [19, 3], None, True, 16, id="sinks-without-window"),
]


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size, lens, window, with_sinks, block_n",
    WINDOW_TRITON_CASES,
)
@basic_value_test
def test_triton_window_sink_kernel_equals_the_reference_at_every_tile_size(
    num_heads, num_kv_heads, head_dim, block_size, lens, window, with_sinks, block_n
):
    rng = np.random.default_rng(block_size * 100 + sum(lens))
    q, ks, vs, paged, sinks = window_triton_case(rng, num_heads, num_kv_heads, head_dim,
                                                 block_size, lens, window, with_sinks)
    scale = 0.7 / math.sqrt(head_dim)
    out, lse = run_window_triton(q, paged, window, sinks, scale, block_n=block_n)
    check_window_triton(out, lse, q, ks, vs, window, sinks, F32, scale, hint=(
        f"block_n={block_n}, block_size={block_size}: the loop starts at position "
        "max(seq_len - window, 0) (tiles need not start on a block boundary)"))


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 2), (32, 1)],
                         ids=["8q-2kv", "32q-1kv-group-above-16"])
def test_triton_window_sink_kernel_packs_every_group_size_into_one_tile(num_heads, num_kv_heads):
    rng = np.random.default_rng(num_heads)
    q, ks, vs, paged, sinks = window_triton_case(rng, num_heads, num_kv_heads, 16, 4, [21], 9,
                                                 True)
    out, lse = run_window_triton(q, paged, 9, sinks)
    check_window_triton(out, lse, q, ks, vs, 9, sinks, F32,
                        hint="query head h reads KV head h // group; its sink is sinks[h]")


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("head_dim", ODD_HEAD_DIMS[:2])
def test_triton_window_sink_kernel_pads_odd_head_dims_and_keeps_the_real_scale(head_dim):
    rng = np.random.default_rng(head_dim)
    q, ks, vs, paged, sinks = window_triton_case(rng, 2, 1, head_dim, 4, [18], 7, True)
    out, lse = run_window_triton(q, paged, 7, sinks)
    check_window_triton(out, lse, q, ks, vs, 7, sinks, F32,
                        hint="the default scale is 1/sqrt(head_dim), not of the padded tile")


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_window_sink_kernel_in_float16_matches_the_reference():
    rng = np.random.default_rng(12)
    q, ks, vs, paged, sinks = window_triton_case(rng, 4, 1, 32, 8, [3, 37], 20, True,
                                                 dtype=np.float16)
    out, lse = run_window_triton(q, paged, 20, sinks, dtype=torch.float16, block_n=32)
    atol, rtol = tolerance("float16")
    check_window_triton(out, lse, q, ks, vs, 20, sinks, dict(atol=atol, rtol=rtol),
                        hint="accumulate in float32: m, l and acc stay float32")


# ---- 6. Triton: MLA decode over a paged latent cache -----------------------------------------


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_window_sink_kernel_reads_transposed_and_sliced_views_through_their_strides(
    layout,
):
    """"transposed": q stored [H, B, d], the caches [blocks, KVH, page, d]; "sliced": every
    other row of a bigger storage at an offset, NaN between the rows (block table too).
    On the interpreter, no two programs of the launch store one element."""
    rng = np.random.default_rng(61)
    q, ks, vs, paged, sinks = window_triton_case(rng, 4, 2, 16, 4, [23, 5], 6, True)
    reports: list = []
    out, lse = run_window_triton(q, paged, 6, sinks, block_n=16, layout=layout,
                                 reports=reports)
    check_window_triton(out, lse, q, ks, vs, 6, sinks, F32, hint=(
        f"{layout} views: use every tensor's own strides, one per dim"))
    assert_no_races(reports, "paged_decode_window_sink_triton")
    assert_loads_in_bounds(reports, "paged_decode_window_sink_triton")


def mla_triton_case(rng, num_heads, d_c, d_rope, block_size, lens, dtype=np.float32):
    """(q_latent [B, H, d_c], q_pe [B, H, d_rope], latent rows per sequence, paged cache)."""
    rows = [rounded(rng.standard_normal((n, 1, d_c + d_rope)), dtype) for n in lens]
    paged = build_paged_kv(rows, rows, block_size, rng=rng, padding="poisoned")
    q_latent = rounded(rng.standard_normal((len(lens), num_heads, d_c)), dtype)
    q_pe = rounded(rng.standard_normal((len(lens), num_heads, d_rope)), dtype)
    return q_latent, q_pe, rows, paged


def run_mla_triton(q_latent, q_pe, paged, scale=None, *, dtype=torch.float32, layout=None,
                   reports=None, **kwargs):
    """``layout`` and ``reports`` as in ``run_window_triton``."""
    kv_cache = torch.tensor(paged.k_cache[:, :, 0, :], dtype=dtype, device=DEVICE)
    t = paged.to_torch(dtype, DEVICE)
    tensors = [torch.tensor(q_latent, dtype=dtype, device=DEVICE),
               torch.tensor(q_pe, dtype=dtype, device=DEVICE), kv_cache, t["block_tables"]]
    if layout is not None:
        tensors = [strided_view(x, layout) for x in tensors]
    if reports is None:
        result = impl.mla_decode_triton(*tensors, t["seq_lens"], scale=scale, **kwargs)
    else:
        result, launches = kernel_memory(impl.mla_decode_triton, *tensors, t["seq_lens"],
                                         scale=scale, **kwargs)
        reports.extend(launches)
    assert isinstance(result, tuple) and len(result) == 2, "mla_decode_triton returns (out, lse)"
    out, lse = result
    assert tuple(out.shape) == q_latent.shape, (
        f"out_latent has shape {tuple(out.shape)}, expected [B, H, d_c] = {q_latent.shape}")
    return out.detach().cpu().double().numpy(), lse.detach().cpu().double().numpy()


def mla_latent_reference(q_latent, q_pe, rows, scale=None):
    """Absorbed MLA over latent rows [L, 1, d_c + d_rope]: MQA whose value is the latent."""
    d_c = q_latent.shape[-1]
    q = np.concatenate([q_latent, q_pe], axis=-1)
    return reference_decode(q, rows, rows[:, :, :d_c], scale=scale)


SPLIT_RANGE_IGNORED = (
    "lse is log(num_splits) too big: every split read all the keys, so the merge counted "
    "each key num_splits times; a split covers its own chunk of the keys only"
)


def check_mla_triton(out, lse, q_latent, q_pe, rows, tol, scale=None, hint="", num_splits=1):
    d_c = q_latent.shape[-1]
    for b, r in enumerate(rows):
        want_out, want_lse = mla_latent_reference(q_latent[b], q_pe[b], r, scale)
        no_rope = reference_decode(q_latent[b], r[:, :, :d_c], r[:, :, :d_c],
                                   scale=scale or 1 / math.sqrt(r.shape[-1]))[0]
        assert_close(out[b], want_out, what=f"out_latent of sequence {b} (seq_len {len(r)})",
                     wrong_answers={ROPE_ABSORBED: no_rope}, nan_hint=KERNEL_NAN, hint=hint,
                     **tol)
        wrong = {SPLIT_RANGE_IGNORED: want_lse + math.log(num_splits)} if num_splits > 1 else {}
        assert_close(lse[b], want_lse, what=f"lse of sequence {b}", hint=LSE_HINT,
                     wrong_answers=wrong, **tol)


MLA_TRITON_CASES = [
    # num_heads, d_c, d_rope, block_size, lens, block_n, block_h
    pytest.param(4, 32, 16, 4, [9, 30], 16, None, id="4-heads-block4-tile16"),
    pytest.param(16, 64, 16, 16, [40, 1], 32, None, id="16-heads-one-tile-tile32"),
    pytest.param(8, 48, 8, 3, [0, 25], 16, None, id="odd-widths-empty-seq-block3"),
    pytest.param(32, 32, 16, 48, [50], 16, 16, id="32-heads-two-tiles-block48"),
]



@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_window_sink_kernel_accumulates_float16_in_float32():
    """float16 values of +-30 that cancel over a 64-token window, 16-key tiles, a sink."""
    rng = np.random.default_rng(18)
    (k,), (v,) = random_kv(rng, [70], 1, 16)
    ks = [k.astype(np.float16).astype(np.float64)]
    v[6:] = cancelling(0.1 * v[6:])  # the window: positions 6..69
    vs = [v.astype(np.float16).astype(np.float64)]
    paged = poison_before_windows(build_paged_kv(ks, vs, 16, rng=rng, padding="poisoned"), 64)
    q = (0.05 * rng.standard_normal((1, 4, 16))).astype(np.float16).astype(np.float64)
    sinks = np.array([0.5, -1.0, 2.0, 0.0])
    out, lse = run_window_triton(q, paged, 64, sinks, dtype=torch.float16, block_n=16)
    check_window_triton(out, lse, q, ks, vs, 64, sinks, dict(zip(("atol", "rtol"),
                        tolerance("float16"))), hint=ACC_IN_FP16)  # fmt: skip


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", ["window_sink", "mla"])
def test_triton_kernels_take_scale_zero_as_a_scale(kernel):
    """scale=0.0 gives every key the same weight: it is not "use the default"."""
    rng = np.random.default_rng(29)
    hint = ("scale=0 was taken for 'use the default' (`scale or ...`): only None means "
            "the default (`if scale is None`)")
    if kernel == "mla":
        q_latent, q_pe, rows, paged = mla_triton_case(rng, 4, 32, 16, 4, [13, 6])
        out, lse = run_mla_triton(q_latent, q_pe, paged, 0.0, block_n=16)
        check_mla_triton(out, lse, q_latent, q_pe, rows, F32, 0.0, hint=hint)
        return
    q, ks, vs, paged, sinks = window_triton_case(rng, 4, 2, 16, 4, [13, 6], 5, True)
    out, lse = run_window_triton(q, paged, 5, sinks, 0.0, block_n=16)
    check_window_triton(out, lse, q, ks, vs, 5, sinks, F32, 0.0, hint=hint)

@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("num_heads, d_c, d_rope, block_size, lens, block_n, block_h",
                         MLA_TRITON_CASES)
def test_triton_mla_kernel_equals_attention_over_the_latent_cache(
    num_heads, d_c, d_rope, block_size, lens, block_n, block_h
):
    """One latent row per token is every head's key (with the rope part) and value."""
    rng = np.random.default_rng(num_heads + d_c + block_size)
    q_latent, q_pe, rows, paged = mla_triton_case(rng, num_heads, d_c, d_rope, block_size, lens)
    out, lse = run_mla_triton(q_latent, q_pe, paged, block_n=block_n, block_h=block_h)
    check_mla_triton(out, lse, q_latent, q_pe, rows, F32, hint=(
        "scores = q_latent · c + q_pe · k_pe over the cache row [c (d_c) | k_pe (d_rope)]; "
        "acc += p · c; the default scale is 1/sqrt(d_c + d_rope); with more query heads than "
        "BLOCK_H, program head_tile serves heads head_tile * BLOCK_H .. head_tile * BLOCK_H + "
        "BLOCK_H - 1 (add its head tile's offset), not heads 0 .. BLOCK_H - 1"))


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_mla_kernel_reads_transposed_and_sliced_views_through_their_strides(layout):
    """The latent cache's rows need not be packed: "transposed" stores it [page, blocks,
    width], "sliced" keeps every other row of a bigger storage at an offset, NaN between."""
    rng = np.random.default_rng(62)
    q_latent, q_pe, rows, paged = mla_triton_case(rng, 16, 32, 16, 4, [21, 9])
    reports: list = []
    out, lse = run_mla_triton(q_latent, q_pe, paged, block_n=16, layout=layout,
                              reports=reports)
    check_mla_triton(out, lse, q_latent, q_pe, rows, F32, hint=(
        f"{layout} views: the latent row of slot s of block b is at b * stride_block + "
        "s * stride_slot, whatever the layout"))
    assert_no_races(reports, "mla_decode_triton")
    assert_loads_in_bounds(reports, "mla_decode_triton")


@pytest.mark.triton
@pytest.mark.points(2)
def test_triton_mla_decode_with_w_uv_afterwards_equals_naive_mla():
    """End to end: absorb w_uk into the query on the host, run the kernel over the paged
    latent cache, apply w_uv to its output: the naive MLA answer."""
    rng = np.random.default_rng(21)
    num_heads, d_nope, d_rope, d_c, dv, lens = 8, 16, 16, 32, 16, [27, 6]
    cases = [mla_case(rng, num_heads, d_nope, d_rope, d_c, dv, n) for n in lens]
    for case in cases[1:]:  # one model: the weights are the same for every sequence
        case["w_uk"], case["w_uv"] = cases[0]["w_uk"], cases[0]["w_uv"]
    rows = [rounded(np.concatenate([c["c_kv"], c["k_pe"]], axis=1)[:, None]) for c in cases]
    paged = build_paged_kv(rows, rows, 4, rng=rng, padding="poisoned")
    q_latent = rounded(np.stack([np.einsum("hn,hcn->hc", c["q_nope"], c["w_uk"])
                                 for c in cases]))
    q_pe = rounded(np.stack([c["q_pe"] for c in cases]))
    scale = 1 / math.sqrt(d_nope + d_rope)
    out_latent, lse = run_mla_triton(q_latent, q_pe, paged, scale)
    for b, case in enumerate(cases):
        case["c_kv"], case["k_pe"] = rows[b][:, 0, :d_c], rows[b][:, 0, d_c:]
        want_out, want_lse = mla_reference(case, scale)  # naive MLA, float64
        got = np.einsum("hc,hcv->hv", out_latent[b], case["w_uv"])
        assert_close(got, want_out, what=f"out_latent · w_uv of sequence {b}", atol=2e-4,
                     rtol=2e-4, nan_hint=KERNEL_NAN, hint="the kernel returns the weighted sum "
                     "of latents per head; w_uv maps it to the head's output")
        assert_close(lse[b], want_lse, what=f"lse of sequence {b}", atol=2e-4, rtol=2e-4)


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_mla_kernel_in_float16_matches_the_reference():
    rng = np.random.default_rng(22)
    q_latent, q_pe, rows, paged = mla_triton_case(rng, 4, 32, 16, 8, [5, 33], dtype=np.float16)
    out, lse = run_mla_triton(q_latent, q_pe, paged, dtype=torch.float16, block_n=32)
    atol, rtol = tolerance("float16")
    check_mla_triton(out, lse, q_latent, q_pe, rows, dict(atol=atol, rtol=rtol))


def window_sync_case(rng):
    """``(launcher, args, check)`` for the host-sync test: window 8, sinks, lengths 6 and 19."""
    q, ks, vs, paged, sinks = window_triton_case(rng, 4, 2, 16, 4, [6, 19], 8, True)
    t = paged.to_torch(torch.float32, DEVICE)
    args = (torch.tensor(q, dtype=torch.float32, device=DEVICE), t["k_cache"], t["v_cache"],
            t["block_tables"], t["seq_lens"], 8,
            torch.tensor(sinks, dtype=torch.float32, device=DEVICE))
    return impl.paged_decode_window_sink_triton, args, lambda out, lse: check_window_triton(
        out, lse, q, ks, vs, 8, sinks, F32)


def mla_sync_case(rng):
    """``(launcher, args, check)`` for the host-sync test: MLA over lengths 6 and 19."""
    q_latent, q_pe, rows, paged = mla_triton_case(rng, 4, 32, 16, 4, [6, 19])
    t = paged.to_torch(torch.float32, DEVICE)
    args = (torch.tensor(q_latent, dtype=torch.float32, device=DEVICE),
            torch.tensor(q_pe, dtype=torch.float32, device=DEVICE),
            torch.tensor(paged.k_cache[:, :, 0, :], dtype=torch.float32, device=DEVICE),
            t["block_tables"], t["seq_lens"])
    return impl.mla_decode_triton, args, lambda out, lse: check_mla_triton(
        out, lse, q_latent, q_pe, rows, F32)


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("case", [window_sync_case, mla_sync_case], ids=["window", "mla"])
def test_triton_launchers_make_no_host_sync_when_max_seq_len_is_given(case):
    """Measured by common.testing.host_syncs inside the process that runs the code (under
    the grader, the sandboxed worker): a teaching check, since a submission that undoes
    its patching of torch.Tensor is not caught (README: not defended)."""
    launcher, args, check = case(np.random.default_rng(10))
    (out, lse), syncs = host_syncs(launcher, *args, max_seq_len=19)
    assert syncs == [], (
        f"with max_seq_len given the launcher must not read device tensors on the host, but "
        f"it did: {syncs}. Each program reads its own seq_len (and so its window's start)")
    check(out.double().numpy(), lse.double().numpy())

    _, syncs = host_syncs(launcher, *args)
    copies = [s for s in syncs if not s.startswith(("Tensor.numpy()", "Tensor.__array__()"))]
    assert len(copies) <= 1, (
        f"without max_seq_len the launcher may copy seq_lens to the host once, not "
        f"{len(copies)} times: {copies}")


# ---- 7. Split-KV: every split a partial (out, lse), merged exactly ----------------------------

SINK_PER_SPLIT = (
    "the sink was counted once per split: it is one term of the softmax denominator, so it "
    "belongs to one split's state only (split 0); the merge adds the splits' denominators"
)
SPLIT_HINT = (
    "with num_splits = S, program_id(2) is the split: it covers whole BLOCK_N tiles of the "
    "visible keys, lo = start + split * chunk up to min(lo + chunk, seq_len), and stores its "
    "(out, lse) at its split row; provided.merge_splits combines them"
)


def sink_in_every_split(q, ks, vs, window, sinks, scale, num_splits, block_n):
    """The answer when each of the non-empty splits starts from the sink (the classic
    split-KV sink bug): the denominator gains exp(sink) once per split that has keys, plus
    once if split 0 has none."""
    start = 0 if window is None else max(len(ks) - window, 0)
    visible = len(ks) - start
    chunk = math.ceil(math.ceil(visible / num_splits) / block_n) * block_n
    counted = max(1, sum(1 for s in range(num_splits) if s * chunk < visible))
    return reference_decode(q, ks, vs, window=window, sinks=sinks + np.log(counted),
                            scale=scale)[0]


SPLIT_CASES = [
    # num_heads, num_kv_heads, lens, window, sinks
    pytest.param(4, 2, [37, 5, 0], None, True, id="sinks-no-window-empty-seq"),
    pytest.param(4, 2, [50, 18], 40, True, id="window-40-and-sinks"),
    pytest.param(2, 1, [45], 33, False, id="window-33-no-sinks"),
]


@pytest.mark.triton
@pytest.mark.points(0.5)
@pytest.mark.parametrize("num_splits", [1, 2, 3])
@pytest.mark.parametrize("num_heads, num_kv_heads, lens, window, with_sinks", SPLIT_CASES)
def test_triton_window_sink_kernel_split_over_the_keys_merges_to_the_reference(
    num_heads, num_kv_heads, lens, window, with_sinks, num_splits
):
    """``num_splits`` = 1, 2, 3 at 16-key tiles: the same answer, the sink counted once."""
    rng = np.random.default_rng(70 + sum(lens))
    q, ks, vs, paged, sinks = window_triton_case(rng, num_heads, num_kv_heads, 16, 4, lens,
                                                 window, with_sinks)
    out, lse = run_window_triton(q, paged, window, sinks, block_n=16, num_splits=num_splits)
    for b in range(len(ks)):
        want_out, want_lse = reference_decode(q[b], ks[b], vs[b], window=window, sinks=sinks)
        wrong = {}
        if sinks is not None and num_splits > 1:
            wrong[SINK_PER_SPLIT] = sink_in_every_split(q[b], ks[b], vs[b], window, sinks,
                                                        None, num_splits, 16)
        what = f"sequence {b} (seq_len {len(ks[b])}, window {window}, {num_splits} splits)"
        assert_close(out[b], want_out, what=f"out of {what}", wrong_answers=wrong,
                     nan_hint=KERNEL_NAN, hint=SPLIT_HINT, **F32)
        assert_close(lse[b], want_lse, what=f"lse of {what}", hint=SPLIT_HINT + ". " + LSE_HINT,
                     **F32)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_window_sink_split_reads_strided_views_and_no_two_programs_store_one_element(
    layout,
):
    """Three splits over strided views: each split stores only its own partial row."""
    rng = np.random.default_rng(63)
    q, ks, vs, paged, sinks = window_triton_case(rng, 4, 2, 16, 4, [40, 9], None, True)
    reports: list = []
    out, lse = run_window_triton(q, paged, None, sinks, block_n=16, layout=layout,
                                 reports=reports, num_splits=3)
    check_window_triton(out, lse, q, ks, vs, None, sinks, F32, hint=SPLIT_HINT)
    assert_no_races(reports, "paged_decode_window_sink_triton with 3 splits")
    assert_loads_in_bounds(reports, "paged_decode_window_sink_triton with 3 splits")


@pytest.mark.triton
@pytest.mark.points(0.5)
@pytest.mark.parametrize("num_splits", [1, 2, 3])
@pytest.mark.parametrize("layout", [None, *LAYOUTS])
def test_triton_mla_kernel_split_over_the_keys_merges_to_the_reference(num_splits, layout):
    """``num_splits`` = 1, 2, 3: the same answer; an empty sequence gives 0 and -inf; no two
    programs store one element, strided views included."""
    rng = np.random.default_rng(64 + num_splits)
    q_latent, q_pe, rows, paged = mla_triton_case(rng, 8, 32, 16, 4, [41, 0, 7])
    reports: list = []
    out, lse = run_mla_triton(q_latent, q_pe, paged, block_n=16, layout=layout,
                              reports=reports, num_splits=num_splits)
    check_mla_triton(out, lse, q_latent, q_pe, rows, F32, hint=SPLIT_HINT, num_splits=num_splits)
    assert_no_races(reports, f"mla_decode_triton with {num_splits} splits")
    assert_loads_in_bounds(reports, f"mla_decode_triton with {num_splits} splits")


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_split_kernels_in_float16_stay_within_float16_tolerance():
    """Three splits in float16: the partial outputs are float16, their lse float32."""
    rng = np.random.default_rng(66)
    q, ks, vs, paged, sinks = window_triton_case(rng, 4, 1, 32, 8, [3, 45], None, True,
                                                 dtype=np.float16)
    out, lse = run_window_triton(q, paged, None, sinks, dtype=torch.float16, block_n=16,
                                 num_splits=3)
    atol, rtol = tolerance("float16")
    check_window_triton(out, lse, q, ks, vs, None, sinks, dict(atol=atol, rtol=rtol),
                        hint=SPLIT_HINT)
    q_latent, q_pe, rows, paged = mla_triton_case(rng, 4, 32, 16, 8, [5, 40], dtype=np.float16)
    out, lse = run_mla_triton(q_latent, q_pe, paged, dtype=torch.float16, block_n=16,
                              num_splits=3)
    check_mla_triton(out, lse, q_latent, q_pe, rows, dict(atol=atol, rtol=rtol), hint=SPLIT_HINT)


# ---- bad input --------------------------------------------------------------------------------


def _cache(num_blocks=4, block_size=4, num_kv_heads=2, head_dim=8):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return np.zeros(shape), np.zeros(shape)


def _mla(**changes):
    case = mla_case(np.random.default_rng(0), 2, 4, 2, 8, 4, 5)
    case.update(changes)
    return case


BAD_NUMPY_CALLS: BadInputs = {
    "kv_bytes: an unknown kind": (
        "kind", lambda: impl.kv_bytes_per_token("mlha", 2, 8, 4)),
    "kv_bytes: gqa without num_kv_heads": (
        "num_kv_heads", lambda: impl.kv_bytes_per_token("gqa", 2, 8, 4)),
    "kv_bytes: gqa with heads that do not divide": (
        "num_kv_heads", lambda: impl.kv_bytes_per_token("gqa", 2, 8, 64, num_kv_heads=6)),
    "kv_bytes: mla without kv_lora_rank": (
        "kv_lora_rank", lambda: impl.kv_bytes_per_token("mla", 2, 8, 4, rope_dim=64)),
    "kv_bytes: zero layers": (
        "num_layers", lambda: impl.kv_bytes_per_token("mha", 0, 8, 4)),
    "mla: w_uk of the wrong shape": (
        "w_uk", lambda: impl.mla_decode_absorbed(**_mla(w_uk=np.zeros((2, 8, 5))), scale=0.5)),
    "mla: k_pe not one row per token": (
        "k_pe", lambda: impl.mla_decode_naive(**_mla(k_pe=np.zeros((4, 2))), scale=0.5)),
    "mla: no scale": (
        "scale", lambda: impl.mla_decode_absorbed(**_mla(), scale=None)),
    "window: window 0": (
        "window", lambda: impl.window_decode_attention(
            np.zeros((2, 8)), *_cache(), np.array([0, 1]), 5, 0)),
    "window: a fractional window": (
        "window", lambda: impl.window_decode_attention(
            np.zeros((2, 8)), *_cache(), np.array([0, 1]), 5, 2.5)),
    "window: a padding entry inside the window": (
        "block_table", lambda: impl.window_decode_attention(
            np.zeros((2, 8)), *_cache(), np.array([0, -1]), 6, 3)),
    "window: num_heads not a multiple of num_kv_heads": (
        "num_kv_heads", lambda: impl.window_decode_attention(
            np.zeros((3, 8)), *_cache(), np.array([0, 1]), 5, 2)),
    "window: negative seq_len": (
        "seq_len", lambda: impl.window_decode_attention(
            np.zeros((2, 8)), *_cache(), np.array([0, 1]), -1, 2)),
    "sinks: one per KV head instead of per query head": (
        "sinks", lambda: impl.sink_decode_attention(
            np.zeros((4, 8)), *_cache(), np.array([0, 1]), 5, np.zeros(2))),
    "sinks: window 0": (
        "window", lambda: impl.sink_decode_attention(
            np.zeros((2, 8)), *_cache(), np.array([0, 1]), 5, np.zeros(2), window=0)),
}


test_bad_input_raises_a_value_error_that_names_the_argument = bad_input_test(
    BAD_NUMPY_CALLS, points=0.5)


def _window_inputs(**shape) -> tuple:
    return zero_paged_decode_torch(DEVICE, **shape)


def _mla_inputs(num_heads=2, d_c=32, d_rope=16, width=48, lens=(5,), max_blocks=2, dtype=None):
    return (torch.zeros(len(lens), num_heads, d_c, device=DEVICE, dtype=dtype),
            torch.zeros(len(lens), num_heads, d_rope, device=DEVICE, dtype=dtype),
            torch.zeros(4, 4, width, device=DEVICE, dtype=dtype),
            torch.zeros(len(lens), max_blocks + 8, dtype=torch.int32,
                        device=DEVICE)[:, :max_blocks],
            torch.tensor(lens, dtype=torch.int32, device=DEVICE))


BAD_TRITON_CALLS: BadInputs = {
    "window: window 0": ("window", lambda: impl.paged_decode_window_sink_triton(
        *_window_inputs(), 0)),
    "window: sinks per KV head": ("sinks", lambda: impl.paged_decode_window_sink_triton(
        *_window_inputs(num_heads=4), 3, torch.zeros(2))),
    "window: block_tables too narrow": ("block_tables", lambda: (
        impl.paged_decode_window_sink_triton(*_window_inputs(lens=(9,)), 3))),
    "window: block_n not a power of two": ("block_n", lambda: (
        impl.paged_decode_window_sink_triton(*_window_inputs(), 3, block_n=24))),
    "window: negative max_seq_len": ("max_seq_len", lambda: (
        impl.paged_decode_window_sink_triton(*_window_inputs(), 3, max_seq_len=-1))),
    "mla: kv_cache narrower than d_c + d_rope": ("kv_cache", lambda: impl.mla_decode_triton(
        *_mla_inputs(width=40))),
    "mla: q_pe with other heads than q_latent": ("q_pe", lambda: impl.mla_decode_triton(
        *_mla_inputs()[:1], torch.zeros(1, 3, 16), *_mla_inputs()[2:])),
    "mla: block_tables too narrow": ("block_tables", lambda: impl.mla_decode_triton(
        *_mla_inputs(lens=(9,)))),
    "mla: block_h not a power of two": ("block_h", lambda: impl.mla_decode_triton(
        *_mla_inputs(), block_h=24)),
    "mla: block_n below 16": ("block_n", lambda: impl.mla_decode_triton(
        *_mla_inputs(), block_n=8)),
    "window: num_splits 0": ("num_splits", lambda: impl.paged_decode_window_sink_triton(
        *_window_inputs(), 3, num_splits=0)),
    "mla: num_splits 1.5": ("num_splits", lambda: impl.mla_decode_triton(
        *_mla_inputs(), num_splits=1.5)),
    # on a GPU bfloat16 runs; only the interpreter's bf16 tl.dot is wrong
    **({"window: bfloat16 on the interpreter": ("bfloat16", lambda: (
            impl.paged_decode_window_sink_triton(*_window_inputs(dtype=torch.bfloat16), 4))),
        "mla: bfloat16 on the interpreter": ("bfloat16", lambda: impl.mla_decode_triton(
            *_mla_inputs(dtype=torch.bfloat16)))} if on_interpreter() else {}),
}


test_triton_launchers_reject_bad_input_with_a_value_error_naming_the_argument = bad_input_test(
    BAD_TRITON_CALLS, points=0.5, marks=(pytest.mark.triton,))


# ---- on a GPU: realistic sizes ----------------------------------------------------------------


def cuda_block_tables(lens: list[int], block_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(block_tables, seq_lens, blocks used)`` on the GPU: each sequence's blocks drawn from
    a shuffled pool, padding entries -1."""
    blocks = [-(-n // block_size) for n in lens]
    perm = torch.randperm(sum(blocks), device="cuda")
    tables = torch.full((len(lens), max(blocks)), -1, dtype=torch.int32, device="cuda")
    for b, start in enumerate(np.cumsum([0, *blocks[:-1]])):
        tables[b, :blocks[b]] = perm[start:start + blocks[b]]
    return tables, torch.tensor(lens, dtype=torch.int32, device="cuda"), sum(blocks)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(2)
def test_triton_mla_kernel_on_a_gpu_at_deepseek_size_matches_a_float32_reference():
    """128 heads, d_c 512, d_rope 64, FlashMLA's page size 64, 8k context, bf16."""
    torch.manual_seed(0)
    num_heads, d_c, d_rope, block_size = 128, 512, 64, 64
    lens = [1, 63, 64, 65, 1000, 8192]
    tables, seq_lens, used = cuda_block_tables(lens, block_size)
    kv_cache = torch.randn(used + 4, block_size, d_c + d_rope, device="cuda").to(torch.bfloat16)
    q_latent = torch.randn(len(lens), num_heads, d_c, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(len(lens), num_heads, d_rope, device="cuda").to(torch.bfloat16)
    scale = 1 / math.sqrt(128 + 64)

    out, lse = impl.mla_decode_triton(q_latent, q_pe, kv_cache, tables, seq_lens, scale=scale,
                                      max_seq_len=max(lens))

    atol, rtol = tolerance(torch.bfloat16)
    for b, n in enumerate(lens):
        t = torch.arange(n, device="cuda")
        rows = kv_cache[tables[b, t // block_size].long(), t % block_size].float()  # [n, 576]
        q = torch.cat([q_latent[b], q_pe[b]], dim=-1).float()
        s = q @ rows.T * scale
        want = torch.softmax(s, dim=-1) @ rows[:, :d_c]
        assert_close(out[b], want, what=f"out_latent of sequence {b} (bf16)", atol=atol,
                     rtol=rtol)
        assert_close(lse[b], torch.logsumexp(s, dim=-1), what=f"lse {b}", atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(2)
def test_triton_window_kernel_on_a_gpu_with_a_4096_window_over_32k_matches_a_reference():
    """Mistral-like GQA 32/8, d=128, block 16, bf16, a window of 4096 over up to 32k, sinks."""
    torch.manual_seed(1)
    num_heads, num_kv_heads, head_dim, block_size, window = 32, 8, 128, 16, 4096
    lens = [1, 4095, 4097, 32768]
    tables, seq_lens, used = cuda_block_tables(lens, block_size)
    shape = (used + 2, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device="cuda").to(torch.bfloat16)
    v_cache = torch.randn(shape, device="cuda").to(torch.bfloat16)
    q = torch.randn(len(lens), num_heads, head_dim, device="cuda").to(torch.bfloat16)
    sinks = torch.randn(num_heads, device="cuda")

    out, lse = impl.paged_decode_window_sink_triton(q, k_cache, v_cache, tables, seq_lens,
                                                    window, sinks, max_seq_len=max(lens))

    heads = torch.arange(num_heads, device="cuda") // (num_heads // num_kv_heads)
    atol, rtol = tolerance(torch.bfloat16)
    for b, n in enumerate(lens):
        t = torch.arange(max(n - window, 0), n, device="cuda")
        blocks_b = tables[b, t // block_size].long()
        k = k_cache[blocks_b, t % block_size][:, heads].float()  # [w, H, d]
        v = v_cache[blocks_b, t % block_size][:, heads].float()
        s = torch.einsum("hd,lhd->hl", q[b].float(), k) / math.sqrt(head_dim)
        s = torch.cat([s, sinks[:, None]], dim=-1)
        w = torch.softmax(s, dim=-1)[:, :-1]
        assert_close(out[b], torch.einsum("hl,lhd->hd", w, v), what=f"out {b} (bf16)",
                     atol=atol, rtol=rtol)
        assert_close(lse[b], torch.logsumexp(s, dim=-1), what=f"lse {b}", atol=atol, rtol=rtol)


# ---- compiled for an H100 on the CPU: what the interpreter cannot see (grading's compile_check)
test_kernel_compiles_for_sm_90_with_ieee_dots_no_spills_and_64_bit_offsets = sm90_compile_test(
    __file__)  # None where bench/ is absent (the grader's copy): nothing to collect
