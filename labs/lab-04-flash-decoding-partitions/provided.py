"""Lab 04, given code: the state type, input checks, constants, grid arithmetic, launchers.

``starter.py`` and ``solution.py`` both load this module and re-export ``AttentionState``,
so ``impl.AttentionState`` works whichever one is graded. Nothing here is an exercise: the
exercises are the numpy functions and the two Triton kernels in ``starter.py``.

The Triton launchers are written once, here, and bound to the kernels of the file that
uses them: ``split_kv_decode_triton = provided.split_kv_decode(partition_kernel,
merge_kernel)``. So the kernels stay in the student's file while the launch code
(validation, tile sizes, buffers, grids) and the launchers' docstrings live in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from common import launch_plan
from common.checks import check_paged_batch, host_max_seq_len
from common.triton_env import (
    LOG2E,
    cdiv,
    check_kernel_dtype,
    default_scale,
    dot_precision,
    dot_tile,
    launch_target,
    log2e_scale,
    on_interpreter,
    tile_config,
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

# Tile sizes: (GPU, interpreter). block_n = K/V tokens per tile of the partition kernel (on a
# GPU vLLM 0.33.0's TILE_SIZE_DECODE for 2-byte dtypes, 16; with 4 warps, d = 128 and 64-token
# tiles the kernel runs out of registers on sm_90), block_p = partitions per step of the merge
# kernel. Override them with the launchers' keyword arguments.
# The GPU values are the launch plan's (common/launch_plan.py, ``split_kv_decode``).
_GPU_PLAN = launch_plan.split_kv_decode(1, 8, 4, 128, 65536, launch_plan.H100)
GPU_TILES = {"block_n": _GPU_PLAN.tiles["block_n"], "block_p": _GPU_PLAN.tiles["block_p"]}
INTERPRETER_TILES = {"block_n": 16, "block_p": 16}
# Launch options on a GPU (the interpreter ignores them), written out rather than left to
# Triton's defaults (4 warps, 3 stages) so ``make gpu-report`` compiles exactly what runs.
PARTITION_LAUNCH = _GPU_PLAN.launch
MERGE_LAUNCH = {"num_warps": 4, "num_stages": 3}


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
    out_a: Any, lse_a: Any, out_b: Any, lse_b: Any
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
    q_shards: list[Any], k_shards: list[Any], v_shards: list[Any], causal: bool
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

    group: int
    block_size: int
    partition_size: int
    num_segments: int  # 0: partition mode
    splits: int
    partition_grid: tuple[int, int]
    merge_grid: tuple[int, int]
    scale: float
    tiles: dict[str, int]


def plan_split_kv(
    q: Any, k_cache: Any, v_cache: Any, block_tables: Any, seq_lens: Any,
    partition_size: int | None, scale: float | None, num_segments: int | None,
    block_n: int | None, max_seq_len: int | None,
) -> SplitKVLaunch:
    """Check the inputs (``ValueError`` naming the argument) and size the launch. Reads no
    device value when ``max_seq_len`` is given. ``partition_size=None``: the launch plan's
    (``common.launch_plan.split_kv_decode``: on a GPU, enough splits for two CTAs per SM when
    ``batch x KV heads`` is below the SM count; 512 tokens on the interpreter)."""
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
    tiles = tile_config(q, gpu=GPU_TILES, interpreter=INTERPRETER_TILES, block_n=block_n)
    splits = num_splits(max_seq_len, partition_size, num_segments)
    partition_grid, merge_grid = split_kv_grids(batch, num_heads, num_kv_heads, splits)
    scale = default_scale(head_dim) if scale is None else float(scale)  # the REAL head dim
    return SplitKVLaunch(group, block_size, partition_size, num_segments or 0, splits,
                         partition_grid, merge_grid, scale, tiles)


def _last_dim_contiguous(t: Any) -> Any:
    """The kernels index the last dim with stride 1. Copy only when that is not so:
    ``.contiguous()`` on a strided view of a whole KV cache would copy gigabytes a step."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _buffer(shape: tuple[int, ...], dtype: Any, like: Any) -> Any:
    """An output buffer. On the interpreter it starts as NaN, so a value a kernel forgets to
    store shows up as NaN; on a GPU it is ``torch.empty`` (no memset on the hot path)."""
    import torch

    if on_interpreter(like):
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def split_kv_decode(partition_kernel: Any, merge_kernel: Any) -> Callable[..., Any]:
    """The launcher ``split_kv_decode_triton``, bound to a lab file's two kernels:
    ``starter.py`` and ``solution.py`` both say
    ``split_kv_decode_triton = provided.split_kv_decode(_split_kv_partition_kernel,
    _merge_partitions_kernel)``."""

    def split_kv_decode_triton(
        q: Any,
        k_cache: Any,
        v_cache: Any,
        block_tables: Any,
        seq_lens: Any,
        partition_size: int | None = None,
        scale: float | None = None,
        *,
        num_segments: int | None = None,
        block_n: int | None = None,
        max_seq_len: int | None = None,
    ) -> tuple[Any, Any]:
        """Split-KV (flash-decoding) paged decode: a partition kernel, then a merge kernel.

        Args:
            q: ``[B, H, d]`` torch tensor, one new token per sequence (float16 or float32;
                bfloat16 on a GPU only).
            k_cache, v_cache: ``[num_blocks, block_size, KVH, d]`` / ``[..., dv]`` (NHD).
            block_tables: ``[B, max_blocks]`` int32; entries past a sequence's last block
                are never read. seq_lens: ``[B]`` int32 (0 allowed).
            partition_size: tokens per split when ``num_segments`` is None: any int >= 1
                (the kernel gathers token by token, so it need not be a multiple of the
                block size). The grid then grows with the longest sequence. None: the
                launch plan's (512 on the interpreter; on a GPU enough splits to fill the
                SMs, ``common.launch_plan.split_kv_decode``).
            num_segments: instead, cut every sequence into this many segments of whole K/V
                tiles (vLLM's 3D path uses 16): the grid no longer depends on the batch's
                lengths, so one captured CUDA graph serves every step.
            block_n: K/V tokens per tile (a power of two >= 16; None = 16, vLLM's decode
                tile).
            max_seq_len: the longest ``seq_lens`` entry, from host metadata: given, the
                launch makes no host synchronisation; None, ``seq_lens`` is copied to the
                host once.

        Returns:
            ``(out [B, H, dv] in q.dtype, lse [B, H] float32)``.
        """
        import torch

        plan = plan_split_kv(q, k_cache, v_cache, block_tables, seq_lens, partition_size,
                             scale, num_segments, block_n, max_seq_len)
        batch, num_heads = int(q.shape[0]), int(q.shape[1])
        head_dim_v = int(v_cache.shape[3])
        q, k_cache, v_cache = (_last_dim_contiguous(t) for t in (q, k_cache, v_cache))
        tables, lens = (t.to(device=q.device, dtype=torch.int32).contiguous()
                        for t in (block_tables, seq_lens))
        part_out = _buffer((batch, num_heads, plan.splits, head_dim_v), torch.float32, q)
        part_lse = _buffer((batch, num_heads, plan.splits), torch.float32, q)
        out = _buffer((batch, num_heads, head_dim_v), q.dtype, q)
        lse = _buffer((batch, num_heads), torch.float32, q)
        if batch == 0:
            return out, lse
        _launch_partitions(partition_kernel, plan, q, k_cache, v_cache, tables, lens,
                           part_out, part_lse)
        _launch_merge(merge_kernel, plan.merge_grid, part_out, part_lse, out, lse,
                      plan.tiles["block_p"])
        return out, lse

    return split_kv_decode_triton


