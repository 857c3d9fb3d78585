"""Lab 04, given code: the state type, input checks, constants, the tile plan, grids, buffers.

``starter.py`` and ``solution.py`` both load this module and re-export ``AttentionState``,
so ``impl.AttentionState`` works whichever one is graded. Nothing here is an exercise: the
exercises are the numpy functions, the two Triton kernels and their launchers in
``starter.py``. A launcher calls ``plan_split_kv`` (or ``check_partials``) to check its
inputs and size the launch, ``tile_config(q, gpu=gpu_tiles(d),
interpreter=INTERPRETER_TILES, ...)`` for its tiles, and ``output_buffer`` for its outputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from common import launch_plan
from common.checks import check_paged_batch, host_max_seq_len
from common.triton_env import (
    cdiv,
    check_kernel_dtype,
    default_scale,
    launch_target,
    on_interpreter,
)

ORDERS = ("sequential", "reverse", "tree", "random")

# vLLM's CUDA paged_attention_v2 cut every sequence into partitions of 512 tokens.
DEFAULT_PARTITION_SIZE = 512
# vLLM 0.33.0, vllm/v1/attention/backends/triton_attn.py: NUM_PAR_SOFTMAX_SEGMENTS = 16, the
# fixed number of segments of its unified Triton kernel's 3D (split-KV) path.
VLLM_NUM_SEGMENTS = 16
# CUDA's launch limits: 2^31 - 1 programs along grid x, 65,535 along y and z.
CUDA_MAX_GRID_X = 2**31 - 1
CUDA_MAX_GRID_YZ = 65_535

# Tile sizes. block_n = K/V tokens per tile of the partition kernel, block_p = partitions
# per step of the merge kernel; num_warps / num_stages launch both kernels (the interpreter
# ignores them). Override block_n with the launcher's keyword argument.
INTERPRETER_TILES: dict[str, int] = {"block_n": 16, "block_p": 16, "num_warps": 4, "num_stages": 1}


def gpu_tiles(head_dim: int) -> dict[str, int]:
    """Tiles and launch options on a GPU: the launch plan's (``common/launch_plan.py``,
    ``split_kv_decode``), the same at every context length (the length sets only the
    partition size, which ``plan_split_kv`` plans).

    ``block_n`` 16 keys per tile is vLLM 0.33.0's ``TILE_SIZE_DECODE`` for 2-byte dtypes
    (with 4 warps, d = 128 and 64-token tiles the kernel runs out of registers on sm_90);
    ``block_p`` 16 partitions per merge step; 4 warps and 3 stages, written out rather than
    left to Triton's defaults so ``make gpu-report`` compiles exactly what runs.
    """
    plan = launch_plan.split_kv_decode(1, 1, 1, head_dim, DEFAULT_PARTITION_SIZE,
                                       launch_plan.H100)  # fmt: skip
    return {name: value for name, value in plan.config.items() if name != "partition_size"}


class AttentionState(NamedTuple):
    """Attention over a set of keys, compressed: ``m [*S]``, ``l [*S]``, ``acc [*S, dv]``.

    ``acc`` is unnormalised (``sum exp(s - m) v``); the empty set is ``(-inf, 0, 0)``.
    """

    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray


# ---- checks of the numpy functions' inputs (bad input -> ValueError naming the argument) ----


def check_decode_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """``q [H, d]``, ``k [n, KVH, d]``, ``v [n, KVH, dv]`` with ``H % KVH == 0``."""
    if q.ndim != 2:
        raise ValueError(f"q must be [num_heads, head_dim], got shape {q.shape}")
    if k.ndim != 3 or k.shape[2] != q.shape[1]:
        raise ValueError(f"k must be [n, num_kv_heads, {q.shape[1]}], got shape {k.shape}")
    if v.ndim != 3 or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v must be [{k.shape[0]}, {k.shape[1]}, dv], got shape {v.shape}")
    if k.shape[1] == 0 or q.shape[0] % k.shape[1] != 0:
        raise ValueError(
            f"num_heads={q.shape[0]} (q) must be a multiple of num_kv_heads={k.shape[1]} (k)"
        )


def check_count(value: Any, name: str) -> int:
    """A Python or numpy integer ``>= 1`` (not a bool), or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def check_order(order: str) -> str:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    return order


