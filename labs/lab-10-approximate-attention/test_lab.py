"""Lab 10 spec: the approximate-attention era, measured against exact attention.

Run:  LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-10-approximate-attention -q

Expected values come from ``common``'s float64 reference (``reference_attention`` with a
mask) or from the definitions written out below, never from the code under test. The
randomised methods draw their random matrices from fixed seeds, so every run sees the same
numbers; where a test checks a statistical claim, its docstring gives the probability that a
correct implementation would fail it under a fresh seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import load_impl, reference_attention
from common.loader import load_lab_module
from common.reference import to_float64, window_mask
from common.testing import (
    BadInputs,
    assert_close,
    assert_peak_below,
    bad_input_test,
    called_on_copies,
    examples,
    peak_memory,
    raised_as,
    random_qkv,
    scale_wrong,
)

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))
provided = load_lab_module(__file__, "provided")  # given code: the seeded random matrices

WINDOW_ONE_TOO_WIDE = (
    "the window is one key too wide at its edge: with window w a token sees w - 1 "
    "neighbours on each side plus itself (|i - j| < w), FlashAttention's window_size=(w-1, w-1)"
)
WINDOW_ONE_TOO_NARROW = (
    "the window is one key too narrow at its edge: |i - j| < w includes |i - j| = w - 1 "
    "(and the token itself)"
)
GLOBAL_ROWS_ONLY = (
    "a global token attends every key but is not attended to: every query must also see "
    "the global tokens (their columns)"
)
GLOBAL_COLUMNS_ONLY = (
    "every query sees the global tokens, but a global token must also attend every key "
    "(its row)"
)
SWAPPED_EF = "e and f swapped: K is projected with e (K' = e @ k) and V with f (V' = f @ v)"
READ_BEFORE_WRITE = (
    "the state was read before token i was added to it: causal includes the token itself, "
    "so add phi(k_i) v_i^T and phi(k_i) to S and z first, then read out_i"
)
NO_PREFIX_SUM = (
    "causal linear attention without the causal prefix sum: every query read the sums over ALL "
    "keys (phi(K)^T V and sum_j phi(k_j) of the whole sequence); query i may read only keys "
    "j <= i, a running (prefix) sum of phi(k_j) v_j^T and phi(k_j)"
)
DENOMINATOR_NOT_MASKED = (
    "causal mask applied to the numerator only: the denominator of query i must be the prefix "
    "sum phi(q_i) . sum_{j<=i} phi(k_j), not the sum over every key"
)
NO_HALF_NORM = "forgot the -|x|^2 / 2 in the exponent: phi(x) = exp(w . x - |x|^2 / 2) / sqrt(m)"
NO_ROOT_M = "forgot the 1 / sqrt(m): with m features, phi(q) . phi(k) must average, not sum"


SEEDS = st.integers(0, 2**16)  # the seed of a property test's random inputs


def sizes(**ranges):
    """``{name: integers in [lo, hi]}`` for ``@given``: the sizes a property test draws."""
    return {name: st.integers(lo, hi) for name, (lo, hi) in ranges.items()}


def assert_out_and_lse(got, want, what, wrong_out=None, wrong_lse=None, **kwargs):
    """``got`` and ``want`` are ``(out, lse)``; ``kwargs`` (hints) apply to both checks,
    ``wrong_out`` / ``wrong_lse`` (misconception: wrong answer) to each one's."""
    __tracebackhide__ = True
    out, lse = got
    assert_close(out, want[0], what=f"out ({what})", wrong_answers=wrong_out, **kwargs)
    assert_close(lse, want[1], what=f"lse ({what})", wrong_answers=wrong_lse, **kwargs)


ACC_NOT_RESCALED = (
    "the accumulator was not rescaled when a key chunk raised the running max: acc must be "
    "multiplied by exp(m_old - m_new), like l"
)
L_NOT_RESCALED = (
    "the denominator l was not rescaled when a key chunk raised the running max: l must be "
    "multiplied by exp(m_old - m_new), like acc"
)
REFORMER_KEYS = "the keys must be the queries scaled to unit length (k_j = qk_j / |qk_j|)"
LSE_WITHOUT_MAX = "lse without the running max: lse = m + log(l), not log(l)"
LSH_LAST_ROUND = (
    "only the last round's buckets were attended: a query attends every key that shares a "
    "bucket with it in ANY round (the union over the rounds)"
)
MASS_INVERTED = (
    "the mass ratio taken the wrong way round: the captured mass is exp(lse_buckets - lse_all), "
    "a fraction <= 1 (the buckets' denominator over the full one)"
)


def chunked_wrongs(q, k, v, query_chunk, key_chunk):
    """({misconception: out}, {misconception: lse}) of chunked attention with the classic
    mistakes of the running (m, l, acc), written out here (not taken from solution.py)."""

    def run(rescale_acc=True, rescale_l=True):
        out, lse = np.zeros((len(q), v.shape[1])), np.full(len(q), -np.inf)
        m_all = np.full(len(q), -np.inf)
        for q0 in range(0, len(q), query_chunk):
            rows = slice(q0, q0 + query_chunk)
            m = np.full(len(q[rows]), -np.inf)
            l, acc = np.zeros(len(q[rows])), np.zeros((len(q[rows]), v.shape[1]))
            for k0 in range(0, len(k), key_chunk):
                s = q[rows] @ k[k0 : k0 + key_chunk].T / math.sqrt(q.shape[1])
                m_new = np.maximum(m, s.max(axis=1))
                alpha, p = np.exp(m - m_new), np.exp(s - m_new[:, None])
                l = (alpha if rescale_l else 1.0) * l + p.sum(axis=1)
                acc = (alpha[:, None] if rescale_acc else 1.0) * acc + p @ v[k0 : k0 + key_chunk]
                m = m_new
            out[rows], lse[rows], m_all[rows] = acc / l[:, None], m + np.log(l), m
        return out, lse, m_all

    _, lse, m = run()
    return ({ACC_NOT_RESCALED: run(rescale_acc=False)[0], L_NOT_RESCALED: run(rescale_l=False)[0]},
            {LSE_WITHOUT_MAX: lse - m})


def softmax_matrix(q, k, scale=None):
    """The float64 ``[Lq, Lk]`` softmax matrix, read off the reference (v = identity)."""
    out, _ = reference_attention(q, k, np.eye(len(k)), scale=scale)
    return out


def assert_mask(got, want, what, wrong_answers=None):
    """``got`` must be the bool array ``want``; else name the misconception or a cell."""
    __tracebackhide__ = True
    got = np.asarray(got)
    if got.shape != want.shape:
        raise AssertionError(f"{what} has shape {got.shape}, expected {want.shape}")
    if got.dtype != np.bool_:
        raise AssertionError(f"{what} must be a bool array (True = may attend), got {got.dtype}")
    if np.array_equal(got, want):
        return
    for name, wrong in (wrong_answers or {}).items():
        if np.array_equal(got, wrong):
            raise AssertionError(f"{what} is wrong: {name}")
    i, j = (int(x[0]) for x in np.nonzero(got != want))
    raise AssertionError(
        f"{what}: query {i}, key {j} is {bool(got[i, j])}, expected {bool(want[i, j])} "
        f"({int((got != want).sum())} cells differ)"
    )


def grid(n):
    """``(i, j)``: the query index and the key index of every cell of an ``[n, n]`` mask."""
    return tuple(np.indices((n, n)))


