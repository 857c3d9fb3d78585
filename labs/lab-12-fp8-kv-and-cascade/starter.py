"""Lab 12 starter: the KV cache made small (FP8 e4m3 with scales) and shared (cascade).

FP8 cache (vLLM's ``kv_cache_dtype="fp8"`` layout, NHD):

    k_cache, v_cache : uint8 [num_blocks, block_size, num_kv_heads, head_dim]   e4m3 bytes
    k_scale, v_scale : float32, one element (per tensor)
                       or [num_blocks, block_size, num_kv_heads] (per token-head, beside the blocks)
    value            : E4M3_VALUES[byte] * scale

Cascade (a prompt prefix shared by a batch):

    q [B, H, d]    prefix_k/v [P, KVH, d]    suffix_k/v [B, S, KVH, d] (first suffix_lens[b] real)

The e4m3 grid, the input checks and the tile plan are given in ``provided.py``.
Your work goes in the functions that raise ``NotImplementedError`` and in the kernel
``_paged_decode_fp8_kernel`` (HINTS.md has its hints, in levels). Run the spec:

    LAB_IMPL=starter pytest labs/lab-12-fp8-kv-and-cascade -q
"""

from __future__ import annotations

import numpy as np
import torch  # noqa: F401

from common.loader import load_lab_module

# The helpers your code will use (unused until you write it):
from common.triton_env import (  # noqa: F401
    default_scale,
    dot_precision,
    dot_tile,
    log2e_scale,
    tile_config,
    tl,
    triton,
)

provided = load_lab_module(__file__, "provided")

# ---------------------------------------------------------------------------------------
# FP8 e4m3 in numpy: a scale, then the nearest value on the grid.
# ---------------------------------------------------------------------------------------


def quantize_kv(
    x: np.ndarray, scale: np.ndarray | float | None = None, *, per: str = "tensor"
) -> tuple[np.ndarray, np.ndarray]:
    """e4m3 bytes of ``x / scale``, rounded to the nearest grid value (ties to even),
    saturating at ±448: never NaN.

    Args:
        x: float ``[..., head_dim]`` (K or V of some tokens and heads).
        scale: None = computed, ``float32(amax / 448)`` (``amax`` the largest ``|x|`` of the
            tensor, or of each ``[head_dim]`` row for ``per="token_head"``; an all-zero
            group gets 1); or given: one element (``per="tensor"``) or ``x.shape[:-1]``.
        per: ``"tensor"`` (one scale) or ``"token_head"`` (one per token and KV head).

    Returns:
        ``(bits uint8 [..., head_dim], scale float32 [] or x.shape[:-1])``:
        ``dequantize_kv(bits, scale) ≈ x``.
    """
    raise NotImplementedError(
        "TODO: never a NaN byte: beyond 448 * scale saturates (HINTS.md step 1: make hint LAB=12 "
        "STEP=1 LEVEL=1)"
    )


def dequantize_kv(bits: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """``E4M3_VALUES[bits] * scale`` in float64: bits ``[..., head_dim]``, scale one element
    or ``bits.shape[:-1]``. The NaN bytes (``0x7F``, ``0xFF``) stay NaN."""
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=12 STEP=1 LEVEL=1)")


def reshape_and_cache_fp8(
    k: np.ndarray,
    v: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slot_mapping: np.ndarray,
    k_scale: np.ndarray,
    v_scale: np.ndarray,
) -> None:
    """Quantise new tokens' K/V and scatter them into the fp8 caches in place (vLLM's
    ``reshape_and_cache_flash`` with an fp8 cache).

    Args:
        k, v: ``[n, num_kv_heads, head_dim]`` floats.
        k_cache, v_cache: uint8 ``[num_blocks, block_size, num_kv_heads, head_dim]``, written.
        slot_mapping: ``[n]`` ints, ``block * block_size + offset`` (lab 01's), or -1 for a
            padding token, which is skipped.
        k_scale, v_scale: float32. One element: the per-tensor scale, read (calibrated
            beforehand). ``[num_blocks, block_size, num_kv_heads]``: per token-head, each
            written slot's scale computed from its own row and stored there.

    Only the given slots (and their scales) change.
    """
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=12 STEP=2 LEVEL=1)")


# ---------------------------------------------------------------------------------------
# The Triton kernel: lab 01's paged decode, reading one byte per cached element.
# ---------------------------------------------------------------------------------------


