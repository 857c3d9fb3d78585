"""pytest plugin: every test's outcome, markers and skip reason, as JSON.

    PYTEST_OUTCOMES=out.json python -m pytest -p tools.pytest_outcomes ...

Used by ``tests/test_setup_no_triton.py`` to check a run where triton is unimportable.
Records ``{nodeid: {"outcome", "markers", "reason"}}``; a module that fails to import is
recorded with outcome ``"error"``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

MARKERS = ("triton", "gpu", "vllm", "setup", "slow")
_records: dict[str, dict[str, Any]] = {}


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, "Skipped: reason")
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr)[-1500:]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _records[report.nodeid] = {"outcome": "error", "markers": [], "reason": _reason(report)}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record = _records.setdefault(
        report.nodeid,
        {
            "outcome": "passed",
            "markers": [m for m in MARKERS if m in report.keywords],
            "reason": "",
        },
    )
    if report.failed:
        record.update(
            outcome="failed" if report.when == "call" else "error", reason=_reason(report)
        )
    elif report.skipped and record["outcome"] == "passed":
        record.update(outcome="skipped", reason=_reason(report))


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("PYTEST_OUTCOMES")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_records, f, indent=1, sort_keys=True)
