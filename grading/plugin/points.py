"""The pytest plugin the grader loads into each lab's pytest process
(``-p grading.plugin.points``).

It appends one JSON line per event to the file named by ``--points-log``, opening, writing
and closing the file for every line, so whatever was written before the graded code
crashes the process (``os._exit``, a segfault, a kill on timeout) is already on disk:

- ``{"event": "collected", "tests": [{"nodeid", "name", "points", "skip"}]}``: every test
  with its points (the ``points(n)`` marker, default 1) and, if
  it will be skipped on this machine (``gpu`` without CUDA, ``skipif``), why;
- ``{"event": "collect_error", "nodeid", "message"}``: a module that failed to import;
- ``{"event": "collect_skip", "nodeid", "message"}``: a module skipped as a whole;
- ``{"event": "start", "nodeid"}`` when a test starts, so a crash names its test;
- ``{"event": "result", "nodeid", "outcome", "duration", "message"}`` when it ends;
  ``message`` is the first lines of the exception (the misconception), never a traceback;
- ``{"event": "finish", "exitstatus"}`` when the session ends normally.

What it does to the collected tests: ``--points-deselect FILE`` drops the node ids listed
in FILE (the grader re-runs a lab without the tests that already finished or crashed it);
the reason a test will be skipped on this machine is read from its markers;
``--points-fast-hypothesis`` makes every ``@given`` test stop at its first failing example:
no shrinking (a failing property fails in about the time a passing one takes, printing
the example it failed on), no example database (nothing read or written between runs, so
the grade does not depend on earlier runs), whatever ``@settings`` the test carries.

``--points-stub-impl`` makes ``load_impl`` answer a stub (registered with
``common.loader.register_impl_loader``) instead of importing anything, so the tests of a
lab whose starter cannot even be imported can still be *counted* (``--collect-only``):
whatever the test module touches at import time is a stub.

``--points-collect-timeout S`` bounds the import of the test modules: an import that
takes longer fails collection with a clear message. ``--points-test-timeout S`` is the
per-test limit (it replaces pytest-timeout, which the grader turns off; see
:mod:`grading.plugin.time_limits`): a test past it fails as "timed out", @given tests
included, and one that ignores it is ended by a watchdog that first writes
``{"event": "timeout", "nodeid", "seconds"}``.
"""

from __future__ import annotations

import json
import os
import re
import types
from pathlib import Path
from typing import Any

import pytest

from grading.plugin import time_limits
from grading.plugin.messages import (
    describe_exception,
    raised_in_graded_code,
    summarize_collect_error,
)

# ---- collection --------------------------------------------------------------------------


