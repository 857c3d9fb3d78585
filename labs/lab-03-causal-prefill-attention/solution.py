"""Lab 03 solution: causal prefill, chunked prefill and varlen batches (numpy + Triton).

The one idea: a block of M queries that starts at position ``start_pos`` is "prefill";
query i sits at position ``start_pos + i`` and reads keys ``0 .. start_pos + i``. The
causal mask is nothing but that loop bound. Decode is the case M = 1, chunked prefill is
the case start_pos > 0, and a serving batch is many of these at once, described by
``query_start_loc`` (where each sequence's queries start in the packed batch) and
``seq_lens`` (how many tokens of context each sequence has, cached + new).

Shapes: q ``[M, H, d]`` (or ``[T, H, d]`` packed), k/v ``[N, KVH, d]``, paged caches
``[num_blocks, block_size, KVH, d]``. Query head h reads KV head ``h // (H // KVH)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common.triton_env import tl, triton

# ---------------------------------------------------------------------------------------
# Input checks (every bad argument is a ValueError that names it)
# ---------------------------------------------------------------------------------------


def _check_heads(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(
            f"q, k, v must be 3-D [tokens, heads, dim]; got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} (q {q.shape}) must be a multiple of "
            f"num_kv_heads={num_kv_heads} (k {k.shape})"
        )
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k head_dim {k.shape[2]} != q head_dim {q.shape[2]} (k {k.shape})")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v {v.shape} must match k {k.shape} in tokens and kv heads")


def _check_varlen_metadata(
    num_tokens: int,
    num_blocks: int,
    block_size: int,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
) -> None:
    """The serving metadata must describe a real batch: checked on the host, once."""
    if seq_lens.ndim != 1 or (seq_lens < 0).any():
        raise ValueError(f"seq_lens must be a 1-D array of lengths >= 0, got {seq_lens}")
    batch = len(seq_lens)
    if query_start_loc.shape != (batch + 1,):
        raise ValueError(
            f"query_start_loc must have batch+1 = {batch + 1} entries, got shape "
            f"{query_start_loc.shape}"
        )
    if query_start_loc[0] != 0:
        raise ValueError(f"query_start_loc must start at 0, got {query_start_loc}")
    query_lens = np.diff(query_start_loc)
    if (query_lens < 0).any():
        raise ValueError(f"query_start_loc must be non-decreasing, got {query_start_loc}")
    if query_start_loc[-1] != num_tokens:
        raise ValueError(
            f"query_start_loc ends at {query_start_loc[-1]} but q has {num_tokens} tokens"
        )
    short = np.flatnonzero(seq_lens < query_lens)
    if short.size:
        b = int(short[0])
        raise ValueError(
            f"seq_lens[{b}]={seq_lens[b]} is smaller than sequence {b}'s query count "
            f"{query_lens[b]}: the context must include the new tokens"
        )
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got {block_tables.shape}"
        )
    for b in range(batch):
        needed = -(-int(seq_lens[b]) // block_size)
        if needed > block_tables.shape[1]:
            raise ValueError(
                f"block_tables has {block_tables.shape[1]} columns but sequence {b} "
                f"(seq_lens[{b}]={seq_lens[b]}) needs {needed} blocks of {block_size}"
            )
        used = block_tables[b, :needed]
        if ((used < 0) | (used >= num_blocks)).any():
            raise ValueError(
                f"block_tables[{b}, :{needed}] = {used} names a block outside 0..{num_blocks - 1}"
            )


# ---------------------------------------------------------------------------------------
# NumPy: the prefill shape
# ---------------------------------------------------------------------------------------


def _attend_prefix(
    q_row: np.ndarray, k_prefix: np.ndarray, v_prefix: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """One query token (all heads) against the keys it may see.

    q_row [H, d], k_prefix [n, KVH, d], v_prefix [n, KVH, dv] -> (out [H, dv], lse [H]).
    """
    num_heads, d = q_row.shape
    num_kv_heads = k_prefix.shape[1]
    group = num_heads // num_kv_heads
    q_grouped = q_row.reshape(num_kv_heads, group, d)  # heads h = kvh*group + g
    scores = np.einsum("kgd,nkd->kgn", q_grouped, k_prefix) * scale  # [KVH, G, n]
    m = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - m)
    l = p.sum(axis=-1, keepdims=True)
    out = np.einsum("kgn,nkd->kgd", p, v_prefix) / l  # [KVH, G, dv]
    lse = (m + np.log(l))[..., 0]
    return out.reshape(num_heads, -1), lse.reshape(num_heads)


def prefill_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    start_pos: int,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention for M queries at positions ``start_pos .. start_pos+M-1``.

    Args:
        q: ``[M, H, d]`` the new tokens' queries.
        k, v: ``[N, KVH, d]`` / ``[N, KVH, dv]`` with ``N >= start_pos + M`` (cached keys
            first, then the new tokens' own keys). Keys past ``start_pos + M - 1`` are
            never read.
        start_pos: how many tokens precede the first query (the cached context length).
        scale: defaults to ``1/sqrt(d)``.

    Returns:
        ``(out [M, H, dv], lse [M, H])``. Query i reads keys ``0 .. start_pos + i``.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    _check_heads(q, k, v)
    if int(start_pos) != start_pos or start_pos < 0:
        raise ValueError(f"start_pos must be an integer >= 0, got {start_pos!r}")
    start_pos = int(start_pos)
    num_queries, num_heads, d = q.shape
    if k.shape[0] < start_pos + num_queries:
        raise ValueError(
            f"k has {k.shape[0]} tokens (k {k.shape}) but start_pos + M = "
            f"{start_pos} + {num_queries} = {start_pos + num_queries} are needed"
        )
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dtype = np.result_type(q, k, v, np.float32)

    out = np.zeros((num_queries, num_heads, v.shape[2]), dtype=dtype)
    lse = np.zeros((num_queries, num_heads), dtype=dtype)
    for i in range(num_queries):
        visible = start_pos + i + 1  # the causal mask, as a loop bound (diagonal included)
        out[i], lse[i] = _attend_prefix(q[i], k[:visible], v[:visible], scale)
    return out, lse


def chunked_prefill(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    chunk_sizes: list[int],
    scale: float | None = None,
) -> np.ndarray:
    """Process a prompt chunk after chunk, as a scheduler with a token budget would.

    Args:
        q: ``[M, H, d]`` the whole prompt's queries.
        k, v: ``[>= M, KVH, d]`` the whole prompt's keys and values.
        chunk_sizes: sizes (>= 0) that add up to M; chunk c starts at ``sum(chunk_sizes[:c])``.

    Returns:
        ``out [M, H, dv]``, equal to ``prefill_attention(q, k, v, 0)[0]`` for any chunking.
    """
    q = np.asarray(q)
    sizes = [int(c) for c in chunk_sizes]
    if any(c < 0 for c in sizes) or sum(sizes) != q.shape[0]:
        raise ValueError(
            f"chunk_sizes must be >= 0 and add up to M={q.shape[0]} queries, got {chunk_sizes}"
        )
    outs = []
    start_pos = 0
    for size in sizes:
        cached_and_new = start_pos + size  # what the KV cache holds once this chunk is written
        out, _ = prefill_attention(
            q[start_pos:cached_and_new], k[:cached_and_new], v[:cached_and_new], start_pos, scale
        )
        outs.append(out)
        start_pos = cached_and_new
    if not outs:
        return prefill_attention(q, k, v, 0, scale)[0]
    return np.concatenate(outs, axis=0)


def _gather(cache: np.ndarray, block_table: np.ndarray, seq_len: int) -> np.ndarray:
    """Tokens ``0 .. seq_len-1`` of one sequence from a paged cache: ``[seq_len, KVH, d]``."""
    block_size = cache.shape[1]
    blocks = block_table[: -(-seq_len // block_size)]
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]


def varlen_prefill_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A serving batch: prefill chunks and decode rows packed into one ``q``.

    Args:
        q: ``[T, H, d]``; sequence b's queries are ``q[query_start_loc[b]:query_start_loc[b+1]]``.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]`` (the new tokens' K/V are
            already written).
        block_tables: ``[B, max_blocks]``; entries past a sequence's last block are padding.
        query_start_loc: ``[B+1]`` starts at 0, non-decreasing, ends at T.
        seq_lens: ``[B]`` context length of each sequence, cached + new. Sequence b's
            queries sit at positions ``seq_lens[b] - query_len_b .. seq_lens[b] - 1``.

    Returns:
        ``(out [T, H, dv], lse [T, H])``. A decode row is a sequence with query_len 1.
    """
    q, k_cache, v_cache = np.asarray(q), np.asarray(k_cache), np.asarray(v_cache)
    block_tables = np.asarray(block_tables)
    query_start_loc = np.asarray(query_start_loc).astype(np.int64).reshape(-1)
    seq_lens = np.asarray(seq_lens).astype(np.int64).reshape(-1)
    if k_cache.ndim != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(
            f"k_cache/v_cache must be [num_blocks, block_size, KVH, d]; got "
            f"{k_cache.shape} and {v_cache.shape}"
        )
    _check_heads(q, k_cache[0], v_cache[0])
    num_blocks, block_size = k_cache.shape[:2]
    _check_varlen_metadata(
        q.shape[0], num_blocks, block_size, block_tables, query_start_loc, seq_lens
    )

    dtype = np.result_type(q, k_cache, v_cache, np.float32)
    out = np.zeros((q.shape[0], q.shape[1], v_cache.shape[3]), dtype=dtype)
    lse = np.zeros(q.shape[:2], dtype=dtype)
    for b, seq_len in enumerate(seq_lens):
        first, last = query_start_loc[b], query_start_loc[b + 1]
        start_pos = int(seq_len) - int(last - first)  # cached tokens before the new ones
        k = _gather(k_cache, block_tables[b], int(seq_len))  # [seq_len, KVH, d]
        v = _gather(v_cache, block_tables[b], int(seq_len))
        out[first:last], lse[first:last] = prefill_attention(q[first:last], k, v, start_pos, scale)
    return out, lse


