"""Grade the labs: a per-lab score table and a Gradescope ``results.json``.

    python -m common.grading                     # every labs/lab-*/test_lab.py, LAB_IMPL=starter
    python -m common.grading --lab 01            # one lab (or --lab lab-01-paged-attention-gather)
    LAB_IMPL=solution python -m common.grading   # the instructor's check: full marks

Points come from the tests' ``points(n)`` markers (default 1). Labs are discovered, never
listed: a new ``labs/lab-NN-*/test_lab.py`` is graded with no change here. Graded files are
``test_lab.py`` plus any instructor-only ``test_hidden*.py`` beside it (same conventions:
``impl = load_impl(__file__)``, ``points`` markers; ``make release`` leaves them out); other
test files in a lab folder (lab-02's conformance tests against the real vLLM) are not graded.

Nothing the graded code does can stop the report. Each lab runs in its own ``pytest``
process (``common.grading.pytest_points`` records every test's result as soon as it finishes) with:

- a per-test time limit (pytest-timeout, ``--test-timeout``, default 15 s) and a limit on
  importing the tests (same value), and a wall-clock limit for the whole lab
  (``--lab-timeout``, default 60 s) after which its process group is killed;
- its output going to a file, not a pipe (megabytes of prints cannot block it), and a cap
  on the size of any file it writes (256 MB);
- if the process dies in the middle (``os._exit``, a segfault, a kill), the test that was
  running gets 0 points with the reason ("crashed with signal SIGSEGV during this test"),
  the tests that had finished keep their results, and the lab is re-run without them (at
  most ``--max-restarts`` times, within the lab's time limit).

When a lab's tests cannot even be imported (a syntax error in ``starter.py``), the lab
scores 0 and its possible points are still known: its tests are collected a second time
with ``load_impl`` answering a stub (``--points-stub-impl``; nothing of the lab's code is
imported), and if that fails too, from a static scan of ``test_lab.py`` (decorators
``pytest.mark.points(n)``, a module ``pytestmark``, literal ``parametrize`` lists; an
approximation that the report marks as such).

Tests that are skipped on this machine (``gpu`` without CUDA) are not counted: "possible"
is what this machine can grade. A ``pytest.skip()`` raised from the graded code counts as
a failure. The grader guards against accidents, not against deliberate tampering: the
graded code runs inside the pytest process that records its results.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.loader import ALLOWED_IMPLS

try:
    import resource
except ImportError:  # not on Windows: no file-size cap there
    resource = None  # type: ignore[assignment]
from common.grading.pytest_points import summarize_collect_error

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LAB_TIMEOUT = 60.0
DEFAULT_TEST_TIMEOUT = 15.0
DEFAULT_MAX_RESTARTS = 5
STUB_COLLECT_TIMEOUT = 60.0
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


# ---- results --------------------------------------------------------------------------------


@dataclass
class TestResult:
    nodeid: str
    name: str
    points: float
    outcome: str  # "passed" | "failed" | "skipped"
    message: str = ""
    duration: float = 0.0

    @property
    def earned(self) -> float:
        return self.points if self.outcome == "passed" else 0.0


@dataclass
class LabResult:
    name: str
    tests: list[TestResult] = field(default_factory=list)
    duration: float = 0.0
    problems: list[str] = field(default_factory=list)  # lab-level notes, worst first
    count_source: str = "collected"  # or "stub collection" / "static scan (approximate)"

    @property
    def graded(self) -> list[TestResult]:
        return [t for t in self.tests if t.outcome != "skipped"]

    @property
    def possible(self) -> float:
        return sum(t.points for t in self.graded)

    @property
    def earned(self) -> float:
        return sum(t.earned for t in self.graded)

    @property
    def passed(self) -> int:
        return sum(t.outcome == "passed" for t in self.graded)

    @property
    def skipped(self) -> int:
        return sum(t.outcome == "skipped" for t in self.tests)

    def note(self) -> str:
        """A few words for the table; the full reasons are in ``problems``."""
        notes = list(dict.fromkeys(_tag(p) for p in self.problems))
        if self.count_source.startswith("static"):
            notes.append("points estimated")
        if self.skipped:
            notes.append(f"{self.skipped} skipped, not counted")
        return ", ".join(notes)


def _tag(problem: str) -> str:
    """``crashed with signal SIGSEGV (...) during test_x`` -> ``crashed (SIGSEGV)``."""
    for pattern, tag in (
        (r"^skipped", "skipped"),
        (r"^no tests were collected", "no tests"),
        (r"^could not import the tests", "tests cannot be imported"),
        (r"timed out after ([\d.]+) s", r"timed out (\1 s)"),
        (r"crashed with signal (\w+)", r"crashed (\1)"),
        (r"interpreter exited with code (-?\d+)", r"exited (code \1)"),
        (r"interrupted", "interrupted"),
        (r"grader error", "grader error"),
    ):
        m = re.search(pattern, problem)
        if m:
            return m.expand(tag)
    return "stopped early"


@dataclass
class Options:
    root: Path = PROJECT_ROOT
    impl: str = "starter"
    lab_timeout: float = DEFAULT_LAB_TIMEOUT
    test_timeout: float = DEFAULT_TEST_TIMEOUT
    max_restarts: int = DEFAULT_MAX_RESTARTS
    python: str = sys.executable


# ---- discovery ------------------------------------------------------------------------------


def discover_labs(root: Path) -> list[Path]:
    """Every ``labs/lab-*/`` folder that has a ``test_lab.py``, in order."""
    return sorted(p.parent for p in (root / "labs").glob("lab-*/test_lab.py"))


def graded_files(lab: Path) -> list[Path]:
    """The test files that carry a lab's points: ``test_lab.py`` plus any instructor-only
    ``test_hidden*.py`` dropped beside it (never part of a student release)."""
    return [lab / "test_lab.py", *sorted(lab.glob("test_hidden*.py"))]


def select_labs(labs: list[Path], wanted: list[str]) -> list[Path]:
    """Labs named by number (``1``, ``01``) or folder name; ``ValueError`` names the choices."""
    if not wanted:
        return labs
    chosen: list[Path] = []
    for spec in (s.strip() for w in wanted for s in w.split(",")):
        if not spec:
            continue
        name = Path(spec.rstrip("/")).name
        if name.isdigit():
            name = f"lab-{int(name):02d}"
        matches = [
            lab
            for lab in labs
            if lab.name == name or re.match(re.escape(name) + r"(-|$)", lab.name)
        ]
        if len(matches) != 1:
            choices = ", ".join(lab.name for lab in labs) or "none found"
            what = "matches no lab" if not matches else "is ambiguous"
            raise ValueError(f"--lab {spec!r} {what}; labs: {choices}")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen


# ---- one pytest process ---------------------------------------------------------------------


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


# ---- grading one lab ------------------------------------------------------------------------


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def grade_lab(lab: Path, opts: Options) -> LabResult:
    """Grade one lab; never raises for anything the graded code does."""
    result = LabResult(name=lab.name)
    start = time.monotonic()
    collected: list[dict] | None = None
    done: dict[str, TestResult] = {}
    stopped: str | None = None  # why tests that never ran did not run
    collect_problem: str | None = None
    restarts = 0

    while True:
        remaining = opts.lab_timeout - (time.monotonic() - start)
        run = run_pytest(lab, opts, remaining, [], deselect=set(done))
        if collected is None:
            collected = run.collected
        for nodeid, event in run.results.items():
            done[nodeid] = _test_result(event, collected)
        errors = run.of("collect_error")
        if errors:
            collect_problem = f"could not import the tests: {errors[0]['message']}"
            break
        if collected is None:  # died (or stopped) before the tests were collected
            collect_problem = _collection_death(run)
            break
        if not collected:
            skips = run.of("collect_skip")
            reason = skips[0]["message"].removeprefix("Skipped: ") if skips else ""
            why = f"skipped: {reason}" if skips else "no tests were collected"
            result.problems.append(why)
            break
        todo = [t for t in collected if t["nodeid"] not in done]
        if not todo:
            break
        # The process ended before all the tests ran.
        reason = run.exit_reason()
        culprit = run.unfinished
        if culprit is not None:
            done[culprit] = _crashed(culprit, collected, f"{reason} during this test")
            result.problems.append(f"{reason} during {_short(culprit)}")
        else:
            result.problems.append(reason)
        out_of_time = run.timed_out or time.monotonic() - start >= opts.lab_timeout - 0.5
        if out_of_time or culprit is None or restarts >= opts.max_restarts:
            stopped = reason if culprit is None else f"{reason} during {_short(culprit)}"
            if not out_of_time and culprit is not None:
                stopped += f" (after {restarts} re-runs of this lab)"
            break
        restarts += 1

    if collect_problem is not None:
        result.problems.insert(0, collect_problem)
        if not collected:
            collected, result.count_source = count_tests(lab, opts)
        stopped = collect_problem
    for spec in collected or []:
        nodeid = spec["nodeid"]
        if nodeid in done:
            result.tests.append(done[nodeid])
        elif spec.get("skip"):
            skipped = {"nodeid": nodeid, "outcome": "skipped", "message": spec["skip"]}
            result.tests.append(_test_result(skipped, collected))
        else:
            result.tests.append(_crashed(nodeid, [spec], f"not run: {stopped or 'unknown reason'}"))
    result.duration = time.monotonic() - start
    return result


def _spec(nodeid: str, collected: list[dict] | None) -> dict:
    for spec in collected or []:
        if spec["nodeid"] == nodeid:
            return spec
    return {"nodeid": nodeid, "name": _short(nodeid), "points": 1.0}


def _test_result(event: dict, collected: list[dict] | None) -> TestResult:
    spec = _spec(event["nodeid"], collected)
    return TestResult(
        nodeid=spec["nodeid"],
        name=spec["name"],
        points=float(spec["points"]),
        outcome=event["outcome"],
        message=event.get("message", ""),
        duration=float(event.get("duration", 0.0)),
    )


def _crashed(nodeid: str, collected: list[dict] | None, message: str) -> TestResult:
    spec = _spec(nodeid, collected)
    return TestResult(nodeid, spec["name"], float(spec["points"]), "failed", message)


def _collection_death(run: Run) -> str:
    """Why a process produced no test list: it died, or pytest itself stopped."""
    if run.finished or "INTERNALERROR" in run.output_tail:
        text = "\n".join(
            line.removeprefix("INTERNALERROR> ") for line in run.output_tail.splitlines()
        )
        return f"could not import the tests: {summarize_collect_error(text)}"
    return f"{run.exit_reason()} while importing the tests"


# ---- counting the points of a lab whose tests cannot be imported ---------------------------


def count_tests(lab: Path, opts: Options) -> tuple[list[dict], str]:
    """The lab's tests and points without running (or importing) the graded code."""
    run = run_pytest(lab, opts, STUB_COLLECT_TIMEOUT, ["--collect-only", "--points-stub-impl"])
    if run.collected and not run.of("collect_error"):
        return run.collected, "stub collection"
    tests = [t for f in graded_files(lab) for t in static_tests(f)]
    return tests, "static scan of the test files (approximate)"


