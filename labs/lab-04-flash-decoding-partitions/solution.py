"""Lab 04 solution: split-KV flash-decoding and ring attention with the attention monoid.

The state of attention over any set of keys fits in three numbers per query head:

    m   = max_j s_j                    (the running max of the scaled scores)
    l   = sum_j exp(s_j - m)           (the softmax denominator, relative to m)
    acc = sum_j exp(s_j - m) * v_j     (the UNNORMALISED weighted sum of values)

Two states over disjoint key sets merge exactly (rescale each side to the common max, add),
the merge is associative and commutative, and ``(-inf, 0, 0)`` is its identity. So the keys
can be cut into any partitions, computed anywhere (another SM, another GPU) and combined in
any order. ``finalize`` turns a state into ``out = acc / l`` and ``lse = m + log(l)``.

Shapes: a state's ``m`` and ``l`` have a leading shape ``S`` (``[H]`` for one decode query,
``[Lq, H]`` for a block of queries) and ``acc`` is ``[*S, dv]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from common.paged import blocks_needed
from common.triton_env import tl, triton

ORDERS = ("sequential", "reverse", "tree", "random")


class AttentionState(NamedTuple):
    """Attention over a set of keys, compressed: ``m [*S]``, ``l [*S]``, ``acc [*S, dv]``.

    ``acc`` is unnormalised (``sum exp(s - m) v``); the empty set is ``(-inf, 0, 0)``.
    """

    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray


# ---- the monoid ------------------------------------------------------------------------


def empty_state(num_heads: int | tuple[int, ...], head_dim: int) -> AttentionState:
    """The identity of ``merge``: ``m = -inf``, ``l = 0``, ``acc = 0``.

    Args:
        num_heads: ``H`` (a decode query), or a tuple of leading dims such as ``(Lq, H)``.
        head_dim: ``dv``, the value head dimension.
    """
    lead = (num_heads,) if isinstance(num_heads, int | np.integer) else tuple(num_heads)
    return AttentionState(
        m=np.full(lead, -np.inf),
        l=np.zeros(lead),
        acc=np.zeros((*lead, head_dim)),
    )


def _rescale(m_part: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``exp(m_part - m)``, and 0 where ``m_part = -inf`` (an empty side adds nothing).

    Without the guard, two empty sides give ``exp(-inf - (-inf)) = exp(nan)``.
    """
    safe_m = np.where(np.isneginf(m), 0.0, m)
    return np.where(np.isneginf(m_part), 0.0, np.exp(m_part - safe_m))


def merge(a: AttentionState, b: AttentionState) -> AttentionState:
    """The state of the union of two disjoint key sets. Exact, associative, commutative."""
    if a.acc.shape != b.acc.shape:
        raise ValueError(f"b has acc shape {b.acc.shape}, a has {a.acc.shape}: they must match")
    m = np.maximum(a.m, b.m)
    alpha, beta = _rescale(a.m, m), _rescale(b.m, m)  # bring both sides to the common max
    l = alpha * a.l + beta * b.l
    acc = alpha[..., None] * a.acc + beta[..., None] * b.acc
    return AttentionState(m, l, acc)


def finalize(state: AttentionState) -> tuple[np.ndarray, np.ndarray]:
    """``(out = acc / l, lse = m + log(l))``; an empty state gives ``(0, -inf)``."""
    empty = state.l == 0
    l_safe = np.where(empty, 1.0, state.l)
    out = state.acc / l_safe[..., None]
    lse = np.where(empty, -np.inf, state.m + np.log(l_safe))
    return out, lse


# ---- one partition, many partitions ----------------------------------------------------


def _check_decode_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim != 2:
        raise ValueError(f"q must be [num_heads, head_dim], got shape {q.shape}")
    if k.ndim != 3 or k.shape[2] != q.shape[1]:
        raise ValueError(f"k must be [n, num_kv_heads, {q.shape[1]}], got shape {k.shape}")
    if v.ndim != 3 or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v must be [{k.shape[0]}, {k.shape[1]}, dv], got shape {v.shape}")
    if k.shape[1] == 0 or q.shape[0] % k.shape[1] != 0:
        raise ValueError(
            f"num_heads={q.shape[0]} (q) must be a multiple of num_kv_heads={k.shape[1]} (k)"
        )


