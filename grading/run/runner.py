"""One lab's tests in a pytest process of their own, under time and size limits, and what that
process did.

The process writes its events (:mod:`grading.plugin.points`) to a file line by line, its
output goes to a file (megabytes of prints cannot block it), it runs in its own process
group (a kill reaches its children) with no core files and a cap on the size of any file
it writes, and it is killed when it outlives its limit (:func:`run_pytest`, its
:class:`Options`).

What it did is a :class:`Run`: the events the points plugin wrote (``collected``,
``start``, ``result``, ``timeout``, ``finish``), the process's exit status and the tail of
its output; :meth:`Run.exit_reason` says why it stopped: the lab's time limit, a test's
hard stop, a signal (with a hint), an interrupted session, or an exit code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading.plugin.compile_check import COMPILE_LIMIT
from grading.plugin.time_limits import hard_stop_grace
from grading.run.discovery import GRADED_PATTERNS, PROJECT_ROOT
from grading.sandbox.host import (
    ENV_UIDS,
    FILE_SIZE_LIMIT,
    Mode,
    SandboxError,
    kill_block,
    remove_files_of,
    signal_text,
)
from grading.sandbox.lab_sandbox import ENV_ENABLE, ENV_ZYGOTE, LabSandbox
from grading.sandbox.zygote_client import ENV_DIR, ForkedChild, exit_child, preloaded

# ---- lab run -----------------------------------------------------------------------------


@dataclass
class Run:
    events: list[dict]
    returncode: int | None
    timed_out: bool
    limit: float  # the lab's time limit, as the report states it
    output_tail: str
    elapsed: float
    allowance: float = 0.0  # seconds added to the limit for tests stopped at the per-test limit

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
        hard_stops = self.of("timeout")
        if hard_stops:
            return f"timed out after {hard_stops[-1]['seconds']:g} s (the per-test limit)"
        rc = self.returncode if self.returncode is not None else -1
        if rc < 0:
            return f"crashed with signal {signal_text(-rc)}"
        if self.finished:
            status = self.of("finish")[0]["exitstatus"]
            if "KeyboardInterrupt" in self.output_tail:
                return "the test session was interrupted (KeyboardInterrupt raised by the code)"
            return f"the test session stopped early (pytest exit status {status})"
        return f"the interpreter exited with code {rc}"


# ---- runner ------------------------------------------------------------------------------


try:
    import resource
except ImportError:  # not on Windows: no file-size cap there
    resource = None  # type: ignore[assignment]

# Calibrated on a 2-core machine kept busy (load average 15-20): the slowest test of a lab took
# 8 s (idle: under 1 s) and the slowest lab 57 s (idle: about 12 s). A wrong answer fails
# well within these; they only stop code that never ends.
DEFAULT_LAB_TIMEOUT = 180.0
DEFAULT_TEST_TIMEOUT = 30.0
DEFAULT_MAX_RESTARTS = 5
OUTPUT_TAIL_BYTES = 20_000
POLL_SECONDS = 0.5
RESTART_ALLOWANCE = 15.0  # seconds: starting pytest again (torch, triton) on a busy machine
# At most this many timed-out tests extend a lab's limit; a lab takes at most
# lab_timeout + MAX_EXTENDING_TIMEOUTS * (test_timeout + grace + RESTART_ALLOWANCE) seconds
# (430 s at the defaults), and the whole run at most run_timeout.
MAX_EXTENDING_TIMEOUTS = 5
DEFAULT_RUN_TIMEOUT = 3600.0

# The limits above are scaled by grading.run.calibration.load_factor (a calibration of the
# machine's load, run before grading).


@dataclass
class Options:
    root: Path = PROJECT_ROOT
    impl: str = "starter"
    lab_timeout: float = DEFAULT_LAB_TIMEOUT
    test_timeout: float = DEFAULT_TEST_TIMEOUT
    max_restarts: int = DEFAULT_MAX_RESTARTS
    python: str = sys.executable
    sandbox: bool = True  # the graded code runs in a sandboxed worker (grading.plugin.proxy)
    uid_blocks: dict[str, tuple[int, int]] = field(default_factory=dict)  # lab -> its uids
    mother: Any = None  # the run's warm zygote (grading.sandbox.zygote_client.Mother), if any
    run_timeout: float = DEFAULT_RUN_TIMEOUT  # the whole run's cap, seconds
    run_deadline: float | None = None  # time.monotonic() at which the run's cap is reached

    def run_left(self) -> float:
        """Seconds left before the run's cap (infinite before the run starts)."""
        if self.run_deadline is None:
            return float("inf")
        return self.run_deadline - time.monotonic()

    def lab_bound(self) -> float:
        """The most seconds one lab can take, however its tests time out."""
        per_test = self.test_timeout + hard_stop_grace(self.test_timeout) + RESTART_ALLOWANCE
        return self.lab_timeout + MAX_EXTENDING_TIMEOUTS * per_test


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


