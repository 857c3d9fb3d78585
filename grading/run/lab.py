"""Grading one lab, and every lab: nothing the graded code does can stop the report.

A lab is run in its own pytest process (:mod:`grading.run.runner`). If the process dies
in the middle (``os._exit``, a segfault, a kill), the test that was running gets 0 points
with the reason, the tests that had finished keep their results, and the lab is re-run
without them (at most ``max_restarts`` times, within the lab's time limit). A test stopped
at the per-test limit costs only itself: the re-run after it is not counted as a crash,
and the lab's limit grows by that test's budget (``runner.timeout_allowance``).

When the tests cannot even be imported (a starter with a syntax error), the lab scores 0
of its points counted without importing its code (:func:`count_tests`): its tests are
collected again with ``load_impl`` answering a stub (``--points-stub-impl``: nothing of
the lab's code is imported); if that fails too, they are read from the source of the test
files (an approximation the report marks as such).
"""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from grading.plugin.messages import summarize_collect_error
from grading.run.discovery import graded_files
from grading.run.report import LabResult, Report, TestResult
from grading.run.runner import Options, Run, run_pytest
from grading.sandbox.lab_sandbox import grading_session

# ---- counting ----------------------------------------------------------------------------


STUB_COLLECT_TIMEOUT = 60.0

Marks = list[tuple[str, list[ast.expr]]]


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


def _marks(exprs: list[ast.expr]) -> Marks:
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


@lru_cache(maxsize=1)
def _has_cuda() -> bool:
    from common.device import has_cuda

    return has_cuda()


