"""The printed table, the target verdicts, the JSON record and the roofline plot."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

from bench.roofs import Roofs
from bench.runner import MERGE_NAMES, Row, ShapeResult
from bench.shapes import Target

BANNER = (
    "#" * 100 + "\n"
    "##  interpreter: not timings.  No CUDA device: the Triton kernels ran through the CPU\n"
    "##  interpreter (TRITON_INTERPRET=1) on tiny float32 shapes. Every ms, GB/s, TFLOP/s and %\n"
    "##  below is CPU wall-clock time of the interpreter or of CPU torch, printed only to\n"
    "##  exercise the harness. The correctness column (max err) is real. Use a GPU for timings.\n"
    + "#"
    * 100
)
SPEEDUP_NOTE = "speedup = this row's time / the lab kernel's time (> 1: the lab kernel is faster)"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    if abs(x) >= 10**digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _size(n: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}"


# ---- targets ---------------------------------------------------------------------------
def evaluate(
    target: Target, res: ShapeResult, all_results: list[ShapeResult], roofs: Roofs
) -> dict[str, Any]:
    """PASS / MISS / n/a for one target, with the measured and required values."""
    verdict: dict[str, Any] = {
        "kernel": res.spec.name,
        "shape": res.shape.name,
        "target": target.text,
        "kind": target.kind,
        "required": None,
        "measured": None,
        "status": "n/a",
    }
    if not roofs.real:
        verdict["status"] = "n/a (interpreter: not timings)"
        return verdict
    kernel = res.kernel_row()
    if kernel is None or kernel.status != "ok" or not kernel.ms:
        verdict["status"] = f"n/a (kernel {kernel.status if kernel else 'missing'})"
        return verdict
    required, measured = _measure(target, res, all_results, roofs, kernel, verdict)
    verdict["required"], verdict["measured"] = required, measured
    if measured is None:
        verdict["status"] = f"n/a (no {target.ref or 'breakdown'} row in this run)"
    elif target.kind == "merge_share":
        verdict["status"] = "PASS" if measured <= target.value else "MISS"
    else:
        verdict["status"] = "PASS" if measured >= (required or 0.0) else "MISS"
    return verdict


def _measure(
    target: Target, res: ShapeResult, all_results: list[ShapeResult], roofs: Roofs,
    kernel: Any, verdict: dict[str, Any],
) -> tuple[float | None, float | None]:
    """``(required, measured)`` for one target on a kernel row that ran."""
    required: float | None = target.value
    measured: float | None = None
    if target.kind == "kv_GBps":
        measured = kernel.kv_GBps
        if roofs.nominal_label != "H100 SXM5":  # same fraction of the measured copy roof
            required = target.value / 3000.0 * roofs.copy_GBps
            verdict["note"] = (
                f"not an H100 SXM: {target.value:g} GB/s scaled to {target.value / 30:.1f}% of "
                "this GPU's measured copy bandwidth"
            )
    elif target.kind in ("pct_of", "speedup_over"):
        ref = next(
            (r for r in res.rows if r.impl.startswith(target.ref) and r.status == "ok" and r.ms),
            None,
        )
        if ref is not None and ref.ms:
            measured = ref.ms / kernel.ms * (100 if target.kind == "pct_of" else 1)
    elif target.kind == "merge_share":
        parts = [r for r in res.rows if r.kind == "part" and r.share is not None]
        if parts:
            measured = sum(r.share or 0.0 for r in parts if MERGE_NAMES.search(r.impl))
    elif target.kind == "pct_of_shape":
        other = next(
            (x for x in all_results if x.spec is res.spec and x.shape.name == target.ref), None
        )
        other_kernel = other.kernel_row() if other else None
        if other_kernel and other_kernel.status == "ok" and other_kernel.TFLOPs:
            measured = 100 * (kernel.TFLOPs or 0.0) / other_kernel.TFLOPs
    else:
        raise ValueError(f"unknown target kind {target.kind!r}")
    return required, measured


def _unit(kind: str) -> str:
    return {"kv_GBps": " GB/s", "pct_of": "%", "speedup_over": "x", "merge_share": "%",
            "pct_of_shape": "%"}[kind]  # fmt: skip


def verdict_line(v: dict[str, Any]) -> str:
    if v["measured"] is None:
        return f"   target: {v['target']} -> {v['status']}"
    op = "<=" if v["kind"] == "merge_share" else ">="
    unit = _unit(v["kind"])
    return (
        f"   target: {v['target']} -> {v['status']} "
        f"({_num(v['measured'])}{unit}, need {op} {_num(v['required'])}{unit})"
    )


# ---- the table ---------------------------------------------------------------------------
COLS = (
    ("impl", 52), ("ms", 9), ("GB/s", 8), ("TFLOP/s", 8), ("%meas", 6), ("%nom", 6),
    ("speedup", 8), ("max err", 8),
)  # fmt: skip


def _cells(row: Row) -> list[str]:
    if row.kind == "part" and row.status == "ok":
        return [
            row.impl,
            _num(row.ms),
            "",
            "",
            "",
            "",
            "",
            "",
            f"{_num(row.share)}% of kernel time",
        ]
    base = [row.impl]
    if row.status in ("failed", "n/a"):
        reason = row.reason if len(row.reason) <= 120 else row.reason[:117] + "..."
        return base + [row.status.upper() + ": " + reason]
    speed = "" if row.speedup is None else f"{row.speedup:.2f}x"
    cells = [
        _num(row.ms), _num(row.GBps), _num(row.TFLOPs), _num(row.pct_meas), _num(row.pct_nom),
        speed, _num(row.max_err, 2),
    ]  # fmt: skip
    tail = "WRONG: " + row.reason if row.status == "wrong" else row.note
    return base + cells + ([tail] if tail else [])


def _line(cells: list[str]) -> str:
    out = []
    for i, cell in enumerate(cells):
        if i < len(COLS):
            width = COLS[i][1]
            out.append(cell.ljust(width) if i == 0 else cell.rjust(width))
        else:
            out.append("  " + cell)
    return " ".join(out).rstrip()


def format_table(
    per_kernel: list[tuple[Any, list[ShapeResult], str]],
    verdicts: list[dict[str, Any]],
    roofs: Roofs,
    dtype_name: str,
) -> str:
    lines = []
    roof_text = (
        f"measured roofs: copy {_num(roofs.copy_GBps)} GB/s (2x {_size(roofs.copy_bytes / 2, 'B')}"
        f" copied), GEMM {_num(roofs.gemm_TFLOPs)} TFLOP/s ({roofs.gemm_dtype} {roofs.gemm_n}^3)"
    )
    if roofs.nominal_label:
        roof_text += (
            f"; datasheet {roofs.nominal_label}: {_num(roofs.nominal_GBps)} GB/s, "
            f"{_num(roofs.nominal_TFLOPs)} TFLOP/s dense bf16"
        )
    lines += [roof_text, SPEEDUP_NOTE, ""]
    for spec, results, why in per_kernel:
        lines.append(f"== {spec.label}: {spec.what}")
        if why:
            lines += [f"   SKIPPED: {why}", ""]
            continue
        wl = spec.workload
        roof = "copy bandwidth" if wl.roof == "bandwidth" else "GEMM"
        lines.append(f"   counted: {wl.work_note}; %meas/%nom are of the {roof} roof")
        for res in results:
            page = f"page {res.shape.block_size}, " if wl.paged else ""
            head = f"-- {res.shape.name} ({page}{dtype_name})"
            if res.work is not None:
                w = res.work
                head += (
                    f": {_size(w.bytes, 'B')}, {_size(w.flops, 'FLOP')}, {w.intensity:.3g} FLOP/B"
                )
            if res.shape.note:
                head += f"  [{res.shape.note}]"
            lines.append(head)
            lines.append("   " + _line([name for name, _ in COLS]))
            for row in res.rows:
                lines.append("   " + _line(_cells(row)))
            for v in verdicts:
                if v["kernel"] == spec.name and v["shape"] == res.shape.name:
                    lines.append(verdict_line(v))
        lines.append("")
    return "\n".join(lines)


def headline_markdown(verdicts: list[dict[str, Any]], real: bool) -> str:
    """The README's headline table: one line per target."""
    lines = [
        "| kernel | shape | target | measured | status |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        measured = "-" if v["measured"] is None else f"{_num(v['measured'])}{_unit(v['kind'])}"
        if not real:
            measured = "pending GPU run"
        lines.append(
            f"| {v['kernel']} | {v['shape']} | {v['target']} | {measured} | {v['status']} |"
        )
    return "\n".join(lines)


# ---- JSON and plot -------------------------------------------------------------------------
def _clean(x: Any) -> Any:
    """JSON has no inf/NaN: write them as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(path: pathlib.Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(record), indent=1, allow_nan=False) + "\n")


MARKERS = {"kernel": "o", "compare": "s", "sdpa": "^", "torch": "x"}


def plot_roofline(
    path: pathlib.Path, per_kernel: list[tuple[Any, list[ShapeResult], str]], roofs: Roofs,
    title: str,
) -> None:  # fmt: skip
    """Log-log roofline: achieved TFLOP/s against FLOP/byte, under the measured roofs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    points = [
        (res, row)
        for _, results, _ in per_kernel
        for res in results
        for row in res.rows
        if row.kind in MARKERS and row.TFLOPs and row.status in ("ok", "wrong")
    ]
    xs = [res.work.intensity for res, _ in points if res.work] or [1.0]
    lo, hi = min(xs + [0.5]) / 2, max(xs + [2000.0]) * 2
    ridge = roofs.gemm_TFLOPs * 1e3 / roofs.copy_GBps  # FLOP/B where the roofs meet
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    measured = f"measured roof: {_num(roofs.copy_GBps)} GB/s, {_num(roofs.gemm_TFLOPs)} TFLOP/s"
    roof_line = [min(roofs.gemm_TFLOPs, x * roofs.copy_GBps / 1e3) for x in grid]
    ax.plot(grid, roof_line, "k-", label=measured)
    if roofs.nominal_GBps and roofs.nominal_TFLOPs:
        nom_bw, nom_fl = roofs.nominal_GBps, roofs.nominal_TFLOPs
        ax.plot(grid, [min(nom_fl, x * nom_bw / 1e3) for x in grid], "k:",
                label=f"datasheet {roofs.nominal_label}")  # fmt: skip
    ax.axvline(ridge, color="0.8", lw=0.8)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    spec_color = {spec.name: colors[i % len(colors)] for i, (spec, _, _) in enumerate(per_kernel)}
    seen = set()
    for res, row in points:
        assert res.work is not None
        key = (res.spec.name, row.kind)
        label = f"{res.spec.name}: {row.kind}" if key not in seen else None
        seen.add(key)
        ax.scatter(res.work.intensity, row.TFLOPs, marker=MARKERS[row.kind], s=40,
                   color=spec_color[res.spec.name], label=label,
                   alpha=0.3 if row.status == "wrong" else 1.0)  # fmt: skip
        if row.kind == "kernel":
            ax.annotate(res.shape.name.split(" d")[0], (res.work.intensity, row.TFLOPs),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of minimum traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", lw=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.09, top=0.94)
    fig.savefig(path, dpi=120)
    plt.close(fig)