def window_global_definition(n, window, global_tokens, causal, rows=True, cols=True):
    """The window from ``common.reference.window_mask`` (causal: the ``window`` most recent
    keys), mirrored for the bidirectional case, plus global rows and columns."""
    causal_window = window_mask(n, n, window)
    mask = causal_window if causal else causal_window | causal_window.T
    g = np.zeros(n, dtype=bool)
    g[list(global_tokens)] = True
    mask = mask | (g[:, None] if rows else False) | (g[None, :] if cols else False)
    return mask & (np.arange(n)[None, :] <= np.arange(n)[:, None]) if causal else mask


# ---- 1. the N^2 wall ---------------------------------------------------------------------

MiB, GiB = 2**20, 2**30


@pytest.mark.points(1)
@pytest.mark.parametrize(
    "n, per_head, per_model",
    [(512, MiB // 2, 192 * MiB), (2048, 8 * MiB, 3 * GiB), (8192, 128 * MiB, 48 * GiB),
     (32768, 2 * GiB, 768 * GiB)],
    ids=["512", "2k", "8k", "32k"],
)  # fmt: skip
def test_score_matrix_bytes_per_head_and_for_16_heads_by_24_layers(n, per_head, per_model):
    got = impl.score_matrix_bytes(n)
    assert got == per_head, (
        f"one FP16 head at N={n}: N*N*2 = {per_head} bytes, got {got!r}"
        + (" (counted elements, not bytes)" if got == n * n else "")
    )
    got = impl.score_matrix_bytes(n, num_heads=16, num_layers=24)
    assert got == per_model, f"16 heads x 24 layers at N={n}: {per_model} bytes, got {got!r}"
    assert impl.score_matrix_bytes(n, bytes_per_element=4) == 2 * per_head, "FP32 is 4 bytes"


# ---- 2. fixed sparse patterns ------------------------------------------------------------


@pytest.mark.points(2)
@given(**sizes(n=(0, 40), stride=(1, 12)), causal=st.booleans())
def test_strided_mask_is_local_plus_every_stride_th_key(n, stride, causal):
    i, j = grid(n)
    both_ways = (np.abs(i - j) < stride) | ((i - j) % stride == 0)
    want = both_ways & (j <= i) if causal else both_ways
    wrong = {"causal: a query may not see keys after it (j <= i)": both_ways} if causal else {}
    assert_mask(
        impl.strided_mask(n, stride, causal=causal),
        want,
        f"strided_mask(n={n}, stride={stride}, causal={causal})",
        wrong,
    )


@pytest.mark.points(2)
@given(**sizes(n=(0, 40), block=(1, 10), summary=(0, 10)), causal=st.booleans())
def test_fixed_mask_is_own_block_plus_summary_columns(n, block, summary, causal):
    summary = min(summary, block)
    i, j = grid(n)
    want = (i // block == j // block) | (j % block >= block - summary)
    first = (i // block == j // block) | (j % block < summary)
    if causal:
        want, first = want & (j <= i), first & (j <= i)
    wrong = {"the summary columns are the LAST num_summary keys of each block": first}
    assert_mask(
        impl.fixed_mask(n, block, summary, causal=causal),
        want,
        f"fixed_mask(n={n}, block={block}, num_summary={summary}, causal={causal})",
        wrong if summary and summary < block else None,
    )


def window_global_wrong_answers(n, window, glob, causal):
    wrong = {
        GLOBAL_ROWS_ONLY: window_global_definition(n, window, glob, causal, cols=False),
        GLOBAL_COLUMNS_ONLY: window_global_definition(n, window, glob, causal, rows=False),
        WINDOW_ONE_TOO_WIDE: window_global_definition(n, window + 1, glob, causal),
    }
    if window > 1:
        wrong[WINDOW_ONE_TOO_NARROW] = window_global_definition(n, window - 1, glob, causal)
    return wrong


@pytest.mark.points(3)
@given(
    **sizes(n=(1, 40), window=(1, 10)),
    glob=st.sets(st.integers(0, 39), max_size=3),
    causal=st.booleans(),
)
def test_window_global_mask_is_a_window_plus_global_rows_and_columns(n, window, glob, causal):
    glob = sorted(g for g in glob if g < n)
    assert_mask(
        impl.window_global_mask(n, window, glob, causal=causal),
        window_global_definition(n, window, glob, causal),
        f"window_global_mask(n={n}, window={window}, global_tokens={glob}, causal={causal})",
        window_global_wrong_answers(n, window, glob, causal),
    )


@pytest.mark.points(1)
@pytest.mark.parametrize("causal", [False, True])
def test_a_window_of_w_sees_w_minus_1_neighbours_and_the_token_itself(causal):
    n, window = 16, 4
    mask = np.asarray(impl.window_global_mask(n, window, (), causal=causal))
    row = np.flatnonzero(mask[8]) if mask.shape == (n, n) else None
    want = [5, 6, 7, 8] if causal else [5, 6, 7, 8, 9, 10, 11]
    assert row is not None and row.tolist() == want, (
        f"window={window}, causal={causal}: token 8 must see keys {want}, got "
        f"{None if row is None else row.tolist()}. "
        + (WINDOW_ONE_TOO_WIDE if row is not None and len(row) > len(want) else "")
        + (WINDOW_ONE_TOO_NARROW if row is not None and len(row) < len(want) else "")
    )


@pytest.mark.points(1)
def test_a_global_token_is_attended_by_every_query_and_attends_every_key():
    n = 12
    mask = np.asarray(impl.window_global_mask(n, 2, [3]))
    assert mask.shape == (n, n), f"mask has shape {mask.shape}, expected {(n, n)}"
    assert mask[3].all(), GLOBAL_COLUMNS_ONLY
    assert mask[:, 3].all(), GLOBAL_ROWS_ONLY


@pytest.mark.points(2)
@examples(15)
@given(
    **sizes(n=(1, 48), window=(1, 6), num_random=(0, 6)),
    glob=st.sets(st.integers(0, 47), max_size=2),
    seed=SEEDS,
)
def test_bigbird_adds_num_random_unseen_keys_to_every_row(n, window, glob, num_random, seed):
    glob = sorted(g for g in glob if g < n)
    base = window_global_definition(n, window, glob, causal=False)
    what = f"bigbird_mask(n={n}, window={window}, global_tokens={glob}, num_random={num_random})"
    mask = np.asarray(impl.bigbird_mask(n, window, glob, num_random, seed=seed))
    assert mask.shape == (n, n) and mask.dtype == np.bool_, f"{what}: got {mask.dtype} {mask.shape}"
    missing = base & ~mask
    assert not missing.any(), (
        f"{what}: lost window/global cells (query {np.argwhere(missing)[0].tolist()}): the random "
        "keys are added on top of window_global_mask(n, window, global_tokens)"
    )
    extra = (mask & ~base).sum(axis=1)
    want = np.minimum(num_random, (~base).sum(axis=1))
    bad = np.flatnonzero(extra != want)
    assert not bad.size, (
        f"{what}: row {bad[0]} gained {extra[bad[0]]} random keys, expected {want[bad[0]]} "
        "(num_random distinct keys the row did not see yet, or all of them if fewer remain)"
    )
    again = np.asarray(impl.bigbird_mask(n, window, glob, num_random, seed=seed))
    assert np.array_equal(mask, again), f"{what}: the same seed must give the same mask"


@pytest.mark.points(2)
def test_bigbird_random_keys_are_uniform_over_the_unseen_keys():
    """Sum over rows of the chosen key positions, standardised against uniform sampling
    without replacement, must lie within 6 standard deviations. Under a correct sampler it
    is close to normal (200 rows x 4 picks), so a fresh seed fails with probability about
    2e-9. Picking the nearest or the first unseen keys lands hundreds of sigmas away."""
    n, window, r = 200, 3, 4
    mask = np.asarray(impl.bigbird_mask(n, window, [], r, seed=1234))
    base = window_global_definition(n, window, [], causal=False)
    total, mean, var = 0.0, 0.0, 0.0
    for i in range(n):
        unseen = np.flatnonzero(~base[i])
        picked = np.flatnonzero(mask[i] & ~base[i])
        total += picked.sum()
        mean += r * unseen.mean()
        var += r * unseen.var() * (len(unseen) - r) / (len(unseen) - 1)
    z = (total - mean) / math.sqrt(var)
    assert abs(z) < 6, (
        f"the random keys are not uniform over each row's unseen keys (z = {z:.1f}): draw them "
        "with the seeded generator, e.g. rng.choice(unseen, size=num_random, replace=False)"
    )
    assert not np.array_equal(mask, impl.bigbird_mask(n, window, [], r, seed=4321)), (
        "different seeds gave the same random keys"
    )


# ---- 3. attention restricted to a mask ---------------------------------------------------

SPARSE_NAN = (
    "NaN reached the output: the keys this row may not attend are NaN-poisoned. Gather the "
    "allowed keys (k[allowed], v[allowed]) instead of scoring every key and masking after: "
    "0 * NaN is NaN, so a masked probability of 0 still lets a poisoned value through."
)


@pytest.mark.points(3)
@given(
    **sizes(lq=(1, 16), lk=(1, 24), d=(1, 6), dv=(1, 5)),
    density=st.floats(0.0, 1.0),
    seed=SEEDS,
)
def test_sparse_attention_equals_dense_attention_restricted_to_the_mask(
    lq, lk, d, dv, density, seed
):
    q, k, v = random_qkv(seed, lq, lk, d, dv, spread=1.5)
    mask = np.random.default_rng(seed + 1).random((lq, lk)) < density
    want = reference_attention(q, k, v, mask=mask)
    unseen = ~mask.any(axis=0)
    k[unseen], v[unseen] = np.nan, np.nan  # no row may read these
    with np.errstate(all="ignore"), raised_as("a row that may attend nothing (no allowed key) "
                                              "has lse = -inf and out = 0, not an error"):
        got = impl.sparse_attention(q, k, v, mask)
    assert_out_and_lse(got, want, f"Lq={lq} Lk={lk} d={d} dv={dv}, {int(mask.sum())} allowed pairs",
                       nan_hint=SPARSE_NAN,
                       hint="a row that may attend nothing has lse = -inf and out = 0")


PATTERNS = {
    "strided": lambda n: impl.strided_mask(n, 5),
    "fixed": lambda n: impl.fixed_mask(n, 8, 2),
    "window+global": lambda n: impl.window_global_mask(n, 3, [0, 17]),
    "bigbird": lambda n: impl.bigbird_mask(n, 3, [0], 2, seed=5),
}


@pytest.mark.points(2)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_sparse_attention_never_reads_a_key_outside_the_row(pattern):
    n = 40
    mask = np.asarray(PATTERNS[pattern](n), dtype=bool)
    assert mask.shape == (n, n), f"the {pattern} mask has shape {mask.shape}"
    q, k, v = random_qkv(9, n, n, 4, 3)
    want_out, want_lse = reference_attention(q, k, v, mask=mask)
    for i in (0, 1, 19, 39):  # one query at a time: every key it may not see is poisoned
        k_i, v_i = k.copy(), v.copy()
        k_i[~mask[i]], v_i[~mask[i]] = np.nan, np.nan
        with np.errstate(all="ignore"):
            got = impl.sparse_attention(q[i : i + 1], k_i, v_i, mask[i : i + 1])
        assert_out_and_lse(got, (want_out[i : i + 1], want_lse[i : i + 1]),
                           f"{pattern} pattern, query {i}", nan_hint=SPARSE_NAN)


@pytest.mark.points(2)
@given(**sizes(layers=(0, 4), window=(1, 6)), causal=st.booleans())
def test_receptive_field_is_what_stacked_windows_reach(layers, window, causal):
    n = 2 * layers * window + 3
    one = window_global_definition(n, window, [], causal).astype(np.int64)
    reach = np.eye(n, dtype=np.int64)
    for _ in range(layers):  # layer by layer: who can have influenced token t
        reach = np.minimum(one @ reach, 1)
    t = n - 1 if causal else n // 2  # far from the edge it cannot pass
    want = int(reach[t].sum())
    got = impl.receptive_field(layers, window, causal=causal)
    assert got == want, (
        f"{layers} layers of window {window} ({'causal' if causal else 'bidirectional'}): "
        f"{want} positions reach a token, got {got!r}. Each layer reaches window - 1 "
        "tokens further (per side); the token itself is counted once"
    )


# ---- 4. LSH attention ---------------------------------------------------------------------


def buckets_by_definition(x, rotations):
    """``[n_rounds, N]``: argmax of ``[x R, -x R]`` per round."""
    proj = np.einsum("nd,rdb->rnb", to_float64(x), rotations)
    return np.argmax(np.concatenate([proj, -proj], axis=-1), axis=-1)


def same_bucket_mask(q, k, rotations):
    """``[Lq, Lk]``: query i and key j share a bucket in at least one round."""
    hq, hk = buckets_by_definition(q, rotations), buckets_by_definition(k, rotations)
    return (hq[:, :, None] == hk[:, None, :]).any(axis=0)


@pytest.mark.points(2)
@given(**sizes(n=(1, 30), d=(1, 6), half=(1, 8), rounds=(1, 3)), seed=SEEDS)
def test_lsh_buckets_are_the_argmax_over_the_rotated_vector_and_its_negation(
    n, d, half, rounds, seed
):
    x = np.random.default_rng(seed).standard_normal((n, d))
    rotations = provided.random_rotations(d, 2 * half, rounds, seed)
    got = np.asarray(impl.lsh_buckets(x, rotations))
    want = buckets_by_definition(x, rotations)
    assert got.shape == want.shape, f"buckets have shape {got.shape}, expected {want.shape}"
    assert np.array_equal(got, want), (
        f"buckets differ from argmax([x R, -x R]) in {int((got != want).sum())} places "
        f"(n_buckets={2 * half}, rounds={rounds}); the first half of the ids are x R, the "
        "second -x R"
    )
    assert np.array_equal(np.asarray(impl.lsh_buckets(3.5 * x, rotations)), want), (
        "scaling x by a positive number must not change its bucket (angular LSH)"
    )


@pytest.mark.points(3)
@given(**sizes(lq=(1, 6), lk=(1, 40), d=(2, 6), half=(1, 6), rounds=(1, 3)), seed=SEEDS)
def test_lsh_attention_equals_attention_restricted_to_shared_buckets(
    lq, lk, d, half, rounds, seed
):
    q, k, v = random_qkv(seed, lq, lk, d, 3)
    rotations = provided.random_rotations(d, 2 * half, rounds, seed + 1)
    mask = same_bucket_mask(q, k, rotations)
    want = reference_attention(q, k, v, mask=mask)
    last = same_bucket_mask(q, k, rotations[-1:])
    wrong = {LSH_LAST_ROUND: reference_attention(q, k, v, mask=last)[0]} if (
        rounds > 1 and last.any(axis=1).all() and not np.array_equal(last, mask)) else None
    v[~mask.any(axis=0)] = np.nan  # hashing reads every key; no value outside a bucket is read
    with np.errstate(all="ignore"):
        got = impl.lsh_attention(q, k, v, rotations)
    assert_out_and_lse(
        got, want, f"Lq={lq} Lk={lk} n_buckets={2 * half} rounds={rounds}", wrong_out=wrong,
        hint="query i attends key j iff they share a bucket in at least one round (once)",
        nan_hint="NaN: the value of a key in none of this query's buckets was read "
        "(poisoned). " + SPARSE_NAN,
    )


@pytest.mark.points(2)
def test_lsh_hashes_queries_and_keys_with_the_same_rotations():
    # identical query and key vectors: with one set of rotations each query finds its own key
    q, _, v = random_qkv(21, 24, 24, 4, 3)
    rotations = provided.random_rotations(4, 16, 1, seed=3)
    want = reference_attention(q, q, v, mask=same_bucket_mask(q, q, rotations))
    out, lse = impl.lsh_attention(q, q.copy(), v, rotations)
    own = (q * q).sum(axis=1) / 2.0  # the scaled score of each query with its own key
    lost = np.flatnonzero(~(to_float64(lse) >= own - 1e-12))
    assert not lost.size, (
        f"query {lost[0]} did not attend the key identical to it: queries and keys must be "
        "hashed with the SAME rotations (a different rotation for the keys scatters them)"
    )
    assert_out_and_lse((out, lse), want, "every key equals its query")


def reformer_mask(qk, rotations, chunk_size, previous=True, self_mask=True, *,
                  same_bucket=True, wrap=False, only_round=None):
    """Shared-QK sort-and-chunk by the definition: same bucket, own or previous chunk (no
    wrap from chunk 0 to the last), the union over rounds; with ``self_mask`` (the paper's
    rule) a query's own key is dropped unless it is the query's only key. The keywords
    build the misconceptions: any bucket, chunk 0 wrapping to the last, one round alone."""
    n = len(qk)
    mask = np.zeros((n, n), dtype=bool)
    for r, h in enumerate(buckets_by_definition(qk, rotations)):
        if only_round is not None and r != only_round:
            continue
        order = sorted(range(n), key=lambda p: (h[p], p))
        chunk = np.empty(n, dtype=np.int64)
        chunk[order] = np.arange(n) // chunk_size
        near = chunk[None, :] == chunk[:, None]
        if previous:
            near |= chunk[None, :] == chunk[:, None] - 1
        if wrap:
            near |= (chunk[:, None] == 0) & (chunk[None, :] == chunk.max())
        mask |= near & (h[None, :] == h[:, None]) if same_bucket else near
    return without_self(mask) if self_mask else mask


def rounds_averaged(qk, keys, v, rotations, chunk_size):
    """Each hash round attended alone (the self-mask of the union), the outputs averaged."""
    union = reformer_mask(qk, rotations, chunk_size, self_mask=False)
    alone = ~(union & ~np.eye(len(qk), dtype=bool)).any(axis=1, keepdims=True)
    outs = []
    for r in range(len(buckets_by_definition(qk, rotations))):
        mine = reformer_mask(qk, rotations, chunk_size, self_mask=False, only_round=r)
        outs.append(reference_attention(qk, keys, v, mask=mine & (alone | ~np.eye(len(qk),
                                                                             dtype=bool)))[0])
    return np.mean(outs, axis=0)


def without_self(mask):
    """Reformer's self-mask: drop the diagonal of every row that has another key."""
    others = mask & ~np.eye(len(mask), dtype=bool)
    return np.where(others.any(axis=1, keepdims=True), others, mask)


def own_chunk_mask(qk, rotations, chunk_size):
    return reformer_mask(qk, rotations, chunk_size, previous=False)


@pytest.mark.points(3)
@given(**sizes(n=(1, 40), d=(2, 6), half=(1, 4), rounds=(1, 2), chunk_size=(1, 12)), seed=SEEDS)
def test_reformer_attention_sorts_by_bucket_and_attends_its_own_and_previous_chunk(
    n, d, half, rounds, chunk_size, seed
):
    qk, _, v = random_qkv(seed, n, n, d, 3)
    rotations = provided.random_rotations(d, 2 * half, rounds, seed + 1)
    mask = reformer_mask(qk, rotations, chunk_size)
    keys = qk / np.linalg.norm(qk, axis=1, keepdims=True)
    want = reference_attention(qk, keys, v, mask=mask)
    wrong = {
        REFORMER_KEYS: reference_attention(qk, qk, v, mask=mask)[0],
        "each query also attends the chunk before its own in the sorted order":
            reference_attention(qk, keys, v, mask=own_chunk_mask(qk, rotations, chunk_size))[0],
        REFORMER_SELF: reference_attention(
            qk, keys, v, mask=reformer_mask(qk, rotations, chunk_size, self_mask=False))[0],
        "a chunk attended keys of other buckets: only keys that share the query's bucket count":
            reference_attention(qk, keys, v, mask=reformer_mask(qk, rotations, chunk_size,
                                                                same_bucket=False))[0],
        "chunk 0 wrapped around to the last chunk: the first chunk has no chunk before it":
            reference_attention(qk, keys, v, mask=reformer_mask(qk, rotations, chunk_size,
                                                                wrap=True))[0],
    }
    if rounds > 1:
        wrong["the hash rounds were averaged: a query attends the union of its rounds' keys, "
              "merged by one softmax"] = rounds_averaged(qk, keys, v, rotations, chunk_size)
    wrong_lse = {REFORMER_KEYS: reference_attention(qk, qk, v, mask=mask)[1]}
    assert_out_and_lse(
        impl.reformer_attention(qk, v, rotations, chunk_size), want,
        f"N={n} n_buckets={2 * half} rounds={rounds} chunk_size={chunk_size}", wrong_out=wrong,
        wrong_lse=wrong_lse,
        hint="sort positions by (bucket, position), cut into chunks of chunk_size",
    )


REFORMER_SELF = (
    "a query attended its own key: with shared QK that key is almost always its best match, "
    "so Reformer drops it unless it is the query's only key"
)


@pytest.mark.points(2)
def test_reformer_never_attends_its_own_key_unless_it_is_the_only_one():
    """The paper's self-mask (Kitaev et al. 2020, section 2): v = the identity, so ``out``
    is the weight matrix and its diagonal is the weight of each query's own key."""
    n = 24
    qk, _, _ = random_qkv(5, n, n, 4, 1)
    rotations = provided.random_rotations(4, 8, 1, seed=2)
    alone = reformer_mask(qk, rotations, 4, self_mask=False).sum(axis=1) == 1  # itself only
    assert alone.any() and not alone.all(), "the data must have lone and accompanied queries"
    out, _ = impl.reformer_attention(qk, np.eye(n), rotations, 4)
    own = np.diag(to_float64(out))
    bad = np.flatnonzero(own[~alone] != 0.0)
    assert not bad.size, (
        f"query {np.flatnonzero(~alone)[bad[0]]} gave weight {own[~alone][bad[0]]:.3g} to its "
        f"own key although it has other keys: {REFORMER_SELF}"
    )
    assert_close(own[alone], np.ones(int(alone.sum())),
                 what="the weight of a query's own key when it is its only key (must be 1)")


def attend_with_bias(q, k, v, mask, bias, scale):
    """``(out, lse)`` of softmax(q kᵀ·scale + bias) v over ``mask``; no key: 0 and -inf."""
    s = np.where(mask, q @ k.T * scale + bias, -np.inf)
    m = s.max(axis=1, initial=-np.inf)
    m0 = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m0[:, None])
    l = p.sum(axis=1)
    safe = np.where(l > 0, l, 1.0)
    with np.errstate(divide="ignore"):
        return p @ v / safe[:, None], np.where(l > 0, m0 + np.log(safe), -np.inf)


def lse_merge(parts):
    """Lab 04's merge of ``(out, lse)`` parts over disjoint key sets: exact attention's own."""
    lses = np.array([lse for _, lse in parts])  # [R, N]
    lse = np.logaddexp.reduce(lses, axis=0)
    w = np.exp(lses - lse)  # every row has a key, so lse is finite
    return sum(w[r][:, None] * out for r, (out, _) in enumerate(parts)), lse


@pytest.mark.points(2)
@given(**sizes(n=(2, 40), d=(2, 6), half=(1, 4), chunk_size=(1, 12)), seed=SEEDS)
def test_reformer_rounds_merge_by_their_log_sum_exps_as_in_the_paper(
    n, d, half, chunk_size, seed
):
    """The paper's multi-round LSH attention: each round attends its own keys with the score
    of a key found in ``N_ij`` rounds lowered by ``log N_ij`` (so that it counts once), and
    the rounds are merged by their log-sum-exps. That is attention over the union."""
    qk, _, v = random_qkv(seed, n, n, d, 3)
    rotations = provided.random_rotations(d, 2 * half, 3, seed + 1)
    keys = qk / np.linalg.norm(qk, axis=1, keepdims=True)
    rounds = [reformer_mask(qk, rotations[r : r + 1], chunk_size, self_mask=False)
              for r in range(3)]  # fmt: skip
    attend = without_self(np.logical_or.reduce(rounds))
    per_round = [m & attend for m in rounds]
    count = np.maximum(np.sum(per_round, axis=0), 1)
    scale = 1 / math.sqrt(d)
    want = lse_merge([attend_with_bias(qk, keys, v, m, -np.log(count), scale)
                      for m in per_round])  # fmt: skip
    plain = [attend_with_bias(qk, keys, v, m, 0.0, scale) for m in per_round]
    wrong = {
        "the rounds were averaged: merge them by their log-sum-exps (lab 04's rule)":
            np.mean([out for out, _ in plain], axis=0),
        "a key found in several rounds was counted once per round: attend the union, each "
        "key once": lse_merge(plain)[0],
    }
    assert_out_and_lse(
        impl.reformer_attention(qk, v, rotations, chunk_size), want,
        f"N={n} n_buckets={2 * half} rounds=3 chunk_size={chunk_size}", wrong_out=wrong,
    )


@pytest.mark.points(2)
@given(**sizes(lq=(1, 8), lk=(1, 30), half=(1, 6), rounds=(1, 3)), seed=SEEDS)
def test_lsh_mass_captured_is_the_softmax_mass_inside_the_buckets(lq, lk, half, rounds, seed):
    q, k, _ = random_qkv(seed, lq, lk, 4, 1, spread=1.5)
    rotations = provided.random_rotations(4, 2 * half, rounds, seed + 2)
    want = (softmax_matrix(q, k) * same_bucket_mask(q, k, rotations)).sum(axis=1)
    try:
        assert_close(
            impl.lsh_mass_captured(q, k, rotations),
            want,
            what=f"mass captured (Lq={lq} Lk={lk} n_buckets={2 * half} rounds={rounds})",
            atol=1e-12,
            rtol=1e-9,
            hint="the sum of the exact softmax row over the keys lsh_attention attends",
            wrong_answers={MASS_INVERTED: inverse(want)},
        )
    except AssertionError as err:
        diagnosis = lse_diagnosis(q, k)
        if diagnosis:
            raise AssertionError(f"{diagnosis}. The symptom: {err}") from None
        raise


def inverse(x):
    with np.errstate(divide="ignore"):
        return 1.0 / x


def lse_diagnosis(q, k):
    """A sentence when a log-sum-exp the mass may be built from (``chunked_attention``'s,
    ``lsh_attention``'s) is itself wrong; "" when both are right or not written."""
    zeros = np.zeros((len(k), 1))
    want = reference_attention(q, k, zeros)[1]
    for name, call in (("chunked_attention", lambda: impl.chunked_attention(q, k, zeros)),):
        try:
            with np.errstate(all="ignore"):
                lse = to_float64(call()[1])
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001 (its own tests say why)
            return f"{name} raised: make its tests pass first"
        if lse.shape != want.shape or not np.allclose(lse, want, atol=1e-9, rtol=1e-9):
            wrong = chunked_wrongs(q, k, zeros, 16, 16)[1][LSE_WITHOUT_MAX]
            why = f" ({LSE_WITHOUT_MAX})" if np.allclose(lse, wrong, atol=1e-9) else ""
            return (f"{name}, whose lse the mass can be built from, returns a wrong lse{why}: "
                    "fix it first (test_chunked_attention_is_exact_for_any_chunking)")
    return ""


@pytest.mark.points(2)
def test_more_rounds_capture_more_mass_and_more_buckets_capture_less():
    """Rounds: nested rotations (the first r rounds of one draw) can only add keys, so the
    captured mass never drops; this is exact. Buckets: with 256 queries against 256 keys
    the mean captured mass at 2 buckets exceeds the one at 32 buckets by 0.46 +- 0.027
    (mean +- standard deviation over 20 rotation seeds of this data), so the bound 0.2 is
    about 10 standard deviations away: under a normal approximation a correct
    implementation fails under a fresh seed with probability below 1e-15."""
    q, k, _ = random_qkv(31, 256, 256, 8, 1, spread=1.5)
    rotations = provided.random_rotations(8, 8, 4, seed=7)
    masses = [np.asarray(impl.lsh_mass_captured(q, k, rotations[:r])) for r in (1, 2, 4)]
    for fewer, more, r in zip(masses, masses[1:], (2, 4)):
        assert (more >= fewer - 1e-12).all(), (
            f"adding rounds lost mass ({r} rounds): a key found in ANY round is attended"
        )
    few = np.asarray(impl.lsh_mass_captured(q, k, provided.random_rotations(8, 2, 1, 7))).mean()
    many = np.asarray(impl.lsh_mass_captured(q, k, provided.random_rotations(8, 32, 1, 7))).mean()
    assert few > many + 0.2, f"2 buckets kept {few:.3f} of the mass, 32 buckets {many:.3f}"


# ---- 5. Linformer ------------------------------------------------------------------------


@pytest.mark.points(2)
@given(**sizes(lq=(1, 12), lk=(1, 24), rank=(1, 10)), seed=SEEDS)
def test_linformer_is_exact_attention_over_the_projected_keys_and_values(lq, lk, rank, seed):
    q, k, v = random_qkv(seed, lq, lk, 4, 3)
    e = provided.linformer_projection(rank, lk, seed)
    f = provided.linformer_projection(rank, lk, seed + 1)
    want, _ = reference_attention(q, e @ k, f @ v)
    assert_close(
        impl.linformer_attention(q, k, v, e, f),
        want,
        what=f"linformer out (Lq={lq} Lk={lk} rank={rank})",
        wrong_answers={SWAPPED_EF: reference_attention(q, f @ k, e @ v)[0]},
        hint="softmax(q (e k)^T / sqrt(d)) (f v): project along the sequence, not along d",
    )


@pytest.mark.points(1)
def test_linformer_with_a_permutation_projection_is_exact():
    q, k, v = random_qkv(4, 10, 10, 4, 3)
    perm = np.eye(10)[np.random.default_rng(0).permutation(10)]
    assert_close(
        impl.linformer_attention(q, k, v, perm, perm),
        reference_attention(q, k, v)[0],
        what="linformer with E = F = a permutation (rank = N: nothing lost)",
    )


@pytest.mark.points(2)
@given(**sizes(lq=(1, 12), lk=(1, 12)), seed=SEEDS)
def test_attention_singular_values_are_those_of_the_softmax_matrix(lq, lk, seed):
    q, k, _ = random_qkv(seed, lq, lk, 4, 1, spread=2.0)
    want = np.linalg.svd(softmax_matrix(q, k), compute_uv=False)
    assert_close(
        impl.attention_singular_values(q, k),
        want,
        what=f"singular values (Lq={lq} Lk={lk})",
        atol=1e-10,
        rtol=1e-10,
        hint="the SVD of P = softmax(q k^T / sqrt(d)) (the probabilities, not the scores), "
        "largest first",
    )


# ---- 6. Performer (FAVOR+) -----------------------------------------------------------------


def favor_features(x, omega):
    x = to_float64(x)
    return np.exp(x @ omega - 0.5 * (x * x).sum(axis=1, keepdims=True)) / math.sqrt(
        omega.shape[1]
    )


@pytest.mark.points(2)
@given(**sizes(n=(1, 10), d=(1, 6), m=(1, 20), seed=(0, 99)))
def test_positive_random_features_follow_the_favor_plus_formula(n, d, m, seed):
    x = np.random.default_rng(seed).standard_normal((n, d))
    omega = provided.performer_omega(d, m, seed)
    got = impl.positive_random_features(x, omega)
    want = favor_features(x, omega)
    assert np.shape(got) != (n, 2 * m), TRIG_FEATURES
    wrong = {
        NO_HALF_NORM: np.exp(x @ omega) / math.sqrt(m),
        NO_ROOT_M: want * math.sqrt(m),
    }
    if m > 1:
        assert_close(got, want, what=f"phi(x) (N={n}, d={d}, m={m})", wrong_answers=wrong)
    else:  # sqrt(1) = 1: the missing 1/sqrt(m) cannot show
        assert_close(got, want, what=f"phi(x) (N={n}, d={d}, m=1)",
                     wrong_answers={NO_HALF_NORM: wrong[NO_HALF_NORM]})


@pytest.mark.points(2)
@given(**sizes(n=(1, 10), d=(1, 6), m=(1, 40), seed=(0, 99)))
def test_performer_features_are_never_negative(n, d, m, seed):
    x = np.random.default_rng(seed).standard_normal((n, d)) * 2.0
    phi = np.asarray(impl.positive_random_features(x, provided.performer_omega(d, m, seed)))
    assert phi.size and (phi > 0).all(), (
        "a random feature is <= 0: trigonometric features (sin, cos) can go negative, and "
        "then estimated attention weights can be negative or the denominator near 0. "
        "FAVOR+ uses exp(w . x - |x|^2 / 2) / sqrt(m), positive by construction"
    )


@pytest.mark.points(2)
def test_random_features_estimate_exp_q_dot_k_without_bias():
    """phi(q) . phi(k) is the mean of m i.i.d. terms with mean exp(q.k) and variance
    exp(2 q.k) (exp(|q + k|^2) - 1); with m = 40000 the estimate must lie within 6 standard
    errors of exp(q.k) for each of 6 pairs. For a correct implementation under a fresh seed
    each check fails with probability about 2e-9 (normal approximation; the terms are
    lognormal with |q + k| <= 1.3 here, so the CLT is accurate at this m): under 2e-8 in all."""
    rng = np.random.default_rng(2024)
    m = 40_000
    omega = provided.performer_omega(3, m, seed=99)
    q = rng.standard_normal((6, 3)) * 0.35
    k = rng.standard_normal((6, 3)) * 0.35
    est = (np.asarray(impl.positive_random_features(q, omega))
           * np.asarray(impl.positive_random_features(k, omega))).sum(axis=1)  # fmt: skip
    exact = np.exp((q * k).sum(axis=1))
    sigma = np.sqrt(exact**2 * (np.exp(((q + k) ** 2).sum(axis=1)) - 1.0) / m)
    z = (est - exact) / sigma
    assert np.abs(z).max() < 6, (
        f"phi(q) . phi(k) is biased: z-scores {np.round(z, 1).tolist()} against exp(q . k). "
        + NO_HALF_NORM
    )


PERFORMER_SCALE_ON_Q = (
    "the whole scale applied to q (phi(q · scale), phi(k)): split it, sqrt(scale) on each of "
    "q and k, so that phi(q') · phi(k') estimates exp(scale · q · k) without bias"
)
TRIG_FEATURES = (
    "phi(x) has 2m columns: trigonometric features (cos, sin)? FAVOR+'s are positive, "
    "exp(w · x - |x|^2 / 2) / sqrt(m): m columns, one per random direction"
)


def performer_q_scaled(q, k, v, omega):
    a = favor_features(q / math.sqrt(q.shape[1]), omega) @ favor_features(k, omega).T
    return (a @ v) / a.sum(axis=1, keepdims=True)


def performer_by_definition(q, k, v, omega, scale=None):
    root = math.sqrt(1.0 / math.sqrt(q.shape[1]) if scale is None else scale)
    a = favor_features(q * root, omega) @ favor_features(k * root, omega).T  # [Lq, Lk]
    return (a @ v) / a.sum(axis=1, keepdims=True)


@pytest.mark.points(3)
@given(**sizes(lq=(1, 12), lk=(1, 16), d=(1, 6), m=(1, 24)), seed=SEEDS)
def test_performer_attention_is_kernel_attention_with_phi(lq, lk, d, m, seed):
    q, k, v = random_qkv(seed, lq, lk, d, 3)
    omega = provided.performer_omega(d, m, seed)
    want = performer_by_definition(q, k, v, omega)
    wrong = {"q and k must each be scaled by sqrt(scale) = d^(-1/4) before phi":
             performer_by_definition(q, k, v, omega, scale=1.0),
             PERFORMER_SCALE_ON_Q: performer_q_scaled(q, k, v, omega)}
    assert_close(
        impl.performer_attention(q, k, v, omega),
        want,
        what=f"performer out (Lq={lq} Lk={lk} d={d} m={m})",
        atol=1e-10,
        rtol=1e-10,
        wrong_answers=wrong if d > 1 else None,
        hint="out = phi(Q)(phi(K)^T V) / (phi(Q)(phi(K)^T 1)) with Q, K scaled by sqrt(scale)",
    )


@pytest.mark.points(1)
def test_the_worked_example_n4_d2():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, -0.5], [1.0, 1.0]])
    v = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 3.0]])
    omega = provided.performer_omega(2, 3, seed=0)
    assert_close(
        impl.performer_attention(q, k, v, omega, scale=1.0),
        performer_by_definition(q, k, v, omega, scale=1.0),
        what="the README's N=4, d=2, m=3 example",
        atol=1e-10,
        rtol=1e-10,
    )


