"""Run one KernelSpec over its shapes: the lab kernel, its comparisons, its baselines.

Each measurement calls the function once (on a GPU this compiles and autotunes), checks
the output against a float32 reference, then times it (bench.timing). Anything that cannot
run (a lab not written yet, an SDPA backend that refuses the inputs, a baseline that would
not fit in memory) becomes a row with a reason instead of an exception.
"""

from __future__ import annotations

import gc
import pathlib
import re
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from bench.counts import Work, rate
from bench.kernels import KernelSpec, by_name
from bench.roofs import Roofs
from bench.shapes import Shape
from bench.timing import Timer, Timing, synchronize, wall_ms
from bench.workloads import Baseline, Workload

# torch.OutOfMemoryError is torch >= 2.5; older CUDA builds only have the cuda one.
OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
CUDA_FATAL = ("CUDA error", "illegal memory access", "device-side assert")
MERGE_NAMES = re.compile(r"merge|reduce|combine", re.IGNORECASE)


@dataclass
class Row:
    kernel: str  # KernelSpec.name
    shape: str
    impl: str  # what was run ("triton lab-01 paged_decode_triton", "sdpa[flash] ...")
    kind: str  # "kernel" | "compare" | "part" | "sdpa" | "torch"
    status: str  # "ok" | "wrong" | "failed" | "n/a"
    ms: float | None = None
    ms_p20: float | None = None
    ms_p80: float | None = None
    GBps: float | None = None
    kv_GBps: float | None = None
    TFLOPs: float | None = None
    pct_meas: float | None = None  # of the measured roof that bounds this workload
    pct_nom: float | None = None  # of the datasheet roof, where the GPU is known
    speedup: float | None = None  # this row's time / the lab kernel's time
    max_err: float | None = None
    share: float | None = None  # "part" rows: share of the call's kernel time (%)
    note: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ShapeResult:
    spec: KernelSpec
    shape: Shape
    work: Work | None
    roof: str  # "bandwidth" or "compute"
    rows: list[Row] = field(default_factory=list)

    def kernel_row(self) -> Row | None:
        return next((r for r in self.rows if r.kind == "kernel"), None)


def tolerance(dtype: torch.dtype) -> float:
    """Max abs error accepted against the float32 reference (outputs are O(1))."""
    return 1e-3 if dtype == torch.float32 else 3e-2


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _sdpa_reason(exc: BaseException, caught: list[warnings.WarningMessage]) -> str:
    """torch explains a refused SDPA backend in UserWarnings; keep the informative ones."""
    reasons = []
    for w in caught:
        msg = str(w.message).strip()
        if not msg or "not used because" in msg or msg in reasons:
            continue
        reasons.append(msg.splitlines()[0][:160])
    return "does not run: " + ("; ".join(reasons[:3]) if reasons else _first_line(exc))


