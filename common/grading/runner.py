"""Run one lab's tests in a pytest process of its own, under time and size limits.

The process writes its events (``common.grading.pytest_points``) to a file line by line, its
output goes to a file (megabytes of prints cannot block it), it runs in its own process
group (a kill reaches its children) with no core files and a cap on the size of any file
it writes, and it is killed when it outlives its limit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.grading.discovery import PROJECT_ROOT, graded_files

try:
    import resource
except ImportError:  # not on Windows: no file-size cap there
    resource = None  # type: ignore[assignment]

DEFAULT_LAB_TIMEOUT = 60.0
DEFAULT_TEST_TIMEOUT = 15.0
DEFAULT_MAX_RESTARTS = 5
FILE_SIZE_LIMIT = 256 * 2**20
OUTPUT_TAIL_BYTES = 20_000

SIGNAL_HINTS = {
    "SIGSEGV": "segmentation fault: the code touched memory it does not own",
    "SIGBUS": "bus error: the code touched memory it does not own",
    "SIGABRT": "aborted",
    "SIGFPE": "arithmetic fault",
    "SIGILL": "illegal instruction",
    "SIGKILL": "killed, perhaps for using too much memory",
    "SIGXFSZ": f"wrote more than {FILE_SIZE_LIMIT >> 20} MB of output: printing in a loop?",
}


@dataclass
class Options:
    root: Path = PROJECT_ROOT
    impl: str = "starter"
    lab_timeout: float = DEFAULT_LAB_TIMEOUT
    test_timeout: float = DEFAULT_TEST_TIMEOUT
    max_restarts: int = DEFAULT_MAX_RESTARTS
    python: str = sys.executable


@dataclass
class Run:
    events: list[dict]
    returncode: int | None
    timed_out: bool
    limit: float
    output_tail: str
    elapsed: float

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    @property
    def finished(self) -> bool:
        return bool(self.of("finish"))

    @property
    def collected(self) -> list[dict] | None:
        found = self.of("collected")
        return found[0]["tests"] if found else None

    @property
    def results(self) -> dict[str, dict]:
        return {e["nodeid"]: e for e in self.of("result")}

    @property
    def unfinished(self) -> str | None:
        """The test that was running when the process stopped, if any."""
        done = self.results
        running = [e["nodeid"] for e in self.of("start") if e["nodeid"] not in done]
        return running[-1] if running else None

    def exit_reason(self) -> str:
        """Why the process stopped before the end, in words."""
        if self.timed_out:
            return f"timed out after {self.limit:g} s (the lab's time limit)"
        rc = self.returncode if self.returncode is not None else -1
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            hint = SIGNAL_HINTS.get(name)
            return f"crashed with signal {name}" + (f" ({hint})" if hint else "")
        if "+ Timeout +" in self.output_tail:  # pytest-timeout's thread method ends it like this
            m = re.search(r"Timeout \(?>?([\d.]+)s", self.output_tail)
            limit = f" after {float(m.group(1)):g} s" if m else ""
            return f"timed out{limit} (the per-test limit)"
        if self.finished:
            status = self.of("finish")[0]["exitstatus"]
            if "KeyboardInterrupt" in self.output_tail:
                return "the test session was interrupted (KeyboardInterrupt raised by the code)"
            return f"the test session stopped early (pytest exit status {status})"
        return f"the interpreter exited with code {rc}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _read_events(path: Path) -> list[dict]:
    events = []
    if path.exists():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a half-written last line of a killed process
    return events


def _tail(path: Path, size: int = OUTPUT_TAIL_BYTES) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        return f.read().decode("utf-8", errors="replace")


def run_pytest(
    lab: Path, opts: Options, limit: float, extra: list[str], deselect: set[str] | None = None
) -> Run:
    """Run pytest on one lab in its own process group, output to a file, under ``limit`` s."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        log, out = Path(tmp) / "events.jsonl", Path(tmp) / "output.txt"
        args = [
            opts.python,
            "-m",
            "pytest",
            *(str(f.relative_to(opts.root)) for f in graded_files(lab)),
            "-p",
            "common.grading.pytest_points",
            "--points-log",
            str(log),
            "-p",
            "no:cacheprovider",
            "-q",
            "--tb=short",
            "--show-capture=no",
            f"--timeout={opts.test_timeout:g}",
            f"--points-collect-timeout={opts.test_timeout:g}",
            *extra,
        ]
        if deselect:
            (Path(tmp) / "deselect.txt").write_text("\n".join(sorted(deselect)), encoding="utf-8")
            args += ["--points-deselect", str(Path(tmp) / "deselect.txt")]
        env = dict(os.environ, LAB_IMPL=opts.impl)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(opts.root), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        start = time.monotonic()
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                args,
                cwd=opts.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a kill reaches its children
            )
            _limit_resources(proc.pid)
            timed_out = False
            try:
                returncode: int | None = proc.wait(timeout=max(limit, 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                returncode = proc.wait()
            _kill_group(proc)  # anything it left running
        return Run(
            events=_read_events(log),
            returncode=returncode,
            timed_out=timed_out,
            limit=limit,
            output_tail=_tail(out),
            elapsed=time.monotonic() - start,
        )


def _limit_resources(pid: int) -> None:
    """No core files, and no file (captured prints included) larger than FILE_SIZE_LIMIT."""
    prlimit = getattr(resource, "prlimit", None) if resource is not None else None
    if prlimit is None:
        return
    for which, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)):
        try:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            prlimit(pid, which, (value, hard))
        except (OSError, ValueError):
            pass
