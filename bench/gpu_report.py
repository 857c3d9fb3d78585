"""``python -m bench.gpu_report`` (``make gpu-report``): GPU evidence without a GPU.

Compiles every kernel of ``bench/gpu_kernels.py`` at each config its launcher uses on a GPU,
for sm_80, sm_90 and sm_100, bf16 and fp16, head dims 64 and 128 (and each main kernel at
d = 256, bf16), plus sm_86 (99 KB of shared memory a block: the plan ``plan_target`` gives
such a GPU) in bf16 at the bench head dim, on this CPU (Triton ships
ptxas and cuobjdump), and reports per kernel x config x arch: registers per thread, spills,
shared memory, theoretical occupancy, the tensor-core instructions each ``tl.dot`` became
and how global memory is loaded; plus, per kernel, the H100 lower bound of its time at the
benchmark shapes. Nothing runs on a GPU: these are compiled facts, not timings.

    python -m bench.gpu_report                 # everything -> captured_outputs/gpu-report.*
    python -m bench.gpu_report --only 01 --arch 90   # a part -> build/gpu-report/partial.*
    python -m bench.gpu_report --impl starter --only 01   # your own kernel
    python -m bench.gpu_report --list          # the entries, nothing compiled

Checks (each config, every arch): no spills; static + dynamic shared memory within the
arch's per-block limit; a tensor-core MMA in the SASS of every kernel whose Triton IR has a
``tl.dot``. Then the launch plan is judged at each kernel's bench shape (``bench.gpu_plan``):
wgmma / tcgen05 where compute-bound, no sub-wave grid for a main launch, bytes in flight
against Little's law, and the expected speed as a model. ``--strict`` exits 1 when a check
fails; a compile error always exits 1.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from bench.gpu_compile import DEFAULT_CACHE, SCHEMA, Task, run_tasks
from bench.gpu_kernels import ARCHS, GPU_KERNELS, SMALL_ARCHS, GpuKernel
from bench.gpu_plan import MODEL_ASSUMPTIONS, plan_checks
from bench.gpu_render import write_report
from common.gpus import LIMIT_SOURCES, LIMITS, ArchLimits
from common.launch_plan import TARGET_SOURCES
from common.loader import default_impl

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAPTURED = ROOT / "captured_outputs"
NOT_RUN = "compiled, not run: no GPU was used"
GATE_ARCH = 90  # the arch the CPU suite checks (tests/test_gpu_report.py)


# ---- each arch's limits: common/gpus.py ------------------------------------------------


def smem_usage(result: dict, limits: ArchLimits) -> tuple[int, int]:
    """``(bytes the kernel uses, bytes a resident block takes)``: static + dynamic shared
    memory without / with the system's reserved 1 KB (which the cubin holds on sm_90+)."""
    in_cubin = limits.reserved_smem_per_block if limits.reserved_in_cubin else 0
    used = result["smem_static"] + result["smem_dynamic"] - min(in_cubin, result["smem_static"])
    return used, used + limits.reserved_smem_per_block


def occupancy(result: dict, limits: ArchLimits) -> dict[str, Any]:
    """Theoretical occupancy: resident blocks and warps per SM and what limits them.

    ``blocks = min(warps: max_warps // warps_per_block, regs: (regs_per_sm // regs_per_warp)
    // warps_per_block, smem: smem_per_sm // smem_per_block, tmem: tmem columns per SM //
    the kernel's (sm_100), max_blocks_per_sm)`` where a
    warp's registers are rounded up to ``reg_unit`` and a block's shared memory
    (``smem_usage``) to ``smem_unit``. 0 blocks: the kernel cannot launch.
    """
    warps = int(result["num_warps"])
    regs_per_warp = math.ceil(result["regs"] * 32 / limits.reg_unit) * limits.reg_unit
    smem, footprint = smem_usage(result, limits)
    smem_block = math.ceil(footprint / limits.smem_unit) * limits.smem_unit
    by = {
        "warps": limits.max_warps_per_sm // warps,
        "regs": (limits.regs_per_sm // regs_per_warp) // warps if regs_per_warp else 10**9,
        "smem": limits.smem_per_sm // smem_block if smem <= limits.smem_per_block else 0,
        "blocks": limits.max_blocks_per_sm,
    }
    if result.get("tmem"):
        by["tmem"] = limits.tmem_cols_per_sm // result["tmem"]
    blocks = min(by.values())
    limiter = ",".join(name for name, n in by.items() if n == blocks)
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "percent": round(100 * blocks * warps / limits.max_warps_per_sm, 1),
            "limited_by": limiter}  # fmt: skip


