"""``python -m common.grading``: grade the labs, print a score table, write ``results.json``.

    python -m common.grading                     # every labs/lab-*/test_lab.py, LAB_IMPL=starter
    python -m common.grading --lab 01            # one lab (or --lab lab-01-paged-attention-gather)
    LAB_IMPL=solution python -m common.grading   # the instructor's check: full marks

Points come from the tests' ``points(n)`` markers (default 1). Graded files are
``test_lab.py`` plus any instructor-only ``test_hidden*.py`` beside it (same conventions:
``impl = load_impl(__file__)``, ``points`` markers; ``make release`` leaves them out); other
test files in a lab folder (lab-02's conformance tests against the real vLLM) are not graded.

Each lab runs in its own ``pytest`` process with a per-test time limit (``--test-timeout``,
default 30 s, also bounding the import of the tests) and a limit for the whole lab
(``--lab-timeout``, default 180 s); see :mod:`common.grading.lab` for what happens when the
graded code crashes, hangs or cannot be imported.

Points: each test is worth its ``points(n)`` marker (default 1), times its lab's weight
(``--weight 04=2``, default 1); a lab's possible points are the sum over the tests collected
on this machine, and the report and ``results.json`` (``extra_data.possible``) give the
total. Tests that are skipped on this machine (``gpu`` without CUDA) are not counted:
"possible" is what this machine can grade. Tests that need triton where it is not installed
(macOS, Windows) are "not run on this machine": not failed, not counted, and the table says
so. A ``pytest.skip()`` raised from the graded code counts as a failure.

The graded code never runs in the process that records the grade: ``load_impl`` returns a
proxy and the student's module runs in a sandboxed worker (:mod:`common.grading.proxy`,
:mod:`common.grading.sandbox`): as another uid when the grader runs as root, else as a
separate process of the same user (the report says which). ``--no-sandbox`` runs it in the
test process, as plain pytest does.

The options are :mod:`common.grading.arguments`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common.grading.arguments import parse_args, parse_weights
from common.grading.discovery import discover_labs, select_labs
from common.grading.gradescope import gradescope_results, write_json
from common.grading.lab import grade
from common.grading.report import (
    Table,
    details,
    fmt_points,
    not_run_lines,
    plain_summary,
    possible_line,
    problem_lines,
)
from common.grading.results import Report
from common.grading.runner import Options
from common.loader import ALLOWED_IMPLS, lab_impl

__all__ = ["main", "parse_args", "parse_weights"]


def _choose(args: argparse.Namespace) -> tuple[str, Path, list[Path]]:
    """What to grade: (impl, root, labs); ``ValueError`` with the message for the user."""
    impl = args.impl or lab_impl(default="starter")  # the grader grades starters unless told
    if impl not in ALLOWED_IMPLS:
        raise ValueError(f"LAB_IMPL={impl!r} is not allowed: use one of {', '.join(ALLOWED_IMPLS)}")
    root = args.root.resolve()
    labs = select_labs(discover_labs(root), args.lab)
    if not labs:
        raise ValueError(f"no labs found: nothing matches {root}/labs/lab-*/test_lab.py")
    return impl, root, labs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        impl, root, labs = _choose(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        env_weights = [os.environ["GRADE_WEIGHTS"]] if os.environ.get("GRADE_WEIGHTS") else []
        weights = parse_weights(env_weights + args.weight, discover_labs(root))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    opts = Options(
        root=root,
        impl=impl,
        lab_timeout=args.lab_timeout,
        test_timeout=args.test_timeout,
        max_restarts=args.max_restarts,
        sandbox=args.sandbox,
    )
    results_path = (args.results or root / "results.json").resolve()
    show_details = args.details if args.details is not None else len(labs) == 1
    report = _grade_and_show(args, opts, labs, weights, results_path, show_details)
    write_json(
        results_path,
        gradescope_results(report, plain_summary(report), hidden_visibility=args.hidden_visibility),
    )
    pct = _print_score(report, results_path)
    if impl == "starter" and report.earned < report.possible and not (args.quiet or show_details):
        one = " LAB=NN" if len(labs) > 1 else ""
        print(
            f"Each failing test says what is wrong: `make grade{one}` lists them, or run "
            f"`LAB_IMPL=starter {_display(Path(sys.executable))} -m pytest labs/<lab> -x -q`."
        )
    return 1 if args.fail_under is not None and pct < args.fail_under else 0


def _grade_and_show(args: argparse.Namespace, opts: Options, labs: list[Path],
                    weights: dict[str, float], results_path: Path, show_details: bool
                    ) -> Report:
    """Grade ``labs``, printing the table (row by row as labs finish, when one at a time),
    what was not run, the details and the problems."""
    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    table = Table([lab.name for lab in labs], color=color)
    live = args.jobs <= 1 and not args.quiet

    def say(text: str = "") -> None:
        if not args.quiet:
            print(text, flush=True)

    say(
        f"Grading {opts.impl}.py of {len(labs)} lab(s): at most {opts.test_timeout:g} s per "
        f"test, {opts.lab_timeout:g} s per lab\n"
    )
    say(table.header())
    report = grade(
        labs,
        opts,
        jobs=args.jobs,
        on_done=(lambda r: say(table.row(r))) if live else None,
        weights=weights,
        results_file=results_path,
        top_level=True,
    )
    if not live:
        for lab in report.labs:
            say(table.row(lab))
    say(table.footer(report))
    say(f"  {possible_line(report)}\n  Sandbox: {report.sandbox}")
    if not_run_lines(report):
        say(not_run_lines(report))
    if show_details:
        ascii_only = "utf" not in (sys.stdout.encoding or "").lower()
        for lab in report.labs:
            say(details(lab, ascii_only))
    notes = problem_lines(report)
    if notes:
        say(notes)
    return report


def _print_score(report: Report, results_path: Path) -> float:
    """The last line: the score, its percentage and where results.json is; returns the %."""
    pct = 100.0 * report.earned / report.possible if report.possible else 100.0
    print(
        f"\nScore: {fmt_points(report.earned)} / {fmt_points(report.possible)} ({fmt_points(pct)}%)"
        f"  ->  {_display(results_path)}"
    )
    return pct


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
