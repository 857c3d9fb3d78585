"""Lab 05 spec: the FlashAttention backward pass, in numpy, in Triton and through autograd.

Run:  LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-05-flash-attention-backward -q
Every expected gradient comes from ``common.reference.reference_attention_backward`` (float64,
itself checked against torch.autograd in float64 in ``tests/test_common_backward.py``); the
wrong answers that name a misconception are built from the same float64 formulas, never
from the code under test.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import load_impl, prefix_mask, reference_attention
from common.reference import reference_attention_backward, to_float64
from common.testing import (
    LAYOUTS,
    ODD_HEAD_DIMS,
    PADDED_SCALE,
    BadInputs,
    assert_close,
    assert_loads_in_bounds,
    assert_no_races,
    assert_peak_below,
    bad_input_test,
    basic_value_test,
    called_on_copies,
    examples,
    host_syncs,
    kernel_memory,
    qkv_sizes,
    random_qkv,
    sm90_compile_test,
    strided_view,
    tile_shapes,
    tolerance,
)

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))

F64 = dict(atol=1e-10, rtol=1e-10)  # float64 exercises: 1e-10 against the float64 reference
NAMES = ("dq", "dk", "dv")

NO_DELTA = (
    "forgot the D term: dS = P ∘ (dP − D) with D_i = rowsum(dO_i ∘ O_i); these numbers are "
    "P ∘ dP. Softmax couples every entry of a row, and D is what that coupling costs"
)
NO_LSE = (
    "P recomputed without subtracting lse: P = exp(S·scale − lse) is the forward's "
    "normalised softmax; exp(S·scale) alone is missing the 1/l of every row"
)
D_FROM_TILE = (
    "D computed from P ∘ dP of one tile: rowsum(P ∘ dP) needs a whole row of P, and a tile "
    "holds only block_k of its keys. D_i = rowsum(dO_i ∘ O_i) gives the row's number from two "
    "[dv] vectors, before the loop"
)
P_MISSING_LOG_L = (
    "P recomputed as exp(S·scale − m), the row max without log l: lse = m + log l holds both "
    "the max and the denominator, so P = exp(S·scale − lse) (these numbers are l times too big)"
)
P_TILE_MAX = (
    "P recomputed with each tile's own max, exp(S·scale − tile max): the backward needs the "
    "softmax of the whole row, P = exp(S·scale − lse) with the forward's lse, the same in "
    "every tile; nothing is rescaled in the backward"
)
P_TILE_SOFTMAX = (
    "P normalised per tile (a softmax inside each K/V tile): each row's probabilities sum to 1 "
    "over the whole row, not per tile. P = exp(S·scale − lse) with the forward's lse is "
    "already normalised"
)
P_UNSCALED = (
    "the scale was not applied when recomputing P: P = exp(q·k·scale − lse), not exp(q·k − lse)"
)
P_SCALE_TWICE = "the scale was applied twice when recomputing P: exp(q·k·scale² − lse)"
GRAD_NO_SCALE = (
    "the scale was not applied to dQ and dK: S = q kᵀ · scale, so dQ = scale · dS K and "
    "dK = scale · dSᵀ Q"
)
GRAD_SCALE_TWICE = "the scale was applied twice to dQ and dK (dQ = scale · dS K, once)"
DIAGONAL_DROPPED = (
    "causal skipping dropped a diagonal tile: the tile that holds both the first key of a "
    "K/V tile and later queries is half visible, so it must be visited (masked), not skipped"
)
DIAGONAL_ROUNDED_UP = (
    "causal skipping dropped a diagonal tile: the Q loop started at the first tile that "
    "begins at or after the key tile's first key k0; start at the tile that holds row k0, "
    "(k0 // block_q) * block_q, whose lower rows see k0"
)
DQ_DIAGONAL_DROPPED = (
    "causal skipping dropped the diagonal key tile in the dQ loop: a query tile [m0, m1) "
    "needs the keys up to m1 - 1, so the loop runs to min(Lk, Lq, m1), not to m0"
)
SWAPPED_TILES = (
    "BLOCK_M and BLOCK_N mixed up in a causal loop bound: a query tile ends at "
    "(start_m + 1) * BLOCK_M and a key tile starts at start_n * BLOCK_N; tile indices of "
    "one size are not positions in the other"
)
DELTA_AXIS = (
    "rowsum(P ∘ dP) summed over the wrong axis (over queries, a column sum): D_i sums row i "
    "of P ∘ dP, over the keys"
)
BACKWARD_NOT_CAUSAL = (
    "the backward ran without the causal mask: FlashAttentionFunction.backward must pass the "
    "forward's causal flag (kept on ctx) to flash_attention_backward_triton"
)
UNMASKED_P = (
    "the recomputed P was not masked: under causal, P_ij = 0 for every key j > query i in "
    "the backward as in the forward (tl.where on the recomputed tile)"
)
MODULO_HEADS = (
    "query head h read KV head h % num_kv_heads: heads are grouped, query head h reads KV "
    "head h // (H // KVH)"
)
LSE_BASE_E = (
    "the natural-log lse was subtracted from base-2 scores: with qk_scale = scale · log2(e) "
    "the kernel needs exp2(s − lse · log2(e))"
)
GROUP_FIRST = (
    "dK/dV not summed over the query group: only the first query head of each group counted. "
    "A KV head is read by H // KVH query heads, and its gradient is the sum of theirs"
)
GROUP_LAST = (
    "dK/dV not summed over the query group: each query head's contribution overwrote the "
    "previous one (only the last head of the group is left). Accumulate over the group, "
    "store once"
)
GROUP_MEAN = (
    "dK/dV averaged over the query group: the gradient of a shared K/V is the sum, not the mean"
)

NAN_HINT = (
    "NaN reached the gradient. The test poisons (NaN) keys and values that no query may see: "
    "under top-left causal, keys past the last query, or key tiles above the diagonal of the "
    "tiles it checks. Skip those tiles with the loop bounds (and mask the loads of the last "
    "tile): a mask on P alone is not enough, because dS = P ∘ (dP − D) and dP = dO Vᵀ is NaN "
    "there, and 0 · NaN = NaN."
)


# ---- helpers: references and the wrong answers of classic mistakes ----------------------


def causal_mask(lq: int, lk: int) -> np.ndarray:
    return prefix_mask(np.arange(lq), lk)  # top-left: key j <= query i


def forward(q, k, v, causal, scale=None):
    """(o, lse) of the float64 reference forward, single head."""
    return reference_attention(q, k, v, scale=scale, mask=causal_mask(len(q), len(k)) if causal
                               else None)


def gradients(q, k, v, do, causal, scale=None):
    """(dq, dk, dv) of the float64 reference backward, single head."""
    return reference_attention_backward(q, k, v, do, scale=scale,
                                        mask=causal_mask(len(q), len(k)) if causal else None)


def variant_backward(q, k, v, do, causal, scale=None, *, p_of=None, use_delta=True,
                     grad_scale=None, visited=None, o_lse=None, mask_p=True, delta_of=None):
    """The textbook backward with one mistake planted, in float64 (single head).

    p_of(s, lse, scale): how P is recomputed from the raw scores s = q kᵀ (right: exp(s ·
    scale - lse)); use_delta: subtract D; grad_scale: the factor on dQ and dK (right: scale);
    visited: [Lq, Lk] bool, the (query, key) pairs the loops reach (right: all);
    o_lse: the forward's (o, lse), if already computed; mask_p: apply the causal mask to the
    recomputed P (right: yes); delta_of(p, dp): the D subtracted from dP (right:
    rowsum(dO ∘ O) per row).
    """
    q, k, v, do = (to_float64(x) for x in (q, k, v, do))
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    o, lse = o_lse if o_lse is not None else forward(q, k, v, causal, scale)
    s = q @ k.T
    allowed = np.ones(s.shape, dtype=bool)
    if causal and mask_p:
        allowed = causal_mask(len(q), len(k))
    if visited is not None:
        allowed = allowed & visited
    with np.errstate(over="ignore", invalid="ignore"):
        p = (p_of or (lambda s_, lse_, c: np.exp(s_ * c - lse_[:, None])))(s, lse, scale)
        p = np.where(allowed, p, 0.0)
        dp = do @ v.T
        D = (do * o).sum(axis=1)[:, None] if use_delta else np.zeros((len(q), 1))
        if delta_of is not None:
            D = delta_of(p, dp)
        ds = p * (dp - D)
        g = scale if grad_scale is None else grad_scale
        return g * ds @ k, g * ds.T @ q, p.T @ do


def tile_p(block_k, causal, normalise=False):
    """p_of for a P recomputed tile by tile with each (row, key tile)'s own max, and
    (normalise) divided by that tile's own sum: the per-tile softmax mistakes."""
    def p_of(s, lse, c):
        t = s * c
        if causal:
            t = np.where(causal_mask(*s.shape), t, -np.inf)
        p = np.zeros_like(t)
        for k0 in range(0, t.shape[1], block_k):
            tile = t[:, k0:k0 + block_k]
            m = tile.max(axis=1, keepdims=True)
            e = np.exp(tile - np.where(np.isfinite(m), m, 0.0))
            if normalise:
                total = e.sum(axis=1, keepdims=True)
                e = e / np.where(total > 0, total, 1.0)
            p[:, k0:k0 + block_k] = e
        return p

    return p_of