def drop_deselected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the node ids listed in ``--points-deselect``'s file (reported as deselected)."""
    deselect_file = config.getoption("points_deselect")
    if deselect_file:
        unwanted = set(Path(deselect_file).read_text(encoding="utf-8").splitlines())
        keep = [i for i in items if i.nodeid not in unwanted]
        dropped = [i for i in items if i.nodeid in unwanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep


def fast_hypothesis(item: pytest.Item) -> None:
    """Stop ``item``'s ``@given`` test at its first failing example, with no database.

    Hypothesis reads the settings of a ``@given`` test from this attribute when the test
    runs, so this overrides the profile and the test's own ``@settings`` alike.
    """
    test = getattr(item, "obj", None)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if current is None:
        return
    from hypothesis import Phase, settings

    phases = [p for p in current.phases if p in (Phase.explicit, Phase.generate, Phase.target)]
    test._hypothesis_internal_use_settings = settings(current, phases=phases, database=None)


def static_skip_reason(item: pytest.Item) -> str | None:
    """Why ``item`` will be skipped on this machine (skip/skipif markers), else None."""
    try:
        from _pytest.skipping import evaluate_skip_marks

        skipped = evaluate_skip_marks(item)
    except Exception:  # noqa: BLE001 - a private API; without it we simply do not know
        return None
    return skipped.reason if skipped is not None else None


# ---- stub --------------------------------------------------------------------------------


class _Stub:
    """Stands in for anything the test module touches at import time."""

    def __init__(self, name: str = "stub") -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub(f"{self._name}()")

    def __getitem__(self, key: Any) -> _Stub:
        return _Stub(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")


def _stub_load_impl(lab_dir: Path, impl: str) -> types.ModuleType:
    return _StubModule(f"stub_of_{impl}")


def install_stub_loader() -> None:
    """``load_impl`` answers a stub in this process (asked before any other loader)."""
    from common.loader import register_impl_loader

    register_impl_loader(_stub_load_impl)


# ---- pytest points -----------------------------------------------------------------------


__all__ = ["describe_exception", "points_of", "summarize_collect_error"]

_state: dict[str, Any] = {"log": None, "pid": None, "phases": {}}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("points", "grading (grading.plugin.points)")
    group.addoption("--points-log", default=None, help="append JSON-line events to this file")
    group.addoption("--points-deselect", default=None, help="file of node ids not to run")
    group.addoption(
        "--points-stub-impl",
        action="store_true",
        default=False,
        help="load_impl returns a stub (count tests without importing starter/solution)",
    )
    group.addoption(
        "--points-collect-timeout",
        type=float,
        default=None,
        help="seconds allowed for importing the test modules",
    )
    group.addoption(
        "--points-test-timeout",
        type=float,
        default=None,
        help="seconds per test (setup + call + teardown), @given tests included",
    )
    group.addoption(
        "--points-fast-hypothesis",
        action="store_true",
        default=False,
        help="hypothesis stops at the first failing example: no shrinking, no database",
    )


# ---- writing events ---------------------------------------------------------------------


def _emit(event: str, **fields: Any) -> None:
    path = _state["log"]
    if path is None or os.getpid() != _state["pid"]:  # a fork of the graded code stays quiet
        return
    line = json.dumps({"event": event, **fields}, default=str)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError:
        pass


def emit_event(event: str, **fields: Any) -> None:
    """Append one event to the log (another plugin's: the compile step's ``compile_start``
    and ``compile``, which the runner reads to keep the step off the lab's clock)."""
    _emit(event, **fields)


def pytest_configure(config: pytest.Config) -> None:
    _state["log"] = config.getoption("points_log")
    _state["pid"] = os.getpid()
    _state["test_timeout"] = config.getoption("points_test_timeout")
    if config.getoption("points_stub_impl"):
        install_stub_loader()


# ---- collection ---------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    with time_limits.collection_limit(session.config.getoption("points_collect_timeout")):
        return (yield)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):  # a module-level skip
        _emit("collect_skip", nodeid=report.nodeid, message=str(report.longrepr[2]))
    if report.failed:
        _emit(
            "collect_error",
            nodeid=report.nodeid,
            message=summarize_collect_error(str(report.longreprtext)),
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    # Hidden tests last: nothing the graded code sees during them can reach the output of a
    # visible test (a sandboxed worker lives for the whole lab).
    items.sort(key=lambda item: item.path.name.startswith("test_hidden"))
    tests = []
    for item in items:
        tests.append(
            {
                "nodeid": item.nodeid,
                "name": item.name,
                "points": points_of(item),
                "skip": static_skip_reason(item),
            }
        )
    _emit("collected", tests=tests)
    if config.getoption("points_fast_hypothesis"):
        for item in items:
            fast_hypothesis(item)

    drop_deselected(config, items)


def points_of(item: pytest.Item) -> float:
    """The points a test is worth: its ``points(n)`` marker, default 1 (as conftest.py)."""
    marker = item.get_closest_marker("points")
    return float(marker.args[0]) if marker and marker.args else 1.0


# ---- running ------------------------------------------------------------------------------


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _state["phases"][nodeid] = []
    _emit("start", nodeid=nodeid)
    seconds = _state["test_timeout"]
    if seconds:
        time_limits.arm(nodeid, seconds, report=_report_hard_stop)


def _report_hard_stop(nodeid: str, seconds: float) -> None:
    _emit("timeout", nodeid=nodeid, seconds=seconds)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    left = time_limits.pause()
    try:
        report = yield
        _record_phase(item, call, report)
    finally:
        time_limits.resume(left)
    return report


def _record_phase(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
    phase = {"when": call.when, "outcome": report.outcome, "duration": report.duration}
    if call.excinfo is not None and report.outcome != "passed":
        lab_dir = Path(str(item.path)).parent
        phase["message"] = describe_exception(call.excinfo, lab_dir, item.path.name)
        phase["from_graded_code"] = raised_in_graded_code(call.excinfo, lab_dir, item.path.name)
        phase["imperative"] = call.excinfo.errisinstance(
            (pytest.skip.Exception, pytest.xfail.Exception)
        )
    if hasattr(report, "wasxfail"):
        phase["wasxfail"] = True
    _state["phases"].setdefault(item.nodeid, []).append(phase)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    time_limits.disarm()  # before the result is written: no hard stop after a recorded result
    phases = _state["phases"].pop(nodeid, [])
    outcome, message = _combine(phases)
    _emit(
        "result",
        nodeid=nodeid,
        outcome=outcome,
        duration=round(sum(p["duration"] for p in phases), 4),
        message=message,
    )


def _combine(phases: list[dict]) -> tuple[str, str]:
    """One outcome for setup + call + teardown: ``passed``, ``failed`` or ``skipped``."""
    for p in phases:
        if p["outcome"] == "failed":
            prefix = "" if p["when"] == "call" else f"error in test {p['when']}: "
            return "failed", prefix + p.get("message", "failed")
    for p in phases:
        if p["outcome"] == "skipped":
            if p.get("imperative") and p.get("from_graded_code"):
                return "failed", (
                    "the graded code called pytest.skip()/pytest.xfail(): a test skipped by the "
                    "code under test counts as failed"
                )
            if p.get("wasxfail") and not p.get("imperative"):
                return "skipped", "expected to fail (xfail marker): not graded"
            message = p.get("message", "skipped")
            return "skipped", re.sub(r"^Skipped: ", "", message)
    if not phases:
        return "failed", "the test did not run"
    return "passed", ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _emit("finish", exitstatus=int(exitstatus))
