"""The report's judgement of the launch plans: per kernel and target, at its bench shape.

For each ``GPU_KERNELS`` entry with a plan and each compiled arch, from the compiled row
(bf16, the bench head dim) and the plan's grid (``common.launch_plan``):

* **Tensor cores.** Compute-bound at the bench shape (FLOPs / bytes above the target's
  ridge, tensor TFLOP/s / HBM TB/s): the SASS must hold the arch's wide MMA, ``HGMMA``
  (wgmma) on sm_90 or ``UTC*MMA`` (tcgen05) on sm_100; ``HMMA`` (mma.sync) alone fails.
* **Waves.** CTAs per SM (the compiled occupancy) and waves = CTAs / (SMs x CTAs per SM).
  A grid with fewer CTAs than SMs leaves SMs idle: it fails for a plan's main launch
  (``role="main"``), and is flagged for helpers and comparison configs.
* **Bytes in flight (Little's law).** A memory-bound kernel keeps ``resident CTAs x
  max(1, stages - 1) x bytes per stage`` in flight per SM; the memory system needs
  ``bandwidth x latency / SMs`` (``launch_plan.TARGET_SOURCES``). Below that: flagged.
* **Spills** zero (the row's own check).
* **The lower bound from the plan**: ``max(bytes / BW, FLOPs / peak)`` over the SMs the grid
  can occupy (``x SMs / CTAs`` when the grid is sub-wave).
* **Expected speed: a MODEL, not a measurement.** ``fraction = BASE x grid x (MMA or
  latency factor)``: ``BASE`` the practical ceiling (``MODEL_ASSUMPTIONS``), ``grid`` =
  ``min(1, CTAs / SMs)`` and the tail of the last wave, the MMA factor for compute-bound
  kernels, the latency factor ``min(1, in flight / needed)`` for memory-bound ones.
"""

from __future__ import annotations

import math
from typing import Any

from bench.gpu_kernels import GPU_KERNELS, GpuKernel
from common.launch_plan import MIN_GAIN, TARGETS, Plan, Target

MODEL_ASSUMPTIONS = (
    "BASE: memory-bound kernels reach at most 0.88 of HBM bandwidth (FlashInfer's long-context "
    "decode reaches about 88-89 % of nominal on an H100, its blog's 'cold' benchmark); "
    "compute-bound ones at most 0.75 of the dense tensor peak (FlashAttention-3, "
    "arXiv:2407.08608, reports up to about 75 % of H100 peak in FP16/BF16).",
    "MMA factor: 1.0 with the arch's wide MMA (wgmma on sm_90, tcgen05 on sm_100, mma.sync "
    "on sm_80 where it is the widest); 0.5 with mma.sync on sm_90/sm_100 (an assumption: "
    "FlashAttention-2 on an H100 reaches about 35 % of peak against FlashAttention-3's 75 %, "
    "arXiv:2407.08608).",
    "Latency factor: min(1, bytes in flight per SM / (bandwidth x latency / SMs)): Little's "
    "law, with the latency of launch_plan.TARGET_SOURCES (an assumption, not measured).",
    "Grid factor: CTAs / (SMs x ceil(CTAs / SMs)): the idle SMs of a partial last wave.",
)
BASE = {"memory": 0.88, "compute": 0.75}


def wide_mma(arch: int, mma_kind: str) -> bool:
    """The arch's widest tensor-core MMA is in the SASS: HGMMA (sm_90), UTC*MMA (sm_100),
    HMMA (sm_80)."""
    if arch >= 100:
        return "UTC" in mma_kind
    if arch >= 90:
        return "HGMMA" in mma_kind
    return "HMMA" in mma_kind


def bench_work(entry: GpuKernel) -> tuple[int, int]:
    """``(FLOPs, bytes)`` of the entry's bench shape (bf16): ``bench.counts``."""
    from bench.kernels import by_name

    spec = by_name(entry.bench)
    shape = next((s for s in spec.gpu if s.name == entry.shape), None) or next(
        (s for s in spec.gpu if s.targets), spec.gpu[0])
    work = spec.workload.count(shape, elem_bytes=2)
    return work.flops, work.bytes


