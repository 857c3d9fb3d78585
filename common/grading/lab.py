"""Grading one lab, and every lab: nothing the graded code does can stop the report.

A lab is run in its own pytest process (:mod:`common.grading.runner`). If the process dies
in the middle (``os._exit``, a segfault, a kill), the test that was running gets 0 points
with the reason, the tests that had finished keep their results, and the lab is re-run
without them (at most ``max_restarts`` times, within the lab's time limit). A test stopped
at the per-test limit costs only itself: the re-run after it is not counted as a crash,
and the lab's limit grows by that test's budget (``runner.timeout_allowance``). When the tests
cannot even be imported, the lab scores 0 of points counted without importing its code
(:mod:`common.grading.counting`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from common.grading.counting import count_tests
from common.grading.messages import import_problem, summarize_collect_error
from common.grading.results import LabResult, Report, TestResult
from common.grading.runner import Options, Run, run_pytest
from common.grading.session import grading_session


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
        return opts.lab_timeout + self.allowance - (time.monotonic() - self.start)


def grade_lab(lab: Path, opts: Options) -> LabResult:
    """Grade one lab; never raises for anything the graded code does."""
    result = LabResult(name=lab.name)
    progress = _Progress(start=time.monotonic())
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
        p.collect_problem = import_problem(errors[0]["message"])
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
        return import_problem(summarize_collect_error(text))
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
    (:func:`common.grading.session.grading_session`: a uid block per lab when running as
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