def _is_test(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def _cases(marks: Marks) -> int:
    """How many tests a literal ``parametrize`` list makes (1 if none, or not literal)."""
    cases = 1
    for name, args in marks:
        if name == "parametrize" and len(args) >= 2 and isinstance(args[1], ast.List | ast.Tuple):
            cases *= max(len(args[1].elts), 1)
    return cases


@lru_cache(maxsize=1)
def _triton_missing() -> str | None:
    """conftest.py's reason for skipping ``triton`` tests here, or None if triton imports."""
    from common.triton_env import HAVE_TRITON, TRITON_MISSING

    return None if HAVE_TRITON else f"not run: {TRITON_MISSING}"


def _skip_reason(marks: Marks) -> str | None:
    if any(name == "gpu" for name, _ in marks) and not _has_cuda():
        return "needs a CUDA GPU (gpu marker)"
    if any(name == "triton" for name, _ in marks):
        return _triton_missing()
    return None


def _entries(node: ast.FunctionDef, rel: str, prefix: str, outer: Marks) -> list[dict]:
    marks = _marks(node.decorator_list) + outer  # closest first, like get_closest_marker
    points = next((m[1] for m in marks if m[0] == "points" and m[1]), None)
    value = points[0].value if points and isinstance(points[0], ast.Constant) else 1
    cases = _cases(marks)
    skip = _skip_reason(marks)
    entries = []
    for i in range(cases):
        name = node.name + (f"[{i}]" if cases > 1 else "")
        entries.append(
            {"nodeid": f"{rel}::{prefix}{name}", "name": name, "points": float(value), "skip": skip}
        )
    return entries


def static_tests(test_file: Path) -> list[dict]:
    """Tests and points read from the source of ``test_file`` (no import).

    Understands ``@pytest.mark.points(n)`` (also on a class or in ``pytestmark``), ``gpu``
    (not counted without CUDA), ``triton`` (not run without triton) and ``parametrize``
    with a literal list of cases (each case is a test). Not understood, so counted as one
    test: parametrize over a computed list, ``pytest_generate_tests``, tests imported from
    elsewhere.
    """
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return []
    rel = f"{test_file.parent.parent.name}/{test_file.parent.name}/{test_file.name}"
    tests: list[dict] = []
    module_marks = _marks(_pytestmark(tree.body))
    for node in tree.body:
        if _is_test(node):
            tests += _entries(node, rel, "", module_marks)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            class_marks = _marks(node.decorator_list) + _marks(_pytestmark(node.body))
            for sub in filter(_is_test, node.body):
                tests += _entries(sub, rel, f"{node.name}::", class_marks + module_marks)
    return tests


# ---- lab ---------------------------------------------------------------------------------


@dataclass
class _Progress:
    """What the runs of one lab have found so far."""

    start: float
    collected: list[dict] | None = None
    done: dict[str, TestResult] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    stopped: str | None = None  # why tests that never ran did not run
    collect_problem: str | None = None
    restarts: int = 0  # re-runs after a crash (not after a test stopped at its time limit)
    allowance: float = 0.0  # seconds added to the lab's limit for tests that timed out

    def remaining(self, opts: Options) -> float:
        lab = opts.lab_timeout + self.allowance - (time.monotonic() - self.start)
        return min(lab, opts.run_left())


def grade_lab(lab: Path, opts: Options) -> LabResult:
    """Grade one lab; never raises for anything the graded code does."""
    result = LabResult(name=lab.name)
    progress = _Progress(start=time.monotonic())
    if opts.run_left() <= 0.5:  # every test "not run", counted without running the lab
        progress.stopped = f"the grading run's time cap ({opts.run_timeout:g} s) was reached"
        progress.problems.append(progress.stopped)
        progress.collected, result.count_source = count_tests(lab, opts)
    else:
        while _run_again(lab, opts, progress):
            pass
    if progress.collect_problem is not None:
        progress.problems.insert(0, progress.collect_problem)
        if not progress.collected:
            progress.collected, result.count_source = count_tests(lab, opts)
        progress.stopped = progress.collect_problem
    result.problems = progress.problems
    result.tests = [_final(spec, progress) for spec in progress.collected or []]
    result.duration = time.monotonic() - progress.start
    return result


def _run_again(lab: Path, opts: Options, p: _Progress) -> bool:
    """Run the tests not done yet; True when the lab must be run again (after a crash)."""
    run = run_pytest(
        lab, opts, p.remaining(opts), [], deselect=set(p.done), shown_limit=opts.lab_timeout
    )
    p.allowance += run.allowance
    if p.collected is None:
        p.collected = run.collected
    for nodeid, event in run.results.items():
        p.done[nodeid] = _test_result(event, p.collected)
    errors = run.of("collect_error")
    if errors:
        p.collect_problem = f"could not import the tests: {errors[0]['message']}"
        return False
    if p.collected is None:  # died (or stopped) before the tests were collected
        p.collect_problem = _collection_death(run)
        return False
    if not p.collected:
        skips = run.of("collect_skip")
        reason = skips[0]["message"].removeprefix("Skipped: ") if skips else ""
        p.problems.append(f"skipped: {reason}" if skips else "no tests were collected")
        return False
    if all(t["nodeid"] in p.done for t in p.collected):
        return False
    return _after_stop(run, opts, p)


def _after_stop(run: Run, opts: Options, p: _Progress) -> bool:
    """The process ended before all the tests ran: blame the running test, maybe re-run."""
    reason = run.exit_reason()
    culprit = run.unfinished
    if culprit is not None:
        p.done[culprit] = _crashed(culprit, p.collected, f"{reason} during this test")
        p.problems.append(f"{reason} during {_short(culprit)}")
    else:
        p.problems.append(reason)
    hung = bool(run.of("timeout"))  # stopped by the per-test watchdog: not a crash
    out_of_time = run.timed_out or p.remaining(opts) <= 0.5
    if out_of_time or culprit is None or (not hung and p.restarts >= opts.max_restarts):
        p.stopped = reason if culprit is None else f"{reason} during {_short(culprit)}"
        if not out_of_time and culprit is not None:
            p.stopped += f" (after {p.restarts} re-runs of this lab)"
        return False
    p.restarts += 0 if hung else 1
    return True


def _final(spec: dict, p: _Progress) -> TestResult:
    nodeid = spec["nodeid"]
    if nodeid in p.done:
        return p.done[nodeid]
    if spec.get("skip"):
        skipped = {"nodeid": nodeid, "outcome": "skipped", "message": spec["skip"]}
        return _test_result(skipped, p.collected)
    return _crashed(nodeid, [spec], f"not run: {p.stopped or 'unknown reason'}")


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


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


def _grader_error(lab: Path, opts: Options, exc: Exception) -> LabResult:
    """A bug of the grader itself: every test of the lab fails with it, the others go on."""
    res = LabResult(name=lab.name, problems=[f"grader error: {exc!r}"])
    try:
        specs, res.count_source = count_tests(lab, opts)
    except Exception:  # noqa: BLE001
        specs = []
    res.tests = [_crashed(s["nodeid"], specs, f"not graded: grader error {exc!r}") for s in specs]
    return res


def grade(
    labs: list[Path],
    opts: Options,
    jobs: int = 1,
    on_done: Callable[[LabResult], None] | None = None,
    weights: dict[str, float] | None = None,
    results_file: Path | None = None,
    top_level: bool = False,
) -> Report:
    """Grade ``labs`` (``jobs`` at a time); ``on_done(LabResult)`` is called as each ends.

    With ``opts.sandbox`` the graded code runs in sandboxed workers
    (:func:`grading.sandbox.lab_sandbox.grading_session`: a uid block per lab when running as
    root, the source tree and ``results_file``'s folder locked meanwhile; ``top_level``:
    every process left below this one is killed at the end). ``weights`` multiply the
    points of a lab's tests (``{lab folder name: factor}``, default 1).
    """
    start = time.monotonic()
    lock = threading.Lock()

    def one(lab: Path) -> LabResult:
        try:
            res = grade_lab(lab, opts)
        except Exception as exc:  # noqa: BLE001 - a grader bug must not lose the other labs
            res = _grader_error(lab, opts, exc)
        _weigh(res, (weights or {}).get(lab.name, 1.0))
        if on_done is not None:
            with lock:
                on_done(res)
        return res

    names = [lab.name for lab in labs]
    opts.run_deadline = start + opts.run_timeout
    with grading_session(opts.root, names, opts.sandbox, results_file, opts.impl,
                         top_level) as session:
        opts.uid_blocks, opts.mother, opts.sandbox = (session.blocks, session.mother,
                                                      session.sandboxed)
        if jobs <= 1:
            results = [one(lab) for lab in labs]
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                results = list(pool.map(one, labs))
    return Report(opts.impl, results, time.monotonic() - start, sandbox=session.description)


def _weigh(res: LabResult, weight: float) -> None:
    res.weight = weight
    if weight != 1.0:
        for t in res.tests:
            t.points *= weight
