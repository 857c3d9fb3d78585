"""Lab 04 spec: the attention monoid, split-KV flash-decoding and ring attention.

Run against the solution:   .venv/bin/python -m pytest labs/lab-04-flash-decoding-partitions -q
Grade your starter.py:      make grade LAB=04

Every expected value comes from ``common.reference`` (float64 dense attention); the wrong
answers that name a misconception are computed from the same reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common.loader import load_impl, load_lab_module
from common.paged import build_paged_kv, random_kv, random_kv_shared_prefix
from common.reference import kv_head_for, prefix_mask, reference_attention
from common.testing import (
    ACC_IN_FP16,
    HEAD_RATIOS,
    LAYOUTS,
    NAN_HINT,
    ODD_HEAD_DIMS,
    P_NOT_CAST,
    PADDED_SCALE,
    BadInputs,
    LabScript,
    assert_close,
    assert_loads_in_bounds,
    assert_no_races,
    assert_value_error_names,
    bad_input_test,
    called_on_copies,
    cancelling,
    head_counts,
    host_syncs,
    kernel_memory,
    raised_as,
    scale_wrong,
    sm90_compile_test,
    strided_view,
    tolerance,
)
from common.triton_env import DEVICE, LOG2E

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))
provided = load_lab_module(__file__, "provided")
ORDERS = ("sequential", "reverse", "tree", "random")

NEVER_NORMALISE = (
    "never normalise a partial: a partition's state keeps acc = sum exp(s - m) v "
    "UNNORMALISED (dividing by l happens once, in finalize, after the last merge)"
)
NO_RESCALE = (
    "the merge forgot to rescale: each side must be multiplied by exp(m_side - m), "
    "m = max(m_a, m_b), before l and acc are added"
)
DROPPED_TAIL = (
    "split-KV is exact for every partition count, but this cut dropped the last keys: "
    "partitions of floor(n / P) keys lose n % P of them; cut at (i * n) // P instead"
)
OWN_MAX = (
    "each side's l and acc are relative to its own max: the merged m is max(m_a, m_b), and "
    "each side is rescaled by exp(m_side - m) before l and acc are added"
)
LSE_WITHOUT_MAX = (
    "the LSE is missing the max: lse = m + log(l); log(l) alone is the log-sum-exp "
    "relative to the running max m"
)
IDENTITY_NAN = (
    "merging the identity produced NaN: with m_a = m_b = -inf, exp(m_a - m) is "
    "exp(-inf - (-inf)) = exp(NaN). An empty side (m = -inf) must get scale 0"
)
OVERFLOW = (
    "NaN or inf from large log-sum-exps: exp(800) overflows float64 and exp(-800) underflows "
    "to 0 (float32: already near +-88), so exp(lse) or exp(m) must never be taken directly. "
    "Subtract the larger of the two first: exp(lse_a - max) and exp(lse_b - max) lie in [0, 1]"
)
EMPTY_IS_IDENTITY = (
    "the empty state is the merge's identity, m = -inf (no score seen yet), l = 0, acc = 0: "
    "with m = 0, merging it into a state whose max is below 0 rescales that state by "
    "exp(m - 0) < 1"
)
PLUS_INF_EMPTY = (
    "an lse of +inf produced NaN: FlashAttention-2 returns lse = +inf for a row with no keys, "
    "and vLLM's merge turns +inf into -inf before merging. Treat +inf, like -inf, as an "
    "empty side (weight 0, its out ignored)"
)
LOCAL_POSITIONS = (
    "the causal ring used LOCAL positions (the index inside each shard) for the mask: once "
    "K/V shards travel, compare GLOBAL positions, q_start + i >= k_start + j"
)
NO_ROTATION = (
    "each device attended only to its own K/V shard: the shards must travel around the "
    "ring so every device sees all P of them"
)
CAUSAL_IGNORED = "the causal mask was ignored: query i must not see keys after position i"
MODULO_HEADS = "query head h read KV head h % num_kv_heads; GQA maps it to h // (H // KVH)"
SWAPPED_GROUP = (
    "query head h read KV head h // num_kv_heads: the divisor is the group size H // KVH"
)


# ---- helpers: problems and expected values from the reference -------------------------


def decode_problem(seed: int, n: int, num_heads: int, num_kv_heads: int, d: int = 8,
                   offset: float = 0.0):
    """One decode query ``q [H, d]`` and ``n`` keys/values ``[n, KVH, d]``.

    ``offset`` adds the same amount to every score (through dim 0 of q and k), so the
    log-sum-exps sit near ``offset`` while the softmax itself stays the same shape.
    """
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((num_heads, d))
    k = rng.standard_normal((n, num_kv_heads, d))
    v = rng.standard_normal((n, num_kv_heads, d))
    shift_scores(q, k, offset, scale=1 / math.sqrt(d))
    return q, k, v


SHIFT_Q = 32.0


def shift_scores(q, k, offset: float, scale: float) -> None:
    """In place: dim 0 of q becomes 32 and dim 0 of k ``offset / (32 * scale)``, which adds
    ``offset`` to every score ``q.k * scale`` (on top of what the other dims give). Key sets
    shifted by different offsets can share one q."""
    if offset:
        q[..., 0] = SHIFT_Q
        k[..., 0] = offset / (SHIFT_Q * scale)


def dense(q, k, v):
    """Dense decode attention from the reference: ``(out [H, dv], lse [H])``."""
    out, lse = reference_attention(q[None], k, v)
    return out[0], lse[0]


def score_max(q, k):
    """``max_j s_j`` per head (``-inf`` with no keys), the m a state must carry."""
    heads = kv_head_for(np.arange(q.shape[0]), q.shape[0], k.shape[1])
    s = np.einsum("hd,nhd->hn", q, k[:, heads, :]) / math.sqrt(q.shape[1])
    return s.max(axis=-1, initial=-np.inf)


def expected_state(q, k, v):
    """The contract's ``(m, l, acc)`` of q against these keys, derived from the reference."""
    out, lse = dense(q, k, v)
    m = score_max(q, k)
    with np.errstate(invalid="ignore"):
        l = np.where(np.isneginf(m), 0.0, np.exp(lse - np.where(np.isneginf(m), 0.0, m)))
    return m, l, out * l[:, None]


def bounds_of(sizes):
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return list(zip(cuts[:-1], cuts[1:]))


def chunk_misconceptions(q, k, v, bounds):
    """What classic merge mistakes would output for these partitions (from the reference)."""
    parts = [expected_state(q, k[lo:hi], v[lo:hi]) for lo, hi in bounds if hi > lo]
    if not parts:
        return {}
    m_all = np.max([m for m, _, _ in parts], axis=0)
    alphas = [np.exp(m - m_all) for m, _, _ in parts]
    outs = [acc / l[:, None] for _, l, acc in parts]
    no_rescale = sum(acc for _, _, acc in parts) / sum(l for _, l, _ in parts)[:, None]
    normalised = sum(a[:, None] * o for a, o in zip(alphas, outs)) / sum(
        a * l for a, (_, l, _) in zip(alphas, parts)
    )[:, None]
    normalised_l1 = sum(a[:, None] * o for a, o in zip(alphas, outs)) / sum(alphas)[:, None]
    return {NO_RESCALE: no_rescale, NEVER_NORMALISE: normalised,
            NEVER_NORMALISE + " (and l = 1)": normalised_l1}


