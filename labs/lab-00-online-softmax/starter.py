"""Lab 00: online softmax and the FlashAttention forward pass (numpy, then Triton).

Your work. Fill in every function that raises ``NotImplementedError`` and the Triton kernel.
Each TODO says what to keep true, not how; hints in levels (the idea, the API, near-code) are
in HINTS.md, one step per function: ``make hint LAB=00 STEP=1 LEVEL=1``. Then run

    LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-00-online-softmax -q
    make grade LAB=00                                 (the same, with a score table)

The whole lab is one recurrence. Walk over the scores of a query row tile by tile and keep
three running quantities:

    m    the largest score seen so far                       (running max)
    l    sum of exp(score - m) over the scores seen so far   (softmax denominator)
    acc  sum of exp(score - m) * v over the same scores      (unnormalised output)

Causal attention in this lab is *top-left* aligned, like PyTorch SDPA's ``is_causal``:
query ``i`` attends keys ``0 … i`` whatever Lq and Lk are.

The given code (input checks, the default scale, Triton tile sizes and the launch grid) is
in ``provided.py``; read it first.
"""

from __future__ import annotations

import numpy as np
import torch

from common.loader import load_lab_module
from common.triton_env import (  # noqa: F401  (the launcher's TODO uses them all)
    dot_precision,
    dot_tile,
    log2e_scale,
    tile_config,
    tl,
    triton,
)

provided = load_lab_module(__file__, "provided")

# ---------------------------------------------------------------------------------------
# 1. The baseline: materialise the whole score matrix
# ---------------------------------------------------------------------------------------


def naive_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float | None = None,
    causal: bool = False,
) -> np.ndarray:
    """softmax(q kᵀ · scale) v, building the full ``[Lq, Lk]`` score matrix.

    Args:
        q: ``[Lq, d]``; k: ``[Lk, d]``; v: ``[Lk, dv]``.
        scale: defaults to ``1/sqrt(d)``.
        causal: top-left causal mask: query ``i`` attends keys ``0 … i``.

    Returns:
        ``out [Lq, dv]`` (zeros when there are no keys).
    """
    raise NotImplementedError(
        "TODO: the definition, with the whole score matrix in memory; a hidden key must get a "
        "weight of exactly 0, and no exp may overflow (HINTS.md, step 1)"
    )


# ---------------------------------------------------------------------------------------
# 2. Online softmax on one vector
# ---------------------------------------------------------------------------------------


def online_softmax_steps(x: np.ndarray, tile_size: int) -> list[tuple[float, float]]:
    """One pass over ``x`` tile by tile; the running ``(m, l)`` after each tile.

    ``m`` is the max of everything seen so far and ``l = sum(exp(seen - m))``. A tile whose
    max is below the running max leaves ``m`` unchanged (alpha = 1).

    Args:
        x: 1-D vector of scores (``-inf`` entries are allowed: they weigh 0).
        tile_size: elements per tile (>= 1); the last tile may be shorter.

    Returns:
        ``ceil(len(x) / tile_size)`` pairs ``(m, l)`` as Python floats.
    """
    raise NotImplementedError(
        "TODO: keep l == sum(exp(seen - m)) true after every tile, including the tiles that "
        "raise m; the empty summary is (-inf, 0) (HINTS.md, step 2)"
    )


def online_softmax(x: np.ndarray, tile_size: int) -> np.ndarray:
    """softmax(x) from the ``(m, l)`` of one tiled pass: ``exp(x - m) / l``. Same shape as x."""
    raise NotImplementedError("TODO: what does the last (m, l) know? (HINTS.md, step 3)")


# ---------------------------------------------------------------------------------------
# 3. FlashAttention forward: the same recurrence, a tile of query rows at a time
# ---------------------------------------------------------------------------------------


