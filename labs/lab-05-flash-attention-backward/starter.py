"""Lab 05: the FlashAttention backward pass (numpy, then Triton, then autograd).

Your work. Fill in every function that raises ``NotImplementedError``, the three Triton
kernels (their steps are in their docstrings) and ``FlashAttentionFunction``, then run

    LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-05-flash-attention-backward -q
    make grade LAB=05                                 (the same, with a score table)

The forward computed, per query row ``i``, ``out_i = Σ_j P_ij v_j`` with
``P_ij = exp(S_ij · scale − lse_i)`` and ``S = q kᵀ``, and kept only ``out`` and ``lse``.
Given ``dO`` (the gradient of the loss with respect to ``out``), the chain rule gives

    dV = Pᵀ dO                    dP = dO Vᵀ
    dS = P ∘ (dP − D)             D_i = rowsum(P ∘ dP)_i = rowsum(dO ∘ O)_i
    dQ = scale · dS K             dK = scale · dSᵀ Q

The backward never stores ``P``: it recomputes each ``[block_q, block_k]`` tile of it from
``q``, ``k`` and the saved ``lse``, and it gets ``D`` from ``dO`` and ``O`` (``O(N)``)
instead of from ``P ∘ dP`` (``O(N²)``).

Causal attention is *top-left* aligned, as in lab 00: query ``i`` attends keys ``0 … i``;
keys at or past ``Lq`` are attended by nobody (their gradients are 0 and they are never
read). The given code (input checks, scale, tile sizes, launch grid, the plain-torch
forward of ``flash_attention``) is in ``provided.py``; read it first.
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
# 1. The textbook backward: the whole P, then the chain rule
# ---------------------------------------------------------------------------------------


def attention_backward_naive(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    scale: float | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of ``out = softmax(q kᵀ · scale) v`` with the full ``[Lq, Lk]`` matrix P.

    Args:
        q: ``[Lq, d]``; k: ``[Lk, d]``; v: ``[Lk, dv]``; do: ``[Lq, dv]`` (d loss / d out).
        scale: defaults to ``1/sqrt(d)``.
        causal: top-left causal mask: query ``i`` attends keys ``0 … i``.

    Returns:
        ``(dq [Lq, d], dk [Lk, d], dv [Lk, dv])``; all zeros when there are no keys.
    """
    raise NotImplementedError(
        "TODO: provided.check_qkv_do(q, k, v, do) first. Build P = softmax(q @ k.T * scale) "
        "(-inf above the diagonal when causal); then dV = P.T @ dO, dP = dO @ V.T, "
        "dS = P * (dP - rowsum(P * dP)), dQ = scale * dS @ K, dK = scale * dS.T @ Q"
    )


# ---------------------------------------------------------------------------------------
# 2. The identity that makes tiling possible
# ---------------------------------------------------------------------------------------


def backward_delta(o: np.ndarray, do: np.ndarray) -> np.ndarray:
    """``D [Lq]`` with ``D_i = rowsum(dO_i ∘ O_i)``.

    It equals ``rowsum(P ∘ dP)_i`` (because ``O_i = Σ_j P_ij v_j`` and ``dP_ij = dO_i · v_j``)
    but costs ``O(Lq · dv)`` instead of a reduction over a whole row of ``P``.
    """
    raise NotImplementedError(
        "TODO: provided.check_o_do(o, do), then one number per query row: the sum over the "
        "head dim of dO times O"
    )


# ---------------------------------------------------------------------------------------
# 3. The tiled backward: K/V tiles outside, Q tiles inside, P recomputed from lse
# ---------------------------------------------------------------------------------------


