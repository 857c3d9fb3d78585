"""Lab 12 given code: the e4m3 number grid, the input checks and the tile constants that
``starter.py`` and ``solution.py`` share. Nothing here is an exercise.

The e4m3 format (the OCP 8-bit floating point specification, "OFP8", 2023; the
``float8_e4m3fn`` of PyTorch and ``tl.float8e4nv`` of Triton): 1 sign bit, 4 exponent bits
(bias 7), 3 mantissa bits, no infinities, one NaN pattern per sign (``0x7F``, ``0xFF``).
Normal values are ``2^(e - 7) * (1 + m / 8)``, subnormals (``e = 0``) ``2^-6 * m / 8``; the
largest is ``2^8 * 1.75 = 448``, the smallest normal ``2^-6``, the smallest subnormal
``2^-9``. :data:`E4M3_VALUES` is that table, built here in float64 from the bit formula.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common import launch_plan
from common.checks import check_paged_batch, host_max_seq_len
from common.triton_env import check_kernel_dtype

E4M3_MAX = 448.0  # the largest finite e4m3 value: 2^8 * (1 + 6/8)
E4M3_MIN_NORMAL = 2.0**-6  # below it the spacing is fixed at 2^-9 (subnormals)
E4M3_MANTISSA_BITS = 3  # so a normal value is rounded to within 2^-4 of itself, relatively
PER_CHOICES = ("tensor", "token_head")
MIN_FP8_BLOCK_N = 32  # vLLM's Triton decode uses 32-key tiles for an fp8 cache (16 for bf16)


def _e4m3_values() -> np.ndarray:
    """float64 ``[256]``: the value of every e4m3 byte (NaN at ``0x7F`` and ``0xFF``)."""
    code = np.arange(256)
    sign = np.where(code >> 7, -1.0, 1.0)
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    normal = 2.0 ** (exponent - 7.0) * (1 + mantissa / 8)
    subnormal = 2.0**-6 * (mantissa / 8)
    values = sign * np.where(exponent == 0, subnormal, normal)
    values[(code & 0x7F) == 0x7F] = np.nan
    return values


E4M3_VALUES: np.ndarray = _e4m3_values()
E4M3_VALUES.flags.writeable = False
# The 127 non-negative finite values in increasing order: byte c (0 <= c <= 126) is
# E4M3_POSITIVE[c], so the byte of a value on the grid is its index here.
E4M3_POSITIVE: np.ndarray = E4M3_VALUES[:127]

# Tiles of paged_decode_fp8_triton: 32 keys a tile (the fp8 minimum) also on the interpreter.
INTERPRETER_TILES: dict[str, int] = {"block_n": 32, "num_warps": 4, "num_stages": 1}


def gpu_tiles(batch: int, num_kv_heads: int, group: int, head_dim: int) -> dict[str, int]:
    """Tiles and launch options on a GPU: lab 01's paged-decode launch plan for an H100
    (``common/launch_plan.py``), with at least :data:`MIN_FP8_BLOCK_N` keys a tile."""
    config = launch_plan.paged_decode(batch, num_kv_heads, group, head_dim,
                                      launch_plan.H100).config
    return config | {"block_n": max(config["block_n"], MIN_FP8_BLOCK_N)}


# ---- the numpy half -----------------------------------------------------------------------


def check_quantize_inputs(x: Any, scale: Any, per: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x float64 [..., head_dim], scale float32 or None)`` for :func:`quantize_kv`.

    ``per="tensor"``: a given ``scale`` has one element; ``per="token_head"``: it has
    ``x.shape[:-1]``. Every scale is finite and > 0; ``x`` is finite.
    """
    if per not in PER_CHOICES:
        raise ValueError(f"per must be one of {PER_CHOICES}, got {per!r}")
    x = np.asarray(x)
    if x.ndim < 1 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"x must be a float array [..., head_dim], got {x.dtype} {x.shape}")
    x = x.astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError("x has NaN or inf entries: nothing finite to quantise them to")
    if scale is None:
        return x, None
    scale = np.asarray(scale)
    want = () if per == "tensor" else x.shape[:-1]
    if per == "tensor" and scale.size == 1:
        scale = scale.reshape(())
    if scale.shape != want:
        raise ValueError(f"scale has shape {scale.shape}; per={per!r} needs shape {want}")
    check_scale_values(scale, "scale")
    return x, scale.astype(np.float32)


def check_scale_values(scale: np.ndarray, name: str) -> None:
    """Every entry finite and > 0, else ``ValueError`` naming ``name``."""
    if not np.issubdtype(scale.dtype, np.floating) or not (np.isfinite(scale).all()
                                                           and (scale > 0).all()):
        raise ValueError(f"{name} must hold finite floats > 0, got {scale!r}")


