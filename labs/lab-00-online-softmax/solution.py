"""Lab 00 solution: online softmax and the FlashAttention forward pass (numpy, then Triton).

The whole lab is one recurrence. Walk over the scores of a query row tile by tile and keep
three running quantities:

    m    the largest score seen so far                       (running max)
    l    sum of exp(score - m) over the scores seen so far   (softmax denominator)
    acc  sum of exp(score - m) * v over the same scores      (unnormalised output)

When a tile raises the max from m_old to m_new, everything accumulated so far was
exponentiated against the old max; multiplying it by alpha = exp(m_old - m_new) re-bases
it exactly. After the last tile: out = acc / l and lse = m + log(l).

Causal attention here is *top-left* aligned, like PyTorch SDPA's ``is_causal``: query ``i``
attends keys ``0 … i`` whatever Lq and Lk are (keys past the last query are never read).
The given code (input checks, scale, tile sizes, launch grid) is in ``provided.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from common.loader import load_lab_module
from common.triton_env import dot_precision, dot_tile, log2e_scale, tile_config, tl, triton

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
    q, k, v = provided.check_qkv(q, k, v)
    Lq, Lk = q.shape[0], k.shape[0]
    if Lk == 0:
        return np.zeros((Lq, v.shape[1]), dtype=q.dtype)
    scores = (q @ k.T) * provided.scale_for(q.shape[1], scale)  # [Lq, Lk]: the O(N^2) array
    if causal:
        allowed = np.arange(Lk)[None, :] <= np.arange(Lq)[:, None]  # top-left: j <= i
        scores = np.where(allowed, scores, -np.inf)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))  # every row sees key 0: max finite
    return (p / p.sum(axis=1, keepdims=True)) @ v


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
    x = provided.as_vector(x)
    tile_size = provided.positive_int("tile_size", tile_size)
    m, l = -math.inf, 0.0
    steps: list[tuple[float, float]] = []
    for start in range(0, x.size, tile_size):
        tile = x[start : start + tile_size]
        m_new = max(m, float(tile.max()))
        if m_new > -math.inf:  # nothing but -inf seen so far: nothing to add yet
            alpha = math.exp(m - m_new)  # rescales the old sum; exp(-inf) = 0 on the first tile
            l = l * alpha + float(np.exp(tile - m_new).sum())
            m = m_new
        steps.append((m, l))
    return steps


def online_softmax(x: np.ndarray, tile_size: int) -> np.ndarray:
    """softmax(x) from the ``(m, l)`` of one tiled pass: ``exp(x - m) / l``. Same shape as x."""
    steps = online_softmax_steps(x, tile_size)
    x = provided.as_vector(x)
    if not steps:
        return np.zeros_like(x)
    m, l = steps[-1]
    return np.exp(x - m) / l


# ---------------------------------------------------------------------------------------
# 3. FlashAttention forward: the same recurrence, a tile of query rows at a time
# ---------------------------------------------------------------------------------------


def _key_tiles(q_end: int, num_keys: int, block_k: int, causal: bool) -> Iterator[tuple[int, int]]:
    """The key tiles ``[k0, k1)`` that the query rows ``< q_end`` need.

    Causal (top-left): the last row of the tile is ``q_end - 1``, so keys ``>= q_end`` are
    needed by nobody in it: the loop stops there (tiles above the diagonal are skipped and
    the last tile is cut short; those keys are never read).
    """
    hi = min(num_keys, q_end) if causal else num_keys
    for k0 in range(0, hi, block_k):
        yield k0, min(k0 + block_k, hi)


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
    q, k, v = provided.check_qkv(q, k, v)
    block_q = provided.positive_int("block_q", block_q)
    block_k = provided.positive_int("block_k", block_k)
    Lq, Lk, dv = q.shape[0], k.shape[0], v.shape[1]
    scale = provided.scale_for(q.shape[1], scale)
    out = np.zeros((Lq, dv), dtype=q.dtype)
    lse = np.full(Lq, -np.inf, dtype=q.dtype)
    if Lk == 0:  # no keys at all: output 0, lse -inf (not 0 / 0)
        return out, lse

    for q0 in range(0, Lq, block_q):
        q1 = min(q0 + block_q, Lq)
        rows = np.arange(q0, q1)
        m = np.full(q1 - q0, -np.inf)  # [bq] running max
        l = np.zeros(q1 - q0)  # [bq] running denominator
        acc = np.zeros((q1 - q0, dv))  # [bq, dv] unnormalised output

        for k0, k1 in _key_tiles(q1, Lk, block_k, causal):
            s = (q[q0:q1] @ k[k0:k1].T) * scale  # [bq, bk]: the only score tile alive
            if causal:
                s = np.where(np.arange(k0, k1)[None, :] <= rows[:, None], s, -np.inf)
            # finite: the first tile holds key 0, which every row may attend (top-left causal)
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp(m - m_new)  # [bq] re-bases old l and acc onto the new max; 0 at first
            p = np.exp(s - m_new[:, None])  # [bq, bk]
            l = alpha * l + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v[k0:k1]
            m = m_new

        out[q0:q1] = acc / l[:, None]  # FlashAttention-2: one division per row, at the end
        lse[q0:q1] = m + np.log(l)
    return out, lse


def score_matrix_bytes(
    seq_len: int, num_heads: int = 1, num_layers: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the ``seq_len x seq_len`` score matrices naive attention materialises.

    One matrix per head per layer, ``bytes_per_element`` bytes per score (FP16 = 2): at
    FP16 one head holds 0.5 MiB at 512 tokens, 128 MiB at 8192 and 2 GiB at 32768.
    ``ValueError`` (naming the argument) for a negative ``seq_len`` or a count below 1.
    """
    seq_len = provided.non_negative_int("seq_len", seq_len)
    num_heads = provided.positive_int("num_heads", num_heads)
    num_layers = provided.positive_int("num_layers", num_layers)
    bytes_per_element = provided.positive_int("bytes_per_element", bytes_per_element)
    return seq_len**2 * num_heads * num_layers * bytes_per_element


