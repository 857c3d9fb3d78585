"""Lab 03: causal prefill, chunked prefill and varlen batches (numpy + Triton).

Your work. Replace every ``raise NotImplementedError`` (and the kernel's
``tl.static_assert``) and run ``make test-lab LAB=03 LAB_IMPL=starter`` or
``LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-03-causal-prefill-attention -q``.

The one idea: a block of M queries that starts at position ``start_pos`` is "prefill";
query i sits at position ``start_pos + i`` and reads keys ``0 .. start_pos + i``. The
causal mask is nothing but that loop bound. Decode is the case M = 1, chunked prefill is
the case start_pos > 0, and a serving batch is many of these at once, described by
``query_start_loc`` (where each sequence's queries start in the packed batch) and
``seq_lens`` (how many tokens of context each sequence has, cached + new).

Shapes: q ``[M, H, d]`` (or ``[T, H, d]`` packed), k/v ``[N, KVH, d]``, paged caches
``[num_blocks, block_size, KVH, d]``. Query head h reads KV head ``h // (H // KVH)``.
Bad input raises ``ValueError`` naming the argument: ``provided.py`` has the checks.
"""

from __future__ import annotations

import numpy as np
import torch

from common.loader import load_lab_module
from common.triton_env import (  # noqa: F401  (the launcher's TODO uses them all)
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
    raise NotImplementedError(
        "TODO: start_pos = provided.check_prefill(q, k, v, start_pos) checks the inputs. Then "
        "for each query i, how many keys may it see? Make that number the loop bound: slice k "
        "and v to it, so the future is never read (it is NaN in the tests). Softmax over that "
        "slice, per head, with query head h using KV head h // (H // KVH); lse = m + log(l)."
    )


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
    raise NotImplementedError(
        "TODO: provided.check_chunk_sizes(chunk_sizes, M) checks that they add up to M. Walk "
        "the chunks; when a chunk starts, how many tokens are already in the KV cache? That "
        "number is the chunk's start_pos. Call prefill_attention on the chunk's queries and "
        "the keys the cache holds by then."
    )


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
    raise NotImplementedError(
        "TODO: provided.check_varlen_shapes(...) and provided.check_varlen_metadata(...) "
        "validate the batch. Then per sequence: gather its first seq_lens[b] tokens through "
        "its block table, work out where its queries start (seq_lens[b] - query_len_b), and "
        "reuse prefill_attention."
    )


def causal_mask(num_queries: int, num_keys: int, alignment: str) -> np.ndarray:
    """The boolean causal mask ``[num_queries, num_keys]`` (True = may attend).

    ``"top_left"``: query i sees keys ``0..i`` (PyTorch SDPA ``is_causal=True``).
    ``"bottom_right"``: the last query sees every key, so query i sees keys
    ``0 .. i + num_keys - num_queries`` (FlashAttention >= 2.1, ``causal_lower_right``,
    and chunked prefill, where ``start_pos = num_keys - num_queries``).
    Any other alignment raises ``ValueError``.
    """
    raise NotImplementedError(
        "TODO: compare a column index with a row index plus an offset; which offset makes "
        "the last row see every key? Anything but the two alignments is a ValueError."
    )


# ---------------------------------------------------------------------------------------
# Triton: one launch for a whole serving batch, GQA-packed
# ---------------------------------------------------------------------------------------


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

    TODO, in order (small @triton.jit helpers are welcome):
    1. q_block = tl.program_id(0) (a global query-block number), kv_head = tl.program_id(1).
    2. Find this block's sequence with a binary search over query_start_loc: sequence b's
       blocks are numbered from query_start_loc[b] // BLOCK_Q + b, so seq is the last b whose
       number is <= q_block (vLLM's find_seq_idx). Then q_start, query_len and
       q_block_in_seq = q_block - (q_start // BLOCK_Q + seq). A spare program of the
       upper-bound grid has q_block_in_seq * BLOCK_Q >= query_len: return. Load seq_len;
       start_pos = seq_len - query_len.
    3. GQA packing: row r of the tile is query token q_block_in_seq * BLOCK_Q + r // GROUP
       and query head kv_head * GROUP + r % GROUP. A row is real if r < BLOCK_Q * GROUP and
       its token < query_len. Load Q [BLOCK_M, HEAD_DIM_PAD] at token rows q_start + token
       (in tl.int64: T * stride_qt can pass 2**31) with that mask and other=0.0.
    4. Loop over K/V tiles of BLOCK_N key positions, from 0 up to the block's last query,
       kv_end = min(start_pos + q_block_in_seq * BLOCK_Q + BLOCK_Q, seq_len): that loop bound
       is the causal mask, and nothing at or past kv_end is ever loaded (it is NaN in the
       tests). Gather each key through the block table: page = block_tables[seq, pos //
       PAGE_SIZE], slot = pos % PAGE_SIZE; cast the page to tl.int64 before multiplying by
       its stride (a large cache overflows int32). Masked loads use other=0.0: NaN * 0 = NaN
       inside tl.dot.
    5. Online softmax in float32 with tl.dot (pass input_precision=DOT_PRECISION to both
       dots, or float32 runs as TF32 on a GPU). qk_scale already holds scale * log2(e), so
       use tl.exp2. Tiles that cross the diagonal mask key_pos > the row's position
       start_pos + token with -inf; tiles wholly below it need no score mask.
    6. Store out = acc / l (in out's dtype, the first HEAD_DIM_V columns) and
       lse = ln(2) * (m + log2(l)) (float32) for the real rows.
    7. The KV split (do it last; num_splits = 1 until then): split = tl.program_id(2) (in
       tl.int64: split * stride_os is large). The whole tiles below the block's first query
       are cut into num_splits equal shares of whole tiles; a program loops over its share
       only, and split 0 alone also does the diagonal tiles, after its share (why must every
       row have seen a key before a masked tile?). Store at the split's row (+ split *
       stride_os, + split * stride_ls). A split with no keys has l = 0: it must write
       out = 0 and lse = -inf, the identity of lab 04's merge, not 0 / 0.
    """
    tl.static_assert(False, "TODO: write _varlen_prefill_kernel (the steps are in its docstring)")


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
    # TODO, step by step:
    #   1. group = provided.check_varlen_inputs(q, k_cache, v_cache, block_tables,
    #      query_start_loc, seq_lens, max_seq_len)  (ValueError naming the argument)
    #      num_tokens, _, head_dim = q.shape; _, page_size, num_kv_heads, head_dim_v =
    #      v_cache.shape; num_seqs = seq_lens.shape[0]
    #   2. tiles = tile_config(q, gpu=provided.gpu_tiles(num_tokens, num_seqs, group, head_dim,
    #      launch_target(q), num_kv_heads=num_kv_heads, max_seq_len=max_seq_len),
    #      interpreter=provided.INTERPRETER_TILES, block_m=block_m, block_n=block_n); then
    #      tiles = provided.fit_group(tiles, group, block_m).
    #      A tile's BLOCK_M rows hold BLOCK_Q query tokens x GROUP query heads: BLOCK_Q = ?
    #      splits = provided.split_count(num_splits, tiles.get("num_splits", 1)).
    #   3. out, lse = provided.output_buffers(q, head_dim_v); no tokens: return them now.
    #      part_out, part_lse = provided.split_outputs(out, lse, splits): where the splits
    #      write (out and lse themselves, viewed with a split dim of 1, for one split).
    #   4. grid = provided.varlen_grid(num_tokens, num_seqs, num_kv_heads, BLOCK_Q, splits):
    #      a program per query block of every sequence (the last may be partial) and split.
    #   5. tables, starts, lens = provided.device_metadata(q, block_tables, query_start_loc,
    #      seq_lens) (int32, contiguous).
    #   6. _varlen_prefill_kernel[grid](...) with the arguments in the order of its signature:
    #      part_out / part_lse as out_ptr / lse_ptr; qk_scale = log2e_scale(scale, or
    #      default_scale of the REAL head dim); every stride (*q.stride(), *k_cache.stride(),
    #      *v_cache.stride(), tables.stride(0), *part_out.stride(), *part_lse.stride()); the
    #      constexprs (HEAD_DIM_PAD = dot_tile(head_dim), DOT_PRECISION =
    #      dot_precision(q.dtype), ...), num_warps and num_stages from tiles.
    #   7. provided.merge_splits(part_out, part_lse, out, lse) (nothing for one split);
    #      return out, lse
    raise NotImplementedError(
        "TODO: launch _varlen_prefill_kernel: check the inputs, plan the tiles (BLOCK_Q query "
        "tokens x GROUP heads per tile), allocate out and lse, a grid with a program for "
        "every query block of every sequence, pass every stride (steps 1-7 above)"
    )
