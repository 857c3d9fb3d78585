"""Launch plans: for each kernel family, the tiles, warps, stages and KV split for a target.

Pure functions of the shapes, the dtype size and the target GPU (SM count, compute
capability); no torch, no triton. The labs' launchers call them on a GPU (the interpreter
target keeps the tiny tiles that keep CPU tests fast), and ``make bench`` / ``make
gpu-report`` compile and judge exactly what they return (``bench/gpu_kernels.py``).

The rules follow the production planners (facts read from their sources, no code copied):

* **Query tiles (prefill).** FlashInfer's ``FA2DetermineCtaTileQ``
  (include/flashinfer/utils.cuh) picks the rows of a CTA's query tile from the average
  *packed* query length (query tokens x the GQA group): 128 rows above 64 packed rows (head
  dim < 256), 64 rows above 16 on sm_80 and newer, 16 rows below. GQA packing (vLLM 0.33.0
  ``vllm/v1/attention/ops/triton_unified_attention.py``: ``BLOCK_Q = BLOCK_M //
  num_queries_per_kv``) puts the group's heads in the rows, so a tile reads each K/V tile
  once per ``BLOCK_M`` rows. A tall tile is what turns ``tl.dot`` into wgmma on sm_90
  (a warpgroup MMA has M = 64 per warpgroup).
* **Split-KV (decode).** FlashInfer's decode planner
  (include/flashinfer/attention/scheduler.cuh, the work estimation behind ``plan()`` of
  flashinfer/decode.py) sets ``max_grid_size = num_blocks_per_sm * num_sm`` and does not
  split when ``batch_size * num_kv_heads >= max_grid_size``; otherwise it searches the
  smallest KV chunk whose split batch still fits the grid. Its prefill planner assumes
  ``num_blocks_per_sm = 2``. vLLM 0.33.0's unified Triton attention
  (``vllm/v1/attention/backends/triton_attn.py``) takes its 3D (split) path only for
  decode batches of at most ``128 // num_kv_heads`` sequences, with 16 fixed segments.
  Here: split whenever ``work items < SMs`` (work item = one CTA of the unsplit grid), into
  enough chunks for ``CTAS_PER_SM * SMs`` CTAs, each at least ``MIN_SPLIT_KEYS`` keys.
* **MLA.** FlashMLA's decode tile holds 64 query heads (``BLOCK_SIZE_M = 64``); one latent
  row per token is shared by every head, so the cache is read once per 64 heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """Where a kernel runs: ``arch`` is the compute capability x 10 (90 = sm_90; 0 = the CPU
    interpreter), ``sms`` the SM count; bandwidth, dense bf16 tensor throughput and a
    loaded HBM latency feed the report's roofline and Little's-law checks."""

    name: str
    arch: int
    sms: int
    hbm_tbps: float = 0.0
    tensor_tflops: float = 0.0
    hbm_latency_ns: float = 0.0

    @property
    def interpreter(self) -> bool:
        return self.arch == 0


INTERPRETER = Target("CPU interpreter", 0, 1)
# Datasheet bandwidth and dense bf16 throughput (NVIDIA A100, H100 SXM, B200 datasheets);
# the latency is an assumption (see TARGET_SOURCES).
A100 = Target("A100 SXM 80GB", 80, 108, 2.039, 312.0, 600.0)
H100 = Target("H100 SXM", 90, 132, 3.35, 989.0, 600.0)
B200 = Target("B200", 100, 148, 8.0, 2250.0, 600.0)
TARGETS = {0: INTERPRETER, 80: A100, 90: H100, 100: B200}
TARGET_SOURCES = (
    "SM counts, HBM bandwidth and dense BF16 tensor throughput: NVIDIA's A100 (80 GB SXM: 108 "
    "SMs, 2,039 GB/s, 312 TFLOP/s), H100 SXM (132 SMs, 3.35 TB/s, 989 TFLOP/s) and B200 (148 "
    "SMs, 8 TB/s, 2.25 PFLOP/s dense) datasheets and architecture whitepapers.",
    "HBM latency: an assumption of 600 ns for a load under traffic (unloaded DRAM latency "
    "on Ampere/Hopper is several hundred ns in published microbenchmarks, e.g. Chips and "
    "Cheese, 'Nvidia's H100: Funny L2, and Tons of Bandwidth', 2023; loaded latency is "
    "higher). Little's law: bytes in flight = bandwidth x latency.",
)

CTAS_PER_SM = 2  # FlashInfer's planner assumes 2 resident CTAs per SM when sizing a grid
MIN_SPLIT_KEYS = 256  # a split shorter than this costs more in merging than it saves


@dataclass(frozen=True)
class Plan:
    """What a launcher passes: ``tiles`` (block_m / block_n / block_h / block_p: the kernel's
    constexprs), ``num_warps``, ``num_stages``, the KV ``splits`` per (sequence, KV head) and
    the CTA ``grid`` at the shapes it was planned for."""

    tiles: dict[str, int]
    num_warps: int
    num_stages: int
    splits: int = 1
    grid: tuple[int, ...] = ()
    why: str = ""
    notes: dict[str, int] = field(default_factory=dict)

    @property
    def ctas(self) -> int:
        return math.prod(self.grid)

    @property
    def launch(self) -> dict[str, int]:
        """``num_warps`` and ``num_stages``: the launch options."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}

    @property
    def config(self) -> dict[str, int]:
        """Tiles and launch options in one dict (lab 00 / 05's ``gpu_tiles`` shape)."""
        return {**self.tiles, **self.launch}


