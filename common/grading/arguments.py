"""The grader's command line (``python -m common.grading``): its options and ``--weight``.

:func:`parse_args` reads the options (the limits and a few others have environment
defaults: ``GRADE_LAB_TIMEOUT``, ``GRADE_TEST_TIMEOUT``, ``GRADE_JOBS``, ``GRADE_SANDBOX``,
``GRADE_HIDDEN_VISIBILITY``); :func:`parse_weights` reads ``--weight 04=2`` (and
``GRADE_WEIGHTS``). :mod:`common.grading.cli` runs the grading.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from common.grading.discovery import PROJECT_ROOT, select_labs
from common.grading.gradescope import DEFAULT_HIDDEN_VISIBILITY, GRADESCOPE_VISIBILITY
from common.grading.runner import DEFAULT_LAB_TIMEOUT, DEFAULT_MAX_RESTARTS, DEFAULT_TEST_TIMEOUT
from common.loader import ALLOWED_IMPLS


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _add_limits(p: argparse.ArgumentParser) -> None:
    lab, test = DEFAULT_LAB_TIMEOUT, DEFAULT_TEST_TIMEOUT
    p.add_argument(
        "--lab-timeout",
        type=float,
        default=_env_float("GRADE_LAB_TIMEOUT", lab),
        help=f"wall-clock seconds per lab (default {lab:g}, env GRADE_LAB_TIMEOUT)",
    )
    p.add_argument(
        "--test-timeout",
        type=float,
        default=_env_float("GRADE_TEST_TIMEOUT", test),
        help=f"seconds per test (default {test:g}, env GRADE_TEST_TIMEOUT)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help=f"re-runs of a lab after a crash (default {DEFAULT_MAX_RESTARTS})",
    )


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
    _add_limits(p)
    _add_output_options(p)
    return p.parse_args(argv)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """How the run goes and what it prints: jobs, details, the sandbox, weights..."""
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
    p.add_argument(
        "--sandbox",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("GRADE_SANDBOX", "1").strip() not in ("0", "no", "off"),
        help="run the graded code in a sandboxed worker (default; env GRADE_SANDBOX=0 to "
        "turn off)",
    )
    p.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="NN=FACTOR",
        help="multiply the points of a lab's tests (repeat; env GRADE_WEIGHTS=04=2,05=0.5)",
    )
    p.add_argument(
        "--hidden-visibility",
        choices=sorted(GRADESCOPE_VISIBILITY),
        default=os.environ.get("GRADE_HIDDEN_VISIBILITY", DEFAULT_HIDDEN_VISIBILITY),
        help="Gradescope visibility of test_hidden*.py tests (default after_published)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only the total")


def parse_weights(specs: list[str], labs: list[Path]) -> dict[str, float]:
    """``["04=2", "lab-05=0.5"]`` -> ``{lab folder name: factor}``; ``ValueError`` if bad."""
    weights: dict[str, float] = {}
    for spec in (s.strip() for w in specs for s in w.split(",")):
        if not spec:
            continue
        name, eq, factor = spec.partition("=")
        if not eq:
            raise ValueError(f"--weight {spec!r}: write LAB=FACTOR, e.g. 04=2")
        value = float(factor)
        if not value >= 0:
            raise ValueError(f"--weight {spec!r}: the factor must be >= 0")
        for lab in select_labs(labs, [name]):
            weights[lab.name] = value
    return weights
