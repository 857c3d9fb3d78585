"""The grade as text: the terminal table (printable row by row), the reasons behind its
notes, and the per-test details."""

from __future__ import annotations

from common.grading.results import NOT_RUN, LabResult, Report


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
    return "\n".join(lines)