def _mark(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """``pytest.mark.NAME(args)`` / ``mark.NAME`` -> (NAME, args)."""
    args: list[ast.expr] = []
    if isinstance(node, ast.Call):
        args, node = list(node.args), node.func
    if isinstance(node, ast.Attribute):
        base = node.value
        if (isinstance(base, ast.Attribute) and base.attr == "mark") or (
            isinstance(base, ast.Name) and base.id == "mark"
        ):
            return node.attr, args
    return None


def _marks(exprs: list[ast.expr]) -> list[tuple[str, list[ast.expr]]]:
    out = []
    for e in exprs:
        items = e.elts if isinstance(e, ast.List | ast.Tuple) else [e]
        out += [m for m in map(_mark, items) if m is not None]
    return out


def _pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
    return [
        node.value
        for node in body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]


def static_tests(test_file: Path) -> list[dict]:
    """Tests and points read from the source of ``test_file`` (no import).

    Understands ``@pytest.mark.points(n)`` (also on a class or in ``pytestmark``), ``gpu``
    (not counted without CUDA) and ``parametrize`` with a literal list of cases (each case is
    a test). Not understood, so counted as one test: parametrize over a computed list,
    ``pytest_generate_tests``, tests imported from elsewhere.
    """
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return []
    rel = f"{test_file.parent.parent.name}/{test_file.parent.name}/{test_file.name}"
    tests: list[dict] = []
    cuda: list[bool] = []

    def add(node: ast.FunctionDef, prefix: str, outer: list[tuple[str, list[ast.expr]]]) -> None:
        marks = _marks(node.decorator_list) + outer  # closest first, like get_closest_marker
        points = next((m[1] for m in marks if m[0] == "points" and m[1]), None)
        value = points[0].value if points and isinstance(points[0], ast.Constant) else 1
        cases = 1
        for name, args in marks:
            if (
                name == "parametrize"
                and len(args) >= 2
                and isinstance(args[1], ast.List | ast.Tuple)
            ):
                cases *= max(len(args[1].elts), 1)
        skip = None
        if any(name == "gpu" for name, _ in marks):
            if not cuda:
                from common.device import has_cuda

                cuda.append(has_cuda())
            skip = None if cuda[0] else "needs a CUDA GPU (gpu marker)"
        for i in range(cases):
            name = node.name + (f"[{i}]" if cases > 1 else "")
            tests.append(
                {
                    "nodeid": f"{rel}::{prefix}{name}",
                    "name": name,
                    "points": float(value),
                    "skip": skip,
                }
            )

    module_marks = _marks(_pytestmark(tree.body))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            add(node, "", module_marks)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            class_marks = _marks(node.decorator_list) + _marks(_pytestmark(node.body))
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef) and sub.name.startswith(
                    "test"
                ):
                    add(sub, f"{node.name}::", class_marks + module_marks)
    return tests