def judge(entry: GpuKernel, plan: Plan, target: Target, row: dict[str, Any],
          work: tuple[int, int], partial_share: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """One (kernel, target) verdict: the numbers, ``problems`` (fail) and ``flags`` (shown).
    ``work``: the kernel's own ``(FLOPs, bytes)`` (``entry.work``) or the call's; with the
    plan's cost model (``plan.model``, ``common.launch_plan.split_cost``) the plan bound is
    the modelled kernel time (waves, idle CTAs, partials), else the roof over the SMs the
    grid occupies."""
    flops, nbytes = work
    ridge = target.tensor_tflops / target.hbm_tbps  # FLOP per byte
    bound = "compute" if flops / nbytes > ridge else "memory"
    per_sm = max(1, row["occupancy"]["blocks_per_sm"])
    ctas = plan.ctas
    waves = ctas / (target.sms * per_sm)
    stage = plan.notes.get("stage_bytes", 0)
    in_flight = per_sm * max(1, row["num_stages"] - 1) * stage
    needed = target.hbm_tbps * 1e12 * target.hbm_latency_ns * 1e-9 / target.sms
    problems, flags = [], []
    mma_ok = wide_mma(target.arch, row["mma_kind"])
    rows_per_tile = plan.tiles.get("block_m", 0)
    if bound == "compute" and 0 < rows_per_tile < 64 and target.arch >= 90:
        problems.append(f"{rows_per_tile}-row query tiles: a wgmma / tcgen05 MMA needs 64 "
                        f"rows, and K/V is re-read every {rows_per_tile} rows")  # fmt: skip
    if bound == "compute" and row["dots"] and not mma_ok:
        problems.append(f"compute-bound at its bench shape but {row['mma_kind']}: needs "
                        f"{'wgmma (HGMMA)' if target.arch < 100 else 'tcgen05 (UTC*MMA)'}")
    if ctas < target.sms:
        text = f"sub-wave grid: {ctas} CTAs on {target.sms} SMs"
        wanted = plan.notes.get("wanted_splits", 1)
        if wanted > 1 and plan.splits == 1:
            text += f" (the plan wants {wanted} KV splits; this kernel does not split)"
        model = plan.model
        priced = bool(model.get("roof_us")) and model.get("ctas") == ctas
        if priced:  # the cost model priced this grid, idle SMs included: no split gains
            text += (f" (modelled {model['plan_us']:g} µs against a {model['roof_us']:g} µs "
                     f"roof; no split gains {100 * MIN_GAIN:g} %)")
        (problems if entry.role == "main" and wanted == 1 and not priced else flags).append(text)
    if bound == "memory" and in_flight < needed:
        flags.append(f"{in_flight // 1024} KB in flight per SM < {needed / 1024:.1f} KB "
                     "(Little's law)")  # fmt: skip
    spilled = row["spill_stores"] + row["spill_loads"]
    if spilled:
        problems.append(f"spills {spilled} B")
    grid_factor = min(1.0, ctas / (target.sms * math.ceil(ctas / target.sms)))
    busy = min(1.0, ctas / target.sms)
    if bound == "compute":
        factor = 1.0 if mma_ok or target.arch < 90 or not row["dots"] else 0.5
    else:
        factor = min(1.0, in_flight / needed) if needed else 1.0
    roof_us = max(nbytes / (target.hbm_tbps * 1e6), flops / (target.tensor_tflops * 1e6))
    model = plan.model
    if model.get("kernel_us"):  # the plan's cost model: waves, idle CTAs, partials inside
        plan_us = max(roof_us, model["kernel_us"])
        fraction = BASE[bound] * (1.0 if bound == "memory" else factor) * roof_us / plan_us
    else:
        plan_us = roof_us / busy
        fraction = BASE[bound] * grid_factor * factor
    partials = model.get("partial_bytes", 0) / model["bytes"] if model.get("bytes") else (
        partial_share)
    return {
        "lab": entry.lab, "kernel": entry.kernel, "config": entry.config,
        "arch": f"sm_{target.arch}", "target": target.name, "role": entry.role,
        "shape": entry.shape or "(the bench's first target shape)",
        "tiles": plan.tiles, "num_warps": row["num_warps"], "num_stages": row["num_stages"],
        "splits": plan.splits, "grid": list(plan.grid), "ctas": ctas, "ctas_per_sm": per_sm,
        "waves": round(waves, 2), "bound": bound, "intensity": round(flops / nbytes, 1),
        "ridge": round(ridge, 1), "mma_kind": row["mma_kind"], "wide_mma": mma_ok,
        "in_flight_kb": round(in_flight / 1024, 1), "needed_kb": round(needed / 1024, 1),
        "roof_us": round(roof_us, 2), "plan_bound_us": round(plan_us, 2),
        "model_fraction": round(fraction, 2),
        "model_us": round(roof_us / fraction, 2), "partials_share": round(partials, 3),
        "work_is": "the kernel's own" if entry.work else "the whole call's",
        "problems": problems, "flags": flags,
    }  # fmt: skip


def plan_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every judged (entry, arch) with a compiled bf16 row at the entry's summary head dim."""
    out = []
    for entry in GPU_KERNELS:
        if entry.plan is None or not entry.bench:
            continue
        dtype = "bf16" if "bf16" in entry.dtypes else entry.dtypes[0]
        mine = {r["arch"]: r for r in rows if (r["lab"], r["kernel"], r["config"], r["dtype"],
                r["head_dim"]) == (entry.lab, entry.kernel, entry.config, dtype,
                                   entry.summary_dims)}  # fmt: skip
        if not mine:
            continue
        call = bench_work(entry)
        for arch_name in sorted(mine, key=lambda a: int(a[3:])):
            if int(arch_name[3:]) not in TARGETS:  # sm_86: compiled for its shared memory only
                continue
            target = TARGETS[int(arch_name[3:])]
            work = entry.work(target) if entry.work else call
            extra = 2 * max(0, work[1] - call[1]) if entry.role != "helper" else 0
            share = extra / (call[1] + extra) if extra else 0.0
            out.append(judge(entry, entry.plan(target), target, mine[arch_name], work, share))
    return out
