"""Lab 06 solution: the decode kernel for compressed and windowed KV caches.

* bytes per token of MHA, MQA, GQA and MLA caches;
* MLA decode, naive (per-head K/V up-projected from the latent) and absorbed (attention over
  the latent itself), and a Triton kernel over a paged latent cache;
* sliding-window decode, where the window is a loop bound, and gpt-oss attention sinks,
  folded into the initial ``(m, l)``; and lab 01's Triton kernel with both.

Paged caches use lab 01's layout: ``k_cache, v_cache [num_blocks, block_size, num_kv_heads,
head_dim]``, token ``t`` at ``cache[block_table[t // block_size], t % block_size]``. The
input checks, the tile plans (``window_gpu_tiles``, ``mla_gpu_tiles``) and the split-KV
plumbing are given in ``provided.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from common.loader import load_lab_module
from common.paged import blocks_needed
from common.triton_env import (
    cdiv,
    default_scale,
    dot_precision,
    dot_tile,
    log2e_scale,
    tile_config,
    tl,
    triton,
)

provided = load_lab_module(__file__, "provided")
ModelKV = provided.ModelKV
MODELS = provided.MODELS

# ---------------------------------------------------------------------------------------
# 1. What a token costs: MHA -> MQA -> GQA -> MLA
# ---------------------------------------------------------------------------------------


def kv_bytes_per_token(
    kind: str,
    num_layers: int,
    head_dim: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    kv_lora_rank: int | None = None,
    rope_dim: int | None = None,
    bytes_per_element: int = 2,
) -> int:
    """Bytes of KV cache one token adds, over all layers.

    ``kind``: ``"mha"`` (a K and a V vector per query head), ``"mqa"`` (one K/V head shared
    by all), ``"gqa"`` (``num_kv_heads`` K/V heads), ``"mla"`` (one row per token: the
    ``kv_lora_rank`` latent and the ``rope_dim`` rotated key, read as both K and V;
    ``head_dim`` and ``num_heads`` do not enter). ``bytes_per_element``: 2 for bf16/fp16.
    """
    kind = provided.check_kv_bytes_args(kind, num_layers, head_dim, num_heads, num_kv_heads,
                                        kv_lora_rank, rope_dim, bytes_per_element)
    if kind == "mla":
        per_layer = kv_lora_rank + rope_dim  # one latent row: no separate K and V
    else:
        kv_heads = {"mha": num_heads, "mqa": 1, "gqa": num_kv_heads}[kind]
        per_layer = 2 * kv_heads * head_dim  # a K and a V vector per KV head
    return int(num_layers * per_layer * bytes_per_element)


# ---------------------------------------------------------------------------------------
# 2. MLA decode in numpy: naive and absorbed
# ---------------------------------------------------------------------------------------


def _softmax_rows(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(p, m, l)`` of ``[H, L]`` scores: ``p = exp(scores - m)``, ``l = sum(p)``.

    An empty row (``L = 0``) has ``m = -inf`` and ``l = 0``.
    """
    m = scores.max(axis=1, initial=-np.inf)  # [H]
    p = np.exp(scores - np.where(np.isfinite(m), m, 0.0)[:, None])  # [H, L]
    return p, m, p.sum(axis=1)


