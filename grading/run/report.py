"""What grading produces, and the two ways it is shown.

:class:`TestResult`, :class:`LabResult` and :class:`Report`: one test's result, one lab's,
the whole run's. The grade as text: the terminal table (printable row by row), the reasons
behind its notes, and the per-test details. The grade as Gradescope reads it:
``results.json`` (:func:`gradescope_results`), checked (:func:`validate_gradescope`) and
written atomically (:func:`write_json`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ---- results -----------------------------------------------------------------------------


# conftest.py skips a test this machine cannot run (no triton installed) with a reason that
# starts with this: "not run on this machine", neither failed nor in the possible points.
NOT_RUN = "not run:"


@dataclass
class TestResult:
    nodeid: str
    name: str
    points: float
    outcome: str  # "passed" | "failed" | "skipped"
    message: str = ""
    duration: float = 0.0

    @property
    def hidden(self) -> bool:
        """From an instructor's ``test_hidden*.py`` (never released to students)."""
        return self.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].startswith("test_hidden")

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
    weight: float = 1.0  # every test's points were multiplied by it (--weight)

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
        """Tests not graded here: skipped (``gpu`` without CUDA) or not run (no triton)."""
        return sum(t.outcome == "skipped" for t in self.tests)

    @property
    def not_run(self) -> int:
        """Skipped tests this machine cannot run (triton is not installed)."""
        return sum(t.outcome == "skipped" and t.message.startswith(NOT_RUN) for t in self.tests)

    def note(self) -> str:
        """A few words for the table; the full reasons are in ``problems``."""
        notes = list(dict.fromkeys(tag(p) for p in self.problems))
        if self.count_source.startswith("static"):
            notes.append("points estimated")
        if self.not_run:
            notes.append(f"{self.not_run} not run on this machine")
        if self.skipped > self.not_run:
            notes.append(f"{self.skipped - self.not_run} skipped, not counted")
        return ", ".join(notes)


@dataclass
class Report:
    impl: str
    labs: list[LabResult]
    duration: float
    sandbox: str = ""  # how the graded code was isolated, in words

    @property
    def earned(self) -> float:
        return sum(lab.earned for lab in self.labs)

    @property
    def possible(self) -> float:
        return sum(lab.possible for lab in self.labs)


TAGS = (
    (r"^skipped", "skipped"),
    (r"^no tests were collected", "no tests"),
    (r"^could not import the tests", "tests cannot be imported"),
    (r"^(\w+\.py) cannot be imported", r"\1 cannot be imported"),
    (r"timed out after ([\d.]+) s", r"timed out (\1 s)"),
    (r"crashed with signal (\w+)", r"crashed (\1)"),
    (r"interpreter exited with code (-?\d+)", r"exited (code \1)"),
    (r"interrupted", "interrupted"),
    (r"grader error", "grader error"),
)


def tag(problem: str) -> str:
    """``crashed with signal SIGSEGV (...) during test_x`` -> ``crashed (SIGSEGV)``."""
    for pattern, words in TAGS:
        m = re.search(pattern, problem)
        if m:
            return m.expand(words)
    return "stopped early"


# ---- report ------------------------------------------------------------------------------