def flash_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    block_q: int = 16,
    block_k: int = 16,
    scale: float | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Tiled exact attention; never holds more than a ``[block_q, block_k]`` score tile.

    Args:
        q: ``[Lq, d]``; k: ``[Lk, d]``; v: ``[Lk, dv]``.
        block_q, block_k: query rows / keys per tile (>= 1).
        scale: defaults to ``1/sqrt(d)``.
        causal: top-left causal (query ``i`` attends keys ``0 … i``); K/V tiles entirely
            above the diagonal are skipped, and keys past the last query are never read.

    Returns:
        ``(out [Lq, dv], lse [Lq])`` with ``lse = m + log(l)`` (natural log); a row with
        no keys has output 0 and ``lse = -inf``.
    """
    raise NotImplementedError(
        "TODO: step 2's recurrence for every query row, with an unnormalised output beside l; "
        "one score tile alive at a time; causal is a loop bound. The loop order and the state "
        "kept between tiles are yours to choose (HINTS.md, step 4)"
    )


def score_matrix_bytes(
    seq_len: int, num_heads: int = 1, num_layers: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the ``seq_len x seq_len`` score matrices naive attention materialises.

    One matrix per head per layer, ``bytes_per_element`` bytes per score (FP16 = 2): at
    FP16 one head holds 0.5 MiB at 512 tokens, 128 MiB at 8192 and 2 GiB at 32768.
    ``ValueError`` (naming the argument) for a negative ``seq_len`` or a count below 1.
    """
    raise NotImplementedError(
        "TODO: how many scores does one head of one layer hold? (HINTS.md, step 5)")


# ---------------------------------------------------------------------------------------
# 4. The same algorithm as a Triton kernel: one program per (query tile, batch·head)
# ---------------------------------------------------------------------------------------

# Kernel arguments are grouped by meaning, one group per line, so the formatter is off here.
# fmt: off


@triton.jit
def _flash_attn_fwd_kernel(
    Q, K, V, Out, Lse,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    num_heads, seqlen_q, seqlen_k, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program = one tile of BLOCK_M query rows of one (batch, head).

    Q ``[B, H, Lq, HEAD_DIM]``, K ``[B, H, Lk, HEAD_DIM]``, V ``[B, H, Lk, HEAD_DIM_V]``,
    Out ``[B, H, Lq, HEAD_DIM_V]`` (any strides, one stride per dim); Lse ``[B, H, Lq]``
    float32. ``qk_scale`` = softmax scale x log2(e), so scores are in base 2 (``exp2``).
    D_PAD / DV_PAD: head dims padded to a ``tl.dot`` tile. The grid is
    ``provided.attention_grid``: program ``pid`` is query tile ``pid % cdiv(Lq, BLOCK_M)``
    of batch·head ``pid // cdiv(Lq, BLOCK_M)``.

    TODO: one query tile of your numpy ``flash_attention_forward``, for one (batch, head).
    Find the tile from the program id (the grid's layout is above); load q once; keep
    ``m_i``, ``l_i``, ``acc`` in float32 across the key tiles; causal bounds the loop; every
    load and store is masked to the data (the tiles are powers of two, the data is not);
    store out and a natural-log ``lse``. The calls: lab 09's triton-sheet.md. Hints in
    levels: HINTS.md, step 6 (``make hint LAB=00 STEP=6 LEVEL=1``).
    """
    tl.static_assert(False, "TODO: write _flash_attn_fwd_kernel (HINTS.md, step 6)")


# fmt: on


def flash_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    *,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward in Triton on torch tensors.

    Args:
        q: ``[batch, heads, Lq, d]``; k: ``[batch, heads, Lk, d]``; v: ``[batch, heads, Lk,
            dv]``: one dtype (float32 or float16 on the CPU interpreter, bfloat16 too on a
            GPU), any strides (no contiguity assumed), ``dv`` may differ from ``d``.
        causal: top-left causal, as in ``naive_attention`` and SDPA's ``is_causal``: query ``i``
            attends keys ``0 … i``; keys past the last query position are never read.
        scale: defaults to ``1/sqrt(d)`` (the real ``d``, not the padded one).
        block_m, block_n: query rows / keys per tile (powers of two >= 16); ``None`` = the
            launcher's choice (``provided.INTERPRETER_TILES`` or ``provided.gpu_tiles``).

    Returns:
        ``(out [batch, heads, Lq, dv]`` in q's dtype (accumulated in float32),
        ``lse [batch, heads, Lq]`` float32, natural log, ``-inf`` for a row with no keys).
    """
    # TODO: check, allocate, choose the tiles, launch, return; no arithmetic on the data.
    #   Everything a program cannot compute from its id is a kernel argument (HINTS.md,
    #   step 7).
    raise NotImplementedError(
        "TODO: launch _flash_attn_fwd_kernel over one program per query tile and (batch, head), "
        "with every stride (HINTS.md, step 7)"
    )
