"""``python -m grading``: grade the labs, print a score table, write ``results.json``.

    python -m grading                     # every labs/lab-*/test_lab.py, LAB_IMPL=starter
    python -m grading --lab 01            # one lab (or --lab lab-01-paged-attention-gather)
    LAB_IMPL=solution python -m grading   # the instructor's check: full marks

Points come from the tests' ``points(n)`` markers (default 1). Graded files are
``test_lab.py`` plus any instructor-only ``test_hidden*.py`` beside it (same conventions:
``impl = load_impl(__file__)``, ``points`` markers; ``make release`` leaves them out); other
test files in a lab folder (lab-02's conformance tests against the real vLLM) are not graded.

Each lab runs in its own ``pytest`` process with a per-test time limit (``--test-timeout``,
default 30 s, also bounding the import of the tests) and a limit for the whole lab
(``--lab-timeout``, default 180 s); see :mod:`grading.run.lab` for what happens when the
graded code crashes, hangs or cannot be imported.

Points: each test is worth its ``points(n)`` marker (default 1), times its lab's weight
(``--weight 04=2``, default 1); a lab's possible points are the sum over the tests collected
on this machine, and the report and ``results.json`` (``extra_data.possible``) give the
total. Tests that are skipped on this machine (``gpu`` without CUDA) are not counted:
"possible" is what this machine can grade. Tests that need triton where it is not installed
(macOS, Windows) are "not run on this machine": not failed, not counted, and the table says
so. A ``pytest.skip()`` raised from the graded code counts as a failure.

The graded code never runs in the process that records the grade: ``load_impl`` returns a
proxy and the student's module runs in a sandboxed worker (:mod:`grading.plugin.proxy`,
:mod:`grading.sandbox.lab_sandbox`): as another uid when the grader runs as root, else as a
separate process of the same user (the report says which). ``--no-sandbox`` runs it in the
test process, as plain pytest does.

The options: :func:`parse_args` reads the options (the limits and a few others have environment
defaults: ``GRADE_LAB_TIMEOUT``, ``GRADE_TEST_TIMEOUT``, ``GRADE_JOBS``, ``GRADE_SANDBOX``,
``GRADE_HIDDEN_VISIBILITY``); :func:`parse_weights` reads ``--weight 04=2`` (and
``GRADE_WEIGHTS``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common.loader import ALLOWED_IMPLS, lab_impl
from grading.run.calibration import Pending, load_factor
from grading.run.discovery import PROJECT_ROOT, discover_labs, select_labs
from grading.run.lab import grade
from grading.run.report import (
    DEFAULT_HIDDEN_VISIBILITY,
    GRADESCOPE_VISIBILITY,
    Report,
    Table,
    details,
    fmt_points,
    gradescope_results,
    not_run_lines,
    plain_summary,
    possible_line,
    problem_lines,
    slowest_line,
    write_json,
)
from grading.run.runner import (
    DEFAULT_LAB_TIMEOUT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RUN_TIMEOUT,
    DEFAULT_TEST_TIMEOUT,
    Options,
)
from grading.sandbox.host import SandboxRefused

# ---- arguments ---------------------------------------------------------------------------


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
        "--run-timeout",
        type=float,
        default=_env_float("GRADE_RUN_TIMEOUT", DEFAULT_RUN_TIMEOUT),
        help=f"wall-clock seconds for the whole run (default {DEFAULT_RUN_TIMEOUT:g}, env "
        "GRADE_RUN_TIMEOUT); labs not started by then score 0, not run",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help=f"re-runs of a lab after a crash (default {DEFAULT_MAX_RESTARTS})",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m grading",
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


# ---- cli ---------------------------------------------------------------------------------


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


def _load_factor(argv: list[str] | None, calibration: Pending | None = None) -> float:
    """The calibration's factor (:func:`grading.run.calibration.load_factor`, or the one
    ``calibration`` computed meanwhile) for the default limits; 1 when the limits were given
    (``--test-timeout``, ``GRADE_TEST_TIMEOUT``...)."""
    given = sys.argv[1:] if argv is None else argv
    if any(a.startswith(("--test-timeout", "--lab-timeout")) for a in given) or any(
            os.environ.get(n) for n in ("GRADE_TEST_TIMEOUT", "GRADE_LAB_TIMEOUT")):
        if calibration is not None:
            calibration.cancel()
        return 1.0
    return calibration.result() if calibration is not None else load_factor()


def main(argv: list[str] | None = None, calibration: Pending | None = None) -> int:
    """The grader's command line; ``calibration``: the load calibration, already started
    (``python -m grading`` starts it before importing the grader)."""
    try:
        return _main(argv, calibration)
    finally:
        if calibration is not None:
            calibration.cancel()  # an early return (bad arguments): the child is not left


def _main(argv: list[str] | None, calibration: Pending | None) -> int:
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
    factor = _load_factor(argv, calibration)
    opts = Options(
        root=root,
        impl=impl,
        lab_timeout=args.lab_timeout * factor,
        test_timeout=args.test_timeout * factor,
        max_restarts=args.max_restarts,
        sandbox=args.sandbox,
        run_timeout=args.run_timeout,
    )
    results_path = (args.results or root / "results.json").resolve()
    show_details = args.details if args.details is not None else len(labs) == 1
    try:
        report = _grade_and_show(args, opts, labs, weights, results_path, show_details)
    except SandboxRefused as exc:  # as root without the user switch: no grade at all
        print(f"\n{exc}", file=sys.stderr)
        return 3
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
        f"test, {opts.lab_timeout:g} s per lab ({opts.lab_bound():g} s with timed-out tests), "
        f"{opts.run_timeout:g} s in all\n"
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
            say(slowest_line(lab, opts.test_timeout))
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
