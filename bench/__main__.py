"""``python -m bench`` (``make bench``): time the labs' Triton kernels against the roofs and
against PyTorch SDPA and plain torch, in one run on one device.

    python -m bench                      # everything; tiny interpreter shapes without CUDA
    python -m bench --only decode,split  # some kernels (names or lab numbers: --only 01,04)
    python -m bench --quick              # GPU: the target shapes only (about 8)
    python -m bench --json captured_outputs/bench.json --plot captured_outputs/roofline.png
    python -m bench --list               # kernels and shapes, nothing run
    python -m bench --only engine        # lab-11's engine rows only (also: --no-engine)

Output: the table on stdout (progress on stderr), a JSON record (default
build/bench/bench.json) and a roofline PNG (default build/bench/roofline.png). After the
kernels, lab-11's serving engine beside transformers' generate() on one workload, on the
CPU (bench/engine.py: tokens/s, TTFT, TPOT, requests held at once paged vs contiguous,
prefix-cache hit rate).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

import bench
from bench import counts, provenance, report
from bench.kernels import KERNELS, KernelSpec, select

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "build" / "bench" / "bench.json"
DEFAULT_PLOT = ROOT / "build" / "bench" / "roofline.png"
CAPTURED = ROOT / "captured_outputs"
ENGINE_NAMES = ("engine", "11", "lab-11-serving-engine")  # --only: lab-11's engine rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--only", help="comma-separated kernel names or lab numbers (default: all)")
    p.add_argument("--quick", action="store_true", help="GPU: key shapes (* in --list)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes even on a GPU (smoke test)")
    p.add_argument("--json", type=pathlib.Path, default=DEFAULT_JSON, help="JSON record path")
    p.add_argument("--plot", type=pathlib.Path, default=DEFAULT_PLOT, help="roofline PNG path")
    p.add_argument("--no-files", action="store_true", help="write neither JSON nor PNG")
    p.add_argument(
        "--impl", choices=("solution", "starter"), default="solution",
        help="which file of each lab to benchmark (starter: your own kernel)",
    )  # fmt: skip
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="GPU dtype")
    p.add_argument("--no-baselines", action="store_true", help="skip SDPA and torch baselines")
    p.add_argument("--warmup-ms", type=int, default=25, help="do_bench warmup (ms)")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time (ms)")
    p.add_argument("--strict", action="store_true", help="exit 1 if a lab kernel fails or is wrong")
    p.add_argument("--list", action="store_true", help="list kernels and shapes, run nothing")
    p.add_argument("--no-engine", action="store_true", help="skip lab-11's engine rows")
    p.add_argument("--labs-root", type=pathlib.Path, default=ROOT / "labs", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _under(path: pathlib.Path, folder: pathlib.Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def list_kernels(kernels: list[KernelSpec]) -> str:
    lines = []
    for spec in kernels:
        lines.append(f"{spec.name:7s} {spec.label}: {spec.what}")
        for mode in ("gpu", "tiny"):
            for shape in spec.shapes(mode):
                star = "*" if shape.name in spec.quick else " "
                lines.append(f"   {mode:4s} {star} {shape.name}  {shape.note}".rstrip())
    lines.append("(* = in --quick)")
    return "\n".join(lines)


def main(argv: list[str] | None = None, kernels: tuple[KernelSpec, ...] = KERNELS) -> int:
    args = parse_args(argv)
    wanted = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    engine = [w for w in wanted if w in ENGINE_NAMES]  # not kernels: bench/engine.py's rows
    args.engine = not args.no_engine and (not wanted or bool(engine))
    try:
        chosen = select(",".join(w for w in wanted if w not in engine), kernels) if (
            not engine or len(engine) < len(wanted)) else []
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.list:
        print(list_kernels(chosen))
        return 0

    import torch

    from common.device import triton_device

    real = triton_device().startswith("cuda")
    if not real and not args.no_files:
        for path in (args.json, args.plot):
            if _under(path, CAPTURED):
                print(
                    f"refusing to write {path}: captured_outputs/ holds real GPU output only, "
                    "and this run has no CUDA device (interpreter: not timings)",
                    file=sys.stderr,
                )
                return 2
    command = " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])])
    threads = torch.get_num_threads()
    if not real:
        torch.set_num_threads(1)  # tiny CPU tensors: extra threads only add overhead
    try:
        return run(args, chosen, command)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace, chosen: list[KernelSpec], command: str) -> int:
    import torch

    from bench.roofs import measure
    from bench.runner import Runner
    from bench.timing import Timer
    from common.device import triton_device

    device = triton_device()
    real = device.startswith("cuda")
    shape_mode = "tiny" if (not real or args.tiny) else ("quick" if args.quick else "gpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype] if real else torch.float32
    dtype_name = str(dtype).removeprefix("torch.")
    info = provenance.collect(command)
    _print_header(info, shape_mode, dtype_name, args.impl, real)
    torch.manual_seed(0)
    timer = Timer(device, args.warmup_ms, args.rep_ms)
    print(f"timer: {timer.method}")
    t0 = time.perf_counter()
    _log(">> measuring the roofs (copy bandwidth, GEMM)")
    roofs = measure(device, timer, quick=args.quick or args.tiny)
    runner = Runner(
        device=device, dtype=dtype, timer=timer, roofs=roofs, impl=args.impl,
        labs_root=args.labs_root, baselines=not args.no_baselines, shape_mode=shape_mode, log=_log,
    )  # fmt: skip
    per_kernel = _run_kernels(runner, chosen)
    all_results = [res for _, results, _ in per_kernel for res in results]
    verdicts = [
        report.evaluate(t, res, all_results, roofs)
        for res in all_results
        for t in res.shape.targets
    ]
    _print_results(per_kernel, verdicts, roofs, dtype_name, real, runner.cuda_broken)
    engine = None
    if args.engine:
        from bench import engine as serving

        _log(">> lab-11's engine beside transformers' generate() (CPU, one thread)")
        print("\nServing engine (lab-11, CPU wall clock; only the ratios within this run mean "
              "anything):")
        engine = serving.section(args.impl, lab_dir=args.labs_root / serving.LAB.name)
    elapsed = time.perf_counter() - t0

    if not args.no_files:
        settings = {
            "impl": args.impl,
            "dtype": dtype_name,
            "shapes": shape_mode,
            "only": args.only,
            "baselines": not args.no_baselines,
            "timer": timer.method,
            "seconds": round(elapsed, 1),
        }
        report.write_json(args.json, {**record(info, settings, roofs, per_kernel, verdicts, real),
                                      "engine": engine})
        _plot(args.plot, per_kernel, roofs, info, dtype_name, real)
        print(f"\nwrote {_rel(args.json)} and {_rel(args.plot)}")
    if not real:
        print(report.BANNER)
    print(f"({elapsed:.1f} s)")
    return 1 if args.strict and _strict_failed(all_results) else 0


def _log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the report."""
    print(message, file=sys.stderr, flush=True)