@pytest.mark.points(2)
def test_performer_attention_never_builds_an_n_by_n_array():
    """Measured by common.testing.peak_memory: tracemalloc in a plain run; under the grader
    the sandboxed worker's resident high-water mark, read from outside it."""
    n = 2048  # the float64 [N, N] weights would be 32 MiB; phi(Q), phi(K) are 512 KiB each
    q, k, v = random_qkv(5, n, n, 8, 8)
    omega = provided.performer_omega(8, 32, seed=1)
    out = assert_peak_below(
        impl.performer_attention, q, k, v, omega, limit=4 * MiB,
        message="compute phi(K)^T V ([m, dv]) first, then phi(Q) times it; phi(Q) phi(K)^T "
        "is the N x N matrix Performer exists to avoid",
    )
    rows = [0, n - 1]
    assert_close(to_float64(out)[rows], performer_by_definition(q[rows], k, v, omega),
                 what="performer out rows 0 and N-1 (memory is fine)", atol=1e-10, rtol=1e-10)


# ---- 7. linear attention as a recurrence --------------------------------------------------


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def linear_by_definition(q, k, v, causal, strict=False):
    w = elu1(q) @ elu1(k).T  # [Lq, Lk]
    if causal:
        w = np.tril(w, -1 if strict else 0)
    with np.errstate(all="ignore"):
        return (w @ v) / w.sum(axis=1, keepdims=True)


