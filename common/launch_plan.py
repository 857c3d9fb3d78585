"""Launch plans: for each kernel family, the tiles, warps, stages and KV split for a target.

Pure functions of the shapes, the dtype size and the target GPU (SM count, compute
capability, shared memory); no torch, no triton. The labs' launchers call them on a GPU
(the interpreter target keeps the tiny tiles that keep CPU tests fast), and ``make bench``
/ ``make gpu-report`` compile and judge exactly what they return (``bench/gpu_kernels.py``).

The rules follow the production planners (facts read from their sources, no code copied;
FlashInfer at commit 00b1eec of include/flashinfer/attention/scheduler.cuh):

* **Occupancy.** FlashInfer's decode work estimation
  (``BatchDecodeWithPagedKVCacheWorkEstimationDispatched``) asks the CUDA occupancy API how
  many CTAs of the kernel fit on an SM (``cudaOccupancyMaxActiveBlocksPerMultiprocessor``,
  from its threads and shared memory) and sets ``max_grid_size = num_blocks_per_sm x
  num_sm``; only its prefill plan (``PrefillPlan``) assumes 2 per SM. Here ``ctas_per_sm``
  computes the same from the kernel's registers, warps and shared memory (``FOOTPRINTS``,
  read from the compiled kernels in ``captured_outputs/gpu-report.json``) and the target's
  limits.
* **Split-KV (decode).** FlashInfer does not split when ``batch x num_kv_heads`` already
  fills ``max_grid_size``; otherwise ``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``
  binary-searches the smallest KV chunk (in pages, at least 128 tokens) whose split batch
  ``sum_i ceil(pages_i / chunk) x num_kv_heads`` still fits the grid, over the *per-request*
  page counts, and splits only if the batch actually grows. Here the chunk is searched over
  the per-request lengths too (``kv_lens``; the launchers, which must not sync, pass only
  ``max_seq_len`` and get the uniform case), but each candidate is priced by a cost model
  (``split_cost``) that counts what a split costs: the partials' bytes (written by the
  partition kernel, re-read by the merge), the merge kernel and its launch, idle CTAs of a
  uniform grid, and the waves of the resident CTAs. The plan splits only when the model
  says it gains at least ``MIN_GAIN``. Departure: FlashInfer's rule fills the grid and
  stops; the model also rejects a split that fills the grid without shortening the call
  (MLA at batch 64 on an H100) and takes one that more than fills it when the partial last
  wave would leave SMs idle (MLA at batch 64 on an A100).
* **Split-KV (prefill).** FlashInfer's FA2 prefill plan (``PrefillSplitQOKVIndptr``,
  ``PrefillBinarySearchKVChunkSize``) splits a prefill's KV too: the smallest chunk (at
  least 128 tokens) whose ``sum_i ceil(packed_qo_len_i / cta_tile_q) x ceil(kv_len_i /
  chunk)`` fits ``max_batch_size_if_split``, the partials merged after. Here
  ``_best_prefill`` prices each split count (up to ``PREFILL_CTAS_PER_SM`` CTAs a SM) and
  lab 03's kernel runs it (grid axis 2, ``common.splits``' merge). Departures: a tile's
  split is an equal share of its own whole key tiles below its first query, the diagonal
  tiles in split 0 (FlashInfer's chunks are fixed spans from the sequence's start, equal
  for every tile), so every row sees a key before any masked tile; and among plans the
  model prices within ``MIN_GAIN`` the least work wins (at TP8, 128-row tiles split in two
  over 64-row tiles: the same modelled time, half the L2 reads).
* **Query tiles (prefill).** FlashInfer's ``FA2DetermineCtaTileQ``
  (include/flashinfer/utils.cuh) picks the rows of a CTA's query tile from the average
  *packed* query length (query tokens x the GQA group): 128 rows above 64 packed rows (head
  dim < 256), 64 rows above 16 on sm_80 and newer, 16 rows below. GQA packing (vLLM 0.33.0
  ``vllm/v1/attention/ops/triton_unified_attention.py``: ``BLOCK_Q = BLOCK_M //
  num_queries_per_kv``) puts the group's heads in the rows, so a tile reads each K/V tile
  once per ``BLOCK_M`` rows. A tall tile is what turns ``tl.dot`` into wgmma on sm_90
  (a warpgroup MMA has M = 64 per warpgroup). Departure: the average lets 511 decode rows
  pick the tile of a 4,096-token prefill beside them, so the tile comes from the sequences
  that carry the FLOPs (``packed_rows_by_flops``). FlashInfer's sm_90 plan
  (``PrefillSM90Plan``) fixes 128 rows (192 at dv = 64) for every request and balances the
  tiles over the SMs with a heap; it neither splits the KV nor packs the group.
* **A tile per sequence class.** vLLM's FlashInfer backend
  (``vllm/v1/attention/backends/flashinfer.py``) cuts a batch with
  ``split_decodes_and_prefills`` (decodes first) and runs the decode rows through
  ``BatchDecodeWithPagedKVCacheWrapper`` and the rest through the prefill wrapper: two
  launches, each with its own tile. Here ``split_classes`` / ``_per_class`` plan the decode
  rows and the prefill rows apart (``Plan.classes``) and take the two launches when the
  model prices them within ``MIN_GAIN`` of one and they issue less work (a decode row in a
  128-row tile pays 128 rows of MMA). Departure: lab 03's launcher cannot run them (it
  would need the class boundary on the host), so it launches the one-launch plan.
* **vLLM 0.33.0's split (3D) path** (``vllm/v1/attention/backends/triton_attn.py`` and
  ``ops/triton_unified_attention.py``): taken only for causal batches whose 2D grid would
  be small, ``num_seqs x cdiv(max_seqlen_q, BLOCK_Q) <= seq_threshold_3D`` with
  ``seq_threshold_3D = 128 // num_kv_heads`` snapped to a CUDA-graph capture size, query
  lengths up to 8 (speculative verification), with 16 fixed segments
  (``NUM_PAR_SOFTMAX_SEGMENTS``). Unchecked against the v0.33.0 tag: the stored
  ``triton_attn.py`` (commit 001ceb3) predates the 3D path, and a later
  ``unified_attention`` seen takes it only for ``max_seqlen_q <= 1`` and ``num_seqs <=
  seq_threshold_3D``. The course's planners do not follow this rule; lab 04 teaches it.
* **MLA.** FlashMLA's decode tile holds 64 query heads (``BLOCK_SIZE_M = 64``); one latent
  row per token is shared by every head, so the cache is read once per 64 heads.
* **Shared memory.** A plan fits the target's per-block shared memory (``smem_kb``, the
  estimate ``make gpu-report`` checks against the compiled kernels): stages, then keys per
  tile, are cut until it does (sm_86 / sm_89 parts have 99 KB a block).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from common.gpus import LIMITS


@dataclass(frozen=True)
class Target:
    """Where a kernel runs: ``arch`` is the compute capability x 10 (90 = sm_90; 0 = the CPU
    interpreter), ``sms`` the SM count; bandwidth, dense bf16 tensor throughput and a
    loaded HBM latency feed the cost model and the report's Little's-law check; shared
    memory per SM / per block (KB) and resident warps per SM feed ``ctas_per_sm``."""

    name: str
    arch: int
    sms: int
    hbm_tbps: float = 0.0
    tensor_tflops: float = 0.0
    hbm_latency_ns: float = 0.0
    smem_per_sm_kb: int = 228
    smem_per_block_kb: int = 227
    max_warps_per_sm: int = 64

    @property
    def interpreter(self) -> bool:
        return self.arch == 0


INTERPRETER = Target("CPU interpreter", 0, 1)


def _limits(arch: int) -> tuple[int, int, int]:
    """``(smem KB an SM, smem KB a block, resident warps)`` of ``common.gpus.LIMITS``."""
    lim = LIMITS[arch]
    return lim.smem_per_sm // 1024, lim.smem_per_block // 1024, lim.max_warps_per_sm


# Datasheet bandwidth and dense bf16 throughput (NVIDIA A100, H100 SXM, B200 datasheets);
# the latency is an assumption (see TARGET_SOURCES); shared memory from common/gpus.py.
A100 = Target("A100 SXM 80GB", 80, 108, 2.039, 312.0, 600.0, *_limits(80))
H100 = Target("H100 SXM", 90, 132, 3.35, 989.0, 600.0, *_limits(90))
B200 = Target("B200", 100, 148, 8.0, 2250.0, 600.0, *_limits(100))
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
MIN_SPLIT_KEYS = 256  # the shortest KV chunk a split may have (FlashInfer: 128 tokens)
MIN_GAIN = 0.05  # split only when the model says the call gets at least 5 % faster
PREFILL_CTAS_PER_SM = 2  # FlashInfer's PrefillPlan assumes 2 (its decode plan asks the API)
# Assumptions of the cost model (modelled, not measured): a dependent kernel launch (the
# merge) costs about 2 us without CUDA graphs; a CTA that exits at once (a split past the
# end of its sequence) holds one resident slot for about 1 us.
LAUNCH_US = 2.0
IDLE_CTA_US = 1.0


@dataclass(frozen=True)
class Plan:
    """What a launcher passes: ``tiles`` (block_m / block_n / block_h / block_p: the kernel's
    constexprs), ``num_warps``, ``num_stages``, the KV ``splits`` per (sequence, KV head) and
    the CTA ``grid`` at the shapes it was planned for; ``model`` the cost model's numbers
    for that launch (``split_cost``: modelled, not measured; empty on the interpreter)."""

    tiles: dict[str, int]
    num_warps: int
    num_stages: int
    splits: int = 1
    grid: tuple[int, ...] = ()
    why: str = ""
    notes: dict[str, int] = field(default_factory=dict)
    model: dict[str, float] = field(default_factory=dict)
    classes: tuple[Plan, ...] = ()  # one launch a sequence class: (decode rows, prefill rows)

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


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ---- occupancy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    """A compiled kernel's resources at its planned config: registers per thread, shared
    memory a block takes (KB, the system's 1 KB included), warps, pipeline stages and the
    global bytes one stage loads (for Little's law)."""

    regs: int
    smem_kb: float
    warps: int
    stages: int
    stage_bytes: int


# sm_90, bf16, the bench configs of captured_outputs/gpu-report.json (tests/test_launch_plan.py
# checks that each gives the report's CTAs per SM).
FOOTPRINTS = {
    "split_partition": Footprint(71, 13.6, 4, 3, 16 * 256 * 2),  # lab 04, d 128, 16 keys
    "merge": Footprint(32, 3.0, 4, 3, 16 * 128 * 4),  # lab 04's merge, 16 fp32 partials
    "decode_d64": Footprint(64, 21.0, 4, 2, 64 * 128 * 2),  # labs 01 / 06, 64 keys, d 64
    "decode_d128": Footprint(107, 39.0, 4, 2, 64 * 256 * 2),  # labs 01 / 06, 64 keys, d 128
    "mla_h64": Footprint(234, 145.0, 8, 2, 32 * 576 * 2),  # lab 06, 64 heads x 512 + 64
    "mla_h16": Footprint(112, 56.0, 8, 2, 32 * 576 * 2),  # lab 06, 16 heads (TP8)
    "prefill": Footprint(192, 97.5, 8, 3, 64 * 256 * 2),  # lab 03, 128 x 64, d 128
}


def ctas_per_sm(fp: Footprint, target: Target) -> int:
    """Resident CTAs an SM holds (the occupancy API's answer): the fewest allowed by warps,
    registers (allocated per warp in units of 256), shared memory and the 32-block cap."""
    regs_per_warp = math.ceil(fp.regs * 32 / 256) * 256
    by_regs = (65536 // regs_per_warp) // fp.warps
    by_warps = target.max_warps_per_sm // fp.warps
    by_smem = int(target.smem_per_sm_kb // fp.smem_kb)
    return max(1, min(by_regs, by_warps, by_smem, 32))


# ---- the cost model (modelled, not measured) -----------------------------------------------


@dataclass(frozen=True)
class KeyWork:
    """What one CTA does per key and once: HBM bytes and FLOPs per key (per lane: a KV head
    or a head tile), fixed bytes per CTA (its queries), the bytes of the result a CTA
    writes (``out_bytes`` unsplit, ``partial_bytes`` as a split: output and lse) and the
    merge's work per (sequence, lane): ``merge_out_bytes`` written, for ``merge_rows``
    CTAs of the merge grid per lane."""

    key_bytes: float
    key_flops: float
    cta_bytes: int
    out_bytes: int
    partial_bytes: int
    merge_rows: int = 1


def _cta_keys(n: int, splits: int, layout: str, chunk: int, granule: int) -> dict[int, int]:
    """``{keys: CTAs}`` of one sequence of ``n`` keys cut into ``splits``: ``"chunks"`` of
    ``chunk`` keys from the start (lab 04's partitions; splits past the end are idle), or
    ``"segments"``: ``splits`` equal parts of whole ``granule``-key tiles (labs 06's split)."""
    size = chunk if layout == "chunks" else _round_up(-(-n // splits), granule) if n else granule
    full = min(n // size, splits)
    rest = n - full * size if full < splits else 0
    out: dict[int, int] = {}
    if full:
        out[size] = full
    if rest:
        out[rest] = out.get(rest, 0) + 1
    idle = splits - full - (1 if rest else 0)
    if idle:
        out[0] = out.get(0, 0) + idle
    return out


def split_cost(lens: Sequence[int], lanes: int, splits: int, work: KeyWork, fp: Footprint,
               target: Target, *, layout: str = "chunks", chunk: int = 0,
               granule: int = 16) -> dict[str, float]:  # fmt: skip
    """The modelled time (µs) of one call: the partition kernel over ``len(lens)`` sequences
    x ``lanes`` x ``splits`` CTAs, plus the merge when ``splits > 1``.

    Each CTA costs ``max(bytes / (BW / SMs), FLOPs / (peak / SMs))`` (its SM's share of the
    machine, slowed by Little's law when too few bytes are in flight), an idle CTA
    ``IDLE_CTA_US`` of one resident slot; the kernel takes the most loaded SM's time, the
    larger of ``total / SMs`` and, for each CTA size ``w``, ``ceil(CTAs >= w / SMs) x w``
    (exact for equal CTAs: the waves; the hardware's greedy schedule is within one CTA of
    it). The merge reads every partial once and writes the output, ``LAUNCH_US`` more. The
    roof is the minimum work (no partials) at the datasheet roofs.
    """
    sms, per = target.sms, ctas_per_sm(fp, target)
    bw, peak = target.hbm_tbps * 1e6, target.tensor_tflops * 1e6  # bytes / µs, FLOP / µs
    counts: dict[int, int] = {}
    for n in lens:
        n = int(n)
        one = {n: 1} if splits == 1 else _cta_keys(n, splits, layout, chunk, granule)
        for keys, c in one.items():
            counts[keys] = counts.get(keys, 0) + c * lanes
    ctas = sum(counts.values())
    resident = min(per, math.ceil(ctas / sms))
    needed = bw * target.hbm_latency_ns * 1e-3 / sms
    latency = min(1.0, resident * max(1, fp.stages - 1) * fp.stage_bytes / needed) if needed else 1
    result = work.out_bytes if splits == 1 else work.partial_bytes

    def cta_us(keys: int) -> float:
        if keys == 0:
            return IDLE_CTA_US / per
        moved = keys * work.key_bytes + work.cta_bytes / splits + result  # q: once, via L2
        return max(moved / (bw / sms) / latency, keys * work.key_flops / (peak / sms))

    times = sorted(((cta_us(k), c) for k, c in counts.items()), reverse=True)
    total = sum(t * c for t, c in times)
    kernel, seen = total / sms, 0
    for t, c in times:
        seen += c
        kernel = max(kernel, math.ceil(seen / sms) * t)
    busy = ctas - counts.get(0, 0)
    keys = sum(int(n) for n in lens) * lanes
    written = busy * work.partial_bytes if splits > 1 else 0
    merge = 0.0
    if splits > 1:
        rows = len(lens) * lanes * work.merge_rows
        per_row = (written / max(1, rows) + ctas / max(1, rows) * 4  # partials + idle lse
                   + work.out_bytes / work.merge_rows)  # fmt: skip
        merge = LAUNCH_US + max(rows * per_row / bw, per_row / (bw / sms))
    minimum = keys * work.key_bytes + len(lens) * lanes * (work.cta_bytes + work.out_bytes)
    flops = keys * work.key_flops
    roof = max(minimum / bw, flops / peak)
    return {"kernel_us": round(kernel, 2), "merge_us": round(merge, 2),
            "plan_us": round(kernel + merge, 2), "roof_us": round(roof, 2),
            "bytes": int(minimum + 2 * written), "partial_bytes": int(2 * written),
            "flops": int(flops), "ctas": ctas, "busy_ctas": busy,
            "ctas_per_sm": per}  # fmt: skip


def best_split(lens: Sequence[int], lanes: int, work: KeyWork, fp: Footprint, target: Target,
               *, layout: str = "chunks", granule: int = 16,
               min_keys: int = MIN_SPLIT_KEYS) -> tuple[int, int, dict[str, float]]:  # fmt: skip
    """``(splits, chunk, model)``: the split count (and, for ``"chunks"``, the chunk: whole
    ``granule`` tiles, at least ``min_keys``) the cost model prices lowest, searched over
    every split count that keeps the longest sequence's chunks at ``min_keys`` or more and
    the grid within 8 waves of resident CTAs; 1 unless a split gains ``MIN_GAIN``."""
    longest = max((int(n) for n in lens), default=0)
    unsplit = split_cost(lens, lanes, 1, work, fp, target)
    best = (1, _round_up(max(longest, 1), granule), unsplit)
    if target.interpreter or longest < 2 * min_keys:
        return best
    slots = ctas_per_sm(fp, target) * target.sms
    cap = min(longest // min_keys, math.ceil(8 * slots / max(1, len(lens) * lanes)))
    tried = set()
    for wanted in range(2, cap + 1):
        chunk = max(min_keys, _round_up(-(-longest // wanted), granule))
        splits = -(-longest // chunk) if layout == "chunks" else wanted
        if (splits, chunk) in tried or splits < 2:
            continue
        tried.add((splits, chunk))
        cost = split_cost(lens, lanes, splits, work, fp, target, layout=layout, chunk=chunk,
                          granule=granule)  # fmt: skip
        if cost["plan_us"] < best[2]["plan_us"]:
            best = (splits, chunk, cost)
    if best[0] > 1 and best[2]["plan_us"] > unsplit["plan_us"] * (1 - MIN_GAIN):
        return 1, _round_up(max(longest, 1), granule), unsplit
    return best


def flashinfer_chunk(lens: Sequence[int], lanes: int, slots: int,
                     min_keys: int = 128) -> int:  # fmt: skip
    """FlashInfer's chunk for comparison (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``
    in keys): the smallest chunk of at least ``min_keys`` whose split batch ``sum_i
    ceil(n_i / chunk) x lanes`` fits ``slots`` resident CTAs."""
    low, high = min_keys, max(min_keys, max(int(n) for n in lens))
    while low < high:
        mid = (low + high) // 2
        if sum(-(-max(int(n), 1) // mid) for n in lens) * lanes > slots:
            low = mid + 1
        else:
            high = mid
    return low


def _gqa_decode_work(group: int, head_dim: int, head_dim_v: int, elem: int = 2,
                     partial_elem: int = 4) -> KeyWork:  # fmt: skip
    """One (sequence, KV head) CTA of GQA decode: K and V of a key, ``4 (d + dv)`` FLOPs per
    query head and key, the group's queries in, their outputs (or partials) out."""
    return KeyWork(key_bytes=(head_dim + head_dim_v) * elem,
                   key_flops=2 * (head_dim + head_dim_v) * group,
                   cta_bytes=group * head_dim * elem, out_bytes=group * head_dim_v * elem,
                   partial_bytes=group * (head_dim_v * partial_elem + 4),
                   merge_rows=group)  # fmt: skip


def query_tile_rows(packed_rows: int, head_dim: int, target: Target) -> int:
    """FlashInfer's rule: 128 rows above 64 packed rows (d < 256), else 64 above 16 (sm_80+),
    else 16; the interpreter always 16."""
    if target.interpreter:
        return 16
    if packed_rows > 64 and head_dim < 256:
        return 128
    return 64 if packed_rows > 16 else 16


def packed_rows_by_flops(q_lens: Sequence[int], kv_lens: Sequence[int], group: int) -> int:
    """The packed query length (tokens x group) of the sequences that carry the FLOPs: the
    mean of ``q_len x group`` weighted by each sequence's attended pairs (bottom-right
    causal), so 511 one-token decodes beside one 4,096-token prefill give the prefill's."""
    pairs = [q * (n - q) + q * (q + 1) // 2 for q, n in zip(q_lens, kv_lens)]
    total = sum(pairs)
    if not total:
        return group
    return round(sum(p * q * group for p, q in zip(pairs, q_lens)) / total)


def smem_kb(family: str, tiles: dict[str, int], stages: int, head_dim: int,
            head_dim_v: int | None = None) -> float:  # fmt: skip
    """Estimated shared memory of a plan (KB, bf16, the system's 1 KB included): the
    resident query tile plus ``stages`` K/V (or Q/dO) tiles, the pipeline Triton builds;
    at or above the compiled kernels' (``tests/test_launch_plan.py`` checks it against
    ``captured_outputs/gpu-report.json``)."""
    d = _pow2_at_least(head_dim)
    dv = _pow2_at_least(head_dim_v or head_dim)
    if family == "mla":  # q tile [block_h, d_c + rope] + 2 or more latent tiles (compiled:
        row = d + 64  # 104 KB at 64 heads, 16 keys, 1 stage)
        return (tiles["block_h"] * row + max(2, stages) * tiles["block_n"] * row) * 2 / 1024 + 1
    rows = tiles.get("block_m", 16)
    keys = tiles.get("block_n", 16)
    if family == "backward":  # K, V resident; Q and dO tiles pipelined; lse and Delta
        return (2 * keys * d + max(2, stages) * rows * (d + dv)) * 2 / 1024 + 2
    return (rows * d + stages * keys * (d + dv)) * 2 / 1024 + 1


def fit_smem(plan: Plan, family: str, head_dim: int, target: Target) -> Plan:
    """Cut stages (down to 1), then keys per tile (down to 16), until the estimate fits the
    target's per-block shared memory."""
    if target.interpreter:
        return plan
    tiles, stages = dict(plan.tiles), plan.num_stages
    while smem_kb(family, tiles, stages, head_dim) > target.smem_per_block_kb:
        if stages > 1:
            stages -= 1
        elif tiles.get("block_n", 16) > 16:
            tiles["block_n"] //= 2
        elif tiles.get("block_h", 16) > 16:  # MLA: fewer heads per tile, more tiles
            tiles["block_h"] //= 2
        else:
            break
    if (tiles, stages) == (plan.tiles, plan.num_stages):
        return plan
    return replace(plan, tiles=tiles, num_stages=stages,
                   why=plan.why + f"; {stages} stages / {tiles.get('block_n')} keys fit "
                   f"{target.smem_per_block_kb} KB")  # fmt: skip


# ---- one function per kernel family -----------------------------------------------------------


def flash_forward(head_dim: int, target: Target) -> Plan:
    """Lab 00's dense forward (one ``[block_m, d]`` query tile per CTA, grid ``(L/block_m,
    B*H)``): 128 x 64 tiles with 8 warps; 3 stages at d = 128, 2 at d <= 64 (3 spill 8 B on
    sm_100) and 64 x 64 with 4 warps above 128; fewer stages where shared memory is short
    (``fit_smem``: 2 at d = 128 on sm_86 / sm_89)."""
    if target.interpreter:
        return Plan({"block_m": 16, "block_n": 16}, 4, 1, why="interpreter: tiny tiles")
    d = _pow2_at_least(head_dim)
    if d <= 64:
        plan = Plan({"block_m": 128, "block_n": 64}, 8, 2, why="128-row tiles (wgmma)")
    elif d <= 128:
        plan = Plan({"block_m": 128, "block_n": 64}, 8, 3, why="128-row tiles (wgmma)")
    else:  # 4 warps spill a 64 x 256 fp32 accumulator (make gpu-report): 8 share it
        plan = Plan({"block_m": 64, "block_n": 64}, 8, 2, why="d > 128: 64-row tiles fit")
    return fit_smem(plan, "forward", head_dim, target)


def flash_backward(head_dim: int, target: Target) -> Plan:
    """Lab 05's backward (dK/dV and dQ kernels share the tiles): 64 x 64, 8 warps, 2 stages
    at d <= 64 and 3 at d = 128; 32 x 32 with 4 warps and 1 stage above; fewer stages where
    shared memory is short (``fit_smem``)."""
    if target.interpreter:
        return Plan({"block_m": 16, "block_n": 16}, 4, 1, why="interpreter: tiny tiles")
    d = _pow2_at_least(head_dim)
    if d <= 128:
        plan = Plan({"block_m": 64, "block_n": 64}, 8, 2 if d <= 64 else 3,
                    why="64 x 64: five live tiles fit the registers")  # fmt: skip
    else:  # dK and dV [32, 256] fp32 spill with 4 warps (make gpu-report): 8 hold them
        plan = Plan({"block_m": 32, "block_n": 32}, 8, 1, why="d > 128: small tiles")
    fitted = fit_smem(plan, "backward", head_dim, target)
    # cut to fit (sm_86 / sm_89): 1 stage, since 2 spill 8 B in dQ at d = 128 (make gpu-report)
    return replace(fitted, num_stages=1) if fitted.num_stages < plan.num_stages else fitted


def _prefill_tiles(block_m: int, head_dim: int) -> dict[str, int]:
    # 64 keys beside a 64+-row tile at d = 128; at d <= 64, 128 x 64 spills on sm_80 with 4
    # warps and on sm_100 with 8, 128 x 32 with 8 warps does not (``make gpu-report``);
    # above 128, 32 keys keep the pipeline's K/V tiles within shared memory
    d = _pow2_at_least(head_dim)
    return {"block_m": block_m, "block_n": 64 if block_m >= 64 and d == 128 else 32}


def _prefill_ctas(
    q_lens: Sequence[int], kv_lens: Sequence[int], group: int, block_m: int, head_dim: int,
    splits: int = 1, elem: int = 2,
) -> tuple[list[tuple[float, float, float]], int]:
    """``([(HBM bytes, FLOPs, L2 bytes) per busy CTA], idle CTAs)`` of lab 03's grid for one
    KV head: ``ceil(q_len x group / block_m)`` tiles per sequence, tile j computing all
    ``block_m`` rows (padded rows too) against keys up to ``n - q + (j + 1) x BLOCK_Q``
    (bottom-right causal). Split as the kernel cuts: a tile's whole key tiles below its
    first query in ``splits`` equal shares, the diagonal tiles in split 0; a share without
    keys is an idle CTA, as are the grid's ``+ B`` slack programs. HBM: a sequence's K/V
    once (its tiles share it through L2), a CTA's queries in and its output (or partial:
    out's dtype and an fp32 lse a row) out; L2: every key a CTA loads."""
    d, block_n = _pow2_at_least(head_dim), _prefill_tiles(block_m, head_dim)["block_n"]
    block_q = max(1, block_m // group)
    out, idle, busy = [], 0, 0
    for q, n in zip(q_lens, kv_lens):
        tiles = -(-q // block_q)
        busy += tiles
        for j in range(tiles):
            first, last = j * block_q, min(q, (j + 1) * block_q)
            rows, end = (last - first) * group, n - q + last
            full = (n - q + first + 1) // block_n  # whole key tiles every row sees
            per, diagonal = -(-full // splits), end - full * block_n
            for s in range(splits):
                keys = max(0, min(per, full - s * per)) * block_n + diagonal * (s == 0)
                if not keys:
                    idle += 1
                    continue
                kv = keys * 2 * d * elem
                io = rows * d * elem * 2 + rows * 4 * (splits > 1)
                out.append((kv / tiles + io, 2 * 2 * d * block_m * keys, kv))
    return out, idle + max(0, sum(q_lens) // block_q + len(q_lens) - busy) * splits


def _prefill_cost(q_lens: Sequence[int], kv_lens: Sequence[int], num_kv_heads: int, group: int,
                  block_m: int, head_dim: int, target: Target,
                  splits: int = 1) -> dict[str, float]:  # fmt: skip
    """Modelled time (µs) of lab 03's launch at ``block_m`` rows and ``splits`` KV splits:
    the CTAs of ``_prefill_ctas`` on the SMs (the ``split_cost`` schedule), mma.sync (half
    speed, the report's MMA factor) below 64 rows on sm_90 and newer; with a split, the
    merge (``common.splits``: reads every partial, writes the output, ``LAUNCH_US``).
    ``work_us``: the tensor-core time the CTAs issue (padded rows too) plus their L2 reads
    at HBM speed, what a plan saves among plans of equal modelled time."""
    sms = target.sms
    bw, peak = target.hbm_tbps * 1e6 / sms, target.tensor_tflops * 1e6 / sms
    mma = 0.5 if block_m < 64 and target.arch >= 90 else 1.0
    ctas, idle = _prefill_ctas(q_lens, kv_lens, group, block_m, head_dim, splits)
    times = sorted((max(b / bw, f / (peak * mma)) for b, f, _ in ctas), reverse=True)
    times = [t for t in times for _ in range(num_kv_heads)]
    per = ctas_per_sm(FOOTPRINTS["prefill"], target)
    total = sum(times) + idle * num_kv_heads * IDLE_CTA_US / per
    kernel = total / sms
    for i in range(0, len(times), sms):  # wave by wave: the i-th largest CTAs
        kernel = max(kernel, (i // sms + 1) * times[i])
    d = _pow2_at_least(head_dim)
    pairs = sum(q * (n - q) + q * (q + 1) // 2 for q, n in zip(q_lens, kv_lens))
    flops = 4 * d * group * pairs * num_kv_heads  # the minimum: real rows, causal pairs
    rows = sum(q_lens) * group * num_kv_heads
    minimum = (sum(kv_lens) * 2 * d * num_kv_heads + rows * 2 * d) * 2
    partial = 2 * rows * splits * (d * 2 + 4) if splits > 1 else 0  # written, then read
    merge = LAUNCH_US + (partial / 2 + rows * d * 2) / (bw * sms) if splits > 1 else 0.0
    issued = sum(f for _, f, _ in ctas) * num_kv_heads / (peak * sms * mma)
    return {"kernel_us": round(kernel, 2), "merge_us": round(merge, 2),
            "plan_us": round(kernel + merge, 2),
            "roof_us": round(max(minimum / (bw * sms), flops / (peak * sms)), 2),
            "ctas": (len(ctas) + idle) * num_kv_heads, "busy_ctas": len(ctas) * num_kv_heads,
            "flops": int(flops), "bytes": int(minimum + partial), "partial_bytes": int(partial),
            "l2_bytes": int(sum(x for _, _, x in ctas) * num_kv_heads), "splits": splits,
            "block_m": block_m, "ctas_per_sm": per,
            "work_us": round(issued + sum(x for _, _, x in ctas) * num_kv_heads / (bw * sms), 2)}


def _best_prefill(q_lens: Sequence[int], kv_lens: Sequence[int], num_kv_heads: int,
                  group: int, block_m: int, floor: int, head_dim: int,
                  target: Target) -> dict[str, float]:  # fmt: skip
    """The ``_prefill_cost`` of the tile (``block_m``, or half when that is still ``>=
    floor``) and KV split the model prefers: a split only when it is ``MIN_GAIN`` faster
    than that tile unsplit (FlashInfer's ``PrefillBinarySearchKVChunkSize`` grows the grid
    to ``max_batch_size_if_split``; here the split count that prices lowest, up to two
    resident CTAs a SM), then, among plans within ``MIN_GAIN`` of the fastest, the least
    ``work_us`` (the 128-row tile split in two beats 64-row tiles: half the L2 reads)."""
    found = []
    for bm in (block_m, block_m // 2) if block_m // 2 >= floor else (block_m,):
        unsplit = _prefill_cost(q_lens, kv_lens, num_kv_heads, group, bm, head_dim, target)
        found.append(unsplit)
        busy = unsplit["busy_ctas"]
        cap = min(max(kv_lens, default=0) // MIN_SPLIT_KEYS,
                  -(-PREFILL_CTAS_PER_SM * target.sms // max(1, busy)))
        for splits in range(2, cap + 1) if busy < target.sms else ():
            cost = _prefill_cost(q_lens, kv_lens, num_kv_heads, group, bm, head_dim, target,
                                 splits)  # fmt: skip
            if cost["plan_us"] < unsplit["plan_us"] * (1 - MIN_GAIN):
                found.append(cost)
    fastest = min(c["plan_us"] for c in found)
    return min((c for c in found if c["plan_us"] <= fastest * (1 + MIN_GAIN)),
               key=lambda c: c["work_us"])


def varlen_prefill(
    num_tokens: int, num_seqs: int, num_kv_heads: int, group: int, head_dim: int,
    target: Target, *, q_lens: Sequence[int] | None = None,
    kv_lens: Sequence[int] | None = None, max_seq_len: int | None = None,
) -> Plan:
    """Lab 03's GQA-packed varlen prefill: ``block_m`` rows = ``block_m // group`` query
    tokens x the group, ``block_n`` keys, warps and stages from ``prefill_launch``, KV
    ``splits``; grid ``(T // BLOCK_Q + B, KVH, splits)`` as the launcher computes it.

    ``block_m``: FlashInfer's ``query_tile_rows`` of the packed length: the FLOP-weighted
    one (``packed_rows_by_flops``) of ``q_lens`` / ``kv_lens``, else of ``num_tokens /
    num_seqs`` tokens each, with ``max_seq_len`` keys each when given (the launcher: no
    host sync); then ``_best_prefill`` takes the tile and split (never under 64 rows on
    sm_90+, never under the group). Only totals: the average, halved under a wave.
    ``classes``: with lengths of both kinds, one plan per sequence class (``split_classes``)."""
    lens_known = q_lens is not None and kv_lens is not None
    if not lens_known and max_seq_len and num_seqs and num_tokens and not target.interpreter:
        q_lens = [num_tokens // num_seqs + (b < num_tokens % num_seqs) for b in range(num_seqs)]
        kv_lens, lens_known = [max(int(max_seq_len), q) for q in q_lens], True
    if lens_known:
        packed = packed_rows_by_flops(q_lens, kv_lens, group)
    else:
        packed = group * max(1, num_tokens // max(1, num_seqs))
    block_m = max(query_tile_rows(packed, head_dim, target), _pow2_at_least(group))
    if target.interpreter:
        return Plan({"block_m": block_m, "block_n": 16}, 4, 1,
                    grid=(num_tokens // (block_m // group) + num_seqs, num_kv_heads, 1),
                    why="interpreter: tiny tiles")  # fmt: skip
    why = f"{packed} packed rows per sequence: {block_m}-row tiles"
    model: dict[str, float] = {}
    splits = 1
    floor = max(_pow2_at_least(group), 64 if target.arch >= 90 else 16)
    if not lens_known and block_m // 2 >= floor and (
            (num_tokens // (block_m // group) + num_seqs) * num_kv_heads < target.sms):
        block_m //= 2  # only totals known: a grid under a wave takes the smaller tile
        why += f", halved: the {block_m * 2}-row grid is under a wave"
    if lens_known:
        model = _best_prefill(q_lens, kv_lens, num_kv_heads, group, block_m, floor, head_dim,
                              target)  # fmt: skip
        if model["block_m"] < block_m:
            why += f", halved: {model['busy_ctas']} CTAs fill the {target.sms} SMs"
        block_m, splits = int(model["block_m"]), int(model["splits"])
        if splits > 1:
            why += f", {splits} KV splits: {model['busy_ctas']} busy CTAs"
    tiles = _prefill_tiles(block_m, head_dim)
    grid = (num_tokens // (block_m // group) + num_seqs, num_kv_heads, splits)
    plan = Plan(tiles, **prefill_launch(block_m, tiles["block_n"], head_dim, target.arch),
                splits=splits, grid=grid, why=why, model=model)  # fmt: skip
    plan = fit_smem(plan, "prefill", head_dim, target)
    classes = split_classes(q_lens, kv_lens, group, head_dim, target) if lens_known else None
    if classes is None or max_seq_len:
        return plan
    return _per_class(plan, classes, num_kv_heads, group, head_dim, target)


def split_classes(q_lens: Sequence[int], kv_lens: Sequence[int], group: int, head_dim: int,
                  target: Target) -> tuple[tuple[list[int], list[int]], ...] | None:  # fmt: skip
    """``((q_lens, kv_lens) of the decode rows, (...) of the prefill rows)``: a sequence is a
    decode row when its own packed tile (``query_tile_rows(q x group)``, at least the
    group) is smaller than the FLOP-weighted tile of the batch; None with one class."""
    tile = max(query_tile_rows(packed_rows_by_flops(q_lens, kv_lens, group), head_dim, target),
               _pow2_at_least(group))  # fmt: skip
    small = [max(query_tile_rows(q * group, head_dim, target), _pow2_at_least(group)) < tile
             for q in q_lens]  # fmt: skip
    if all(small) or not any(small):
        return None
    pick = [[(q, n) for q, n, f in zip(q_lens, kv_lens, small) if f == cls] for cls in (1, 0)]
    return tuple(([q for q, _ in part], [n for _, n in part]) for part in pick)


def _per_class(plan: Plan, classes: tuple[tuple[list[int], list[int]], ...], num_kv_heads: int,
               group: int, head_dim: int, target: Target) -> Plan:  # fmt: skip
    """``plan`` with one launch per sequence class (each planned alone), when the two
    launches (the second ``LAUNCH_US`` more) price within ``MIN_GAIN`` of the one launch and
    issue less ``work_us`` (the decode rows' padded MMA)."""
    parts = tuple(varlen_prefill(sum(q), len(q), num_kv_heads, group, head_dim, target,
                                 q_lens=q, kv_lens=n) for q, n in classes)  # fmt: skip
    add = ("kernel_us", "merge_us", "plan_us", "ctas", "busy_ctas", "bytes", "partial_bytes",
           "l2_bytes", "work_us")  # fmt: skip
    model = {**plan.model, **{k: round(sum(p.model[k] for p in parts), 2) for k in add}}
    model["plan_us"] += LAUNCH_US
    if (model["plan_us"] > plan.model["plan_us"] * (1 + MIN_GAIN)
            or model["work_us"] >= plan.model["work_us"]):
        return plan
    rows = " / ".join(f"{p.tiles['block_m']}" for p in parts)
    return replace(plan, classes=parts, model=model,
                   why=f"a launch a class: decode / prefill rows in {rows}-row tiles")


def prefill_launch(block_m: int, block_n: int, head_dim: int, arch: int = 90) -> dict[str, int]:
    """Lab 03's ``num_warps`` / ``num_stages`` for a ``block_m x block_n`` tile: 8 warps from
    64 x 64 elements or above d = 128 (4 run out of registers at d = 128 with 64 x 64, and
    at d = 256 with 64 x 32 except on sm_100: K/V are gathered through per-key pointers),
    else 4; 3 stages."""
    # d = 256 (64 x 32 tiles): 4 warps spill on sm_80 / 86 / 90, 8 spill on sm_100 (both
    # compiled by make gpu-report), so 8 warps except on sm_100
    big_d = _pow2_at_least(head_dim) > 128 and arch < 100
    wide = block_m * block_n >= 64 * 64 or big_d
    return {"num_warps": 8 if wide else 4, "num_stages": 3}


def paged_decode(batch: int, num_kv_heads: int, group: int, head_dim: int, target: Target) -> Plan:
    """Lab 01's paged decode (one CTA per (sequence, KV head), the group in the rows): 64-key
    tiles, 4 warps, 2 stages. No split: the lab teaches the gather; lab 04 splits."""
    block_n = 16 if target.interpreter else 64
    plan = Plan({"block_n": block_n}, 4, 1 if target.interpreter else 2,
                grid=(batch, num_kv_heads), why="one CTA per (sequence, KV head)")  # fmt: skip
    return fit_smem(plan, "decode", head_dim, target)


def _lens(batch: int, max_seq_len: int, kv_lens: Sequence[int] | None) -> list[int]:
    if kv_lens is None:
        return [int(max_seq_len)] * batch
    if len(kv_lens) != batch:
        raise ValueError(f"kv_lens has {len(kv_lens)} entries for a batch of {batch}")
    return [int(n) for n in kv_lens]


def split_kv_decode(
    batch: int, num_kv_heads: int, group: int, head_dim: int, max_seq_len: int, target: Target,
    *, kv_lens: Sequence[int] | None = None,
) -> Plan:
    """Lab 04's split-KV decode: ``splits`` chunks of ``partition_size`` keys per (sequence,
    KV head) from ``best_split`` (the cost model over the per-request lengths ``kv_lens``,
    or ``max_seq_len`` for every sequence; lab 04's chunks start at the sequence's start, so
    a short sequence's later splits are idle CTAs), partition kernel grid ``(B * splits,
    KVH)``, 16-key tiles (vLLM's decode tile), 4 warps, 3 stages. The interpreter keeps
    vLLM v2's 512-token partitions."""
    if target.interpreter:
        splits = max(1, math.ceil(max_seq_len / 512))
        return Plan({"block_n": 16, "block_p": 16, "partition_size": 512}, 4, 1, splits,
                    (batch * splits, num_kv_heads), why="interpreter: 512-token partitions")
    lens = _lens(batch, max_seq_len, kv_lens)
    work = _gqa_decode_work(group, head_dim, head_dim)
    fp = FOOTPRINTS["split_partition"]
    splits, chunk, model = best_split(lens, num_kv_heads, work, fp, target, layout="chunks",
                                      granule=16)  # fmt: skip
    slots = ctas_per_sm(fp, target) * target.sms
    return Plan({"block_n": 16, "block_p": 16, "partition_size": chunk}, 4, 3, splits,
                (batch * splits, num_kv_heads),
                why=f"{batch} x {num_kv_heads} work items, {slots} resident CTAs on "
                f"{target.sms} SMs: {splits} splits of {chunk} keys",
                notes={"flashinfer_chunk": flashinfer_chunk(lens, num_kv_heads, slots)},
                model=model)  # fmt: skip


def window_decode(
    batch: int, num_kv_heads: int, group: int, head_dim: int, max_seq_len: int,
    window: int | None, target: Target, *, kv_lens: Sequence[int] | None = None,
) -> Plan:
    """Lab 06's window/sink decode: lab 01's tiles, split over the visible keys
    (``min(context, window)``) by ``best_split`` (segments: each sequence's keys in
    ``splits`` equal parts of whole tiles, as the kernel cuts them); grid ``(B, KVH,
    splits)``, the partials merged by the lab's given merge kernel when ``splits > 1``."""
    base = paged_decode(batch, num_kv_heads, group, head_dim, target)
    if target.interpreter:
        return replace(base, grid=(*base.grid, 1), notes={"wanted_splits": 1})
    lens = [min(n, window) if window else n for n in _lens(batch, max_seq_len, kv_lens)]
    work = _gqa_decode_work(group, head_dim, head_dim, partial_elem=2)
    fp = FOOTPRINTS["decode_d64" if _pow2_at_least(head_dim) <= 64 else "decode_d128"]
    splits, _, model = best_split(lens, num_kv_heads, work, fp, target, layout="segments",
                                  granule=base.tiles["block_n"])  # fmt: skip
    keys = max(lens, default=0)
    return Plan(base.tiles, base.num_warps, base.num_stages, splits, (*base.grid, splits),
                why=f"{keys} visible keys, {splits} splits", notes={"wanted_splits": splits},
                model=model)  # fmt: skip


def mla_decode(batch: int, num_heads: int, kv_lora_rank: int, max_seq_len: int,
               target: Target, *, kv_lens: Sequence[int] | None = None,
               rope_dim: int = 64) -> Plan:  # fmt: skip
    """Lab 06's absorbed MLA decode: up to 64 query heads per tile (FlashMLA's tile: the
    latent cache is read once per 64 heads, and 64 rows make a wgmma; fewer heads, a
    ``dot_tile(H)``-row tile, what the launcher runs), 32 keys per tile, 8 warps, 2 stages;
    split over the keys by ``best_split`` (segments, as the kernel cuts them; the head
    tiles of a sequence run side by side, so the model counts the latent once per
    sequence: the second tile's read is an L2 hit); grid ``(B, ceil(H / block_h), splits)``."""
    block_h = min(64, _pow2_at_least(num_heads))
    if target.interpreter:
        return Plan({"block_h": 64, "block_n": 16}, 4, 1,
                    grid=(batch, math.ceil(num_heads / 64), 1), why="interpreter")  # fmt: skip
    plan = fit_smem(Plan({"block_h": block_h, "block_n": 32}, 8, 2), "mla", kv_lora_rank,
                    target)  # fmt: skip
    block_h = plan.tiles["block_h"]
    tiles_h = math.ceil(num_heads / block_h)
    row = (kv_lora_rank + rope_dim) * 2
    work = KeyWork(key_bytes=row / tiles_h, key_flops=2 * (2 * kv_lora_rank + rope_dim) * block_h,
                   cta_bytes=block_h * row, out_bytes=block_h * kv_lora_rank * 2,
                   partial_bytes=block_h * (kv_lora_rank * 2 + 4), merge_rows=block_h)
    fp = FOOTPRINTS["mla_h64" if block_h == 64 else "mla_h16"]
    lens = _lens(batch, max_seq_len, kv_lens)
    splits, _, model = best_split(lens, tiles_h, work, fp, target, layout="segments",
                                  granule=plan.tiles["block_n"])  # fmt: skip
    return replace(plan, splits=splits, grid=(batch, tiles_h, splits),
                   why=f"{block_h} heads per tile: the latent read once per tile; "
                   f"{splits} splits", notes={"wanted_splits": splits}, model=model)


def target_for(arch: int, sms: int | None = None) -> Target:
    """The target of a compute capability (x 10) and, if known, its real SM count: the
    table's numbers for its family (sm_8x: A100, sm_9x: H100, sm_10x+: B200), with the
    shared memory and resident warps of sm_86 / sm_89 (``common.gpus.LIMITS[86]``)."""
    if arch == 0:
        return INTERPRETER
    base = A100 if arch < 90 else H100 if arch < 100 else B200
    small = 86 if arch in (86, 89) else None  # sm_89 shares sm_86's shared memory and warps
    per_sm, per_block, warps = _limits(small) if small else (
        base.smem_per_sm_kb, base.smem_per_block_kb, base.max_warps_per_sm)
    same = sms in (None, base.sms) and arch == base.arch
    return Target(base.name if same else f"sm_{arch}, {sms or base.sms} SMs", arch,
                  sms or base.sms, base.hbm_tbps, base.tensor_tflops, base.hbm_latency_ns,
                  per_sm, per_block, warps)  # fmt: skip
