"""Lab 00: online softmax and the FlashAttention forward pass (numpy, then Triton).

Your work. Fill in every function that raises ``NotImplementedError`` and the Triton kernel
(its steps are in its docstring), then run

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
        "TODO: scores = q @ k.T * scale; hide keys j > i with -inf when causal; subtract each "
        "row's max before exp; divide by the row sum; multiply by v"
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
        "TODO: start from m = -inf, l = 0. For each tile: the new max is max(m, tile max); "
        "the old l was summed against the old max, so multiply it by exp(m_old - m_new) "
        "before adding this tile's exp(tile - m_new). Careful while m is still -inf."
    )


def online_softmax(x: np.ndarray, tile_size: int) -> np.ndarray:
    """softmax(x) from the ``(m, l)`` of one tiled pass: ``exp(x - m) / l``. Same shape as x."""
    raise NotImplementedError("TODO: one pass of online_softmax_steps gives the final (m, l)")


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
        "TODO: for each tile of block_q query rows keep m, l (one per row) and acc "
        "[rows, dv]; for each tile of block_k keys compute only that score tile, update "
        "m, l and acc the way online_softmax_steps updates m and l (acc gets the same "
        "correction factor), and when causal stop the key loop at the tile's last row. "
        "At the end: out = acc / l, lse = m + log(l)."
    )


def score_matrix_bytes(
    seq_len: int, num_heads: int = 1, num_layers: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the ``seq_len x seq_len`` score matrices naive attention materialises.

    One matrix per head per layer, ``bytes_per_element`` bytes per score (FP16 = 2): at
    FP16 one head holds 0.5 MiB at 512 tokens, 128 MiB at 8192 and 2 GiB at 32768.
    ``ValueError`` (naming the argument) for a negative ``seq_len`` or a count below 1.
    """
    raise NotImplementedError("TODO: how many scores does one head of one layer hold?")


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

    TODO, step by step (the numpy ``flash_attention_forward`` is the same loop):
      1. Which tile: ``pid = tl.program_id(0)``; ``start_m = pid % tl.cdiv(seqlen_q, BLOCK_M)``,
         ``off_bh = pid // tl.cdiv(seqlen_q, BLOCK_M)``; batch ``off_bh // num_heads``, head
         ``off_bh % num_heads``, both ``.to(tl.int64)``. Move Q, K, V, Out and Lse to this
         (batch, head) with their batch and head strides.
      2. ``offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)`` (query positions). Load the q
         tile ``[BLOCK_M, D_PAD]`` once, masking rows ``>= seqlen_q`` and columns
         ``>= HEAD_DIM`` with ``other=0.0`` (tl.dot needs dims >= 16, so small head dims
         are padded with zeros). Row offsets in int64: ``offs_m.to(tl.int64) * stride_qm``.
      3. ``m_i = -inf``, ``l_i = 0`` (``[BLOCK_M]``) and ``acc = 0`` (``[BLOCK_M, DV_PAD]``),
         all ``tl.float32``.
      4. The key bound ``hi``: ``seqlen_k``; if CAUSAL, also ``min(seqlen_q, (start_m + 1) *
         BLOCK_M)``: the tile's last row + 1, so tiles above the diagonal are never visited.
      5. Loop ``start_n`` over ``range(0, hi, BLOCK_N)``; ``cols = start_n + tl.arange(0,
         BLOCK_N)``. Load k transposed ``[D_PAD, BLOCK_N]`` and v ``[BLOCK_N, DV_PAD]``
         masked by ``cols < hi`` (keys past it may be NaN) and the head-dim pad. Offsets in
         int64: ``cols.to(tl.int64) * stride_kn`` (``Lk * H * d`` can pass 2^31).
      6. ``s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale``; set ``s`` to -inf
         where ``cols >= hi`` or (CAUSAL) ``cols > offs_m`` (the diagonal is attended).
      7. The update, in base 2: ``m_new = max(m_i, rowmax(s))``, ``alpha = exp2(m_i - m_new)``,
         ``p = exp2(s - m_new)``, ``l_i = l_i * alpha + rowsum(p)``, ``acc = acc * alpha``
         then ``acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)``,
         ``m_i = m_new``.
      8. Store ``acc / l_i`` (in Out's dtype) with the row and head-dim masks, and
         ``lse = (m_i + log2(l_i)) * provided.LN2`` (natural log) with the row mask.
    Faster, once it passes: split the loop in two, tiles every row sees in full (no
    masks) and the rest (the diagonal and the ragged tail), like Triton's tutorial 06.
    """
    tl.static_assert(False, "TODO: write _flash_attn_fwd_kernel (the steps are in its docstring)")


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
    # TODO, step by step:
    #   1. provided.check_bhld(q, k, v)  (shapes, dtype, device; ValueError naming the argument)
    #      B, H, Lq, d = q.shape; Lk, dv = k.shape[2], v.shape[3]
    #   2. out = torch.zeros((B, H, Lq, dv), dtype=q.dtype, device=q.device)
    #      lse = torch.full((B, H, Lq), float("-inf"), dtype=torch.float32, device=q.device)
    #      If there is nothing to compute (B * H * Lq == 0 or Lk == 0) return (out, lse) now.
    #   3. tiles = tile_config(q, gpu=provided.gpu_tiles(d), interpreter=provided.INTERPRETER_TILES,
    #                          block_m=block_m, block_n=block_n)
    #   4. grid = provided.attention_grid(B, H, Lq, tiles["block_m"])
    #   5. _flash_attn_fwd_kernel[grid](q, k, v, out, lse, then every stride: *q.stride(),
    #      *k.stride(), *v.stride(), *out.stride(), *lse.stride(); then H, Lq, Lk and
    #      qk_scale = log2e_scale(provided.scale_for(d, scale)) (the REAL d); then the
    #      constexprs HEAD_DIM=d, HEAD_DIM_V=dv, D_PAD=dot_tile(d), DV_PAD=dot_tile(dv),
    #      CAUSAL=bool(causal), BLOCK_M=tiles["block_m"], BLOCK_N=tiles["block_n"],
    #      DOT_PRECISION=dot_precision(q.dtype), num_warps=tiles["num_warps"],
    #      num_stages=tiles["num_stages"]).
    #   6. return out, lse
    raise NotImplementedError(
        "TODO: launch _flash_attn_fwd_kernel: check the inputs, allocate out and lse, pick the "
        "tiles, compute the grid, pass every stride (steps 1-6 above)"
    )