def flash_attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    lse: np.ndarray,
    do: np.ndarray,
    block_q: int = 16,
    block_k: int = 16,
    scale: float | None = None,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The FlashAttention-2 backward, tiled; never holds more than a ``[block_q, block_k]``
    tile of scores.

    Args:
        q: ``[Lq, d]``; k: ``[Lk, d]``; v: ``[Lk, dv]``: the forward's inputs.
        o: ``[Lq, dv]``, lse: ``[Lq]``: the forward's outputs (``lse`` in natural log).
        do: ``[Lq, dv]``, the gradient of the loss with respect to ``o``.
        block_q, block_k: query rows / keys per tile (>= 1).
        scale: defaults to ``1/sqrt(d)``.
        causal: top-left causal; tiles above the diagonal are skipped, and keys at or past
            ``Lq`` (attended by nobody) are never read: their gradients are 0.

    Returns:
        ``(dq [Lq, d], dk [Lk, d], dv [Lk, dv])``.
    """
    raise NotImplementedError(
        "TODO: provided.check_backward_inputs(...) and provided.positive_int for the tile "
        "sizes; D = backward_delta(o, do). Outer loop over K/V tiles [k0, k1) (under causal "
        "only keys < min(Lk, Lq)), with dK and dV accumulators for the tile; inner loop over "
        "Q tiles [q0, q1) (under causal starting at the tile that holds row k0). Per pair: "
        "s = q_tile @ k_tile.T * scale (-inf where key > query when causal), "
        "P = exp(s - lse[q0:q1, None]) (already normalised), dV += P.T @ dO, "
        "dP = dO @ V.T, dS = P * (dP - D[q0:q1, None]), dQ[q0:q1] += dS @ K, dK += dS.T @ Q. "
        "Multiply dQ and dK by scale once."
    )


# ---------------------------------------------------------------------------------------
# 4. The same backward in Triton: three kernels, no atomics
# ---------------------------------------------------------------------------------------

# Kernel arguments are grouped by meaning, one group per line, so the formatter is off here.
# fmt: off


@triton.jit
def _bwd_preprocess_kernel(
    O, DO, Delta,
    num_heads, seqlen_q,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """``Delta = rowsum(dO ∘ O)`` for one tile of BLOCK_M query rows of one (batch, head).

    O, DO ``[B, H, Lq, HEAD_DIM]`` and Delta ``[B, H, Lq]`` (float32), all contiguous, so
    row ``r`` of batch·head ``bh`` starts at element ``(bh * seqlen_q + r) * HEAD_DIM``.
    Grid ``provided.tile_grid(B, H, Lq, BLOCK_M)``.

    TODO, step by step:
      1. ``pid = tl.program_id(0)``; ``start_m = pid % tl.cdiv(seqlen_q, BLOCK_M)`` and
         ``off_bh = pid // tl.cdiv(seqlen_q, BLOCK_M)`` (``.to(tl.int64)``: offsets can
         pass 2^31).
      2. ``rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)``, ``dims = tl.arange(0, D_PAD)``;
         load the O and dO tiles ``[BLOCK_M, D_PAD]`` masked by ``rows < seqlen_q`` and
         ``dims < HEAD_DIM`` (``other=0.0``), as float32.
      3. Store ``tl.sum(o * do, axis=1)`` at ``Delta + off_bh * seqlen_q + rows`` (row mask).
    """
    tl.static_assert(False, "TODO: write _bwd_preprocess_kernel (steps in its docstring)")


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, Delta, DK, DV,
    num_heads, num_kv_heads, seqlen_q, seqlen_k, qk_scale, scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dK and dV of one tile of BLOCK_N keys of one (batch, KV head).

    Q, DO ``[B, H, Lq, HEAD_DIM]``; K, V, DK, DV ``[B, KVH, Lk, HEAD_DIM]``; LSE, Delta
    ``[B, H, Lq]`` float32 (LSE in natural log); all contiguous. ``qk_scale`` = scale x
    log2(e): scores in base 2, so ``P = exp2(s - lse * log2(e))``. Grid
    ``provided.tile_grid(B, KVH, Lk, BLOCK_N)``. The K/V tile and the float32 dK/dV
    accumulators stay on chip while the program loops over the query tiles of every query
    head of the KV head's group: dK and dV are sums over the group, written once, no atomics.

    TODO, step by step:
      1. ``pid``; ``start_n = pid % tl.cdiv(seqlen_k, BLOCK_N)``, ``off_bkv = pid // …``
         (batch·KVH + KV head), ``off_b = off_bkv // num_kv_heads``,
         ``kv_head = off_bkv % num_kv_heads``.
      2. ``kv_len = min(seqlen_k, seqlen_q)`` if CAUSAL (top-left: keys ``>= Lq`` are
         nobody's), else ``seqlen_k``. ``cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)``.
         Load the K and V tiles ``[BLOCK_N, D_PAD]`` masked by ``cols < kv_len`` and the
         head-dim pad (``other=0.0``); int64 offsets. They stay on chip.
      3. ``dk = dv = 0``, ``[BLOCK_N, D_PAD]`` float32.
      4. ``lo``: 0, or if CAUSAL the first query tile that holds a row ``>= start_n *
         BLOCK_N``, i.e. ``(start_n * BLOCK_N // BLOCK_M) * BLOCK_M``.
      5. For each of the GROUP query heads ``g`` of this KV head (query head
         ``kv_head * GROUP + g``, batch·head ``off_b * num_heads + kv_head * GROUP + g``),
         and each ``start_m`` in ``range(lo, seqlen_q, BLOCK_M)``:
         a. ``rows = start_m + tl.arange(0, BLOCK_M)``; load q and dO ``[BLOCK_M, D_PAD]``,
            lse and Delta ``[BLOCK_M]`` (row mask, ``other=0.0``);
         b. transposed tile, keys on the rows: ``s_t = tl.dot(k, tl.trans(q)) * qk_scale``
            (``[BLOCK_N, BLOCK_M]``), ``p_t = exp2(s_t - lse[None, :] * LOG2E)`` with
            ``provided.LOG2E_CONST`` (the lse is in natural log, the scores in base 2);
         c. ``p_t = 0`` where the key is ``>= kv_len``, the row ``>= seqlen_q``, or (CAUSAL)
            key ``>`` query: ``tl.where``;
         d. ``dv += tl.dot(p_t.to(do.dtype), do)``; ``dp_t = tl.dot(v, tl.trans(do))``;
            ``ds_t = p_t * (dp_t - delta[None, :])``; ``dk += tl.dot(ds_t.to(q.dtype), q)``.
         Every ``tl.dot`` takes ``input_precision=DOT_PRECISION``.
      6. Store ``dk * scale`` and ``dv`` (in DK's / DV's dtype) for keys ``< seqlen_k``: keys
         in ``[kv_len, seqlen_k)`` get their zeros. No atomics: this program is the only
         writer of its rows of dK and dV.
    """
    tl.static_assert(False, "TODO: write _bwd_dkdv_kernel (steps in its docstring)")


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, Delta, DQ,
    num_heads, seqlen_q, seqlen_k, qk_scale, scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dQ of one tile of BLOCK_M query rows of one (batch, head): loops over key tiles.

    Same layouts as ``_bwd_dkdv_kernel``; grid ``provided.tile_grid(B, H, Lq, BLOCK_M)``.
    Each program owns its rows of dQ, so it writes them once: no atomics.

    TODO, step by step:
      1. ``start_m = pid % tl.cdiv(seqlen_q, BLOCK_M)``, ``off_bh = pid // …``; the query
         head is ``off_bh % num_heads`` and it reads KV head ``head // GROUP`` of batch
         ``off_bh // num_heads`` (batch·KVH index ``off_b * (num_heads // GROUP) + kv_head``).
      2. Load q and dO ``[BLOCK_M, D_PAD]``, lse and Delta ``[BLOCK_M]`` (masked); they stay
         on chip. ``dq = 0`` (float32).
      3. ``hi = seqlen_k``; if CAUSAL, ``min(seqlen_k, seqlen_q, (start_m + 1) * BLOCK_M)``:
         the tile's last row + 1, so key tiles above the diagonal are never visited (and
         the diagonal tile is: its keys are attended by the tile's lower rows).
      4. For ``start_n`` in ``range(0, hi, BLOCK_N)``: load K and V ``[BLOCK_N, D_PAD]``
         masked by ``cols < hi``; ``s = tl.dot(q, tl.trans(k)) * qk_scale``;
         ``p = exp2(s - lse[:, None] * LOG2E)``, 0 where masked (rows, ``cols >= hi``,
         CAUSAL key > query); ``dp = tl.dot(do, tl.trans(v))``;
         ``ds = p * (dp - delta[:, None])``; ``dq += tl.dot(ds.to(k.dtype), k)``.
      5. Store ``dq * scale`` in DQ's dtype (row and head-dim mask).
    """
    tl.static_assert(False, "TODO: write _bwd_dq_kernel (steps in its docstring)")


# fmt: on


def flash_attention_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
    *,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FlashAttention backward in Triton: a preprocess kernel, a dK/dV kernel, a dQ kernel.

    Args:
        q, o, do: ``[B, H, Lq, d]``; k, v: ``[B, KVH, Lk, d]`` with ``H % KVH == 0`` (query
            head ``h`` reads KV head ``h // (H // KVH)``); one dtype (float32 or float16 on
            the CPU interpreter, bfloat16 too on a GPU); any strides (the launcher makes
            them contiguous).
        lse: ``[B, H, Lq]`` float32, the forward's log-sum-exp (natural log).
        causal: top-left causal; keys at or past ``Lq`` are never read (their grads are 0).
        scale: defaults to ``1/sqrt(d)`` (the real ``d``, not the padded one).
        block_m, block_n: query rows / keys per tile (powers of two >= 16); ``None`` = the
            launcher's choice (``provided.INTERPRETER_TILES`` or ``provided.gpu_tiles``).

    Returns:
        ``(dq, dk, dv)`` shaped and typed like ``q``, ``k``, ``v`` (accumulated in float32);
        a KV head's dk, dv are sums over its query group. Deterministic: every output
        element is written by exactly one program, in a fixed order; no atomics, no host
        synchronisation.
    """
    # TODO, step by step:
    #   1. group = provided.check_triton_backward(q, k, v, o, lse, do)  (ValueError naming
    #      the argument); B, H, Lq, d = q.shape; KVH, Lk = k.shape[1], k.shape[2].
    #   2. Make q, k, v, o, do, lse contiguous (.contiguous(): a device copy if needed, never
    #      a host sync); dq, dk, dv = torch.zeros_like(q), (k), (v).
    #   3. tiles = tile_config(q, gpu=provided.gpu_tiles(d),
    #                          interpreter=provided.INTERPRETER_TILES,
    #                          block_m=block_m, block_n=block_n)
    #      If B * H * Lq == 0 or Lk == 0, return (dq, dk, dv) now (nothing to launch).
    #   4. scale = provided.scale_for(d, scale) (the REAL d); the kernels take
    #      qk_scale = log2e_scale(scale) and scale.
    #   5. delta = torch.empty_like(lse); launch _bwd_preprocess_kernel on
    #      provided.tile_grid(B, H, Lq, tiles["block_m"]) with (o, do, delta, H, Lq,
    #      HEAD_DIM=d, D_PAD=dot_tile(d), BLOCK_M=tiles["block_m"],
    #      num_warps=tiles["num_warps"], num_stages=tiles["num_stages"]).
    #   6. _bwd_dkdv_kernel on provided.tile_grid(B, KVH, Lk, tiles["block_n"]) with
    #      (q, k, v, do, lse, delta, dk, dv, H, KVH, Lq, Lk, qk_scale, scale) and the
    #      constexprs GROUP=group, HEAD_DIM, D_PAD, CAUSAL=bool(causal), BLOCK_M, BLOCK_N,
    #      DOT_PRECISION=dot_precision(q.dtype), plus num_warps and num_stages.
    #   7. _bwd_dq_kernel on provided.tile_grid(B, H, Lq, tiles["block_m"]) with
    #      (q, k, v, do, lse, delta, dq, H, Lq, Lk, qk_scale, scale) and the same constexprs.
    #   8. return dq, dk, dv
    raise NotImplementedError(
        "TODO: write the three kernels, then launch them: check the inputs, make them "
        "contiguous, pick the tiles, preprocess D, then dK/dV (grid over K/V tiles x KV "
        "heads) and dQ (grid over Q tiles x query heads): steps 1-8 above"
    )


