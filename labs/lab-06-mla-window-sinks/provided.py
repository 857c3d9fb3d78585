"""Lab 06 given code: the input checks, tile constants and model table ``starter.py`` and
``solution.py`` share. Nothing here is an exercise; call the checks at the top of your
functions.

Bad input is a ``ValueError`` that names the argument, never an ``IndexError`` from deep
inside. The checks every paged lab shares live in ``common.checks``; the ones below wrap
them for this lab's functions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from common import launch_plan
from common.checks import (
    check_decode_inputs,
    check_paged_batch,
    host_max_seq_len,
    positive_int,
)
from common.splits import merge_splits, split_outputs  # noqa: F401 (given; lab 03 shares them)
from common.triton_env import (
    check_kernel_dtype,
    launch_target,
    on_interpreter,
    plan_target,
)

KV_KINDS = ("mha", "mqa", "gqa", "mla")

# Tile sizes, picked with common.triton_env.tile_config; the interpreter ignores num_warps
# and num_stages. The window kernel is lab 01's: 16 tokens per K/V tile on the interpreter
# (so small tests cross several tiles). The MLA kernel puts up to block_h query heads in the
# rows of one tile (with fewer heads the tile has dot_tile(num_heads) rows); its K/V tile is
# one 576-wide latent row per token, so it takes fewer tokens per tile on a GPU.
WINDOW_INTERPRETER_TILES: dict[str, int] = {"block_n": 16, "num_warps": 4, "num_stages": 1}
MLA_INTERPRETER_TILES: dict[str, int] = {
    "block_h": 64, "block_n": 16, "num_warps": 4, "num_stages": 1}


def window_gpu_tiles(batch: int, num_kv_heads: int, group: int, head_dim: int
                     ) -> dict[str, int]:
    """Tiles and launch options of ``paged_decode_window_sink_triton`` on a GPU: the launch
    plan ``common.launch_plan.window_decode`` for an H100, lab 01's ``{"block_n": 64,
    "num_warps": 4, "num_stages": 2}``. The context and the window set only the KV splits
    (``window_num_splits``), not the tiles."""
    plan = launch_plan.window_decode(batch, num_kv_heads, group, head_dim, 0, None,
                                     launch_plan.H100)
    return plan.config


def mla_gpu_tiles(batch: int, num_heads: int, kv_lora_rank: int) -> dict[str, int]:
    """Tiles and launch options of ``mla_decode_triton`` on a GPU: the launch plan
    ``common.launch_plan.mla_decode`` for an H100. 64 heads per tile, FlashMLA's
    BLOCK_SIZE_M, so the latent cache is read once per 64 heads and the tile is a wgmma on
    sm_90; 64 x 512 with 32 keys per tile and 8 warps compiles without spills on
    sm_80/90/100 (`make gpu-report`, captured_outputs/gpu-report.md: compiled, not run).
    The context sets only the KV splits (``mla_num_splits``), not the tiles."""
    return launch_plan.mla_decode(batch, num_heads, kv_lora_rank, 0, plan_target()).config


class ModelKV(NamedTuple):
    """A real model's attention shape, as ``kv_bytes_per_token`` takes it (bf16 caches)."""

    name: str
    kind: str
    num_layers: int
    head_dim: int
    num_heads: int
    num_kv_heads: int | None = None
    kv_lora_rank: int | None = None
    rope_dim: int | None = None
    window: int | None = None  # sliding window of (some of) its layers, in tokens
    source: str = ""


