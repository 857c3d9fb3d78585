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

import numpy as np
import torch

from common.loader import load_lab_module
from common.triton_env import LOG2E, dot_precision, dot_tile, log2e_scale, tile_config, tl, triton

provided = load_lab_module(__file__, "provided")
AttentionState = provided.AttentionState
ORDERS = provided.ORDERS


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
    provided.check_decode_shapes(q, k, v)
    num_heads, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if k.shape[0] == 0:
        return empty_state(num_heads, v.shape[2])
    k_h, v_h = _per_query_head(k, num_heads), _per_query_head(v, num_heads)  # [n, H, d]
    s = np.einsum("hd,nhd->hn", q, k_h) * scale  # [H, n]
    return _state_from_scores(s, v_h)


def _partition_bounds(n: int, num_partitions: int) -> list[tuple[int, int]]:
    """Even cut of ``n`` keys (sizes differ by at most 1); past ``n`` partitions are empty."""
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
        order: ``"sequential"`` (0, 1, 2, ...), ``"reverse"``, ``"tree"`` (pairwise rounds:
            ``(P0 + P1) + (P2 + P3)``) or ``"random"`` (a shuffled fold). Partials are
            combined with ``merge``.

    Returns:
        ``(out [H, dv], lse [H])``, equal to dense attention whatever the order.

    Raises:
        ValueError: naming ``num_partitions`` (< 1) or ``order`` (not in ``ORDERS``).
    """
    num_partitions = provided.check_count(num_partitions, "num_partitions")
    provided.check_order(order)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    provided.check_decode_shapes(q, k, v)

    bounds = _partition_bounds(k.shape[0], num_partitions)
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

    Each side weighs ``exp(lse_side - lse)`` with ``lse = log(exp(lse_a) + exp(lse_b))``,
    computed relative to ``max(lse_a, lse_b)`` so nothing overflows (the operation of vLLM's
    ``merge_attn_states`` and FlashInfer's ``merge_state``).

    Args:
        out_a, out_b: ``[*S, dv]`` (e.g. ``[num_tokens, H, dv]``).
        lse_a, lse_b: ``[*S]`` natural-log LSEs. ``-inf`` and ``+inf`` both mark an empty
            partition (FlashAttention-2 returns ``+inf`` for a row with no keys); an empty
            side's ``out`` is ignored.

    Returns:
        ``(out [*S, dv], lse [*S])``; two empty sides give ``(0, -inf)``, never NaN.
    """
    out_a, lse_a, out_b, lse_b = provided.check_merge_inputs(out_a, lse_a, out_b, lse_b)
    lse_a = np.where(np.isposinf(lse_a), -np.inf, lse_a)  # FlashAttention-2's "no keys"
    lse_b = np.where(np.isposinf(lse_b), -np.inf, lse_b)
    lse_max = np.maximum(lse_a, lse_b)
    w_a, w_b = _rescale(lse_a, lse_max), _rescale(lse_b, lse_max)  # in [0, 1]; empty side: 0
    total = w_a + w_b
    empty = total == 0  # both sides empty
    total = np.where(empty, 1.0, total)
    out = _weighted(w_a / total, out_a) + _weighted(w_b / total, out_b)
    lse = np.where(empty, -np.inf, lse_max + np.log(total))
    return out, lse