# ---- grading everything ---------------------------------------------------------------------


@dataclass
class Report:
    impl: str
    labs: list[LabResult]
    duration: float

    @property
    def earned(self) -> float:
        return sum(lab.earned for lab in self.labs)

    @property
    def possible(self) -> float:
        return sum(lab.possible for lab in self.labs)


def grade(labs: list[Path], opts: Options, jobs: int = 1, on_done=None) -> Report:
    """Grade ``labs`` (``jobs`` at a time); ``on_done(LabResult)`` is called as each ends."""
    start = time.monotonic()
    lock = threading.Lock()

    def one(lab: Path) -> LabResult:
        try:
            res = grade_lab(lab, opts)
        except Exception as exc:  # noqa: BLE001 - a grader bug must not lose the other labs
            res = LabResult(name=lab.name, problems=[f"grader error: {exc!r}"])
            try:
                specs, res.count_source = count_tests(lab, opts)
            except Exception:  # noqa: BLE001
                specs = []
            res.tests = [_crashed(s["nodeid"], specs, f"not graded: grader error {exc!r}")
                         for s in specs]  # fmt: skip
        if on_done is not None:
            with lock:
                on_done(res)
        return res

    if jobs <= 1:
        results = [one(lab) for lab in labs]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, labs))
    return Report(opts.impl, results, time.monotonic() - start)