def head_misconceptions(q, k, v, scale=None):
    """Dense answers with the two classic wrong head mappings (where they differ)."""
    H, KVH = q.shape[0], k.shape[1]
    wrong = {}
    for why, heads in ((MODULO_HEADS, np.arange(H) % KVH),
                       (SWAPPED_GROUP, np.minimum(np.arange(H) // KVH, KVH - 1))):
        if not np.array_equal(heads, kv_head_for(np.arange(H), H, KVH)):
            outs = [reference_attention(q[h][None, None], k[:, [j]], v[:, [j]],
                                        scale=scale)[0][0, 0]
                    for h, j in enumerate(heads)]
            wrong[why] = np.stack(outs)
    return wrong


def check_state(actual, m, l, acc, what, nan_hint=None, hint=""):
    """Compare a state's three fields with the expected ones."""
    assert isinstance(actual, tuple) and len(actual) == 3, (
        f"{what} must be an AttentionState(m, l, acc), got {type(actual).__name__}"
    )
    kwargs = {"nan_hint": nan_hint} if nan_hint else {}
    assert_close(actual.m, m, what=f"{what}.m (the max score)", hint=hint, **kwargs)
    assert_close(actual.l, l, what=f"{what}.l (the denominator relative to m)", **kwargs)
    assert_close(actual.acc, acc, what=f"{what}.acc", wrong_answers={
        NEVER_NORMALISE: acc / np.where(l == 0, 1.0, l)[..., None]}, **kwargs)


# ---- hypothesis strategies -------------------------------------------------------------

STATE_HEADS, STATE_DV = 3, 2
OFFSETS = (0.0, 100.0, -100.0, 800.0, -800.0)  # where a state's scores sit


@st.composite
def attention_states(draw):
    """Random valid states over [3] heads, scores near 0, +-100 or +-800; a head is empty
    (m = -inf, l = 0, acc = 0) at times."""
    finite = {"allow_nan": False, "allow_infinity": False}
    offset = draw(st.sampled_from(OFFSETS))
    m, l, acc = [], [], []
    for _ in range(STATE_HEADS):
        if draw(st.integers(0, 3)) == 0:
            m.append(-np.inf), l.append(0.0), acc.append([0.0] * STATE_DV)
        else:
            m.append(offset + draw(st.floats(-30, 30, **finite)))
            l.append(draw(st.floats(1, 40, **finite)))
            acc.append([draw(st.floats(-40, 40, **finite)) for _ in range(STATE_DV)])
    return provided.AttentionState(np.array(m), np.array(l), np.array(acc))


@st.composite
def merge_trees(draw, num_leaves: int):
    """Any binary tree over the leaves 0..num_leaves-1, in any left-to-right order."""
    order = draw(st.permutations(range(num_leaves)))

    def build(items):
        if len(items) == 1:
            return items[0]
        cut = draw(st.integers(1, len(items) - 1))
        return (build(items[:cut]), build(items[cut:]))

    return build(list(order))


def reduce_tree(tree, leaves, merge):
    if isinstance(tree, int):
        return leaves[tree]
    return merge(reduce_tree(tree[0], leaves, merge), reduce_tree(tree[1], leaves, merge))


# ---- the monoid ------------------------------------------------------------------------


@pytest.mark.points(1)
def test_empty_state_is_minus_inf_zero_zero_with_the_right_shapes():
    state = impl.empty_state(3, 5)
    check_state(state, np.full(3, -np.inf), np.zeros(3), np.zeros((3, 5)), "empty_state(3, 5)",
                hint=EMPTY_IS_IDENTITY)
    state = impl.empty_state((2, 3), 4)
    check_state(state, np.full((2, 3), -np.inf), np.zeros((2, 3)), np.zeros((2, 3, 4)),
                "empty_state((2, 3), 4)", hint=EMPTY_IS_IDENTITY)


@pytest.mark.points(1)
def test_partial_state_of_no_keys_is_the_identity():
    q, k, v = decode_problem(0, 0, 4, 2)
    check_state(impl.partial_state(q, k, v), np.full(4, -np.inf), np.zeros(4), np.zeros((4, 8)),
                "partial_state over 0 keys")


@pytest.mark.points(2)
@given(n=st.integers(1, 12), heads=head_counts(max_heads=4), seed=st.integers(0, 2**16))
def test_partial_state_holds_the_max_the_denominator_and_an_unnormalised_accumulator(
    n, heads, seed
):
    q, k, v = decode_problem(seed, n, *heads)
    m, l, acc = expected_state(q, k, v)
    check_state(impl.partial_state(q, k, v), m, l, acc, "partial_state")


@pytest.mark.points(2)
@given(a=attention_states(), b=attention_states(), c=attention_states())
def test_merge_is_associative_even_for_scores_near_plus_or_minus_800(a, b, c):
    left = impl.merge(impl.merge(a, b), c)
    right = impl.merge(a, impl.merge(b, c))
    check_state(left, right.m, right.l, right.acc, "merge(merge(a, b), c) vs merge(a, merge(b, c))",
                nan_hint=f"{IDENTITY_NAN}. Or: {OVERFLOW}")


@pytest.mark.points(1)
@given(a=attention_states(), b=attention_states())
def test_merge_is_commutative(a, b):
    ab, ba = impl.merge(a, b), impl.merge(b, a)
    check_state(ab, ba.m, ba.l, ba.acc, "merge(a, b) vs merge(b, a)",
                nan_hint=f"{IDENTITY_NAN}. Or: {OVERFLOW}")


@pytest.mark.points(2)
@given(a=attention_states())
def test_empty_state_is_the_identity_of_merge(a):
    e = impl.empty_state(STATE_HEADS, STATE_DV)
    hint = ("merge(a, empty) must be a: with an empty state of m = 0 instead of -inf, a state "
            "whose max is -800 is rescaled by exp(-800 - 0) = 0 and vanishes")
    for what, merged in (("merge(a, empty)", impl.merge(a, e)),
                         ("merge(empty, a)", impl.merge(e, a))):
        assert_close(merged.l, a.l, what=f"{what}.l", hint=hint, nan_hint=IDENTITY_NAN)
        check_state(merged, a.m, a.l, a.acc, what, nan_hint=IDENTITY_NAN, hint=OWN_MAX)


@pytest.mark.points(2)
def test_merging_the_identity_never_produces_nan():
    e = impl.empty_state(4, 8)
    check_state(impl.merge(e, e), e.m, e.l, e.acc, "merge(empty, empty)", nan_hint=IDENTITY_NAN)
    q, k, v = decode_problem(1, 5, 4, 2)
    m, l, acc = expected_state(q, k, v)
    check_state(impl.merge(e, impl.partial_state(q, k, v)), m, l, acc, "merge(empty, partial)",
                nan_hint=IDENTITY_NAN)
    out, lse = impl.finalize(e)
    assert_close(out, np.zeros((4, 8)), what="finalize(empty).out", nan_hint=IDENTITY_NAN)
    assert_close(lse, np.full(4, -np.inf), what="finalize(empty).lse", nan_hint=IDENTITY_NAN)


@pytest.mark.points(2)
def test_finalize_divides_once_and_adds_the_max_back_to_the_lse():
    m = np.array([0.5, -np.inf, 3.0, -2.0, 800.0])
    l = np.array([2.0, 0.0, 1.5, 7.0, 4.0])
    acc = np.array([[1.0, -2.0], [0.0, 0.0], [3.0, 0.75], [-7.0, 14.0], [4.0, 8.0]])
    out, lse = impl.finalize(provided.AttentionState(m, l, acc))
    want_out = np.array([[0.5, -1.0], [0.0, 0.0], [2.0, 0.5], [-1.0, 2.0], [1.0, 2.0]])
    with np.errstate(divide="ignore"):
        want_lse = np.where(l == 0, -np.inf, m + np.log(l))
        assert_close(lse, want_lse, what="finalize lse", wrong_answers={
            LSE_WITHOUT_MAX: np.where(l == 0, -np.inf, np.log(l))})
    assert_close(out, want_out, what="finalize out", hint="out = acc / l; an empty state gives 0")


@pytest.mark.points(2)
@given(split=st.integers(1, 11), heads=head_counts(max_heads=4), seed=st.integers(0, 2**16))
def test_merging_two_partials_equals_dense_attention(split, heads, seed):
    q, k, v = decode_problem(seed, 12, *heads)
    k[:split] *= 2.0  # the two halves get clearly different maxima
    state = impl.merge(impl.partial_state(q, k[:split], v[:split]),
                       impl.partial_state(q, k[split:], v[split:]))
    out, lse = impl.finalize(state)
    want_out, want_lse = dense(q, k, v)
    bounds = [(0, split), (split, 12)]
    assert_close(out, want_out, what="out of merge(first part, second part)",
                 wrong_answers=chunk_misconceptions(q, k, v, bounds))
    assert_close(lse, want_lse, what="lse of merge(first part, second part)",
                 wrong_answers={LSE_WITHOUT_MAX: want_lse - score_max(q, k)})


@pytest.mark.points(3)
@given(data=st.data())
def test_any_merge_tree_over_any_partitioning_equals_dense_attention(data):
    heads = data.draw(head_counts(max_heads=4), label="heads")
    sizes = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=7), label="partition sizes")
    tree = data.draw(merge_trees(len(sizes)), label="merge tree")
    q, k, v = decode_problem(data.draw(st.integers(0, 2**16), label="seed"), sum(sizes), *heads)
    bounds = bounds_of(sizes)
    leaves = [impl.partial_state(q, k[lo:hi], v[lo:hi]) for lo, hi in bounds]
    out, lse = impl.finalize(reduce_tree(tree, leaves, impl.merge))
    want_out, want_lse = dense(q, k, v)
    assert_close(out, want_out, what=f"out after merging partitions {sizes} as {tree}",
                 wrong_answers=chunk_misconceptions(q, k, v, bounds), nan_hint=IDENTITY_NAN)
    with np.errstate(invalid="ignore"):
        assert_close(lse, want_lse, what=f"lse after merging partitions {sizes} as {tree}",
                     wrong_answers={LSE_WITHOUT_MAX: want_lse - score_max(q, k)},
                     nan_hint=IDENTITY_NAN)


@pytest.mark.points(1)
@pytest.mark.parametrize("offset", [100.0, -100.0, 800.0, -800.0])
def test_merged_partials_stay_exact_when_the_scores_sit_near_plus_or_minus_800(offset):
    q, k, v = decode_problem(5, 20, 4, 2, offset=offset)
    leaves = [impl.partial_state(q, k[lo:hi], v[lo:hi]) for lo, hi in bounds_of([7, 0, 6, 7])]
    out, lse = impl.finalize(reduce_tree(((0, 1), (2, 3)), leaves, impl.merge))
    want_out, want_lse = dense(q, k, v)
    what = f"merged partials with scores near {offset:+.0f}"
    assert_close(out, want_out, what=f"{what}: out", hint=OVERFLOW, nan_hint=OVERFLOW)
    assert_close(lse, want_lse, what=f"{what}: lse", hint=OVERFLOW, nan_hint=OVERFLOW,
                 wrong_answers={LSE_WITHOUT_MAX: want_lse - score_max(q, k)})


# ---- split-KV attention ----------------------------------------------------------------


@pytest.mark.points(3)
@given(n=st.integers(0, 20), extra=st.integers(0, 3), pick=st.integers(0, 10**6),
       order=st.sampled_from(ORDERS), heads=head_counts(max_heads=4), seed=st.integers(0, 2**16))
def test_split_kv_attention_equals_dense_for_every_partition_count_and_order(
    n, extra, pick, order, heads, seed
):
    num_partitions = 1 + pick % (max(n, 1) + extra)  # 1 .. n, and a few past n (empty ones)
    q, k, v = decode_problem(seed, n, *heads)
    out, lse = impl.split_kv_attention(q, k, v, num_partitions, order=order)
    want_out, want_lse = dense(q, k, v)
    what = f"split_kv_attention(n={n}, num_partitions={num_partitions}, order={order!r})"
    wrong = {DROPPED_TAIL: dropped_tail(q, k, v, num_partitions)[0]} if n else {}
    assert_close(out, want_out, what=f"{what} out", nan_hint=IDENTITY_NAN, wrong_answers=wrong)
    with np.errstate(invalid="ignore"):
        assert_close(lse, want_lse, what=f"{what} lse", nan_hint=IDENTITY_NAN,
                     wrong_answers={LSE_WITHOUT_MAX: want_lse - score_max(q, k)})


def dropped_tail(q, k, v, num_partitions):
    """Dense attention over the keys a cut of equal floor(n / P) sizes would keep."""
    kept = (len(k) // num_partitions) * num_partitions
    return dense(q, k[:kept], v[:kept])


@pytest.mark.points(1)
@pytest.mark.parametrize(("n", "num_partitions", "order", "offset"), [
    (203, 80, "sequential", 0.0),
    (203, 80, "tree", 800.0),
    (50, 80, "tree", 0.0),
    (290, 129, "random", -800.0),
    (100, 129, "reverse", 0.0),
])
def test_split_kv_attention_with_more_than_64_partitions_not_a_power_of_two(
    n, num_partitions, order, offset
):
    q, k, v = decode_problem(n + num_partitions, n, 4, 2, offset=offset)
    out, lse = impl.split_kv_attention(q, k, v, num_partitions, order=order)
    want_out, want_lse = dense(q, k, v)
    what = (f"split_kv_attention(n={n}, num_partitions={num_partitions}, order={order!r}, "
            f"scores near {offset:+.0f})")
    wrong = {}
    if n > num_partitions:
        wrong[DROPPED_TAIL] = dropped_tail(q, k, v, num_partitions)[0]
    assert_close(out, want_out, what=f"{what} out", nan_hint=f"{IDENTITY_NAN}. Or: {OVERFLOW}",
                 wrong_answers=wrong)
    assert_close(lse, want_lse, what=f"{what} lse", nan_hint=OVERFLOW)


@pytest.mark.points(1)
def test_split_kv_attention_respects_an_explicit_scale():
    q, k, v = decode_problem(3, 9, 4, 1)
    out, lse = impl.split_kv_attention(q, k, v, 3, scale=0.3)
    want_out, want_lse = reference_attention(q[None], k, v, scale=0.3)
    assert_close(out, want_out[0], what="out with scale=0.3",
                 hint="scores are q.k * scale; the default scale is 1/sqrt(d)")
    assert_close(lse, want_lse[0], what="lse with scale=0.3")


@pytest.mark.points(2)
def test_split_kv_attention_maps_query_heads_to_kv_heads_for_every_head_ratio():
    for i, (num_heads, num_kv_heads) in enumerate(HEAD_RATIOS):
        q, k, v = decode_problem(40 + i, 11, num_heads, num_kv_heads)
        out, lse = impl.split_kv_attention(q, k, v, 3, order="tree")
        want_out, want_lse = dense(q, k, v)
        what = f"split_kv_attention with {num_heads} query heads and {num_kv_heads} KV heads"
        assert_close(out, want_out, what=f"{what}: out",
                     wrong_answers=head_misconceptions(q, k, v))
        assert_close(lse, want_lse, what=f"{what}: lse")


@pytest.mark.points(1)
def test_tree_order_merges_neighbours_pairwise():
    """Floating-point addition is not associative, so the merge ORDER shows in the last bits.

    Four partitions of one key each, all scores 0 (every rescale factor is exactly 1), so
    merging adds the values: sequentially ((v0 + v1) + v2) + v3, as a tree
    (v0 + v1) + (v2 + v3). With v = [1, 2^54, -2^54, 1] in float64 the first gives 1 and the
    second 0 (2^54 + 1 rounds to 2^54): that is how a reduction order is observed.
    """
    big = 2.0**54
    q = np.zeros((1, 1))
    k = np.zeros((4, 1, 1))
    v = np.array([1.0, big, -big, 1.0]).reshape(4, 1, 1)
    tree = impl.split_kv_attention(q, k, v, 4, order="tree")[0][0, 0] * 4  # the sum of acc
    sequential = impl.split_kv_attention(q, k, v, 4, order="sequential")[0][0, 0] * 4
    assert sequential == ((1.0 + big) - big) + 1.0, (
        f"order='sequential' must fold P0, P1, P2, P3 in turn: got a sum of {sequential}")
    assert tree == (1.0 + big) + (-big + 1.0), (
        f"order='tree' must merge neighbours in rounds, (P0 + P1) + (P2 + P3): got a sum of "
        f"{tree}, which is what folding them one after another gives"
    )


# ---- the serving form: merge_attn_states -----------------------------------------------


def token_problem(seed: int, tokens: int = 3, n: int = 10, heads=(4, 2), d: int = 8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((tokens, heads[0], d))
    k = rng.standard_normal((n, heads[1], d))
    v = rng.standard_normal((n, heads[1], d))
    return q, k, v


@pytest.mark.points(2)
@given(split=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_merge_attn_states_of_two_partitions_equals_dense_attention(split, seed):
    q, k, v = token_problem(seed)
    k[split:] *= 1.7
    out_a, lse_a = reference_attention(q, k[:split], v[:split])  # [T, H, d], [T, H]
    out_b, lse_b = reference_attention(q, k[split:], v[split:])
    out, lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = reference_attention(q, k, v)
    assert_close(out, want_out, what="merge_attn_states out", wrong_answers={
        "the two partial outputs were averaged: weigh each by exp(lse_side - lse)":
            (out_a + out_b) / 2,
        "the outputs were weighted by exp(lse_side) but not divided by exp(lse_a) + exp(lse_b)":
            np.exp(lse_a)[..., None] * out_a + np.exp(lse_b)[..., None] * out_b,
    })
    assert_close(lse, want_lse, what="merge_attn_states lse", wrong_answers={
        "the merged lse is log(exp(lse_a) + exp(lse_b)), not max(lse_a, lse_b)":
            np.maximum(lse_a, lse_b)})


def expected_merge(out_a, lse_a, out_b, lse_b):
    """The serving-form merge written out in float64, with +-inf meaning empty."""
    lse_a, lse_b = (np.where(np.isinf(x), -np.inf, x) for x in (lse_a, lse_b))
    m = np.maximum(lse_a, lse_b)
    with np.errstate(invalid="ignore"):
        both = np.isneginf(m)
        m_safe = np.where(both, 0.0, m)
        w_a = np.where(np.isneginf(lse_a), 0.0, np.exp(lse_a - m_safe))
        w_b = np.where(np.isneginf(lse_b), 0.0, np.exp(lse_b - m_safe))
        total = np.where(both, 1.0, w_a + w_b)
        out = (np.where(w_a[..., None] > 0, (w_a / total)[..., None] * out_a, 0.0)
               + np.where(w_b[..., None] > 0, (w_b / total)[..., None] * out_b, 0.0))
        lse = np.where(both, -np.inf, m_safe + np.log(total))
    return out, lse


@pytest.mark.points(2)
@given(empty_a=st.lists(st.booleans(), min_size=4, max_size=4),
       empty_b=st.lists(st.booleans(), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_merge_attn_states_with_minus_inf_lse_gives_no_nan(empty_a, empty_b, seed):
    q, k, v = token_problem(seed, tokens=2)
    out_a, lse_a = reference_attention(q, k[:4], v[:4])
    out_b, lse_b = reference_attention(q, k[4:], v[4:])
    ea, eb = np.array(empty_a), np.array(empty_b)  # per head: this side's partition is empty
    out_a[:, ea], lse_a[:, ea] = 0.0, -np.inf
    out_b[:, eb], lse_b[:, eb] = 0.0, -np.inf
    want_out, want_lse = expected_merge(out_a, lse_a, out_b, lse_b)  # before the call
    out, lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    hint = ("an empty partition has lse = -inf: its weight is 0, and two empty sides give "
            "out 0, lse -inf; exp(-inf - (-inf)) is NaN, so guard it")
    assert_close(out, want_out, what="merge_attn_states out with empty partitions",
                 nan_hint=hint)
    assert_close(lse, want_lse, what="merge_attn_states lse with empty partitions",
                 nan_hint=hint)


@pytest.mark.points(2)
def test_merge_attn_states_treats_plus_inf_lse_as_empty_like_vllm():
    q, k, v = token_problem(8, tokens=2)
    out_a, lse_a = reference_attention(q, k[:4], v[:4])
    out_b, lse_b = reference_attention(q, k[4:], v[4:])
    lse_a[0, 1] = np.inf  # FlashAttention-2's lse for a row with no keys ...
    out_a[0, 1] = 0.0     # ... whose output is 0
    lse_a[1, 2], lse_b[1, 2] = np.inf, np.inf  # both sides empty
    lse_b[1, 3], lse_a[1, 3] = np.inf, -np.inf
    out_a[1, 3] = np.nan  # an empty side's out is never read into the result
    want_out, want_lse = expected_merge(out_a, lse_a, out_b, lse_b)  # before the call
    plus_inf = np.isposinf(lse_a) | np.isposinf(lse_b)
    out, lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    assert_close(out, want_out, what="merge_attn_states out with +inf lses",
                 hint="FlashAttention-2 returns lse = +inf for a row with no keys: treat "
                 "+inf, like -inf, as an empty side (weight 0, its out ignored)",
                 nan_hint=PLUS_INF_EMPTY)
    assert_close(lse, want_lse, what="merge_attn_states lse with +inf lses",
                 nan_hint=PLUS_INF_EMPTY, wrong_answers={
                     "an lse of +inf was passed through: +inf means 'no keys', the merged lse "
                     "of an empty and a non-empty side is the non-empty side's": np.where(
                         plus_inf, np.inf, want_lse)})


@pytest.mark.points(1)
@pytest.mark.parametrize(("offset_a", "offset_b"),
                         [(100.0, 100.0), (-100.0, -90.0), (800.0, 790.0), (-800.0, -800.0),
                          (800.0, -800.0)])
def test_merge_attn_states_stays_exact_for_lse_near_plus_or_minus_800(offset_a, offset_b):
    q, k, v = token_problem(9, tokens=2)
    scale = 1 / math.sqrt(q.shape[-1])
    shift_scores(q, k[:5], offset_a, scale)
    shift_scores(q, k[5:], offset_b, scale)
    out_a, lse_a = reference_attention(q, k[:5], v[:5])
    out_b, lse_b = reference_attention(q, k[5:], v[5:])
    out, lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = reference_attention(q, k, v)
    what = f"merge_attn_states with lse near {lse_a.mean():+.0f} and {lse_b.mean():+.0f}"
    assert_close(out, want_out, what=f"{what}: out", hint=OVERFLOW, nan_hint=OVERFLOW)
    assert_close(lse, want_lse, what=f"{what}: lse", hint=OVERFLOW, nan_hint=OVERFLOW)


@pytest.mark.points(2)
@given(data=st.data())
def test_any_tree_of_merge_attn_states_equals_dense_attention(data):
    sizes = data.draw(st.lists(st.integers(0, 4), min_size=2, max_size=6), label="sizes")
    tree = data.draw(merge_trees(len(sizes)), label="merge tree")
    offset = data.draw(st.sampled_from(OFFSETS), label="score offset")
    plus_inf = data.draw(st.booleans(), label="empty partitions say lse = +inf")
    q, k, v = token_problem(data.draw(st.integers(0, 2**16), label="seed"), tokens=2,
                            n=sum(sizes))
    shift_scores(q, k, offset, 1 / math.sqrt(q.shape[-1]))
    leaves = []
    for lo, hi in bounds_of(sizes):
        out_p, lse_p = reference_attention(q, k[lo:hi], v[lo:hi])
        if hi == lo:  # an empty partition: lse +-inf, its out poisoned
            out_p, lse_p = np.full_like(out_p, np.nan), np.full_like(lse_p, np.inf)
            lse_p = lse_p if plus_inf else -lse_p
        leaves.append((out_p, lse_p))
    out, lse = reduce_tree(tree, leaves, lambda a, b: impl.merge_attn_states(*a, *b))
    want_out, want_lse = reference_attention(q, k, v)
    what = f"a tree {tree} of merge_attn_states over partitions {sizes} near {offset:+.0f}"
    hint = f"{OVERFLOW}. Or: {PLUS_INF_EMPTY}. Or: {IDENTITY_NAN}"
    assert_close(out, want_out, what=f"{what}: out", nan_hint=hint)
    assert_close(lse, want_lse, what=f"{what}: lse", nan_hint=hint)


# ---- ring attention, simulated ---------------------------------------------------------


def ring_misconceptions(q, k, v, sizes, causal):
    """Dense answers of the classic ring mistakes, from the reference with the wrong mask."""
    L = q.shape[0]
    owner = np.repeat(np.arange(len(sizes)), sizes)  # shard of each token
    local = np.arange(L) - np.concatenate([[0], np.cumsum(sizes)])[owner]
    same_shard = owner[:, None] == owner[None, :]
    wrong = {NO_ROTATION: same_shard}
    if causal:
        wrong = {
            LOCAL_POSITIONS: local[None, :] <= local[:, None],
            NO_ROTATION: same_shard & prefix_mask(np.arange(L), L),
            CAUSAL_IGNORED: np.ones((L, L), dtype=bool),
        }
    return {why: reference_attention(q, k, v, mask=mask) for why, mask in wrong.items()}


def check_ring(sizes, heads, causal, seed):
    rng = np.random.default_rng(seed)
    L, (H, KVH), d = sum(sizes), heads, 8
    q = rng.standard_normal((L, H, d))
    k = rng.standard_normal((L, KVH, d))
    v = rng.standard_normal((L, KVH, d))
    shard = [slice(lo, hi) for lo, hi in bounds_of(sizes)]
    mask = prefix_mask(np.arange(L), L) if causal else None
    want_out, want_lse = reference_attention(q, k, v, mask=mask)  # before the call
    wrong = ring_misconceptions(q, k, v, sizes, causal)
    outs, lses = impl.ring_attention([q[s] for s in shard], [k[s] for s in shard],
                                     [v[s] for s in shard], causal=causal)
    assert len(outs) == len(sizes) and len(lses) == len(sizes), (
        f"ring_attention must return one (out, lse) shard per device: {len(sizes)} devices, "
        f"got {len(outs)} outs and {len(lses)} lses"
    )
    for p, (o, s) in enumerate(zip(outs, lses)):
        assert np.shape(o) == (sizes[p], H, d) and np.shape(s) == (sizes[p], H), (
            f"device {p} holds {sizes[p]} queries: out must be {(sizes[p], H, d)} and lse "
            f"{(sizes[p], H)}, got {np.shape(o)} and {np.shape(s)}"
        )
    what = f"ring attention ({len(sizes)} devices, shard sizes {sizes}, causal={causal})"
    assert_close(np.concatenate(outs), want_out, what=f"{what} out",
                 wrong_answers={why: w[0] for why, w in wrong.items()}, nan_hint=IDENTITY_NAN)
    assert_close(np.concatenate(lses), want_lse, what=f"{what} lse",
                 wrong_answers={why: w[1] for why, w in wrong.items()}, nan_hint=IDENTITY_NAN)



@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_ring_step_takes_the_scale_keyword(scale):
    """One ring step with ``scale=``: queries at 4..8, keys at 2..8 (causal: key <= query)."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((5, 4, 8)), rng.standard_normal((7, 2, 8)), \
        rng.standard_normal((7, 2, 6))  # fmt: skip
    for causal in (False, True):
        mask = (2 + np.arange(7))[None, :] <= (4 + np.arange(5))[:, None] if causal else None
        state = impl.ring_step(impl.empty_state((5, 4), 6), q, k, v, 4, 2, causal, scale=scale)
        out, lse = impl.finalize(state)
        want_out, want_lse = reference_attention(q, k, v, scale=scale, mask=mask)
        default_out, _ = reference_attention(q, k, v, mask=mask)
        wrong = scale_wrong(scale, default_out)
        if causal:  # the shards' own positions: queries 0..4 and keys 0..6
            local = np.arange(7)[None, :] <= np.arange(5)[:, None]
            wrong[LOCAL_POSITIONS] = reference_attention(q, k, v, scale=scale, mask=local)[0]
        assert_close(out, want_out, what=f"ring_step(causal={causal}, scale={scale}) out",
                     wrong_answers=wrong)
        assert_close(lse, want_lse, what=f"ring_step(causal={causal}, scale={scale}) lse")

@pytest.mark.points(3)
@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(lambda s: sum(s) > 0),
       heads=head_counts(max_heads=4), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_ring_attention_equals_dense_attention_for_any_sharding(sizes, heads, causal, seed):
    check_ring(sizes, heads, causal, seed)


@pytest.mark.points(2)
def test_causal_ring_attention_masks_with_global_positions():
    check_ring([4, 4, 4], (4, 2), causal=True, seed=11)


# ---- bad input -------------------------------------------------------------------------


def _shards(counts):
    rng = np.random.default_rng(0)
    return [[rng.standard_normal((2, 2, 4)) for _ in range(c)] for c in counts]


BAD_INPUTS: BadInputs = {
    "num_partitions=0": (
        "num_partitions", lambda: impl.split_kv_attention(*decode_problem(0, 6, 2, 1), 0)),
    "num_partitions=-3": (
        "num_partitions", lambda: impl.split_kv_attention(*decode_problem(0, 6, 2, 1), -3)),
    "unknown order": ("order", lambda: impl.split_kv_attention(*decode_problem(0, 6, 2, 1), 2,
                                                               order="zigzag")),
    "fewer k shards than q shards": ("k_shards", lambda: impl.ring_attention(*_shards([3, 2, 3]))),
    "more v shards than q shards": ("v_shards", lambda: impl.ring_attention(*_shards([2, 2, 3]))),
    "lse_b of the wrong shape": ("lse_b", lambda: impl.merge_attn_states(
        np.zeros((2, 3, 4)), np.zeros((2, 3)), np.zeros((2, 3, 4)), np.zeros((3, 2)))),
}


test_bad_input_raises_value_error_naming_the_argument = bad_input_test(BAD_INPUTS, points=0.5)


# ---- Triton: partition kernel + merge kernel over a paged cache ------------------------


def paged_problem(seq_lens, heads=(2, 1), d=16, block_size=8, seed=0, reach=64, offset=0.0,
                  shared_prefix=0):
    """A NaN-poisoned paged cache. Padding entries of the block table name a poisoned block,
    ``reach`` tokens' worth of them past the longest sequence: a kernel that reads past
    seq_len (up to a whole partition or segment too far) sees NaN instead of wild memory.
    With ``shared_prefix``, every sequence starts with the same tokens and their full blocks
    are shared between the block tables (prefix caching)."""
    rng = np.random.default_rng(seed)
    if shared_prefix:
        ks, vs = random_kv_shared_prefix(rng, seq_lens, shared_prefix, heads[1], d)
    else:
        ks, vs = random_kv(rng, seq_lens, heads[1], d)
    # keys grow along the sequence, so the running max rises tile after tile (every tile of a
    # split must rescale what came before)
    ks = [k * (1 + np.arange(len(k)) / 32)[:, None, None] for k in ks]
    q = rng.standard_normal((len(seq_lens), heads[0], d))
    for k in ks:
        shift_scores(q, k, offset, 1 / math.sqrt(d))
    paged = build_paged_kv(ks, vs, block_size, rng=rng, padding="poisoned",
                           extra_table_entries=-(-reach // block_size) + 1,
                           share_blocks=bool(shared_prefix))
    return q, ks, vs, paged


def reference_batch(q, ks, vs, scale=None):
    results = [reference_attention(q[b][None], ks[b], vs[b], scale=scale)
               for b in range(len(ks))]
    return np.stack([o[0] for o, _ in results]), np.stack([s[0] for _, s in results])


def paged_misconceptions(q, ks, vs, split_bounds):
    """Wrong answers computed from the reference, split by split (``split_bounds[b]`` lists
    the (lo, hi) of sequence b's non-empty splits)."""
    H = q.shape[1]
    heads = [head_misconceptions(q[b], k, v) for b, (k, v) in enumerate(zip(ks, vs))]
    avg_seen, unnormalised = [], []
    for b, (k, v) in enumerate(zip(ks, vs)):
        parts = split_bounds[b]
        zero = np.zeros((H, v.shape[2]))
        if not parts:
            avg_seen.append(zero), unnormalised.append(zero)
            continue
        avg_seen.append(np.mean([dense(q[b], k[lo:hi], v[lo:hi])[0] for lo, hi in parts], 0))
        states = [expected_state(q[b], k[lo:hi], v[lo:hi]) for lo, hi in parts]
        lses = np.stack([m + np.log(l) for m, l, _ in states])  # [P, H]
        w = np.exp(lses - lses.max(axis=0))
        unnormalised.append(sum(w_p[:, None] * acc for w_p, (_, _, acc) in zip(w, states))
                            / w.sum(axis=0)[:, None])
    wrong = {"the merge kernel averaged the partitions: weigh each by exp(lse_p - lse)":
             np.stack(avg_seen),
             "the partition kernel stored acc unnormalised: in the serving form (out, lse) a "
             "partial output is acc / l; the merge weighs it by exp(lse_p - lse)":
             np.stack(unnormalised)}
    for why in heads[0]:
        wrong[why] = np.stack([h[why] for h in heads])
    return wrong


def split_bounds_for(seq_lens, partition_size=None, num_segments=None, block_n=16,
                     full_only=False):
    """Each sequence's non-empty splits, the way the kernel must cut them (``full_only``:
    only the splits of the whole split length)."""
    bounds = []
    for n in seq_lens:
        if num_segments:
            size = -(-n // (num_segments * block_n)) * block_n
        else:
            size = partition_size
        bounds.append([(lo, min(lo + size, n)) for lo in range(0, n, size)
                       if not full_only or lo + size <= n] if n else [])
    return bounds


EXP_ON_LOG2 = (
    "tl.exp on scores scaled into log2 units (qk_scale = scale * log2 e): every score weighs "
    "as if the scale were 1.44x larger; with the log2 e scale, use tl.exp2"
)
LAST_SPLIT_SKIPPED = (
    "the keys of each sequence's last, partial split were lost: a split shorter than the "
    "split length (the end of a sequence) is not empty, it holds the last keys"
)
SPLIT_END_EARLY = (
    "every full split lost its last key: a split covers start .. start + split_len - 1 "
    "inclusive, so its end bound is start + split_len, exclusive (and min(., seq_len))"
)
SEGMENT_ROUNDED_DOWN = (
    "the segment length was rounded down: NUM_SEGMENTS segments of floor(n / (NUM_SEGMENTS "
    "* BLOCK_N)) tiles leave the last keys in no segment; round the tile count up (cdiv)"
)
LSE_IN_LOG2 = (
    "the lse was left in log2 units (m + log2(l), m in log2 units): divide by log2 e to get "
    "back to the natural log that the merge and the caller use"
)
TRITON_NAN_HINT = NAN_HINT + (
    " In the merge kernel: a sequence with 0 tokens has lse = -inf in every partition, and "
    "exp(-inf - (-inf)) is NaN; such partitions must weigh 0, and their output (never "
    "written) must not be read at all: weight 0 times a NaN output is NaN. Or a kernel never "
    "stored a "
    "value it owns (provided.output_buffer fills buffers with NaN on the interpreter): the "
    "launcher must run the partition kernel on the whole plan.partition_grid (one program "
    "per sequence x split, KV head), and only then the merge kernel over all the splits."
)


def expected_partition_merge(part_out, part_lse):
    """The merge of ``P`` serving-form partials ``[B, H, P, dv]``, ``[B, H, P]`` in float64;
    an lse of +-inf is an empty partition (weight 0, its output never read)."""
    empty = np.isinf(part_lse)
    m = np.max(np.where(empty, -np.inf, part_lse), axis=2, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # [B, H, 1]
    w = np.where(empty, 0.0, np.exp(np.where(empty, 0.0, part_lse - m)))  # [B, H, P]
    total = w.sum(axis=2)
    out = np.einsum("bhp,bhpd->bhd", w, np.where(empty[..., None], 0.0, part_out)) \
        / np.where(total == 0, 1.0, total)[..., None]
    with np.errstate(divide="ignore"):
        lse = np.where(total == 0, -np.inf, m[..., 0] + np.log(total))
    return out, lse


def split_kv_args(q, paged, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The launcher's tensors, by name: ``q``, ``k_cache``, ``v_cache``, ``block_tables``,
    ``seq_lens`` (in its parameters' order)."""
    return {"q": torch.tensor(q, dtype=dtype, device=DEVICE), **paged.to_torch(dtype, DEVICE)}


def run_split_kv(q, paged, dtype=torch.float32, **kwargs):
    with raised_as(P_NOT_CAST, when="must be same dtype"):
        return impl.split_kv_decode_triton(*split_kv_args(q, paged, dtype).values(), **kwargs)


def check_split_kv(seq_lens, kwargs, dtype=torch.float32, heads=(2, 1), d=16, offset=0.0,
                   shared_prefix=0, more_wrong=None):
    """Run the launcher on a poisoned paged problem and compare with the reference;
    ``more_wrong(q, ks, vs)`` adds wrong answers to name."""
    reach = kwargs.get("num_segments", 0) * (kwargs.get("block_n") or 16) \
        or kwargs.get("partition_size", 512)  # how far past seq_len a wrong split could read
    q, ks, vs, paged = paged_problem(seq_lens, heads=heads, d=d, offset=offset,
                                     shared_prefix=shared_prefix, reach=reach)
    if shared_prefix:  # the premise: some physical blocks are named by several tables
        used = np.concatenate([t[: -(-n // paged.block_size)]
                               for t, n in zip(paged.block_tables, seq_lens)])
        assert len(np.unique(used)) < len(used), "the test's tables share no block"
    out, lse = run_split_kv(q, paged, dtype, **kwargs)
    want_out, want_lse = reference_batch(q, ks, vs)
    bounds = split_bounds_for(seq_lens, kwargs.get("partition_size", 512),
                              kwargs.get("num_segments"), kwargs.get("block_n") or 16)
    atol, rtol = tolerance(dtype)
    what = f"split_kv_decode_triton({', '.join(f'{k}={v}' for k, v in kwargs.items())}, " \
           f"seq_lens={seq_lens}, heads={heads}, d={d}, {str(dtype).replace('torch.', '')})"
    wrong = {**paged_misconceptions(q, ks, vs, bounds), **(more_wrong(q, ks, vs)
                                                            if more_wrong else {})}
    wrong[EXP_ON_LOG2] = reference_batch(q, ks, vs, scale=LOG2E / math.sqrt(d))[0]
    full = split_bounds_for(seq_lens, kwargs.get("partition_size", 512),
                            kwargs.get("num_segments"), kwargs.get("block_n") or 16, full_only=True)
    if full != bounds:  # the keys of the full splits only
        kept = [np.concatenate([np.arange(lo, hi) for lo, hi in parts] or [[]]).astype(int)
                for parts in full]
        wrong[LAST_SPLIT_SKIPPED] = reference_batch(
            q, [k[i] for k, i in zip(ks, kept)], [v[i] for v, i in zip(vs, kept)])[0]
    short = [np.concatenate([np.arange(lo, hi - ((lo, hi) in whole)) for lo, hi in parts]
                            or [[]]).astype(int)
             for parts, whole in zip(bounds, full)]  # every full split one token short
    wrong[SPLIT_END_EARLY] = reference_batch(
        q, [k[i] for k, i in zip(ks, short)], [v[i] for v, i in zip(vs, short)])[0]
    if kwargs.get("num_segments"):  # segments of whole tiles, their count rounded down
        tile = (kwargs.get("block_n") or 16) * kwargs["num_segments"]
        kept = [min(n, (n // tile) * tile) for n in seq_lens]
        wrong[SEGMENT_ROUNDED_DOWN] = reference_batch(
            q, [k[:n] for k, n in zip(ks, kept)], [v[:n] for v, n in zip(vs, kept)])[0]
    assert_close(out, want_out, what=f"{what} out", atol=atol, rtol=rtol, wrong_answers=wrong,
                 nan_hint=TRITON_NAN_HINT)
    assert_close(lse, want_lse, what=f"{what} lse", atol=atol, rtol=rtol,
                 nan_hint=TRITON_NAN_HINT, wrong_answers={LSE_IN_LOG2: want_lse * LOG2E})


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize(("seq_lens", "kwargs", "heads"), [
    pytest.param([37, 9], {"block_n": 32}, (2, 1),  # first: one split each names more mistakes
                 id="the default 512-token partition, longer than every sequence"),
    pytest.param([37, 0, 20], {"partition_size": 16, "block_n": 16}, (2, 1),
                 id="partitions of 16 in tiles of 16, an empty sequence"),
    pytest.param([23, 0], {"partition_size": 5, "block_n": 32}, (2, 1),
                 id="partitions of 5 inside tiles of 32"),
])
def test_split_kv_decode_triton_matches_the_reference_for_partition_and_tile_sizes(
    seq_lens, kwargs, heads
):
    check_split_kv(seq_lens, kwargs, heads=heads)


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize(("seq_lens", "kwargs"), [
    pytest.param([37, 0], {"num_segments": 16, "block_n": 16},
                 id="vLLM's 16 segments, mostly empty for short sequences"),
    pytest.param([70, 33], {"num_segments": 2, "block_n": 32},
                 id="2 segments of two tiles of 32"),
])
def test_split_kv_decode_triton_with_a_fixed_number_of_segments(seq_lens, kwargs):
    check_split_kv(seq_lens, kwargs)


@pytest.mark.triton
@pytest.mark.points(2)
def test_split_kv_decode_triton_merges_more_than_64_partitions():
    """80 partitions of one token: a merge that looks at 64 (or any power of two) misses some."""
    seq_lens = [80]
    q, ks, vs, paged = paged_problem(seq_lens, heads=(2, 1), seed=3)
    out, lse = run_split_kv(q, paged, partition_size=1, max_seq_len=80)
    want_out, want_lse = reference_batch(q, ks, vs)
    first64 = reference_batch(q, [ks[0][:64]], [vs[0][:64]])
    atol, rtol = tolerance("float32")
    assert_close(out, want_out, what="split_kv_decode_triton with 80 partitions: out",
                 atol=atol, rtol=rtol, nan_hint=TRITON_NAN_HINT, wrong_answers={
                     "the merge kernel read only the first 64 partitions: loop over all "
                     "num_partitions of them, BLOCK_P at a time": first64[0]})
    assert_close(lse, want_lse, what="split_kv_decode_triton with 80 partitions: lse",
                 atol=atol, rtol=rtol, wrong_answers={
                     "the merge kernel read only the first 64 partitions": first64[1]})


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize(("num_partitions", "offset"), [(80, 100.0), (129, -100.0)])
def test_merge_partitions_triton_merges_any_number_of_partitions_near_plus_or_minus_100(
    num_partitions, offset
):
    """Partitions beyond 64, empty ones (lse -inf, and +inf as FlashAttention-2 reports it,
    with NaN outputs that must not be read) and LSEs near +-100, where exp(lse) overflows
    float32."""
    rng = np.random.default_rng(num_partitions)
    part_out = rng.standard_normal((1, 3, num_partitions, 24))
    part_lse = offset + rng.uniform(-4, 4, (1, 3, num_partitions))
    empty = rng.random((1, 3, num_partitions)) < 0.2
    empty[0, 2, :] = True  # a (sequence, head) with no keys at all
    part_lse[empty] = np.where(rng.random(empty.sum()) < 0.5, -np.inf, np.inf)
    part_out[empty] = np.nan
    want_out, want_lse = expected_partition_merge(part_out, part_lse)  # before the call
    first64, _ = expected_partition_merge(part_out[:, :, :64], part_lse[:, :, :64])
    out, lse = impl.merge_partitions_triton(torch.tensor(part_out, dtype=torch.float32),
                                            torch.tensor(part_lse, dtype=torch.float32))
    atol, rtol = tolerance("float32")
    what = f"merge_partitions_triton over {num_partitions} partitions, lse near {offset:+.0f}"
    hint = f"{OVERFLOW}. Or: {PLUS_INF_EMPTY}. Or: {TRITON_NAN_HINT}"
    assert_close(out, want_out, what=f"{what}: out", atol=atol, rtol=rtol, nan_hint=hint,
                 wrong_answers={"only the first 64 partitions were merged": first64})
    assert_close(lse, want_lse, what=f"{what}: lse", atol=atol, rtol=rtol, nan_hint=hint)



@pytest.mark.triton
@pytest.mark.points(1)
def test_split_kv_decode_triton_accumulates_float16_in_float32():
    """float16 values of +-30 (cancelling) over 64 positions, partitions of 32 in 16-key tiles:
    each partition's acc must stay float32 until its partial is stored."""
    rng = np.random.default_rng(15)
    (k,), (v,) = random_kv(rng, [64], 1, 16)
    q = (0.05 * rng.standard_normal((1, 2, 16))).astype(np.float16).astype(np.float64)
    ks, vs = [k.astype(np.float16).astype(np.float64)], [cancelling(0.1 * v)]
    paged = build_paged_kv(ks, vs, 16, rng=rng, padding="poisoned")
    out, lse = run_split_kv(q, paged, torch.float16, partition_size=32, block_n=16)
    want_out, want_lse = reference_batch(q, ks, vs)
    atol, rtol = tolerance("float16")
    assert_close(out, want_out, what="float16 out (cancelling values)", atol=atol, rtol=rtol,
                 hint=f"{ACC_IN_FP16}. Or: {PARTIALS_IN_HALF}")  # fmt: skip
    assert_close(lse, want_lse, what="float16 lse", atol=atol, rtol=rtol)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [0.0, 0.3])
def test_split_kv_decode_triton_takes_the_scale_keyword(scale):
    q, ks, vs, paged = paged_problem([29, 9], heads=(4, 2), d=16, reach=16, seed=8)
    out, lse = run_split_kv(q, paged, partition_size=16, block_n=16, scale=scale)
    want_out, want_lse = reference_batch(q, ks, vs, scale=scale)
    atol, rtol = tolerance("float32")
    wrong = scale_wrong(scale, reference_batch(q, ks, vs)[0])
    heads = [head_misconceptions(q[b], k, v, scale) for b, (k, v) in enumerate(zip(ks, vs))]
    wrong.update({why: np.stack([h[why] for h in heads]) for why in heads[0]})
    assert_close(out, want_out, what=f"split_kv_decode_triton(scale={scale}) out", atol=atol,
                 rtol=rtol, wrong_answers=wrong)
    assert_close(lse, want_lse, what=f"split_kv_decode_triton(scale={scale}) lse", atol=atol,
                 rtol=rtol)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("block_p", [16, 32, 64])
def test_merge_partitions_triton_takes_the_block_p_keyword(block_p):
    """40 partitions merged 16, 32 or 64 at a time: every partition counted once."""
    rng = np.random.default_rng(block_p)
    part_out = rng.standard_normal((2, 3, 40, 24))
    part_lse = rng.uniform(-4, 4, (2, 3, 40))
    want_out, want_lse = expected_partition_merge(part_out, part_lse)
    out, lse = impl.merge_partitions_triton(torch.tensor(part_out, dtype=torch.float32),
                                            torch.tensor(part_lse, dtype=torch.float32),
                                            block_p=block_p)  # fmt: skip
    atol, rtol = tolerance("float32")
    hint = ("each step of the partition loop must advance by BLOCK_P, the tile it loads: "
            "range(0, num_partitions, BLOCK_P)")
    assert_close(out, want_out, what=f"merge_partitions_triton(block_p={block_p}) out",
                 atol=atol, rtol=rtol, hint=hint)  # fmt: skip
    assert_close(lse, want_lse, what=f"merge_partitions_triton(block_p={block_p}) lse",
                 atol=atol, rtol=rtol, hint=hint)  # fmt: skip
    assert_value_error_names(lambda: impl.merge_partitions_triton(
        torch.tensor(part_out, dtype=torch.float32), torch.tensor(part_lse, dtype=torch.float32),
        block_p=24), "block_p")

@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_kv_decode_triton_reads_transposed_and_sliced_views_through_their_strides(layout):
    """"transposed": q stored [H, B, d], the caches [blocks, KVH, page, d]; "sliced": every
    other row of a bigger storage at an offset, NaN between the rows (block table too).
    On the interpreter, no two programs of a launch may store to one element."""
    seq_lens = [29, 0]
    q, ks, vs, paged = paged_problem(seq_lens, heads=(4, 2), d=16, reach=16, seed=5)
    args = split_kv_args(q, paged)
    tensors = [strided_view(args[name], layout)
               for name in ("q", "k_cache", "v_cache", "block_tables")]
    (out, lse), reports = kernel_memory(impl.split_kv_decode_triton, *tensors,
                                        args["seq_lens"], partition_size=16, block_n=16)
    want_out, want_lse = reference_batch(q, ks, vs)
    atol, rtol = tolerance("float32")
    what = f"split_kv_decode_triton on {layout} views"
    nan_hint = (f"NaN with {layout} views: NaN sits between the rows of a sliced view, so a "
                "kernel stepped with a stride it assumed instead of the tensor's own")
    assert_close(out, want_out, what=f"{what}: out", atol=atol, rtol=rtol, nan_hint=nan_hint)
    assert_close(lse, want_lse, what=f"{what}: lse", atol=atol, rtol=rtol, nan_hint=nan_hint)
    assert_no_races(reports, "split_kv_decode_triton")
    assert_loads_in_bounds(reports, "split_kv_decode_triton")


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_merge_partitions_triton_reads_transposed_and_sliced_views(layout):
    rng = np.random.default_rng(3)
    part_out = rng.standard_normal((2, 3, 5, 16))
    part_lse = rng.uniform(-4, 4, (2, 3, 5))
    views = [strided_view(torch.tensor(x, dtype=torch.float32), layout)
             for x in (part_out, part_lse)]
    (out, lse), reports = kernel_memory(impl.merge_partitions_triton, *views)
    want_out, want_lse = expected_partition_merge(part_out, part_lse)
    atol, rtol = tolerance("float32")
    assert_close(out, want_out, what=f"merge of {layout} views: out", atol=atol, rtol=rtol)
    assert_close(lse, want_lse, what=f"merge of {layout} views: lse", atol=atol, rtol=rtol)
    assert_no_races(reports, "merge_partitions_triton")
    assert_loads_in_bounds(reports, "merge_partitions_triton")


@pytest.mark.triton
@pytest.mark.points(2)
def test_split_kv_decode_triton_keeps_scores_near_100_finite():
    check_split_kv([37], {"partition_size": 16}, offset=100.0)


@pytest.mark.triton
@pytest.mark.points(2)
def test_split_kv_decode_triton_reads_shared_physical_blocks():
    check_split_kv([24, 30, 17], {"partition_size": 16}, shared_prefix=16)


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("heads", [(32, 1), (6, 3)],
                         ids=["a group of 32, larger than 16", "6 heads on 3 KV heads"])
def test_split_kv_decode_triton_maps_query_heads_to_kv_heads(heads):
    check_split_kv([20], {"partition_size": 16 if heads[1] > 1 else 32}, heads=heads)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("d", ODD_HEAD_DIMS)
def test_split_kv_decode_triton_with_an_odd_head_dim_uses_the_real_head_dim_for_the_scale(d):
    padded = 1 << (d - 1).bit_length()
    check_split_kv([20], {"partition_size": 32}, d=d, more_wrong=lambda q, ks, vs: {
        PADDED_SCALE: reference_batch(q, ks, vs, scale=1 / math.sqrt(padded))[0]})


@pytest.mark.triton
@pytest.mark.points(2)
def test_split_kv_decode_triton_in_float16():
    check_split_kv([37, 20], {"partition_size": 16}, dtype=torch.float16)


PARTIALS_IN_HALF = (
    "the partials were kept in float16: near lse = 100 float16 rounds a partition's lse to "
    "1/16, so its merge weight exp(lse_p - lse) is off by up to 3%. Allocate part_out and "
    "part_lse in float32 whatever q's dtype (only out is in q.dtype)"
)


@pytest.mark.triton
@pytest.mark.points(2)
def test_split_kv_decode_triton_keeps_the_partials_in_float32_for_float16_inputs():
    """Scores near 100 in float16: the launcher's partial buffers must be float32."""
    def in_half(q, ks, vs):
        parts = [[(lo, min(lo + 8, len(k))) for lo in range(0, len(k), 8)] for k in ks]
        out = []
        for b, (k, v) in enumerate(zip(ks, vs)):
            outs, lses = zip(*(dense(q[b], k[lo:hi], v[lo:hi]) for lo, hi in parts[b]))
            lses = np.stack(lses).astype(np.float16).astype(np.float64)  # [P, H]
            part = (np.stack(outs).transpose(1, 0, 2)[None], lses.T[None])
            out.append(expected_partition_merge(*part)[0][0])
        return {PARTIALS_IN_HALF: np.stack(out)}

    check_split_kv([37, 44], {"partition_size": 8}, dtype=torch.float16, offset=100.0,
                   more_wrong=in_half)


# Checks the given launcher (provided.py), not your code: worth no points.
@pytest.mark.triton
@pytest.mark.points(0)
def test_split_kv_decode_triton_refuses_bfloat16_on_the_interpreter():
    if not provided.on_interpreter():
        pytest.skip("bfloat16 runs on a GPU")
    q, _, _, paged = paged_problem([5])
    with pytest.raises(ValueError, match="q"):
        run_split_kv(q, paged, torch.bfloat16, partition_size=16)


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("mode", [{"partition_size": 16}, {"num_segments": 2}],
                         ids=["partitions", "segments"])
def test_split_kv_decode_triton_makes_no_host_sync_when_given_max_seq_len(mode):
    """Measured by common.testing.host_syncs inside the process that runs the code (under
    the grader, the sandboxed worker): a teaching check, since a submission that undoes
    its patching of torch.Tensor is not caught (README: not defended)."""
    q, ks, vs, paged = paged_problem([9])
    args = split_kv_args(q, paged).values()
    (out, _), syncs = host_syncs(impl.split_kv_decode_triton, *args, max_seq_len=9, **mode)
    assert syncs == [], (
        f"with max_seq_len given the launch must not wait for the device, but it made "
        f"{len(syncs)} host synchronisation(s): {syncs}. The grid comes from max_seq_len "
        "(or num_segments), never from reading seq_lens"
    )
    want_out, _ = reference_batch(q, ks, vs)
    atol, rtol = tolerance("float32")
    assert_close(out, want_out, what="out with max_seq_len given", atol=atol, rtol=rtol)


# Checks the given launcher (provided.py), not your code: worth no points.
@pytest.mark.points(0)
def test_the_launch_grids_stay_within_cuda_limits_at_realistic_sizes():
    """CUDA allows 2^31 - 1 programs on grid x but only 65,535 on y and z (no launch here)."""
    limit_x, limit_yz = provided.CUDA_MAX_GRID_X, provided.CUDA_MAX_GRID_YZ
    cases = [  # (batch, num_heads, num_kv_heads, max_seq_len, partition_size, num_segments)
        (1, 32, 8, 1 << 20, 16, None),  # 65,536 partitions of one 1M-token sequence
        (256, 64, 8, 131_072, 512, None),
        (4096, 128, 128, 32_768, 512, None),
        (1024, 64, 8, 1 << 20, 512, 16),
    ]
    for batch, heads, kv_heads, max_len, part, segments in cases:
        splits = provided.num_splits(max_len, part, segments)
        grids = provided.split_kv_grids(batch, heads, kv_heads, splits)
        for grid in grids:
            assert grid[0] <= limit_x and all(g <= limit_yz for g in grid[1:]), (
                f"grid {grid} for batch={batch}, splits={splits}, heads={heads}/{kv_heads} "
                "exceeds CUDA's limits: fold the axes that grow into grid x"
            )
        assert np.prod(grids[0]) == batch * splits * kv_heads, (
            f"the partition grid {grids[0]} must hold one program per (sequence, split, KV head)"
        )
    assert provided.num_splits(1 << 20, 16, None) == 65_536
    assert provided.num_splits(37, 16, None) == 3, "ceil(37 / 16) = 3: the last one is partial"
    assert provided.num_splits(0, 16, None) == 1
    assert {provided.num_splits(n, 512, 16) for n in (1, 5000, 1 << 20)} == {16}, (
        "with num_segments the grid must not depend on the sequence lengths (CUDA graphs)"
    )
    with pytest.raises(ValueError, match="grid"):
        provided.split_kv_grids(1, 70_000, 1, 1)


def _bad_launch(change: Callable[[dict], dict]) -> None:
    q, _, _, paged = paged_problem([12, 3])
    args = {**split_kv_args(q, paged), "partition_size": 16}
    args.update(change(args))
    impl.split_kv_decode_triton(**args)


_TRITON_CHANGES = {
    "partition_size=0": (lambda a: {"partition_size": 0}, "partition_size"),
    "num_segments=0": (lambda a: {"num_segments": 0}, "num_segments"),
    "block table too short": (lambda a: {"block_tables": a["block_tables"][:, :1]},
                              "block_tables"),
    "max_seq_len longer than the table": (lambda a: {"max_seq_len": 10_000}, "block_tables"),
    "block_n=24": (lambda a: {"block_n": 24}, "block_n"),
    "q's head dim 8 against a cache of 16": (lambda a: {"q": a["q"][..., :8]}, "head_dim"),
}
TRITON_BAD_INPUTS: BadInputs = {
    case: (name, functools.partial(_bad_launch, change))
    for case, (change, name) in _TRITON_CHANGES.items()
}


# Checks the given launcher (provided.py), not your code: worth no points.
test_split_kv_decode_triton_rejects_bad_input_naming_the_argument = bad_input_test(
    TRITON_BAD_INPUTS, points=0, marks=(pytest.mark.triton,))


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize("mode", [{"partition_size": 512}, {"num_segments": 16}])
def test_split_kv_decode_triton_at_batch_1_with_32k_tokens_in_bf16_on_the_gpu(mode):
    seq_len, H, KVH, d, block_size = 32768, 32, 8, 128, 16
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(seq_len, KVH, d, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(seq_len, KVH, d, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn(1, H, d, device="cuda", generator=gen).to(torch.bfloat16)
    num_blocks = seq_len // block_size
    physical = torch.randperm(num_blocks + 4, device="cuda", generator=gen)
    k_cache = torch.full((num_blocks + 4, block_size, KVH, d), float("nan"), device="cuda",
                         dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    k_cache[physical[:num_blocks]] = k.view(num_blocks, block_size, KVH, d)
    v_cache[physical[:num_blocks]] = v.view(num_blocks, block_size, KVH, d)
    block_tables = physical[:num_blocks].to(torch.int32)[None]
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device="cuda")
    out, lse = impl.split_kv_decode_triton(q, k_cache, v_cache, block_tables, seq_lens,
                                           max_seq_len=seq_len, **mode)

    group = H // KVH  # torch float32 reference on the device
    kf = k.float().repeat_interleave(group, dim=1)  # [L, H, d]
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("hd,lhd->hl", q[0].float(), kf) / math.sqrt(d)
    want_lse = torch.logsumexp(s, dim=-1)
    want_out = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), vf)
    atol, rtol = tolerance("bfloat16")
    assert_close(out[0].float(), want_out, what="32k-token bf16 split-KV out", atol=atol, rtol=rtol)
    assert_close(lse[0], want_lse, what="32k-token bf16 split-KV lse", atol=atol, rtol=rtol)


# ---- ring attention on torch.distributed -----------------------------------------------


DISTRIBUTED_TEST = "test_ring_attention_on_torch_distributed_equals_dense_attention"
# The problem the rings solve, passed to ring_dist.py on its command line.
RING_SEED, RING_LEN, RING_HEADS, RING_KV_HEADS, RING_DIM = 5, 24, 4, 2, 8


def ring_problem(seed, seq_len, heads, kv_heads, head_dim):
    """``q [L, H, d]``, ``k, v [L, KVH, d]``: the numbers ring_dist.py's ``make_problem``
    draws from the same arguments. The test makes them here and keeps them: the code under
    test runs in the launcher's processes, so nothing they write (the problem, a reference)
    is trusted; their ``.npz`` is read for the gathered ``out`` and ``lse`` only."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((seq_len, heads, head_dim))
    k = rng.standard_normal((seq_len, kv_heads, head_dim))
    v = rng.standard_normal((seq_len, kv_heads, head_dim))
    return q, k, v


@pytest.fixture(scope="module", autouse=True)
def ring_launch(request, tmp_path_factory):
    """Start the distributed rings (``ring_dist.py --local 2 4``: rings of 2 and 4 CPU
    processes, gloo on 127.0.0.1) when this module starts, if a distributed test is selected:
    their start-up then runs on the second core while the other tests run. Whatever happens,
    no process of ours outlives the module."""
    wanted = any(getattr(item, "originalname", "") == DISTRIBUTED_TEST
                 for item in request.session.items)
    if not wanted:
        yield None
        return
    save_dir = tmp_path_factory.mktemp("ring")
    problem = [str(x) for x in (RING_SEED, RING_LEN, RING_HEADS, RING_KV_HEADS, RING_DIM)]
    options = ("--seed", "--seq-len", "--heads", "--kv-heads", "--head-dim")
    script = LabScript(__file__, "ring_dist.py", "--local", "2", "4", "--save-dir",
                       str(save_dir), "--timeout", "30",
                       *(x for pair in zip(options, problem) for x in pair),
                       env={"OMP_NUM_THREADS": "1"})
    script.save_dir = save_dir
    yield script
    script.stop()


@pytest.mark.points(2)
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_on_torch_distributed_equals_dense_attention(ring_launch, world):
    """The launcher's file is read for the ranks' answers only; the problem and the expected
    values are the test's own (a launcher that writes a forged problem with its matching
    answer fails)."""
    q, k, v = ring_problem(RING_SEED, RING_LEN, RING_HEADS, RING_KV_HEADS, RING_DIM)
    sizes = np.diff([(r * RING_LEN) // world for r in range(world + 1)]).tolist()
    expected = {}
    for causal in (False, True):
        mask = prefix_mask(np.arange(RING_LEN), RING_LEN) if causal else None
        expected[causal] = (reference_attention(q, k, v, mask=mask),
                            ring_misconceptions(q, k, v, sizes, causal))
    returncode, output = ring_launch.result(timeout=60)
    result = ring_launch.save_dir / f"ring_{world}.npz"
    tail = "\n".join(output.strip().splitlines()[-25:])
    assert result.exists(), (
        f"the ring of {world} processes wrote no result (launcher exit code {returncode}; a "
        f"rank waiting for a transfer that never came?). Its output ends with:\n{tail}"
    )
    with np.load(result, allow_pickle=False) as data:
        answers = {key: np.array(data[key], dtype=np.float64) if key in data.files else None
                   for key in ("out_full", "lse_full", "out_causal", "lse_causal")}
    for causal, key in ((False, "full"), (True, "causal")):
        (want_out, want_lse), wrong = expected[causal]
        what = f"torch.distributed ring of {world} ranks, causal={causal}"
        assert_close(answers[f"out_{key}"], want_out, what=f"{what} out",
                     wrong_answers={why: w[0] for why, w in wrong.items()})
        assert_close(answers[f"lse_{key}"], want_lse, what=f"{what} lse",
                     wrong_answers={why: w[1] for why, w in wrong.items()})
    assert returncode == 0, f"ring_dist.py exited with {returncode}:\n{tail}"


# ---- compiled for an H100 on the CPU: what the interpreter cannot see (grading's compile_check)
test_kernel_compiles_for_sm_90_with_ieee_dots_no_spills_and_64_bit_offsets = sm90_compile_test(
    __file__)  # None where bench/ is absent (the grader's copy): nothing to collect