def _weighted(w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``w * out``, and 0 where ``w = 0``: an empty side's ``out`` may hold anything."""
    return np.where(w[..., None] > 0, w[..., None] * out, 0.0)


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

    ``ring_dist.py`` (the torch.distributed version) calls this function for every step.

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

    Raises:
        ValueError: naming ``q_shards``/``k_shards``/``v_shards`` when the lists differ in
        length (one shard per device) or are empty.
    """
    q_shards, k_shards, v_shards = provided.check_ring_shards(q_shards, k_shards, v_shards, causal)
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
    qk_scale, num_splits,
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ob, stride_oh, stride_op,
    stride_lb, stride_lh,
    PARTITION_SIZE: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, LOG2E: tl.constexpr,
):
    """One program = (sequence b, split, KV head): the whole query group of that KV head
    against one split of sequence b's tokens, stored in the serving form: the normalised
    partial output ``part_out[b, h, split] [dv]`` and its natural-log LSE
    ``part_lse[b, h, split]`` (float32), for each query head h of the group.
    """
    b = (tl.program_id(0) // num_splits).to(tl.int64)  # 1. grid x folds (sequence, split)
    split = tl.program_id(0) % num_splits
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    if NUM_SEGMENTS > 0:  # 2. vLLM's fixed grid: NUM_SEGMENTS segments of whole K/V tiles
        tiles = (seq_len + NUM_SEGMENTS * BLOCK_N - 1) // (NUM_SEGMENTS * BLOCK_N)
        split_len = tiles * BLOCK_N
    else:
        split_len = PARTITION_SIZE
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, BLOCK_H)  # 3. GQA packing: the group's heads are the dot's M rows
    head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    if start >= seq_len:  # nothing to attend to: the merge gives this split weight 0
        tl.store(part_lse_ptr + b * stride_lb + head * stride_lh + split, float("-inf"),
                 mask=row_ok)
        return
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    d_ok, dv_ok = dims < HEAD_DIM, dims_v < HEAD_DIM_V  # the pad of head dims like 80 or 96
    q = tl.load(
        q_ptr + b * stride_qb + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & d_ok[None, :], other=0.0,
    )  # [BLOCK_H, BLOCK_D]
    k_head = k_cache_ptr + kv_head * stride_kh + dims[None, :]  # this KV head, any token
    v_head = v_cache_ptr + kv_head * stride_vh + dims_v[None, :]

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # 4. log2 units
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        valid = pos < end  # never read past the split or the sequence
        block = tl.load(block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0)
        block = block.to(tl.int64)  # block * stride overflows int32 in a large cache
        slot = pos % BLOCK_SIZE
        k = tl.load(k_head + block[:, None] * stride_kb + slot[:, None] * stride_kt,
                    mask=valid[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: the tile has at least one valid token
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_head + block[:, None] * stride_vb + slot[:, None] * stride_vt,
                    mask=valid[:, None] & dv_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_DV]
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    out = acc / l[:, None]  # 5. l >= 1: the split holds at least one token
    lse = (m + tl.log2(l)) / LOG2E  # back from log2 units to the natural log
    tl.store(
        part_out_ptr + b * stride_ob + head[:, None] * stride_oh + split * stride_op
        + dims_v[None, :],
        out, mask=row_ok[:, None] & dv_ok[None, :],
    )
    tl.store(part_lse_ptr + b * stride_lb + head * stride_lh + split, lse, mask=row_ok)


@triton.jit
def _merge_partitions_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr,
    num_partitions,
    stride_ob, stride_oh, stride_op,
    stride_lb, stride_lh,
    stride_fb, stride_fh,
    stride_sb, stride_sh,
    HEAD_DIM_V: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr,
    LOG2E: tl.constexpr,
):
    """One program = (sequence b, query head): merge ``num_partitions`` serving-form
    partials ``part_out[b, head, p] [dv]``, ``part_lse[b, head, p]`` into ``out[b, head]``
    and ``lse[b, head]``, ``BLOCK_P`` partitions at a time (any count: 16 segments or 129
    partitions alike). An lse of -inf or +inf marks an empty partition: weight 0, and its
    output is never read (it may hold anything, NaN included).

    Steps:
    1. Pass 1: ``m``, the largest lse over all partitions (+inf counts as -inf): loop
       ``p0 = 0, BLOCK_P, ...`` with masked loads (``other=-inf``), keep a lane-wise max,
       then reduce it.
    2. Pass 2: weights ``w_p = exp(lse_p - m)`` (as ``exp2((lse_p - m) * LOG2E)``), in
       [0, 1], and exactly 0 for an empty partition; ``acc += sum_p w_p * out_p`` without
       multiplying an empty partition's output (0 * NaN is NaN); ``total += sum_p w_p``.
    3. Store ``out = acc / total`` and ``lse = m + log(total)``; when every partition is
       empty, out 0 and lse -inf, never NaN.
    """
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dims_v = tl.arange(0, BLOCK_DV)
    lse_base = part_lse_ptr + b * stride_lb + head * stride_lh
    out_base = part_out_ptr + b * stride_ob + head * stride_oh

    # 1. the largest LSE over all partitions (lane-wise, then across lanes)
    m_lanes = tl.full([BLOCK_P], float("-inf"), tl.float32)
    for p0 in range(0, num_partitions, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        lse_p = tl.load(lse_base + parts, mask=parts < num_partitions, other=float("-inf"))
        lse_p = tl.where(lse_p == float("inf"), float("-inf"), lse_p)  # FA2's empty row
        m_lanes = tl.maximum(m_lanes, lse_p)
    m = tl.max(m_lanes, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every partition empty: weights stay 0

    # 2. weights exp(lse_p - m) in [0, 1]; empty partitions weigh exactly 0
    w_lanes = tl.zeros([BLOCK_P], tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for p0 in range(0, num_partitions, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        ok = parts < num_partitions
        lse_p = tl.load(lse_base + parts, mask=ok, other=float("-inf"))
        empty = (lse_p == float("-inf")) | (lse_p == float("inf"))
        w = tl.where(empty, 0.0, tl.exp2((lse_p - m_safe) * LOG2E))
        o = tl.load(
            out_base + parts[:, None] * stride_op + dims_v[None, :],
            mask=ok[:, None] & (dims_v[None, :] < HEAD_DIM_V), other=0.0,
        ).to(tl.float32)  # [BLOCK_P, BLOCK_DV]
        acc += tl.sum(tl.where(empty[:, None], 0.0, w[:, None] * o), 0)
        w_lanes += w
    total = tl.sum(w_lanes, 0)  # 3.
    total_safe = tl.where(total > 0, total, 1.0)
    lse = tl.where(total > 0, m_safe + tl.log2(total_safe) / LOG2E, float("-inf"))
    tl.store(out_ptr + b * stride_fb + head * stride_fh + dims_v, acc / total_safe,
             mask=dims_v < HEAD_DIM_V)
    tl.store(lse_ptr + b * stride_sb + head * stride_sh, lse)


# ---- Triton: the launchers -------------------------------------------------------------


def split_kv_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    partition_size: int | None = None,
    *,
    scale: float | None = None,
    block_n: int | None = None,
    num_segments: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV (flash-decoding) paged decode: a partition kernel, then a merge kernel.

    Args:
        q: ``[B, H, d]``, one new token per sequence (float16 or float32; bfloat16 on a GPU
            only).
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]`` / ``[..., dv]`` (NHD).
        block_tables: ``[B, max_blocks]`` int32; entries past a sequence's last block are
            never read. seq_lens: ``[B]`` int32 (0 allowed).
        partition_size: tokens per split when ``num_segments`` is None: any int >= 1 (the
            kernel gathers token by token, so it need not be a multiple of the block size).
            The grid then grows with the longest sequence. None: the launch plan's (512 on
            the interpreter; on a GPU enough splits to fill the SMs,
            ``common.launch_plan.split_kv_decode``).
        scale: defaults to ``1/sqrt(d)`` of the real head dim.
        block_n: K/V tokens per tile (a power of two >= 16; None = 16, vLLM's decode tile).
        num_segments: instead, cut every sequence into this many segments of whole K/V
            tiles (vLLM's 3D path uses 16): the grid no longer depends on the batch's
            lengths, so one captured CUDA graph serves every step.
        max_seq_len: the longest ``seq_lens`` entry, from host metadata: given, the launch
            makes no host synchronisation; None, ``seq_lens`` is copied to the host once.

    Returns:
        ``(out [B, H, dv] in q.dtype, lse [B, H] float32)``.
    """
    plan = provided.plan_split_kv(q, k_cache, v_cache, block_tables, seq_lens, partition_size,
                                  scale=scale, num_segments=num_segments,
                                  max_seq_len=max_seq_len)  # fmt: skip
    batch, num_heads, head_dim = q.shape
    head_dim_v = v_cache.shape[3]
    tiles = tile_config(q, gpu=provided.gpu_tiles(head_dim),
                        interpreter=provided.INTERPRETER_TILES, block_n=block_n)  # fmt: skip
    q, k_cache, v_cache = provided.last_dim_contiguous(q, k_cache, v_cache)
    block_tables, seq_lens = provided.int32_on(q, block_tables, seq_lens)

    # partials in float32 whatever q's dtype: the merge weighs them by exp(lse_p - lse)
    part_out = provided.output_buffer((batch, num_heads, plan.splits, head_dim_v),
                                      torch.float32, q)  # [B, H, splits, dv]
    part_lse = provided.output_buffer((batch, num_heads, plan.splits), torch.float32, q)
    out = provided.output_buffer((batch, num_heads, head_dim_v), q.dtype, q)  # [B, H, dv]
    lse = provided.output_buffer((batch, num_heads), torch.float32, q)  # [B, H]
    if batch == 0:
        return out, lse  # a grid of size 0 is not launchable

    # 1. one program per (sequence x split, KV head): every split's partial of every head
    _split_kv_partition_kernel[plan.partition_grid](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse,
        log2e_scale(plan.scale), plan.splits,
        *q.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
        *part_out.stride()[:3], *part_lse.stride()[:2],
        PARTITION_SIZE=plan.partition_size, NUM_SEGMENTS=plan.num_segments,
        BLOCK_SIZE=plan.block_size, GROUP=plan.group, HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v, BLOCK_H=dot_tile(plan.group), BLOCK_D=dot_tile(head_dim),
        BLOCK_DV=dot_tile(head_dim_v), BLOCK_N=tiles["block_n"],
        DOT_PRECISION=dot_precision(q.dtype), LOG2E=LOG2E,
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )  # fmt: skip
    # 2. then one program per (sequence, query head): merge its splits into out and lse
    _merge(part_out, part_lse, out, lse, plan.merge_grid, tiles)
    return out, lse


def merge_partitions_triton(
    part_out: torch.Tensor, part_lse: torch.Tensor, *, block_p: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge kernel alone: ``P`` partial results per (sequence, head) into one.

    Args:
        part_out: ``[B, H, P, dv]`` normalised partial outputs (float16 or float32).
        part_lse: ``[B, H, P]`` their natural-log LSEs; ``-inf`` or ``+inf`` = empty (an
            empty partition's output is never read).
        block_p: partitions per step (a power of two >= 16; None = the launcher's choice).

    Returns:
        ``(out [B, H, dv] in part_out.dtype, lse [B, H] float32)``.
    """
    merge_grid = provided.check_partials(part_out, part_lse)
    batch, num_heads, _, head_dim_v = part_out.shape
    tiles = tile_config(part_out, gpu=provided.gpu_tiles(head_dim_v),
                        interpreter=provided.INTERPRETER_TILES, block_p=block_p)  # fmt: skip
    # the kernel steps the last dims (dv, P) with stride 1 and reads the LSEs as float32
    part_out, part_lse = provided.last_dim_contiguous(part_out, part_lse.to(torch.float32))
    out = provided.output_buffer((batch, num_heads, head_dim_v), part_out.dtype, part_out)
    lse = provided.output_buffer((batch, num_heads), torch.float32, part_out)  # [B, H]
    if batch and num_heads:
        _merge(part_out, part_lse, out, lse, merge_grid, tiles)
    return out, lse


def _merge(
    part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    grid: tuple[int, int], tiles: dict[str, int],
) -> None:
    """Launch the merge kernel: ``part_out [B, H, P, dv]``, ``part_lse [B, H, P]`` float32
    into ``out [B, H, dv]``, ``lse [B, H]``, one program per ``(b, head)`` of ``grid``."""
    head_dim_v = part_out.shape[3]
    _merge_partitions_kernel[grid](
        part_out, part_lse, out, lse, part_lse.shape[2],
        *part_out.stride()[:3], *part_lse.stride()[:2], *out.stride()[:2], *lse.stride()[:2],
        HEAD_DIM_V=head_dim_v, BLOCK_P=tiles["block_p"], BLOCK_DV=dot_tile(head_dim_v),
        LOG2E=LOG2E, num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )  # fmt: skip