@pytest.mark.points(2)
@given(**sizes(n=(1, 20), lk=(1, 20), d=(1, 6)), causal=st.booleans(), seed=SEEDS)
def test_linear_attention_parallel_is_the_elu_plus_one_kernel_average(n, lk, d, causal, seed):
    lk = n if causal else lk
    q, k, v = random_qkv(seed, n, lk, d, 3)
    assert_close(
        impl.linear_attention_parallel(q, k, v, causal=causal),
        linear_by_definition(q, k, v, causal),
        what=f"linear attention (N={n} Lk={lk} d={d} causal={causal})",
        atol=1e-10,
        rtol=1e-10,
        wrong_answers=linear_causal_wrongs(q, k, v) if causal else None,
        nan_hint="NaN in the output (0 / 0 for query 0?): causal includes the diagonal: key i "
        "is visible to query i, so query 0 sees key 0",
    )


def linear_causal_wrongs(q, k, v):
    """{misconception: what causal linear attention gives with that mistake}."""
    w = elu1(q) @ elu1(k).T
    with np.errstate(all="ignore"):
        numerator_only = (np.tril(w) @ v) / w.sum(axis=1, keepdims=True)
    return {
        "causal includes the diagonal: key i is visible to query i":
            linear_by_definition(q, k, v, True, strict=True),
        NO_PREFIX_SUM: linear_by_definition(q, k, v, False),
        DENOMINATOR_NOT_MASKED: numerator_only,
    }  # fmt: skip


