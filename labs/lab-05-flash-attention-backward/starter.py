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
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=05 STEP=1 LEVEL=1)")


# ---------------------------------------------------------------------------------------
# 2. The identity that makes tiling possible
# ---------------------------------------------------------------------------------------


def backward_delta(o: np.ndarray, do: np.ndarray) -> np.ndarray:
    """``D [Lq]`` with ``D_i = rowsum(dO_i ∘ O_i)``.

    It equals ``rowsum(P ∘ dP)_i`` (because ``O_i = Σ_j P_ij v_j`` and ``dP_ij = dO_i · v_j``)
    but costs ``O(Lq · dv)`` instead of a reduction over a whole row of ``P``.
    """
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=05 STEP=2 LEVEL=1)")


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
        "TODO: P is recomputed tile by tile from lse, never stored whole (HINTS.md step 3: make "
        "hint LAB=05 STEP=3 LEVEL=1)"
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
    """
    tl.static_assert(False, "TODO: HINTS.md step 4 (make hint LAB=05 STEP=4 LEVEL=1)")


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
    """
    tl.static_assert(False,
        "TODO: one program is the only writer of its rows of dK and dV: no atomics (HINTS.md step"
        " 5: make hint LAB=05 STEP=5 LEVEL=1)"
    )


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
    """
    tl.static_assert(False,
        "TODO: one program is the only writer of its rows of dQ (HINTS.md step 6: make hint "
        "LAB=05 STEP=6 LEVEL=1)"
    )


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
    raise NotImplementedError("TODO: HINTS.md step 7 (make hint LAB=05 STEP=7 LEVEL=1)")


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
        raise NotImplementedError("TODO: HINTS.md step 7 (make hint LAB=05 STEP=7 LEVEL=1)")

    @staticmethod
    def backward(ctx, do):  # noqa: ANN001, D102
        raise NotImplementedError("TODO: HINTS.md step 7 (make hint LAB=05 STEP=7 LEVEL=1)")


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