def timeout_allowance(events: list[dict], test_timeout: float) -> float:
    """Seconds the tests stopped at the per-test limit may take beyond the lab's limit.

    The lab's limit is for the tests that end by themselves: a hang costs only its own test
    (its limit plus the watchdog's grace, and a restart of pytest after a hard stop), never
    the tests after it. At most :data:`MAX_EXTENDING_TIMEOUTS` of them extend it.
    """
    per_test = test_timeout + hard_stop_grace(test_timeout)
    soft = sum(
        1
        for e in events
        if e.get("event") == "result" and str(e.get("message", "")).startswith("timed out after")
    )
    hard = min(MAX_EXTENDING_TIMEOUTS, sum(1 for e in events if e.get("event") == "timeout"))
    soft = min(soft, MAX_EXTENDING_TIMEOUTS - hard)  # bounded: see MAX_EXTENDING_TIMEOUTS
    return soft * per_test + hard * (per_test + RESTART_ALLOWANCE) + compile_allowance(events)


def compile_allowance(events: list[dict]) -> float:
    """Seconds the lab's compile step took (or, while it runs, has taken so far), at most
    ``COMPILE_LIMIT``: it runs before the tests and is not the tests' time."""
    seconds, started = 0.0, None
    for e in events:
        if e.get("event") == "compile_start":
            started = e.get("at")
        elif e.get("event") == "compile":
            seconds += float(e.get("seconds") or 0.0)
            started = None
    if isinstance(started, int | float):
        seconds += max(time.monotonic() - started, 0.0)
    return min(seconds, COMPILE_LIMIT + 60.0)


def _wait(proc: subprocess.Popen, log: Path, limit: float, opts: Options) -> tuple[bool, float]:
    """Wait for ``proc`` until ``limit`` s plus the allowance of its timed-out tests;
    returns (killed at the limit, allowance)."""
    start = time.monotonic()
    while True:
        allowance = timeout_allowance(_read_events(log), opts.test_timeout)
        left = min(start + limit + allowance - time.monotonic(), opts.run_left())
        if left <= 0:
            _kill_group(proc)
            return True, allowance
        try:
            proc.wait(timeout=min(max(left, 0.05), POLL_SECONDS))
            return False, allowance
        except subprocess.TimeoutExpired:
            continue


def _pytest_args(lab: Path, opts: Options, log: Path, extra: list[str]) -> list[str]:
    """The command line of one lab's pytest process (the points plugin, the limits)."""
    # the lab's folder and a file pattern, not the file names: a process list (ps) shows this
    # command line, and it must not name the hidden tests
    tests = [str(lab.relative_to(opts.root)), "-o", f"python_files={' '.join(GRADED_PATTERNS)}"]
    plugin = ["-p", "grading.plugin.points", "--points-log", str(log)]
    quiet = ["-p", "no:cacheprovider", "-q", "--tb=short", "--show-capture=no"]
    limits = [
        "--timeout=0",  # pytest-timeout off: --points-test-timeout also stops @given tests
        f"--points-test-timeout={opts.test_timeout:g}",
        f"--points-collect-timeout={opts.test_timeout:g}",
        "--points-fast-hypothesis",
    ]
    return [opts.python, "-m", "pytest", *tests, *plugin, *quiet, *limits, *extra]