def load_style(loads: dict[str, int]) -> str:
    """How global memory is read: TMA (UTMALDG), cp.async (LDGSTS) or plain LDG."""
    kinds = [name for name, sass in (("TMA", "UTMALDG"), ("bulk copy", "UBLKCP"),
                                     ("cp.async", "LDGSTS"), ("LDG", "LDG")) if loads.get(sass)]
    return " + ".join(kinds) or "none"  # fmt: skip


def mma_kind(mma: dict[str, int]) -> str:
    """``HGMMA x24`` (the base opcodes and counts), or ``none``."""
    bases: dict[str, int] = {}
    for mnemonic, count in mma.items():
        base = mnemonic.split(".", 1)[0]
        bases[base] = bases.get(base, 0) + count
    return ", ".join(f"{b} x{n}" for b, n in sorted(bases.items())) or "none"


def check(result: dict, limits: ArchLimits) -> list[str]:
    """What is wrong with a compiled config (empty: nothing)."""
    problems = []
    spilled = result["spill_stores"] + result["spill_loads"]
    if spilled:
        problems.append(f"spills {result['spill_stores']} B stored / "
                        f"{result['spill_loads']} B loaded")  # fmt: skip
    smem, _ = smem_usage(result, limits)
    if smem > limits.smem_per_block:
        problems.append(f"shared memory {smem} B > {limits.smem_per_block} B per block")
    if result["dots"] and not result["mma"]:
        problems.append(f"{result['dots']} tl.dot but no tensor-core MMA in the SASS")
    return problems


# ---- the tasks and their results -------------------------------------------------------------


def select(only: str | None) -> list[int]:
    """Indices of ``GPU_KERNELS`` matching ``--only`` (lab numbers, kernel names, labs)."""
    if not only:
        return list(range(len(GPU_KERNELS)))
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    chosen = [i for i, e in enumerate(GPU_KERNELS)
              if wanted & {e.lab, e.lab.split("-")[1], e.kernel, e.bench}]  # fmt: skip
    if not chosen:
        raise ValueError(f"--only {only}: matches no entry (see --list)")
    return chosen


def make_tasks(args: argparse.Namespace) -> list[Task]:
    """Every (entry, dtype, head dim, arch) asked for, the big compiles first."""
    tasks = []
    for index in select(args.only):
        entry = GPU_KERNELS[index]
        for dtype in entry.dtypes:
            for d in entry.head_dims:
                for arch in args.arch:
                    small = arch in SMALL_ARCHS
                    if small and (dtype != entry.dtypes[0] or d != entry.summary_dims):
                        continue
                    if args.dtype and dtype not in args.dtype:
                        continue
                    if args.head_dim and d not in args.head_dim:
                        continue
                    tasks.append(Task(index, dtype, d, arch, args.impl, str(args.labs_root),
                                      None if args.no_cache else str(args.cache_dir),
                                      args.refresh))  # fmt: skip
    return sorted(tasks, key=lambda t: (-t.head_dim, t.entry, t.arch, t.dtype))