def kernel_breakdown(fn: Callable[[], Any], iters: int = 20) -> list[tuple[str, float]]:
    """Per-kernel device time (ms per call) of ``fn`` from torch.profiler (CUDA only).

    This needs no cooperation from the lab: a partition kernel and a merge kernel show up
    under their own names. No L2 flush between iterations here (unlike do_bench).
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    parts = []
    for evt in prof.key_averages():
        if getattr(evt, "device_type", None) != DeviceType.CUDA:
            continue
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0.0)
        if us > 0:
            parts.append((evt.key, us / iters / 1e3))
    return sorted(parts, key=lambda p: -p[1])


class Runner:
    def __init__(
        self,
        *,
        device: str,
        dtype: torch.dtype,
        timer: Timer,
        roofs: Roofs,
        impl: str,
        labs_root: pathlib.Path,
        baselines: bool = True,
        shape_mode: str = "gpu",
        log: Callable[[str], None] = print,
    ) -> None:
        self.device = device
        self.dtype = dtype
        self.timer = timer
        self.roofs = roofs
        self.impl = impl
        self.labs_root = labs_root
        self.with_baselines = baselines
        self.shape_mode = shape_mode
        self.log = log
        self.cuda_broken: str | None = None
        self._loaded: dict[str, tuple[Callable[..., Any] | None, str]] = {}

    # -- loading -----------------------------------------------------------------------
    def load(self, spec: KernelSpec) -> tuple[Callable[..., Any] | None, str]:
        """The lab's function, or (None, why not). Never raises."""
        if spec.name in self._loaded:
            return self._loaded[spec.name]
        from common.loader import load_impl

        lab_dir = self.labs_root / spec.lab
        try:
            module = load_impl(lab_dir, self.impl)
            fn = getattr(module, spec.func, None)
            result = (
                (fn, "")
                if callable(fn)
                else (None, f"{spec.lab}/{self.impl}.py has no {spec.func}")
            )
        except FileNotFoundError:
            result = (None, f"{spec.lab}/{self.impl}.py does not exist yet")
        except Exception as exc:  # a broken lab must not stop the other labs' benchmarks
            result = (None, f"{spec.lab}/{self.impl}.py failed to import: {_first_line(exc)}")
        self._loaded[spec.name] = result
        return result

    # -- one measurement ---------------------------------------------------------------
    def measure(
        self,
        res: ShapeResult,
        wl: Workload,
        impl: str,
        kind: str,
        fn: Callable[[], Any],
        canon: Callable[[Any], torch.Tensor],
        context: Callable[[], Any] | None = None,
        note: str = "",
    ) -> Row:
        row = Row(res.spec.name, res.shape.name, impl, kind, "ok", note=note)
        if self.cuda_broken:
            row.status, row.reason = "n/a", f"skipped after a CUDA error: {self.cuda_broken}"
            return row
        ctx = context or (lambda: _Null())
        holder: list[Any] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ctx():
                    first_ms = wall_ms(lambda: holder.append(fn()), self.device)
                    row.max_err = wl.check(canon(holder[0]))
                    holder.clear()
                    if self.timer.real:
                        timing = self.timer(fn)
                    else:
                        timing = Timing(first_ms, first_ms, first_ms, "cpu-wall")
        except OUT_OF_MEMORY as exc:
            holder.clear()
            _free(self.device)
            row.status, row.reason = (
                ("n/a" if kind in ("sdpa", "torch") else "failed"),
                ("out of memory: " + _first_line(exc)[:120]),
            )
            return row
        except Exception as exc:
            holder.clear()
            if any(s in str(exc) for s in CUDA_FATAL):
                self.cuda_broken = f"{impl} on {res.shape.name}: {_first_line(exc)}"
            if kind == "sdpa":
                row.status, row.reason = "n/a", _sdpa_reason(exc, caught)
            else:
                row.status = "n/a" if kind == "torch" else "failed"
                row.reason = _first_line(exc)
                if kind == "kernel" and not isinstance(exc, (NotImplementedError, ValueError)):
                    self.log(traceback.format_exc(limit=3))
            return row
        row.ms, row.ms_p20, row.ms_p80 = timing.ms, timing.ms_p20, timing.ms_p80
        if res.work is not None:
            self._rates(row, res)
        if row.max_err is None or not row.max_err <= tolerance(self.dtype):
            row.status = "wrong"
            row.reason = f"max abs error {row.max_err:.3g} > {tolerance(self.dtype):g}"
        return row

    def _rates(self, row: Row, res: ShapeResult) -> None:
        assert row.ms is not None and res.work is not None
        r = rate(res.work, row.ms)
        row.GBps, row.kv_GBps, row.TFLOPs = r["GBps"], r["kv_GBps"], r["TFLOPs"]
        if res.roof == "bandwidth":
            row.pct_meas = 100 * r["GBps"] / self.roofs.copy_GBps
            if self.roofs.nominal_GBps:
                row.pct_nom = 100 * r["GBps"] / self.roofs.nominal_GBps
        else:
            row.pct_meas = 100 * r["TFLOPs"] / self.roofs.gemm_TFLOPs
            if self.roofs.nominal_TFLOPs:
                row.pct_nom = 100 * r["TFLOPs"] / self.roofs.nominal_TFLOPs

    # -- one kernel over its shapes ------------------------------------------------------
    def run(self, spec: KernelSpec) -> tuple[list[ShapeResult], str]:
        """Results per shape, and a reason when the kernel could not be loaded at all."""
        fn, why = self.load(spec)
        if fn is None:
            return [], why
        kwargs = spec.tiny_kwargs if self.shape_mode == "tiny" else spec.kwargs
        results = []
        for shape in spec.shapes(self.shape_mode):
            self.log(f"   {spec.name}: {shape.name}")
            results.append(self.run_shape(spec, fn, shape, kwargs))
            _free(self.device)
        return results, ""

    def run_shape(
        self, spec: KernelSpec, fn: Callable[..., Any], shape: Shape, kwargs: dict[str, Any]
    ) -> ShapeResult:
        res = ShapeResult(spec, shape, None, spec.workload.roof)
        try:
            wl = spec.workload(shape, self.dtype, self.device)
        except Exception as exc:
            res.rows.append(
                Row(spec.name, shape.name, "inputs", "kernel", "failed", reason=_first_line(exc))
            )
            return res
        res.work = wl.work
        call = lambda: wl.call(fn, **kwargs)
        label = f"triton {spec.label}" + ("" if self.impl == "solution" else f" ({self.impl})")
        kernel = self.measure(res, wl, label, "kernel", call, wl.output)
        res.rows.append(kernel)

        for other_name in spec.compare:
            other = by_name(other_name)
            other_fn, why = self.load(other)
            impl = f"{other.label} (no split)"
            if other_fn is None:
                res.rows.append(Row(spec.name, shape.name, impl, "compare", "n/a", reason=why))
                continue
            run_other = lambda f=other_fn: wl.call(f)
            res.rows.append(self.measure(res, wl, impl, "compare", run_other, wl.output))

        if spec.breakdown and kernel.status in ("ok", "wrong"):
            res.rows.extend(self.breakdown(res, call, kernel))

        if self.with_baselines:
            res.rows.extend(self.run_baselines(res, wl))

        if kernel.ms:
            for row in res.rows:
                if row.ms and row.kind in ("compare", "sdpa", "torch"):
                    row.speedup = row.ms / kernel.ms
        return res

    def run_baselines(self, res: ShapeResult, wl: Workload) -> list[Row]:
        """SDPA (each backend) and torch on the kernel's inputs, then the follow-ups that
        depend on which SDPA backend was fastest (decode: the same with the gather timed)."""
        rows: list[Row] = []
        try:
            rows += [self.run_baseline(res, wl, b) for b in wl.baselines()]
            fastest = min(
                (r for r in rows if r.kind == "sdpa" and r.status == "ok" and r.ms),
                key=lambda r: r.ms or 0.0,
                default=None,
            )
            backend = None if fastest is None else fastest.impl.split("]")[0].removeprefix("sdpa[")
            rows += [self.run_baseline(res, wl, b) for b in wl.followups(backend)]
        except Exception as exc:  # a harness bug must not hide the kernel's numbers
            self.log(traceback.format_exc(limit=4))
            reason = f"could not build the baselines: {_first_line(exc)}"
            rows.append(Row(res.spec.name, res.shape.name, "baselines", "torch", "failed",
                            reason=reason))  # fmt: skip
        return rows

    def run_baseline(self, res: ShapeResult, wl: Workload, b: Baseline) -> Row:
        if b.skip:
            return Row(res.spec.name, res.shape.name, b.name, b.kind, "n/a", note=b.note,
                       reason=b.skip)  # fmt: skip
        return self.measure(res, wl, b.name, b.kind, b.fn, b.canon, b.context, b.note)

    def breakdown(self, res: ShapeResult, call: Callable[[], Any], kernel: Row) -> list[Row]:
        """Per-kernel device time of the whole call (partition vs merge), GPU only."""
        spec, shape = res.spec, res.shape
        if not self.timer.real:
            return [
                Row(spec.name, shape.name, "per-kernel breakdown", "part", "n/a",
                    reason="needs CUDA (torch.profiler device times); the whole call is timed")
            ]  # fmt: skip
        if self.cuda_broken:
            return []
        try:
            parts = kernel_breakdown(call)
        except Exception as exc:
            return [
                Row(spec.name, shape.name, "per-kernel breakdown", "part", "n/a",
                    reason=f"torch.profiler failed ({_first_line(exc)}); only the total is timed")
            ]  # fmt: skip
        if not parts:
            return [
                Row(spec.name, shape.name, "per-kernel breakdown", "part", "n/a",
                    reason="torch.profiler recorded no CUDA kernels; only the total is timed")
            ]  # fmt: skip
        total = sum(ms for _, ms in parts)
        rows = []
        for name, ms in parts:
            kind = "merge" if MERGE_NAMES.search(name) else "other"
            rows.append(
                Row(spec.name, shape.name, f"  part: {name[:60]}", "part", "ok", ms=ms,
                    share=100 * ms / total,
                    note=f"{kind}; device time per call from torch.profiler (no L2 flush)")
            )  # fmt: skip
        return rows


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _free(device: str) -> None:
    """Give the previous shape's tensors back before the next shape allocates (GPU only)."""
    if device.startswith("cuda"):
        gc.collect()
        torch.cuda.empty_cache()
        synchronize(device)
