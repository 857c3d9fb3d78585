"""The grade as Gradescope reads it: ``results.json``, checked and written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.grading.report import markdown_block
from common.grading.results import Report


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
                    "not_run": lab.not_run,
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


def _number(x: Any) -> bool:
    """A finite int or float (not a bool): what Gradescope accepts as a score."""
    return (
        isinstance(x, int | float) and not isinstance(x, bool) and x == x and abs(x) != float("inf")
    )


def _top_level_problems(results: dict[str, Any]) -> list[str]:
    problems = []
    if "score" in results and not _number(results["score"]):
        problems.append("score is not a finite number")
    if "score" not in results and not all("score" in t for t in results.get("tests", [])):
        problems.append("no top-level score and a test without score")
    if not isinstance(results.get("tests", []), list):
        problems.append("tests is not a list")
    if results.get("visibility", "visible") not in GRADESCOPE_VISIBILITY:
        problems.append("bad top-level visibility")
    return problems


def _test_problems(i: int, t: dict[str, Any]) -> list[str]:
    problems = [
        f"tests[{i}].{key} is not a finite number"
        for key in ("score", "max_score")
        if key in t and not _number(t[key])
    ]
    if not isinstance(t.get("name", ""), str) or not isinstance(t.get("output", ""), str):
        problems.append(f"tests[{i}] name/output must be strings")
    if t.get("visibility", "visible") not in GRADESCOPE_VISIBILITY:
        problems.append(f"tests[{i}].visibility is not one of {sorted(GRADESCOPE_VISIBILITY)}")
    if t.get("status", "passed") not in ("passed", "failed"):
        problems.append(f"tests[{i}].status must be passed or failed")
    if _number(t.get("score")) and _number(t.get("max_score")) and t["score"] > t["max_score"]:
        problems.append(f"tests[{i}] scores more than its max_score")
    return problems


def validate_gradescope(results: dict[str, Any]) -> list[str]:
    """Problems with ``results`` as a Gradescope results.json (empty list: valid)."""
    problems = _top_level_problems(results)
    for i, t in enumerate(results.get("tests", [])):
        problems += _test_problems(i, t)
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
