"""Lab 12 solution: the KV cache made small (FP8 e4m3 with scales) and shared (cascade).

FP8 cache (vLLM's ``kv_cache_dtype="fp8"`` layout, NHD):

    k_cache, v_cache : uint8 [num_blocks, block_size, num_kv_heads, head_dim]   e4m3 bytes
    k_scale, v_scale : float32, one element (per tensor)
                       or [num_blocks, block_size, num_kv_heads] (per token-head, beside the blocks)
    value            : E4M3_VALUES[byte] * scale

Cascade (a prompt prefix shared by a batch):

    q [B, H, d]    prefix_k/v [P, KVH, d]    suffix_k/v [B, S, KVH, d] (first suffix_lens[b] real)

The e4m3 grid, the input checks and the tile plan are given in ``provided.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from common.loader import load_lab_module
from common.triton_env import (
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
    x, scale = provided.check_quantize_inputs(x, scale, per)
    if scale is None:
        amax = np.abs(x).max() if per == "tensor" else np.abs(x).max(axis=-1)
        scale = np.where(amax > 0, amax / provided.E4M3_MAX, 1.0).astype(np.float32)
    y = x / np.asarray(scale, dtype=np.float64)[..., None]  # the scaled values, float64
    y = np.clip(y, -provided.E4M3_MAX, provided.E4M3_MAX)  # saturate: 448 is the last value
    magnitude = np.abs(y)
    exponent = np.floor(np.log2(np.maximum(magnitude, provided.E4M3_MIN_NORMAL)))
    step = 2.0 ** (exponent - provided.E4M3_MANTISSA_BITS)  # the spacing of the grid there
    on_grid = np.rint(magnitude / step) * step  # nearest, ties to an even mantissa
    code = np.searchsorted(provided.E4M3_POSITIVE, on_grid)  # exact: on_grid is a grid value
    sign = np.where(y < 0, 0x80, 0)
    return (code | sign).astype(np.uint8), scale


def dequantize_kv(bits: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """``E4M3_VALUES[bits] * scale`` in float64: bits ``[..., head_dim]``, scale one element
    or ``bits.shape[:-1]``. The NaN bytes (``0x7F``, ``0xFF``) stay NaN."""
    bits, scale = provided.check_dequantize_inputs(bits, scale)
    return provided.E4M3_VALUES[bits] * scale[..., None]


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
    k, v, slots, per = provided.check_cache_write_inputs(
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    real = slots >= 0
    block, offset = np.divmod(slots[real], k_cache.shape[1])
    for new, cache, scales in ((k[real], k_cache, k_scale), (v[real], v_cache, v_scale)):
        if per == "tensor":
            bits, _ = quantize_kv(new, scales, per="tensor")
        else:
            bits, row_scales = quantize_kv(new, per="token_head")  # [n, KVH]
            scales[block, offset] = row_scales
        cache[block, offset] = bits


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
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    head_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [GROUP_PAD, HEAD_DIM_PAD], q's dtype

    score_scale = qk_scale
    if not PER_TOKEN_HEAD:
        score_scale = qk_scale * tl.load(k_scale_ptr)  # k_scale folded in, once

    m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    block_table = block_tables_ptr + seq * stride_table_seq

    for start_pos in range(0, seq_len, BLOCK_N):
        pos = start_pos + tl.arange(0, BLOCK_N)
        in_seq = pos < seq_len
        physical_block = tl.load(block_table + pos // BLOCK_SIZE, mask=in_seq, other=0)
        physical_block = physical_block.to(tl.int64)  # block * stride passes 2^31
        slot = pos % BLOCK_SIZE
        kv_mask = in_seq[:, None] & dim_ok[None, :]
        k_bytes = tl.load(
            k_cache_ptr + physical_block[:, None] * stride_k_block + slot[:, None] * stride_k_slot
            + kv_head * stride_k_head + dims[None, :],
            mask=kv_mask,
            other=0,
        )  # [BLOCK_N, HEAD_DIM_PAD] uint8
        v_bytes = tl.load(
            v_cache_ptr + physical_block[:, None] * stride_v_block + slot[:, None] * stride_v_slot
            + kv_head * stride_v_head + dims[None, :],
            mask=kv_mask,
            other=0,
        )
        k = k_bytes.to(tl.float8e4nv, bitcast=True).to(q.dtype)  # the same bits, read as e4m3
        v = v_bytes.to(tl.float8e4nv, bitcast=True).to(q.dtype)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * score_scale
        if PER_TOKEN_HEAD:
            k_scale = tl.load(
                k_scale_ptr + physical_block * stride_ks_block + slot * stride_ks_slot
                + kv_head * stride_ks_head, mask=in_seq, other=0.0)  # [BLOCK_N]
            s = s * k_scale[None, :]
        s = tl.where(in_seq[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if PER_TOKEN_HEAD:
            v_scale = tl.load(
                v_scale_ptr + physical_block * stride_vs_block + slot * stride_vs_slot
                + kv_head * stride_vs_head, mask=in_seq, other=0.0)
            p = p * v_scale[None, :]  # weights V row j by its scale; l stays unscaled
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    has_keys = l > 0
    l_safe = tl.where(has_keys, l, 1.0)
    out = acc / l_safe[:, None]
    if not PER_TOKEN_HEAD:
        out = out * tl.load(v_scale_ptr)  # v_scale on the output, once
    lse = tl.where(has_keys, m * 0.6931471805599453 + tl.log(l_safe), float("-inf"))  # ln 2
    out_rows = out_ptr + seq * stride_o_seq + heads * stride_o_head
    tl.store(
        out_rows[:, None] + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & dim_ok[None, :],
    )
    tl.store(lse_ptr + seq * stride_lse_seq + heads, lse, mask=head_ok)


def _scale_strides(scale: torch.Tensor, per_token_head: bool) -> tuple[int, int, int]:
    return tuple(scale.stride()) if per_token_head else (0, 0, 0)


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
    group, per_token_head = provided.check_fp8_triton_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, block_n, max_seq_len)
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    tiles = tile_config(q, gpu=provided.gpu_tiles(batch, num_kv_heads, group, head_dim),
                        interpreter=provided.INTERPRETER_TILES, block_n=block_n)
    scale = default_scale(head_dim) if scale is None else float(scale)

    q, k_cache, v_cache = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    k_scale, v_scale = (s if per_token_head else s.reshape(1) for s in (k_scale, v_scale))
    block_tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse

    _paged_decode_fp8_kernel[(batch, num_kv_heads)](
        q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, out, lse,
        log2e_scale(scale),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        *_scale_strides(k_scale, per_token_head), *_scale_strides(v_scale, per_token_head),
        block_tables.stride(0),
        out.stride(0), out.stride(1), lse.stride(0),
        GROUP=group,
        GROUP_PAD=dot_tile(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=dot_tile(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_N=tiles["block_n"],
        PER_TOKEN_HEAD=per_token_head,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )
    return out, lse


# ---------------------------------------------------------------------------------------
# Cascade attention: the shared prefix once for every query, then each request's suffix.
# ---------------------------------------------------------------------------------------


def attention_states(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Many queries over ONE key/value set, in one pass: q ``[N, H, d]``, k ``[L, KVH, d]``,
    v ``[L, KVH, dv]`` -> ``(out [N, H, dv], lse [N, H])``, float64. ``L = 0`` gives
    out 0 and lse -inf. Query head h reads KV head ``h // (H // KVH)``."""
    q, k, v = provided.check_states_inputs(q, k, v)
    num_queries, num_heads, head_dim = q.shape
    length, num_kv_heads = k.shape[:2]
    group = num_heads // num_kv_heads
    scale = default_scale(head_dim) if scale is None else float(scale)
    if length == 0:
        return (np.zeros((num_queries, num_heads, v.shape[2])),
                np.full((num_queries, num_heads), -np.inf))
    # Every query of every request that reads KV head g, against that head's keys at once.
    qg = q.reshape(num_queries, num_kv_heads, group, head_dim)  # [N, KVH, group, d]
    s = np.einsum("ngqd,lgd->ngql", qg, k) * scale  # [N, KVH, group, L]
    m = s.max(axis=-1)  # [N, KVH, group]
    p = np.exp(s - m[..., None])
    l = p.sum(axis=-1)
    out = np.einsum("ngql,lgd->ngqd", p, v) / l[..., None]
    lse = m + np.log(l)
    return out.reshape(num_queries, num_heads, -1), lse.reshape(num_queries, num_heads)