@pytest.mark.points(3)
@given(**sizes(n=(1, 24), d=(1, 6), dv=(1, 4)), seed=SEEDS)
def test_the_recurrence_equals_the_causal_parallel_form(n, d, dv, seed):
    q, k, v = random_qkv(seed, n, n, d, dv)
    with np.errstate(all="ignore"):
        result = impl.linear_attention_recurrent(q, k, v)
    assert isinstance(result, tuple) and len(result) == 3, "return (out, S, z)"
    out, s, z = result
    assert_close(
        out,
        linear_by_definition(q, k, v, causal=True),
        what=f"recurrent out (N={n}, d={d})",
        atol=1e-10,
        rtol=1e-10,
        wrong_answers={READ_BEFORE_WRITE: linear_by_definition(q, k, v, True, strict=True),
                       NO_PREFIX_SUM: linear_by_definition(q, k, v, False),
                       DENOMINATOR_NOT_MASKED: linear_causal_wrongs(q, k, v)[
                           DENOMINATOR_NOT_MASKED]},
        nan_hint=f"NaN in the output (0 / 0 for token 0?): {READ_BEFORE_WRITE}",
    )
    assert_close(s, elu1(k).T @ v, what="final state S = phi(K)^T V", atol=1e-10, rtol=1e-10)
    assert_close(z, elu1(k).sum(axis=0), what="final z = sum_j phi(k_j)", atol=1e-10, rtol=1e-10)


