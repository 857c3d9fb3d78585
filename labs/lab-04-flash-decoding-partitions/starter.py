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

Your work: the numpy functions below, the two Triton kernels (numbered steps in their
docstrings) and their launchers ``split_kv_decode_triton`` and ``merge_partitions_triton``
(steps in their comments); the checks, the tile plan, grids and buffers are given in
``provided.py``.
Grade it with ``make grade LAB=04``.
"""

from __future__ import annotations

import numpy as np
import torch

from common.loader import load_lab_module

# The helpers your launchers will use (unused until you write them), with
# common.triton_env.LOG2E:
from common.triton_env import (  # noqa: F401
    dot_precision,
    dot_tile,
    log2e_scale,
    tile_config,
    tl,
    triton,
)

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
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=04 STEP=1 LEVEL=1)")


def merge(a: AttentionState, b: AttentionState) -> AttentionState:
    """The state of the union of two disjoint key sets. Exact, associative, commutative."""
    raise NotImplementedError(
        "TODO: merge(a, b) is the exact state of the union, in any order; the empty state changes"
        " nothing (HINTS.md step 1: make hint LAB=04 STEP=1 LEVEL=1)"
    )


def finalize(state: AttentionState) -> tuple[np.ndarray, np.ndarray]:
    """``(out = acc / l, lse = m + log(l))``; an empty state gives ``(0, -inf)``."""
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=04 STEP=1 LEVEL=1)")


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
        "TODO: a partial is a summary, not an answer: do not divide (HINTS.md step 2: make hint "
        "LAB=04 STEP=2 LEVEL=1)"
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
        order: ``"sequential"`` (0, 1, 2, ...), ``"reverse"``, ``"tree"`` (pairwise rounds:
            ``(P0 + P1) + (P2 + P3)``) or ``"random"`` (a shuffled fold). Partials are
            combined with ``merge``.

    Returns:
        ``(out [H, dv], lse [H])``, equal to dense attention whatever the order.

    Raises:
        ValueError: naming ``num_partitions`` (< 1) or ``order`` (not in ``ORDERS``).
    """
    raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=04 STEP=3 LEVEL=1)")


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
    raise NotImplementedError(
        "TODO: an empty side (lse -inf) has weight 0; nothing overflows at lse of +-800 (HINTS.md"
        " step 4: make hint LAB=04 STEP=4 LEVEL=1)"
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
        "TODO: after the step, the state summarises every shard seen so far; causal uses global "
        "positions (HINTS.md step 5: make hint LAB=04 STEP=5 LEVEL=1)"
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
    raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=04 STEP=5 LEVEL=1)")


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
    tl.static_assert(False,
        "TODO: a split reads only its own positions; an empty split stores lse -inf (HINTS.md "
        "step 6: make hint LAB=04 STEP=6 LEVEL=1)"
    )


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
    tl.static_assert(False, "TODO: HINTS.md step 6 (make hint LAB=04 STEP=6 LEVEL=1)")


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
    raise NotImplementedError("TODO: HINTS.md step 7 (make hint LAB=04 STEP=7 LEVEL=1)")


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
    raise NotImplementedError("TODO: HINTS.md step 7 (make hint LAB=04 STEP=7 LEVEL=1)")