def _launch_partitions(
    partition_kernel: Any, plan: Any, q: Any, k_cache: Any, v_cache: Any, tables: Any,
    lens: Any, part_out: Any, part_lse: Any,
) -> None:
    head_dim, head_dim_v = int(q.shape[2]), int(v_cache.shape[3])
    partition_kernel[plan.partition_grid](
        q, k_cache, v_cache, tables, lens, part_out, part_lse,
        log2e_scale(plan.scale), plan.splits,
        *q.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3], tables.stride()[0],
        *part_out.stride()[:3], *part_lse.stride()[:2],
        PARTITION_SIZE=plan.partition_size, NUM_SEGMENTS=plan.num_segments,
        BLOCK_SIZE=plan.block_size, GROUP=plan.group, HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v, BLOCK_H=dot_tile(plan.group), BLOCK_D=dot_tile(head_dim),
        BLOCK_DV=dot_tile(head_dim_v), BLOCK_N=plan.tiles["block_n"],
        DOT_PRECISION=dot_precision(q.dtype), LOG2E=LOG2E, **PARTITION_LAUNCH,
    )


def _launch_merge(
    merge_kernel: Any, grid: tuple[int, int], part_out: Any, part_lse: Any, out: Any, lse: Any,
    block_p: int,
) -> None:
    merge_kernel[grid](
        part_out, part_lse, out, lse, int(part_lse.shape[2]),
        *part_out.stride()[:3], *part_lse.stride()[:2], *out.stride()[:2], *lse.stride()[:2],
        HEAD_DIM_V=int(part_out.shape[3]), BLOCK_P=block_p,
        BLOCK_DV=dot_tile(int(part_out.shape[3])), LOG2E=LOG2E, **MERGE_LAUNCH,
    )


def merge_partitions(merge_kernel: Any) -> Callable[..., Any]:
    """The launcher ``merge_partitions_triton``, bound to a lab file's merge kernel."""

    def merge_partitions_triton(
        part_out: Any, part_lse: Any, *, block_p: int | None = None
    ) -> tuple[Any, Any]:
        """The merge kernel alone: ``P`` partial results per (sequence, head) into one.

        Args:
            part_out: ``[B, H, P, dv]`` torch tensor of normalised partial outputs.
            part_lse: ``[B, H, P]`` their natural-log LSEs; ``-inf`` or ``+inf`` = empty
                (an empty partition's output is never read).
            block_p: partitions per step (a power of two >= 16; None = the launcher's
                choice).

        Returns:
            ``(out [B, H, dv] in part_out.dtype, lse [B, H] float32)``.
        """
        import torch

        check_kernel_dtype(part_out, "part_out")
        if part_out.ndim != 4 or part_out.shape[2] < 1:
            raise ValueError(
                f"part_out must be [batch, heads, P >= 1, dv], got {tuple(part_out.shape)}")
        if tuple(part_lse.shape) != tuple(part_out.shape[:3]):
            raise ValueError(
                f"part_lse must be [batch, heads, P] = {tuple(part_out.shape[:3])}, got "
                f"{tuple(part_lse.shape)}"
            )
        tiles = tile_config(part_out, gpu=GPU_TILES, interpreter=INTERPRETER_TILES,
                            block_p=block_p)
        batch, num_heads, _, head_dim_v = (int(s) for s in part_out.shape)
        _, merge_grid = split_kv_grids(batch, num_heads, 1, 1)
        part_out = part_out.contiguous()
        part_lse = part_lse.to(torch.float32).contiguous()
        out = _buffer((batch, num_heads, head_dim_v), part_out.dtype, part_out)
        lse = _buffer((batch, num_heads), torch.float32, part_out)
        if batch and num_heads:
            _launch_merge(merge_kernel, merge_grid, part_out, part_lse, out, lse,
                          tiles["block_p"])
        return out, lse

    return merge_partitions_triton