@pytest.mark.points(1)
def test_the_recurrence_keeps_a_fixed_size_state():
    """Measured by common.testing.peak_memory: tracemalloc in a plain run; under the grader
    the sandboxed worker's resident high-water mark, read from outside it."""
    n = 2048  # an [N, N] weight matrix would be 32 MiB; the state is d x dv
    q, k, v = random_qkv(8, n, n, 4, 4)
    out, _, _ = assert_peak_below(
        impl.linear_attention_recurrent, q, k, v, limit=2 * MiB,
        message="the recurrence carries S [m, dv] and z [m] from token to token; it never "
        "builds the N x N weights",
    )
    assert_close(to_float64(out)[-1:], linear_by_definition(q, k, v, True)[-1:],
                 what="recurrent out, last row", atol=1e-10, rtol=1e-10)


# ---- 8. exact, chunked, O(N) memory ------------------------------------------------------


@pytest.mark.points(3)
@given(
    **sizes(lq=(0, 30), lk=(0, 30), d=(1, 6), query_chunk=(1, 16), key_chunk=(1, 16)),
    seed=SEEDS,
)
def test_chunked_attention_is_exact_for_any_chunking(lq, lk, d, query_chunk, key_chunk, seed):
    q, k, v = random_qkv(seed, lq, lk, d, 3, spread=2.0)
    wrong_out, wrong_lse = chunked_wrongs(q, k, v, query_chunk, key_chunk)
    assert_out_and_lse(
        impl.chunked_attention(q, k, v, query_chunk=query_chunk, key_chunk=key_chunk),
        reference_attention(q, k, v),
        f"Lq={lq} Lk={lk} query_chunk={query_chunk} key_chunk={key_chunk}",
        wrong_out=wrong_out, wrong_lse=wrong_lse,
        hint="when a key chunk raises the running max, rescale l and acc by "
        "exp(m_old - m_new); lse = m + log(l)",
    )


