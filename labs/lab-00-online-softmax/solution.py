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
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from common.triton_env import DEVICE, INTERPRET, tl, triton

# ---------------------------------------------------------------------------------------
# Input checks (one place, so every function fails the same readable way)
# ---------------------------------------------------------------------------------------


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _as_vector(x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"x must be a 1-D vector, got shape {x.shape}")
    return x.astype(np.result_type(x.dtype, np.float32), copy=False)


def _check_qkv(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [Lq, d], k [Lk, d], v [Lk, dv] as float arrays of one dtype (float64 stays float64)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D [length, dim], got shape {x.shape}")
    if q.shape[1] == 0:
        raise ValueError(f"q must have head_dim >= 1, got shape {q.shape}")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k has head_dim {k.shape[1]} but q has {q.shape[1]}: k {k.shape}")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"v has {v.shape[0]} rows but k has {k.shape[0]}: v {v.shape}")
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def _scale_for(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


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
    q, k, v = _check_qkv(q, k, v)
    Lq, Lk = q.shape[0], k.shape[0]
    if Lk == 0:
        return np.zeros((Lq, v.shape[1]), dtype=q.dtype)
    scores = (q @ k.T) * _scale_for(q.shape[1], scale)  # [Lq, Lk]: the O(N^2) array
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
    x = _as_vector(x)
    tile_size = _positive_int("tile_size", tile_size)
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
    x = _as_vector(x)
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
    q, k, v = _check_qkv(q, k, v)
    block_q = _positive_int("block_q", block_q)
    block_k = _positive_int("block_k", block_k)
    Lq, Lk, dv = q.shape[0], k.shape[0], v.shape[1]
    scale = _scale_for(q.shape[1], scale)
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

    ``seq_len**2 * num_heads * num_layers * bytes_per_element`` (FP16 = 2 bytes): 512 tokens
    give 0.5 MiB per head, 8192 give 128 MiB, 32768 give 2 GiB.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative integer, got {seq_len!r}")
    num_heads = _positive_int("num_heads", num_heads)
    num_layers = _positive_int("num_layers", num_layers)
    bytes_per_element = _positive_int("bytes_per_element", bytes_per_element)
    return int(seq_len) ** 2 * num_heads * num_layers * bytes_per_element


# ---------------------------------------------------------------------------------------
# 4. The same algorithm as a Triton kernel: one program per (query tile, batch*head)
# ---------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): the scale is folded into qk_scale
# A global read inside @triton.jit must be a tl.constexpr (a plain float compiles in the
# interpreter but is a NameError on a GPU).
LN2 = tl.constexpr(0.6931471805599453)

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
        k_mask = offs_d[:, None] < HEAD_DIM
        v_mask = offs_dv[None, :] < HEAD_DIM_V
        if MASKED:  # never read keys at or past hi (they may be another tile's or nobody's)
            k_mask = k_mask & (cols[None, :] < hi)
            v_mask = v_mask & (cols[:, None] < hi)
        k_t = tl.load(
            k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd, mask=k_mask, other=0.0
        )  # [D_PAD, BLOCK_N]
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2
        if MASKED:
            keep = cols[None, :] < hi
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])  # the diagonal is attended
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)  # exp(m_old - m_new): 0 on the first tile
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + cols[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
            mask=v_mask,
            other=0.0,
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
    num_heads, seqlen_q, seqlen_k, qk_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs (exact), "tf32" otherwise
):
    """One program = one tile of BLOCK_M query rows of one (batch, head)."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    o_base = Out + off_b * stride_ob + off_h * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    q = tl.load(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
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
    # Stage 1: tiles below the diagonal and inside Lk, no mask. Stage 2: the rest, masked.
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

    # Epilogue: one division per row (FlashAttention-2's final diag(l)^-1).
    acc = acc / l_i[:, None]
    row_ok = offs_m < seqlen_q
    tl.store(
        o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
        acc.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V),
    )
    if STORE_LSE:  # natural-log LSE per row: (m + log2 l) * ln 2
        tl.store(Lse + off_bh * seqlen_q + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=row_ok)


# fmt: on


def _configs() -> list[Any]:
    """Tile shapes: 16x16 under the interpreter (fast tests), 64-128 tiles tuned on a GPU."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in [
            (128, 64, 4, 3),
            (128, 64, 8, 3),  # 2 warpgroups share the 128 rows: no register spills at d=128
            (128, 128, 8, 3),
            (64, 64, 4, 3),
            (64, 64, 4, 2),  # the small one: fits in shared memory even at head_dim 256
        ]
    ]


_flash_attn_fwd = triton.autotune(configs=_configs(), key=["HEAD_DIM", "HEAD_DIM_V", "CAUSAL"])(
    _flash_attn_fwd_kernel
)


def _check_bhld(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "stride") or x.ndim != 4:
            raise ValueError(
                f"{name} must be a 4-D torch tensor [batch, heads, seq, head_dim], "
                f"got {getattr(x, 'shape', type(x))}"
            )
    B, H, _, d = q.shape
    if tuple(k.shape[:2]) != (B, H) or k.shape[3] != d:
        raise ValueError(
            f"k must be [{B}, {H}, Lk, {d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"v must be [{B}, {H}, {k.shape[2]}, dv] to match k, got {tuple(v.shape)}")
    if d == 0:
        raise ValueError(f"q must have head_dim >= 1, got {tuple(q.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device.type != DEVICE:
            raise ValueError(f"{name} is on {x.device} but Triton runs on {DEVICE} here")


def _flash_attention_triton(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None, with_lse: bool = False
) -> tuple[Any, Any]:
    import torch

    _check_bhld(q, k, v)
    B, H, Lq, d = q.shape
    Lk, dv = k.shape[2], v.shape[3]
    out = torch.zeros((B, H, Lq, dv), dtype=q.dtype, device=q.device)
    lse = torch.full((B, H, Lq), float("-inf"), dtype=torch.float32, device=q.device)
    if Lq == 0 or Lk == 0 or B * H == 0:
        return out, lse  # no keys: output 0, lse -inf
    qk_scale = _scale_for(d, scale) * LOG2E
    grid = lambda meta: (triton.cdiv(Lq, meta["BLOCK_M"]), B * H)
    # fmt: off
    _flash_attn_fwd[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        H, Lq, Lk, qk_scale,
        HEAD_DIM=d, HEAD_DIM_V=dv,
        D_PAD=max(16, triton.next_power_of_2(d)), DV_PAD=max(16, triton.next_power_of_2(dv)),
        CAUSAL=bool(causal), STORE_LSE=with_lse,
        # float32 tl.dot defaults to TF32 on a GPU (~1e-3 error): ask for IEEE fp32
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    # fmt: on
    return out, lse


def flash_attention_triton(
    q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None
) -> Any:
    """FlashAttention forward in Triton on torch tensors.

    Args:
        q: ``[batch, heads, Lq, d]``; k: ``[batch, heads, Lk, d]``; v: ``[batch, heads, Lk, dv]``
            (one dtype: float32 under the interpreter, float16/bfloat16 on a GPU; any strides).
        causal: top-left causal, as in ``naive_attention`` and SDPA's ``is_causal``: query ``i``
            attends keys ``0 … i``; keys past the last query position are never read.
        scale: defaults to ``1/sqrt(d)``.

    Returns:
        ``out [batch, heads, Lq, dv]`` in q's dtype (accumulated in float32).
    """
    out, _ = _flash_attention_triton(q, k, v, causal=causal, scale=scale)
    return out