def causal_mask(num_queries: int, num_keys: int, alignment: str) -> np.ndarray:
    """The boolean causal mask ``[num_queries, num_keys]`` (True = may attend).

    ``"top_left"``: query i sees keys ``0..i`` (PyTorch SDPA ``is_causal=True``).
    ``"bottom_right"``: the last query sees every key, so query i sees keys
    ``0 .. i + num_keys - num_queries`` (FlashAttention >= 2.1, ``causal_lower_right``,
    and chunked prefill, where ``start_pos = num_keys - num_queries``).
    """
    if int(num_queries) != num_queries or int(num_keys) != num_keys:
        raise ValueError(f"num_queries, num_keys must be integers: {num_queries}, {num_keys}")
    if num_queries < 0 or num_keys < 0:
        raise ValueError(f"num_queries={num_queries} and num_keys={num_keys} must be >= 0")
    if alignment == "top_left":
        offset = 0
    elif alignment == "bottom_right":
        offset = int(num_keys) - int(num_queries)
    else:
        raise ValueError(f"alignment must be 'top_left' or 'bottom_right', got {alignment!r}")
    rows = np.arange(int(num_queries))[:, None]
    cols = np.arange(int(num_keys))[None, :]
    return cols <= rows + offset


# ---------------------------------------------------------------------------------------
# Triton: one launch for a whole serving batch
# ---------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E): the kernel works in base 2