def check_merge_inputs(
    out_a: npt.ArrayLike, lse_a: npt.ArrayLike, out_b: npt.ArrayLike, lse_b: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """float64 copies of ``out_a, lse_a, out_b, lse_b``: ``out [*S, dv]``, ``lse [*S]``."""
    out_a, out_b = np.asarray(out_a, dtype=np.float64), np.asarray(out_b, dtype=np.float64)
    lse_a, lse_b = np.asarray(lse_a, dtype=np.float64), np.asarray(lse_b, dtype=np.float64)
    if out_a.ndim < 1 or out_a.shape != out_b.shape:
        raise ValueError(f"out_b has shape {out_b.shape}, out_a has {out_a.shape}: they must match")
    if lse_a.shape != out_a.shape[:-1] or lse_b.shape != out_a.shape[:-1]:
        raise ValueError(
            f"lse_a {lse_a.shape} and lse_b {lse_b.shape} must be out's shape without the "
            f"last dim, {out_a.shape[:-1]}"
        )
    return out_a, lse_a, out_b, lse_b


def check_ring_shards(
    q_shards: list[npt.ArrayLike],
    k_shards: list[npt.ArrayLike],
    v_shards: list[npt.ArrayLike],
    causal: bool,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """float64 copies of the per-device shards; ``ValueError`` naming the list at fault."""
    if len(q_shards) == 0 or len(k_shards) != len(q_shards) or len(v_shards) != len(q_shards):
        raise ValueError(
            "q_shards, k_shards and v_shards must hold one shard per device: got "
            f"{len(q_shards)}, {len(k_shards)}, {len(v_shards)} shards"
        )
    qs = [np.asarray(x, dtype=np.float64) for x in q_shards]
    ks = [np.asarray(x, dtype=np.float64) for x in k_shards]
    vs = [np.asarray(x, dtype=np.float64) for x in v_shards]
    for p, (q, k, v) in enumerate(zip(qs, ks, vs)):
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or v.shape[:2] != k.shape[:2]:
            raise ValueError(
                f"shard {p}: q_shards[{p}] {q.shape}, k_shards[{p}] {k.shape}, v_shards[{p}] "
                f"{v.shape} must be [L, H, d], [L, KVH, d], [L, KVH, dv]"
            )
        if causal and q.shape[0] != k.shape[0]:
            raise ValueError(
                f"causal ring attention needs q_shards[{p}] and k_shards[{p}] to cover the same "
                f"tokens: lengths {q.shape[0]} and {k.shape[0]}"
            )
    return qs, ks, vs


# ---- the split-KV launch: how many splits, which grids --------------------------------------


def num_splits(max_seq_len: int, partition_size: int, num_segments: int | None) -> int:
    """Splits per sequence: ``num_segments`` (fixed), or ``ceil(max_seq_len / partition_size)``.

    With ``num_segments`` the answer does not depend on the batch's lengths, so the launch
    shape is the same every decode step (what a captured CUDA graph needs).
    """
    if num_segments is not None:
        return num_segments
    return max(1, cdiv(max_seq_len, partition_size))


def split_kv_grids(
    batch: int, num_heads: int, num_kv_heads: int, splits: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(partition grid, merge grid)`` of the split-KV launch.

    Partition kernel: ``(batch * splits, num_kv_heads)``, program ``(i, kv_head)`` works on
    sequence ``i // splits``, split ``i % splits``. The two axes that grow (the batch, and the
    splits, which grow with the context) are folded into grid x, whose limit is 2^31 - 1; a
    separate axis for the splits would hit CUDA's 65,535 limit on y/z at a 1M-token context
    with 16-token partitions. Merge kernel: ``(batch, num_heads)``.
    """
    partition_grid = (batch * splits, num_kv_heads)
    merge_grid = (batch, num_heads)
    for name, grid in (("partition", partition_grid), ("merge", merge_grid)):
        if grid[0] > CUDA_MAX_GRID_X or grid[1] > CUDA_MAX_GRID_YZ:
            raise ValueError(
                f"the {name} grid {grid} exceeds CUDA's limits (x <= {CUDA_MAX_GRID_X}, "
                f"y <= {CUDA_MAX_GRID_YZ}): batch={batch}, splits={splits}, "
                f"num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
    return partition_grid, merge_grid


class SplitKVLaunch(NamedTuple):
    """What the split-KV launch needs once the inputs are checked (all known on the host)."""

    group: int  # query heads per KV head
    block_size: int  # tokens per page of the cache
    partition_size: int  # tokens per split (partition mode)
    num_segments: int  # segments per sequence; 0: partition mode
    splits: int  # splits per sequence: the partials' P dim
    partition_grid: tuple[int, int]  # (batch * splits, num_kv_heads)
    merge_grid: tuple[int, int]  # (batch, num_heads)
    scale: float  # from the real head dim when not given


def plan_split_kv(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    partition_size: int | None,
    *,
    scale: float | None,
    num_segments: int | None,
    max_seq_len: int | None,
) -> SplitKVLaunch:
    """Check the inputs (``ValueError`` naming the argument) and size the launch. Reads no
    device value when ``max_seq_len`` is given. ``partition_size=None``: the launch plan's
    (``common.launch_plan.split_kv_decode``: on a GPU, the split its cost model prices
    fastest for ``max_seq_len`` keys per sequence, occupancy, partials and merge counted, or
    none; 512 tokens on the interpreter)."""
    if partition_size is not None:
        partition_size = check_count(partition_size, "partition_size")
    if num_segments is not None:
        num_segments = check_count(num_segments, "num_segments")
    for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        check_kernel_dtype(t, name)
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share a dtype (tl.dot needs equal operand types), got "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    group = check_paged_batch(q, k_cache, v_cache, block_tables, seq_lens)
    batch, num_heads, head_dim = (int(s) for s in q.shape)
    block_size, num_kv_heads = int(k_cache.shape[1]), int(k_cache.shape[2])
    max_seq_len = host_max_seq_len(seq_lens, block_tables, block_size, max_seq_len)
    planned = launch_plan.split_kv_decode(batch, num_kv_heads, group, head_dim, max_seq_len,
                                          launch_target(q))  # fmt: skip
    partition_size = partition_size or planned.tiles["partition_size"]
    splits = num_splits(max_seq_len, partition_size, num_segments)
    partition_grid, merge_grid = split_kv_grids(batch, num_heads, num_kv_heads, splits)
    scale = default_scale(head_dim) if scale is None else float(scale)  # the REAL head dim
    return SplitKVLaunch(group, block_size, partition_size, num_segments or 0, splits,
                         partition_grid, merge_grid, scale)


def check_partials(part_out: torch.Tensor, part_lse: torch.Tensor) -> tuple[int, int]:
    """``merge_partitions_triton``'s inputs: ``part_out [B, H, P >= 1, dv]`` and
    ``part_lse [B, H, P]`` (``ValueError`` naming the argument). Returns its merge grid,
    ``(B, H)``."""
    if not isinstance(part_out, torch.Tensor) or part_out.ndim != 4 or part_out.shape[2] < 1:
        raise ValueError(
            f"part_out must be a torch tensor [batch, heads, P >= 1, dv], got "
            f"{tuple(getattr(part_out, 'shape', ()))}"
        )
    check_kernel_dtype(part_out, "part_out")
    if not isinstance(part_lse, torch.Tensor) or tuple(part_lse.shape) != tuple(part_out.shape[:3]):
        raise ValueError(
            f"part_lse must be [batch, heads, P] = {tuple(part_out.shape[:3])}, got "
            f"{tuple(getattr(part_lse, 'shape', ()))}"
        )
    _, merge_grid = split_kv_grids(int(part_out.shape[0]), int(part_out.shape[1]), 1, 1)
    return merge_grid


def last_dim_contiguous(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kernels index the last dim with stride 1. Copy only a tensor where that is not
    so: ``.contiguous()`` on a strided view of a whole KV cache would copy gigabytes a step."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def int32_on(like: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``block_tables`` and ``seq_lens`` as contiguous int32 on ``like``'s device (``.to``,
    never ``.cpu()``: no host sync)."""
    return tuple(t.to(device=like.device, dtype=torch.int32).contiguous() for t in tensors)


def output_buffer(shape: tuple[int, ...], dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """An output buffer on ``like``'s device. On the interpreter it starts as NaN, so a value
    a kernel forgets to store shows up as NaN; on a GPU it is ``torch.empty`` (no memset on
    the hot path)."""
    if on_interpreter(like):
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)
