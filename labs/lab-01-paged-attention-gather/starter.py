"""Lab 01 starter: PagedAttention decode = the online softmax streamed over a block table.

Your work goes in the functions that raise ``NotImplementedError``. Run the spec with

    LAB_IMPL=starter pytest labs/lab-01-paged-attention-gather -q

The paged KV cache (the FlashAttention/FlashInfer "NHD" layout):

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : [max_blocks_per_seq]   logical block i lives in physical block block_table[i]
    token t          : k_cache[block_table[t // block_size], t % block_size]

Slots past ``seq_len`` in the last block, blocks no table references and the padding
entries of a table may hold anything (the tests put NaN there): never read them.
"""

from __future__ import annotations

import math  # noqa: F401  (you will want math.sqrt)

import numpy as np
import torch

from common.paged import blocks_needed
from common.triton_env import tl, triton  # noqa: F401  (triton.next_power_of_2 is handy)

# ---------------------------------------------------------------------------------------
# Given: input checks. Bad input must be a ValueError that names the argument, never an
# IndexError from deep inside; call these at the top of your functions.
# ---------------------------------------------------------------------------------------


def _check_block_table(
    block_table: np.ndarray, seq_len: int, block_size: int, num_blocks: int, name: str
) -> None:
    """The first ceil(seq_len / block_size) entries must name real physical blocks."""
    if block_table.ndim != 1:
        raise ValueError(f"{name} must be 1-D [max_blocks], got shape {block_table.shape}")
    needed = blocks_needed(seq_len, block_size)
    if len(block_table) < needed:
        raise ValueError(
            f"{name} has {len(block_table)} entries but seq_len={seq_len} needs {needed} "
            f"blocks of {block_size} tokens"
        )
    used = block_table[:needed]
    bad = np.flatnonzero((used < 0) | (used >= num_blocks))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{name}[{i}] = {int(used[i])} is not a physical block (the cache has "
            f"{num_blocks} blocks); only entries past the last needed block may be padding"
        )


def _check_caches(k_cache: np.ndarray, v_cache: np.ndarray) -> None:
    if k_cache.ndim != 4:
        raise ValueError(
            f"k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {k_cache.shape}"
        )
    if v_cache.ndim != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(
            f"v_cache shape {v_cache.shape} does not match k_cache shape {k_cache.shape} "
            "in [num_blocks, block_size, num_kv_heads]"
        )


def _check_heads(num_heads: int, head_dim: int, k_cache_shape: tuple[int, ...]) -> int:
    """Validate q's heads and head_dim against the cache; return the group size."""
    num_kv_heads, cache_head_dim = k_cache_shape[2], k_cache_shape[3]
    if head_dim != cache_head_dim:
        raise ValueError(
            f"head_dim of q ({head_dim}) does not match the head_dim of k_cache "
            f"({cache_head_dim}, shape {tuple(k_cache_shape)})"
        )
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} (from q) is not a multiple of num_kv_heads={num_kv_heads} "
            "(from k_cache)"
        )
    return num_heads // num_kv_heads


def _check_seq_len(seq_len: int, name: str = "seq_len") -> int:
    if int(seq_len) != seq_len or seq_len < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seq_len}")
    return int(seq_len)


# ---------------------------------------------------------------------------------------
# The write path: where does token t go, and put it there.
# ---------------------------------------------------------------------------------------


