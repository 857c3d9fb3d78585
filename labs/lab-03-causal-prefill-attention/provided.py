"""Lab 03 given code: input checks, the GQA tile choice and the Triton launcher.

``starter.py`` and ``solution.py`` both load this module; nothing here is an exercise.
The exercise on the Triton side is the kernel (``_varlen_prefill_kernel``), which
:func:`launch_varlen_prefill` launches with the arguments listed in its docstring.

Bad input raises ``ValueError`` naming the argument. The launcher reads shapes only, unless
the caller leaves ``max_seq_len`` out: then it copies the metadata to the host once (the
debug path) and checks every value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common import launch_plan
from common.checks import (
    check_block_table,
    check_heads,
    check_paged_cache,
    check_seq_len,
    host_max_seq_len,
)
from common.triton_env import (
    check_kernel_dtype,
    default_scale,
    dot_precision,
    dot_tile,
    launch_target,
    log2e_scale,
    on_interpreter,
    tile_config,
)

# Rows of the GQA-packed query tile (block_m) and keys per K/V tile (block_n). On a GPU the
# launch plan picks them (common/launch_plan.py, ``varlen_prefill``: FlashInfer's rule, 128
# rows when a sequence packs more than 64 query rows, 64 above 16, else 16; 64 keys beside a
# 64+-row tile at d > 64, else 32); the interpreter keeps 16 x 16 so CPU tests stay fast.
INTERPRETER_TILES = {"block_m": 16, "block_n": 16}
def gpu_launch(block_m: int, block_n: int, head_dim: int = 128) -> dict[str, int]:
    """``num_warps`` and ``num_stages`` of the varlen kernel for a ``block_m x block_n`` tile
    (ignored by the interpreter): the launch plan's (``launch_plan.prefill_launch``)."""
    return launch_plan.prefill_launch(block_m, block_n, head_dim)

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
    q: Any, k_cache: Any, v_cache: Any, block_tables: Any, query_start_loc: Any, seq_lens: Any
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
# The Triton launch
# ---------------------------------------------------------------------------------------


def metadata_on_host(
    block_tables: Any, query_start_loc: Any, seq_lens: Any
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


def gqa_tiles(
    q: Any, group: int, block_m: int | None, block_n: int | None, num_seqs: int = 1
) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_Q, BLOCK_N)``: rows per query tile, query tokens per tile, keys per
    K/V tile. On a GPU the defaults are the launch plan's for ``q [T, H, d]`` cut into
    ``num_seqs`` sequences (``common.launch_plan.varlen_prefill``).

    A tile's ``BLOCK_M`` rows hold ``BLOCK_Q = BLOCK_M // group`` query tokens times the
    ``group`` query heads that share one KV head (vLLM 0.33.0: ``BLOCK_M = 16 if
    num_queries_per_kv <= 16 else next_power_of_2(num_queries_per_kv)``).
    """
    gpu = None if on_interpreter(q) else launch_plan.varlen_prefill(
        int(q.shape[0]), num_seqs, 1, group, int(q.shape[2]), launch_target(q)).tiles
    config = tile_config(
        q, gpu=gpu or INTERPRETER_TILES, interpreter=INTERPRETER_TILES, block_m=block_m,
        block_n=block_n,
    )
    rows = config["block_m"]
    if block_m is None:
        rows = max(rows, dot_tile(group))  # a group larger than 16 gets a taller tile
    elif block_m < group:
        raise ValueError(
            f"block_m={block_m} is smaller than the query-head group ({group} query heads per "
            "KV head): one tile must hold every query head of its KV head"
        )
    return rows, rows // group, config["block_n"]


def varlen_grid(num_tokens: int, num_seqs: int, num_kv_heads: int, block_q: int) -> tuple:
    """``(num_tokens // BLOCK_Q + num_seqs, num_kv_heads)``: from shapes only.

    sum_b ceil(query_len_b / BLOCK_Q) <= sum_b (query_len_b // BLOCK_Q + 1)
    <= num_tokens // BLOCK_Q + num_seqs, so every query block has a program; the spare ones
    return at once. (vLLM 0.33.0: ``total_num_q_blocks = q.shape[0] // BLOCK_Q + num_seqs``.)
    """
    return (num_tokens // block_q + num_seqs, num_kv_heads)


def _check_launch_inputs(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    query_start_loc: Any,
    seq_lens: Any,
    max_seq_len: int | None,
) -> int:
    """The launcher's checks (shapes, dtypes, metadata); returns the head ratio ``group``."""
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


def launch_varlen_prefill(
    kernel: Any,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    query_start_loc: Any,
    seq_lens: Any,
    scale: float | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[Any, Any]:
    """Check the inputs, choose the tiles and the grid, launch ``kernel``; ``(out, lse)``.

    Strides are passed for every dimension (no tensor need be contiguous) and V's head dim
    may differ from K's. The kernel is called as::

        kernel[(T // BLOCK_Q + B, KVH)](
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, lse,
            qk_scale,            # scale * log2(e): the kernel uses exp2
            num_seqs,
            stride_qt, stride_qh, stride_qd,
            stride_kb, stride_ks, stride_kh, stride_kd,
            stride_vb, stride_vs, stride_vh, stride_vd,
            stride_bt,
            stride_ot, stride_oh, stride_od,
            stride_lt, stride_lh,
            GROUP=, PAGE_SIZE=, HEAD_DIM=, HEAD_DIM_PAD=, HEAD_DIM_V=, HEAD_DIM_V_PAD=,
            BLOCK_M=, BLOCK_Q=, BLOCK_N=, DOT_PRECISION=)
    """
    import torch

    group = _check_launch_inputs(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_seq_len
    )
    num_tokens, num_heads, head_dim = (int(s) for s in q.shape)
    _, page_size, num_kv_heads, head_dim_v = (int(s) for s in v_cache.shape)
    block_m, block_q, block_n = gqa_tiles(q, group, block_m, block_n, int(seq_lens.shape[0]))

    out = torch.empty((num_tokens, num_heads, head_dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=q.device)
    if num_tokens == 0:
        return out, lse
    metadata = [t.to(device=q.device, dtype=torch.int32).contiguous() for t in
                (block_tables, query_start_loc, seq_lens)]  # fmt: skip
    scale = default_scale(head_dim) if scale is None else float(scale)
    grid = varlen_grid(num_tokens, int(seq_lens.shape[0]), num_kv_heads, block_q)
    kernel[grid](
        q, k_cache, v_cache, *metadata, out, lse,
        log2e_scale(scale), int(seq_lens.shape[0]),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), metadata[0].stride(0),
        *out.stride(), *lse.stride(),
        GROUP=group, PAGE_SIZE=page_size, BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=dot_tile(head_dim),
        HEAD_DIM_V=head_dim_v, HEAD_DIM_V_PAD=dot_tile(head_dim_v),
        DOT_PRECISION=dot_precision(q.dtype), **gpu_launch(block_m, block_n, head_dim),
    )  # fmt: skip
    return out, lse
