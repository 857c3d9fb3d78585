"""The GPU report as markdown and JSON (``bench.gpu_report`` builds it, this writes it).

Both files are functions of the report dict alone, which is sorted and carries no wall-clock
time, so regenerating them at the same commit gives the same bytes.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

SUMMARY_DTYPE, SUMMARY_HEAD_DIM, SUMMARY_ARCH = "bf16", 128, "sm_90"


def write_report(report: dict, out: pathlib.Path) -> None:
    """``<out>.md`` and ``<out>.json``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    ordered = {"provenance": report["provenance"], **report}  # the header first, like the .md
    out.with_suffix(".json").write_text(json.dumps(ordered, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}"


def _table(header: list[str], lines: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return out


def _occupancy(r: dict) -> str:
    occ = r["occupancy"]
    return f"{occ['warps_per_sm']} ({occ['percent']:g}%, {occ['limited_by']})"


def _spills(r: dict) -> str:
    return f"{r['spill_stores']}/{r['spill_loads']}"


def _smem(r: dict) -> str:
    tmem = f" (+ {r['tmem']} TMEM columns)" if r.get("tmem") else ""
    return f"{_kb(r['smem_static'])} + {_kb(r['smem_dynamic'])}{tmem}"


def _fits(r: dict) -> str:
    """``used / limit`` KB per arch the binary runs on; ``OVER`` where it does not fit."""
    fits = r.get("smem_fits") or {}
    return "; ".join(f"{a}: {u:g} / {lim}" + (" OVER" if u > lim else "")
                     for a, (u, lim) in fits.items()) or "-"  # fmt: skip


def _verdict(r: dict) -> str:
    return "ok" if not r["problems"] else "**FAIL**: " + "; ".join(r["problems"])


def _command(command: str) -> str:
    full = command == "python -m bench.gpu_report"
    return f"`make gpu-report` (`{command}`)" if full else f"`{command}`"


def header(report: dict) -> list[str]:
    p = report["provenance"]
    archs = ", ".join(report["limits"])
    lines = [
        f"# GPU report: the course's Triton kernels compiled for {archs}",
        "",
        f"**{p['note'][0].upper() + p['note'][1:]}.** Every number below comes from "
        "compiling the labs' kernels on a CPU-only machine (Triton's bundled ptxas and "
        "cuobjdump): registers, spills, shared memory and instructions are facts about the "
        "binary a GPU would run; occupancy is computed from them and the arch's limits. No "
        "time here was measured: the H100 column is the analytic lower bound a kernel would "
        "have to reach.",
        "",
    ]
    lines += _table(["provenance", ""], [
        ["command", _command(p["command"])],
        ["commit", f"`{p['commit']}`"],
        ["date", f"{p['date']} ({p['date_is']})"],
        ["triton", p["triton"]],
        ["ptxas", "; ".join(p["ptxas"])],
        ["cuobjdump", p["cuobjdump"]],
    ])  # fmt: skip
    return lines + [""]


def verdict(report: dict) -> list[str]:
    rows = report["rows"]
    failing = [r for r in rows if r["problems"]]
    gate = [r for r in rows if r["arch"] == SUMMARY_ARCH]
    lines = [
        "## Verdict",
        "",
        f"{len(rows)} configs compiled, {len(rows) - len(failing)} pass every check (no "
        "spills; static + dynamic shared memory within the arch's per-block limit; a "
        "tensor-core MMA for every kernel whose Triton IR has a `tl.dot`). On sm_90, the "
        f"arch the CPU suite checks: {len(gate) - sum(1 for r in gate if r['problems'])} of "
        f"{len(gate)} pass.",
        "",
    ]
    checks = report.get("plan_checks") or []
    if checks:
        bad = [c for c in checks if c["problems"]]
        flagged = [c for c in checks if c["flags"] and not c["problems"]]
        lines += [
            f"Launch plans judged at the bench shapes (below): {len(checks)} kernel x arch, "
            f"{len(checks) - len(bad)} pass (wgmma / tcgen05 where compute-bound, no sub-wave "
            f"grid for a main launch, no spills), {len(flagged)} flagged: "
            + ("; ".join(sorted({f"{c['kernel']} [{c['config']}]: {c['flags'][0]}"
                                 for c in flagged if c["arch"] == SUMMARY_ARCH})) or "none")
            + ".",
            "",
        ]  # fmt: skip
    if failing:
        lines += ["Failing configs (a launcher should not use them on that arch):", ""]
        lines += _table(
            ["kernel [config]", "dtype", "d", "arch", "warps/stages", "regs", "problem"],
            [[f"{r['kernel']} [{r['config']}]", r["dtype"], r["head_dim"], r["arch"],
              f"{r['num_warps']}/{r['num_stages']}", r["regs"], "; ".join(r["problems"])]
             for r in failing],
        )  # fmt: skip
        lines.append("")
    for title, items in (("Errors (did not compile)", report["errors"]),
                         ("Skipped entries", report["skipped"])):  # fmt: skip
        if items:
            lines += [f"{title}:", ""]
            lines += [f"- {i['lab']} `{i['kernel']}` [{i['config']}]"
                      + (f" {i['dtype']} d{i['head_dim']} {i['arch']}" if "arch" in i else "")
                      + f": {i['reason'][:400]}" for i in items]  # fmt: skip
            lines.append("")
    return lines


def _bound(report: dict, r: dict) -> str:
    """The H100 bound of the row's call at its bench shape (default: the first target)."""
    for b in report["lower_bounds"]:
        wanted = b["shape"] == r["bench_shape"] if r["bench_shape"] else b["target"]
        if b["bench"] == r["bench"] and wanted:
            return f"{b['bound_us']:g} µs ({b['roof']}) at {b['shape']}"
    return "-"


def summary(report: dict) -> list[str]:
    picked = [r for r in report["rows"] if r["arch"] == SUMMARY_ARCH
              and r["dtype"] == SUMMARY_DTYPE
              and r["head_dim"] == r.get("summary_head_dim", SUMMARY_HEAD_DIM)]  # fmt: skip
    if not picked:
        return []
    lines = [
        f"## Per kernel on {SUMMARY_ARCH} ({SUMMARY_DTYPE} and the head dim of the bench "
        f"shape: d={SUMMARY_HEAD_DIM}, except gpt-oss's d=64 for the window kernel and the "
        "512-wide latent (+ 64 rotary dims) for MLA)",
        "",
    ]
    lines += _table(
        ["lab", "kernel [config]", "d", "warps/stages", "regs/thread", "spills st/ld (B)",
         "smem static + dynamic (KB)", "smem used / limit per arch (KB)",
         "occupancy: warps/SM", "MMA (SASS)", "global loads",
         "H100 lower bound of the call", "check"],
        [[r["lab"].split("-")[1], f"`{r['kernel']}` [{r['config']}]", r["head_dim"],
          f"{r['num_warps']}/{r['num_stages']}", r["regs"], _spills(r), _smem(r), _fits(r),
          _occupancy(r), r["mma_kind"], r["load_style"],
          _bound(report, r), _verdict(r)] for r in picked],
    )  # fmt: skip
    return lines + [""]


def bounds(report: dict) -> list[str]:
    if not report["lower_bounds"]:
        return []
    b0 = report["lower_bounds"][0]
    lines = [
        "## Lower bounds on an H100 at the benchmark shapes",
        "",
        f"`max(bytes / {b0['tbps']} TB/s, FLOPs / {b0['tflops']:g} TFLOP/s)` per call, bf16, "
        "with the minimum work of the answer (`bench/counts.py`: each K/V byte once per KV "
        "head, causal pairs only; the backward: 5 matmuls per pair, 2.5x the forward's FLOPs; "
        "a window: only its keys; MLA: one latent row per token for all heads) at the shapes "
        "of `bench/kernels.py`. A kernel reaches "
        "this only at 100% of the datasheet roof: the course's decode targets (2.4-2.5 TB/s "
        "of K/V bytes, README) are 72-75% of it. * = a shape with a target.",
        "",
    ]
    lines += _table(
        ["call", "shape", "MB moved", "GFLOP", "lower bound (µs)", "bound by"],
        [[b["function"], b["shape"] + (" *" if b["target"] else ""), f"{b['bytes'] / 1e6:.1f}",
          f"{b['flops'] / 1e9:.1f}", f"{b['bound_us']:g}", b["roof"]]
         for b in report["lower_bounds"]],
    )  # fmt: skip
    return lines + [""]


def plans(report: dict) -> list[str]:
    """The launch plans judged at the bench shapes (``bench.gpu_plan``), and the model."""
    checks = report.get("plan_checks") or []
    if not checks:
        return []
    lines = [
        "## The launch plans at the bench shapes (bf16; a MODEL of the speed, not a measurement)",
        "",
        "Per kernel and target: the plan of `common/launch_plan.py` (tiles, warps/stages, KV "
        "splits, grid), CTAs per SM from the compiled occupancy, waves = CTAs / (SMs x CTAs "
        "per SM), compute- or memory-bound at the bench shape (FLOP/byte against the "
        "target's ridge), whether the SASS has the arch's wide MMA (wgmma = HGMMA on sm_90, "
        "tcgen05 = UTC*MMA on sm_100), bytes in flight per SM against Little's law, the "
        "roofline bound, the bound over the SMs the grid can occupy, and the modelled "
        "fraction of the roof (assumptions below). FAIL = a problem; flag = shown, not "
        "failed (helpers, comparison configs, and a split the kernel does not implement).",
        "",
    ]
    lines += _table(
        ["kernel [config]", "arch", "tiles", "w/s", "splits", "grid (CTAs)", "CTAs/SM",
         "waves", "bound (FLOP/B vs ridge)", "wide MMA", "in flight / needed per SM (KB)",
         "roof (µs): the kernel's own work", "partials' share of bytes", "plan bound (µs)",
         "model: fraction of roof (µs)", "verdict"],
        [[f"{c['lab'].split('-')[1]} `{c['kernel']}` [{c['config']}]", c["arch"],
          " ".join(f"{k.replace('block_', '')}={v}" for k, v in c["tiles"].items()),
          f"{c['num_warps']}/{c['num_stages']}", c["splits"],
          f"{'x'.join(map(str, c['grid']))} ({c['ctas']})", c["ctas_per_sm"], c["waves"],
          f"{c['bound']} ({c['intensity']:g} vs {c['ridge']:g})",
          "yes" if c["wide_mma"] else "no", f"{c['in_flight_kb']:g} / {c['needed_kb']:g}",
          f"{c['roof_us']:g}" + ("" if c.get("work_is", "")[:10] == "the kernel" else " (call)"),
          f"{100 * c.get('partials_share', 0):.1f} %", f"{c['plan_bound_us']:g}",
          f"{c['model_fraction']:.2f} ({c['model_us']:g})",
          "; ".join(["FAIL: " + p for p in c["problems"]] + ["flag: " + f for f in c["flags"]])
          or "ok"] for c in checks],
    )  # fmt: skip
    lines += ["", "Model assumptions (the fraction is a model, not a measurement):", ""]
    lines += [f"- {a}" for a in report.get("model_assumptions", [])]
    lines += ["", "Target figures:", ""] + [f"- {a}" for a in report.get("target_sources", [])]
    return lines + [""]


def all_rows(report: dict) -> list[str]:
    lines = ["## Every config", ""]
    lines += _table(
        ["kernel [config]", "dtype", "d", "arch", "warps/stages", "regs", "spills st/ld (B)",
         "smem (KB)", "smem used / limit (KB)", "occupancy: warps/SM", "tl.dot", "MMA (SASS)",
         "global loads", "check"],
        [[f"{r['lab'].split('-')[1]} `{r['kernel']}` [{r['config']}]", r["dtype"],
          r["head_dim"], r["arch"], f"{r['num_warps']}/{r['num_stages']}", r["regs"],
          _spills(r), _smem(r), _fits(r), _occupancy(r), r["dots"],
          ", ".join(f"{k} x{v}" for k, v in r["mma"].items()) or "none",
          ", ".join(f"{k} x{v}" for k, v in r["loads"].items()) or "none", _verdict(r)]
         for r in report["rows"]],
    )  # fmt: skip
    return lines + [""]


def how_to_read(report: dict) -> list[str]:
    lines = [
        "## How to read this",
        "",
        "- **regs**: registers per thread (`cuobjdump --dump-resource-usage`, REG); 255 is "
        "the ceiling, past it ptxas spills. **spills**: bytes stored to / loaded from local "
        "memory by ptxas (`ptxas -v`), which live in DRAM behind L1: 0 is the goal.",
        "- **smem**: static (in the cubin; on sm_90 and sm_100 that is the 1 KB the system "
        "reserves per block) + dynamic (Triton's pipeline buffers, requested at launch), in "
        "KB. What the kernel uses must fit the arch's per-block limit.",
        "- **occupancy**: resident warps per SM and what limits them (`warps`, `regs`, "
        "`smem`, `tmem` on sm_100, or `blocks`: the cap on resident blocks); theoretical, from "
        "the limits below. "
        "Attention kernels often run well at low occupancy when each warp keeps many loads in "
        "flight; it is a reason to look, not a verdict.",
        "- **MMA**: the tensor-core instructions in the SASS: `HMMA` (mma.sync, sm_80+), "
        "`HGMMA` (warpgroup wgmma, sm_90a; needs a 64-row tile per warpgroup), `UTC*MMA` "
        "(tcgen05, sm_100a). **tl.dot**: `tt.dot` ops in the Triton IR; a kernel with dots "
        "and no MMA would run its matmuls on the CUDA cores.",
        "- **global loads**: `LDG` (plain loads into registers), `LDGSTS` (cp.async: global "
        "to shared without registers, what Triton's software pipeline uses), `UTMALDG` (TMA, "
        "Hopper's tensor-memory accelerator). Counts are static instructions, not executions.",
        "- The SASS of each config is in `build/gpu-report/<key>.sass` after a run (`key` in "
        "the JSON).",
        "",
        "What still needs a GPU: every time, bandwidth and TFLOP/s (`make bench` on a GPU, "
        "`captured_outputs/README.md`), achieved occupancy, and whether the chosen tiles are "
        "the fastest.",
        "",
        "### Arch limits used",
        "",
    ]
    limits = report["limits"]
    lines += _table(
        ["arch", "part", "regs/SM", "regs/thread", "warps/SM", "blocks/SM", "smem/SM (KB)",
         "smem/block (KB)", "reserved/block (B)"],
        [[a, v["part"], v["regs_per_sm"], v["max_regs_per_thread"], v["max_warps_per_sm"],
          v["max_blocks_per_sm"], v["smem_per_sm"] // 1024, v["smem_per_block"] // 1024,
          v["reserved_smem_per_block"]] for a, v in limits.items()],
    )  # fmt: skip
    lines += ["", "Sources:", ""] + [f"- {s}" for s in report["limit_sources"]]
    return lines + [""]


def markdown(report: dict) -> str:
    parts = header(report) + verdict(report) + summary(report) + bounds(report) + plans(report)
    parts += all_rows(report) + how_to_read(report)
    return "\n".join(parts).rstrip() + "\n"
