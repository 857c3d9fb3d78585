"""Lab 03: causal prefill, chunked prefill and varlen batches (numpy + Triton).

Your work. Replace every ``raise NotImplementedError`` and run
``LAB_IMPL=starter pytest labs/lab-03-causal-prefill-attention -q``.

The one idea: a block of M queries that starts at position ``start_pos`` is "prefill";
query i sits at position ``start_pos + i`` and reads keys ``0 .. start_pos + i``. The
causal mask is nothing but that loop bound. Decode is the case M = 1, chunked prefill is
the case start_pos > 0, and a serving batch is many of these at once, described by
``query_start_loc`` (where each sequence's queries start in the packed batch) and
``seq_lens`` (how many tokens of context each sequence has, cached + new).

Shapes: q ``[M, H, d]`` (or ``[T, H, d]`` packed), k/v ``[N, KVH, d]``, paged caches
``[num_blocks, block_size, KVH, d]``. Query head h reads KV head ``h // (H // KVH)``.
Bad input raises ``ValueError`` naming the argument (the tests check the name).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.triton_env import tl, triton

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
        "TODO: check the inputs (k must hold at least start_pos + M tokens; name the argument "
        "in a ValueError). Then for each query i, how many keys may it see? Make that number "
        "the loop bound: slice k and v to it, so the future is never read (it is NaN in the "
        "tests). Softmax over that slice, per head, with query head h using KV head "
        "h // (H // KVH); lse = m + log(l)."
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
        "TODO: check that chunk_sizes add up to M. Walk the chunks; when a chunk starts, how "
        "many tokens are already in the KV cache? That number is the chunk's start_pos. Call "
        "prefill_attention on the chunk's queries and the keys the cache holds by then."
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
            already written).
        block_tables: ``[B, max_blocks]``; entries past a sequence's last block are padding.
        query_start_loc: ``[B+1]`` starts at 0, non-decreasing, ends at T.
        seq_lens: ``[B]`` context length of each sequence, cached + new. Sequence b's
            queries sit at positions ``seq_lens[b] - query_len_b .. seq_lens[b] - 1``.

    Returns:
        ``(out [T, H, dv], lse [T, H])``. A decode row is a sequence with query_len 1.
    """
    raise NotImplementedError(
        "TODO: validate the metadata (query_start_loc starts at 0, never decreases, ends at "
        "T; seq_lens[b] >= query_len_b; block_tables has enough columns), each failure a "
        "ValueError naming the argument. Then per sequence: gather its first seq_lens[b] "
        "tokens through its block table, work out where its queries start, and reuse "
        "prefill_attention."
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
# Triton: one launch for a whole serving batch
# ---------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E): a kernel can work in base 2


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
    """One program = one tile of BLOCK_M queries of one sequence, for one query head.

    TODO, in order:
    1. tile = tl.program_id(0), head = tl.program_id(1), kv_head = head // GROUP.
    2. Find the sequence this tile belongs to. Either binary-search query_start_loc in the
       kernel (a sequence's tiles can be numbered from query_start_loc[b] // BLOCK_M + b),
       or pass a tile -> sequence map computed on the host. Return early if the tile has
       no queries. start_pos = seq_len - query_len.
    3. Load the tile's queries [BLOCK_M, HEAD_DIM_PAD] with a mask (other=0.0).
    4. Loop over K/V tiles of BLOCK_N positions, only up to the tile's last query (the
       loop bound is the causal mask; tiles wholly above the diagonal are never visited).
       Gather each key's page through the block table: block_tables[seq, pos // PAGE_SIZE],
       slot pos % PAGE_SIZE (cast the page number to tl.int64 before multiplying by its
       stride: a large cache overflows int32). Masked loads use other=0.0: NaN * 0 = NaN
       inside tl.dot.
    5. Online softmax in fp32 with tl.dot (scores * qk_scale are in log2 units: use
       tl.exp2; pass input_precision=DOT_PRECISION to both tl.dot calls, or float32 on a
       GPU runs as TF32); mask key_pos > query_pos with -inf only on tiles that cross the
       diagonal.
    6. Store out = acc / l (in out's dtype) and lse = ln(2) * m + ln(l) for valid rows.
    """


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

    Launch sketch (fill in the kernel above first):
        validate the metadata as varlen_prefill_attention does (ValueError naming it);
        out = torch.empty_like(q); lse = torch.empty((T, H), dtype=torch.float32)
        BLOCK_M, BLOCK_N = 16, 16 under the interpreter (64-128 and 32-64 on a GPU)
        grid = (number of query tiles, or an upper bound such as T // BLOCK_M + B, H)
        _varlen_prefill_kernel[grid](..., qk_scale=scale * LOG2E, ...,
            HEAD_DIM_PAD=max(16, triton.next_power_of_2(d)),
            DOT_PRECISION="ieee" if q is float32 else "tf32")
    """
    raise NotImplementedError(
        "TODO: validate, allocate out and lse, choose the tile sizes and the grid, launch "
        "_varlen_prefill_kernel (see the launch sketch in this docstring), return (out, lse)."
    )
