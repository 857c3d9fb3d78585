"""Lab 04 starter: split-KV flash-decoding and ring attention with the attention monoid.

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

Grade your work:  LAB_IMPL=starter pytest labs/lab-04-flash-decoding-partitions -q
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
    raise NotImplementedError(
        "TODO: the state of NO keys. What max, denominator and weighted sum describe an empty "
        "set so that merging it with anything changes nothing? (float64 arrays)"
    )


def merge(a: AttentionState, b: AttentionState) -> AttentionState:
    """The state of the union of two disjoint key sets. Exact, associative, commutative."""
    raise NotImplementedError(
        "TODO: bring both sides to a common reference max m, then add denominators and "
        "accumulators. Each side's numbers were computed relative to its own max. Careful: "
        "what is exp(m_a - m) when both sides are empty (m = -inf)?"
    )


def finalize(state: AttentionState) -> tuple[np.ndarray, np.ndarray]:
    """``(out = acc / l, lse = m + log(l))``; an empty state gives ``(0, -inf)``."""
    raise NotImplementedError(
        "TODO: this is the one place where you divide. And remember what l is measured "
        "relative to when you take its log."
    )


# ---- one partition, many partitions ----------------------------------------------------


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
    raise NotImplementedError(
        "TODO: scores s = q.k * scale per query head (head h reads KV head "
        "h // (H // KVH)); then the max, the denominator and the weighted sum of this "
        "partition. Do not divide: a partial is not an answer yet."
    )


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

    Raises:
        ValueError: naming ``num_partitions`` (< 1) or ``order`` (not in ``ORDERS``).
    """
    raise NotImplementedError(
        "TODO: validate num_partitions and order (ValueError naming them), cut [0, n) into "
        "num_partitions ranges (some may be empty), compute a partial_state for each and "
        "combine them with merge() in the requested order ('tree': merge neighbours in "
        "rounds, like a GPU reduction)."
    )


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
    raise NotImplementedError(
        "TODO: exp(lse) is each side's full softmax denominator. Weigh the outputs by their "
        "share of the total, computed relative to max(lse_a, lse_b) so nothing overflows, "
        "and decide what happens when both sides are -inf."
    )


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
    raise NotImplementedError(
        "TODO: scores [Lq, H, Lk]; when causal, mask out keys whose position is after the "
        "query's (which positions?); a row that sees no key of this block contributes the "
        "identity. Then merge into state."
    )


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
    raise NotImplementedError(
        "TODO: validate the three lists; one running state per device (empty_state accepts "
        "(L_p, H)); P steps of: every device runs ring_step on the shard it holds, then the "
        "shards move one device along the ring. Finish with finalize."
    )


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
    against the partition's tokens, written as a normalised partial output plus its LSE.

    part_out ``[B, H, P, dv]`` float32, part_lse ``[B, H, P]`` float32.
    """
    # TODO 1: b, kv_head, part from tl.program_id(0..2); this partition covers positions
    #         [part * PARTITION_SIZE, min(that + PARTITION_SIZE, seq_len)) of sequence b.
    # TODO 2: load the GROUP query heads of this KV head as a [BLOCK_H, BLOCK_D] tile
    #         (rows past GROUP and dims past HEAD_DIM masked to 0: tl.dot needs >= 16).
    # TODO 3: m, l, acc in fp32; loop over the partition BLOCK_N tokens at a time:
    #         physical block = block_table[pos // BLOCK_SIZE] (as tl.int64 before it meets
    #         a stride: a large cache overflows int32), slot = pos % BLOCK_SIZE;
    #         load K and V with a mask (never read past the partition or the sequence),
    #         s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale (float32 on
    #         a GPU is otherwise TF32), masked to -inf, then the online update.
    # TODO 4: store out = acc / l and lse = m + log(l); a partition with no token stores
    #         out 0 and lse -inf.
    pass


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
    # TODO 1: the max LSE over the partitions (loop BLOCK_P at a time, masked with -inf).
    # TODO 2: weights w_p = exp(lse_p - max) (0 for an empty partition), out = sum w_p out_p /
    #         sum w_p, lse = max + log(sum w_p); all partitions empty gives out 0, lse -inf.
    pass


def _check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens, partition_size) -> int:
    """Validate the paged-decode inputs; returns the longest sequence length. (Given.)"""
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
    raise NotImplementedError(
        "TODO: write the two kernels above, then delete this line: the launch code below "
        "validates, allocates the partial buffers and launches both grids."
    )
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