# The configurations the README and figures.py use (numbers from each model's published
# configuration; see the README's table for the sources).
MODELS: tuple[ModelKV, ...] = (
    ModelKV("Llama-3-70B as MHA (64 KV heads)", "mha", 80, 128, 64,
            source="Llama 3 paper Table 3, with one KV head per query head"),
    ModelKV("Llama-3-70B (GQA 64/8)", "gqa", 80, 128, 64, num_kv_heads=8,
            source="Llama 3 paper (arXiv:2407.21783) Table 3: 80 layers, 64 heads, 8 KV heads"),
    ModelKV("Llama-3-70B as MQA (1 KV head)", "mqa", 80, 128, 64,
            source="Llama 3 paper Table 3, with one shared KV head"),
    ModelKV("Mistral-7B-v0.1 (GQA 32/8, window 4096)", "gqa", 32, 128, 32, num_kv_heads=8,
            window=4096, source="Mistral 7B paper (arXiv:2310.06825) Table 1"),
    ModelKV("gpt-oss-120b (GQA 64/8, window 128 on half the layers)", "gqa", 36, 64, 64,
            num_kv_heads=8, window=128,
            source="openai/gpt-oss gpt_oss/torch/model.py ModelConfig"),
    ModelKV("DeepSeek-V3 (MLA, 128 heads)", "mla", 61, 128, 128, kv_lora_rank=512, rope_dim=64,
            source="deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json"),
)


# ---- kv_bytes_per_token ------------------------------------------------------------------




def check_kv_bytes_args(
    kind: Any, num_layers: Any, head_dim: Any, num_heads: Any, num_kv_heads: Any,
    kv_lora_rank: Any, rope_dim: Any, bytes_per_element: Any,
) -> str:
    """The arguments of ``kv_bytes_per_token``, checked; returns ``kind`` in lower case.

    ``gqa`` needs ``num_kv_heads`` (a divisor of ``num_heads``); ``mla`` needs
    ``kv_lora_rank`` and ``rope_dim``. ``num_kv_heads`` given to ``mha``/``mqa`` must agree
    with the kind (``num_heads`` and 1).
    """
    if not isinstance(kind, str) or kind.lower() not in KV_KINDS:
        raise ValueError(f"kind must be one of {KV_KINDS}, got {kind!r}")
    kind = kind.lower()
    for name, value in (("num_layers", num_layers), ("head_dim", head_dim),
                        ("num_heads", num_heads), ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    if kind == "gqa":
        if num_kv_heads is None:
            raise ValueError("num_kv_heads is required for kind='gqa'")
        positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of "
                             f"num_kv_heads={num_kv_heads}")
    elif num_kv_heads is not None and kind in ("mha", "mqa"):
        expected = int(num_heads) if kind == "mha" else 1
        if num_kv_heads != expected:
            raise ValueError(f"num_kv_heads={num_kv_heads!r} contradicts kind={kind!r} "
                             f"({expected} KV heads)")
    if kind == "mla":
        if kv_lora_rank is None or rope_dim is None:
            raise ValueError("kind='mla' needs kv_lora_rank and rope_dim (the latent width "
                             f"and the decoupled RoPE width), got {kv_lora_rank!r}, {rope_dim!r}")
        positive_int("kv_lora_rank", kv_lora_rank)
        positive_int("rope_dim", rope_dim, minimum=0)
    return kind


# ---- MLA decode (numpy) ------------------------------------------------------------------