def _print_header(
    info: dict[str, Any], shape_mode: str, dtype_name: str, impl: str, real: bool
) -> None:
    print(f"attention-labs bench · {info['date']} · commit {info['commit']}")
    print(
        f"device: {info['gpu']} · driver {info['driver']} · CUDA {info['cuda']} · "
        f"torch {info['torch']} · triton {info['triton']}"
    )
    print(f"shapes: {shape_mode} · dtype {dtype_name} · labs' {impl}.py")
    if not real:
        print(report.BANNER)


def _run_kernels(runner: Any, chosen: list[KernelSpec]) -> list[tuple[KernelSpec, list[Any], str]]:
    """Each chosen kernel's results and, if it was skipped, why."""
    per_kernel: list[tuple[KernelSpec, list[Any], str]] = []
    for spec in chosen:
        _log(f">> {spec.label}")
        results, why = runner.run(spec)
        if why:
            _log(f"   skipped: {why}")
        per_kernel.append((spec, results, why))
    return per_kernel


def _print_results(
    per_kernel: list[tuple[KernelSpec, list[Any], str]],
    verdicts: list[dict[str, Any]],
    roofs: Any,
    dtype_name: str,
    real: bool,
    cuda_broken: Any,
) -> None:
    print()
    print(report.format_table(per_kernel, verdicts, roofs, dtype_name))
    print("Targets (README.md, \"Benchmarks\"; evaluated on a GPU only):")
    print(report.headline_markdown(verdicts, real) if verdicts else "(no target shapes ran)")
    if cuda_broken:
        print(f"\nA CUDA error stopped the run early: {cuda_broken}")


def _plot(
    path: pathlib.Path,
    per_kernel: list[tuple[KernelSpec, list[Any], str]],
    roofs: Any,
    info: dict[str, Any],
    dtype_name: str,
    real: bool,
) -> None:
    title = f"{info['gpu']} · {dtype_name} · commit {str(info['commit'])[:12]}"
    if not real:
        title = "interpreter: not timings (CPU wall clock, tiny shapes) · " + title
    report.plot_roofline(path, per_kernel, roofs, title)


def _strict_failed(all_results: list[Any]) -> bool:
    """``--strict``: print the lab kernels that failed or were wrong; True if any."""
    bad = [
        f"{row.kernel} {row.shape}: {row.status} {row.reason}"
        for res in all_results
        for row in res.rows
        if row.kind == "kernel" and row.status in ("failed", "wrong")
    ]
    if bad:
        print("strict: lab kernels failed or wrong:\n  " + "\n  ".join(bad), file=sys.stderr)
    return bool(bad)


def record(
    info: dict[str, Any],
    settings: dict[str, Any],
    roofs: Any,
    per_kernel: list[tuple[KernelSpec, list[Any], str]],
    verdicts: list[dict[str, Any]],
    real: bool,
) -> dict[str, Any]:
    """The JSON record: provenance, method, roofs, every row, every target verdict."""
    return {
        "schema": bench.SCHEMA,
        "timings_are_real": real,
        "mode": "cuda" if real else "interpreter: not timings",
        "provenance": info,
        "settings": settings,
        "method": {
            "counts": counts.__doc__,
            "per_kernel": {spec.name: spec.workload.work_note for spec, _, _ in per_kernel},
            "roofs": "copy: dst.copy_(src), 2x bytes; GEMM: torch.matmul n^3, 2n^3 FLOPs",
        },
        "roofs": roofs.as_dict(),
        "kernels": [
            {
                "name": spec.name,
                "lab": spec.lab,
                "function": spec.func,
                "what": spec.what,
                "skipped": why or None,
                "shapes": [
                    {
                        "shape": res.shape.as_dict(),
                        "work": res.work.as_dict() if res.work else None,
                        "roof": res.roof,
                        "rows": [row.as_dict() for row in res.rows],
                    }
                    for res in results
                ],
            }
            for spec, results, why in per_kernel
        ],
        "targets": verdicts,
    }


def _rel(path: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    raise SystemExit(main())