def _per_query_head(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``[n, KVH, d] -> [n, H, d]``: query head h reads KV head ``h // (H // KVH)``."""
    group = num_heads // x.shape[1]
    return np.repeat(x, group, axis=1)


def _state_from_scores(s: np.ndarray, v: np.ndarray) -> AttentionState:
    """State of scores ``s [..., H, n]`` (-inf = masked out) over values ``v [n, H, dv]``."""
    m = s.max(axis=-1, initial=-np.inf)
    p = np.exp(s - np.where(np.isneginf(m), 0.0, m)[..., None])  # exp(-inf) = 0 when masked
    l = p.sum(axis=-1)
    acc = np.einsum("...hn,nhd->...hd", p, v)
    return AttentionState(m, l, acc)


def partial_state(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None
) -> AttentionState:
    """The state of one decode query against one partition of keys.

    Args:
        q: ``[H, d]``; k: ``[n, KVH, d]``; v: ``[n, KVH, dv]`` (``n`` may be 0).

    Returns:
        ``AttentionState`` with ``m, l [H]`` and an unnormalised ``acc [H, dv]``;
        ``n = 0`` gives the identity.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    _check_decode_shapes(q, k, v)
    num_heads, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if k.shape[0] == 0:
        return empty_state(num_heads, v.shape[2])
    k_h, v_h = _per_query_head(k, num_heads), _per_query_head(v, num_heads)  # [n, H, d]
    s = np.einsum("hd,nhd->hn", q, k_h) * scale  # [H, n]
    return _state_from_scores(s, v_h)


def _partition_bounds(n: int, num_partitions: int) -> list[tuple[int, int]]:
    """Even cut of ``n`` keys; partitions past the last key are empty."""
    cuts = [(i * n) // num_partitions for i in range(num_partitions + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _tree_reduce(states: list[AttentionState]) -> AttentionState:
    """Pairwise rounds, as a GPU reduction does: depth ``ceil(log2 P)``."""
    while len(states) > 1:
        pairs = [merge(states[i], states[i + 1]) for i in range(0, len(states) - 1, 2)]
        states = pairs + ([states[-1]] if len(states) % 2 else [])
    return states[0]


def split_kv_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    num_partitions: int,
    scale: float | None = None,
    order: str = "sequential",
) -> tuple[np.ndarray, np.ndarray]:
    """Flash-decoding on the CPU: cut the keys, compute partials, merge in any order.

    Args:
        q: ``[H, d]`` one decode query; k: ``[n, KVH, d]``; v: ``[n, KVH, dv]``.
        num_partitions: ``P >= 1``; may exceed ``n`` (the extra partitions are empty).
        order: ``"sequential"`` (0, 1, 2, ...), ``"reverse"``, ``"tree"`` (pairwise rounds)
            or ``"random"`` (a shuffled fold). Partials are combined with ``merge``.

    Returns:
        ``(out [H, dv], lse [H])``, equal to dense attention whatever the order.
    """
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int | np.integer):
        raise ValueError(f"num_partitions must be an int >= 1, got {num_partitions!r}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    _check_decode_shapes(q, k, v)

    bounds = _partition_bounds(k.shape[0], int(num_partitions))
    partials = [partial_state(q, k[lo:hi], v[lo:hi], scale) for lo, hi in bounds]
    if order == "tree":
        return finalize(_tree_reduce(partials))
    if order == "reverse":
        partials = partials[::-1]
    elif order == "random":
        partials = [partials[i] for i in np.random.default_rng().permutation(len(partials))]
    state = partials[0]
    for part in partials[1:]:
        state = merge(state, part)
    return finalize(state)


def merge_attn_states(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Merge two NORMALISED partial outputs by their log-sum-exps (the serving form).

    This is what vLLM's ``merge_attn_states`` and FlashInfer's ``merge_state`` do: each side
    weighs ``exp(lse_side - lse)`` with ``lse = log(exp(lse_a) + exp(lse_b))``.

    Args:
        out_a, out_b: ``[*S, dv]`` (e.g. ``[num_tokens, H, dv]``); an empty side has out 0.
        lse_a, lse_b: ``[*S]`` natural-log LSEs; ``-inf`` marks an empty partition.

    Returns:
        ``(out [*S, dv], lse [*S])``; two empty sides give ``(0, -inf)``, never NaN.
    """
    out_a, out_b = np.asarray(out_a, dtype=np.float64), np.asarray(out_b, dtype=np.float64)
    lse_a, lse_b = np.asarray(lse_a, dtype=np.float64), np.asarray(lse_b, dtype=np.float64)
    if out_a.shape != out_b.shape:
        raise ValueError(f"out_b has shape {out_b.shape}, out_a has {out_a.shape}")
    if lse_a.shape != out_a.shape[:-1] or lse_b.shape != out_a.shape[:-1]:
        raise ValueError(
            f"lse_a {lse_a.shape} and lse_b {lse_b.shape} must be out's shape without the "
            f"last dim, {out_a.shape[:-1]}"
        )
    lse_max = np.maximum(lse_a, lse_b)
    w_a, w_b = _rescale(lse_a, lse_max), _rescale(lse_b, lse_max)  # in [0, 1]; empty side: 0
    total = w_a + w_b
    empty = total == 0  # both sides empty
    total = np.where(empty, 1.0, total)
    out = (w_a / total)[..., None] * out_a + (w_b / total)[..., None] * out_b
    lse = np.where(empty, -np.inf, lse_max + np.log(total))
    return out, lse


# ---- ring attention (context parallelism), simulated -----------------------------------


def ring_step(
    state: AttentionState,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_start: int,
    k_start: int,
    causal: bool = False,
    scale: float | None = None,
) -> AttentionState:
    """One device, one ring step: fold the K/V block in residence into its queries' state.

    Args:
        state: this device's running state, ``m, l [Lq, H]``, ``acc [Lq, H, dv]``.
        q: ``[Lq, H, d]`` this device's queries, at GLOBAL positions ``q_start + i``.
        k, v: ``[Lk, KVH, d]`` / ``[Lk, KVH, dv]``, the visiting block, at GLOBAL positions
            ``k_start + j``.
        causal: query at position p sees keys at positions ``<= p`` (global positions: the
            local index inside a shard means nothing once shards travel).

    Returns:
        ``merge(state, state of q against this block)``.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    num_heads, head_dim = q.shape[1], q.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    k_h, v_h = _per_query_head(k, num_heads), _per_query_head(v, num_heads)  # [Lk, H, d]
    s = np.einsum("qhd,khd->qhk", q, k_h) * scale  # [Lq, H, Lk]
    if causal:
        q_pos = q_start + np.arange(q.shape[0])
        k_pos = k_start + np.arange(k.shape[0])
        allowed = k_pos[None, :] <= q_pos[:, None]  # [Lq, Lk]
        s = np.where(allowed[:, None, :], s, -np.inf)
    return merge(state, _state_from_scores(s, v_h))


def ring_attention(
    q_shards: list[np.ndarray],
    k_shards: list[np.ndarray],
    v_shards: list[np.ndarray],
    causal: bool = False,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Ring attention over P simulated devices: Q stays, K/V shards travel around the ring.

    Device ``p`` holds the ``p``-th contiguous chunk of the sequence: ``q_shards[p]``
    ``[L_p, H, d]``, ``k_shards[p]`` ``[L_p, KVH, d]``, ``v_shards[p]`` ``[L_p, KVH, dv]``
    (``L_p`` may differ between devices; a shard starts at the sum of the lengths before it).
    At step ``t`` device ``p`` holds K/V shard ``(p - t) mod P``, runs ``ring_step`` on it,
    then passes it to device ``p + 1``. After P steps every device has seen every shard.

    Returns:
        ``(outs, lses)``: per device, ``outs[p] [L_p, H, dv]`` and ``lses[p] [L_p, H]``;
        concatenated they equal dense attention (causal: over global positions).
    """
    if not (len(q_shards) == len(k_shards) == len(v_shards)) or len(q_shards) == 0:
        raise ValueError(
            "q_shards, k_shards and v_shards must hold one shard per device: got "
            f"{len(q_shards)}, {len(k_shards)}, {len(v_shards)} shards"
        )
    q_shards = [np.asarray(x, dtype=np.float64) for x in q_shards]
    k_shards = [np.asarray(x, dtype=np.float64) for x in k_shards]
    v_shards = [np.asarray(x, dtype=np.float64) for x in v_shards]
    for p, (q, k, v) in enumerate(zip(q_shards, k_shards, v_shards)):
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or v.shape[:2] != k.shape[:2]:
            raise ValueError(
                f"shard {p}: q_shards[{p}] {q.shape}, k_shards[{p}] {k.shape}, v_shards[{p}] "
                f"{v.shape} must be [L, H, d], [L, KVH, d], [L, KVH, dv]"
            )
        if causal and q.shape[0] != k.shape[0]:
            raise ValueError(
                f"causal ring attention needs q_shards[{p}] and k_shards[{p}] to cover the same "
                f"tokens: lengths {q.shape[0]} and {k.shape[0]}"
            )
    world = len(q_shards)
    q_starts = np.concatenate([[0], np.cumsum([q.shape[0] for q in q_shards])])[:-1]
    k_starts = np.concatenate([[0], np.cumsum([k.shape[0] for k in k_shards])])[:-1]
    num_heads, dv = q_shards[0].shape[1], v_shards[0].shape[2]

    states = [empty_state((q.shape[0], num_heads), dv) for q in q_shards]
    resident = list(range(world))  # resident[p]: the K/V shard device p holds now
    for _step in range(world):
        for p in range(world):  # on real hardware the P devices run this loop in parallel
            src = resident[p]
            states[p] = ring_step(
                states[p], q_shards[p], k_shards[src], v_shards[src],
                int(q_starts[p]), int(k_starts[src]), causal,
            )
        resident = [resident[(p - 1) % world] for p in range(world)]  # pass to p + 1
    outs, lses = zip(*(finalize(s) for s in states))
    return list(outs), list(lses)


# ---- Triton: split-KV decode over a paged cache ----------------------------------------


@triton.jit
def _split_kv_partition_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    part_out_ptr, part_lse_ptr,
    scale,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ob, stride_oh, stride_op,
    stride_lb, stride_lh,
    PARTITION_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program = (sequence b, KV head, partition): the whole query group of that KV head
    against the partition's tokens, written as a normalised partial output plus its LSE."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start_pos = part * PARTITION_SIZE
    end_pos = tl.minimum(start_pos + PARTITION_SIZE, seq_len)

    rows = tl.arange(0, BLOCK_H)  # GQA packing: the group's query heads are the dot's M rows
    head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    q = tl.load(
        q_ptr + b * stride_qb + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0,
    )  # [BLOCK_H, BLOCK_D]

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for tile_start in range(start_pos, end_pos, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        valid = pos < end_pos  # never read past the partition or the sequence
        block = tl.load(block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
        block = block.to(tl.int64)
        slot = pos % BLOCK_SIZE
        k = tl.load(
            k_cache_ptr + block[:, None] * stride_kb + slot[:, None] * stride_kt
            + kv_head * stride_kh + dims[None, :],
            mask=valid[:, None] & (dims[None, :] < HEAD_DIM), other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_H, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: the tile has at least one valid token
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(
            v_cache_ptr + block[:, None] * stride_vb + slot[:, None] * stride_vt
            + kv_head * stride_vh + dims_v[None, :],
            mask=valid[:, None] & (dims_v[None, :] < HEAD_DIM_V), other=0.0,
        )  # [BLOCK_N, BLOCK_DV]
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    nonempty = l > 0  # a partition past the end of this sequence saw nothing
    out = acc / tl.where(nonempty, l, 1.0)[:, None]
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, l, 1.0)), float("-inf"))
    tl.store(
        part_out_ptr + b * stride_ob + head[:, None] * stride_oh + part * stride_op
        + dims_v[None, :],
        out, mask=row_ok[:, None] & (dims_v[None, :] < HEAD_DIM_V),
    )
    tl.store(part_lse_ptr + b * stride_lb + head * stride_lh + part, lse, mask=row_ok)


@triton.jit
def _merge_partitions_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr,
    num_partitions,
    stride_ob, stride_oh, stride_op,
    stride_lb, stride_lh,
    stride_fb, stride_fh,
    stride_sb,
    HEAD_DIM_V: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """One program = (sequence b, query head): merge its partitions' (out, lse) pairs."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    dims_v = tl.arange(0, BLOCK_DV)
    lse_base = part_lse_ptr + b * stride_lb + head * stride_lh
    out_base = part_out_ptr + b * stride_ob + head * stride_oh

    # pass 1: the max LSE over all partitions (lane-wise, then across lanes)
    m_lanes = tl.full([BLOCK_P], float("-inf"), tl.float32)
    for p0 in range(0, num_partitions, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        lse_p = tl.load(lse_base + parts, mask=parts < num_partitions, other=float("-inf"))
        m_lanes = tl.maximum(m_lanes, lse_p)
    m = tl.max(m_lanes, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every partition empty: weights stay 0

    # pass 2: weights exp(lse_p - m); empty partitions weigh exactly 0
    w_lanes = tl.zeros([BLOCK_P], tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for p0 in range(0, num_partitions, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        ok = parts < num_partitions
        lse_p = tl.load(lse_base + parts, mask=ok, other=float("-inf"))
        w = tl.where(lse_p == float("-inf"), 0.0, tl.exp(lse_p - m_safe))
        o = tl.load(
            out_base + parts[:, None] * stride_op + dims_v[None, :],
            mask=ok[:, None] & (dims_v[None, :] < HEAD_DIM_V), other=0.0,
        )  # [BLOCK_P, BLOCK_DV]
        acc += tl.sum(w[:, None] * o, 0)
        w_lanes += w
    total = tl.sum(w_lanes, 0)
    total_safe = tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + b * stride_fb + head * stride_fh + dims_v,
        acc / total_safe, mask=dims_v < HEAD_DIM_V,
    )
    tl.store(lse_ptr + b * stride_sb + head, tl.where(total > 0, m_safe + tl.log(total_safe),
                                                      float("-inf")))


def _check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, partition_size) -> int:
    """Validate the paged-decode inputs; returns the longest sequence length."""
    if isinstance(partition_size, bool) or not isinstance(partition_size, int) \
            or partition_size < 1:
        raise ValueError(f"partition_size must be an int >= 1, got {partition_size!r}")
    if q.ndim != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.ndim != 4 or v_cache.ndim != 4:
        raise ValueError(
            "k_cache and v_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} != q head_dim {head_dim}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(
            f"v_cache {tuple(v_cache.shape)} does not match k_cache {tuple(k_cache.shape)}"
        )
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}"
        )
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be [{batch}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if seq_lens.ndim != 1 or seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must be [{batch}], got {tuple(seq_lens.shape)}")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share a dtype (tl.dot needs equal operand types), got "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    # One copy of the lengths to the host (a single sync on a GPU, not one per min/max); the
    # grid needs the longest length anyway. A serving engine passes it from host metadata.
    lens = seq_lens.detach().cpu()
    if batch and int(lens.min()) < 0:
        raise ValueError(f"seq_lens must be >= 0, got {lens.tolist()}")
    max_seq_len = int(lens.max()) if batch else 0
    if blocks_needed(max_seq_len, k_cache.shape[1]) > block_tables.shape[1]:
        raise ValueError(
            f"block_tables has {block_tables.shape[1]} columns, too few for seq_len "
            f"{max_seq_len} with block_size {k_cache.shape[1]}"
        )
    return max_seq_len


def split_kv_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    partition_size: int = 512,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV (flash-decoding) paged decode: a partition kernel, then a merge kernel.

    Args:
        q: ``[B, H, d]`` one new token per sequence.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]`` / ``[..., dv]`` (NHD layout).
        block_tables: ``[B, max_blocks]`` int32; entries past a sequence's last block are
            never read. seq_lens: ``[B]`` int32 (0 allowed).
        partition_size: tokens per partition, any int >= 1 (vLLM uses 512, a multiple of its
            block size, so no block straddles two partitions; this kernel gathers token by
            token, so it needs no such rule). Larger than the sequence = one partition.

    Returns:
        ``(out [B, H, dv] in q.dtype, lse [B, H] float32)``.
    """
    max_seq_len = _check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, partition_size)
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, head_dim_v = v_cache.shape
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    num_partitions = max(1, triton.cdiv(max_seq_len, partition_size))
    # The kernels index the last dimension with stride 1. Copy only when that is not so:
    # .contiguous() on a strided view of a whole KV cache would copy gigabytes every step.
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    block_tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()

    device = q.device
    part_out = torch.empty(batch, num_heads, num_partitions, head_dim_v, device=device,
                           dtype=torch.float32)
    part_lse = torch.empty(batch, num_heads, num_partitions, device=device, dtype=torch.float32)
    out = torch.empty(batch, num_heads, head_dim_v, device=device, dtype=q.dtype)
    lse = torch.empty(batch, num_heads, device=device, dtype=torch.float32)
    if batch == 0:
        return out, lse

    block_n = max(16, min(64, triton.next_power_of_2(partition_size)))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _split_kv_partition_kernel[(batch, num_kv_heads, num_partitions)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse, scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        PARTITION_SIZE=partition_size, BLOCK_SIZE=block_size, GROUP=group,
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_DV=max(16, triton.next_power_of_2(head_dim_v)),
        BLOCK_N=block_n, DOT_PRECISION=precision,
        num_warps=4, num_stages=2,
    )
    _merge_partitions_kernel[(batch, num_heads)](
        part_out, part_lse, out, lse, num_partitions,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        HEAD_DIM_V=head_dim_v, BLOCK_P=min(64, triton.next_power_of_2(num_partitions)),
        BLOCK_DV=max(16, triton.next_power_of_2(head_dim_v)),
        num_warps=4,
    )
    return out, lse