# ---- output: the table and results.json -----------------------------------------------------


def fmt_points(x: float) -> str:
    """``5``, ``47.5``, ``0.25``: no trailing zeros."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


class Table:
    """The terminal table, printable row by row as labs finish."""

    def __init__(self, names: list[str], color: bool = False) -> None:
        self.width = max([len("Total"), len("Lab"), *map(len, names)])
        self.color = color

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _rule(self) -> str:
        return "  " + "-" * (self.width + 45)

    def header(self) -> str:
        head = f"  {'Lab':<{self.width}}  {'Points':>11}  {'Tests passed':>12}  {'Time':>7}  Notes"
        return head + "\n" + self._rule()

    def row(self, lab: LabResult | Report) -> str:
        earned, possible = lab.earned, lab.possible
        if isinstance(lab, Report):
            passed = sum(x.passed for x in lab.labs)
            graded = sum(len(x.graded) for x in lab.labs)
            note, name = "", "Total"
        else:
            passed, graded, note, name = lab.passed, len(lab.graded), lab.note(), lab.name
        full = possible > 0 and earned >= possible
        points = f"{fmt_points(earned) + ' / ' + fmt_points(possible):>11}"
        points = self._paint(points, "32" if full else ("33" if earned > 0 else "31"))
        tests = f"{passed} / {graded}"
        line = f"  {name:<{self.width}}  {points}  {tests:>12}  {lab.duration:6.1f}s  {note}"
        return line.rstrip()

    def footer(self, report: Report) -> str:
        return self._rule() + "\n" + self.row(report)


def problem_lines(report: Report) -> str:
    """The full reason behind each note of the table ("" when there is none)."""
    lines = []
    for lab in report.labs:
        for problem in lab.problems:
            lines.append(f"  {lab.name}: {' '.join(problem.split())}")
        if lab.count_source != "collected":
            lines.append(f"  {lab.name}: possible points counted by {lab.count_source}")
    return "\nWhat went wrong:\n" + "\n".join(lines) if lines else ""


def plain_summary(report: Report) -> str:
    """The table and the reasons, without colours (Gradescope's top-level output)."""
    table = Table([lab.name for lab in report.labs])
    lines = [table.header(), *map(table.row, report.labs), table.footer(report)]
    return "\n".join(lines) + problem_lines(report)


def markdown_block(text: str) -> str:
    """``text`` as a Markdown code block (monospace: the table stays aligned)."""
    fence = "`" * 3
    return f"{fence}text\n" + text.replace(fence, "'" * 3) + f"\n{fence}"


def details(lab: LabResult, ascii_only: bool) -> str:
    """One line per test: mark, name, points, and the first line of what went wrong."""
    ok, bad, skip = ("ok", "FAIL", "skip") if ascii_only else ("✓", "✗", "–")
    lines = [f"\n{lab.name}: {fmt_points(lab.earned)} / {fmt_points(lab.possible)} points"]
    for t in lab.tests:
        mark = {"passed": ok, "failed": bad}.get(t.outcome, skip)
        pts = f"{fmt_points(t.earned)}/{fmt_points(t.points)}" if t.outcome != "skipped" else "-"
        lines.append(f"  {mark:>4} {pts:>5}  {t.name}")
        if t.outcome != "passed" and t.message:
            for line in t.message.splitlines()[:3]:
                lines.append(f"              {line}")
    return "\n".join(lines)


def gradescope_results(report: Report, summary: str = "") -> dict[str, Any]:
    """The dict Gradescope reads from ``/autograder/results/results.json``."""
    tests = []
    for lab in report.labs:
        for t in lab.graded:
            tests.append(
                {
                    "name": f"{lab.name} › {t.name}",
                    "score": round(t.earned, 4),
                    "max_score": round(t.points, 4),
                    "status": "passed" if t.outcome == "passed" else "failed",
                    "output": t.message,
                    "visibility": "visible",
                }
            )
    return {
        "score": round(report.earned, 4),
        "execution_time": round(report.duration, 2),
        "output": markdown_block(summary),
        "output_format": "md",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {
            "impl": report.impl,
            "possible": round(report.possible, 4),
            "labs": [
                {
                    "name": lab.name,
                    "score": round(lab.earned, 4),
                    "possible": round(lab.possible, 4),
                    "passed": lab.passed,
                    "tests": len(lab.graded),
                    "skipped": lab.skipped,
                    "seconds": round(lab.duration, 2),
                    "notes": lab.note(),
                    "problems": lab.problems,
                    "counted_by": lab.count_source,
                }
                for lab in report.labs
            ],
        },
    }


GRADESCOPE_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def validate_gradescope(results: dict[str, Any]) -> list[str]:
    """Problems with ``results`` as a Gradescope results.json (empty list: valid)."""
    problems = []

    def number(x: Any) -> bool:
        return (
            isinstance(x, int | float)
            and not isinstance(x, bool)
            and x == x
            and abs(x) != float("inf")
        )

    if "score" in results and not number(results["score"]):
        problems.append("score is not a finite number")
    if "score" not in results and not all("score" in t for t in results.get("tests", [])):
        problems.append("no top-level score and a test without score")
    if not isinstance(results.get("tests", []), list):
        problems.append("tests is not a list")
    if results.get("visibility", "visible") not in GRADESCOPE_VISIBILITY:
        problems.append("bad top-level visibility")
    for i, t in enumerate(results.get("tests", [])):
        for key in ("score", "max_score"):
            if key in t and not number(t[key]):
                problems.append(f"tests[{i}].{key} is not a finite number")
        if not isinstance(t.get("name", ""), str) or not isinstance(t.get("output", ""), str):
            problems.append(f"tests[{i}] name/output must be strings")
        if t.get("visibility", "visible") not in GRADESCOPE_VISIBILITY:
            problems.append(f"tests[{i}].visibility is not one of {sorted(GRADESCOPE_VISIBILITY)}")
        if t.get("status", "passed") not in ("passed", "failed"):
            problems.append(f"tests[{i}].status must be passed or failed")
        if number(t.get("score")) and number(t.get("max_score")) and t["score"] > t["max_score"]:
            problems.append(f"tests[{i}] scores more than its max_score")
    try:
        json.dumps(results, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"not strict JSON: {exc}")
    return problems


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file) as strict JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---- command line ---------------------------------------------------------------------------


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m common.grading",
        description="Grade the labs (LAB_IMPL=starter by default): a score table and a "
        "Gradescope results.json.",
    )
    p.add_argument(
        "--lab",
        action="append",
        default=[],
        metavar="NN",
        help="a lab number (01) or folder name; repeat or comma-separate; default all",
    )
    p.add_argument(
        "--impl",
        choices=ALLOWED_IMPLS,
        default=None,
        help="what to grade (default: $LAB_IMPL, else starter)",
    )
    p.add_argument("--root", type=Path, default=PROJECT_ROOT, help="project root (has labs/)")
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="where to write results.json (default: ROOT/results.json)",
    )
    p.add_argument(
        "--lab-timeout",
        type=float,
        default=_env_float("GRADE_LAB_TIMEOUT", DEFAULT_LAB_TIMEOUT),
        help="wall-clock seconds per lab (default 60, env GRADE_LAB_TIMEOUT)",
    )
    p.add_argument(
        "--test-timeout",
        type=float,
        default=_env_float("GRADE_TEST_TIMEOUT", DEFAULT_TEST_TIMEOUT),
        help="seconds per test (default 15, env GRADE_TEST_TIMEOUT)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help="re-runs of a lab after a crash (default 5)",
    )
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=int(_env_float("GRADE_JOBS", 1)),
        help="labs graded at once (default 1, env GRADE_JOBS)",
    )
    p.add_argument(
        "--details",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="list every test with its message (default: on for a single lab)",
    )
    p.add_argument(
        "--fail-under",
        type=float,
        default=None,
        metavar="PERCENT",
        help="exit with status 1 when the score is below PERCENT of possible",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only the total")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    impl = args.impl or (os.environ.get("LAB_IMPL", "").strip() or "starter")
    if impl not in ALLOWED_IMPLS:
        print(
            f"LAB_IMPL={impl!r} is not allowed: use one of {', '.join(ALLOWED_IMPLS)}",
            file=sys.stderr,
        )
        return 2
    root = args.root.resolve()
    labs = discover_labs(root)
    try:
        labs = select_labs(labs, args.lab)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not labs:
        print(f"no labs found: nothing matches {root}/labs/lab-*/test_lab.py", file=sys.stderr)
        return 2
    opts = Options(
        root=root,
        impl=impl,
        lab_timeout=args.lab_timeout,
        test_timeout=args.test_timeout,
        max_restarts=args.max_restarts,
    )
    results_path = (args.results or root / "results.json").resolve()
    show_details = args.details if args.details is not None else len(labs) == 1
    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    ascii_only = "utf" not in (sys.stdout.encoding or "").lower()
    table = Table([lab.name for lab in labs], color=color)
    live = args.jobs <= 1 and not args.quiet

    def say(text: str = "") -> None:
        if not args.quiet:
            print(text, flush=True)

    say(
        f"Grading {impl}.py of {len(labs)} lab(s): at most {opts.test_timeout:g} s per test, "
        f"{opts.lab_timeout:g} s per lab\n"
    )
    say(table.header())
    report = grade(
        labs, opts, jobs=args.jobs, on_done=(lambda r: say(table.row(r))) if live else None
    )
    if not live:
        for lab in report.labs:
            say(table.row(lab))
    say(table.footer(report))
    if show_details:
        for lab in report.labs:
            say(details(lab, ascii_only))
    notes = problem_lines(report)
    if notes:
        say(notes)
    write_json(results_path, gradescope_results(report, plain_summary(report)))
    pct = 100.0 * report.earned / report.possible if report.possible else 100.0
    print(
        f"\nScore: {fmt_points(report.earned)} / {fmt_points(report.possible)} ({fmt_points(pct)}%)"
        f"  ->  {_display(results_path)}"
    )
    if impl == "starter" and report.earned < report.possible and not (args.quiet or show_details):
        one = " LAB=NN" if len(labs) > 1 else ""
        print(
            f"Each failing test says what is wrong: `make grade{one}` lists them, or run "
            f"`LAB_IMPL=starter python -m pytest labs/<lab> -x -q`."
        )
    if args.fail_under is not None and pct < args.fail_under:
        return 1
    return 0


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