def check_dequantize_inputs(bits: Any, scale: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(bits uint8 [..., head_dim], scale float64 broadcastable as [..., 1])``."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint8 or bits.ndim < 1:
        raise ValueError(f"bits must be a uint8 array [..., head_dim] of e4m3 bytes, got "
                         f"{bits.dtype} {bits.shape}")
    scale = np.asarray(scale)
    if scale.size == 1:
        scale = scale.reshape(())
    elif scale.shape != bits.shape[:-1]:
        raise ValueError(f"scale has shape {scale.shape}: one scale (per tensor) or "
                         f"bits.shape[:-1] = {bits.shape[:-1]} (per token-head)")
    return bits, scale.astype(np.float64)


def check_cache_write_inputs(
    k: Any, v: Any, k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: Any,
    k_scale: np.ndarray, v_scale: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """``(k, v, slot_mapping int64, per)`` for :func:`reshape_and_cache_fp8`.

    ``k_cache, v_cache``: uint8 ``[num_blocks, block_size, num_kv_heads, head_dim]``;
    ``k, v``: ``[n, num_kv_heads, head_dim]``; ``slot_mapping``: ``[n]`` slots in the cache
    or -1 (a padding token: skipped); ``k_scale, v_scale``: both one float32 element (per
    tensor, read) or both float32 ``[num_blocks, block_size, num_kv_heads]`` (per
    token-head, written at the slots).
    """
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(cache, np.ndarray) or cache.dtype != np.uint8 or cache.ndim != 4:
            raise ValueError(f"{name} must be a uint8 numpy array [num_blocks, block_size, "
                             f"num_kv_heads, head_dim], got {getattr(cache, 'dtype', None)} "
                             f"{np.shape(cache)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {v_cache.shape} differs from k_cache {k_cache.shape}")
    k, v = np.asarray(k), np.asarray(v)
    if k.ndim != 3 or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k has shape {k.shape}, expected [n, *{k_cache.shape[2:]}]")
    if v.shape != k.shape:
        raise ValueError(f"v has shape {v.shape}, expected k's {k.shape}")
    slots = np.asarray(slot_mapping)
    if slots.shape != (k.shape[0],) or not np.issubdtype(slots.dtype, np.integer):
        raise ValueError(f"slot_mapping must be [{k.shape[0]}] ints, got {slots.dtype} "
                         f"{slots.shape}")
    slots = slots.astype(np.int64)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    real = slots[slots >= 0]
    if (slots < -1).any() or (real >= num_slots).any():
        raise ValueError(f"slot_mapping entries must be -1 (skip) or in [0, {num_slots})")
    if len(np.unique(real)) != len(real):
        raise ValueError("slot_mapping has duplicates: two tokens cannot share one slot")
    pers = [_scale_kind(s, name, k_cache.shape[:3])
            for name, s in (("k_scale", k_scale), ("v_scale", v_scale))]
    if pers[0] != pers[1]:
        raise ValueError(f"k_scale is per {pers[0]} but v_scale per {pers[1]}: use one kind")
    return k, v, slots, pers[0]


def _scale_kind(scale: Any, name: str, slots_shape: tuple[int, ...]) -> str:
    if not isinstance(scale, np.ndarray) or scale.dtype != np.float32:
        raise ValueError(f"{name} must be a float32 numpy array, got "
                         f"{getattr(scale, 'dtype', type(scale).__name__)}")
    if scale.size == 1:
        check_scale_values(scale, name)
        return "tensor"
    if scale.shape == tuple(slots_shape):
        return "token_head"
    raise ValueError(f"{name} has shape {scale.shape}: one element (per tensor) or "
                     f"[num_blocks, block_size, num_kv_heads] = {tuple(slots_shape)}")


def check_states_inputs(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 ``q [N, H, d]``, ``k [L, KVH, d]``, ``v [L, KVH, dv]``, ``H`` a multiple of
    ``KVH``, for :func:`attention_states`."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 3:
        raise ValueError(f"q must be [num_queries, num_heads, head_dim], got shape {q.shape}")
    if k.ndim != 3 or k.shape[2] != q.shape[2]:
        raise ValueError(f"k must be [num_keys, num_kv_heads, {q.shape[2]}], got {k.shape}")
    if v.ndim != 3 or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v must be [{k.shape[0]}, {k.shape[1]}, head_dim_v], got {v.shape}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"num_heads={q.shape[1]} is not a multiple of num_kv_heads="
                         f"{k.shape[1]}")
    return q, k, v


def check_cascade_inputs(
    q: Any, prefix_k: Any, prefix_v: Any, suffix_k: Any, suffix_v: Any, suffix_lens: Any
) -> tuple[np.ndarray, ...]:
    """All as arrays: ``q [B, H, d]``, ``prefix_k [P, KVH, d]``, ``prefix_v [P, KVH, dv]``,
    ``suffix_k [B, S, KVH, d]``, ``suffix_v [B, S, KVH, dv]``, ``suffix_lens [B]`` in
    ``[0, S]``; ``H`` a multiple of ``KVH``."""
    q, pk, pv, sk, sv = (np.asarray(a) for a in (q, prefix_k, prefix_v, suffix_k, suffix_v))
    lens = np.asarray(suffix_lens)
    if q.ndim != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {q.shape}")
    batch, num_heads, head_dim = q.shape
    if pk.ndim != 3 or pk.shape[2] != head_dim:
        raise ValueError(f"prefix_k must be [prefix_len, num_kv_heads, {head_dim}], got {pk.shape}")
    if pv.ndim != 3 or pv.shape[:2] != pk.shape[:2]:
        raise ValueError(f"prefix_v must be [{pk.shape[0]}, {pk.shape[1]}, head_dim_v], "
                         f"got {pv.shape}")
    num_kv_heads = pk.shape[1]
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads="
                         f"{num_kv_heads}")
    if sk.ndim != 4 or sk.shape[0] != batch or sk.shape[2:] != pk.shape[1:]:
        raise ValueError(f"suffix_k must be [{batch}, max_suffix, {num_kv_heads}, {head_dim}], "
                         f"got {sk.shape}")
    if sv.shape != (*sk.shape[:3], pv.shape[2]):
        raise ValueError(f"suffix_v must be [*{sk.shape[:3]}, {pv.shape[2]}], got {sv.shape}")
    if lens.shape != (batch,) or not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(f"suffix_lens must be [{batch}] ints, got {lens.dtype} {lens.shape}")
    if lens.size and (lens.min() < 0 or lens.max() > sk.shape[1]):
        raise ValueError(f"suffix_lens must lie in [0, {sk.shape[1]}], got {lens.tolist()}")
    return q, pk, pv, sk, sv, lens.astype(np.int64)


# ---- the Triton half ----------------------------------------------------------------------


def check_fp8_triton_inputs(
    q: Any, k_cache: Any, v_cache: Any, block_tables: Any, seq_lens: Any, k_scale: Any,
    v_scale: Any, block_n: int | None, max_seq_len: int | None,
) -> tuple[int, bool]:
    """Shapes and dtypes of a ``paged_decode_fp8_triton`` call: ``(group, per_token_head)``.

    ``k_cache, v_cache`` uint8 (e4m3 bytes); ``k_scale, v_scale`` float32 on q's device, both
    one element (per tensor) or both ``[num_blocks, block_size, num_kv_heads]``;
    ``block_n`` None or ``>= 32``. Copies nothing to the host when ``max_seq_len`` is given.
    """
    import torch

    group = check_paged_batch(q, k_cache, v_cache, block_tables, seq_lens)
    check_kernel_dtype(q, "q")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dtype != torch.uint8:
            raise ValueError(f"{name} has dtype {cache.dtype}: an fp8 cache holds e4m3 bytes as "
                             "torch.uint8 (view a float8_e4m3fn tensor with .view(torch.uint8))")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache "
                         f"{tuple(k_cache.shape)}")
    kinds = []
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            raise ValueError(f"{name} must be a float32 tensor, got "
                             f"{getattr(s, 'dtype', type(s).__name__)}")
        if s.device != q.device:
            raise ValueError(f"{name} is on {s.device}, q on {q.device}")
        if s.numel() == 1:
            kinds.append(False)
        elif tuple(s.shape) == tuple(k_cache.shape[:3]):
            kinds.append(True)
        else:
            raise ValueError(f"{name} has shape {tuple(s.shape)}: one element (per tensor) or "
                             f"[num_blocks, block_size, num_kv_heads] = "
                             f"{tuple(k_cache.shape[:3])} (per token-head)")
    if kinds[0] != kinds[1]:
        raise ValueError("k_scale and v_scale must be the same kind (both per tensor or both "
                         "per token-head)")
    if block_n is not None and not isinstance(block_n, bool) and isinstance(block_n, int) and (
            block_n < MIN_FP8_BLOCK_N):
        raise ValueError(f"block_n={block_n}: an fp8 cache needs tiles of >= {MIN_FP8_BLOCK_N} "
                         "keys, as vLLM's Triton decode keeps them: an fp8 MMA contracts 32 "
                         "elements at a time, and in P @ V the keys are that dimension")
    host_max_seq_len(seq_lens, block_tables, int(k_cache.shape[1]), max_seq_len)
    return group, kinds[0]
