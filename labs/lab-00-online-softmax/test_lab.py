"""Lab 00 spec: online softmax and the FlashAttention forward pass.

Run:  LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-00-online-softmax -q
Every expected value comes from ``common``'s float64 reference; wrong answers used to name
a misconception are built from that reference too, never from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from common import load_impl, prefix_mask, reference_attention
from common.loader import load_lab_module
from common.reference import reference_softmax, to_float64
from common.testing import (
    ACC_IN_FP16,
    BOTTOM_RIGHT,
    LAYOUTS,
    LSE_WITHOUT_MAX,
    NO_SCALE,
    ODD_HEAD_DIMS,
    P_NOT_CAST,
    PADDED_SCALE,
    SCALE_ZERO_AS_DEFAULT,
    TILE_SHAPES,
    BadInputs,
    assert_close,
    assert_loads_in_bounds,
    assert_no_races,
    assert_peak_below,
    bad_input_test,
    basic_value_test,
    called_on_copies,
    cancelling,
    examples,
    host_syncs,
    interpreter_only,
    kernel_memory,
    qkv_sizes,
    raised_as,
    random_qkv,
    scale_wrong,
    sm90_compile_test,
    strided_view,
    tile_shapes,
    tolerance,
)

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))
provided = load_lab_module(__file__, "provided")  # given code: the launch grid is tested here

NO_RESCALE_ACC = "the accumulator was not rescaled when the running max grew"
NO_RESCALE_L = "the denominator l was not rescaled when the running max grew"
DIAGONAL = "causal mask off by one: the diagonal must be attended"
ONE_AHEAD = "causal mask off by one: query i attended key i+1, a future token"
TILE_MAX = "m must be the running max over every tile so far, not the current tile's max"
STRIDED_VIEW = (
    "q, k or v is a strided view here (not contiguous): pass each tensor's own strides "
    "(*k.stride()), never strides computed from its shape or from a .contiguous() copy"
)
M_STARTS_AT_ZERO = (
    "the running max started at 0, not -inf: the empty summary is (m, l) = (-inf, 0), and a "
    "tile of nothing but -inf leaves it there"
)
PER_TILE_SOFTMAX = "each tile was normalised on its own: the tiles' denominators must be combined"
ATTENTION_NAN_HINT = (
    "NaN reached the output. Usual causes: exp(-inf - (-inf)) for a row whose scores are all "
    "masked (under top-left causal every query attends key 0, so no row is empty unless Lk = 0, "
    "where out is 0 and lse is -inf: do not divide 0 by 0); a causal mask that hides the "
    "diagonal, a causal key loop that stops before the diagonal tile, or a mask aligned "
    "bottom-right (then early rows see no key at all); or a read past the end of k/v or of a "
    "NaN-poisoned key."
)
OVERFLOW_HINT = (
    "NaN or inf: exp overflowed. Subtract the running max before exponentiating "
    "(exp(1e4) is inf in float64)."
)


# ---- helpers: references and the wrong answers of classic mistakes ----------------------


def assert_attention_close(actual, expected, **kwargs):
    """assert_close with a NaN hint about attention (empty rows, masks, poisoned keys)."""
    kwargs.setdefault("nan_hint", ATTENTION_NAN_HINT)
    assert_close(actual, expected, **kwargs)


def top_left(lq: int, lk: int) -> np.ndarray:
    return prefix_mask(np.arange(lq), lk)


def reference(q, k, v, causal=False, scale=None, mask=None):
    if mask is None and causal:
        mask = top_left(len(q), len(k))
    return reference_attention(q, k, v, scale=scale, mask=mask)


def scaled_scores(q, k, causal, scale=None):
    q, k = to_float64(q), to_float64(k)
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    s = (q @ k.T) * scale
    return np.where(top_left(len(q), len(k)), s, -np.inf) if causal else s


def tiled_without_rescale(q, k, v, block_k, causal, rescale_acc, rescale_l, want_lse=False):
    """The output (or lse) of the tile loop when acc and/or l skip exp(m_old - m_new)."""
    s = scaled_scores(q, k, causal)
    v = to_float64(v)
    m = np.full(len(q), -np.inf)
    l = np.zeros(len(q))
    acc = np.zeros((len(q), v.shape[1]))
    for k0 in range(0, len(k), block_k):
        tile = s[:, k0 : k0 + block_k]
        m_new = np.maximum(m, tile.max(axis=1))
        base = np.where(np.isinf(m_new), 0.0, m_new)
        alpha = np.exp(m - base)
        p = np.exp(tile - base[:, None])
        l = (alpha if rescale_l else 1.0) * l + p.sum(axis=1)
        acc = (alpha[:, None] if rescale_acc else 1.0) * acc + p @ v[k0 : k0 + block_k]
        m = m_new
    if want_lse:
        with np.errstate(divide="ignore"):
            return m + np.log(l)
    return acc / np.where(l > 0, l, 1.0)[:, None]


def out_misconceptions(q, k, v, block_k, causal):
    lq, lk = len(q), len(k)
    wrong = {
        NO_RESCALE_ACC: tiled_without_rescale(q, k, v, block_k, causal, False, True),
        NO_RESCALE_L: tiled_without_rescale(q, k, v, block_k, causal, True, False),
        NO_SCALE: reference(q, k, v, causal, scale=1.0)[0],
    }
    if causal:
        wrong[DIAGONAL] = reference(q, k, v, mask=prefix_mask(np.arange(lq) - 1, lk))[0]
        wrong[ONE_AHEAD] = reference(q, k, v, mask=prefix_mask(np.arange(lq) + 1, lk))[0]
        if lq != lk:
            wrong[BOTTOM_RIGHT] = reference(q, k, v, mask=prefix_mask(np.arange(lq) + lk - lq, lk))[
                0
            ]
    return wrong


def lse_misconceptions(q, k, v, block_k, causal):
    _, lse = reference(q, k, v, causal)
    row_max = scaled_scores(q, k, causal).max(axis=1, initial=-np.inf)
    with np.errstate(invalid="ignore"):
        return {
            LSE_WITHOUT_MAX: np.where(np.isinf(lse), lse, lse - row_max),
            NO_RESCALE_L: tiled_without_rescale(q, k, v, block_k, causal, True, False, True),
            NO_SCALE: reference(q, k, v, causal, scale=1.0)[1],
        }


def expected_steps(x, tile_size):
    """(m, l) after each tile, straight from the definition on the prefix seen so far."""
    steps = []
    for end in range(tile_size, len(x) + tile_size, tile_size):
        seen = x[: min(end, len(x))]
        m = seen.max()
        l = 0.0 if m == -np.inf else float(np.exp(seen - m).sum())
        steps.append((float(m), l))
    return np.array(steps, dtype=np.float64).reshape(-1, 2)


def steps_misconceptions(x, tile_size):
    """(m, l) when l skips the rescale, and when m is the tile's max instead of the running max."""
    no_rescale, tile_max = [], []
    m, l_wrong = -np.inf, 0.0
    with np.errstate(all="ignore"):
        for start in range(0, len(x), tile_size):
            tile = x[start : start + tile_size]
            m = max(m, tile.max())
            l_wrong += float(np.exp(tile - m).sum())
            no_rescale.append((m, l_wrong))
            seen = x[: start + len(tile)]
            tile_max.append((tile.max(), float(np.exp(seen - tile.max()).sum())))
    return {NO_RESCALE_L: np.array(no_rescale), TILE_MAX: np.array(tile_max)}