@pytest.mark.points(2)
def test_chunked_attention_memory_is_linear_in_n():
    """Measured by common.testing.peak_memory: tracemalloc in a plain run; under the grader
    the sandboxed worker's resident high-water mark, read from outside it."""
    peaks = {}
    for n in (1024, 4096):
        q, k, v = random_qkv(13, n, n, 4, 4)
        (out, _), peaks[n] = peak_memory(impl.chunked_attention, q, k, v, 64, 64)
        assert_close(to_float64(out)[[0, n - 1]], reference_attention(q[[0, n - 1]], k, v)[0],
                     what=f"chunked out rows 0 and {n - 1}")
    full = 4096 * 4096 * 8
    assert peaks[4096] < full / 32, (
        f"peak memory {peaks[4096] / MiB:.1f} MiB at N=4096 (the N x N float64 scores are "
        f"{full / MiB:.0f} MiB): only a [query_chunk, key_chunk] block of scores may be alive"
    )
    assert peaks[4096] < 8 * peaks[1024] + MiB, (
        f"peak memory grew from {peaks[1024] / MiB:.2f} to {peaks[4096] / MiB:.2f} MiB when N "
        "grew 4x: that is quadratic, not linear"
    )


# ---- 9. the retrieval task: what each approximation loses ---------------------------------


@pytest.mark.points(1)
def test_on_the_retrieval_task_exact_finds_the_far_key_and_a_local_window_cannot():
    q, k, v, target = provided.retrieval_task(512, seed=3)
    exact, _ = impl.chunked_attention(q, k, v)
    assert_close(to_float64(exact)[-1], v[target], what="exact answer of the last query",
                 atol=1e-6, rtol=0, hint="chunked attention is exact: it finds the planted key")
    window = impl.window_global_mask(512, 64, [], causal=True)
    local, _ = impl.sparse_attention(q, k, v, window)
    err = np.linalg.norm(to_float64(local)[-1] - v[target]) / np.linalg.norm(v[target])
    assert err > 0.5, f"a 64-token window cannot see a key 448 tokens back (error {err:.2f})"


