"""Lab 00: online softmax and the FlashAttention forward pass (numpy, then Triton).

Your work. Fill in every function that raises ``NotImplementedError``, then run

    LAB_IMPL=starter pytest labs/lab-00-online-softmax -q      (or: make grade LAB=00)

The whole lab is one recurrence. Walk over the scores of a query row tile by tile and keep
three running quantities:

    m    the largest score seen so far                       (running max)
    l    sum of exp(score - m) over the scores seen so far   (softmax denominator)
    acc  sum of exp(score - m) * v over the same scores      (unnormalised output)

Causal attention in this lab is *top-left* aligned, like PyTorch SDPA's ``is_causal``:
query ``i`` attends keys ``0 … i`` whatever Lq and Lk are.

The small helpers at the top (input checks, the default scale) are given.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common.triton_env import DEVICE, INTERPRET, tl, triton

# ---------------------------------------------------------------------------------------
# Given: input checks (one place, so every function fails the same readable way)
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

    One ``seq_len x seq_len`` matrix per head per layer, ``bytes_per_element`` bytes per
    score (FP16 = 2). Raise ``ValueError`` for a negative ``seq_len``.
    """
    raise NotImplementedError("TODO: how many scores does one head of one layer hold?")


# ---------------------------------------------------------------------------------------
# 4. The same algorithm as a Triton kernel: one program per (query tile, batch*head)
# ---------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): fold it into the score scale
# A global read inside @triton.jit must be a tl.constexpr (a plain float compiles in the
# interpreter but is a NameError on a GPU).
LN2 = tl.constexpr(0.6931471805599453)


# fmt: off
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
    """One program = one tile of BLOCK_M query rows of one (batch, head).

    TODO, step by step:
      1. start_m = tl.program_id(0) (which query tile), off_bh = tl.program_id(1); split
         off_bh into batch and head and offset the Q/K/V/Out pointers with the strides.
      2. Load the [BLOCK_M, D_PAD] tile of q once (mask rows >= seqlen_q and columns >=
         HEAD_DIM with other=0: tl.dot needs dims >= 16, so small head dims are padded).
      3. m_i = -inf, l_i = 0 (shape [BLOCK_M]), acc = 0 ([BLOCK_M, DV_PAD]), all float32.
      4. Loop over key tiles of BLOCK_N: load k transposed ([D_PAD, BLOCK_N]), s = tl.dot(q, k)
         * qk_scale (log2 units, use tl.math.exp2; pass input_precision=DOT_PRECISION to
         both tl.dot calls: float32 on a GPU is otherwise TF32, ~1e-3 off), mask keys >= the
         bound (and, if CAUSAL, keys after the row), update m_i, l_i, acc;
         acc = tl.dot(p.to(v.dtype), v, acc).
         Causal: this tile's last row is its bound, so stop the loop there, and never load
         keys past it (they may be NaN). Tiles that every row sees in full need no mask.
      5. acc / l_i[:, None], stored with a row mask; if STORE_LSE, (m_i + log2(l_i)) * LN2.
    """
    pass
# fmt: on


def _configs() -> list[Any]:
    """Given: tile shapes, 16x16 under the interpreter (fast tests), 64-128 tiles on a GPU."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm, bn, w, s in [
            (128, 64, 4, 3),
            (128, 64, 8, 3),  # 2 warpgroups share the 128 rows: no register spills at d=128
            (128, 128, 8, 3),
            (64, 64, 4, 3),
            (64, 64, 4, 2),
        ]
    ]


# Given: the autotuner picks BLOCK_M / BLOCK_N / num_warps / num_stages; do not pass them.
_flash_attn_fwd = triton.autotune(configs=_configs(), key=["HEAD_DIM", "HEAD_DIM_V", "CAUSAL"])(
    _flash_attn_fwd_kernel
)


def _check_bhld(q: Any, k: Any, v: Any) -> None:
    """Given: q [B, H, Lq, d], k [B, H, Lk, d], v [B, H, Lk, dv], one dtype, on DEVICE."""
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
    # Suggested shape of the launcher:
    #   _check_bhld(q, k, v); out = torch.zeros(B, H, Lq, dv) like q (return it if Lk == 0)
    #   grid = lambda meta: (triton.cdiv(Lq, meta["BLOCK_M"]), B * H)
    #   _flash_attn_fwd[grid](q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(),
    #       *out.stride(), H, Lq, Lk, scale * LOG2E, HEAD_DIM=d, HEAD_DIM_V=dv,
    #       D_PAD=max(16, triton.next_power_of_2(d)), DV_PAD=..., CAUSAL=causal, STORE_LSE=False,
    #       DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    raise NotImplementedError(
        "TODO: write _flash_attn_fwd_kernel (the numpy flash_attention_forward, one program "
        "per query tile and batch*head, tl.dot for both matmuls), then launch it here"
    )