def steps_from_zero(x, tile_size):
    """(m, l) after each tile when the running max starts at 0 instead of -inf."""
    m, l, out = 0.0, 0.0, []
    with np.errstate(all="ignore"):
        for start in range(0, len(x), tile_size):
            tile = x[start : start + tile_size]
            top = max(m, float(tile.max()))
            l, m = l * math.exp(m - top) + float(np.exp(tile - top).sum()), top
            out.append((m, l))
    return np.array(out)


def as_steps_array(steps, x, tile_size):
    if not isinstance(steps, list | tuple):
        raise AssertionError(
            f"online_softmax_steps must return a list of (m, l), got {type(steps)}"
        )
    want = -(-len(x) // tile_size)
    if len(steps) != want:
        raise AssertionError(
            f"{len(x)} numbers in tiles of {tile_size} make {want} tiles, so {want} (m, l) "
            f"pairs, got {len(steps)}"
        )
    return np.array([(float(m), float(l)) for m, l in steps], dtype=np.float64).reshape(-1, 2)


finite = st.floats(-60.0, 60.0, allow_nan=False, allow_infinity=False)
vectors = arrays(np.float64, st.integers(1, 40), elements=finite)


# ---- 1. online softmax on one vector ----------------------------------------------------


@pytest.mark.points(3)
@given(x=vectors, tile_size=st.integers(1, 45))
def test_online_softmax_steps_give_the_running_max_and_denominator_after_every_tile(x, tile_size):
    steps = as_steps_array(impl.online_softmax_steps(x, tile_size), x, tile_size)
    assert_close(
        steps,
        expected_steps(x, tile_size),
        what=f"(m, l) after each tile of {tile_size}",
        hint="column 0 is the running max m, column 1 the running denominator l",
        wrong_answers={**steps_misconceptions(x, tile_size),
                       M_STARTS_AT_ZERO: steps_from_zero(x, tile_size)},
    )


@pytest.mark.points(1)
def test_a_tile_whose_max_is_below_the_running_max_leaves_m_and_the_old_sum_alone():
    x = np.array([5.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0, 4.0])  # tile 2's max (4) < running max (5)
    steps = as_steps_array(impl.online_softmax_steps(x, 4), x, 4)
    assert_close(
        steps,
        expected_steps(x, 4),
        what="(m, l) after tiles [5, 1, 2, 0] and [1, 2, 3, 4]",
        hint="after tile 2, m stays 5 and l only grows by sum(exp(tile - 5))",
        wrong_answers=steps_misconceptions(x, 4),
    )


@pytest.mark.points(3)
@given(x=vectors, tile_size=st.integers(1, 45))
def test_online_softmax_equals_softmax_for_any_tile_size(x, tile_size):
    per_tile = np.concatenate(
        [reference_softmax(x[i : i + tile_size]) for i in range(0, len(x), tile_size)]
    )
    wrong = {PER_TILE_SOFTMAX: per_tile} if len(x) > tile_size else {}
    assert_close(
        impl.online_softmax(x, tile_size),
        reference_softmax(x),
        what=f"online_softmax(x, tile_size={tile_size})",
        wrong_answers=wrong,
        nan_hint=OVERFLOW_HINT,
    )


@pytest.mark.points(1)
@pytest.mark.parametrize("tile_size", [1, 3, 8])
def test_online_softmax_does_not_overflow_on_huge_values(tile_size):
    x = np.array([1e4, 9999.0, -1e4, 3e3, 10003.0, 1e4 - 0.5, 7.0])  # exp(1e4) = inf
    with np.errstate(over="ignore", invalid="ignore"):
        got = impl.online_softmax(x, tile_size)
        steps = impl.online_softmax_steps(x, tile_size)
    assert_close(
        got, reference_softmax(x), what="softmax of 1e4-sized scores", nan_hint=OVERFLOW_HINT
    )
    assert_close(
        as_steps_array(steps, x, tile_size),
        expected_steps(x, tile_size),
        what="(m, l) of 1e4-sized scores",
        nan_hint=OVERFLOW_HINT,
    )


@pytest.mark.points(1)
def test_masked_minus_inf_scores_get_zero_probability_without_nan():
    x = np.array([-np.inf, -np.inf, -np.inf, 0.5, 2.0, -np.inf, 1.0])  # first tile all masked
    hint = (
        "a tile of nothing but -inf must leave m = -inf and l = 0; computing "
        "exp(-inf - (-inf)) gives NaN"
    )
    with np.errstate(invalid="ignore"):
        steps = impl.online_softmax_steps(x, 3)
        got = impl.online_softmax(x, 3)
    assert_close(as_steps_array(steps, x, 3), expected_steps(x, 3), what="(m, l)", nan_hint=hint,
                 wrong_answers={M_STARTS_AT_ZERO: steps_from_zero(x, 3)})
    assert_close(got, reference_softmax(x), what="softmax with -inf entries", nan_hint=hint)


# ---- 2. FlashAttention forward in numpy -------------------------------------------------


@pytest.mark.points(4)
@given(
    **qkv_sizes(40, 8, min_len=0),
    block_q=st.integers(1, 20),
    block_k=st.integers(1, 20),
    causal=st.booleans(),
)
@basic_value_test
def test_flash_attention_forward_equals_the_float64_reference(
    lq, lk, d, dv, block_q, block_k, causal, seed
):
    q, k, v = random_qkv(seed, lq, lk, d, dv, spread=1.5)
    want_out, want_lse = reference(q, k, v, causal)
    result = impl.flash_attention_forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    assert isinstance(result, tuple) and len(result) == 2, "return the pair (out, lse)"
    out, lse = result
    what = f"Lq={lq} Lk={lk} d={d} dv={dv} block_q={block_q} block_k={block_k} causal={causal}"
    assert_attention_close(
        out,
        want_out,
        what=f"out ({what})",
        wrong_answers=out_misconceptions(q, k, v, block_k, causal),
    )
    assert_attention_close(
        lse,
        want_lse,
        what=f"lse ({what})",
        wrong_answers=lse_misconceptions(q, k, v, block_k, causal),
    )


@pytest.mark.points(2)
@pytest.mark.parametrize("causal", [False, True])
def test_the_accumulator_is_rescaled_when_the_running_max_grows(causal):
    # scores grow from tile to tile, so every tile raises the running max
    q = np.array([[1.0], [0.5], [2.0], [1.5], [0.25]])
    k = np.arange(8.0)[:, None] / 2.0
    v = np.random.default_rng(7).standard_normal((8, 3))
    out, _ = impl.flash_attention_forward(q, k, v, block_q=2, block_k=2, scale=1.0, causal=causal)
    want, _ = reference(q, k, v, causal, scale=1.0)
    assert_attention_close(
        out,
        want,
        what="out when every key tile raises the max",
        wrong_answers=out_misconceptions(q, k, v, 2, causal),
    )


@pytest.mark.points(1)
def test_lse_includes_the_running_max():
    q, k, v = random_qkv(3, 6, 20, 4, 4)
    k = k * 30.0  # scores in the tens: lse - m is far from lse
    _, lse = impl.flash_attention_forward(q, k, v, block_q=4, block_k=8)
    assert_attention_close(
        lse, reference(q, k, v)[1], what="lse", wrong_answers=lse_misconceptions(q, k, v, 8, False)
    )


@pytest.mark.points(1)
def test_scores_are_scaled_by_one_over_sqrt_d_by_default():
    q, k, v = random_qkv(4, 9, 13, 16, 5)
    out, lse = impl.flash_attention_forward(q, k, v, block_q=4, block_k=4)
    want_out, want_lse = reference(q, k, v)
    wrong_out, wrong_lse = reference(q, k, v, scale=1.0)
    assert_attention_close(out, want_out, what="out with d=16", wrong_answers={NO_SCALE: wrong_out})
    assert_attention_close(lse, want_lse, what="lse with d=16", wrong_answers={NO_SCALE: wrong_lse})
    out, _ = impl.flash_attention_forward(q, k, v, block_q=4, block_k=4, scale=0.3)
    assert_attention_close(out, reference(q, k, v, scale=0.3)[0], what="out with scale=0.3")


@pytest.mark.points(0.5)
@pytest.mark.parametrize("scale", [0.0, 0.3, 2.5])
def test_every_numpy_forward_takes_the_scale_keyword(scale):
    q, k, v = random_qkv(6, 7, 11, 8, 5)
    for causal in (False, True):
        want_out, want_lse = reference(q, k, v, causal, scale=scale)
        default_out, default_lse = reference(q, k, v, causal)
        wrong = scale_wrong(scale, default_out)
        if causal:  # Lq = 7 < Lk = 11: a bottom-right mask shows here first
            wrong[BOTTOM_RIGHT] = reference(q, k, v, scale=scale,
                                            mask=prefix_mask(np.arange(7) + 4, 11))[0]
        got = impl.naive_attention(q, k, v, scale=scale, causal=causal)
        assert_attention_close(got, want_out, what=f"naive_attention(scale={scale}, "
                               f"causal={causal})", wrong_answers=wrong)  # fmt: skip
        out, lse = impl.flash_attention_forward(q, k, v, block_q=4, block_k=4, scale=scale,
                                                causal=causal)  # fmt: skip
        assert_attention_close(out, want_out, what=f"flash_attention_forward out (scale={scale}, "
                               f"causal={causal})", wrong_answers=wrong)  # fmt: skip
        assert_attention_close(lse, want_lse, what=f"flash_attention_forward lse (scale={scale})",
                               wrong_answers={SCALE_ZERO_AS_DEFAULT: default_lse})  # fmt: skip

@pytest.mark.points(1)
@pytest.mark.parametrize("lq, lk", [(10, 10), (7, 12), (12, 7)])
def test_causal_attends_the_diagonal(lq, lk):
    q, k, v = random_qkv(5, lq, lk, 4, 3)
    with np.errstate(all="ignore"):
        out, _ = impl.flash_attention_forward(q, k, v, block_q=4, block_k=4, causal=True)
    want = reference(q, k, v, causal=True)[0]
    strict = reference(q, k, v, mask=prefix_mask(np.arange(lq) - 1, lk))[0]
    out = to_float64(out)
    if out.shape == want.shape and np.allclose(out[1:], strict[1:], atol=1e-9):
        raise AssertionError(f"out is wrong: {DIAGONAL} (row 0 must equal v[0])")
    assert_attention_close(
        out, want, what="causal out", wrong_answers=out_misconceptions(q, k, v, 4, causal=True)
    )


@pytest.mark.points(2)
@examples(20)
@given(
    lq=st.integers(1, 24),
    extra=st.integers(1, 24),
    block_q=st.integers(1, 16),
    block_k=st.integers(1, 16),
    seed=st.integers(0, 2**16),
)
def test_causal_never_reads_keys_past_the_last_query(lq, extra, block_q, block_k, seed):
    lk = lq + extra  # top-left causal: keys lq..lk-1 are attended by nobody
    q, k, v = random_qkv(seed, lq, lk, 4, 3)
    want_out, want_lse = reference(q, k[:lq], v[:lq], causal=True)
    wrong_out = out_misconceptions(q, k, v, block_k, causal=True)
    wrong_lse = lse_misconceptions(q, k, v, block_k, causal=True)
    k[lq:], v[lq:] = np.nan, np.nan  # poisoned: reading them turns the output into NaN
    with np.errstate(invalid="ignore"):
        out, lse = impl.flash_attention_forward(
            q, k, v, block_q=block_q, block_k=block_k, causal=True
        )
    hint = (
        f"NaN: keys {lq}..{lk - 1} lie past the last query ({lq - 1}) and are NaN-poisoned. "
        "Under top-left causal no query needs them, so the key loop must stop at the last "
        "row of the query tile (skip tiles above the diagonal and cut the last tile short)."
    )
    what = f"Lq={lq} < Lk={lk}, block_q={block_q}, block_k={block_k}"
    assert_attention_close(
        out, want_out, what=f"causal out ({what})", nan_hint=hint, wrong_answers=wrong_out
    )
    assert_attention_close(
        lse, want_lse, what=f"causal lse ({what})", nan_hint=hint, wrong_answers=wrong_lse
    )


@pytest.mark.points(1)
@pytest.mark.parametrize("causal", [False, True])
def test_rows_whose_scores_are_all_far_below_zero_still_get_a_softmax(causal):
    # every score is about -800: exp(-800) is 0 in float64, so m must start at -inf (then
    # take the tile's max), never at 0, or l sums to 0 and out = 0 / 0
    q, k, v = random_qkv(11, 9, 21, 4, 3, spread=0.1)
    q, k = q + 20.0, k - 20.0  # q . k / sqrt(4) ~ -800 for every pair
    with np.errstate(all="ignore"):
        out, lse = impl.flash_attention_forward(q, k, v, block_q=4, block_k=8, causal=causal)
    want_out, want_lse = reference(q, k, v, causal)
    hint = (
        "NaN: all scores are near -800 and exp(-800) underflows to 0. The running max must "
        "start at -inf and become the first tile's max (m starting at 0 makes l = 0 and "
        "out = 0 / 0)."
    )
    assert_attention_close(out, want_out, what="out for scores near -800", nan_hint=hint)
    assert_attention_close(lse, want_lse, what="lse for scores near -800", nan_hint=hint)


def assert_some_rows_close(out, q, k, v):
    """The memory tests' value check: a few rows of ``out`` against the reference."""
    rows = np.unique([0, 1, len(q) // 2, len(q) - 1])
    assert_attention_close(
        to_float64(out)[rows],
        reference(q[rows], k, v)[0],
        what=f"out rows {rows.tolist()} (memory is fine)",
        hint="the values are wrong: the other tests say why",
    )


# The memory tests measure with common.testing.peak_memory: tracemalloc in a plain run; under
# the grader the sandboxed worker's resident high-water mark, read from outside it. The array
# each looks for is 32 MiB, so glibc maps it fresh and it always counts.


@pytest.mark.points(2)
def test_flash_attention_forward_never_builds_an_lq_by_lk_array():
    lq = lk = 2048  # the float64 score matrix would be 32 MiB; a 128 x 128 tile is 128 KiB
    q, k, v = random_qkv(6, lq, lk, 4, 4)
    full = lq * lk * 8
    out, _ = assert_peak_below(
        impl.flash_attention_forward,
        q,
        k,
        v,
        block_q=128,
        block_k=128,
        limit=full / 8,
        message=f"the Lq x Lk score matrix is {full / 2**20:.0f} MiB; flash_attention_forward "
        "must only ever hold a block_q x block_k tile of scores (128 x 128 here)",
    )
    assert_some_rows_close(out, q, k, v)


@pytest.mark.points(2)
def test_flash_attention_forward_never_builds_a_row_block_of_all_keys():
    # one tile of 32 queries against 131072 keys, 32 at a time: a [block_q, Lk] row block of
    # scores is 32 MiB in float64; the 32 x 32 tile is 8 KiB, K and V are 2 MiB each
    lq, lk, block = 32, 131072, 32
    q, k, v = random_qkv(12, lq, lk, 2, 2)
    row_block = block * lk * 8
    out, _ = assert_peak_below(
        impl.flash_attention_forward,
        q,
        k,
        v,
        block_q=block,
        block_k=block,
        limit=row_block * 3 / 4,  # room for the inputs' copies the grader's measurement counts
        message=f"a [block_q, Lk] = [{block}, {lk}] row block of scores is "
        f"{row_block / 2**20:.0f} MiB: compute the scores one [block_q, block_k] = [{block}, "
        f"{block}] tile at a time inside the key loop, never for all keys of the query tile "
        "at once",
    )
    assert_some_rows_close(out, q, k, v)


# ---- 3. the naive baseline and the memory arithmetic ------------------------------------


@pytest.mark.points(1)
@given(**qkv_sizes(12, 6), causal=st.booleans())
def test_naive_attention_equals_the_float64_reference(lq, lk, d, dv, causal, seed):
    q, k, v = random_qkv(seed, lq, lk, d, dv)
    wrong = out_misconceptions(q, k, v, max(lk, 1), causal)
    wrong.pop(NO_RESCALE_ACC)
    wrong.pop(NO_RESCALE_L)
    with np.errstate(all="ignore"):
        got = impl.naive_attention(q, k, v, causal=causal)
    assert_attention_close(
        got, reference(q, k, v, causal)[0], what="naive_attention", wrong_answers=wrong
    )


MiB, GiB = 2**20, 2**30


@pytest.mark.points(1)
@pytest.mark.parametrize(
    "seq_len, want",
    [(512, MiB // 2), (2048, 8 * MiB), (8192, 128 * MiB), (32768, 2 * GiB), (131072, 32 * GiB)],
    ids=["512-0.5MiB", "2k-8MiB", "8k-128MiB", "32k-2GiB", "128k-32GiB"],
)
def test_score_matrix_bytes_reproduces_the_per_head_fp16_figures(seq_len, want):
    got = impl.score_matrix_bytes(seq_len)
    size = f"{want / GiB:g} GiB" if want >= GiB else f"{want / MiB:g} MiB"
    assert got == want, (
        f"one FP16 head at N={seq_len}: N*N scores x 2 bytes = {want} bytes ({size}), got {got!r}"
        + (" (counted elements, not bytes)" if got == seq_len**2 else "")
    )


@pytest.mark.points(1)
def test_score_matrix_bytes_multiplies_by_heads_layers_and_element_size():
    # 16 heads x 24 layers (BERT-large-ish): 512 -> 192 MiB, 8k -> 48 GiB, 32k -> 768 GiB
    assert impl.score_matrix_bytes(512, num_heads=16, num_layers=24) == 192 * MiB
    assert impl.score_matrix_bytes(8192, num_heads=16, num_layers=24) == 48 * GiB
    assert impl.score_matrix_bytes(32768, num_heads=16, num_layers=24) == 768 * GiB
    assert impl.score_matrix_bytes(1024, bytes_per_element=4) == 4 * MiB, "FP32 is 4 bytes"
    assert impl.score_matrix_bytes(0) == 0


# ---- 4. bad input is a ValueError that names the argument ------------------------------

_q, _k, _v = random_qkv(8, 3, 5, 4, 2)
BAD_INPUTS: BadInputs = {
    "naive_attention-k": ("k", lambda: impl.naive_attention(_q, _k[:, :3], _v)),
    "naive_attention-v": ("v", lambda: impl.naive_attention(_q, _k, _v[:4])),
    "flash_attention_forward-v": ("v", lambda: impl.flash_attention_forward(_q, _k, _v[:4])),
    "flash_attention_forward-k": ("k", lambda: impl.flash_attention_forward(_q[:, :2], _k, _v)),
    "flash_attention_forward-block_q": (
        "block_q", lambda: impl.flash_attention_forward(_q, _k, _v, block_q=0)),
    "flash_attention_forward-block_k": (
        "block_k", lambda: impl.flash_attention_forward(_q, _k, _v, block_k=-2)),
    "online_softmax_steps-tile_size": (
        "tile_size", lambda: impl.online_softmax_steps(np.ones(4), 0)),
    "online_softmax-tile_size": ("tile_size", lambda: impl.online_softmax(np.ones(4), -1)),
    "online_softmax-x": ("x", lambda: impl.online_softmax(np.ones((2, 2)), 2)),
    "score_matrix_bytes-seq_len": ("seq_len", lambda: impl.score_matrix_bytes(-1)),
}
test_bad_input_raises_value_error_naming_the_argument = bad_input_test(BAD_INPUTS, points=0.5)


# ---- 5. the Triton kernel (interpreter on a CPU, CUDA on a GPU) -------------------------

NO_LOG2E = (
    "exp2 without log2(e) folded into the scale: exp(x) = exp2(x * log2(e)), so qk_scale = "
    "scale * LOG2E"
)
LSE_BASE2 = (
    "lse left in base 2: m_i + log2(l_i) is a base-2 log; multiply by ln(2) for the natural "
    "log of the contract"
)
SWAPPED_TILES = (
    "BLOCK_N where BLOCK_M belongs: a causal query tile ends at (start_m + 1) * BLOCK_M, "
    "whatever the key tile size"
)
LN2 = math.log(2.0)


def torch_qkv(b, h, lq, lk, d, dv, dtype, device, seed=0, layout="bhld", shift=0.0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    if layout == "blhd":  # how models hold activations: [batch, seq, heads, dim], viewed as BHLD
        q = torch.randn(b, lq, h, d, generator=gen).transpose(1, 2)
        k = torch.randn(b, lk, h, d, generator=gen).transpose(1, 2)
        v = torch.randn(b, lk, h, dv, generator=gen).transpose(1, 2)
    else:
        q = torch.randn(b, h, lq, d, generator=gen)
        k = torch.randn(b, h, lk, d, generator=gen)
        v = torch.randn(b, h, lk, dv, generator=gen)
    q, k = q + shift, k - shift
    return (
        q.to(device=device, dtype=dtype),
        k.to(device=device, dtype=dtype),
        v.to(device=device, dtype=dtype),
    )


def reference_bhld(q, k, v, causal, scale=None, mask=None):
    """float64 ``(out [B, H, Lq, dv], lse [B, H, Lq])`` for [B, H, L, d] tensors."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        qb, kb, vb = (to_float64(x[b]).transpose(1, 0, 2) for x in (q, k, v))
        out, lse = reference(qb, kb, vb, causal, scale=scale, mask=mask)
        outs.append(out.transpose(1, 0, 2))
        lses.append(lse.T)
    return np.stack(outs), np.stack(lses)


def per_head(fn, q, k, v):
    """fn(q, k, v) -> array applied to every (batch, head) of [B, H, L, d] tensors."""
    q, k, v = to_float64(q), to_float64(k), to_float64(v)
    return np.stack(
        [
            np.stack([fn(q[b, h], k[b, h], v[b, h]) for h in range(q.shape[1])])
            for b in range(len(q))
        ]
    )


def forward_kernel_misconceptions(q, k, v, causal, block_m, block_n):
    """(wrong outs, wrong lses) of classic kernel mistakes at tiles block_m x block_n."""
    from common.triton_env import LOG2E, dot_tile

    lq, lk, d = q.shape[2], k.shape[2], q.shape[3]
    ref_out, ref_lse = reference_bhld(q, k, v, causal)

    def tiled(rescale_acc, rescale_l, want_lse=False):
        return per_head(
            lambda a, b, c: tiled_without_rescale(
                a, b, c, block_n, causal, rescale_acc, rescale_l, want_lse
            ),
            q,
            k,
            v,
        )

    scaled = {
        NO_SCALE: 1.0,
        NO_LOG2E: LN2 / math.sqrt(d),
        PADDED_SCALE: 1.0 / math.sqrt(dot_tile(d)),
    }
    if dot_tile(d) == d:
        del scaled[PADDED_SCALE]
    outs = {name: reference_bhld(q, k, v, causal, scale=s) for name, s in scaled.items()}
    wrong_out = {name: o for name, (o, _) in outs.items()}
    wrong_out[NO_RESCALE_ACC] = tiled(False, True)
    wrong_out[NO_RESCALE_L] = tiled(True, False)
    if causal:
        rows = np.arange(lq)
        last_key = {DIAGONAL: rows - 1, ONE_AHEAD: rows + 1}
        if lq != lk:
            last_key[BOTTOM_RIGHT] = rows + lk - lq
        if block_m != block_n:  # the tile's key bound (start_m + 1) * BLOCK_N, then the mask
            last_key[SWAPPED_TILES] = np.minimum(rows, (rows // block_m + 1) * block_n - 1)
        for name, last in last_key.items():
            mask = prefix_mask(last, lk)
            with np.errstate(all="ignore"):
                wrong_out[name] = reference_bhld(q, k, v, False, mask=mask)[0]
    with np.errstate(all="ignore"):
        wrong_lse = {name: lse for name, (_, lse) in outs.items()}
        wrong_lse[LSE_BASE2] = ref_lse * LOG2E
        wrong_lse[NO_RESCALE_L] = tiled(True, False, want_lse=True)
        row_max = per_head(lambda a, b, c: scaled_scores(a, b, causal).max(axis=1), q, k, v)
        wrong_lse[LSE_WITHOUT_MAX] = ref_lse - row_max
    return wrong_out, wrong_lse


def check_forward_kernel(
    q, k, v, causal, tiles, scale=None, what="", nan_hint=None, tol=None, want=None
):
    """Run flash_attention_triton at ``tiles`` and grade out AND lse against float64."""
    block_m, block_n = tiles
    result = impl.flash_attention_triton(
        q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n
    )
    assert isinstance(result, tuple) and len(result) == 2, (
        "flash_attention_triton must return the pair (out, lse)"
    )
    out, lse = result
    assert out.dtype == q.dtype, f"out must have q's dtype {q.dtype}, got {out.dtype}"
    assert str(lse.dtype) == "torch.float32", f"lse must be float32, got {lse.dtype}"
    want_out, want_lse = want if want is not None else reference_bhld(q, k, v, causal, scale)
    wrong_out, wrong_lse = (  # a scale's misconception: the default 1/sqrt(d) used
        [scale_wrong(scale, x) for x in reference_bhld(q, k, v, causal)] if scale is not None
        else forward_kernel_misconceptions(q, k, v, causal, block_m, block_n))
    atol, rtol = tol or tolerance(q.dtype)
    b, h, lq, d = q.shape
    what = (
        f"{what}B={b} H={h} Lq={lq} Lk={k.shape[2]} d={d} dv={v.shape[3]} {q.dtype} "
        f"causal={causal} block_m={block_m} block_n={block_n}"
    )
    extra = {"nan_hint": nan_hint} if nan_hint else {}
    assert_attention_close(
        out,
        want_out,
        what=f"out ({what})",
        atol=atol,
        rtol=rtol,
        wrong_answers=wrong_out,
        hint=STRIDED_VIEW if not all(x.is_contiguous() for x in (q, k, v))
        else "look at the rows and columns past the last full tile",
        **extra,
    )
    assert_attention_close(
        lse,
        want_lse,
        what=f"lse ({what})",
        atol=atol,
        rtol=rtol,
        wrong_answers=wrong_lse,
        hint="lse = m + log(l), natural log, one per query row",
        **extra,
    )


TRITON_CASES = {
    # name: (batch, heads, Lq, Lk, d, dv, causal, layout)
    "one-tile": (1, 1, 16, 16, 16, 16, False, "bhld"),
    "ragged": (1, 1, 37, 45, 16, 16, False, "bhld"),
    "ragged-causal": (1, 1, 37, 37, 16, 16, True, "bhld"),
    "batch-heads-causal-lq>lk": (2, 2, 16, 13, 32, 32, True, "bhld"),
    "causal-lq<lk": (1, 1, 21, 50, 16, 16, True, "bhld"),
    "dv!=d-strided-blhd-view-causal": (1, 2, 20, 20, 16, 24, True, "blhd"),
}
# every case at two tile shapes, block_m != block_n among them (both ways for causal cases)
TRITON_RUNS = [
    (case, TILE_SHAPES[j])
    for i, case in enumerate(TRITON_CASES)
    for j in (i % 3, 1 + i % 2 if i % 3 == 0 else (i + 1) % 3)
]


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize(
    "case, tiles", TRITON_RUNS, ids=[f"{c}-{m}x{n}" for c, (m, n) in TRITON_RUNS]
)
@basic_value_test
def test_triton_kernel_matches_the_reference_at_several_tile_shapes(case, tiles):
    import torch

    from common.triton_env import DEVICE

    b, h, lq, lk, d, dv, causal, layout = TRITON_CASES[case]
    q, k, v = torch_qkv(b, h, lq, lk, d, dv, torch.float32, DEVICE, seed=lq + lk, layout=layout)
    check_forward_kernel(q, k, v, causal, tiles)


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_kernel_takes_a_custom_scale():
    import torch

    from common.triton_env import DEVICE

    q, k, v = torch_qkv(1, 1, 19, 30, 16, 16, torch.float32, DEVICE, seed=5)
    check_forward_kernel(q, k, v, False, (16, 32), scale=0.3)
    # 0 is a scale (uniform weights), not "use the default": only None means 1/sqrt(d)
    check_forward_kernel(q, k, v, True, (16, 16), scale=0.0, what="scale=0.0, ")


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("d", ODD_HEAD_DIMS)
def test_triton_head_dims_that_are_not_powers_of_two_use_the_real_head_dim(d):
    import torch

    from common.triton_env import DEVICE

    # d is padded to a tl.dot tile (24 -> 32, 40 -> 64, 80 and 96 -> 128); the default scale
    # must stay 1/sqrt(d) and the pad must read zeros
    q, k, v = torch_qkv(1, 1, 20, 24, d, d, torch.float32, DEVICE, seed=d)
    check_forward_kernel(q, k, v, d in (40, 96), (16, 16) if d < 64 else (32, 16))


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_kernel_in_float16(causal):
    import torch

    from common.triton_env import DEVICE

    q, k, v = torch_qkv(1, 1, 24, 37, 32, 32, torch.float16, DEVICE, seed=9)
    with raised_as(P_NOT_CAST, when="must be same dtype"):
        check_forward_kernel(q, k, v, causal, (16, 32) if causal else (32, 16))


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_kernel_accumulates_float16_inputs_in_float32():
    """float16 values of +-30 whose weighted sum cancels: the running acc reaches ~500 where
    float16 steps by 0.25-0.5; a float32 accumulator keeps the small answer exact enough."""
    import torch

    from common.triton_env import DEVICE

    q, k, v = torch_qkv(1, 1, 16, 64, 16, 16, torch.float16, DEVICE, seed=5)
    q = q * 0.05  # near-uniform weights; the first two key tiles push acc up, the last two back
    v = torch.from_numpy(cancelling(0.1 * to_float64(v), axis=2)).to(torch.float16)
    want_out, want_lse = reference_bhld(q, k, v, False)
    out, lse = impl.flash_attention_triton(q, k, v, block_m=16, block_n=16)
    atol, rtol = tolerance("float16")
    assert_attention_close(out, want_out, what="float16 out", atol=atol, rtol=rtol,
                           hint=ACC_IN_FP16)
    assert_attention_close(lse, want_lse, what="float16 lse", atol=atol, rtol=rtol)

@pytest.mark.triton
@pytest.mark.points(1)
@tile_shapes((16, 32), (32, 16))
def test_triton_causal_never_reads_keys_past_the_last_query(tiles):
    import torch

    from common.triton_env import DEVICE

    lq, lk = 21, 50
    q, k, v = torch_qkv(1, 1, lq, lk, 16, 16, torch.float32, DEVICE, seed=3)
    want = reference_bhld(q, k[:, :, :lq], v[:, :, :lq], causal=True)
    k[:, :, lq:] = float("nan")
    v[:, :, lq:] = float("nan")
    check_forward_kernel(
        q,
        k,
        v,
        True,
        tiles,
        want=want,
        what="keys past Lq NaN-poisoned, ",
        nan_hint=(
            f"NaN: keys {lq}..{lk - 1} are poisoned and no query may read them under top-left "
            "causal. Bound the key loop by the query tile's last row (and by Lq), and mask the "
            "K/V loads of the last tile. (Or the diagonal was masked: row 0 then sees no key.)"
        ),
    )


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_rows_whose_scores_are_all_far_below_zero_still_get_a_softmax():
    import torch

    from common.triton_env import DEVICE

    # q . k / sqrt(16) is about -128 everywhere: exp(-128) underflows to 0 in float32, so
    # m_i must start at -inf (m_i = 0 gives l_i = 0 and out = 0 / 0). Scores this large
    # carry float32 rounding of about 1e-5 in the exponent, hence the looser tolerance.
    q, k, v = torch_qkv(1, 1, 20, 40, 16, 16, torch.float32, DEVICE, seed=4, shift=5.6)
    check_forward_kernel(
        q,
        k,
        v,
        False,
        (16, 16),
        tol=(1e-4, 1e-4),
        what="scores near -128, ",
        nan_hint=(
            "NaN: every score is near -128 and exp of it underflows to 0 in float32. Start "
            "m_i at -inf so that the first tile's max becomes the running max."
        ),
    )


@pytest.mark.triton
@pytest.mark.points(0.5)
def test_triton_with_no_keys_returns_zeros_and_minus_inf_lse():
    import torch

    from common.triton_env import DEVICE

    q, k, v = torch_qkv(1, 2, 5, 0, 16, 8, torch.float32, DEVICE)
    out, lse = impl.flash_attention_triton(q, k, v)
    assert tuple(out.shape) == (1, 2, 5, 8) and bool((out == 0).all()), "no keys: out is 0"
    assert tuple(lse.shape) == (1, 2, 5) and bool(torch.isneginf(lse).all()), (
        "no keys: lse is -inf (log of an empty sum), not NaN"
    )


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_kernel_reads_transposed_and_sliced_views_through_their_strides(layout):
    import torch

    from common.triton_env import DEVICE

    # "sliced": a storage offset, every other row, a padded last dim, NaN between the rows
    q, k, v = torch_qkv(2, 2, 37, 29, 16, 24, torch.float32, DEVICE, seed=17)
    want = reference_bhld(q, k, v, True)
    q, k, v = (strided_view(t, layout) for t in (q, k, v))
    check_forward_kernel(q, k, v, True, (16, 32), want=want, what=f"{layout} views, ", nan_hint=(
        f"NaN from {layout} views: NaN sits between the rows of a sliced view, so the kernel "
        "stepped with a stride it assumed (contiguous [B, H, L, d]) instead of the tensor's "
        "own: pass q.stride(), k.stride(), v.stride() and use one stride per dim"))



@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_kernel_loads_only_rows_inside_the_tensors(causal):
    """Every element the kernel loads lies in q, k, v's views: no padded query row past Lq, no
    key row past Lk, no head-dim pad column, even where nothing stored depends on it."""
    import torch

    from common.triton_env import DEVICE

    interpreter_only()
    q, k, v = torch_qkv(1, 2, 21, 19, 24, 24, torch.float32, DEVICE, seed=31)
    want_out, want_lse = reference_bhld(q, k, v, causal)
    q, k, v = (strided_view(t, "sliced") for t in (q, k, v))  # NaN around every row
    (out, lse), reports = kernel_memory(
        impl.flash_attention_triton, q, k, v, causal=causal, block_m=16, block_n=16
    )
    assert_attention_close(out, want_out, what="out", atol=2e-5, rtol=2e-5)
    assert_attention_close(lse, want_lse, what="lse", atol=2e-5, rtol=2e-5)
    assert_loads_in_bounds(reports, "flash_attention_triton (Lq = 21, Lk = 19, d = 24, "
                                    "16x16 tiles)")


@pytest.mark.triton
@pytest.mark.points(1)
@tile_shapes()
def test_triton_causal_kernel_never_loads_key_tiles_above_the_diagonal(tiles):
    import torch

    from common.triton_env import DEVICE

    interpreter_only()
    block_m, block_n = tiles
    b, h, lq, d = 1, 2, 64, 16
    q, k, v = torch_qkv(b, h, lq, lq, d, d, torch.float32, DEVICE, seed=23)
    (out, lse), reports = kernel_memory(
        impl.flash_attention_triton, q, k, v, causal=True, block_m=block_m, block_n=block_n
    )
    want_out, want_lse = reference_bhld(q, k, v, True)
    assert_attention_close(out, want_out, what="causal out", atol=2e-5, rtol=2e-5)
    assert_attention_close(lse, want_lse, what="causal lse", atol=2e-5, rtol=2e-5)
    assert_no_races(reports, "flash_attention_triton")
    assert_loads_in_bounds(reports, "flash_attention_triton")
    # query tile m needs keys 0 .. (m + 1) * block_m - 1: whole key tiles up to that bound
    needed = sum(min(-(-min((m + 1) * block_m, lq) // block_n) * block_n, lq)
                 for m in range(-(-lq // block_m)))  # fmt: skip
    loaded = sum(r["loads"].get("K", 0) for r in reports)
    assert loaded <= b * h * needed * d, (
        f"the causal kernel loaded {loaded} elements of K where {b * h * needed * d} suffice "
        f"(Lq = Lk = {lq}, block_m={block_m}, block_n={block_n}): key tiles wholly above the "
        "diagonal must be skipped by the loop bound hi = min(Lq, (start_m + 1) * BLOCK_M), not "
        "masked to -inf after loading them. Right numbers, about twice the work"
    )


@pytest.mark.triton
@pytest.mark.points(0.5)
def test_triton_launcher_makes_no_host_synchronisation():
    """Measured by common.testing.host_syncs inside the process that runs the code (under
    the grader, the sandboxed worker): a teaching check, since a submission that undoes
    its patching of torch.Tensor is not caught (README: not defended)."""
    import torch

    from common.triton_env import DEVICE

    q, k, v = torch_qkv(1, 1, 16, 16, 16, 16, torch.float32, DEVICE, seed=2)
    _, syncs = host_syncs(impl.flash_attention_triton, q, k, v, causal=True)
    assert not syncs, (
        f"the launcher copied device values to the host: {syncs}. Everything it needs "
        "(shapes, strides, tile sizes) is known on the host without reading a tensor."
    )


@pytest.mark.triton
@pytest.mark.points(0.5)
def test_triton_rejects_bad_input_naming_the_argument():
    import torch

    from common.triton_env import DEVICE

    q, k, v = torch_qkv(1, 2, 8, 8, 16, 16, torch.float32, DEVICE)
    with pytest.raises(ValueError, match=r"\bk\b"):
        impl.flash_attention_triton(q, k[:, :, :, :8], v)
    with pytest.raises(ValueError, match=r"\bv\b"):
        impl.flash_attention_triton(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match=r"\bblock_m\b"):
        impl.flash_attention_triton(q, k, v, block_m=24)
    with pytest.raises(ValueError, match=r"\bblock_n\b"):
        impl.flash_attention_triton(q, k, v, block_n=8)


@pytest.mark.triton
@pytest.mark.points(0.5)
def test_triton_refuses_bfloat16_on_the_interpreter():
    import torch

    from common.triton_env import DEVICE, on_interpreter

    q, k, v = torch_qkv(1, 1, 16, 16, 16, 16, torch.bfloat16, DEVICE)
    if not on_interpreter(q):
        pytest.skip("bfloat16 runs on a GPU; the interpreter refuses it")
    with pytest.raises(ValueError, match=r"\bq\b.*bfloat16"):
        impl.flash_attention_triton(q, k, v)


# (batch, heads, seqlen_q, block_m): serving-sized launches, none of them launched here
REALISTIC_GRIDS = [
    (1, 32, 131072, 128),  # one 128k-token prompt, 32 heads
    (512, 128, 2048, 128),  # B * H = 65,536: one past CUDA's limit on grid axes y and z
    (4096, 64, 512, 64),  # a big batch of short prompts: B * H = 262,144
    (1, 8, 2**20, 16),  # a million tokens in 16-row tiles: 65,536 tiles of one head
]


# The grid is given code (provided.attention_grid): checked here, worth no points.
@pytest.mark.points(0)
@pytest.mark.parametrize("batch, heads, seqlen_q, block_m", REALISTIC_GRIDS)
def test_the_launch_grid_stays_within_cuda_limits_at_realistic_sizes(
    batch, heads, seqlen_q, block_m
):
    grid = provided.attention_grid(batch, heads, seqlen_q, block_m)
    limits = (provided.MAX_GRID_X, provided.MAX_GRID_YZ, provided.MAX_GRID_YZ)
    assert all(0 < g <= limit for g, limit in zip(grid, limits)), (
        f"grid {grid} breaks CUDA's limits {limits[: len(grid)]}"
    )
    assert math.prod(grid) == -(-seqlen_q // block_m) * batch * heads, (
        "one program per (query tile, batch * head)"
    )


@pytest.mark.points(0)
def test_the_launch_grid_refuses_more_programs_than_cuda_allows():
    with pytest.raises(ValueError, match="programs"):
        provided.attention_grid(2**16, 128, 2**20, 128)


# ---- 6. realistic sizes on a real GPU (skipped without CUDA) ----------------------------


def torch_reference_fp32(q, k, v, causal):
    """(out, lse) in float32 torch for [B, H, L, d] tensors (top-left causal)."""
    import torch

    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:  # top-left: key j <= query i
        lq, lk = s.shape[-2:]
        s = s.masked_fill(
            ~torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril(), float("-inf")
        )
    return torch.softmax(s, dim=-1) @ v.float(), torch.logsumexp(s, dim=-1)


def check_against_torch(q, k, v, causal, what, **tiles):
    import torch

    out, lse = impl.flash_attention_triton(q, k, v, causal=causal, **tiles)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    want_out, want_lse = torch_reference_fp32(q, k, v, causal)
    atol, rtol = tolerance(q.dtype)
    assert_attention_close(out, want_out, what=f"out ({what})", atol=atol, rtol=rtol)
    assert_attention_close(lse, want_lse, what=f"lse ({what})", atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_triton_kernel_on_a_gpu_at_realistic_size(dtype_name, causal):
    import torch

    dtype = getattr(torch, dtype_name)
    q, k, v = torch_qkv(2, 8, 2048, 2048, 128, 128, dtype, "cuda", seed=1)
    check_against_torch(q, k, v, causal, f"B=2 H=8 L=2048 d=128 {dtype_name} causal={causal}")


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize(
    "tiles", [{}, {"block_m": 64, "block_n": 32}, {"block_m": 32, "block_n": 64}]
)
def test_triton_kernel_on_a_gpu_with_ragged_lengths_strides_and_tile_shapes(tiles):
    import torch

    q, k, v = torch_qkv(2, 4, 1000, 1537, 80, 80, torch.float16, "cuda", seed=2, layout="blhd")
    for causal in (False, True):
        check_against_torch(q, k, v, causal, f"Lq=1000 Lk=1537 d=80 fp16 {tiles}", **tiles)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_key_offsets_are_64_bit_past_two_to_the_31_elements():
    import torch

    # K and V as [1, Lk, H, d] viewed [1, H, Lk, d]: stride_kn = H * d = 4096, so key
    # Lk - 1 sits 2^31 + 4096 * 999 elements in: an int32 offset wraps around and reads
    # the wrong key (8 GiB of fp16 K/V; the queries are few)
    heads, d, lk, lq = 32, 128, 2**19 + 1000, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(1, lk, heads, d, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(1, lk, heads, d, device="cuda", dtype=torch.float16, generator=gen)
    q = torch.randn(1, heads, lq, d, device="cuda", dtype=torch.float16, generator=gen)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    assert (lk - 1) * k.stride(2) >= 2**31
    out, lse = impl.flash_attention_triton(q, k, v)
    for h in (0, heads - 1):  # the reference one head at a time (scores are [64, 525k])
        want_out, want_lse = torch_reference_fp32(
            q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1], False
        )
        assert_attention_close(
            out[:, h : h + 1], want_out, what=f"out head {h}", atol=2e-3, rtol=2e-3
        )
        assert_attention_close(
            lse[:, h : h + 1], want_lse, what=f"lse head {h}", atol=1e-3, rtol=1e-3
        )


# ---- compiled for an H100 on the CPU: what the interpreter cannot see (grading's compile_check)
test_kernel_compiles_for_sm_90_with_ieee_dots_no_spills_and_64_bit_offsets = sm90_compile_test(
    __file__)  # None where bench/ is absent (the grader's copy): nothing to collect
