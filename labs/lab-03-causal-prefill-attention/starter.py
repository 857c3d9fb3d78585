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
        "TODO: query i never reads a key past its own position; the mask is the loop bound "
        "(HINTS.md step 1: make hint LAB=03 STEP=1 LEVEL=1)"
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
        "TODO: each chunk sees exactly the tokens before it and its own causal part (HINTS.md "
        "step 2: make hint LAB=03 STEP=2 LEVEL=1)"
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
    raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=03 STEP=3 LEVEL=1)")


def causal_mask(num_queries: int, num_keys: int, alignment: str) -> np.ndarray:
    """The boolean causal mask ``[num_queries, num_keys]`` (True = may attend).

    ``"top_left"``: query i sees keys ``0..i`` (PyTorch SDPA ``is_causal=True``).
    ``"bottom_right"``: the last query sees every key, so query i sees keys
    ``0 .. i + num_keys - num_queries`` (FlashAttention >= 2.1, ``causal_lower_right``,
    and chunked prefill, where ``start_pos = num_keys - num_queries``).
    Any other alignment raises ``ValueError``.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=03 STEP=4 LEVEL=1)")


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
    """
    tl.static_assert(False,
        "TODO: every row's state summarises only keys at or before its own position (HINTS.md "
        "step 5: make hint LAB=03 STEP=5 LEVEL=1)"
    )


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
    raise NotImplementedError("TODO: HINTS.md step 6 (make hint LAB=03 STEP=6 LEVEL=1)")
