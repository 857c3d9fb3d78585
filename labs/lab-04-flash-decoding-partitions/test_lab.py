"""Lab 04 spec: the attention monoid, split-KV flash-decoding and ring attention.

Run against the solution:   pytest labs/lab-04-flash-decoding-partitions -q
Grade your starter.py:      LAB_IMPL=starter pytest labs/lab-04-flash-decoding-partitions -q

Every expected value comes from ``common.reference`` (float64 dense attention); the wrong
answers that name a misconception are computed from the same reference.
"""

from __future__ import annotations

import math
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from common.loader import load_impl
from common.paged import build_paged_kv, random_kv
from common.reference import kv_head_for, prefix_mask, reference_attention
from common.testing import NAN_HINT, assert_close, head_counts, tolerance
from common.triton_env import DEVICE

impl = load_impl(__file__)
LAB_DIR = pathlib.Path(__file__).resolve().parent
ORDERS = ("sequential", "reverse", "tree", "random")
# Hypothesis without its "explain" phase: on a failing starter it only adds minutes of noise.
QUICK_FAIL = settings(phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])

NEVER_NORMALISE = (
    "never normalise a partial: a partition's state keeps acc = sum exp(s - m) v "
    "UNNORMALISED (dividing by l happens once, in finalize, after the last merge)"
)
NO_RESCALE = (
    "the merge forgot to rescale: each side must be multiplied by exp(m_side - m), "
    "m = max(m_a, m_b), before l and acc are added"
)
LSE_WITHOUT_MAX = (
    "the LSE is missing the max: lse = m + log(l); log(l) alone is the log-sum-exp "
    "relative to the running max m"
)
IDENTITY_NAN = (
    "merging the identity produced NaN: with m_a = m_b = -inf, exp(m_a - m) is "
    "exp(-inf - (-inf)) = exp(NaN). An empty side (m = -inf) must get scale 0"
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


# ---- helpers: problems and expected values from the reference -------------------------


def decode_problem(seed: int, n: int, num_heads: int, num_kv_heads: int, d: int = 8):
    """One decode query ``q [H, d]`` and ``n`` keys/values ``[n, KVH, d]``."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((num_heads, d))
    k = rng.standard_normal((n, num_kv_heads, d))
    v = rng.standard_normal((n, num_kv_heads, d))
    return q, k, v


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


def check_state(actual, m, l, acc, what, nan_hint=None):
    """Compare a state's three fields with the expected ones."""
    assert isinstance(actual, tuple) and len(actual) == 3, (
        f"{what} must be an AttentionState(m, l, acc), got {type(actual).__name__}"
    )
    kwargs = {"nan_hint": nan_hint} if nan_hint else {}
    assert_close(actual.m, m, what=f"{what}.m (the max score)", **kwargs)
    assert_close(actual.l, l, what=f"{what}.l (the denominator relative to m)", **kwargs)
    assert_close(actual.acc, acc, what=f"{what}.acc", wrong_answers={
        NEVER_NORMALISE: acc / np.where(l == 0, 1.0, l)[..., None]}, **kwargs)


# ---- hypothesis strategies -------------------------------------------------------------

STATE_HEADS, STATE_DV = 3, 2


@st.composite
def attention_states(draw):
    """Random valid states over [3] heads; a head is empty (m = -inf, l = 0, acc = 0) at times."""
    finite = {"allow_nan": False, "allow_infinity": False}
    m, l, acc = [], [], []
    for _ in range(STATE_HEADS):
        if draw(st.integers(0, 3)) == 0:
            m.append(-np.inf), l.append(0.0), acc.append([0.0] * STATE_DV)
        else:
            m.append(draw(st.floats(-30, 30, **finite)))
            l.append(draw(st.floats(1, 40, **finite)))
            acc.append([draw(st.floats(-40, 40, **finite)) for _ in range(STATE_DV)])
    return impl.AttentionState(np.array(m), np.array(l), np.array(acc))


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


def reduce_tree(tree, leaves):
    if isinstance(tree, int):
        return leaves[tree]
    return impl.merge(reduce_tree(tree[0], leaves), reduce_tree(tree[1], leaves))


# ---- the monoid ------------------------------------------------------------------------


@pytest.mark.points(1)
def test_empty_state_is_minus_inf_zero_zero_with_the_right_shapes():
    state = impl.empty_state(3, 5)
    check_state(state, np.full(3, -np.inf), np.zeros(3), np.zeros((3, 5)), "empty_state(3, 5)")


@pytest.mark.points(1)
def test_partial_state_of_no_keys_is_the_identity():
    q, k, v = decode_problem(0, 0, 4, 2)
    check_state(impl.partial_state(q, k, v), np.full(4, -np.inf), np.zeros(4), np.zeros((4, 8)),
                "partial_state over 0 keys")


@pytest.mark.points(2)
@QUICK_FAIL
@given(n=st.integers(1, 12), heads=head_counts(max_heads=4), seed=st.integers(0, 2**16))
def test_partial_state_holds_the_max_the_denominator_and_an_unnormalised_accumulator(
    n, heads, seed
):
    q, k, v = decode_problem(seed, n, *heads)
    m, l, acc = expected_state(q, k, v)
    check_state(impl.partial_state(q, k, v), m, l, acc, "partial_state")


@pytest.mark.points(2)
@QUICK_FAIL
@given(a=attention_states(), b=attention_states(), c=attention_states())
def test_merge_is_associative(a, b, c):
    left = impl.merge(impl.merge(a, b), c)
    right = impl.merge(a, impl.merge(b, c))
    check_state(left, right.m, right.l, right.acc, "merge(merge(a, b), c) vs merge(a, merge(b, c))",
                nan_hint=IDENTITY_NAN)


@pytest.mark.points(1)
@QUICK_FAIL
@given(a=attention_states(), b=attention_states())
def test_merge_is_commutative(a, b):
    ab, ba = impl.merge(a, b), impl.merge(b, a)
    check_state(ab, ba.m, ba.l, ba.acc, "merge(a, b) vs merge(b, a)", nan_hint=IDENTITY_NAN)


@pytest.mark.points(2)
@QUICK_FAIL
@given(a=attention_states())
def test_empty_state_is_the_identity_of_merge(a):
    e = impl.empty_state(STATE_HEADS, STATE_DV)
    check_state(impl.merge(a, e), a.m, a.l, a.acc, "merge(a, empty)", nan_hint=IDENTITY_NAN)
    check_state(impl.merge(e, a), a.m, a.l, a.acc, "merge(empty, a)", nan_hint=IDENTITY_NAN)


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
    m = np.array([0.5, -np.inf, 3.0, -2.0])
    l = np.array([2.0, 0.0, 1.5, 7.0])
    acc = np.array([[1.0, -2.0], [0.0, 0.0], [3.0, 0.75], [-7.0, 14.0]])
    out, lse = impl.finalize(impl.AttentionState(m, l, acc))
    want_out = np.array([[0.5, -1.0], [0.0, 0.0], [2.0, 0.5], [-1.0, 2.0]])
    with np.errstate(divide="ignore"):
        want_lse = np.where(l == 0, -np.inf, m + np.log(l))
        assert_close(lse, want_lse, what="finalize lse", wrong_answers={
            LSE_WITHOUT_MAX: np.where(l == 0, -np.inf, np.log(l))})
    assert_close(out, want_out, what="finalize out", hint="out = acc / l; an empty state gives 0")


@pytest.mark.points(2)
@QUICK_FAIL
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
@QUICK_FAIL
@given(data=st.data())
def test_any_merge_tree_over_any_partitioning_equals_dense_attention(data):
    heads = data.draw(head_counts(max_heads=4), label="heads")
    sizes = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=7), label="partition sizes")
    tree = data.draw(merge_trees(len(sizes)), label="merge tree")
    q, k, v = decode_problem(data.draw(st.integers(0, 2**16), label="seed"), sum(sizes), *heads)
    bounds = bounds_of(sizes)
    leaves = [impl.partial_state(q, k[lo:hi], v[lo:hi]) for lo, hi in bounds]
    out, lse = impl.finalize(reduce_tree(tree, leaves))
    want_out, want_lse = dense(q, k, v)
    assert_close(out, want_out, what=f"out after merging partitions {sizes} as {tree}",
                 wrong_answers=chunk_misconceptions(q, k, v, bounds), nan_hint=IDENTITY_NAN)
    with np.errstate(invalid="ignore"):
        assert_close(lse, want_lse, what=f"lse after merging partitions {sizes} as {tree}",
                     wrong_answers={LSE_WITHOUT_MAX: want_lse - score_max(q, k)},
                     nan_hint=IDENTITY_NAN)


