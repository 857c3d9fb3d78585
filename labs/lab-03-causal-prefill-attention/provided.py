"""Lab 03 given code: input checks, the tile plan, the launch grid and the output buffers.

``starter.py`` and ``solution.py`` both load this module; nothing here is an exercise.
On the Triton side you write the kernel (``_varlen_prefill_kernel``) and its launcher
(``varlen_prefill_triton``); the launcher calls :func:`check_varlen_inputs`,
:data:`INTERPRETER_TILES` / :func:`gpu_tiles` (through ``tile_config``), :func:`fit_group`,
:func:`split_count`, :func:`varlen_grid`, :func:`output_buffers`, :func:`device_metadata`,
and the KV split's buffers and merge (``split_outputs``, ``merge_splits``: ``common.splits``,
given code lab 06 shares).

Bad input raises ``ValueError`` naming the argument. The checks read shapes only, unless
the caller leaves ``max_seq_len`` out: then they copy the metadata to the host once (the
debug path) and check every value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from common import launch_plan
from common.checks import (
    check_block_table,
    check_heads,
    check_paged_cache,
    check_seq_len,
    host_max_seq_len,
)
from common.splits import merge_splits, split_outputs  # noqa: F401 (given; lab 06 shares them)
from common.triton_env import check_kernel_dtype, dot_tile, plan_target

if TYPE_CHECKING:
    import torch

# Rows of the GQA-packed query tile (block_m) and keys per K/V tile (block_n). Under the
# interpreter 16 x 16 keeps the CPU tests fast (it ignores num_warps / num_stages).
INTERPRETER_TILES: dict[str, int] = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}


def gpu_tiles(
    num_tokens: int,
    num_seqs: int,
    group: int,
    head_dim: int,
    target: launch_plan.Target | None = None,
    *,
    num_kv_heads: int = 1,
    max_seq_len: int | None = None,
) -> dict[str, int]:
    """The GPU tile plan for ``q [num_tokens, H, head_dim]`` cut into ``num_seqs`` sequences,
    ``group`` query heads per KV head: ``block_m``, ``block_n``, ``num_warps``,
    ``num_stages`` and ``num_splits`` (KV splits; 1 unless ``max_seq_len`` is given).

    The launch plan's (``common.launch_plan.varlen_prefill``, FlashInfer's rule): 128 rows
    when a sequence packs more than 64 query rows, 64 above 16, else 16, and never fewer
    than the group; 64 keys beside a 64+-row tile at d > 64, else 32; 8 warps from a
    64 x 64 tile, else 4; 3 stages (``launch_plan.prefill_launch``). With ``max_seq_len``
    keys a sequence, a grid under a wave splits the keys (8 heads on one KV head, 1,024
    tokens after 32k cached: 2 splits on an H100).
    """
    target = target or plan_target()  # this GPU's plan; the H100's without one
    plan = launch_plan.varlen_prefill(num_tokens, num_seqs, num_kv_heads, group, head_dim,
                                      target, max_seq_len=max_seq_len)  # fmt: skip
    return {**plan.config, "num_splits": plan.splits}


def split_count(num_splits: Any, planned: int) -> int:
    """KV splits of a launch: the caller's ``num_splits`` (an int >= 1), or ``planned``."""
    if num_splits is None:
        return int(planned)
    if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) \
            or num_splits < 1:
        raise ValueError(f"num_splits must be None (the launch plan's) or an int >= 1, got "
                         f"{num_splits!r}")
    return int(num_splits)

# ---------------------------------------------------------------------------------------
# NumPy inputs
# ---------------------------------------------------------------------------------------