def fmt_points(x: float) -> str:
    """``5``, ``47.5``, ``0.25``: no trailing zeros."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


class Table:
    """The terminal table, printable row by row as labs finish.

    Formatted here, not by a table library: ``tabulate`` sizes its columns from all the rows,
    so it cannot print a lab's row the moment the lab ends (the widths are known up front
    here: the lab names); ``rich`` can (a live table) but brings ``pygments`` and
    ``markdown-it-py`` into every student's install, which has neither, for four
    fixed-width columns and one colour code.
    """

    def __init__(self, names: list[str], color: bool = False) -> None:
        self.width = max([len("Total"), len("Lab"), *map(len, names)])
        self.color = color

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _rule(self) -> str:
        return "  " + "-" * (self.width + 51)

    def header(self) -> str:
        head = f"  {'Lab':<{self.width}}  {'Points':>17}  {'Tests passed':>12}  {'Time':>7}  Notes"
        return head + "\n" + self._rule()

    def row(self, lab: LabResult | Report) -> str:
        earned, possible = lab.earned, lab.possible
        # Tests worth points only: a 0-point check of given code passes on an untouched starter
        scored = [t for x in (lab.labs if isinstance(lab, Report) else [lab]) for t in x.graded
                  if t.points > 0]
        passed, graded = sum(t.outcome == "passed" for t in scored), len(scored)
        note, name = ("", "Total") if isinstance(lab, Report) else (lab.note(), lab.name)
        full = possible > 0 and earned >= possible
        points = f"{fmt_points(earned) + ' / ' + fmt_points(possible):>17}"
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


def not_run_lines(report: Report) -> str:
    """Why some tests were not run on this machine ("" when every test could run)."""
    count = sum(lab.not_run for lab in report.labs)
    if not count:
        return ""
    reasons = {
        t.message.removeprefix(NOT_RUN).strip()
        for lab in report.labs
        for t in lab.tests
        if t.outcome == "skipped" and t.message.startswith(NOT_RUN)
    }
    return (
        f"\nNot run on this machine: {count} test(s), neither failed nor counted in the "
        "possible points above.\n" + "\n".join(f"  {reason}" for reason in sorted(reasons))
    )


def possible_line(report: Report) -> str:
    """Where the possible total comes from (what an instructor enters as the total)."""
    tests = sum(len(lab.graded) for lab in report.labs)
    weighted = [f"{lab.name} x{fmt_points(lab.weight)}" for lab in report.labs if lab.weight != 1]
    return (
        f"Possible: {fmt_points(report.possible)} points, the sum of the points of the "
        f"{tests} tests collected on this machine"
        + (f" (weights: {', '.join(weighted)})" if weighted else "")
    )


def plain_summary(report: Report) -> str:
    """The table and the reasons, without colours (Gradescope's top-level output)."""
    table = Table([lab.name for lab in report.labs])
    lines = [table.header(), *map(table.row, report.labs), table.footer(report)]
    extra = "\n" + possible_line(report)
    if report.sandbox:
        extra += f"\nSandbox: {report.sandbox}"
    return "\n".join(lines) + extra + not_run_lines(report) + problem_lines(report)


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
        if t.outcome == "failed" and hint_line(lab.name, t):
            lines.append(f"              {hint_line(lab.name, t)}")
    return "\n".join(lines)


def hint_line(lab_name: str, t: TestResult) -> str:
    """``see: make hint LAB=00 STEP=2 LEVEL=2`` for a failed test of a lab with hints: the
    step and level its misconception points to (labs/hints.py), or ``""``."""
    try:  # the course's hints, read from the repository's lab folder (a tree of labs
        from labs import hints  # graded with --root may have none)
        from labs.manifest import LABS_DIR
    except ImportError:
        return ""

    lab_dir = LABS_DIR / lab_name
    if t.hidden or not (lab_dir / "HINTS.md").is_file():
        return ""
    command = hints.hint_command(lab_dir, t.name, t.message)
    return f"see: {command}" if command else ""


def slowest_line(lab: LabResult, limit: float) -> str:
    """The lab's slowest test against the per-test limit it ran under (a share of the
    limit: how close a correct solution came to timing out on this machine, at this load)."""
    ran = [t for t in lab.tests if t.outcome != "skipped"]
    if not ran or limit <= 0:
        return ""
    t = max(ran, key=lambda t: t.duration)
    return (f"  slowest test: {t.name}, {t.duration:.1f} s of its {limit:g} s limit "
            f"({t.duration / limit:.0%})")


# ---- gradescope --------------------------------------------------------------------------


DEFAULT_HIDDEN_VISIBILITY = "after_published"


def redact_hidden(text: str, report: Report) -> str:
    """``text`` with the names of hidden tests replaced by "a hidden test"."""
    for lab in report.labs:
        for t in lab.tests:
            if t.hidden and t.name:
                text = text.replace(t.name, "a hidden test")
    return text


def gradescope_results(
    report: Report, summary: str = "", hidden_visibility: str = DEFAULT_HIDDEN_VISIBILITY
) -> dict[str, Any]:
    """The dict Gradescope reads from ``/autograder/results/results.json``.

    Tests of an instructor's ``test_hidden*.py`` get ``hidden_visibility`` (default
    ``after_published``: name, score and failure output appear once the grades are
    published); their names are kept out of the top-level output. ``extra_data.possible``
    is the total of the tests collected on this machine: the assignment's total points.
    """
    if hidden_visibility not in GRADESCOPE_VISIBILITY:
        raise ValueError(f"hidden_visibility={hidden_visibility!r}: one of "
                         f"{sorted(GRADESCOPE_VISIBILITY)}")
    tests = []
    for lab in report.labs:
        for t in lab.graded:
            tests.append(
                {
                    "name": f"{lab.name} › {t.name}",
                    "score": round(t.earned, 4),
                    "max_score": round(t.points, 4),
                    "status": "passed" if t.outcome == "passed" else "failed",
                    "output": "\n".join(filter(None, [t.message, hint_line(lab.name, t)
                                                       if t.outcome == "failed" else ""])),
                    "visibility": hidden_visibility if t.hidden else "visible",
                }
            )
    summary = redact_hidden(summary, report)
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
            "sandbox": report.sandbox,
            "hidden_tests": sum(t.hidden for lab in report.labs for t in lab.graded),
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
                    "problems": [redact_hidden(p, report) for p in lab.problems],
                    "counted_by": lab.count_source,
                    "weight": lab.weight,
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