def _pow2_at_least(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def kv_splits(work_items: int, keys: int, target: Target, chunk_multiple: int = 16) -> int:
    """Chunks per work item so the grid fills ``CTAS_PER_SM`` CTAs per SM: 1 when the unsplit
    grid already covers every SM (FlashInfer's "no split" case) or there are too few keys."""
    if target.interpreter or work_items >= target.sms or keys <= MIN_SPLIT_KEYS:
        return 1
    wanted = math.ceil(CTAS_PER_SM * target.sms / max(1, work_items))
    by_keys = math.ceil(keys / MIN_SPLIT_KEYS)
    splits = min(wanted, by_keys)
    chunk = math.ceil(math.ceil(keys / splits) / chunk_multiple) * chunk_multiple
    return math.ceil(keys / chunk)


def query_tile_rows(packed_rows: int, head_dim: int, target: Target) -> int:
    """FlashInfer's rule: 128 rows above 64 packed rows (d < 256), else 64 above 16 (sm_80+),
    else 16; the interpreter always 16."""
    if target.interpreter:
        return 16
    if packed_rows > 64 and head_dim < 256:
        return 128
    return 64 if packed_rows > 16 else 16


# ---- one function per kernel family -----------------------------------------------------------


def flash_forward(head_dim: int, target: Target) -> Plan:
    """Lab 00's dense forward (one ``[block_m, d]`` query tile per CTA, grid ``(L/block_m,
    B*H)``): 128 x 64 tiles with 8 warps; 3 stages at d = 128, 2 at d <= 64 (3 spill 8 B on
    sm_100) and 64 x 64 with 4 warps above 128."""
    if target.interpreter:
        return Plan({"block_m": 16, "block_n": 16}, 4, 1, why="interpreter: tiny tiles")
    d = _pow2_at_least(head_dim)
    if d <= 64:
        return Plan({"block_m": 128, "block_n": 64}, 8, 2, why="128-row tiles (wgmma)")
    if d <= 128:
        return Plan({"block_m": 128, "block_n": 64}, 8, 3, why="128-row tiles (wgmma)")
    return Plan({"block_m": 64, "block_n": 64}, 4, 2, why="d > 128: 64-row tiles fit")


def flash_backward(head_dim: int, target: Target) -> Plan:
    """Lab 05's backward (dK/dV and dQ kernels share the tiles): 64 x 64, 8 warps, 2 stages
    at d <= 64 and 3 at d = 128; 32 x 32 with 4 warps and 1 stage above."""
    if target.interpreter:
        return Plan({"block_m": 16, "block_n": 16}, 4, 1, why="interpreter: tiny tiles")
    d = _pow2_at_least(head_dim)
    if d <= 128:
        return Plan({"block_m": 64, "block_n": 64}, 8, 2 if d <= 64 else 3,
                    why="64 x 64: five live tiles fit the registers")  # fmt: skip
    return Plan({"block_m": 32, "block_n": 32}, 4, 1, why="d > 128: small tiles")


def varlen_prefill(
    num_tokens: int, num_seqs: int, num_kv_heads: int, group: int, head_dim: int, target: Target
) -> Plan:
    """Lab 03's GQA-packed varlen prefill: ``block_m`` rows = ``block_m // group`` query tokens
    x the group (``query_tile_rows`` of the average packed length, at least the group),
    ``block_n`` keys (64 beside a 64+-row tile at d > 64, else 32), warps and stages from
    ``prefill_launch``; grid ``(T // BLOCK_Q + B, KVH)`` as the launcher computes it."""
    packed = group * max(1, num_tokens // max(1, num_seqs))
    block_m = max(query_tile_rows(packed, head_dim, target), _pow2_at_least(group))
    if target.interpreter:
        return Plan({"block_m": block_m, "block_n": 16}, 4, 1,
                    grid=(num_tokens // (block_m // group) + num_seqs, num_kv_heads),
                    why="interpreter: tiny tiles")  # fmt: skip
    # 64 keys beside a 128-row tile at d > 64; at d <= 64, 128 x 64 spills on sm_80 with 4
    # warps and on sm_100 with 8, 128 x 32 with 8 warps does not (``make gpu-report``)
    block_n = 64 if block_m >= 64 and _pow2_at_least(head_dim) > 64 else 32
    grid = (num_tokens // (block_m // group) + num_seqs, num_kv_heads)
    return Plan({"block_m": block_m, "block_n": block_n},
                **prefill_launch(block_m, block_n, head_dim), grid=grid,
                why=f"{packed} packed rows per sequence: {block_m}-row tiles")


def prefill_launch(block_m: int, block_n: int, head_dim: int) -> dict[str, int]:
    """Lab 03's ``num_warps`` / ``num_stages`` for a ``block_m x block_n`` tile: 8 warps from
    64 x 64 elements (4 run out of registers at d = 128: K/V are gathered through per-key
    pointers), else 4; 3 stages."""
    return {"num_warps": 8 if block_m * block_n >= 64 * 64 else 4, "num_stages": 3}


def paged_decode(batch: int, num_kv_heads: int, group: int, head_dim: int, target: Target) -> Plan:
    """Lab 01's paged decode (one CTA per (sequence, KV head), the group in the rows): 64-key
    tiles, 4 warps, 2 stages. No split: the lab teaches the gather; lab 04 splits."""
    block_n = 16 if target.interpreter else 64
    return Plan({"block_n": block_n}, 4, 1 if target.interpreter else 2,
                grid=(batch, num_kv_heads), why="one CTA per (sequence, KV head)")  # fmt: skip


def split_kv_decode(
    batch: int, num_kv_heads: int, group: int, head_dim: int, max_seq_len: int, target: Target
) -> Plan:
    """Lab 04's split-KV decode: ``splits`` chunks per (sequence, KV head) from ``kv_splits``
    (a whole number of 256-key chunks), partition kernel grid ``(B * splits, KVH)``, 16-key
    tiles (vLLM's decode tile), 4 warps, 3 stages. ``tiles["partition_size"]`` is the chunk;
    the interpreter keeps vLLM v2's 512-token partitions."""
    if target.interpreter:
        splits = max(1, math.ceil(max_seq_len / 512))
        return Plan({"block_n": 16, "block_p": 16, "partition_size": 512}, 4, 1, splits,
                    (batch * splits, num_kv_heads), why="interpreter: 512-token partitions")
    wanted = kv_splits(batch * num_kv_heads, max_seq_len, target, MIN_SPLIT_KEYS)
    chunk = math.ceil(max_seq_len / wanted / MIN_SPLIT_KEYS) * MIN_SPLIT_KEYS
    splits = math.ceil(max_seq_len / chunk)
    return Plan({"block_n": 16, "block_p": 16, "partition_size": chunk}, 4, 3, splits,
                (batch * splits, num_kv_heads),
                why=f"{batch} x {num_kv_heads} work items on {target.sms} SMs: "
                f"{splits} splits of {chunk} keys")  # fmt: skip


def window_decode(
    batch: int, num_kv_heads: int, group: int, head_dim: int, max_seq_len: int,
    window: int | None, target: Target,
) -> Plan:
    """Lab 06's window/sink decode: lab 01's tiles, split over the visible keys
    (``min(context, window)``) by ``kv_splits``; grid ``(B, KVH, splits)``, the partials
    merged by the lab's given merge kernel when ``splits > 1``."""
    keys = min(max_seq_len, window) if window else max_seq_len
    splits = kv_splits(batch * num_kv_heads, keys, target)
    base = paged_decode(batch, num_kv_heads, group, head_dim, target)
    return Plan(base.tiles, base.num_warps, base.num_stages, splits, (*base.grid, splits),
                why=f"{keys} visible keys, {splits} splits", notes={"wanted_splits": splits})


def mla_decode(batch: int, num_heads: int, kv_lora_rank: int, max_seq_len: int,
               target: Target) -> Plan:  # fmt: skip
    """Lab 06's absorbed MLA decode: 64 query heads per tile (FlashMLA's tile: the latent cache
    is read once per 64 heads, and 64 rows make a wgmma), 32 keys per tile, 8 warps, 2
    stages; split over the keys by ``kv_splits`` when ``B x head tiles`` is under the SM
    count; grid ``(B, ceil(H / block_h), splits)``."""
    block_h = 64
    if target.interpreter:
        return Plan({"block_h": block_h, "block_n": 16}, 4, 1,
                    grid=(batch, math.ceil(num_heads / block_h), 1), why="interpreter")  # fmt: skip
    grid = (batch, math.ceil(num_heads / min(block_h, _pow2_at_least(num_heads))))
    splits = kv_splits(math.prod(grid), max_seq_len, target)
    return Plan({"block_h": block_h, "block_n": 32}, 8, 2, splits, (*grid, splits),
                why=f"64 heads per tile: the latent read once per 64 heads; {splits} splits",
                notes={"wanted_splits": splits})  # fmt: skip


def target_for(arch: int, sms: int | None = None) -> Target:
    """The target of a compute capability (x 10) and, if known, its real SM count: the
    table's numbers for its family (sm_8x: A100, sm_9x: H100, sm_10x+: B200)."""
    if arch == 0:
        return INTERPRETER
    base = A100 if arch < 90 else H100 if arch < 100 else B200
    return Target(base.name if sms in (None, base.sms) else f"sm_{arch}, {sms} SMs", arch,
                  sms or base.sms, base.hbm_tbps, base.tensor_tflops, base.hbm_latency_ns)