# ---- split-KV attention ----------------------------------------------------------------


@pytest.mark.points(3)
@QUICK_FAIL
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
    assert_close(out, want_out, what=f"{what} out", nan_hint=IDENTITY_NAN)
    with np.errstate(invalid="ignore"):
        assert_close(lse, want_lse, what=f"{what} lse", nan_hint=IDENTITY_NAN,
                     wrong_answers={LSE_WITHOUT_MAX: want_lse - score_max(q, k)})


@pytest.mark.points(1)
def test_split_kv_attention_respects_an_explicit_scale():
    q, k, v = decode_problem(3, 9, 4, 1)
    out, lse = impl.split_kv_attention(q, k, v, 3, scale=0.3)
    want_out, want_lse = reference_attention(q[None], k, v, scale=0.3)
    assert_close(out, want_out[0], what="out with scale=0.3",
                 hint="scores are q·k * scale; the default scale is 1/sqrt(d)")
    assert_close(lse, want_lse[0], what="lse with scale=0.3")


@pytest.mark.points(1)
def test_tree_order_merges_partials_pairwise_in_log_depth(monkeypatch):
    depth, keep = {}, []
    real_merge = impl.merge

    def recording_merge(a, b):
        out = real_merge(a, b)
        keep.extend([a, b, out])  # keep ids unique while we look
        depth[id(out)] = 1 + max(depth.get(id(a), 0), depth.get(id(b), 0))
        return out

    monkeypatch.setattr(impl, "merge", recording_merge)
    q, k, v = decode_problem(4, 16, 2, 2)
    for order, bound in (("tree", math.ceil(math.log2(8)) + 1), ("sequential", None)):
        depth.clear()
        impl.split_kv_attention(q, k, v, 8, order=order)
        assert depth, "split_kv_attention must combine its partials with merge() (none was called)"
        deepest = max(depth.values())
        if bound is not None:
            assert deepest <= bound, (
                f"order='tree' built a merge chain {deepest} deep for 8 partitions: a tree "
                "reduction merges pairs, then pairs of pairs (depth log2(8) = 3)"
            )
        else:
            assert deepest >= 7, (
                f"order='sequential' should fold one partition at a time: depth {deepest}"
            )


