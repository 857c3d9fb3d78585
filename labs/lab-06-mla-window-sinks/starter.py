"""Lab 06 starter: the decode kernel for compressed and windowed KV caches.

Your work goes in the functions that raise ``NotImplementedError`` and in the two kernels
(their docstrings list the steps). Suggested order: ``kv_bytes_per_token`` ->
``mla_decode_naive`` -> ``mla_decode_absorbed`` -> ``window_decode_attention`` ->
``sink_decode_attention`` -> ``_window_sink_decode_kernel`` and its launcher ->
``_mla_decode_kernel`` and its launcher. Run the spec with

    LAB_IMPL=starter pytest labs/lab-06-mla-window-sinks -q

Paged caches use lab 01's layout: ``k_cache, v_cache [num_blocks, block_size, num_kv_heads,
head_dim]``, token ``t`` at ``cache[block_table[t // block_size], t % block_size]``. The
input checks are given in ``provided.py``: call the one each TODO names first.
"""

from __future__ import annotations

import numpy as np
import torch  # noqa: F401

from common.loader import load_lab_module

# The helpers your code will use (unused until you write it):
from common.paged import blocks_needed  # noqa: F401
from common.triton_env import (  # noqa: F401
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
    by all), ``"gqa"`` (``num_kv_heads`` K/V heads), ``"mla"`` (one latent row of
    ``kv_lora_rank + rope_dim`` per token, read as both K and V; ``head_dim`` and
    ``num_heads`` do not enter). ``bytes_per_element``: 2 for bf16/fp16.
    """
    raise NotImplementedError(
        "TODO: validate with provided.check_kv_bytes_args(...) (it returns kind in lower "
        "case). How many numbers does one token add per layer? MHA: a K and a V vector per "
        "head; MQA: per one shared head; GQA: per KV head; MLA: one latent row of "
        "kv_lora_rank + rope_dim, read as both K and V. Times layers times bytes_per_element."
    )


# ---------------------------------------------------------------------------------------
# 2. MLA decode in numpy: naive and absorbed
# ---------------------------------------------------------------------------------------


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
    raise NotImplementedError(
        "TODO: validate with provided.check_mla_inputs(...). Up-project the latent into "
        "per-head keys (c_kv through w_uk, then k_pe appended to every head) and values "
        "(c_kv through w_uv), concatenate q_nope and q_pe, and run plain attention with the "
        "given scale. Return (out [H, dv], lse [H]); L = 0 gives out 0 and lse -inf."
    )


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
    raise NotImplementedError(
        "TODO: validate with provided.check_mla_inputs(...). Fold w_uk into the query "
        "(q_latent [H, d_c]); score every cached latent row with it and add the RoPE score "
        "q_pe · k_pe (that part cannot be absorbed); softmax; take the weighted sum of the "
        "latents [H, d_c]; only then apply w_uv. Never build an [L, H, d] array."
    )


# ---------------------------------------------------------------------------------------
# 3. Sliding windows and attention sinks in numpy
# ---------------------------------------------------------------------------------------


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
    raise NotImplementedError(
        "TODO: validate with provided.check_window(window) and "
        "provided.check_window_decode_inputs(...), which returns (q, block_table, seq_len, "
        "group). Find the window's first position, then run lab 01's block-by-block online "
        "softmax starting at the block that holds it (the window is a loop bound: blocks "
        "before it are never read; the first block may be entered mid-way). A private helper "
        "shared with sink_decode_attention saves work."
    )


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
    raise NotImplementedError(
        "TODO: validate like window_decode_attention (window may be None) and with "
        "provided.check_sinks(sinks, num_heads). The same online softmax, but each head's "
        "state starts from its sink: which (m, l, acc) describe a softmax that has seen one "
        "term exp(sink) and no value yet?"
    )


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

    1. ``seq``, ``kv_head``, ``split`` from the program ids; load ``seq_len``; ``start`` =
       the window's first position, as in ``window_decode_attention`` (``window = 0``: 0).
       The split's keys: ``chunk = cdiv(cdiv(seq_len - start, num_splits), BLOCK_N) *
       BLOCK_N`` (whole tiles), positions ``lo = start + split * chunk`` up to ``hi =
       min(lo + chunk, seq_len)`` (empty for a late split of a short sequence).
    2. Load the group's queries as one ``[GROUP_PAD, HEAD_DIM_PAD]`` tile (masked).
    3. The state: with sinks (``HAS_SINKS``), each head's ``(m, l)`` starts from its sink as
       in ``sink_decode_attention``, but in base 2 like the scores (a sink is already a
       scaled logit: it is multiplied by log2(e) and nothing else), in split 0 only (the
       merge adds the splits' denominators: a sink in every split would count it
       ``num_splits`` times); without, ``m = -inf``, ``l = 0``. ``acc = 0`` in both cases.
    4. For each tile of ``BLOCK_N`` positions from ``lo`` (the window is the loop's start,
       not a mask) while below ``hi``: look the blocks up (int64 offsets), load K and V with
       ``mask=pos < hi``, ``other=0``, and run lab 01's base-2 update.
    5. ``out = acc / l``, ``lse = m * ln 2 + ln l`` (``l = 0``: output 0, ``lse = -inf``),
       stored at the split's row (``stride_o_split``, ``stride_lse_split``): with one split
       the final answer, with more a partial that ``provided.merge_splits`` combines.
    """
    pass  # TODO: the steps above


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
    # The launcher, step by step (the kernel's docstring lists its own steps):
    #   1. group = provided.check_window_sink_triton_inputs(q, k_cache, v_cache, block_tables,
    #      seq_lens, window, sinks, max_seq_len): no host sync when max_seq_len is given;
    #   2. tiles = tile_config(q, gpu=provided.window_gpu_tiles(batch, num_kv_heads, group,
    #      head_dim), interpreter=provided.WINDOW_INTERPRETER_TILES, block_n=block_n);
    #   3. scale = default_scale(head_dim) when None; the kernel gets log2e_scale(scale);
    #   4. contiguous last dims; block_tables and seq_lens int32 on q's device; sinks (if
    #      any) float32 on q's device (torch.as_tensor(...).contiguous());
    #   5. allocate out [B, H, d] (q.dtype) and lse [B, H] (float32); splits =
    #      provided.window_num_splits(q, k_cache, block_tables, window, max_seq_len,
    #      num_splits); B = 0: return them; part_out, part_lse =
    #      provided.split_outputs(out, lse, splits) (out and lse themselves for one split);
    #   6. launch _window_sink_decode_kernel[(batch, num_kv_heads, splits)](...) writing
    #      part_out / part_lse, with the window as an int (0 for None), splits, any float32
    #      tensor in place of sinks when there are none (HAS_SINKS=False), every stride (the
    #      partials' three), GROUP_PAD = dot_tile(group), HEAD_DIM_PAD = dot_tile(head_dim),
    #      BLOCK_SIZE, BLOCK_N = tiles["block_n"], DOT_PRECISION =
    #      dot_precision(k_cache.dtype), num_warps = tiles["num_warps"] and num_stages =
    #      tiles["num_stages"];
    #   7. provided.merge_splits(part_out, part_lse, out, lse) (given: nothing for one
    #      split); return out, lse.
    raise NotImplementedError(
        "TODO: write _window_sink_decode_kernel (lab 01's kernel: its docstring lists what "
        "changes), then follow the launcher's steps above."
    )


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

    1. ``seq``, ``head_tile``, ``split`` from the program ids; heads ``head_tile * BLOCK_H
       + r``; the split's positions ``lo .. hi - 1`` as in the window kernel (``start = 0``:
       ``chunk = cdiv(cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N``).
    2. Load ``q_latent [BLOCK_H, KV_LORA_PAD]`` and ``q_pe [BLOCK_H, ROPE_PAD]`` (masked).
    3. ``m = -inf``, ``l = 0``, ``acc = 0 [BLOCK_H, KV_LORA_PAD]`` (fp32).
    4. For each tile of ``BLOCK_N`` positions from ``lo`` below ``hi``: find each row through
       the block table (int64), load the latent ``c [BLOCK_N, KV_LORA_PAD]`` and the rotated
       key ``k_pe [BLOCK_N, ROPE_PAD]`` (columns ``KV_LORA_RANK ...``), masked by
       ``pos < hi``; ``s = (q_latent · cᵀ + q_pe · k_peᵀ) * qk_scale``; the base-2
       online update with ``acc += p · c`` (the same loaded latent is the value).
    5. ``out_latent = acc / l``, ``lse = m ln 2 + ln l``; store rows of real heads at the
       split's row (``stride_o_split``, ``stride_lse_split``).
    """
    pass  # TODO: the steps above


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
    # The launcher, step by step (the kernel's docstring lists its own steps):
    #   1. d_c, d_rope = provided.check_mla_triton_inputs(q_latent, q_pe, kv_cache,
    #      block_tables, seq_lens, max_seq_len);
    #   2. tiles = tile_config(q_latent, gpu=provided.mla_gpu_tiles(batch, num_heads, d_c),
    #      interpreter=provided.MLA_INTERPRETER_TILES, block_h=block_h, block_n=block_n);
    #      heads per tile = min(tiles["block_h"], dot_tile(num_heads));
    #   3. scale = default_scale(d_c + d_rope) when None; the kernel gets log2e_scale(scale);
    #   4. contiguous last dims; block_tables and seq_lens int32 on the queries' device;
    #   5. allocate out [B, H, d_c] (q_latent.dtype) and lse [B, H] (float32); splits =
    #      provided.mla_num_splits(q_latent, kv_cache, block_tables, max_seq_len,
    #      num_splits); B = 0: return; part_out, part_lse = provided.split_outputs(out, lse,
    #      splits);
    #   6. launch _mla_decode_kernel[(batch, cdiv(num_heads, heads_per_tile), splits)](...)
    #      writing part_out / part_lse, with splits, every stride (the partials' three),
    #      KV_LORA_PAD = dot_tile(d_c), ROPE_PAD = dot_tile(d_rope), BLOCK_SIZE, BLOCK_N =
    #      tiles["block_n"], DOT_PRECISION = dot_precision(kv_cache.dtype), num_warps =
    #      tiles["num_warps"] and num_stages = tiles["num_stages"];
    #   7. provided.merge_splits(part_out, part_lse, out, lse); return out, lse.
    raise NotImplementedError(
        "TODO: write _mla_decode_kernel (its docstring lists the steps), then follow the "
        "launcher's steps above."
    )