def row(task: Task, outcome: dict) -> dict[str, Any]:
    """One line of the report: the entry's names, the compiled numbers and the verdict."""
    entry = GPU_KERNELS[task.entry]
    base = {"lab": entry.lab, "kernel": entry.kernel, "config": entry.config,
            "bench": entry.bench, "bench_shape": entry.shape, "dtype": task.dtype,
            "head_dim": task.head_dim, "arch": f"sm_{task.arch}",
            "summary_head_dim": entry.summary_dims}  # fmt: skip
    if outcome["status"] != "ok":
        return {**base, "status": outcome["status"], "reason": outcome["reason"]}
    result, limits = outcome["result"], LIMITS[task.arch]
    problems = check(result, limits)
    used, _ = smem_usage(result, limits)
    fits = {f"sm_{task.arch}": [round(used / 1024, 1), limits.smem_per_block // 1024]}
    keep = ("num_warps", "num_stages", "regs", "spill_stores", "spill_loads", "local",
            "smem_static", "smem_dynamic", "tmem", "dots", "mma", "loads", "key")  # fmt: skip
    return {**base, "status": "ok", **{k: result[k] for k in keep},
            "mma_kind": mma_kind(result["mma"]), "load_style": load_style(result["loads"]),
            "occupancy": occupancy(result, limits), "smem_fits": fits,
            "problems": problems}  # fmt: skip


def sort_key(r: dict) -> tuple:
    return (r["lab"], r["kernel"], r["config"], r["dtype"], r["head_dim"], int(r["arch"][3:]))


# ---- the lower bounds at the benchmark shapes -------------------------------------------------


def lower_bounds(entries: list[GpuKernel]) -> list[dict[str, Any]]:
    """Per bench kernel of ``entries``, per GPU shape (bf16): bytes, FLOPs (the workload's
    ``count``: ``bench.counts``) and the H100 bound ``max(bytes / 3.35 TB/s, FLOPs / 989
    TFLOP/s)``."""
    from bench.counts import H100_TBPS, H100_TFLOPS, lower_bound_ms
    from bench.kernels import by_name

    out = []
    for name in sorted({e.bench for e in entries if e.bench}):
        spec = by_name(name)
        for shape in spec.gpu:
            work = spec.workload.count(shape, elem_bytes=2)
            ms, roof = lower_bound_ms(work)
            out.append({"bench": name, "function": f"{spec.lab.split('-')[1]} {spec.func}",
                        "shape": shape.name, "target": bool(shape.targets),
                        "bytes": work.bytes, "flops": work.flops, "bound_us": round(ms * 1e3, 2),
                        "roof": roof, "tbps": H100_TBPS, "tflops": H100_TFLOPS})  # fmt: skip
    return out


# ---- provenance ------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(command: str, rows: list[dict]) -> dict[str, Any]:
    """Deterministic: the commit is the last one that changed anything outside
    captured_outputs/ (so committing the report does not change it), the date is that
    commit's, and the tools' versions come from the results. ``+dirty`` when tracked files
    outside captured_outputs/ differ from HEAD."""
    outside = ["--", ".", ":(exclude)captured_outputs"]
    source = _git("log", "-1", "--format=%H %cI", *outside)
    commit, date = source.split() if source else ("unknown (not a git checkout)", "unknown")
    dirty = _git("status", "--porcelain", "--untracked-files=no", *outside)
    by_arch = {int(r["arch"][3:]): r["tools"]["ptxas"] for r in rows if "tools" in r}
    ptxas = [f"sm_{arch}: {by_arch[arch]}" for arch in sorted(by_arch)]
    tools = next((r["tools"] for r in rows if "tools" in r), {})
    return {
        "command": command,
        "commit": commit + ("+dirty" if dirty else ""),
        "date": date,
        "date_is": "the commit's date: the report is a function of the source at that commit",
        "triton": tools.get("triton", "unknown"),
        "ptxas": ptxas,
        "cuobjdump": tools.get("cuobjdump", "unknown"),
        "gpu": "none: compiled on a CPU-only machine, nothing ran",
        "driver": "none: no CUDA driver was used (Triton's bundled ptxas and cuobjdump)",
        "note": NOT_RUN,
    }


# ---- the command line ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--only", help="lab numbers, kernel names or bench names, comma-separated")
    p.add_argument("--arch", type=_ints, default=list(ARCHS), help="e.g. 90 or 80,90,100")
    p.add_argument("--dtype", type=lambda s: s.split(","), help="e.g. bf16 (default: each entry's)")
    p.add_argument("--head-dim", type=_ints, help="e.g. 128 (default: each entry's)")
    p.add_argument("--jobs", type=int, default=2, help="compile processes (default 2)")
    p.add_argument("--refresh", action="store_true", help="compile even what the cache has")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE, help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=("solution", "starter"), default=default_impl(),
                   help="which file of each lab to compile (default: solution if present)")
    p.add_argument("--out", type=pathlib.Path, help="write <out>.md and <out>.json (default: "
                   "captured_outputs/gpu-report for a full run, else build/gpu-report/partial)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a check fails")
    p.add_argument("--list", action="store_true", help="list the entries, compile nothing")
    p.add_argument("--labs-root", type=pathlib.Path, default=ROOT / "labs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [a for a in args.arch if a not in LIMITS]
    if unknown:
        p.error(f"--arch {unknown}: no limits for it (known: {sorted(LIMITS)})")
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _partial(args: argparse.Namespace) -> bool:
    return bool(args.only or args.dtype or args.head_dim or set(args.arch) != set(ARCHS)
                or args.impl != "solution" or args.labs_root != ROOT / "labs")  # fmt: skip


def _progress(done: list[int], total: int) -> Any:
    def show(task: Task, outcome: dict) -> None:
        done[0] += 1
        status = outcome["status"]
        how = ("cached" if outcome.get("cached") else f"{outcome['seconds']:.1f} s") \
            if status == "ok" else f"{status}: {outcome['reason'][:160]}"
        print(f"[{done[0]:3d}/{total}] {task.label}: {how}", file=sys.stderr, flush=True)

    return show


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for e in GPU_KERNELS:
            print(f"{e.name}: {', '.join(e.dtypes)} x d {', '.join(map(str, e.head_dims))}"
                  f" x sm_{', sm_'.join(map(str, args.arch))}  (bench: {e.bench or '-'})")
        return 0
    tasks = make_tasks(args)
    start = time.perf_counter()
    print(f">> compiling {len(tasks)} configs on {args.jobs} processes ({NOT_RUN})",
          file=sys.stderr)  # fmt: skip
    outcomes = run_tasks(tasks, args.jobs, _progress([0], len(tasks)))
    wall = time.perf_counter() - start
    command = " ".join(["python -m bench.gpu_report", *(sys.argv[1:] if argv is None else argv)])
    report = build_report(command, tasks, outcomes)
    out = args.out or (CAPTURED / "gpu-report" if not _partial(args)
                       else DEFAULT_CACHE / "partial")  # fmt: skip
    write_report(report, out)
    return summarize_run(report, tasks, outcomes, wall, out, args.strict)


def build_report(command: str, tasks: list[Task], outcomes: list[dict]) -> dict:
    """The whole report: sorted rows, errors, skips, limits, lower bounds, provenance."""
    rows = sorted((row(t, o) for t, o in zip(tasks, outcomes)), key=sort_key)
    tools_rows = [{"arch": f"sm_{t.arch}", "tools": o["result"]["tools"]}
                  for t, o in zip(tasks, outcomes) if o["status"] == "ok"]  # fmt: skip
    skipped = sorted({(r["lab"], r["kernel"], r["config"], r["reason"])
                      for r in rows if r["status"] == "skip"})  # fmt: skip
    entries = [GPU_KERNELS[i] for i in sorted({t.entry for t in tasks})]
    return {
        "schema": SCHEMA,
        "provenance": provenance(command, tools_rows),
        "limits": {f"sm_{a}": asdict(LIMITS[a]) for a in sorted({t.arch for t in tasks})},
        "limit_sources": list(LIMIT_SOURCES),
        "rows": [r for r in rows if r["status"] == "ok"],
        "errors": [r for r in rows if r["status"] == "error"],
        "skipped": [dict(zip(("lab", "kernel", "config", "reason"), s)) for s in skipped],
        "lower_bounds": lower_bounds(entries),
        "plan_checks": plan_checks([r for r in rows if r["status"] == "ok"]),
        "model_assumptions": list(MODEL_ASSUMPTIONS),
        "target_sources": list(TARGET_SOURCES),
    }


def summarize_run(report: dict, tasks: list[Task], outcomes: list[dict], wall: float,
                  out: pathlib.Path, strict: bool) -> int:  # fmt: skip
    compiled = [o for o in outcomes if o["status"] == "ok" and not o["cached"]]
    cpu = sum(o["seconds"] for o in compiled)
    print(f">> {len(tasks)} configs: {len(compiled)} compiled ({cpu:.0f} s of compile time), "
          f"{sum(1 for o in outcomes if o.get('cached'))} from the cache, "
          f"{len(report['skipped'])} entries skipped, {len(report['errors'])} errors; "
          f"{wall:.0f} s wall", file=sys.stderr)  # fmt: skip
    for s in report["skipped"]:
        print(f"   skipped {s['lab']} {s['kernel']} [{s['config']}]: {s['reason']}",
              file=sys.stderr)  # fmt: skip
    for e in report["errors"]:
        print(f"   ERROR {e['kernel']} [{e['config']}] {e['dtype']} d{e['head_dim']} "
              f"{e['arch']}: {e['reason'][:300]}", file=sys.stderr)  # fmt: skip
    failing = [r for r in report["rows"] if r["problems"]]
    for r in failing:
        print(f"   FAIL {r['kernel']} [{r['config']}] {r['dtype']} d{r['head_dim']} {r['arch']}: "
              f"{'; '.join(r['problems'])}", file=sys.stderr)  # fmt: skip
    plan_failing = [p for p in report.get("plan_checks", []) if p["problems"]]
    for p in plan_failing:
        print(f"   PLAN FAIL {p['kernel']} [{p['config']}] {p['arch']}: "
              f"{'; '.join(p['problems'])}", file=sys.stderr)  # fmt: skip
    print(f">> wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}", file=sys.stderr)
    return 1 if report["errors"] or (strict and (failing or plan_failing)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