@triton.jit
def _sequence_of_tile(query_start_loc_ptr, tile, num_seqs, BLOCK_M: tl.constexpr):
    """Binary search: the sequence whose query tiles include global tile number ``tile``.

    Sequence b's tiles are numbered from ``query_start_loc[b] // BLOCK_M + b`` (an upper
    bound on the tiles before it, so no host-side prefix sum is needed).
    """
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_M + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_kv_tile(
    acc, m_i, l_i, q, q_pos, start_n, kv_end,
    block_table_row_ptr, k_cache_ptr, v_cache_ptr, kv_head,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    offs_d, d_ok, qk_scale,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One K/V tile: gather it through the block table, then the online-softmax update."""
    key_pos = start_n + tl.arange(0, BLOCK_N)  # logical token positions in the sequence
    key_ok = key_pos < kv_end
    block = tl.load(block_table_row_ptr + key_pos // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
    slot = key_pos % PAGE_SIZE
    k_ptrs = (k_cache_ptr + block[None, :] * stride_kb + slot[None, :] * stride_ks
              + kv_head * stride_kh + offs_d[:, None])  # fmt: skip
    v_ptrs = (v_cache_ptr + block[:, None] * stride_vb + slot[:, None] * stride_vs
              + kv_head * stride_vh + offs_d[None, :])  # fmt: skip
    # other=0: a masked slot may hold NaN, and NaN * 0 = NaN inside tl.dot.
    k = tl.load(k_ptrs, mask=d_ok[:, None] & key_ok[None, :], other=0.0)  # [D, BLOCK_N]
    v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, D]

    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    if ON_DIAGONAL:  # only tiles that straddle the diagonal pay for the mask
        s = tl.where(key_pos[None, :] <= q_pos[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)  # rescale what was accumulated under the old max
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _varlen_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    out_ptr, lse_ptr,
    qk_scale, num_seqs,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    stride_lt,
    GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One program = one tile of BLOCK_M queries of one sequence, for one query head."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP

    # Which sequence does this tile belong to, and where in it?
    seq = _sequence_of_tile(query_start_loc_ptr, tile, num_seqs, BLOCK_M)
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile_in_seq = tile - (q_start // BLOCK_M + seq)
    if tile_in_seq * BLOCK_M >= query_len:
        return  # a spare program of the upper-bound grid
    seq_len = tl.load(seq_lens_ptr + seq)
    start_pos = seq_len - query_len  # cached tokens before this sequence's first query

    offs_m = tile_in_seq * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the sequence
    row_ok = offs_m < query_len
    q_pos = start_pos + offs_m  # absolute positions of this tile's queries
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, D]  # fmt: skip

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    block_table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt

    # The loop bounds ARE the causal mask: keys 0..first_pos are seen by every row of the
    # tile (no mask), keys up to the tile's last query need the diagonal mask, and keys
    # past kv_end (the future, and other sequences' slots) are never touched.
    first_pos = start_pos + tile_in_seq * BLOCK_M
    kv_end = tl.minimum(first_pos + BLOCK_M, seq_len)
    full_end = ((first_pos + 1) // BLOCK_N) * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            acc, m_i, l_i, q, q_pos, start_n, kv_end,
            block_table_row_ptr, k_cache_ptr, v_cache_ptr, kv_head,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
            offs_d, d_ok, qk_scale, BLOCK_N, PAGE_SIZE, False, DOT_PRECISION,
        )  # fmt: skip
    for start_n in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            acc, m_i, l_i, q, q_pos, start_n, kv_end,
            block_table_row_ptr, k_cache_ptr, v_cache_ptr, kv_head,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
            offs_d, d_ok, qk_scale, BLOCK_N, PAGE_SIZE, True, DOT_PRECISION,
        )  # fmt: skip

    out = acc / l_i[:, None]
    lse = m_i * 0.6931471805599453 + tl.log(l_i)  # m_i is in log2 units; ln(2) * m_i + ln(l)
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])  # fmt: skip
    tl.store(lse_ptr + q_rows * stride_lt + head, lse, mask=row_ok)


def _block_config(head_dim: int, on_gpu: bool) -> dict[str, int]:
    """Tile sizes: FA2-like on a GPU (64-128 queries per tile), tiny under the interpreter."""
    if not on_gpu:
        return {"BLOCK_M": 16, "BLOCK_N": 16}
    if head_dim <= 128:
        return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}


def varlen_prefill_triton(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    query_start_loc: Any,
    seq_lens: Any,
    scale: float | None = None,
) -> tuple[Any, Any]:
    """Varlen causal attention over a paged cache in one Triton launch (torch tensors).

    Args:
        q: ``[T, H, d]`` fp32 / fp16 / bf16, every sequence's new tokens packed.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]``, same dtype as q.
        block_tables: ``[B, max_blocks]`` int; query_start_loc ``[B+1]``; seq_lens ``[B]``.
        scale: defaults to ``1/sqrt(d)``.

    Returns:
        ``(out [T, H, d] in q's dtype, lse [T, H] float32)``.

    Grid: ``(T // BLOCK_M + B, H)``, an upper bound on the number of query tiles; each
    program binary-searches ``query_start_loc`` for its sequence (as vLLM's
    triton_unified_attention does), so launching needs no per-sequence data on the host.
    """
    import torch

    if q.ndim != 3 or k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"q must be [T, H, d] and k_cache/v_cache [num_blocks, block_size, KVH, d] with "
            f"equal shapes; got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
            f"v_cache {tuple(v_cache.shape)}"
        )
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, page_size, num_kv_heads, _ = k_cache.shape
    if k_cache.shape[3] != head_dim or num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} disagree: head_dim must "
            "match and num_heads must be a multiple of num_kv_heads"
        )
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}")
    if q.dtype == torch.bfloat16 and q.device.type != "cuda":
        raise ValueError(
            "q is bfloat16 on the CPU: the Triton interpreter's tl.dot returns garbage for "
            "bfloat16 (checked with triton 3.9); use float16 or float32 on the CPU"
        )
    # Validation reads the metadata on the host; a production kernel trusts the scheduler.
    _check_varlen_metadata(
        num_tokens,
        num_blocks,
        page_size,
        block_tables.detach().cpu().numpy(),
        query_start_loc.detach().cpu().numpy().astype(np.int64),
        seq_lens.detach().cpu().numpy().astype(np.int64),
    )

    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    device = q.device
    q = q.contiguous()
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    block_tables = block_tables.to(device=device, dtype=torch.int32).contiguous()
    query_start_loc = query_start_loc.to(device=device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=device, dtype=torch.int32).contiguous()
    out = torch.empty_like(q)
    lse = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=device)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out, lse

    config = _block_config(head_dim, on_gpu=device.type == "cuda")
    grid = (num_tokens // config["BLOCK_M"] + num_seqs, num_heads)
    _varlen_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, lse,
        scale * LOG2E, num_seqs,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        lse.stride(0),
        GROUP=num_heads // num_kv_heads, PAGE_SIZE=page_size,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **config,
    )  # fmt: skip
    return out, lse