def _finish(acc: np.ndarray, m: np.ndarray, l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(acc / l, m + log l)``; a row with ``l = 0`` gives output 0 and ``lse = -inf``."""
    out = acc / np.where(l > 0, l, 1.0)[:, None]
    with np.errstate(divide="ignore"):
        return out, m + np.log(l)


def mla_decode_naive(
    q_nope: np.ndarray,
    q_pe: np.ndarray,
    c_kv: np.ndarray,
    k_pe: np.ndarray,
    w_uk: np.ndarray,
    w_uv: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """MLA decode by up-projecting the latent cache into per-head keys and values.

    Args:
        q_nope: ``[H, d_nope]``, the part of each head's query without RoPE.
        q_pe: ``[H, d_rope]``, the rotated part.
        c_kv: ``[L, d_c]``, the cached latent of every context token.
        k_pe: ``[L, d_rope]``, the cached rotated key, shared by every head.
        w_uk: ``[H, d_c, d_nope]``, latent -> each head's key.
        w_uv: ``[H, d_c, dv]``, latent -> each head's value.
        scale: the model's softmax scale (DeepSeek-V3: ``1/sqrt(d_nope + d_rope)``).

    Returns:
        ``(out [H, dv], lse [H])``. Builds ``[L, H, d_nope + d_rope]`` keys and
        ``[L, H, dv]`` values: plain MHA, as in training and prefill.
    """
    q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale = provided.check_mla_inputs(
        q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale
    )
    num_heads, length = q_nope.shape[0], c_kv.shape[0]
    k_nope = np.einsum("lc,hcn->lhn", c_kv, w_uk)  # [L, H, d_nope]: per-head keys
    v = np.einsum("lc,hcv->lhv", c_kv, w_uv)  # [L, H, dv]: per-head values
    k_rope = np.broadcast_to(k_pe[:, None, :], (length, num_heads, k_pe.shape[1]))
    k = np.concatenate([k_nope, k_rope], axis=-1)  # [L, H, d_nope + d_rope]
    q = np.concatenate([q_nope, q_pe], axis=-1)  # [H, d_nope + d_rope]

    p, m, l = _softmax_rows(np.einsum("hd,lhd->hl", q, k) * scale)  # [H, L]
    return _finish(np.einsum("hl,lhv->hv", p, v), m, l)


def mla_decode_absorbed(
    q_nope: np.ndarray,
    q_pe: np.ndarray,
    c_kv: np.ndarray,
    k_pe: np.ndarray,
    w_uk: np.ndarray,
    w_uv: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """MLA decode over the latent cache itself: ``w_uk`` folded into the query, ``w_uv``
    applied after the weighted sum. Same arguments and result as :func:`mla_decode_naive`.

    Every head scores the same ``[L, d_c + d_rope]`` rows (one shared key per token, 576
    wide in DeepSeek-V3) and sums the same ``[L, d_c]`` latents (the value): MQA with a
    wide head. No per-head ``[L, H, d]`` key or value is ever built.
    """
    q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale = provided.check_mla_inputs(
        q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale
    )
    q_latent = np.einsum("hn,hcn->hc", q_nope, w_uk)  # [H, d_c]: q_nope · W_UKᵀ
    scores = (q_latent @ c_kv.T + q_pe @ k_pe.T) * scale  # [H, L]: latent part + RoPE part
    p, m, l = _softmax_rows(scores)
    o_latent = p @ c_kv  # [H, d_c]: the weighted sum of the latents (V = c_kv)
    return _finish(np.einsum("hc,hcv->hv", o_latent, w_uv), m, l)  # W_UV after the sum


# ---------------------------------------------------------------------------------------
# 3. Sliding windows and attention sinks in numpy
# ---------------------------------------------------------------------------------------


def _decode_range(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray,
    group: int,
    start_pos: int,
    seq_len: int,
    scale: float | None,
    sinks: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Online softmax over positions ``start_pos .. seq_len - 1`` only, block by block.

    The loop starts at the block holding ``start_pos``: blocks before it are never read.
    A sink starts each head's state at ``m = sink``, ``l = exp(sink - m) = 1``, ``acc = 0``:
    a weight in the denominator, no value.
    """
    num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    scale = default_scale(head_dim) if scale is None else float(scale)
    kv_head = np.arange(num_heads) // group  # query head h reads KV head h // group
    dtype = np.result_type(q, k_cache, v_cache)
    if sinks is None:
        m = np.full(num_heads, -np.inf, dtype=dtype)  # running max of the scores
        l = np.zeros(num_heads, dtype=dtype)  # running sum of exp(score - m)
    else:
        m = np.asarray(sinks, dtype=dtype).copy()
        l = np.ones(num_heads, dtype=dtype)
    acc = np.zeros((num_heads, v_cache.shape[3]), dtype=dtype)  # running sum of exp(.) * v

    for logical_block in range(start_pos // block_size, blocks_needed(seq_len, block_size)):
        block_start = logical_block * block_size
        lo = max(start_pos, block_start) - block_start  # the window may start mid-block
        hi = min(seq_len, block_start + block_size) - block_start
        physical_block = block_table[logical_block]
        k = k_cache[physical_block, lo:hi][:, kv_head]  # [n, num_heads, head_dim]
        v = v_cache[physical_block, lo:hi][:, kv_head]  # [n, num_heads, head_dim_v]

        s = np.einsum("hd,nhd->hn", q, k) * scale  # [num_heads, n]
        m_new = np.maximum(m, s.max(axis=1))
        alpha = np.exp(m - m_new)  # 0 on the first block without a sink (m = -inf)
        p = np.exp(s - m_new[:, None])
        l = alpha * l + p.sum(axis=1)
        acc = alpha[:, None] * acc + np.einsum("hn,nhd->hd", p, v)
        m = m_new
    return _finish(acc, m, l)


def window_decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray,
    seq_len: int,
    window: int,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One decode step that sees only the ``window`` most recent tokens, itself included.

    Args:
        q: ``[num_heads, head_dim]``, the token at position ``seq_len - 1``.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_table: ``[max_blocks]``; entries of blocks wholly before the window may be
            anything (``-1``, a freed block): they are never read.
        seq_len: tokens in the context, the new one included.
        window: ``>= 1`` tokens: positions ``seq_len - window .. seq_len - 1``
            (FlashAttention's ``window_size=(window - 1, 0)``).
        scale: defaults to ``1 / sqrt(head_dim)``.

    Returns:
        ``(out [num_heads, head_dim], lse [num_heads])``.
    """
    window = provided.check_window(window)
    q, block_table, seq_len, group = provided.check_window_decode_inputs(
        q, k_cache, v_cache, block_table, seq_len, window
    )
    start_pos = max(seq_len - window, 0)  # the first token in the window
    return _decode_range(q, k_cache, v_cache, block_table, group, start_pos, seq_len, scale,
                         sinks=None)


def sink_decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_table: np.ndarray,
    seq_len: int,
    sinks: np.ndarray,
    window: int | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One decode step with gpt-oss attention sinks (and optionally a sliding window).

    ``sinks [num_heads]`` are learned logits in the units of the scaled scores: head ``h``'s
    softmax denominator gains ``exp(sinks[h])``, and nothing is added to its output (a sink
    has no value). ``-inf`` means no sink. Other arguments as in
    :func:`window_decode_attention` (``window=None``: the whole context).

    Returns:
        ``(out [num_heads, head_dim], lse [num_heads])``; ``lse`` includes the sink, so an
        empty context gives output 0 and ``lse = sinks``.
    """
    window = provided.check_window(window, allow_none=True)
    q, block_table, seq_len, group = provided.check_window_decode_inputs(
        q, k_cache, v_cache, block_table, seq_len, window
    )
    sinks = provided.check_sinks(sinks, q.shape[0])
    start_pos = 0 if window is None else max(seq_len - window, 0)
    return _decode_range(q, k_cache, v_cache, block_table, group, start_pos, seq_len, scale,
                         sinks=sinks)


# ---------------------------------------------------------------------------------------
# 4. Triton: lab 01's kernel with the window as its loop start and the sink in (m, l)
# ---------------------------------------------------------------------------------------


@triton.jit
def _window_sink_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, sinks_ptr, out_ptr, lse_ptr,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2 (exp2)
    window,  # tokens each query sees, itself included; 0 = no window
    num_splits,  # KV splits per (sequence, KV head): program_id(2) is the split
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table_seq,
    stride_o_seq, stride_o_head, stride_o_split,
    stride_lse_seq, stride_lse_head, stride_lse_split,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a tl.dot tile (a power of two >= 16)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_N: tl.constexpr,  # tokens per K/V tile
    HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program = one sequence x one KV head x one KV split (lab 01's grid, plus
    ``num_splits``: grid ``(batch, num_kv_heads, num_splits)``).
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)  # the window's first token
    chunk = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N  # whole tiles
    lo = start + split * chunk  # this split's keys: lo .. hi - 1
    hi = tl.minimum(lo + chunk, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    head_ok = rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [GROUP_PAD, HEAD_DIM_PAD]
    q = q.to(k_cache_ptr.dtype.element_ty)

    if HAS_SINKS:  # the sink is the state's first term: a weight exp(sink), no value
        sink_ok = head_ok & (split == 0)  # one split holds it: the merge adds denominators
        m = tl.load(sinks_ptr + heads, mask=sink_ok, other=float("-inf")) * 1.4426950408889634
        l = tl.where(sink_ok, 1.0, 0.0).to(tl.float32)
    else:
        m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    block_table = block_tables_ptr + seq * stride_table_seq

    for start_pos in range(lo, hi, BLOCK_N):
        pos = start_pos + tl.arange(0, BLOCK_N)  # positions >= start: all inside the window
        in_seq = pos < hi
        physical_block = tl.load(block_table + pos // BLOCK_SIZE, mask=in_seq, other=0)
        physical_block = physical_block.to(tl.int64)
        slot = pos % BLOCK_SIZE
        kv_mask = in_seq[:, None] & dim_ok[None, :]
        k = tl.load(
            k_cache_ptr + physical_block[:, None] * stride_k_block + slot[:, None] * stride_k_slot
            + kv_head * stride_k_head + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, HEAD_DIM_PAD]
        v = tl.load(
            v_cache_ptr + physical_block[:, None] * stride_v_block + slot[:, None] * stride_v_slot
            + kv_head * stride_v_head + dims[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, HEAD_DIM_PAD]

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [GROUP_PAD, BLOCK_N]
        s = tl.where(in_seq[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new

    has_mass = l > 0  # False only with nothing to attend and no sink: output 0, lse -inf
    l_safe = tl.where(has_mass, l, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has_mass, m * 0.6931471805599453 + tl.log(l_safe), float("-inf"))  # ln 2
    out_rows = out_ptr + seq * stride_o_seq + heads * stride_o_head + split * stride_o_split
    tl.store(out_rows[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_ok[:, None] & dim_ok[None, :])
    tl.store(lse_ptr + seq * stride_lse_seq + heads * stride_lse_head + split * stride_lse_split,
             lse, mask=head_ok)


def paged_decode_window_sink_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    block_n: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged decode with a sliding window and/or attention sinks, split over the keys.

    Args:
        q: ``[B, H, d]``.
        k_cache, v_cache: ``[num_blocks, block_size, KVH, d]``, float16 or float32 (bfloat16
            on a GPU only).
        block_tables: ``[B, max_blocks]`` ints; entries before each window are never read.
        seq_lens: ``[B]`` ints, on q's device.
        window: tokens each new token sees, itself included; None = the whole context.
        sinks: ``[H]`` per-head logits (float32 on q's device), or None.
        scale: defaults to ``1 / sqrt(d)``.
        block_n: tokens per K/V tile, a power of two >= 16; None = the launcher's choice
            (``provided.window_gpu_tiles``: 64 on a GPU; ``WINDOW_INTERPRETER_TILES``: 16).
        max_seq_len: the longest ``seq_lens`` entry if the caller knows it (no host sync).
        num_splits: KV splits per (sequence, KV head); None = the launch plan's
            (``provided.window_num_splits``: 1 on the interpreter, enough on a GPU for two
            CTAs per SM); 1 = one launch, no merge; more: partials, then
            ``provided.merge_splits``.

    Returns:
        ``(out [B, H, d]`` in q's dtype, ``lse [B, H]`` float32, natural log, sinks included).
    """
    group = provided.check_window_sink_triton_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, window, sinks, max_seq_len
    )
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    tiles = tile_config(q, gpu=provided.window_gpu_tiles(batch, num_kv_heads, group, head_dim),
                        interpreter=provided.WINDOW_INTERPRETER_TILES, block_n=block_n)
    scale = default_scale(head_dim) if scale is None else float(scale)

    q, k_cache, v_cache = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache)
    )
    block_tables = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q.device)
    if sinks is not None:
        sinks = torch.as_tensor(sinks, dtype=torch.float32, device=q.device).contiguous()
    splits = provided.window_num_splits(q, k_cache, block_tables, window, max_seq_len,
                                        num_splits)
    if batch == 0:
        return out, lse
    part_out, part_lse = provided.split_outputs(out, lse, splits)  # [B, H, S, d], [B, H, S]

    _window_sink_decode_kernel[(batch, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, lse if sinks is None else sinks,
        part_out, part_lse, log2e_scale(scale), 0 if window is None else int(window), splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        GROUP=group,
        GROUP_PAD=dot_tile(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=dot_tile(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_N=tiles["block_n"],
        HAS_SINKS=sinks is not None,
        DOT_PRECISION=dot_precision(k_cache.dtype),
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )
    provided.merge_splits(part_out, part_lse, out, lse)
    return out, lse


# ---------------------------------------------------------------------------------------
# 5. Triton: MLA decode over a paged latent cache, the query heads as the rows of a tile
# ---------------------------------------------------------------------------------------


@triton.jit
def _mla_decode_kernel(
    q_latent_ptr, q_pe_ptr, kv_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # KV splits per (sequence, head tile): program_id(2) is the split
    stride_ql_seq, stride_ql_head,
    stride_qr_seq, stride_qr_head,
    stride_kv_block, stride_kv_slot,
    stride_table_seq,
    stride_o_seq, stride_o_head, stride_o_split,
    stride_lse_seq, stride_lse_head, stride_lse_split,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,  # query heads per tile (a power of two >= 16)
    KV_LORA_RANK: tl.constexpr,  # d_c: the latent, used as K (with q_latent) and as V
    KV_LORA_PAD: tl.constexpr,
    ROPE_DIM: tl.constexpr,  # d_rope: the shared rotated key, stored after the latent
    ROPE_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program = one sequence x ``BLOCK_H`` query heads x one KV split; the heads are the
    tile's rows.

    Grid ``(batch, cdiv(num_heads, BLOCK_H), num_splits)``. A cache row is ``[latent (d_c) |
    k_pe (d_rope)]``; the whole row is the key, its latent part is also the value.
    """
    seq = tl.program_id(0)
    head_tile = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N  # whole tiles
    lo = split * chunk  # this split's keys: lo .. hi - 1
    hi = tl.minimum(lo + chunk, seq_len)

    heads = head_tile * BLOCK_H + tl.arange(0, BLOCK_H)  # every query head of the tile
    head_ok = heads < NUM_HEADS
    lat = tl.arange(0, KV_LORA_PAD)
    lat_ok = lat < KV_LORA_RANK
    rope = tl.arange(0, ROPE_PAD)
    rope_ok = rope < ROPE_DIM
    q_latent = tl.load(
        q_latent_ptr + seq * stride_ql_seq + heads[:, None] * stride_ql_head + lat[None, :],
        mask=head_ok[:, None] & lat_ok[None, :],
        other=0.0,
    ).to(kv_cache_ptr.dtype.element_ty)  # [BLOCK_H, KV_LORA_PAD]
    q_pe = tl.load(
        q_pe_ptr + seq * stride_qr_seq + heads[:, None] * stride_qr_head + rope[None, :],
        mask=head_ok[:, None] & rope_ok[None, :],
        other=0.0,
    ).to(kv_cache_ptr.dtype.element_ty)  # [BLOCK_H, ROPE_PAD]

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, KV_LORA_PAD], dtype=tl.float32)
    block_table = block_tables_ptr + seq * stride_table_seq

    for start_pos in range(lo, hi, BLOCK_N):
        pos = start_pos + tl.arange(0, BLOCK_N)
        in_seq = pos < hi
        physical_block = tl.load(block_table + pos // BLOCK_SIZE, mask=in_seq, other=0)
        row = (kv_cache_ptr + physical_block.to(tl.int64) * stride_kv_block
               + (pos % BLOCK_SIZE) * stride_kv_slot)  # [BLOCK_N] pointers to cache rows
        c = tl.load(row[:, None] + lat[None, :], mask=in_seq[:, None] & lat_ok[None, :],
                    other=0.0)  # [BLOCK_N, KV_LORA_PAD]: the key's latent part AND the value
        k_pe = tl.load(row[:, None] + KV_LORA_RANK + rope[None, :],
                       mask=in_seq[:, None] & rope_ok[None, :], other=0.0)  # [BLOCK_N, ROPE_PAD]

        s = tl.dot(q_latent, tl.trans(c), input_precision=DOT_PRECISION)
        s += tl.dot(q_pe, tl.trans(k_pe), input_precision=DOT_PRECISION)  # [BLOCK_H, BLOCK_N]
        s = tl.where(in_seq[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)
        m = m_new

    has_keys = l > 0
    l_safe = tl.where(has_keys, l, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has_keys, m * 0.6931471805599453 + tl.log(l_safe), float("-inf"))
    out_rows = out_ptr + seq * stride_o_seq + heads * stride_o_head + split * stride_o_split
    tl.store(out_rows[:, None] + lat[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_ok[:, None] & lat_ok[None, :])
    tl.store(lse_ptr + seq * stride_lse_seq + heads * stride_lse_head + split * stride_lse_split,
             lse, mask=head_ok)


def mla_decode_triton(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    block_n: int | None = None,
    block_h: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA decode over a paged latent cache, split over the keys.

    Args:
        q_latent: ``[B, H, d_c]``, each head's query with ``w_uk`` folded in.
        q_pe: ``[B, H, d_rope]``, the rotated part of each head's query.
        kv_cache: ``[num_blocks, block_size, d_c + d_rope]``: per token, the latent then the
            rotated key; one row shared by every head. float16/float32 (bf16 on a GPU).
        block_tables, seq_lens: as in lab 01.
        scale: defaults to ``1 / sqrt(d_c + d_rope)`` (FlashMLA's default); a model passes
            its own (DeepSeek-V3: ``1 / sqrt(d_nope + d_rope)``, times its YaRN factor).
        block_n: tokens per tile; None = the launcher's choice (``provided.mla_gpu_tiles``:
            32 on a GPU; ``MLA_INTERPRETER_TILES``: 16).
        block_h: query heads per tile at most (None = 64 on a GPU and on the interpreter);
            a tile has ``min(block_h, dot_tile(H))`` rows.
        max_seq_len: the longest ``seq_lens`` entry if the caller knows it (no host sync).
        num_splits: KV splits per (sequence, head tile); None = the launch plan's
            (``provided.mla_num_splits``: 1 on the interpreter); 1 = one launch, no merge;
            more: partials, then ``provided.merge_splits``.

    Returns:
        ``(out_latent [B, H, d_c]`` in q_latent's dtype, ``lse [B, H]`` float32). The caller
        applies ``w_uv`` to ``out_latent`` (``out[h] = out_latent[h] @ w_uv[h]``).
    """
    d_c, d_rope = provided.check_mla_triton_inputs(
        q_latent, q_pe, kv_cache, block_tables, seq_lens, max_seq_len
    )
    batch, num_heads = q_latent.shape[:2]
    tiles = tile_config(q_latent, gpu=provided.mla_gpu_tiles(batch, num_heads, d_c),
                        interpreter=provided.MLA_INTERPRETER_TILES, block_h=block_h,
                        block_n=block_n)
    heads_per_tile = min(tiles["block_h"], dot_tile(num_heads))
    scale = default_scale(d_c + d_rope) if scale is None else float(scale)

    q_latent, q_pe, kv_cache = (t if t.stride(-1) == 1 else t.contiguous()
                                for t in (q_latent, q_pe, kv_cache))
    block_tables = block_tables.to(device=q_latent.device, dtype=torch.int32).contiguous()
    seq_lens = seq_lens.to(device=q_latent.device, dtype=torch.int32).contiguous()
    out = torch.empty((batch, num_heads, d_c), dtype=q_latent.dtype, device=q_latent.device)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q_latent.device)
    splits = provided.mla_num_splits(q_latent, kv_cache, block_tables, max_seq_len, num_splits)
    if batch == 0:
        return out, lse
    part_out, part_lse = provided.split_outputs(out, lse, splits)  # [B, H, S, d_c], [B, H, S]

    _mla_decode_kernel[(batch, cdiv(num_heads, heads_per_tile), splits)](
        q_latent, q_pe, kv_cache, block_tables, seq_lens, part_out, part_lse,
        log2e_scale(scale), splits,
        q_latent.stride(0), q_latent.stride(1),
        q_pe.stride(0), q_pe.stride(1),
        kv_cache.stride(0), kv_cache.stride(1),
        block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        NUM_HEADS=num_heads,
        BLOCK_H=heads_per_tile,
        KV_LORA_RANK=d_c,
        KV_LORA_PAD=dot_tile(d_c),
        ROPE_DIM=d_rope,
        ROPE_PAD=dot_tile(d_rope),
        BLOCK_SIZE=kv_cache.shape[1],
        BLOCK_N=tiles["block_n"],
        DOT_PRECISION=dot_precision(kv_cache.dtype),
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )
    provided.merge_splits(part_out, part_lse, out, lse)
    return out, lse