# ---- every scale= keyword, and no keys at all ---------------------------------------------

SCALED = {  # function -> (what it returns for scale s, from the definitions above)
    "sparse_attention": (
        lambda q, k, v, s: impl.sparse_attention(q, k, v, MASK_7x9, scale=s),
        lambda q, k, v, s: reference_attention(q, k, v, scale=s, mask=MASK_7x9)),
    "lsh_attention": (
        lambda q, k, v, s: impl.lsh_attention(q, k, v, ROT_4, scale=s),
        lambda q, k, v, s: reference_attention(q, k, v, scale=s,
                                               mask=same_bucket_mask(q, k, ROT_4))),
    "reformer_attention": (
        lambda q, k, v, s: impl.reformer_attention(q, v[: len(q)], ROT_4, 3, scale=s),
        lambda q, k, v, s: reference_attention(
            q, q / np.linalg.norm(q, axis=1, keepdims=True), v[: len(q)], scale=s,
            mask=reformer_mask(q, ROT_4, 3))),
    "chunked_attention": (
        lambda q, k, v, s: impl.chunked_attention(q, k, v, 3, 4, scale=s),
        lambda q, k, v, s: reference_attention(q, k, v, scale=s)),
    "lsh_mass_captured": (
        lambda q, k, v, s: impl.lsh_mass_captured(q, k, ROT_4, scale=s),
        lambda q, k, v, s: (softmax_matrix(q, k, scale=s) * same_bucket_mask(q, k, ROT_4)).sum(1)),
    "linformer_attention": (
        lambda q, k, v, s: impl.linformer_attention(q, k, v, E_3x9, F_3x9, scale=s),
        lambda q, k, v, s: reference_attention(q, E_3x9 @ k, F_3x9 @ v, scale=s)[0]),
    "attention_singular_values": (
        lambda q, k, v, s: impl.attention_singular_values(q, k, scale=s),
        lambda q, k, v, s: np.linalg.svd(softmax_matrix(q, k, scale=s), compute_uv=False)),
}  # fmt: skip
MASK_7x9 = np.random.default_rng(70).random((7, 9)) < 0.6
ROT_4 = provided.random_rotations(4, 4, 2, seed=11)
E_3x9, F_3x9 = provided.linformer_projection(3, 9, 1), provided.linformer_projection(3, 9, 2)


@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [0.37, 0.0], ids=["scale=0.37", "scale=0"])
@pytest.mark.parametrize("name", list(SCALED))
def test_every_scale_keyword_is_used(name, scale):
    """``scale=`` replaces ``1/sqrt(d)``; ``scale=0`` is a scale (every score 0: uniform
    weights), not "use the default"."""
    q, k, v = random_qkv(60, 7, 9, 4, 3, spread=1.5)
    call, definition = SCALED[name]
    got, want = call(q, k, v, scale), definition(q, k, v, scale)
    default = definition(q, k, v, None)
    if isinstance(want, tuple):
        assert_out_and_lse(got, want, f"{name}(..., scale={scale})",
                           wrong_out=scale_wrong(scale, default[0]))  # fmt: skip
    else:
        assert_close(got, want, what=f"{name}(..., scale={scale})",
                     wrong_answers=scale_wrong(scale, default), atol=1e-10, rtol=1e-10)  # fmt: skip


NO_KEYS = {  # function -> its call on Lk = 0 keys (every row attends nothing: 0 and -inf)
    "sparse_attention": lambda q, k, v: impl.sparse_attention(q, k, v, np.zeros((3, 0), bool)),
    "lsh_attention": lambda q, k, v: impl.lsh_attention(q, k, v, ROT_4),
    "chunked_attention": lambda q, k, v: impl.chunked_attention(q, k, v, 2, 2),
}


@pytest.mark.points(1)
def test_zero_tokens_give_empty_masks_and_no_bytes():
    """``n = 0`` is allowed (``non_negative_int``): every mask is ``[0, 0]``, no bytes."""
    masks = {
        "strided_mask(0, 2)": lambda: impl.strided_mask(0, 2),
        "fixed_mask(0, 2)": lambda: impl.fixed_mask(0, 2),
        "window_global_mask(0, 1)": lambda: impl.window_global_mask(0, 1),
        "bigbird_mask(0, 1, [], 2)": lambda: impl.bigbird_mask(0, 1, [], 2),
    }
    for what, call in masks.items():
        with raised_as(f"{what}: n = 0 tokens is allowed, the mask is [0, 0]"):
            got = call()
        assert_mask(got, np.zeros((0, 0), dtype=bool), what)
    assert impl.score_matrix_bytes(0) == 0, "score_matrix_bytes(0) must be 0"


@pytest.mark.points(1)
@pytest.mark.parametrize("name", list(NO_KEYS))
def test_no_keys_at_all_gives_zeros_and_minus_inf(name):
    q, k, v = random_qkv(61, 3, 0, 4, 2)
    with np.errstate(all="ignore"), raised_as(f"{name} with Lk = 0: no keys is allowed, every "
                                              "row attends nothing (out 0, lse -inf)"):
        got = NO_KEYS[name](q, k, v)
    assert_out_and_lse(got, (np.zeros((3, 2)), np.full(3, -np.inf)), f"{name} with Lk = 0",
                       nan_hint="NaN: with no keys l = 0; the output is 0, not 0/0")


# ---- 10. bad input is a ValueError that names the argument ---------------------------------

_q, _k, _v = random_qkv(8, 3, 5, 4, 2)
_rot = provided.random_rotations(4, 4, 1, 0)
BAD_INPUTS: BadInputs = {
    "score_matrix_bytes-seq_len": ("seq_len", lambda: impl.score_matrix_bytes(-1)),
    "strided_mask-stride": ("stride", lambda: impl.strided_mask(8, 0)),
    "fixed_mask-block": ("block", lambda: impl.fixed_mask(8, 0)),
    "window_global_mask-window": ("window", lambda: impl.window_global_mask(8, 0)),
    "window_global_mask-global_tokens": (
        "global_tokens", lambda: impl.window_global_mask(8, 2, [9])),
    "bigbird_mask-num_random": ("num_random", lambda: impl.bigbird_mask(8, 2, [], -1)),
    "sparse_attention-mask": (
        "mask", lambda: impl.sparse_attention(_q, _k, _v, np.ones((3, 4), bool))),
    "sparse_attention-v": (
        "v", lambda: impl.sparse_attention(_q, _k, _v[:4], np.ones((3, 5), bool))),
    "receptive_field-window": ("window", lambda: impl.receptive_field(2, 0)),
    "lsh_attention-rotations": ("rotations", lambda: impl.lsh_attention(_q, _k, _v, _rot[:, :3])),
    "reformer_attention-chunk_size": (
        "chunk_size", lambda: impl.reformer_attention(_q, _v[:3], _rot, 0)),
    "linformer_attention-e": (
        "e", lambda: impl.linformer_attention(_q, _k, _v, np.ones((2, 4)), np.ones((2, 5)))),
    "positive_random_features-omega": (
        "omega", lambda: impl.positive_random_features(_q, np.ones((3, 8)))),
    "chunked_attention-query_chunk": (
        "query_chunk", lambda: impl.chunked_attention(_q, _k, _v, query_chunk=0)),
    "linear_attention_recurrent-q": ("q", lambda: impl.linear_attention_recurrent(_q, _k, _v)),
}  # fmt: skip
test_bad_input_raises_value_error_naming_the_argument = bad_input_test(BAD_INPUTS, points=0.5)
