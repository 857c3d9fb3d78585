"""What grading produces: one test's result, one lab's, the whole run's."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