def check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """q ``[M, H, d]``, k ``[N, KVH, d]``, v ``[N, KVH, dv]`` with ``H % KVH == 0``."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(
            f"q, k, v must be 3-D [tokens, heads, dim]; got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} (q {q.shape}) must be a multiple of "
            f"num_kv_heads={num_kv_heads} (k {k.shape})"
        )
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k head_dim {k.shape[2]} != q head_dim {q.shape[2]} (k {k.shape})")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v {v.shape} must match k {k.shape} in tokens and kv heads")


def check_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, start_pos: Any) -> int:
    """The inputs of ``prefill_attention``; returns ``start_pos`` as an int."""
    check_qkv(q, k, v)
    start_pos = check_seq_len(start_pos, "start_pos")
    num_queries = q.shape[0]
    if k.shape[0] < start_pos + num_queries:
        raise ValueError(
            f"k has {k.shape[0]} tokens (k {k.shape}) but start_pos + M = "
            f"{start_pos} + {num_queries} = {start_pos + num_queries} are needed"
        )
    return start_pos


def check_chunk_sizes(chunk_sizes: Any, num_queries: int) -> list[int]:
    """Chunk sizes >= 0 that add up to the prompt's ``num_queries``."""
    sizes = [int(c) for c in chunk_sizes]
    if any(c < 0 for c in sizes) or sum(sizes) != num_queries:
        raise ValueError(
            f"chunk_sizes must be >= 0 and add up to M={num_queries} queries, got {chunk_sizes}"
        )
    return sizes


def check_varlen_metadata(
    num_tokens: int,
    num_blocks: int,
    block_size: int,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
) -> None:
    """Every value of the serving metadata (numpy arrays on the host) describes a real batch."""
    if seq_lens.ndim != 1 or (seq_lens < 0).any():
        raise ValueError(f"seq_lens must be a 1-D array of lengths >= 0, got {seq_lens}")
    batch = len(seq_lens)
    if query_start_loc.shape != (batch + 1,):
        raise ValueError(
            f"query_start_loc must have batch+1 = {batch + 1} entries, got shape "
            f"{query_start_loc.shape}"
        )
    if query_start_loc[0] != 0:
        raise ValueError(f"query_start_loc must start at 0, got {query_start_loc}")
    query_lens = np.diff(query_start_loc)
    if (query_lens < 0).any():
        raise ValueError(f"query_start_loc must be non-decreasing, got {query_start_loc}")
    if query_start_loc[-1] != num_tokens:
        raise ValueError(
            f"query_start_loc ends at {query_start_loc[-1]} but q has {num_tokens} tokens"
        )
    short = np.flatnonzero(seq_lens < query_lens)
    if short.size:
        b = int(short[0])
        raise ValueError(
            f"seq_lens[{b}]={seq_lens[b]} is smaller than sequence {b}'s query count "
            f"{query_lens[b]}: the context must include the new tokens"
        )
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got {block_tables.shape}"
        )
    for b in range(batch):
        check_block_table(
            block_tables[b], int(seq_lens[b]), block_size, num_blocks, name=f"block_tables[{b}]"
        )


# ---------------------------------------------------------------------------------------
# Shapes (numpy arrays or torch tensors: no value is read, so no host synchronisation)
# ---------------------------------------------------------------------------------------


def check_varlen_shapes(
    q: np.ndarray | torch.Tensor,
    k_cache: np.ndarray | torch.Tensor,
    v_cache: np.ndarray | torch.Tensor,
    block_tables: np.ndarray | torch.Tensor,
    query_start_loc: np.ndarray | torch.Tensor,
    seq_lens: np.ndarray | torch.Tensor,
) -> int:
    """q ``[T, H, d]``, caches ``[num_blocks, block_size, KVH, d / dv]``, block_tables
    ``[B, max_blocks]``, query_start_loc ``[B+1]``, seq_lens ``[B]``; returns the group size."""
    if q.ndim != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got {tuple(q.shape)}")
    check_paged_cache(k_cache, v_cache)
    num_tokens, num_heads, head_dim = (int(s) for s in q.shape)
    group = check_heads(num_heads, head_dim, tuple(k_cache.shape))
    if seq_lens.ndim != 1:
        raise ValueError(f"seq_lens must be 1-D [batch], got shape {tuple(seq_lens.shape)}")
    batch = int(seq_lens.shape[0])
    if tuple(query_start_loc.shape) != (batch + 1,):
        raise ValueError(
            f"query_start_loc must be [batch+1 = {batch + 1}] (seq_lens has {batch} entries), "
            f"got shape {tuple(query_start_loc.shape)}"
        )
    if block_tables.ndim != 2 or int(block_tables.shape[0]) != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if batch == 0 and num_tokens:
        raise ValueError(f"q has {num_tokens} tokens but seq_lens describes no sequence")
    return group


