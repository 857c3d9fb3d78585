"""Lab 01 solution: PagedAttention decode = the online softmax streamed over a block table.

The paged KV cache (the FlashAttention/FlashInfer "NHD" layout):

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : [max_blocks_per_seq]   logical block i lives in physical block block_table[i]
    token t          : k_cache[block_table[t // block_size], t % block_size]

Slots past ``seq_len`` in the last block, blocks no table references and the padding
entries of a table may hold anything (the tests put NaN there): never read them.
The input checks and the tile plan (``INTERPRETER_TILES``, ``gpu_tiles``) are given in
``provided.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from common.loader import load_lab_module
from common.paged import blocks_needed
from common.triton_env import (
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
    block_table, positions = provided.check_slot_mapping_inputs(block_table, positions, block_size)
    logical_block, offset = np.divmod(positions, block_size)
    physical_block = block_table[logical_block]
    return physical_block * block_size + offset


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
    k, v, slots = provided.check_write_kv_inputs(k_cache, v_cache, k, v, slots)
    block_size = k_cache.shape[1]
    block, offset = np.divmod(slots, block_size)
    k_cache[block, offset] = k
    v_cache[block, offset] = v


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """The sequence's K (or V) in logical order: ``[seq_len, num_kv_heads, head_dim]``.

    Reads exactly the first ``seq_len`` slots named by the block table, nothing else.
    """
    block_table, seq_len = provided.check_gather_inputs(cache, block_table, seq_len)
    block_size = cache.shape[1]
    positions = np.arange(seq_len)
    return cache[block_table[positions // block_size], positions % block_size]


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
    q, block_table, seq_len, group = provided.check_decode_inputs(
        q, k_cache, v_cache, block_table, seq_len
    )
    num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    scale = default_scale(head_dim) if scale is None else float(scale)

    kv_head = np.arange(num_heads) // group  # query head h reads KV head h // group
    dtype = np.result_type(q, k_cache, v_cache)
    m = np.full(num_heads, -np.inf, dtype=dtype)  # running max of the scores
    l = np.zeros(num_heads, dtype=dtype)  # running sum of exp(score - m)
    acc = np.zeros((num_heads, v_cache.shape[3]), dtype=dtype)  # running sum of exp(.) * v

    for logical_block in range(blocks_needed(seq_len, block_size)):
        physical_block = block_table[logical_block]
        start_pos = logical_block * block_size
        n = min(block_size, seq_len - start_pos)  # the last block may be partial
        k = k_cache[physical_block, :n][:, kv_head]  # [n, num_heads, head_dim]
        v = v_cache[physical_block, :n][:, kv_head]  # [n, num_heads, head_dim_v]

        s = np.einsum("hd,nhd->hn", q, k) * scale  # [num_heads, n]
        m_new = np.maximum(m, s.max(axis=1))  # finite: every block has >= 1 token
        alpha = np.exp(m - m_new)  # rescales the old state; exp(-inf) = 0 on the first block
        p = np.exp(s - m_new[:, None])  # [num_heads, n]
        l = alpha * l + p.sum(axis=1)
        acc = alpha[:, None] * acc + np.einsum("hn,nhd->hd", p, v)
        m = m_new

    if seq_len == 0:
        return acc, m  # zeros and -inf: attention over nothing
    return acc / l[:, None], m + np.log(l)


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
    q, block_tables, seq_lens = provided.check_batch_inputs(q, block_tables, seq_lens)
    num_heads, head_dim_v = q.shape[1], v_cache.shape[-1]
    out = np.zeros((q.shape[0], num_heads, head_dim_v), dtype=np.result_type(q, v_cache))
    lse = np.zeros((q.shape[0], num_heads), dtype=out.dtype)
    for b in range(q.shape[0]):
        try:
            out[b], lse[b] = paged_decode_attention(
                q[b], k_cache, v_cache, block_tables[b], int(seq_lens[b]), scale
            )
        except ValueError as err:  # say which sequence of the batch was bad
            raise ValueError(f"sequence {b} of the batch: {err}") from None
    return out, lse


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
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)

    # The query heads of this KV head's group, packed as the rows of one tile.
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    head_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [GROUP_PAD, HEAD_DIM_PAD]
    q = q.to(k_cache_ptr.dtype.element_ty)

    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    block_table = block_tables_ptr + seq * stride_table_seq

    for start_pos in range(0, seq_len, BLOCK_N):
        pos = start_pos + tl.arange(0, BLOCK_N)  # logical token positions of this tile
        in_seq = pos < seq_len  # False past seq_len: the partial last block
        physical_block = tl.load(block_table + pos // BLOCK_SIZE, mask=in_seq, other=0)
        # int64: at 16 tokens x 8 KV heads x d=128 a block is 16,384 elements, so
        # physical_block * stride_k_block passes 2^31 from block 131,072 on.
        physical_block = physical_block.to(tl.int64)
        slot = pos % BLOCK_SIZE
        kv_mask = in_seq[:, None] & dim_ok[None, :]
        k = tl.load(
            k_cache_ptr + physical_block[:, None] * stride_k_block + slot[:, None] * stride_k_slot
            + kv_head * stride_k_head + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, HEAD_DIM_PAD]
        v = tl.load(
            v_cache_ptr + physical_block[:, None] * stride_v_block + slot[:, None] * stride_v_slot
            + kv_head * stride_v_head + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, HEAD_DIM_PAD]

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [GROUP_PAD, BLOCK_N]
        s = tl.where(in_seq[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: each tile has >= 1 token in seq
        alpha = tl.exp2(m - m_new)  # 0 on the first tile, where m = -inf
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    has_keys = l > 0  # False only for seq_len = 0: output 0, lse -inf
    l_safe = tl.where(has_keys, l, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has_keys, m * 0.6931471805599453 + tl.log(l_safe), float("-inf"))  # ln 2
    out_rows = out_ptr + seq * stride_o_seq + heads * stride_o_head
    tl.store(
        out_rows[:, None] + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & dim_ok[None, :],
    )
    tl.store(lse_ptr + seq * stride_lse_seq + heads, lse, mask=head_ok)


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
    group = provided.check_triton_inputs(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len)
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    tiles = tile_config(q, gpu=provided.gpu_tiles(batch, num_kv_heads, group, head_dim),
                        interpreter=provided.INTERPRETER_TILES, block_n=block_n)
    scale = default_scale(head_dim) if scale is None else float(scale)

    q, k_cache, v_cache = (
        t if t.stride(-1) == 1 else t.contiguous()
        for t in (q, k_cache, v_cache)
    )
    block_tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse

    _paged_decode_kernel[(batch, num_kv_heads)](
        q, k_cache, v_cache, block_tables, seq_lens, out, lse,
        log2e_scale(scale),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1), lse.stride(0),
        GROUP=group,
        GROUP_PAD=dot_tile(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=dot_tile(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_N=tiles["block_n"],
        DOT_PRECISION=dot_precision(k_cache.dtype),
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )
    return out, lse
