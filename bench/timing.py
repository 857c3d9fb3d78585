"""One way to time everything in a run, so kernel, baselines and roofs are comparable.

On CUDA: ``triton.testing.do_bench``. It calls the function once, estimates its time,
warms up for ``warmup_ms``, then times ``rep_ms`` worth of runs, each with its own pair of
CUDA events and with the L2 cache flushed (a 256 MB buffer is zeroed) before every run,
so decode numbers are cold-L2 numbers, as the targets require. We keep the median and the
20th/80th percentiles. Launch overhead (a few µs) is inside the timing: that is real for a
decode step without CUDA graphs, and it dominates the short-context shapes.

Without CUDA: the Triton kernels run through the interpreter, which is thousands of times
slower than a GPU and has nothing to do with one. The "time" is the CPU wall clock of a
single call, kept only so that the same code path (rates, roofs, table, JSON, plot) runs
in CI. The report says "interpreter: not timings" wherever such a number is shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    ms: float  # the median on CUDA; one wall-clock call on the CPU
    ms_p20: float
    ms_p80: float
    method: str


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class Timer:
    """``timer(fn) -> Timing``; ``timer.real`` says whether the numbers mean anything."""

    def __init__(self, device: str, warmup_ms: int = 25, rep_ms: int = 100) -> None:
        self.device = device
        self.real = device.startswith("cuda")
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms

    @property
    def method(self) -> str:
        if self.real:
            return (
                f"triton.testing.do_bench(warmup={self.warmup_ms} ms, rep={self.rep_ms} ms, "
                "quantiles=[0.5, 0.2, 0.8]): median of per-run CUDA-event times, L2 flushed "
                "before every run"
            )
        return "CPU wall clock of one call (Triton interpreter): NOT a timing"

    def __call__(self, fn: Callable[[], Any]) -> Timing:
        if self.real:
            from triton.testing import do_bench

            med, p20, p80 = do_bench(
                fn, warmup=self.warmup_ms, rep=self.rep_ms, quantiles=[0.5, 0.2, 0.8]
            )
            return Timing(float(med), float(p20), float(p80), "do_bench")
        ms = wall_ms(fn, self.device)
        return Timing(ms, ms, ms, "cpu-wall")


def wall_ms(fn: Callable[[], Any], device: str) -> float:
    """Wall-clock milliseconds of one call, synchronised on both sides."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3
