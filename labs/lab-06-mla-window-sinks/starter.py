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
    by all), ``"gqa"`` (``num_kv_heads`` K/V heads), ``"mla"`` (one row per token: the
    ``kv_lora_rank`` latent and the ``rope_dim`` rotated key, read as both K and V;
    ``head_dim`` and ``num_heads`` do not enter). ``bytes_per_element``: 2 for bf16/fp16.
    """
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=06 STEP=1 LEVEL=1)")


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
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=06 STEP=2 LEVEL=1)")


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
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=06 STEP=2 LEVEL=1)")


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
        "TODO: the window is where the loop starts, not a mask over keys read anyway (HINTS.md "
        "step 3: make hint LAB=06 STEP=3 LEVEL=1)"
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
        "TODO: a sink adds to the denominator l and to nothing else (HINTS.md step 3: make hint "
        "LAB=06 STEP=3 LEVEL=1)"
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
    """
    # TODO: the sink enters one split only; a split reads only its positions (HINTS.md step 4: make
    # hint LAB=06 STEP=4 LEVEL=1)
    pass


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
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=06 STEP=4 LEVEL=1)")


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
    pass  # TODO: HINTS.md step 5 (make hint LAB=06 STEP=5 LEVEL=1)


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
    raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=06 STEP=5 LEVEL=1)")
