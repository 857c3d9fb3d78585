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

import numpy as np
import torch

from common.loader import load_lab_module
from common.triton_env import (
    default_scale,
    dot_precision,
    dot_tile,
    launch_target,
    log2e_scale,
    tile_config,
    tl,
    triton,
)

provided = load_lab_module(__file__, "provided")

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
    start_pos = provided.check_prefill(q, k, v, start_pos)
    num_queries, num_heads, d = q.shape
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
    sizes = provided.check_chunk_sizes(chunk_sizes, q.shape[0])
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
            already written; V's head dim may differ).
        block_tables: ``[B, max_blocks]``; entries past a sequence's last block are padding.
        query_start_loc: ``[B+1]`` starts at 0, non-decreasing, ends at T.
        seq_lens: ``[B]`` context length of each sequence, cached + new. Sequence b's
            queries sit at positions ``seq_lens[b] - query_len_b .. seq_lens[b] - 1``.

    Returns:
        ``(out [T, H, dv], lse [T, H])``. A decode row is a sequence with query_len 1.
    """
    q, k_cache, v_cache = np.asarray(q), np.asarray(k_cache), np.asarray(v_cache)
    block_tables = np.asarray(block_tables)
    query_start_loc = np.asarray(query_start_loc).astype(np.int64)
    seq_lens = np.asarray(seq_lens).astype(np.int64)
    provided.check_varlen_shapes(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    num_blocks, block_size = k_cache.shape[:2]
    provided.check_varlen_metadata(
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
    Any other alignment raises ``ValueError``.
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
# Triton: one launch for a whole serving batch, GQA-packed
# ---------------------------------------------------------------------------------------


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Binary search: the sequence whose query blocks include global block ``q_block``.

    Sequence b's blocks are numbered from ``query_start_loc[b] // BLOCK_Q + b``, never less
    than the number of blocks before it, so no host-side prefix sum is needed.
    """
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_kv_tile(
    acc, m_i, l_i, q, q_pos, start_n, kv_end, block_table_ptr, k_head_ptr, v_head_ptr,
    stride_kb, stride_ks, stride_vb, stride_vs, k_dims, v_dims, d_ok, dv_ok, qk_scale,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    ON_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One K/V tile: gather it through the block table, then the online-softmax update."""
    key_pos = start_n + tl.arange(0, BLOCK_N)  # logical token positions in the sequence
    key_ok = key_pos < kv_end
    block = tl.load(block_table_ptr + key_pos // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
    slot = key_pos % PAGE_SIZE
    k_tokens = block * stride_kb + slot * stride_ks  # [BLOCK_N] offsets, int64
    v_tokens = block * stride_vb + slot * stride_vs
    # other=0: a masked slot may hold NaN, and NaN * 0 = NaN inside tl.dot.
    k = tl.load(k_head_ptr + k_tokens[None, :] + k_dims[:, None],
                mask=d_ok[:, None] & key_ok[None, :], other=0.0)  # [D, BLOCK_N]  # fmt: skip
    v = tl.load(v_head_ptr + v_tokens[:, None] + v_dims[None, :],
                mask=key_ok[:, None] & dv_ok[None, :], other=0.0)  # [BLOCK_N, DV]  # fmt: skip

    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    if ON_DIAGONAL:  # only tiles that straddle the diagonal pay for the score mask
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
    qk_scale, num_seqs, num_splits,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt,
    stride_ot, stride_oh, stride_os, stride_od,
    stride_lt, stride_lh, stride_ls,
    GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, HEAD_DIM_V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One program = BLOCK_Q query tokens of one sequence x the GROUP query heads of one KV
    head, packed into the BLOCK_M rows of one tile: every K/V tile it loads serves them all.

    ``varlen_prefill_triton`` launches it on the grid ``(T // BLOCK_Q + B, KVH,
    num_splits)`` with the arguments above (strides for every dimension: nothing is assumed
    contiguous; V's head dim HEAD_DIM_V may differ from K's HEAD_DIM; both are padded to
    powers of two >= 16, HEAD_DIM_PAD and HEAD_DIM_V_PAD, for tl.dot). Split ``split`` of
    ``num_splits`` takes its share of the key tiles every row sees, split 0 the diagonal
    too; it writes a partial ``(out, lse)`` at its split row (``stride_os``, ``stride_ls``).
    """
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2).to(tl.int64)  # x stride_os: the partials pass 2**31 elements

    # Which sequence does this query block belong to, and where in it?
    seq = _find_seq_idx(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_in_seq = q_block - (q_start // BLOCK_Q + seq)
    if q_block_in_seq * BLOCK_Q >= query_len:
        return  # a spare program of the upper-bound grid
    seq_len = tl.load(seq_lens_ptr + seq)
    start_pos = seq_len - query_len  # cached tokens before this sequence's first query

    # GQA packing: row r is query token r // GROUP, query head kv_head * GROUP + r % GROUP.
    rows = tl.arange(0, BLOCK_M)
    token = q_block_in_seq * BLOCK_Q + rows // GROUP  # query index within the sequence
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (token < query_len)
    q_pos = start_pos + token  # absolute positions of the rows' queries
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, HEAD_DIM_V_PAD)
    dv_ok = offs_dv < HEAD_DIM_V
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh
                + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, D]  # fmt: skip

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V_PAD], dtype=tl.float32)
    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head_ptr = k_cache_ptr + kv_head * stride_kh
    v_head_ptr = v_cache_ptr + kv_head * stride_vh
    k_dims = offs_d * stride_kd
    v_dims = offs_dv * stride_vd

    # The loop bounds ARE the causal mask: keys 0..first_pos are seen by every row (no score
    # mask), keys up to the block's last query need the diagonal mask, and keys at or past
    # kv_end (the future, and slots the sequence does not own) are never touched.
    first_pos = start_pos + q_block_in_seq * BLOCK_Q
    kv_end = tl.minimum(first_pos + BLOCK_Q, seq_len)
    full_end = ((first_pos + 1) // BLOCK_N) * BLOCK_N
    # KV split: this split's share of the full tiles (whole tiles); split 0 also takes the
    # diagonal, after its full tiles, so every row has a key before a masked tile.
    share = tl.cdiv(full_end // BLOCK_N, num_splits) * BLOCK_N
    lo = tl.minimum(split * share, full_end)
    hi = tl.minimum(lo + share, full_end)
    for start_n in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            acc, m_i, l_i, q, q_pos, start_n, kv_end, block_table_ptr, k_head_ptr, v_head_ptr,
            stride_kb, stride_ks, stride_vb, stride_vs, k_dims, v_dims, d_ok, dv_ok, qk_scale,
            BLOCK_N, PAGE_SIZE, False, DOT_PRECISION,
        )  # fmt: skip
    for start_n in range(full_end, tl.where(split == 0, kv_end, full_end), BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            acc, m_i, l_i, q, q_pos, start_n, kv_end, block_table_ptr, k_head_ptr, v_head_ptr,
            stride_kb, stride_ks, stride_vb, stride_vs, k_dims, v_dims, d_ok, dv_ok, qk_scale,
            BLOCK_N, PAGE_SIZE, True, DOT_PRECISION,
        )  # fmt: skip

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # a split with no keys: out 0, lse -inf (identity)
    out = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))  # ln
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh
             + split * stride_os + offs_dv[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])  # fmt: skip
    tl.store(lse_ptr + q_rows * stride_lt + head * stride_lh + split * stride_ls, lse,
             mask=row_ok)  # fmt: skip