# ---- the serving form: merge_attn_states -----------------------------------------------


def token_problem(seed: int, tokens: int = 3, n: int = 10, heads=(4, 2), d: int = 8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((tokens, heads[0], d))
    k = rng.standard_normal((n, heads[1], d))
    v = rng.standard_normal((n, heads[1], d))
    return q, k, v


@pytest.mark.points(2)
@QUICK_FAIL
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


@pytest.mark.points(2)
@QUICK_FAIL
@given(empty_a=st.lists(st.booleans(), min_size=4, max_size=4),
       empty_b=st.lists(st.booleans(), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_merge_attn_states_with_minus_inf_lse_gives_no_nan(empty_a, empty_b, seed):
    q, k, v = token_problem(seed, tokens=2)
    out_a, lse_a = reference_attention(q, k[:4], v[:4])
    out_b, lse_b = reference_attention(q, k[4:], v[4:])
    ea, eb = np.array(empty_a), np.array(empty_b)  # per head: this side's partition is empty
    out_a[:, ea], lse_a[:, ea] = 0.0, -np.inf
    out_b[:, eb], lse_b[:, eb] = 0.0, -np.inf
    out, lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    m = np.maximum(lse_a, lse_b)
    with np.errstate(invalid="ignore"):
        both = np.isneginf(m)
        w_a = np.where(np.isneginf(lse_a), 0.0, np.exp(lse_a - np.where(both, 0.0, m)))
        w_b = np.where(np.isneginf(lse_b), 0.0, np.exp(lse_b - np.where(both, 0.0, m)))
        total = np.where(both, 1.0, w_a + w_b)
        want_lse = np.where(both, -np.inf, m + np.log(total))
    want_out = (w_a / total)[..., None] * out_a + (w_b / total)[..., None] * out_b
    hint = ("an empty partition has lse = -inf and out = 0: its weight is 0, and two empty "
            "sides give out 0, lse -inf; exp(-inf - (-inf)) is NaN, so guard it")
    assert_close(out, want_out, what="merge_attn_states out with empty partitions",
                 nan_hint=hint)
    assert_close(lse, want_lse, what="merge_attn_states lse with empty partitions",
                 nan_hint=hint)


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
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    shard = [slice(lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:])]
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
    mask = prefix_mask(np.arange(L), L) if causal else None
    want_out, want_lse = reference_attention(q, k, v, mask=mask)
    wrong = ring_misconceptions(q, k, v, sizes, causal)
    what = f"ring attention ({len(sizes)} devices, shard sizes {sizes}, causal={causal})"
    assert_close(np.concatenate(outs), want_out, what=f"{what} out",
                 wrong_answers={why: w[0] for why, w in wrong.items()}, nan_hint=IDENTITY_NAN)
    assert_close(np.concatenate(lses), want_lse, what=f"{what} lse",
                 wrong_answers={why: w[1] for why, w in wrong.items()}, nan_hint=IDENTITY_NAN)


@pytest.mark.points(3)
@QUICK_FAIL
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


BAD_INPUTS = {
    "num_partitions=0": (lambda: impl.split_kv_attention(*decode_problem(0, 6, 2, 1), 0),
                         "num_partitions"),
    "num_partitions=-3": (lambda: impl.split_kv_attention(*decode_problem(0, 6, 2, 1), -3),
                          "num_partitions"),
    "unknown order": (lambda: impl.split_kv_attention(*decode_problem(0, 6, 2, 1), 2,
                                                      order="zigzag"), "order"),
    "fewer k shards than q shards": (lambda: impl.ring_attention(*_shards([3, 2, 3])), "k_shards"),
    "more v shards than q shards": (lambda: impl.ring_attention(*_shards([2, 2, 3])), "v_shards"),
}


@pytest.mark.points(1)
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_value_error_naming_the_argument(case):
    call, name = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=name):
        call()


# ---- Triton: partition kernel + merge kernel over a paged cache ------------------------


def paged_problem(seq_lens, partition_size=16, heads=(4, 2), d=16, block_size=8, seed=0):
    """A NaN-poisoned paged cache. Padding entries of the block table name poisoned blocks, and
    there are enough of them that even a partition read to its full size stays inside the
    table: a kernel that reads past seq_len sees NaN (with -1 entries it would read wild
    memory and could crash the interpreter)."""
    rng = np.random.default_rng(seed)
    ks, vs = random_kv(rng, seq_lens, heads[1], d)
    # keys grow along the sequence, so the running max rises tile after tile (every tile of a
    # partition must rescale what came before)
    ks = [k * (1 + np.arange(len(k)) / 32)[:, None, None] for k in ks]
    longest = max(seq_lens)
    padded_end = -(-longest // partition_size) * partition_size  # end of the last partition
    extra = -(-padded_end // block_size) - (-(-longest // block_size)) + 1
    paged = build_paged_kv(ks, vs, block_size, rng=rng, padding="poisoned",
                           extra_table_entries=extra)
    q = rng.standard_normal((len(seq_lens), heads[0], d))
    return q, ks, vs, paged


def paged_misconceptions(q, ks, vs, partition_size):
    """Wrong answers computed from the reference, partition by partition."""
    H, KVH = q.shape[1], ks[0].shape[1]
    num_partitions = max(1, -(-max(len(k) for k in ks) // partition_size))
    gqa, avg_seen, avg_all, unnormalised = [], [], [], []
    for b, (k, v) in enumerate(zip(ks, vs)):
        per_head = [reference_attention(q[b, h][None, None], k[:, [h % KVH]], v[:, [h % KVH]])[0]
                    for h in range(H)]
        gqa.append(np.concatenate([o[0] for o in per_head]))
        zero = np.zeros((H, v.shape[2]))
        parts = [(lo, lo + partition_size) for lo in range(0, len(k), partition_size)]
        outs = [dense(q[b], k[lo:hi], v[lo:hi])[0] for lo, hi in parts]
        avg_seen.append(np.mean(outs, axis=0) if outs else zero)
        avg_all.append(np.sum(outs, axis=0) / num_partitions if outs else zero)
        if not parts:
            unnormalised.append(zero)
            continue
        states = [expected_state(q[b], k[lo:hi], v[lo:hi]) for lo, hi in parts]
        lses = np.stack([m + np.log(l) for m, l, _ in states])  # [P, H]
        w = np.exp(lses - lses.max(axis=0))
        unnormalised.append(sum(w_p[:, None] * acc for w_p, (_, _, acc) in zip(w, states))
                            / w.sum(axis=0)[:, None])
    averaged = "the merge kernel averaged the partitions: weigh each by exp(lse_p - lse)"
    return {
        "query head h read KV head h % num_kv_heads; GQA maps it to h // (H // KVH)":
            np.stack(gqa),
        averaged: np.stack(avg_seen),
        averaged + " (empty partitions counted too)": np.stack(avg_all),
        "the partition kernel stored acc unnormalised: in the serving form (out, lse) a "
        "partial output is acc / l; the merge weighs it by exp(lse_p - lse)":
            np.stack(unnormalised),
    }


TRITON_NAN_HINT = NAN_HINT + (
    " In the merge kernel: a sequence with 0 tokens has lse = -inf in every partition, and "
    "exp(-inf - (-inf)) is NaN; such partitions must weigh 0."
)


@pytest.mark.triton
@pytest.mark.points(2)
@pytest.mark.parametrize(("partition_size", "seq_lens"), [
    pytest.param(5, [37, 0, 20], id="tiny partitions of 5, an empty sequence"),
    pytest.param(16, [37, 0, 20], id="partitions of 16"),
    pytest.param(100, [150, 0, 37], id="partitions of 100 spanning two K/V tiles"),
    pytest.param(256, [150, 9], id="one partition larger than every sequence"),
])
def test_split_kv_decode_triton_matches_the_reference_for_several_partition_sizes(
    partition_size, seq_lens
):
    q, ks, vs, paged = paged_problem(seq_lens, partition_size)
    cache = paged.to_torch(torch.float32, DEVICE)
    out, lse = impl.split_kv_decode_triton(
        torch.tensor(q, dtype=torch.float32, device=DEVICE), cache["k_cache"], cache["v_cache"],
        cache["block_tables"], cache["seq_lens"], partition_size=partition_size,
    )
    results = [reference_attention(q[b][None], ks[b], vs[b]) for b in range(len(seq_lens))]
    want_out = np.stack([o[0] for o, _ in results])
    want_lse = np.stack([s[0] for _, s in results])
    atol, rtol = tolerance("float32")
    what = f"split_kv_decode_triton (partition_size={partition_size}, seq_lens={seq_lens})"
    assert_close(out, want_out, what=f"{what} out", atol=atol, rtol=rtol,
                 wrong_answers=paged_misconceptions(q, ks, vs, partition_size),
                 nan_hint=TRITON_NAN_HINT)
    assert_close(lse, want_lse, what=f"{what} lse", atol=atol, rtol=rtol,
                 nan_hint=TRITON_NAN_HINT)


@pytest.mark.triton
@pytest.mark.points(1)
@pytest.mark.parametrize("case", ["partition_size=0", "block table too short"])
def test_split_kv_decode_triton_rejects_bad_input_naming_the_argument(case):
    q, ks, vs, paged = paged_problem([12, 3], 16)
    cache = paged.to_torch(torch.float32, DEVICE)
    qt = torch.tensor(q, dtype=torch.float32, device=DEVICE)
    if case == "partition_size=0":
        args, name = (qt, cache["k_cache"], cache["v_cache"], cache["block_tables"],
                      cache["seq_lens"], 0), "partition_size"
    else:
        args, name = (qt, cache["k_cache"], cache["v_cache"], cache["block_tables"][:, :1],
                      cache["seq_lens"], 16), "block_tables"
    with pytest.raises(ValueError, match=name):
        impl.split_kv_decode_triton(*args)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.points(2)
def test_split_kv_decode_triton_at_batch_1_with_32k_tokens_in_bf16_on_the_gpu():
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
    out, lse = impl.split_kv_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, 512)

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


class RingLaunch:
    """``ring_dist.py --local 2 4``: rings of 2 and 4 CPU processes (gloo on 127.0.0.1)."""

    def __init__(self, save_dir: pathlib.Path):
        self.save_dir = save_dir
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(LAB_DIR.parents[1]))
        env.pop("RANK", None)
        cmd = [sys.executable, str(LAB_DIR / "ring_dist.py"), "--local", "2", "4",
               "--save-dir", str(save_dir), "--timeout", "30"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.output: str | None = None

    def result(self, timeout: float = 60) -> tuple[pathlib.Path, int | None, str]:
        if self.output is None:
            try:
                self.output, _ = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.output = (f"ring_dist.py did not finish in {timeout:.0f} s "
                               "(a rank waiting for a transfer that never came?)")
            finally:
                self.stop()
        return self.save_dir, self.proc.returncode, self.output

    def stop(self) -> None:
        """Kill the launcher's process group (it and every rank it forked), if any is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # everyone already exited
        self.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def ring_launch(request, tmp_path_factory):
    """Start the distributed rings when this module starts, if a distributed test is
    selected: their Python start-up then runs on the second core while the other tests run.
    Whatever happens, no process of ours outlives the module."""
    wanted = any(getattr(item, "originalname", "") == DISTRIBUTED_TEST
                 for item in request.session.items)
    launch = RingLaunch(tmp_path_factory.mktemp("ring")) if wanted else None
    yield launch
    if launch is not None:
        launch.stop()


@pytest.mark.points(2)
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_on_torch_distributed_equals_dense_attention(ring_launch, world):
    save_dir, returncode, output = ring_launch.result()
    result = save_dir / f"ring_{world}.npz"
    tail = "\n".join(output.strip().splitlines()[-25:])
    assert result.exists(), (
        f"the ring of {world} processes wrote no result (launcher exit code {returncode}). "
        f"Its output ends with:\n{tail}"
    )
    data = np.load(result)
    q, k, v = data["q"], data["k"], data["v"]
    L = q.shape[0]
    sizes = np.diff([(r * L) // world for r in range(world + 1)]).tolist()
    for causal, key in ((False, "full"), (True, "causal")):
        mask = prefix_mask(np.arange(L), L) if causal else None
        want_out, want_lse = reference_attention(q, k, v, mask=mask)
        wrong = ring_misconceptions(q, k, v, sizes, causal)
        what = f"torch.distributed ring of {world} ranks, causal={causal}"
        assert_close(data[f"out_{key}"], want_out, what=f"{what} out",
                     wrong_answers={why: w[0] for why, w in wrong.items()})
        assert_close(data[f"lse_{key}"], want_lse, what=f"{what} lse",
                     wrong_answers={why: w[1] for why, w in wrong.items()})
    assert returncode == 0, f"ring_dist.py exited with {returncode}:\n{tail}"