def row_max_p(causal):
    """p_of for P = exp(S·scale − m): the row max, without log l."""
    def p_of(s, lse, c):
        t = s * c
        if causal:
            t = np.where(causal_mask(*s.shape), t, -np.inf)
        m = t.max(axis=1, keepdims=True)
        return np.exp(t - np.where(np.isfinite(m), m, 0.0))

    return p_of


def p_recompute_variants(causal, block_k):
    """The P-recompute mistakes that keep P bounded (so they give finite wrong gradients)."""
    return {
        P_MISSING_LOG_L: dict(p_of=row_max_p(causal)),
        P_TILE_MAX: dict(p_of=tile_p(block_k, causal)),
        P_TILE_SOFTMAX: dict(p_of=tile_p(block_k, causal, normalise=True)),
    }


def diagonal_dropped_visits(lq, lk, block_q, block_k, round_up=False):
    """Pairs an outer-K/inner-Q loop reaches when its Q loop starts one tile too late: after
    the tile that holds the key tile's first key k0, or (round_up) at the first tile that
    starts at or after k0."""
    k0 = (np.arange(lk) // block_k) * block_k
    first_q = -(-k0 // block_q) * block_q if round_up else (k0 // block_q + 1) * block_q
    return np.arange(lq)[:, None] >= first_q[None, :]


def tile_rowsum(block_k):
    """delta_of for D taken as rowsum(P ∘ dP) over each K/V tile's keys alone."""
    def delta_of(p, dp):
        d = np.zeros_like(p)
        for k0 in range(0, p.shape[1], block_k):
            d[:, k0:k0 + block_k] = (p[:, k0:k0 + block_k] * dp[:, k0:k0 + block_k]).sum(
                axis=1, keepdims=True)
        return d

    return delta_of


def numpy_misconceptions(q, k, v, do, causal, block_q, block_k, scale=None):
    """{"dq": {misconception: wrong dq}, "dk": ..., "dv": ...} for the tiled numpy backward."""
    if len(k) == 0 or len(q) == 0:
        return {name: {} for name in NAMES}
    c = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    variants = {
        NO_DELTA: dict(use_delta=False),
        D_FROM_TILE: dict(delta_of=tile_rowsum(block_k)),
        NO_LSE: dict(p_of=lambda s, lse, c_: np.exp(s * c_)),
        GRAD_NO_SCALE: dict(grad_scale=1.0),
        GRAD_SCALE_TWICE: dict(grad_scale=c * c),
        P_UNSCALED: dict(p_of=lambda s, lse, c_: np.exp(s - lse[:, None])),
        P_SCALE_TWICE: dict(p_of=lambda s, lse, c_: np.exp(s * c_ * c_ - lse[:, None])),
        **p_recompute_variants(causal, block_k),
    }
    if causal:
        variants[DIAGONAL_DROPPED] = dict(
            visited=diagonal_dropped_visits(len(q), len(k), block_q, block_k))
        variants[DIAGONAL_ROUNDED_UP] = dict(
            visited=diagonal_dropped_visits(len(q), len(k), block_q, block_k, round_up=True))
        key_start = (np.arange(len(k)) // block_k) * block_k  # P unmasked in visited tiles
        variants[UNMASKED_P] = dict(mask_p=False, visited=np.arange(len(q))[:, None] >= (
            key_start // block_q * block_q)[None, :])
    wrong = {name: {} for name in NAMES}
    o_lse = forward(q, k, v, causal, scale)
    for misconception, kw in variants.items():
        for name, w in zip(NAMES, variant_backward(q, k, v, do, causal, scale, o_lse=o_lse,
                                                   **kw)):
            if np.isfinite(w).all():
                wrong[name][misconception] = w
    return wrong


def check_gradients(got, want, what, wrong=None, tol=F64, nan_hint=NAN_HINT, hint=""):
    """Grade (dq, dk, dv) one by one, naming the misconception each matches."""
    __tracebackhide__ = True
    if not isinstance(got, tuple | list) or len(got) != 3:
        raise AssertionError(f"{what}: return the triple (dq, dk, dv), got {type(got).__name__}")
    for name, g, w in zip(NAMES, got, want):
        assert_close(g, w, what=f"{name} ({what})", wrong_answers=(wrong or {}).get(name),
                     nan_hint=nan_hint, hint=hint, **tol)


def qkv_do(seed, lq, lk, d, dv, spread=1.0):
    """``random_qkv``'s q, k, v and a gradient dO ``[lq, dv]`` of the output."""
    q, k, v = random_qkv(seed, lq, lk, d, dv, spread=spread)
    return q, k, v, np.random.default_rng([seed, 1]).standard_normal((lq, dv))


def run_flash(q, k, v, do, causal, block_q, block_k, scale=None, o_lse=None):
    o, lse = o_lse if o_lse is not None else forward(q, k, v, causal, scale)
    with np.errstate(all="ignore"):
        return impl.flash_attention_backward(q, k, v, o, lse, do, block_q=block_q,
                                             block_k=block_k, scale=scale, causal=causal)


# ---- 1. the textbook backward ------------------------------------------------------------


@pytest.mark.points(3)
@given(**qkv_sizes(12, 6), causal=st.booleans())
@basic_value_test
def test_naive_backward_equals_the_float64_autograd_gradients(lq, lk, d, dv, causal, seed):
    q, k, v, do = qkv_do(seed, lq, lk, d, dv)
    with np.errstate(all="ignore"):
        got = impl.attention_backward_naive(q, k, v, do, causal=causal)
    wrong = numpy_misconceptions(q, k, v, do, causal, 1, 1)
    for w in wrong.values():  # the naive version has no lse, no tiles: only these apply
        for name in (NO_LSE, D_FROM_TILE, P_UNSCALED, P_SCALE_TWICE, DIAGONAL_DROPPED,
                     DIAGONAL_ROUNDED_UP, UNMASKED_P, P_MISSING_LOG_L, P_TILE_MAX,
                     P_TILE_SOFTMAX):
            w.pop(name, None)
    column_sums = variant_backward(q, k, v, do, causal,
                                   delta_of=lambda p, dp: (p * dp).sum(axis=0, keepdims=True))
    for name, w in zip(NAMES, column_sums):
        wrong[name][DELTA_AXIS] = w
    check_gradients(got, gradients(q, k, v, do, causal),
                    f"naive, Lq={lq} Lk={lk} d={d} dv={dv} causal={causal}", wrong)


@pytest.mark.points(1)
def test_naive_backward_takes_a_custom_scale():
    q, k, v, do = qkv_do(21, 6, 9, 4, 3)
    got = impl.attention_backward_naive(q, k, v, do, scale=0.3, causal=True)
    check_gradients(got, gradients(q, k, v, do, True, scale=0.3), "naive, scale=0.3",
                    numpy_misconceptions(q, k, v, do, True, 1, 1, scale=0.3))


# ---- 2. D = rowsum(dO ∘ O) -----------------------------------------------------------------


@pytest.mark.points(2)
@given(lq=st.integers(1, 10), lk=st.integers(1, 10), dv=st.integers(1, 6),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_backward_delta_equals_rowsum_of_p_times_dp_without_building_p(lq, lk, dv, causal, seed):
    q, k, v, do = qkv_do(seed, lq, lk, 3, dv)
    o, _ = forward(q, k, v, causal)
    s = (q @ k.T) / math.sqrt(3)
    s = np.where(causal_mask(lq, lk), s, -np.inf) if causal else s
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = (p * (do @ v.T)).sum(axis=1)  # rowsum(P ∘ dP), the definition
    assert_close(impl.backward_delta(o, do), want, what=f"D (Lq={lq}, dv={dv})",
                 hint="D_i = Σ_d dO[i, d] · O[i, d]: one number per query row",
                 wrong_answers={"D summed over the wrong axis: one number per query row, "
                                "D_i = Σ_d dO[i, d] · O[i, d]": (do * o).sum(axis=0)}, **F64)


# ---- 3. the tiled backward ------------------------------------------------------------------


@pytest.mark.points(4)
@examples(30)
@given(**qkv_sizes(24, 6, min_len=0), block_q=st.integers(1, 12), block_k=st.integers(1, 12),
       causal=st.booleans())
@basic_value_test
def test_flash_backward_equals_the_float64_autograd_gradients(
    lq, lk, d, dv, block_q, block_k, causal, seed
):
    q, k, v, do = qkv_do(seed, lq, lk, d, dv, spread=1.5)
    got = run_flash(q, k, v, do, causal, block_q, block_k)
    what = f"Lq={lq} Lk={lk} d={d} dv={dv} block_q={block_q} block_k={block_k} causal={causal}"
    check_gradients(got, gradients(q, k, v, do, causal), what,
                    numpy_misconceptions(q, k, v, do, causal, block_q, block_k))


@pytest.mark.points(1)
def test_p_is_recomputed_as_exp_of_scaled_scores_minus_lse():
    # scores in the hundreds: exp(S·scale) alone overflows, exp(S·scale - lse) <= 1 does not
    q, k, v, do = qkv_do(4, 10, 14, 4, 3)
    k = k * 150.0
    got = run_flash(q, k, v, do, False, 4, 4)
    check_gradients(got, gradients(q, k, v, do, False), "scores up to about 600",
                    numpy_misconceptions(q, k, v, do, False, 4, 4),
                    nan_hint="NaN or inf: P must be recomputed as exp(S·scale − lse); without "
                    "lse, exp of a score of 600 overflows (and is not normalised anyway)")


@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [None, 0.3, 2.0], ids=["default-1/sqrt(16)", "0.3", "2.0"])
def test_the_scale_enters_p_once_and_dq_dk_once(scale):
    q, k, v, do = qkv_do(5, 9, 13, 16, 5)
    got = run_flash(q, k, v, do, True, 4, 4, scale=scale)
    check_gradients(got, gradients(q, k, v, do, True, scale), f"d=16, scale={scale}",
                    numpy_misconceptions(q, k, v, do, True, 4, 4, scale=scale))


@pytest.mark.points(2)
@pytest.mark.parametrize("block_q, block_k", [(4, 4), (4, 8), (8, 4), (3, 5), (16, 16)])
def test_causal_tiled_backward_visits_every_diagonal_tile(block_q, block_k):
    q, k, v, do = qkv_do(6, 23, 23, 4, 3)
    got = run_flash(q, k, v, do, True, block_q, block_k)
    check_gradients(got, gradients(q, k, v, do, True), f"causal 23x23, {block_q}x{block_k} tiles",
                    numpy_misconceptions(q, k, v, do, True, block_q, block_k),
                    hint="look at the tiles that straddle the diagonal (causal: the tile "
                    "that holds a key tile's first key is half visible)")


@pytest.mark.points(2)
@pytest.mark.parametrize("block_q, block_k", [(4, 8), (8, 4), (16, 16), (8, 16)])
def test_causal_tiled_backward_never_reads_key_tiles_above_the_diagonal(block_q, block_k):
    """Keys from position 16 on are NaN; queries 0..15 never see them, so a backward that
    skips the tiles above the diagonal gets dq[:16], dk[:16] and dv[:16] right."""
    cut, n = 16, 40
    q, k, v, do = qkv_do(7, n, n, 4, 3)
    o_lse = forward(q, k, v, True)  # the forward ran on clean keys
    want = gradients(q, k, v, do, True)
    k[cut:], v[cut:] = np.nan, np.nan
    got = run_flash(q, k, v, do, True, block_q, block_k, o_lse=o_lse)
    check_gradients(tuple(to_float64(g)[:cut] for g in got), tuple(w[:cut] for w in want),
                    f"rows < {cut} with keys >= {cut} poisoned, {block_q}x{block_k} tiles")


@pytest.mark.points(1)
@pytest.mark.parametrize("lq, lk, block_q, block_k", [(9, 20, 4, 4), (13, 30, 8, 16), (5, 6, 2, 3)])
def test_causal_tiled_backward_never_reads_keys_past_the_last_query(lq, lk, block_q, block_k):
    """Top-left causal: keys lq..lk-1 are attended by nobody; they are NaN, and their
    gradients are exactly 0."""
    q, k, v, do = qkv_do(8, lq, lk, 4, 3)
    o_lse = forward(q, k, v, True)
    want = gradients(q, k, v, do, True)
    k[lq:], v[lq:] = np.nan, np.nan
    got = run_flash(q, k, v, do, True, block_q, block_k, o_lse=o_lse)
    check_gradients(got, want, f"Lq={lq} < Lk={lk}, keys past Lq poisoned",
                    hint="keys nobody attends get dk = dv = 0")


MiB = 2**20


@pytest.mark.parametrize("lq, lk, limit, message", [
    pytest.param(2048, 2048, 4 * MiB, "the Lq x Lk P (or S, dP, dS) is 32 MiB: hold one "
                 "[block_q, block_k] tile of each at a time",
                 marks=pytest.mark.points(2), id="Lq-by-Lk"),
    pytest.param(64, 65536, 24 * MiB, "a [block_q, Lk] = [64, 65536] row block of scores is "
                 "32 MiB: tile the keys, [block_q, block_k] at a time",
                 marks=pytest.mark.points(1), id="block_q-by-Lk"),
    pytest.param(65536, 64, 24 * MiB, "an [Lq, block_k] = [65536, 64] strip of scores is 32 "
                 "MiB: the inner loop walks over Q tiles of block_q rows, it does not take all "
                 "queries at once", marks=pytest.mark.points(1), id="Lq-by-block_k"),
])
def test_flash_backward_holds_one_tile_of_scores_at_a_time(lq, lk, limit, message):
    """64 x 64 tiles; a float64 score array of all queries or all keys is 32 MiB, so glibc
    maps it fresh and it always counts (the inputs and gradients are 1 MiB each at most).
    Measured by common.testing.peak_memory: tracemalloc in a plain run; under the grader
    the sandboxed worker's resident high-water mark, read from outside it."""
    q4, k, v, do4 = qkv_do(9, 4, lk, 2, 2)  # 4 query rows, repeated: the forward stays cheap
    o4, lse4 = forward(q4, k, v, False)
    reps = lq // 4
    q, o, do = (np.tile(x, (reps, 1)) for x in (q4, o4, do4))
    got = assert_peak_below(impl.flash_attention_backward, q, k, v, o, np.tile(lse4, reps), do,
                            block_q=64, block_k=64, limit=limit, message=message)
    # the values, cheaply: dq of rows 0..3 (each row's dq depends on that row alone) and, as
    # rows repeat every 4, dk and dv are reps times those of the first 4 rows
    want_dq, want_dk, want_dv = gradients(q4, k, v, do4, False)
    dq, dk, dv = (to_float64(g) for g in got)
    check_gradients((dq[:4], dk, dv), (want_dq, reps * want_dk, reps * want_dv),
                    "memory is fine", tol=dict(atol=1e-9, rtol=1e-9),
                    hint="the values are wrong: the other tests say why")


# ---- 4. bad input is a ValueError that names the argument ------------------------------

_q, _k, _v, _do = qkv_do(10, 3, 5, 4, 2)
_o, _lse = forward(_q, _k, _v, False)
_flash = impl.flash_attention_backward
BAD_INPUTS: BadInputs = {
    "naive-k": ("k", lambda: impl.attention_backward_naive(_q, _k[:, :3], _v, _do)),
    "naive-v": ("v", lambda: impl.attention_backward_naive(_q, _k, _v[:4], _do)),
    "naive-do": ("do", lambda: impl.attention_backward_naive(_q, _k, _v, _do[:2])),
    "delta-do": ("do", lambda: impl.backward_delta(_o, _do[:, :1])),
    "delta-o": ("o", lambda: impl.backward_delta(_o[0], _do)),
    "flash-lse": ("lse", lambda: _flash(_q, _k, _v, _o, _lse[:2], _do)),
    "flash-o": ("o", lambda: _flash(_q, _k, _v, _o[:2], _lse, _do)),
    "flash-do": ("do", lambda: _flash(_q, _k, _v[:, :1], _o, _lse, _do)),
    "flash-block_q": ("block_q", lambda: _flash(_q, _k, _v, _o, _lse, _do, block_q=0)),
    "flash-block_k": ("block_k", lambda: _flash(_q, _k, _v, _o, _lse, _do, block_k=-1)),
}
test_bad_input_raises_value_error_naming_the_argument = bad_input_test(BAD_INPUTS, points=0.5)


# ---- 5. the Triton backward (interpreter on a CPU, CUDA on a GPU) -------------------------


def torch_case(b, h, kvh, lq, lk, d, dtype, seed=0, scale=None, causal=False):
    """q, k, v, do [B, H|KVH, L, d] in dtype on DEVICE, and the forward's (o, lse) from the
    float64 reference on the rounded inputs (o in dtype, lse float32), as training has."""
    import torch

    from common.triton_env import DEVICE

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=gen).to(dtype)
    k = torch.randn(b, kvh, lk, d, generator=gen).to(dtype)
    v = torch.randn(b, kvh, lk, d, generator=gen).to(dtype)
    do = torch.randn(b, h, lq, d, generator=gen).to(dtype)
    o, lse = forward_reference_bhld(q, k, v, causal, scale)
    o_t = torch.tensor(o).to(dtype)
    lse_t = torch.tensor(lse).float()
    return tuple(x.to(DEVICE) for x in (q, k, v, o_t, lse_t, do))


def to_lhd(x):
    """[B, H, L, d] tensor -> float64 numpy [B, L, H, d] (the reference's [L, heads, d])."""
    return to_float64(x).transpose(0, 2, 1, 3)


def forward_reference_bhld(q, k, v, causal, scale=None):
    outs, lses = [], []
    for b in range(q.shape[0]):
        mask = causal_mask(q.shape[2], k.shape[2]) if causal else None
        o, lse = reference_attention(to_lhd(q)[b], to_lhd(k)[b], to_lhd(v)[b], scale, mask)
        outs.append(o.transpose(1, 0, 2))
        lses.append(lse.T)
    return np.stack(outs), np.stack(lses)


def reference_bhld_backward(q, k, v, do, causal, scale=None):
    """(dq, dk, dv) [B, H|KVH, L, d] in float64."""
    grads = []
    for b in range(q.shape[0]):
        mask = causal_mask(q.shape[2], k.shape[2]) if causal else None
        g = reference_attention_backward(to_lhd(q)[b], to_lhd(k)[b], to_lhd(v)[b], to_lhd(do)[b],
                                         scale, mask)
        grads.append([x.transpose(1, 0, 2) for x in g])
    return tuple(np.stack([g[i] for g in grads]) for i in range(3))


def per_head_variant(q, k, v, do, causal, scale, **variant):
    """A planted mistake's (dq, dk, dv) [B, H|KVH, L, d], head by head, dK/dV group-summed."""
    q, k, v, do = (to_float64(x) for x in (q, k, v, do))
    B, H = q.shape[:2]
    group = H // k.shape[1]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(B):
        for h in range(H):
            g = variant_backward(q[b, h], k[b, h // group], v[b, h // group], do[b, h], causal,
                                 scale, **variant)
            dq[b, h] = g[0]
            dk[b, h // group] += g[1]
            dv[b, h // group] += g[2]
    return dq, dk, dv


def group_misconceptions(q, k, v, do, causal, scale=None):
    """Wrong dK, dV of a kernel that does not sum over the query group, and the wrong dQ of
    one that maps query head h to KV head h % KVH."""
    H, KVH = q.shape[1], k.shape[1]
    group = H // KVH
    if group == 1:
        return {}
    wrong = {"dq": {}, "dk": {}, "dv": {}}
    if KVH > 1:
        q64, k64, v64, do64 = (to_float64(x) for x in (q, k, v, do))
        dq = np.zeros_like(q64)
        for b in range(q64.shape[0]):
            for h in range(H):
                o_lse = forward(q64[b, h], k64[b, h // group], v64[b, h // group], causal, scale)
                dq[b, h] = variant_backward(q64[b, h], k64[b, h % KVH], v64[b, h % KVH],
                                            do64[b, h], causal, scale, o_lse=o_lse)[0]
        if np.isfinite(dq).all():
            wrong["dq"][MODULO_HEADS] = dq
    k_rep = np.repeat(to_float64(k), group, axis=1)  # one KV copy per query head
    v_rep = np.repeat(to_float64(v), group, axis=1)
    _, dk_h, dv_h = reference_bhld_backward(q, k_rep, v_rep, do, causal, scale)  # [B, H, L, d]
    for name, per_head in (("dk", dk_h), ("dv", dv_h)):
        wrong[name][GROUP_FIRST] = per_head[:, ::group]
        wrong[name][GROUP_LAST] = per_head[:, group - 1::group]
        wrong[name][GROUP_MEAN] = per_head.reshape(*per_head.shape[:1], KVH, group,
                                                   *per_head.shape[2:]).mean(axis=2)
    return wrong


def backward_kernel_misconceptions(q, k, v, do, causal, tiles, scale=None):
    from common.triton_env import dot_tile

    lq, lk, d = q.shape[2], k.shape[2], q.shape[3]
    block_m, block_n = tiles
    c = 1.0 / math.sqrt(d) if scale is None else scale
    variants = {
        NO_DELTA: dict(use_delta=False),
        NO_LSE: dict(p_of=lambda s, lse, c_: np.exp(s * c_)),
        LSE_BASE_E: dict(p_of=lambda s, lse, c_: np.exp(s * c_ - lse[:, None] * math.log(2))),
        GRAD_NO_SCALE: dict(grad_scale=1.0),
        GRAD_SCALE_TWICE: dict(grad_scale=c * c),
        P_UNSCALED: dict(p_of=lambda s, lse, c_: np.exp(s - lse[:, None])),
        P_SCALE_TWICE: dict(p_of=lambda s, lse, c_: np.exp(s * c_ * c_ - lse[:, None])),
        **p_recompute_variants(causal, block_n),
    }
    if scale is None and dot_tile(d) != d:
        padded = 1.0 / math.sqrt(dot_tile(d))
        variants[PADDED_SCALE] = dict(
            p_of=lambda s, lse, c_: np.exp(s * padded - lse[:, None]), grad_scale=padded)
    rows, cols = np.arange(lq)[:, None], np.arange(lk)[None, :]
    dkdv_only, dq_only = ("dk", "dv"), ("dq",)  # a mistake in one kernel shows in its outputs
    kernel_specific = {}
    if causal:
        key_start = (cols // block_n) * block_n
        kernel_specific[DIAGONAL_DROPPED] = (
            dict(visited=rows >= (key_start // block_m + 1) * block_m), dkdv_only)
        kernel_specific[DQ_DIAGONAL_DROPPED] = (
            dict(visited=cols < (rows // block_m) * block_m), dq_only)
        # P unmasked inside the tiles the loops visit (the diagonal tiles' future entries)
        kernel_specific[UNMASKED_P + " (dK/dV kernel)"] = (
            dict(mask_p=False, visited=rows >= (key_start // block_m) * block_m), dkdv_only)
        kernel_specific[UNMASKED_P + " (dQ kernel)"] = (
            dict(mask_p=False, visited=cols < np.minimum(lq, (rows // block_m + 1) * block_m)),
            dq_only)
        if block_m != block_n:
            kernel_specific[SWAPPED_TILES + " (in the dK/dV kernel's first query tile)"] = (
                dict(visited=rows >= (cols // block_n) * block_m), dkdv_only)
            kernel_specific[SWAPPED_TILES + " (in the dQ kernel's last key)"] = (
                dict(visited=cols < (rows // block_m + 1) * block_n), dq_only)
    wrong = {name: {} for name in NAMES}
    planted = {m: (kw, NAMES) for m, kw in variants.items()} | kernel_specific
    for misconception, (kw, names) in planted.items():
        for name, w in zip(NAMES, per_head_variant(q, k, v, do, causal, scale, **kw)):
            if name in names and np.isfinite(w).all():
                wrong[name][misconception] = w
    for name, answers in group_misconceptions(q, k, v, do, causal, scale).items():
        wrong[name].update(answers)
    return wrong


def check_backward_kernel(case, tiles=(None, None), *, causal=False, scale=None, what="",
                          tol=None, want=None, poison=None, rows=None, no_host_sync=False,
                          layout=None, skip=0, poison_rows=None, nan_hint=NAN_HINT, hint=""):
    """Run flash_attention_backward_triton on ``case`` and grade dq, dk, dv against float64.

    ``poison(k, v)`` NaN-poisons keys after the forward ran, ``poison_rows`` the first rows
    of q, o, lse and dO; ``rows`` restricts the graded
    query rows of dq (and keys of dk, dv) to ``[:rows]``, ``skip`` to ``[skip:]``;
    ``no_host_sync`` also requires that the launcher copies nothing from the device to the
    host; ``layout`` passes every input as a ``strided_view``.
    """
    q, k, v, o, lse, do = case
    want = want or reference_bhld_backward(q, k, v, do, causal, scale)
    wrong = backward_kernel_misconceptions(q, k, v, do, causal,
                                           (tiles[0] or 16, tiles[1] or 16), scale)
    if poison is not None:
        k, v = k.clone(), v.clone()
        poison(k, v)
    if poison_rows is not None:  # rows [0, poison_rows) of q, o, lse, dO
        q, o, lse, do = (x.clone() for x in (q, o, lse, do))
        for x in (q, o, lse, do):
            x[:, :, :poison_rows] = float("nan")
    if layout is not None:
        q, k, v, o, lse, do = (strided_view(x, layout) for x in (q, k, v, o, lse, do))
    got, syncs = host_syncs(impl.flash_attention_backward_triton, q, k, v, o, lse, do,
                            causal=causal, scale=scale, block_m=tiles[0], block_n=tiles[1])
    assert not (no_host_sync and syncs), (
        f"the launcher copied device values to the host: {syncs}. Everything it needs "
        "(shapes, tile sizes, the scale) is known on the host without reading a tensor")
    assert isinstance(got, tuple | list) and len(got) == 3, (
        "flash_attention_backward_triton must return the triple (dq, dk, dv)")
    for name, g, x in zip(NAMES, got, (q, k, v)):
        assert g.dtype == x.dtype, f"{name} must have {name[1]}'s dtype {x.dtype}, got {g.dtype}"
    b, h, lq, d = q.shape
    what = (f"{what}B={b} H={h} KVH={k.shape[1]} Lq={lq} Lk={k.shape[2]} d={d} {q.dtype} "
            f"causal={causal} block_m={tiles[0]} block_n={tiles[1]}")
    atol, rtol = tol or tolerance(q.dtype)
    cut = (slice(None), slice(None), slice(skip, rows))
    for name, g, w in zip(NAMES, got, want):
        assert_close(to_float64(g)[cut], np.asarray(w)[cut], what=f"{name} ({what})",
                     atol=atol, rtol=rtol, nan_hint=nan_hint, hint=hint,
                     wrong_answers={m: np.asarray(x)[cut] for m, x in wrong[name].items()})


# (block_m, block_n): the interpreter must see the shapes a GPU uses, block_m != block_n too
TRITON_CASES = {
    # name: (B, H, KVH, Lq, Lk, d, causal, tiles)
    "ragged-16x16": (1, 1, 1, 24, 24, 16, False, (16, 16)),
    "ragged-causal-16x32": (1, 1, 1, 37, 37, 16, True, (16, 32)),
    "ragged-causal-32x16": (1, 1, 1, 37, 37, 16, True, (32, 16)),
    "batch2-causal-lq>lk-16x16": (2, 1, 1, 24, 13, 32, True, (16, 16)),
    "causal-lq<lk-default-tiles": (1, 1, 1, 20, 33, 16, True, (None, None)),
}


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("case", list(TRITON_CASES))
@basic_value_test
def test_triton_backward_matches_float64_gradients_at_several_tile_shapes(case):
    import torch

    b, h, kvh, lq, lk, d, causal, tiles = TRITON_CASES[case]
    case = torch_case(b, h, kvh, lq, lk, d, torch.float32, seed=lq + lk, causal=causal)
    check_backward_kernel(case, tiles, causal=causal)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("d", [ODD_HEAD_DIMS[0], 64], ids=["d24", "d64"])
def test_triton_head_dims_24_and_64_use_the_real_head_dim(d):
    """24 is padded to a tl.dot tile of 32; the default scale stays 1/sqrt(24)."""
    import torch

    causal = d != 64
    case = torch_case(1, 1, 1, 20, 20, d, torch.float32, seed=d, causal=causal)
    check_backward_kernel(case, (16, 16), causal=causal)


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_backward_takes_a_custom_scale_and_makes_no_host_synchronisation():
    """Measured by common.testing.host_syncs inside the process that runs the code (under
    the grader, the sandboxed worker): a teaching check, since a submission that undoes
    its patching of torch.Tensor is not caught (README: not defended)."""
    import torch

    case = torch_case(1, 1, 1, 16, 16, 16, torch.float32, seed=5, scale=0.3, causal=True)
    check_backward_kernel(case, (16, 16), causal=True, scale=0.3, no_host_sync=True)


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("h, kvh, causal", [(4, 2, True), (4, 1, False), (8, 1, True)],
                         ids=["group2-4q-2kv", "group4-4q-1kv", "group8-8q-1kv"])
def test_triton_dk_dv_of_a_kv_head_sum_over_its_query_group(h, kvh, causal):
    """A KV head's dK, dV are the sums over the H // KVH query heads that read it."""
    import torch

    case = torch_case(1, h, kvh, 16, 16, 16, torch.float32, seed=h + kvh, causal=causal)
    check_backward_kernel(case, (16, 16), causal=causal, what="GQA: ")


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_backward_in_float16():
    import torch

    # float16 inputs, float32 accumulation; P and dS are rounded to float16 for the tl.dots
    # as on a GPU, so the gradients carry about 1e-3 relative error
    case = torch_case(1, 2, 1, 24, 24, 32, torch.float16, seed=9, causal=True)
    check_backward_kernel(case, (16, 32), causal=True, tol=(1e-2, 1e-2))


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_backward_reads_transposed_and_sliced_views_through_their_strides(layout):
    """"transposed": [B, L, H, d] storage viewed as [B, H, L, d]; "sliced": every other row
    of a bigger storage at an offset, NaN between the rows. Same gradients as contiguous."""
    import torch

    case = torch_case(1, 4, 2, 24, 24, 16, torch.float32, seed=19, causal=True)
    strides = ("a kernel stepped with a stride it assumed instead of the tensor's own (pass "
               "every .stride(), or make the inputs contiguous first)")
    check_backward_kernel(case, (16, 16), causal=True, layout=layout, what=f"{layout} views, ",
                          nan_hint=f"NaN with {layout} views: NaN sits between the rows of a "
                          f"sliced view, so {strides}",
                          hint=f"wrong with {layout} views: {strides}")


@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_backward_programs_store_disjoint_gradients_no_atomics_needed():
    """On the interpreter: no two programs of one launch store to the same element of
    Delta, dK, dV or dQ (GQA: one dK/dV program sums its whole query group)."""
    import torch

    q, k, v, o, lse, do = torch_case(1, 4, 2, 37, 37, 16, torch.float32, seed=7, causal=True)
    got, reports = kernel_memory(impl.flash_attention_backward_triton, q, k, v, o, lse, do,
                                 causal=True, block_m=16, block_n=32)
    want = reference_bhld_backward(q, k, v, do, True, None)
    atol, rtol = tolerance("float32")
    for name, g, w in zip(NAMES, got, want):
        assert_close(g, w, what=f"{name} (GQA 4q/2kv, causal, 16x32)", atol=atol, rtol=rtol)
    assert_no_races(reports, "flash_attention_backward_triton")
    assert_loads_in_bounds(reports, "flash_attention_backward_triton")


@pytest.mark.triton
@pytest.mark.points(2)
@tile_shapes()
def test_triton_causal_dk_dv_never_visit_query_rows_above_the_diagonal(tiles):
    """Rows 0..31 of q, dO, O and lse are NaN. Under the causal mask keys 32.. are seen by
    rows 32.. only, so their dK, dV (and dQ of rows 32..) stay finite: a dK/dV loop that
    starts at query tile 0 and masks P to 0 still multiplies NaN (0 * NaN = NaN)."""
    import torch

    cut = 32
    case = torch_case(1, 2, 1, 48, 48, 16, torch.float32, seed=29, causal=True)

    check_backward_kernel(case, tiles, causal=True, poison_rows=cut, skip=cut,
                          what=f"query rows < {cut} NaN-poisoned, graded from row/key {cut}, ",
                          nan_hint=(f"NaN: query rows 0..{cut - 1} are poisoned, and under the "
                                    f"causal mask no key >= {cut} is seen by them. The dK/dV "
                                    "loop over query tiles must start at the tile holding row "
                                    "start_n * BLOCK_N (lo = start_n * BLOCK_N // BLOCK_M * "
                                    "BLOCK_M), not at 0: masking P to 0 does not help, since "
                                    "dS = P * (dP - Delta) is 0 * NaN"))


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize(
    "lq, lk, rows, tiles",
    [(40, 40, 32, (32, 16)), (21, 40, None, (16, 32))],
    ids=["future-key-tiles-32x16", "keys-past-lq-16x32"],
)
def test_triton_causal_backward_never_reads_keys_no_query_may_see(lq, lk, rows, tiles):
    """NaN keys: from position ``rows`` on (dq of rows < ``rows`` must not see them: the dQ
    loop stops at the query tile's last row), or past Lq (nobody sees them: dk = dv = 0)."""
    import torch

    case = torch_case(1, 1, 1, lq, lk, 16, torch.float32, seed=3, causal=True)
    start = lq if rows is None else rows

    def poison(k, v):
        k[:, :, start:] = float("nan")
        v[:, :, start:] = float("nan")

    check_backward_kernel(case, tiles, causal=True, poison=poison, rows=rows,
                          what=f"keys >= {start} NaN-poisoned, ")


@pytest.mark.triton
@pytest.mark.points(0.5)
def test_triton_backward_with_nothing_to_do_returns_zeros():
    import torch

    q, k, v, o, lse, do = torch_case(1, 2, 1, 5, 0, 16, torch.float32)
    dq, dk, dv = impl.flash_attention_backward_triton(q, k, v, o, lse, do)
    assert tuple(dq.shape) == (1, 2, 5, 16) and bool((dq == 0).all()), "no keys: dq is 0"
    assert tuple(dk.shape) == (1, 1, 0, 16) and tuple(dv.shape) == (1, 1, 0, 16)


@pytest.mark.triton
@pytest.mark.points(0.5)
def test_triton_refuses_bfloat16_on_the_interpreter():
    import torch

    from common.triton_env import on_interpreter

    q, k, v, o, lse, do = torch_case(1, 1, 1, 16, 16, 16, torch.float32)
    if not on_interpreter(q):
        pytest.skip("bfloat16 runs on a GPU; the interpreter refuses it")
    q, k, v, o, do = (x.to(torch.bfloat16) for x in (q, k, v, o, do))
    with pytest.raises(ValueError, match=r"\bq\b.*bfloat16"):
        impl.flash_attention_backward_triton(q, k, v, o, lse, do)


def _bad_backward_calls():
    import torch

    case = torch_case(1, 4, 2, 8, 8, 16, torch.float32)
    q, k, v, o, lse, do = case
    return {
        "k head_dim differs": ((q, k[..., :8], v, o, lse, do), {}),
        "v length differs": ((q, k, v[:, :, :5], o, lse, do), {}),
        "heads do not divide": ((q[:, :3], k, v, o[:, :3], lse[:, :3], do[:, :3]), {}),
        "o shaped unlike q": ((q, k, v, o[:, :, :5], lse, do), {}),
        "do shaped unlike q": ((q, k, v, o, lse, do[:, :2]), {}),
        "lse of the wrong shape": ((q, k, v, o, lse[..., :3], do), {}),
        "lse not float32": ((q, k, v, o, lse.double(), do), {}),
        "block_m not a power of two": (case, {"block_m": 24}),
        "block_n below 16": (case, {"block_n": 8}),
    }


# {case: the argument its ValueError must name}; the calls are built on first use (torch).
BAD_TRITON = {"k head_dim differs": "k", "v length differs": "v",
              "heads do not divide": "num_kv_heads", "o shaped unlike q": "o",
              "do shaped unlike q": "do", "lse of the wrong shape": "lse",
              "lse not float32": "lse", "block_m not a power of two": "block_m",
              "block_n below 16": "block_n"}


def _bad_backward_call(case: str) -> None:
    args, kwargs = _bad_backward_calls()[case]
    impl.flash_attention_backward_triton(*args, **kwargs)


test_triton_rejects_bad_input_naming_the_argument = bad_input_test(
    {case: (argument, functools.partial(_bad_backward_call, case))
     for case, argument in BAD_TRITON.items()},
    points=0.5, marks=(pytest.mark.triton,))


# ---- 6. flash_attention: autograd end to end -----------------------------------------------


@pytest.mark.points(1)  # the given plain-torch forward: no Triton kernel runs here
def test_flash_attention_returns_the_attention_output():
    import torch

    q, k, v, o, _, _ = torch_case(1, 4, 2, 12, 12, 16, torch.float32, seed=11, causal=True)
    got = impl.flash_attention(q, k, v, causal=True)
    assert isinstance(got, torch.Tensor), (
        f"flash_attention returns o alone (one tensor), got {type(got).__name__}: the "
        "autograd.Function's forward returns o and keeps lse for the backward (ctx)")
    assert_close(got, o, what="flash_attention output", **dict(zip(("atol", "rtol"),
                                                                   tolerance("float32"))))


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("h, kvh, causal", [(1, 1, False), (2, 1, True)],
                         ids=["mha-full", "gqa-2q-1kv-causal"])
def test_loss_backward_through_flash_attention_gives_the_float64_gradients(h, kvh, causal):
    """(flash_attention(q, k, v) * do).sum().backward() runs the lab's Triton backward."""
    import torch

    q, k, v, _, _, do = torch_case(1, h, kvh, 20, 16, 16, torch.float32, seed=h, causal=causal)
    got = impl.gradients_through_autograd(q, k, v, do, causal=causal)
    want = reference_bhld_backward(q, k, v, do, causal)
    wrong = {name: {} for name in NAMES}
    if causal:  # first: the Function forgot to pass causal on
        not_causal = per_head_variant(q, k, v, do, True, None, mask_p=False)
        for name, w in zip(NAMES, not_causal):
            wrong[name][BACKWARD_NOT_CAUSAL] = w
    for name, answers in backward_kernel_misconceptions(q, k, v, do, causal, (16, 16)).items():
        wrong[name].update(answers)
    atol, rtol = tolerance("float32")
    for name, g, w in zip(NAMES, got, want):
        assert g is not None, (
            f"{name} is None after loss.backward(): FlashAttentionFunction.backward must "
            "return (dq, dk, dv, None, None), one gradient per input of forward")
        assert_close(g, w, what=f"{name} through autograd (H={h} KVH={kvh} causal={causal})",
                     atol=atol, rtol=rtol, nan_hint=NAN_HINT, wrong_answers=wrong[name],
                     hint="the backward must get causal and scale from the forward (ctx)")



SCALE_HINT = ("the scale must reach the forward and be kept for the backward (ctx.scale); "
              "0 is a scale, only None means 1/sqrt(d) (`if scale is None`)")


def _scale_case(scale):
    import torch

    return torch_case(1, 2, 1, 12, 12, 16, torch.float32, seed=13, scale=scale, causal=True)


@pytest.mark.points(0.5)
@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_flash_attention_forward_takes_the_scale_keyword(scale):
    """``flash_attention(..., scale=)``: the output uses the given scale; 0 is a scale
    (uniform weights), only None is 1/sqrt(d). (The forward is given: no Triton kernel.)"""
    q, k, v, o, _, _ = _scale_case(scale)
    atol, rtol = tolerance("float32")
    got = impl.flash_attention(q, k, v, causal=True, scale=scale)
    assert_close(got, o, what=f"flash_attention output (scale={scale})", atol=atol, rtol=rtol,
                 hint=SCALE_HINT)  # fmt: skip


@pytest.mark.triton
@pytest.mark.points(0.5)
@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_flash_attention_backward_takes_the_scale_keyword(scale):
    """Through loss.backward(), the Triton backward's gradients use the forward's scale."""
    q, k, v, _, _, do = _scale_case(scale)
    atol, rtol = tolerance("float32")
    grads = impl.gradients_through_autograd(q, k, v, do, causal=True, scale=scale)
    for name, g, w in zip(NAMES, grads, reference_bhld_backward(q, k, v, do, True, scale)):
        assert_close(g, w, what=f"{name} through autograd (scale={scale})", atol=atol,
                     rtol=rtol, hint=SCALE_HINT)  # fmt: skip


# ---- 7. realistic sizes on a real GPU (skipped without CUDA) ----------------------------


def sdpa_gradients(q, k, v, do, causal):
    """SDPA's backward in float32 (K/V repeated per query head; autograd sums the copies)."""
    import torch.nn.functional as F

    group = q.shape[1] // k.shape[1]
    q, k, v = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                         v.repeat_interleave(group, 1), is_causal=causal)
    out.backward(do.float())
    return q.grad, k.grad, v.grad


def relative_error(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "dtype_name, d", [("bfloat16", 128), ("float16", 128), ("float16", 64), ("bfloat16", 64)]
)
def test_triton_backward_on_a_gpu_matches_sdpas_backward_at_4k_tokens(dtype_name, d, causal):
    """B=2, 32 query heads over 8 KV heads, 4,096 tokens: gradients within the rounding of
    the input dtype of SDPA's backward computed in float32."""
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_q, shape_kv = (2, 32, 4096, d), (2, 8, 4096, d)
    q, k, v, do = (torch.randn(s, device="cuda", generator=gen).to(dtype)
                   for s in (shape_q, shape_kv, shape_kv, shape_q))
    o, lse = lse_forward(q, k, v, causal)
    dq, dk, dv = impl.flash_attention_backward_triton(q, k, v, o.to(dtype), lse, do,
                                                      causal=causal)
    want = sdpa_gradients(q, k, v, do, causal)
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    for name, g, w in zip(NAMES, (dq, dk, dv), want):
        assert g.dtype == dtype
        err = relative_error(g, w)
        assert err < limit, f"{name}: relative error {err:.2e} vs SDPA's float32 backward"


def lse_forward(q, k, v, causal):
    """(o, lse) in float32 on the GPU, one head at a time (the [L, L] scores of one head)."""
    import torch

    group = q.shape[1] // k.shape[1]
    o = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h].float() @ k[b, h // group].float().T) / math.sqrt(q.shape[-1])
            if causal:
                s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
            lse[b, h] = torch.logsumexp(s, dim=-1)
            o[b, h] = torch.softmax(s, dim=-1) @ v[b, h // group].float()
    return o, lse


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(1)
def test_triton_backward_on_a_gpu_is_bitwise_deterministic():
    """No atomics: two runs give the same bits (FlashAttention-2's atomic dQ would not)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1, 16, 2048, 128, device="cuda", generator=gen).half()
    k, v = (torch.randn(1, 4, 2048, 128, device="cuda", generator=gen).half() for _ in "kv")
    do = torch.randn_like(q)
    o, lse = lse_forward(q, k, v, True)
    first = impl.flash_attention_backward_triton(q, k, v, o.half(), lse, do, causal=True)
    second = impl.flash_attention_backward_triton(q, k, v, o.half(), lse, do, causal=True)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), f"{name} differs between two identical runs"


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(1)
def test_loss_backward_on_a_gpu_matches_sdpa():
    import torch

    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(2, 16, 4096, 64, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(2, 4, 4096, 64, device="cuda", generator=gen).to(torch.bfloat16)
            for _ in "kv")
    do = torch.randn_like(q)
    got = impl.gradients_through_autograd(q, k, v, do, causal=True)
    want = sdpa_gradients(q, k, v, do, True)
    for name, g, w in zip(NAMES, got, want):
        err = relative_error(g, w)
        assert err < 2e-2, f"{name}: relative error {err:.2e} vs SDPA's float32 backward"


# ---- compiled for an H100 on the CPU: what the interpreter cannot see (grading's compile_check)
test_kernel_compiles_for_sm_90_with_ieee_dots_no_spills_and_64_bit_offsets = sm90_compile_test(
    __file__)  # None where bench/ is absent (the grader's copy): nothing to collect
