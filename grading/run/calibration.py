"""How loaded the machine is: the factor the grader's default time limits are multiplied by.

The per-test and per-lab limits (:mod:`grading.run.runner`) hold for this machine kept busy;
on a busier or slower one they are scaled by a calibration run before grading
(:func:`load_factor`), so that correct code never races them: a fixed piece of Python and
numpy work, its wall time against the CPU time it got (contention), and that CPU time
against this machine's (a slower machine).

The calibration takes about a quarter of a second of one core, and more when the machine is busy,
so ``python -m grading`` starts it first, in a forked child (:func:`start`), while the
grader imports itself and sets the grading session up on the other core; the factor is
read (:meth:`Pending.result`) just before the limits are needed.
"""

from __future__ import annotations

import os
import time

CALIBRATION_CPU_SECONDS = 0.055  # the work below on this 2-core machine (CPU time)
MAX_LOAD_FACTOR = 6.0


def calibration_work() -> None:
    """A fixed amount of interpreter and numpy work (what a test spends its time on)."""
    import numpy as np

    total = 0
    for i in range(500_000):
        total += i % 7
    a = np.arange(200_000, dtype=np.float64)
    for _ in range(100):
        a = np.sqrt(a * a + 1.0)


def load_factor(runs: int = 3) -> float:
    """How much slower than this machine idle a test runs now: the median over ``runs`` of
    wall time / CPU time of :func:`calibration_work` (after a warm-up), or its CPU time
    against :data:`CALIBRATION_CPU_SECONDS`, whichever is larger, between 1 and
    :data:`MAX_LOAD_FACTOR`: what the default limits are multiplied by."""
    calibration_work()
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        calibration_work()
        walls.append(time.perf_counter() - wall)
        cpus.append(max(time.process_time() - cpu, 1e-3))
    ratio = sorted(w / c for w, c in zip(walls, cpus))[runs // 2]
    slower = sorted(cpus)[runs // 2] / CALIBRATION_CPU_SECONDS
    return round(min(max(ratio, slower, 1.0), MAX_LOAD_FACTOR), 2)


class Pending:
    """A :func:`load_factor` running in a forked child; :meth:`result` waits for it."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd, self._value = pid, fd, None

    def result(self) -> float:
        """The child's factor (computed here instead if the child gave none)."""
        if self._value is None:
            data = b""
            try:
                while chunk := os.read(self.fd, 64):
                    data += chunk
            finally:
                os.close(self.fd)
                try:
                    os.waitpid(self.pid, 0)
                except ChildProcessError:
                    pass
            try:
                value = float(data.decode())
            except ValueError:
                value = load_factor()
            self._value = min(max(value, 1.0), MAX_LOAD_FACTOR)
        return self._value

    def cancel(self) -> None:
        """The factor is not needed (the limits were given): end the child."""
        if self._value is None:
            try:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(self.fd)
            self._value = 1.0


def start() -> Pending | None:
    """:func:`load_factor` started in a forked child (None where there is no ``fork``).
    Call it before any thread starts."""
    if not hasattr(os, "fork"):
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: calibrate, answer, and leave without running any cleanup
        code = 1
        try:
            os.close(read)
            os.write(write, repr(load_factor()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return Pending(pid, read)