def varlen_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen causal attention over a paged cache in one Triton launch (torch tensors).

    Args:
        q: ``[T, H, d]`` fp32 / fp16 (bf16 on a GPU only), every sequence's new tokens packed.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]`` / ``[..., dv]``, q's dtype.
        block_tables: ``[B, max_blocks]`` int; query_start_loc ``[B+1]``; seq_lens ``[B]``.
        scale: defaults to ``1/sqrt(d)`` (the real ``d``, not the padded one).
        block_m: rows of a query tile (power of two >= 16 and >= H // KVH): ``block_m //
            (H // KVH)`` query tokens times the query heads of one KV head.
        block_n: keys per K/V tile (power of two >= 16).
        max_seq_len: the longest ``seq_lens`` entry, known on the host. Given, the launch
            makes no host synchronisation; None is the debug path (one copy of the metadata
            to the host, every value checked).
        num_splits: KV splits per query tile; None = the launch plan's (1 on the
            interpreter; on a GPU, enough to fill a grid under a wave). More than one: the
            kernel writes partials that ``provided.merge_splits`` combines (a second launch).

    Returns:
        ``(out [T, H, dv] in q's dtype, lse [T, H] float32)``.

    Grid: ``(T // BLOCK_Q + B, KVH, num_splits)`` from shapes only; each program
    binary-searches ``query_start_loc`` for its sequence (vLLM 0.33.0's ``find_seq_idx``).
    """
    group = provided.check_varlen_inputs(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_seq_len
    )
    num_tokens, _, head_dim = q.shape
    _, page_size, num_kv_heads, head_dim_v = v_cache.shape
    num_seqs = seq_lens.shape[0]
    tiles = tile_config(
        q,
        gpu=provided.gpu_tiles(num_tokens, num_seqs, group, head_dim, launch_target(q),
                               num_kv_heads=num_kv_heads, max_seq_len=max_seq_len),
        interpreter=provided.INTERPRETER_TILES,
        block_m=block_m,
        block_n=block_n,
    )
    tiles = provided.fit_group(tiles, group, block_m)
    block_q = tiles["block_m"] // group  # BLOCK_M rows = BLOCK_Q query tokens x GROUP heads
    splits = provided.split_count(num_splits, tiles.get("num_splits", 1))
    out, lse = provided.output_buffers(q, head_dim_v)  # [T, H, dv], [T, H] float32
    if num_tokens == 0:
        return out, lse
    part_out, part_lse = provided.split_outputs(out, lse, splits)  # [T, H, S, dv], [T, H, S]
    grid = provided.varlen_grid(num_tokens, num_seqs, num_kv_heads, block_q, splits)
    tables, starts, lens = provided.device_metadata(q, block_tables, query_start_loc, seq_lens)
    qk_scale = log2e_scale(default_scale(head_dim) if scale is None else scale)  # for exp2
    # fmt: off
    _varlen_prefill_kernel[grid](
        q, k_cache, v_cache, tables, starts, lens, part_out, part_lse,
        qk_scale, num_seqs, splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), tables.stride(0),
        *part_out.stride(), *part_lse.stride(),
        GROUP=group, PAGE_SIZE=page_size,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=dot_tile(head_dim),
        HEAD_DIM_V=head_dim_v, HEAD_DIM_V_PAD=dot_tile(head_dim_v),
        BLOCK_M=tiles["block_m"], BLOCK_Q=block_q, BLOCK_N=tiles["block_n"],
        DOT_PRECISION=dot_precision(q.dtype),  # float32: "ieee", else a GPU uses TF32
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )
    # fmt: on
    provided.merge_splits(part_out, part_lse, out, lse)  # nothing for one split
    return out, lse