# ---------------------------------------------------------------------------------------
# 5. flash_attention: a differentiable op whose backward is the Triton backward
# ---------------------------------------------------------------------------------------


class FlashAttentionFunction(torch.autograd.Function):
    """``o = attention(q, k, v)`` with the lab's backward.

    forward: ``provided.attention_forward`` (the given plain-torch forward: ``(o, lse)``);
    saves ``q, k, v, o, lse``, which is ``O(N)`` beyond the inputs, never ``P``.
    backward: ``flash_attention_backward_triton`` on the saved tensors.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):  # noqa: ANN001, D102 (autograd's signature)
        raise NotImplementedError(
            "TODO: o, lse = provided.attention_forward(q, k, v, causal=causal, scale=scale); "
            "save what the backward needs with ctx.save_for_backward (tensors) and plain "
            "attributes on ctx (causal, scale); return o alone"
        )

    @staticmethod
    def backward(ctx, do):  # noqa: ANN001, D102
        raise NotImplementedError(
            "TODO: read ctx.saved_tensors, call flash_attention_backward_triton, and return "
            "one gradient per input of forward, in order (None for causal and scale)"
        )


# Given: the autograd entry point (FlashAttentionFunction is yours).
def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Differentiable attention: ``o [B, H, Lq, d]``; ``o.backward(do)`` runs the Triton
    backward. q ``[B, H, Lq, d]``, k, v ``[B, KVH, Lk, d]`` (GQA), top-left causal."""
    return FlashAttentionFunction.apply(q, k, v, causal, scale)


# Given: the end-to-end check the tests call (flash_attention, then loss.backward()).
gradients_through_autograd = provided.autograd_gradients(flash_attention)