def check_mla_inputs(
    q_nope: Any, q_pe: Any, c_kv: Any, k_pe: Any, w_uk: Any, w_uv: Any, scale: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """``(q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, scale)`` as arrays and a float.

    Shapes: ``q_nope [H, d_nope]``, ``q_pe [H, d_rope]``, ``c_kv [L, d_c]``,
    ``k_pe [L, d_rope]``, ``w_uk [H, d_c, d_nope]``, ``w_uv [H, d_c, dv]``.
    """
    arrays = [np.asarray(x) for x in (q_nope, q_pe, c_kv, k_pe, w_uk, w_uv)]
    q_nope, q_pe, c_kv, k_pe, w_uk, w_uv = arrays
    for name, x, ndim in (("q_nope", q_nope, 2), ("q_pe", q_pe, 2), ("c_kv", c_kv, 2),
                          ("k_pe", k_pe, 2), ("w_uk", w_uk, 3), ("w_uv", w_uv, 3)):
        if x.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    num_heads, d_nope = q_nope.shape
    length, d_c = c_kv.shape
    d_rope = q_pe.shape[1]
    expected = {
        "q_pe": (q_pe.shape, (num_heads, d_rope)),
        "k_pe": (k_pe.shape, (length, d_rope)),
        "w_uk": (w_uk.shape, (num_heads, d_c, d_nope)),
        "w_uv": (w_uv.shape[:2], (num_heads, d_c)),
    }
    for name, (got, want) in expected.items():
        if tuple(got) != want:
            raise ValueError(
                f"{name} has shape {tuple(got)}, expected {want} (from q_nope "
                f"[H={num_heads}, d_nope={d_nope}], c_kv [L={length}, d_c={d_c}], "
                f"q_pe [H, d_rope={d_rope}])"
            )
    if scale is None or isinstance(scale, bool) or not np.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite number (MLA's scale is the model's: "
                         f"1/sqrt(d_nope + d_rope) in DeepSeek-V3), got {scale!r}")
    return q_nope, q_pe, c_kv, k_pe, w_uk, w_uv, float(scale)


# ---- windows and sinks (numpy) -------------------------------------------------------------


def check_window(window: Any, allow_none: bool = False) -> int | None:
    """A window of ``>= 1`` tokens (``None`` when allowed: no window)."""
    if window is None and allow_none:
        return None
    return positive_int("window", window)


def check_sinks(sinks: Any, num_heads: int) -> np.ndarray:
    """``sinks`` as a ``[num_heads]`` array (one learned logit per query head)."""
    sinks = np.asarray(sinks)
    if sinks.shape != (num_heads,):
        raise ValueError(f"sinks must have shape [{num_heads}] (one logit per query head), "
                         f"got {sinks.shape}")
    if np.isnan(sinks).any() or np.isposinf(sinks).any():
        raise ValueError("sinks must not hold NaN or +inf (-inf means: no sink for that head)")
    return sinks


def check_window_decode_inputs(
    q: Any, k_cache: np.ndarray, v_cache: np.ndarray, block_table: Any, seq_len: Any,
    window: int | None,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(q, block_table, seq_len, group)`` for one windowed decode step.

    Only the blocks the window touches must be real: from the block that holds position
    ``seq_len - window`` on. Entries before it may be anything (``-1``, a freed block), as in
    vLLM, whose sliding-window manager frees blocks that fell out of the window.
    """
    return check_decode_inputs(q, k_cache, v_cache, block_table, seq_len, window=window)


# ---- Triton launchers ------------------------------------------------------------------------


def check_window_sink_triton_inputs(
    q: Any, k_cache: Any, v_cache: Any, block_tables: Any, seq_lens: Any, window: Any,
    sinks: Any, max_seq_len: int | None,
) -> int:
    """Shapes, dtypes, window and sinks of a ``paged_decode_window_sink_triton`` call;
    returns the group size. Reads no tensor value when ``max_seq_len`` is given."""
    group = check_paged_batch(q, k_cache, v_cache, block_tables, seq_lens)
    if int(v_cache.shape[3]) != int(q.shape[2]):
        raise ValueError(f"v_cache head_dim {int(v_cache.shape[3])} must equal q's head_dim "
                         f"{int(q.shape[2])} in this kernel")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_kernel_dtype(t, name)
    check_window(window, allow_none=True)
    if sinks is not None and tuple(sinks.shape) != (int(q.shape[1]),):
        raise ValueError(f"sinks must have shape [{int(q.shape[1])}] (one logit per query "
                         f"head), got {tuple(sinks.shape)}")
    host_max_seq_len(seq_lens, block_tables, int(k_cache.shape[1]), max_seq_len)
    return group


def check_mla_triton_inputs(
    q_latent: Any, q_pe: Any, kv_cache: Any, block_tables: Any, seq_lens: Any,
    max_seq_len: int | None,
) -> tuple[int, int]:
    """Shapes and dtypes of an ``mla_decode_triton`` call; returns ``(d_c, d_rope)``.

    ``kv_cache [num_blocks, block_size, d_c + d_rope]``: one latent row per token, shared
    by every query head. Reads no tensor value when ``max_seq_len`` is given.
    """
    if q_latent.ndim != 3:
        raise ValueError(f"q_latent must be [batch, num_heads, d_c], got {tuple(q_latent.shape)}")
    batch, num_heads, d_c = (int(s) for s in q_latent.shape)
    if q_pe.ndim != 3 or tuple(q_pe.shape[:2]) != (batch, num_heads) or int(q_pe.shape[2]) < 1:
        raise ValueError(f"q_pe must be [batch={batch}, num_heads={num_heads}, d_rope >= 1], "
                         f"got {tuple(q_pe.shape)}")
    d_rope = int(q_pe.shape[2])
    if kv_cache.ndim != 3 or int(kv_cache.shape[2]) != d_c + d_rope:
        raise ValueError(f"kv_cache must be [num_blocks, block_size, d_c + d_rope = "
                         f"{d_c + d_rope}], got {tuple(kv_cache.shape)}")
    if block_tables.ndim != 2 or int(block_tables.shape[0]) != batch:
        raise ValueError(f"block_tables must be [batch={batch}, max_blocks], got "
                         f"{tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be [batch={batch}], got {tuple(seq_lens.shape)}")
    for name, t in (("q_latent", q_latent), ("q_pe", q_pe), ("kv_cache", kv_cache)):
        check_kernel_dtype(t, name)
    host_max_seq_len(seq_lens, block_tables, int(kv_cache.shape[1]), max_seq_len)
    return d_c, d_rope


# ---- Split-KV: how many splits (where they write and the merge: common.splits) -------------


def _split_count(num_splits: Any, planned: int) -> int:
    if num_splits is None:
        return planned
    if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) \
            or num_splits < 1:
        raise ValueError(f"num_splits must be None (the launch plan's) or an int >= 1, got "
                         f"{num_splits!r}")
    return int(num_splits)


def _max_keys(block_tables: Any, block_size: int, max_seq_len: int | None) -> int:
    """The longest sequence without a host sync: ``max_seq_len``, else the table's capacity."""
    return int(max_seq_len) if max_seq_len is not None else int(block_tables.shape[1]) * block_size


def window_num_splits(q: Any, k_cache: Any, block_tables: Any, window: int | None,
                      max_seq_len: int | None, num_splits: Any) -> int:
    """KV splits per (sequence, KV head) of ``paged_decode_window_sink_triton``: the caller's,
    or the launch plan's (``common.launch_plan.window_decode``; 1 on the interpreter)."""
    if num_splits is not None or on_interpreter(q):
        return _split_count(num_splits, 1)
    batch, num_heads, head_dim = (int(s) for s in q.shape)
    num_kv_heads = int(k_cache.shape[2])
    plan = launch_plan.window_decode(
        batch, num_kv_heads, num_heads // num_kv_heads, head_dim,
        _max_keys(block_tables, int(k_cache.shape[1]), max_seq_len), window, launch_target(q))
    return plan.splits


def mla_num_splits(q_latent: Any, kv_cache: Any, block_tables: Any, max_seq_len: int | None,
                   num_splits: Any) -> int:
    """KV splits per (sequence, head tile) of ``mla_decode_triton``: the caller's, or the
    launch plan's (``common.launch_plan.mla_decode``; 1 on the interpreter)."""
    if num_splits is not None or on_interpreter(q_latent):
        return _split_count(num_splits, 1)
    batch, num_heads, d_c = (int(s) for s in q_latent.shape)
    plan = launch_plan.mla_decode(batch, num_heads, d_c,
                                  _max_keys(block_tables, int(kv_cache.shape[1]), max_seq_len),
                                  launch_target(q_latent))
    return plan.splits