@triton.jit
def _paged_decode_fp8_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, lse_ptr,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2 (exp2)
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_ks_block, stride_ks_slot, stride_ks_head,  # per token-head scales (else unused)
    stride_vs_block, stride_vs_slot, stride_vs_head,
    stride_table_seq,
    stride_o_seq, stride_o_head, stride_lse_seq,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a tl.dot tile (a power of two >= 16)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # HEAD_DIM rounded up the same way
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_N: tl.constexpr,  # tokens per K/V tile (>= 32 for fp8)
    PER_TOKEN_HEAD: tl.constexpr,  # False: one k_scale and one v_scale for the whole cache
    DOT_PRECISION: tl.constexpr,
):
    """One program = one sequence x one KV head, its GROUP query heads the rows of a tile.

    Grid ``(batch, num_kv_heads)``; every head dim is contiguous. Lab 01's kernel, except
    where the FP8 bytes and their scales enter.
    """
    # TODO: l sums the unscaled weights; a scale multiplies only what it belongs to (HINTS.md step
    # 3: make hint LAB=12 STEP=3 LEVEL=1)
    pass




def paged_decode_fp8_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    *,
    scale: float | None = None,
    block_n: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged decode attention over an fp8 (e4m3) cache, as one Triton launch.

    Args:
        q: ``[B, H, d]`` float16 or float32 (bfloat16 on a GPU).
        k_cache, v_cache: uint8 ``[num_blocks, block_size, KVH, d]``, e4m3 bytes.
        block_tables: ``[B, max_blocks]`` ints; seq_lens: ``[B]`` ints, on q's device.
        k_scale, v_scale: float32 on q's device: one element each (per tensor), or each
            ``[num_blocks, block_size, KVH]`` (per token-head). Read by the kernel.
        scale: softmax scale, defaults to ``1 / sqrt(d)``.
        block_n: keys per tile, a power of two >= 32; None = ``provided``'s tiles.
        max_seq_len: the longest ``seq_lens`` entry, if the host knows it (no host sync).

    Returns:
        ``(out [B, H, d]`` in q's dtype, ``lse [B, H]`` float32, natural log): attention
        over the dequantised cache ``E4M3_VALUES[byte] * scale``.
    """
    raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=12 STEP=3 LEVEL=1)")


# ---------------------------------------------------------------------------------------
# Cascade attention: the shared prefix once for every query, then each request's suffix.
# ---------------------------------------------------------------------------------------


def attention_states(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Many queries over ONE key/value set, in one pass: q ``[N, H, d]``, k ``[L, KVH, d]``,
    v ``[L, KVH, dv]`` -> ``(out [N, H, dv], lse [N, H])``, float64. ``L = 0`` gives
    out 0 and lse -inf. Query head h reads KV head ``h // (H // KVH)``."""
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=12 STEP=4 LEVEL=1)")


def merge_states(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the union of two disjoint key sets from each set's ``(out, lse)``
    (lab 04's merge): weights ``exp(lse_x - lse)``, ``lse = log(exp(lse_a) + exp(lse_b))``.
    ``out [..., dv]``, ``lse [...]``; an empty side (lse -inf) contributes nothing, two
    empty sides give out 0 and lse -inf."""
    raise NotImplementedError(
        "TODO: the merged state is exact: each side weighed by its share of the denominator "
        "(HINTS.md step 4: make hint LAB=12 STEP=4 LEVEL=1)"
    )


def cascade_attention(
    q: np.ndarray,
    prefix_k: np.ndarray,
    prefix_v: np.ndarray,
    suffix_k: np.ndarray,
    suffix_v: np.ndarray,
    suffix_lens: np.ndarray,
    *,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode attention of ``B`` requests that share a prompt prefix, prefix read once.

    Args:
        q: ``[B, H, d]``, one new token per request.
        prefix_k, prefix_v: ``[P, KVH, d]`` / ``[P, KVH, dv]``, the shared prefix.
        suffix_k, suffix_v: ``[B, S, KVH, d]`` / ``[B, S, KVH, dv]``; request b's own tokens
            are the first ``suffix_lens[b]``, the rest padding (never read).
        suffix_lens: ``[B]`` ints in ``[0, S]``.
        scale: defaults to ``1 / sqrt(d)``.

    Returns:
        ``(out [B, H, dv], lse [B, H])`` float64, equal to attention of request b over
        ``prefix + suffix_b[:suffix_lens[b]]``.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=12 STEP=4 LEVEL=1)")


def cascade_kv_bytes(
    prefix_len: int, suffix_lens: list[int] | np.ndarray, num_kv_heads: int, head_dim: int,
    bytes_per_element: int = 2,
) -> tuple[int, int]:
    """``(cascade, per_request)``: K and V bytes one layer reads for one decode step of the
    batch, with the prefix read once (cascade) or once per request (per-request decode)."""
    raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=12 STEP=5 LEVEL=1)")