def slot_mapping(block_table: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Physical slot of each token position: ``block_table[p // bs] * bs + p % bs``.

    Args:
        block_table: ``[max_blocks]`` physical block of each logical block.
        positions: ``[n]`` token positions (ints >= 0).
        block_size: tokens per block.

    Returns:
        ``[n]`` int64: each position's row in the flattened cache
        ``cache.reshape(num_blocks * block_size, num_kv_heads, head_dim)``.
    """
    raise NotImplementedError(
        "TODO: split each position into (logical block, offset in the block), look the "
        "logical block up in block_table, and turn (physical block, offset) into one slot "
        "number. Reject block_size < 1, negative positions and positions past the table "
        "with a ValueError that names the argument (block_size, positions, block_table)."
    )


def write_kv(
    k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray, slots: np.ndarray
) -> None:
    """Scatter new tokens' K/V into the caches in place (vLLM's reshape-and-cache step).

    Args:
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, modified.
        k, v: ``[n, num_kv_heads, head_dim]``, the new tokens.
        slots: ``[n]`` distinct physical slots (see :func:`slot_mapping`).

    Only the ``n`` given slots change; every other slot keeps its bytes.
    """
    raise NotImplementedError(
        "TODO: a slot number is (block, offset) in disguise; write token i's K and V there, "
        "in place. Return nothing. Reject k or v whose shape is not [n, num_kv_heads, "
        "head_dim] of the cache, and slots outside the cache, with a ValueError naming k, v "
        "or slots."
    )


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """The sequence's K (or V) in logical order: ``[seq_len, num_kv_heads, head_dim]``.

    Reads exactly the first ``seq_len`` slots named by the block table, nothing else.
    """
    raise NotImplementedError(
        "TODO: for every position t < seq_len, read the slot the block table names for it "
        "(validate with _check_seq_len and _check_block_table first)."
    )


# ---------------------------------------------------------------------------------------
# The read path: one decode step, streamed block by block.
# ---------------------------------------------------------------------------------------


def paged_decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray,
    seq_len: int,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention of one new token over its paged context, one block at a time.

    Args:
        q: ``[num_heads, head_dim]``, the new token's queries.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_table: ``[max_blocks]``; entries past ``ceil(seq_len / block_size)`` are padding.
        seq_len: tokens in the context (the new token's own K/V included).
        scale: defaults to ``1 / sqrt(head_dim)``.

    Returns:
        ``(out [num_heads, head_dim], lse [num_heads])``; with ``seq_len = 0`` the output is
        0 and ``lse = -inf``. Query head ``h`` reads KV head ``h // (num_heads //
        num_kv_heads)``. Slots past ``seq_len`` are never read.
    """
    raise NotImplementedError(
        "TODO: validate (q must be 2-D; _check_caches, _check_heads, _check_seq_len, "
        "_check_block_table). Keep a running max m, denominator l and accumulator acc per "
        "query head. Visit the logical blocks in order, find each one's physical block in "
        "the table, read only the tokens that exist (the last block may be partial), and "
        "fold the block's scores into (m, l, acc), rescaling the old state when m grows. "
        "Start m at -inf, not 0. Finish with out = acc / l and lse = m + log(l)."
    )


def paged_decode_attention_batch(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A decode step for a batch: q ``[B, H, d]``, block_tables ``[B, max_blocks]``, seq_lens
    ``[B]`` -> ``(out [B, H, d], lse [B, H])``. Each sequence has its own length and table."""
    raise NotImplementedError(
        "TODO: check that q, block_tables and seq_lens agree on the batch size (ValueError "
        "naming the argument), then run paged_decode_attention for each sequence and stack."
    )


# ---------------------------------------------------------------------------------------
# The Triton kernel: one program per (sequence, KV head), GQA-packed.
# ---------------------------------------------------------------------------------------


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    scale,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table_seq,
    stride_o_seq, stride_o_head, stride_lse_seq,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two >= 16 (tl.dot needs M >= 16)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_N: tl.constexpr,  # tokens per K/V tile: a part of a block, or several blocks
    DOT_PRECISION: tl.constexpr,
):
    # TODO 1: seq = tl.program_id(0), kv_head = tl.program_id(1); load this sequence's seq_len.
    # TODO 2: load the query rows of this KV head's group as one [GROUP_PAD, HEAD_DIM_PAD] tile
    #         (rows past GROUP and dims past HEAD_DIM masked, other=0). Which query heads
    #         belong to KV head kv_head?
    # TODO 3: m = -inf, l = 0 ([GROUP_PAD], fp32); acc = 0 ([GROUP_PAD, HEAD_DIM_PAD], fp32).
    # TODO 4: for start_pos in range(0, seq_len, BLOCK_N):
    #           logical positions of the tile, a mask "inside the sequence", their physical
    #           blocks through the block table (masked load; cast them to tl.int64 before
    #           multiplying by a stride: a 100k-block cache overflows int32), their slots;
    #           masked loads of the K and V tiles [BLOCK_N, HEAD_DIM_PAD] with other=0
    #           (NaN * 0 = NaN inside tl.dot: masking only the scores is not enough);
    #           s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale, set to -inf
    #           outside the sequence; then the online-softmax update of (m, l, acc), with a
    #           second tl.dot for p @ v.
    # TODO 5: out = acc / l (guard l = 0: seq_len = 0 gives out 0, lse -inf); lse = m + log(l);
    #         store the rows < GROUP into out and lse.
    pass


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Paged decode attention for a batch, as one Triton launch.

    Args:
        q: ``[B, H, d]``.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]`` (fp16/bf16 on a GPU; any float
            dtype under the interpreter). Computation accumulates in fp32.
        block_tables: ``[B, max_blocks]`` int32; padding entries are never read.
        seq_lens: ``[B]`` ints.
        scale: defaults to ``1 / sqrt(d)``.
        return_lse: also return the log-sum-exp.

    Returns:
        ``out [B, H, d]`` in q's dtype, or ``(out, lse [B, H] float32)`` with ``return_lse``.
        Grid: one program per (sequence, KV head); each loads every K/V tile once and serves
        all ``H // KVH`` query heads of its group with ``tl.dot``.
    """
    # The launch wrapper, step by step:
    #   1. validate: shapes, num_heads % num_kv_heads, seq_lens >= 0, block_tables wide enough
    #      (the same rules as the numpy functions; reuse _check_caches and _check_heads);
    #   2. allocate out [B, H, d] (q.dtype) and lse [B, H] (float32) on q's device;
    #   3. launch _paged_decode_kernel[(batch, num_kv_heads)](...) passing every stride,
    #      GROUP_PAD = max(16, triton.next_power_of_2(group)), HEAD_DIM_PAD likewise,
    #      BLOCK_N = 16 (interpreter) or larger on a GPU, DOT_PRECISION "ieee" for float32
    #      caches (exact fp32 on a GPU) else "tf32";
    #   4. return out, or (out, lse) when return_lse.
    raise NotImplementedError(
        "TODO: write _paged_decode_kernel (its TODOs say what each part does), then validate "
        "the inputs, allocate out/lse and launch it on a (batch, num_kv_heads) grid here."
    )