# ---------------------------------------------------------------------------------------
# The Triton launch: checks, tiles, grid, buffers (the launcher puts them together)
# ---------------------------------------------------------------------------------------


def metadata_on_host(
    block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three metadata tensors as numpy arrays, copied in ONE device-to-host transfer.

    Only the debug path (``max_seq_len=None``) calls this: a serving engine never waits for
    the GPU to hand its metadata back.
    """
    import torch

    parts = [t.reshape(-1).to(torch.int64) for t in (query_start_loc, seq_lens, block_tables)]
    flat = np.array(torch.cat(parts).tolist(), dtype=np.int64)  # the one synchronisation
    batch = int(seq_lens.shape[0])
    qsl, lens, tables = np.split(flat, [batch + 1, 2 * batch + 1])
    return tables.reshape(tuple(block_tables.shape)), qsl, lens


def check_varlen_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int | None,
) -> int:
    """The launcher's checks (shapes, dtypes, metadata); returns the group ``H // KVH``.

    With ``max_seq_len`` given only what the host knows is checked (no synchronisation);
    with None the metadata is copied to the host once and every value is checked.
    """
    group = check_varlen_shapes(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_kernel_dtype(t, name)
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, "
            f"{v_cache.dtype}"
        )
    num_blocks, page_size = int(v_cache.shape[0]), int(v_cache.shape[1])
    if max_seq_len is None:  # the debug path: one copy to the host, every value checked
        host = metadata_on_host(block_tables, query_start_loc, seq_lens)
        check_varlen_metadata(int(q.shape[0]), num_blocks, page_size, *host)
    else:  # the serving path: trust the device metadata, check what the host knows
        host_max_seq_len(seq_lens, block_tables, page_size, max_seq_len)
    return group


def fit_group(tiles: dict[str, int], group: int, block_m: int | None) -> dict[str, int]:
    """``tiles`` with a query tile tall enough for the whole query-head group.

    A tile's ``block_m`` rows hold ``block_m // group`` query tokens times the ``group``
    query heads that share one KV head, so ``block_m`` must be ``>= group`` (vLLM 0.33.0:
    ``BLOCK_M = 16 if num_queries_per_kv <= 16 else next_power_of_2(num_queries_per_kv)``).
    The launcher's choice grows to ``dot_tile(group)``; a caller's ``block_m`` below the
    group is a ``ValueError``.
    """
    if block_m is not None and block_m < group:
        raise ValueError(
            f"block_m={block_m} is smaller than the query-head group ({group} query heads per "
            "KV head): one tile must hold every query head of its KV head"
        )
    return {**tiles, "block_m": max(tiles["block_m"], dot_tile(group))}


def varlen_grid(
    num_tokens: int, num_seqs: int, num_kv_heads: int, block_q: int, num_splits: int = 1
) -> tuple[int, int, int]:
    """``(num_tokens // BLOCK_Q + num_seqs, num_kv_heads, num_splits)``: from shapes only.

    sum_b ceil(query_len_b / BLOCK_Q) <= sum_b (query_len_b // BLOCK_Q + 1)
    <= num_tokens // BLOCK_Q + num_seqs, so every query block has a program; the spare ones
    return at once. (vLLM 0.33.0: ``total_num_q_blocks = q.shape[0] // BLOCK_Q + num_seqs``.)
    """
    return (num_tokens // block_q + num_seqs, num_kv_heads, num_splits)


def output_buffers(q: torch.Tensor, head_dim_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``out [T, H, head_dim_v]`` in q's dtype and ``lse [T, H]`` float32, on q's device
    (uninitialised: the kernel writes every real row)."""
    import torch

    num_tokens, num_heads = int(q.shape[0]), int(q.shape[1])
    out = torch.empty((num_tokens, num_heads, head_dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=q.device)
    return out, lse


def device_metadata(
    q: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(block_tables, query_start_loc, seq_lens)`` as contiguous int32 on q's device: the
    kernel reads a block table row with stride ``block_tables.stride(0)`` and unit steps."""
    import torch

    tables, starts, lens = (
        t.to(device=q.device, dtype=torch.int32).contiguous()
        for t in (block_tables, query_start_loc, seq_lens)
    )
    return tables, starts, lens
