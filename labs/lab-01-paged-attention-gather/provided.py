"""Lab 01 given code: the input checks and tile constants ``starter.py`` and ``solution.py``
share. Nothing here is an exercise; call these at the top of your functions.

Bad input is a ``ValueError`` that names the argument, never an ``IndexError`` from deep
inside. The checks that every paged lab shares live in ``common.checks``; the ones below
wrap them for this lab's functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common import launch_plan
from common.checks import (
    check_block_table,
    check_paged_batch,
    check_paged_cache,
    check_seq_len,
    host_max_seq_len,
)
from common.checks import check_decode_inputs as check_decode_inputs  # given: one sequence's inputs
from common.triton_env import check_kernel_dtype

# Tile sizes of paged_decode_triton (tokens per K/V tile), picked with
# common.triton_env.tile_config. 16 keeps the interpreter fast while a tile still crosses
# cache-block boundaries; the interpreter ignores num_warps and num_stages.
INTERPRETER_TILES: dict[str, int] = {"block_n": 16, "num_warps": 4, "num_stages": 1}


def gpu_tiles(batch: int, num_kv_heads: int, group: int, head_dim: int) -> dict[str, int]:
    """Tiles and launch options on a GPU: the launch plan of ``common/launch_plan.py``
    (``paged_decode``) for an H100, ``{"block_n", "num_warps", "num_stages"}``.

    64 tokens per K/V tile keep enough bytes in flight; 4 warps, 2 stages. One program per
    (sequence, KV head) whatever the shape: this lab teaches the gather, lab 04 splits.
    """
    return launch_plan.paged_decode(batch, num_kv_heads, group, head_dim, launch_plan.H100).config


def check_slot_mapping_inputs(
    block_table: Any, positions: Any, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(block_table, positions)`` as int64 arrays, or ``ValueError`` naming the argument.

    Every position must fall in a logical block the table has, and that entry must name a
    block (not the padding value -1).
    """
    if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    block_table = np.asarray(block_table, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    if block_table.ndim != 1:
        raise ValueError(f"block_table must be 1-D [max_blocks], got shape {block_table.shape}")
    if positions.ndim != 1:
        raise ValueError(f"positions must be 1-D [n], got shape {positions.shape}")
    if positions.size == 0:
        return block_table, positions
    if positions.min() < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions.min())}")
    last = int(positions.max()) // int(block_size)
    if last >= len(block_table):
        raise ValueError(
            f"block_table has {len(block_table)} entries but position {int(positions.max())} "
            f"needs logical block {last} (block_size {block_size})"
        )
    if block_table[positions // block_size].min() < 0:
        raise ValueError("block_table has a padding entry (< 0) where a position needs a block")
    return block_table, positions


def check_write_kv_inputs(
    k_cache: np.ndarray, v_cache: np.ndarray, k: Any, v: Any, slots: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(k, v, slots)`` as arrays: ``k, v [n, num_kv_heads, head_dim]`` of the caches and
    ``n`` distinct slots inside the cache."""
    check_paged_cache(k_cache, v_cache)
    num_blocks, block_size = k_cache.shape[:2]
    k, v = np.asarray(k), np.asarray(v)
    slots = np.asarray(slots, dtype=np.int64)
    if k.ndim != 3 or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k has shape {k.shape}, expected [n, *{k_cache.shape[2:]}]")
    if v.shape != (k.shape[0], *v_cache.shape[2:]):
        raise ValueError(f"v has shape {v.shape}, expected [{k.shape[0]}, *{v_cache.shape[2:]}]")
    if slots.shape != (k.shape[0],):
        raise ValueError(f"slots has shape {slots.shape}, expected [{k.shape[0]}] (one per token)")
    if slots.size and (slots.min() < 0 or slots.max() >= num_blocks * block_size):
        raise ValueError(
            f"slots must lie in [0, {num_blocks * block_size}), got {slots.min()}..{slots.max()}"
        )
    if len(np.unique(slots)) != len(slots):
        raise ValueError("slots has duplicates: two tokens cannot share one cache slot")
    return k, v, slots


def check_gather_inputs(
    cache: np.ndarray, block_table: Any, seq_len: Any
) -> tuple[np.ndarray, int]:
    """``(block_table, seq_len)`` for :func:`gather_kv` on a ``[num_blocks, block_size,
    num_kv_heads, head_dim]`` cache."""
    if cache.ndim != 4:
        raise ValueError(
            f"cache must be [num_blocks, block_size, num_kv_heads, head_dim], got {cache.shape}"
        )
    seq_len = check_seq_len(seq_len)
    block_table = np.asarray(block_table)
    num_blocks, block_size = cache.shape[:2]
    check_block_table(block_table, seq_len, block_size, num_blocks)
    return block_table, seq_len



def check_batch_inputs(
    q: Any, block_tables: Any, seq_lens: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q [B, H, d], block_tables [B, max_blocks], seq_lens [B])`` agreeing on ``B``."""
    q, block_tables, seq_lens = np.asarray(q), np.asarray(block_tables), np.asarray(seq_lens)
    if q.ndim != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {q.shape}")
    batch = q.shape[0]
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got shape {block_tables.shape}"
        )
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be [batch={batch}], got shape {seq_lens.shape}")
    return q, block_tables, seq_lens


def check_triton_inputs(
    q: Any, k_cache: Any, v_cache: Any, block_tables: Any, seq_lens: Any,
    max_seq_len: int | None,
) -> int:
    """Shapes, dtypes and (unless ``max_seq_len`` is given) lengths of a
    ``paged_decode_triton`` call; returns the group size.

    With ``max_seq_len`` it reads no tensor value, so it makes no host synchronisation:
    only what the host already knows is checked. Without it, ``seq_lens`` is copied to the
    host once (``common.checks.host_max_seq_len``), which also validates the lengths.
    """
    group = check_paged_batch(q, k_cache, v_cache, block_tables, seq_lens)
    if int(v_cache.shape[3]) != int(q.shape[2]):
        raise ValueError(
            f"v_cache head_dim {int(v_cache.shape[3])} must equal q's head_dim "
            f"{int(q.shape[2])} in this kernel"
        )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_kernel_dtype(t, name)
    host_max_seq_len(seq_lens, block_tables, int(k_cache.shape[1]), max_seq_len)
    return group