def run_pytest(
    lab: Path,
    opts: Options,
    limit: float,
    extra: list[str],
    deselect: set[str] | None = None,
    shown_limit: float | None = None,
) -> Run:
    """Run pytest on one lab in its own process group, output to a file, under ``limit`` s
    (plus the allowance of tests stopped at the per-test limit)."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        log, out = Path(tmp) / "events.jsonl", Path(tmp) / "output.txt"
        args = _pytest_args(lab, opts, log, extra)
        if deselect:
            (Path(tmp) / "deselect.txt").write_text("\n".join(sorted(deselect)), encoding="utf-8")
            args += ["--points-deselect", str(Path(tmp) / "deselect.txt")]
        private_tmp = Path(tmp) / "tmp"  # the test process's own: no lab can reach it
        private_tmp.mkdir(mode=0o700)
        env = dict(os.environ, LAB_IMPL=opts.impl, TMPDIR=str(private_tmp))
        env.setdefault(ENV_DIR, tempfile.gettempdir())  # scratch copies: where the uids reach
        env["PYTHONPATH"] = os.pathsep.join(
            [str(opts.root), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        block = opts.uid_blocks.get(lab.name)
        args += sandbox_args(opts, env, block)
        if opts.sandbox and (opts.root / "conftest.py").is_file():
            # the project's conftest.py as a plugin, and no other: a conftest.py the graded
            # code managed to drop into a lab folder is never loaded
            args += ["--noconftest", "-p", "conftest"]
        box = _start_sandbox(lab, opts, block, env) if "--collect-only" not in extra else None
        start = time.monotonic()
        try:
            with open(out, "wb") as sink:
                proc = _start_tests(args, opts, env, sink)
                _limit_resources(proc.pid)
                timed_out, allowance = _wait(proc, log, limit, opts)
                returncode = proc.wait()
                _kill_group(proc)  # anything it left running
        finally:
            if box is not None:
                box.close()  # the sandbox: its processes and its scratch copy
            if block is not None:  # and anything else of the lab's sandbox uids
                kill_block(block)
                remove_files_of(block)
        return Run(
            events=_read_events(log),
            returncode=returncode,
            timed_out=timed_out,
            limit=limit if shown_limit is None else shown_limit,
            output_tail=_tail(out),
            elapsed=time.monotonic() - start,
            allowance=allowance,
        )


def _start_tests(args: list[str], opts: Options, env: dict[str, str], sink: Any
                 ) -> subprocess.Popen | ForkedChild:
    """The lab's pytest process: forked from this one when it is the warm front door
    (:func:`can_fork_tests`: torch imported once here serves it), else a fresh interpreter.
    Either way its own session and process group (a kill reaches its children), ``cwd`` the
    project, ``env`` its whole environment, no input, its output to ``sink``."""
    if not can_fork_tests(opts):
        return subprocess.Popen(args, cwd=opts.root, env=env, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        exit_child(lambda: _forked_pytest(args[3:], str(opts.root), env, sink.fileno()),
                   run_exit_handlers=True)
    return ForkedChild(pid)


def can_fork_tests(opts: Options) -> bool:
    """Fork the tests from this process? Only the warm front door (``python -m grading``,
    :func:`grading.sandbox.zygote_client.preloaded`) with no thread running (``--jobs 1``),
    grading the project its own code comes from, with its own interpreter."""
    import threading

    return (preloaded() and threading.active_count() == 1 and opts.python == sys.executable
            and opts.root.resolve() == PROJECT_ROOT.resolve())


def _forked_pytest(args: list[str], cwd: str, env: dict[str, str], out: int) -> int:
    """In the forked child: become what ``python -m pytest ARGS`` started in ``cwd`` with
    ``env`` would be (a new session, only stdin, stdout and stderr, the parent's objects
    and exit handlers left alone), run pytest, its exit status (:func:`exit_child` leaves
    with it)."""
    import atexit
    import gc
    import weakref

    gc.freeze()  # the parent's objects: never collected here (their descriptors are gone)
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    atexit._clear()  # the parent's: its temp folders are not this process's to remove
    for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        finalizer.atexit = False
    weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined]
    given = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd, *path, *(p for p in sys.path[1:] if p and p not in given)]
    sys.argv = ["pytest", *args]
    import pytest

    return int(pytest.main(args))


def sandbox_args(opts: Options, env: dict[str, str], block: tuple[int, int] | None
                 ) -> list[str]:
    """The pytest options and environment that put the graded code in its sandbox: the
    proxy plugin, ``COURSE_SANDBOX=1`` and the lab's uid block (or ``none``). The test
    process writes no bytecode (no compiled copy of a hidden test left readable)."""
    for name in (ENV_ENABLE, ENV_UIDS, ENV_ZYGOTE, "COURSE_SCRIPT_PREFIX"):
        env.pop(name, None)
    if not opts.sandbox:
        return []
    env[ENV_ENABLE] = "1"
    env[ENV_UIDS] = f"{block[0]}-{block[1] - 1}" if block else "none"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return ["-p", "grading.plugin.proxy"]


def _start_sandbox(lab: Path, opts: Options, block: tuple[int, int] | None,
                   env: dict[str, str]) -> LabSandbox | None:
    """The lab's sandbox, started now so that its zygote imports torch while pytest starts;
    handed to the test process in ``COURSE_SANDBOX_ZYGOTE`` (it makes its own otherwise)."""
    if not opts.sandbox:
        return None
    try:
        box = LabSandbox(opts.root, lab, opts.impl, Mode(block, "" if block else "no user"),
                         mother=opts.mother)
    except (OSError, SandboxError):
        return None
    env[ENV_ZYGOTE] = json.dumps({lab.name: box.info()})
    return box


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
