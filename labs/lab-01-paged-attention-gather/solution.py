"""Lab 01 solution: PagedAttention decode = the online softmax streamed over a block table.

The paged KV cache (the FlashAttention/FlashInfer "NHD" layout):

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    block_table      : [max_blocks_per_seq]   logical block i lives in physical block block_table[i]
    token t          : k_cache[block_table[t // block_size], t % block_size]

Slots past ``seq_len`` in the last block, blocks no table references and the padding
entries of a table may hold anything (the tests put NaN there): never read them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from common.paged import blocks_needed
from common.triton_env import tl, triton

# ---------------------------------------------------------------------------------------
# Input checks: bad input is a ValueError that names the argument, never an IndexError.
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
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    block_table = np.asarray(block_table, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    if block_table.ndim != 1:
        raise ValueError(f"block_table must be 1-D [max_blocks], got shape {block_table.shape}")
    if positions.size == 0:
        return positions.copy()
    if positions.min() < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions.min())}")
    logical_block, offset = np.divmod(positions, block_size)
    if logical_block.max() >= len(block_table):
        raise ValueError(
            f"block_table has {len(block_table)} entries but position {int(positions.max())} "
            f"needs logical block {int(logical_block.max())}"
        )
    physical_block = block_table[logical_block]
    if physical_block.min() < 0:
        raise ValueError("block_table has a padding entry (< 0) where a position needs a block")
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
    _check_caches(k_cache, v_cache)
    num_blocks, block_size = k_cache.shape[:2]
    k, v = np.asarray(k), np.asarray(v)
    slots = np.asarray(slots, dtype=np.int64)
    if k.shape[1:] != k_cache.shape[2:] or k.ndim != 3:
        raise ValueError(f"k has shape {k.shape}, expected [n, *{k_cache.shape[2:]}]")
    if v.shape != (k.shape[0], *v_cache.shape[2:]):
        raise ValueError(f"v has shape {v.shape}, expected [{k.shape[0]}, *{v_cache.shape[2:]}]")
    if slots.shape != (k.shape[0],):
        raise ValueError(f"slots has shape {slots.shape}, expected [{k.shape[0]}] (one per token)")
    if slots.size and (slots.min() < 0 or slots.max() >= num_blocks * block_size):
        raise ValueError(
            f"slots must lie in [0, {num_blocks * block_size}), got {slots.min()}..{slots.max()}"
        )
    if len(np.unique(slots)) != len(slots):
        raise ValueError("slots has duplicates: two tokens cannot share one cache slot")

    block, offset = np.divmod(slots, block_size)
    k_cache[block, offset] = k
    v_cache[block, offset] = v


def gather_kv(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """The sequence's K (or V) in logical order: ``[seq_len, num_kv_heads, head_dim]``.

    Reads exactly the first ``seq_len`` slots named by the block table, nothing else.
    """
    if cache.ndim != 4:
        raise ValueError(
            f"cache must be [num_blocks, block_size, num_kv_heads, head_dim], got {cache.shape}"
        )
    seq_len = _check_seq_len(seq_len)
    block_table = np.asarray(block_table)
    num_blocks, block_size = cache.shape[:2]
    _check_block_table(block_table, seq_len, block_size, num_blocks, "block_table")

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
    q = np.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"q must be [num_heads, head_dim], got shape {q.shape}")
    _check_caches(k_cache, v_cache)
    num_heads, head_dim = q.shape
    group = _check_heads(num_heads, head_dim, k_cache.shape)
    seq_len = _check_seq_len(seq_len)
    num_blocks, block_size = k_cache.shape[:2]
    block_table = np.asarray(block_table)
    _check_block_table(block_table, seq_len, block_size, num_blocks, "block_table")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)

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
    q = np.asarray(q)
    block_tables = np.asarray(block_tables)
    seq_lens = np.asarray(seq_lens)
    if q.ndim != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {q.shape}")
    batch = q.shape[0]
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got shape {block_tables.shape}"
        )
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be [batch={batch}], got shape {seq_lens.shape}")

    results = []
    for b in range(batch):
        try:
            results.append(
                paged_decode_attention(
                    q[b], k_cache, v_cache, block_tables[b], int(seq_lens[b]), scale
                )
            )
        except ValueError as err:  # say which sequence of the batch was bad
            raise ValueError(f"sequence {b} of the batch: {err}") from None
    out = np.stack([o for o, _ in results]) if results else np.zeros((0, *q.shape[1:]))
    lse = np.stack([s for _, s in results]) if results else np.zeros((0, q.shape[1]))
    return out, lse


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
        physical_block = physical_block.to(tl.int64)  # block * stride can overflow int32
        slot = pos % BLOCK_SIZE
        kv_mask = in_seq[:, None] & dim_ok[None, :]
        # Masked lanes are never loaded: they read as 0, so a NaN in a slot past seq_len
        # cannot reach tl.dot (NaN * 0 = NaN, so masking the scores alone is not enough).
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

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [GROUP_PAD, BLOCK_N]
        s = tl.where(in_seq[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: each tile has >= 1 token in seq
        alpha = tl.exp(m - m_new)  # 0 on the first tile, where m = -inf
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    has_keys = l > 0  # False only for seq_len = 0: output 0, lse -inf
    l_safe = tl.where(has_keys, l, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has_keys, m + tl.log(l_safe), float("-inf"))
    out_rows = out_ptr + seq * stride_o_seq + heads * stride_o_head
    tl.store(
        out_rows[:, None] + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & dim_ok[None, :],
    )
    tl.store(lse_ptr + seq * stride_lse_seq + heads, lse, mask=head_ok)


def _check_triton_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> int:
    """Shapes, head counts and lengths; returns the group size."""
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {tuple(q.shape)}")
    _check_caches(k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    if v_cache.shape[3] != head_dim:
        raise ValueError(
            f"v_cache head_dim {v_cache.shape[3]} must equal q's head_dim {head_dim} here"
        )
    group = _check_heads(num_heads, head_dim, tuple(k_cache.shape))
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be [batch={batch}], got shape {tuple(seq_lens.shape)}")
    # One copy of the lengths to the host (a single sync on a GPU, not one per min/max);
    # a production kernel trusts the scheduler's metadata and skips these checks.
    lens = seq_lens.detach().cpu()
    if batch and int(lens.min()) < 0:
        raise ValueError(f"seq_lens must be >= 0, got {int(lens.min())}")
    block_size = k_cache.shape[1]
    longest = int(lens.max()) if batch else 0
    needed = blocks_needed(longest, block_size)
    if needed > block_tables.shape[1]:
        raise ValueError(
            f"block_tables has {block_tables.shape[1]} columns but a sequence of "
            f"{longest} tokens needs {needed} blocks of {block_size}"
        )
    return group


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
    group = _check_triton_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)

    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    block_tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device)

    on_gpu = q.is_cuda
    grid = (batch, num_kv_heads)
    if batch:
        _paged_decode_kernel[grid](
            q, k_cache, v_cache, block_tables, seq_lens, out, lse,
            scale,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1), lse.stride(0),
            GROUP=group,
            GROUP_PAD=max(16, triton.next_power_of_2(group)),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
            BLOCK_SIZE=block_size,
            # 64 tokens per tile keeps enough bytes in flight on a GPU; 16 keeps the
            # interpreter fast while still crossing block boundaries inside a tile.
            BLOCK_N=64 if on_gpu else 16,
            DOT_PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
            **({"num_warps": 4, "num_stages": 2} if on_gpu else {}),
        )
    return (out, lse) if return_lse else out
