"""Lab 01 starter: PagedAttention decode = the online softmax streamed over a block table.

Your work goes in the functions that raise ``NotImplementedError`` and in the kernel
``_paged_decode_kernel`` (HINTS.md has its hints, in levels). Run the spec with

    LAB_IMPL=starter pytest labs/lab-01-paged-attention-gather -q

The paged KV cache (the FlashAttention/FlashInfer "NHD" layout):

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : [max_blocks_per_seq]   logical block i lives in physical block block_table[i]
    token t          : k_cache[block_table[t // block_size], t % block_size]

Slots past ``seq_len`` in the last block, blocks no table references and the padding
entries of a table may hold anything (the tests put NaN there): never read them.
The input checks are given in ``provided.py``: call the one each TODO names first.
"""

from __future__ import annotations

import numpy as np
import torch  # noqa: F401

from common.loader import load_lab_module

# The helpers your code will use (unused until you write it):
from common.paged import blocks_needed  # noqa: F401
from common.triton_env import (  # noqa: F401
    default_scale,
    dot_precision,
    dot_tile,
    log2e_scale,
    tile_config,
    tl,
    triton,
)

provided = load_lab_module(__file__, "provided")

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
        "TODO: a position names a logical block and an offset; the table names the physical block"
        " (HINTS.md step 1: make hint LAB=01 STEP=1 LEVEL=1)"
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
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=01 STEP=1 LEVEL=1)")


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """The sequence's K (or V) in logical order: ``[seq_len, num_kv_heads, head_dim]``.

    Reads exactly the first ``seq_len`` slots named by the block table, nothing else.
    """
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=01 STEP=1 LEVEL=1)")


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
        "TODO: keep (m, l, acc) per query head the exact summary of the blocks visited so far; "
        "never read a slot at or past seq_len (HINTS.md step 2: make hint LAB=01 STEP=2 LEVEL=1)"
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
    raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=01 STEP=3 LEVEL=1)")


# ---------------------------------------------------------------------------------------
# The Triton kernel: one program per (sequence, KV head), GQA-packed.
# ---------------------------------------------------------------------------------------


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2 (exp2)
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table_seq,
    stride_o_seq, stride_o_head, stride_lse_seq,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a tl.dot tile (a power of two >= 16)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # HEAD_DIM rounded up the same way
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_N: tl.constexpr,  # tokens per K/V tile: a part of a block, or several blocks
    DOT_PRECISION: tl.constexpr,
):
    """One program = one sequence x one KV head; its GROUP query heads are the rows of a tile.

    Grid ``(batch, num_kv_heads)``. Every head dim is a contiguous last dimension
    (the launcher makes it so); ``v_cache`` has ``q``'s head dim.
    """
    # TODO: keep m, l, acc the summary of the positions loaded so far; load nothing at or past
    # seq_len (HINTS.md step 4: make hint LAB=01 STEP=4 LEVEL=1)
    pass


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    block_n: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged decode attention for a batch, as one Triton launch.

    Args:
        q: ``[B, H, d]``.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]``, float16 or float32 (bfloat16
            too on a GPU; the interpreter refuses it). Accumulation is in float32.
        block_tables: ``[B, max_blocks]`` ints; padding entries are never read.
        seq_lens: ``[B]`` ints, on q's device.
        scale: defaults to ``1 / sqrt(d)`` (the real head dim, not the padded tile).
        block_n: tokens per K/V tile, a power of two >= 16; None = the launcher's choice
            (``provided.gpu_tiles``: 64 on a GPU; ``provided.INTERPRETER_TILES``: 16).
            Independent of the cache's block size.
        max_seq_len: the longest ``seq_lens`` entry, if the caller knows it on the host (a
            serving engine does); then nothing is copied from the device. None = one copy
            of ``seq_lens`` to the host, which also validates the lengths.

    Returns:
        ``(out [B, H, d]`` in q's dtype, ``lse [B, H]`` float32, natural log). Grid: one
        program per (sequence, KV head); each loads every K/V tile once and serves all
        ``H // KVH`` query heads of its group with ``tl.dot``.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=01 STEP=4 LEVEL=1)")