def merge_states(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the union of two disjoint key sets from each set's ``(out, lse)``
    (lab 04's merge): weights ``exp(lse_x - lse)``, ``lse = log(exp(lse_a) + exp(lse_b))``.
    ``out [..., dv]``, ``lse [...]``; an empty side (lse -inf) contributes nothing, two
    empty sides give out 0 and lse -inf."""
    lse_max = np.maximum(lse_a, lse_b)
    safe_max = np.where(np.isneginf(lse_max), 0.0, lse_max)
    w_a, w_b = np.exp(lse_a - safe_max), np.exp(lse_b - safe_max)  # in [0, 1]
    total = w_a + w_b
    empty = total == 0
    total_safe = np.where(empty, 1.0, total)
    out = (w_a[..., None] * out_a + w_b[..., None] * out_b) / total_safe[..., None]
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, safe_max + np.log(total_safe))
    return out, lse


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
    q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lens = provided.check_cascade_inputs(
        q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lens)
    scale = default_scale(q.shape[2]) if scale is None else float(scale)
    out_p, lse_p = attention_states(q, prefix_k, prefix_v, scale=scale)  # all B queries, 1 pass
    out_s = np.zeros_like(out_p)
    lse_s = np.full_like(lse_p, -np.inf)
    for b, n in enumerate(suffix_lens):
        o, s = attention_states(q[b : b + 1], suffix_k[b, :n], suffix_v[b, :n], scale=scale)
        out_s[b], lse_s[b] = o[0], s[0]
    return merge_states(out_p, lse_p, out_s, lse_s)


def cascade_kv_bytes(
    prefix_len: int, suffix_lens: list[int] | np.ndarray, num_kv_heads: int, head_dim: int,
    bytes_per_element: int = 2,
) -> tuple[int, int]:
    """``(cascade, per_request)``: K and V bytes one layer reads for one decode step of the
    batch, with the prefix read once (cascade) or once per request (per-request decode)."""
    row = 2 * num_kv_heads * head_dim * bytes_per_element  # one token's K and V
    suffix = int(np.sum(suffix_lens))
    batch = len(suffix_lens)
    return (prefix_len + suffix) * row, (batch * prefix_len + suffix) * row