# ---------------------------------------------------------------------------------------
# 4. The same algorithm as a Triton kernel: one program per (query tile, batch·head)
# ---------------------------------------------------------------------------------------

# Kernel arguments are grouped by meaning, one group per line, so the formatter is off here.
# fmt: off


@triton.jit
def _attn_fwd_tiles(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, lo, hi, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold key tiles ``[lo, hi)`` into (acc, l_i, m_i). MASKED tiles check ``key < hi`` and,
    if CAUSAL, ``key <= query``; unmasked tiles are entirely visible to every row."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n  # key positions of this tile
        k_mask = offs_d[:, None] < HEAD_DIM  # the head-dim pad reads zeros
        v_mask = offs_dv[None, :] < HEAD_DIM_V
        if MASKED:  # never read keys at or past hi (another tile's, nobody's, or past Lk)
            k_mask = k_mask & (cols[None, :] < hi)
            v_mask = v_mask & (cols[:, None] < hi)
        key_offs = cols.to(tl.int64)  # key * stride_kn passes 2^31 once L * H * d does
        k_t = tl.load(
            k_base + key_offs[None, :] * stride_kn + offs_d[:, None] * stride_kd,
            mask=k_mask, other=0.0,
        )  # [D_PAD, BLOCK_N]
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2
        if MASKED:
            keep = cols[None, :] < hi
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])  # the diagonal is attended
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)  # exp(m_old - m_new) in base 2: 0 on the first tile
        p = tl.math.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + key_offs[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
            mask=v_mask, other=0.0,
        )  # [BLOCK_N, DV_PAD]
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # fp32 accumulate
        m_i = m_new
    return acc, l_i, m_i


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
    """
    pid = tl.program_id(0)
    num_m_tiles = tl.cdiv(seqlen_q, BLOCK_M)
    start_m = pid % num_m_tiles
    off_bh = pid // num_m_tiles
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    lse_base = Lse + off_b * stride_lb + off_h * stride_lh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions of this tile
    rows = offs_m.to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    row_ok = offs_m < seqlen_q
    q = tl.load(
        q_base + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0,
    )  # [BLOCK_M, D_PAD], stays on chip for the whole loop

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], dtype=tl.float32)

    # Keys this tile needs (hi) and keys every row of it sees (full_hi).
    if CAUSAL:  # top-left: row r sees keys 0..r; rows of this tile end at min(Lq, m0 + BLOCK_M)
        hi = tl.minimum(seqlen_k, tl.minimum(seqlen_q, (start_m + 1) * BLOCK_M))
        full_hi = tl.minimum(hi, start_m * BLOCK_M + 1)
    else:
        hi = seqlen_k
        full_hi = seqlen_k
    unmasked_hi = (full_hi // BLOCK_N) * BLOCK_N
    # Stage 1: whole tiles every row sees, no mask. Stage 2: the rest (diagonal, ragged tail).
    acc, l_i, m_i = _attn_fwd_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, 0, unmasked_hi, qk_scale,
        HEAD_DIM, HEAD_DIM_V, D_PAD, DV_PAD, BLOCK_N, CAUSAL, False, DOT_PRECISION,
    )
    acc, l_i, m_i = _attn_fwd_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, unmasked_hi, hi, qk_scale,
        HEAD_DIM, HEAD_DIM_V, D_PAD, DV_PAD, BLOCK_N, CAUSAL, True, DOT_PRECISION,
    )

    # Epilogue: one division per row (FlashAttention-2's final diag(l)^-1), then the lse.
    acc = acc / l_i[:, None]
    tl.store(
        o_base + rows[:, None] * stride_om + offs_dv[None, :] * stride_od,
        acc.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V),
    )
    # m_i and log2(l_i) are base-2 logs: times ln(2) gives the natural log of the contract
    tl.store(lse_base + rows * stride_lm, (m_i + tl.math.log2(l_i)) * provided.LN2, mask=row_ok)


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
    provided.check_bhld(q, k, v)
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    out = torch.zeros((B, H, Lq, dv), dtype=q.dtype, device=q.device)
    lse = torch.full((B, H, Lq), float("-inf"), dtype=torch.float32, device=q.device)
    if B * H * Lq == 0 or Lk == 0:
        return out, lse  # no keys: output 0, lse -inf (no 0 / 0)
    tiles = tile_config(
        q,
        gpu=provided.gpu_tiles(d),
        interpreter=provided.INTERPRETER_TILES,
        block_m=block_m,
        block_n=block_n,
    )
    # fmt: off
    _flash_attn_fwd_kernel[provided.attention_grid(B, H, Lq, tiles["block_m"])](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        H, Lq, Lk, log2e_scale(provided.scale_for(d, scale)),
        HEAD_DIM=d, HEAD_DIM_V=dv, D_PAD=dot_tile(d), DV_PAD=dot_tile(dv),
        CAUSAL=bool(causal), BLOCK_M=tiles["block_m"], BLOCK_N=tiles["block_n"],
        DOT_PRECISION=dot_precision(q.dtype),  # float32: "ieee", else a GPU uses TF32
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )
    # fmt: on
    return out, lse
