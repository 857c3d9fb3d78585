"""make mutants' ``# expect:`` rule (grading/tools/mutants.py), on made-up mutants (not graded)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grading.tools.mutants import names_it, parse_mutant, shared_status

MUTANT = """# the scale forgotten
# expect: forgot the 1/sqrt(d) scale
<<<<<<< find
    a = 1
=======
    a = 2
>>>>>>> replace
"""


def test_a_mutant_s_expected_words_are_read_and_not_taken_for_its_description(tmp_path):
    path = tmp_path / "m.mutant"
    path.write_text(MUTANT)
    mutant = parse_mutant(path, "lab-00")
    assert (mutant.description, mutant.expect) == ("the scale forgotten",
                                                   "forgot the 1/sqrt(d) scale")


def test_the_words_are_found_across_pytest_s_line_breaks_and_case():
    output = ("E       AssertionError: SDPA out is wrong: Forgot the 1/sqrt(d)\n"
              "E         scale\nFAILED test_x")
    assert names_it(output, "forgot the 1/sqrt(d) scale")
    assert not names_it("E   AssertionError: out differs from the float64 reference",
                        "forgot the 1/sqrt(d) scale")


def test_a_shared_mutant_is_killed_when_one_run_fails_naming_it():
    """A mutant of common/ runs against every lab and course test using the module: one run
    that fails with the words kills it; runs that fail without them do not."""
    assert shared_status(["SURVIVED", "UNNAMED", "killed"]) == "killed"
    assert shared_status(["SURVIVED", "UNNAMED", "UNNAMED"]) == "UNNAMED"
    assert shared_status(["SURVIVED", "BROKEN"]) == "BROKEN"
    assert shared_status(["SURVIVED", "SURVIVED"]) == "SURVIVED"


# ---- the course's own mutants: each names its misconception, each README row has one ----------

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "tests" / "mutants"  # dropped from the student copy: these tests then skip
LABS = sorted(p for p in (ROOT / "labs").glob("lab-*") if (p / "README.md").is_file())
FOLDERS = sorted(p for p in MUTANTS.glob("*") if p.is_dir()) if MUTANTS.is_dir() else []
# Not done yet (the next round's work): {folder: mutants still without '# expect:' words} and
# {lab: Misconceptions rows no named mutant ties to yet}. A count may only go down; a lab that
# is done leaves the table. Done: every lab and common (a shared mutant's words must hold in
# at least one run that fails: make mutants' rule). A new lab starts here, never a done one.
PENDING_EXPECT: dict[str, int] = {}
PENDING_ROWS: dict[str, int] = {}


def _plain(text: str) -> str:
    """Lower case, code spans unquoted, one space between words."""
    return " ".join(text.replace("`", "").lower().split())


def misconception_rows(readme: Path) -> list[str]:
    """The first cell of each body row of the README's ``## Misconceptions`` table."""
    text = readme.read_text(encoding="utf-8")
    section = text.split("\n## Misconceptions", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines()
            if r.startswith("|") and not re.match(r"\|[\s|:-]+\|?$", r)]
    return [re.split(r"(?<!\\)\|", row)[1].strip() for row in rows[1:]]


def _header(path: Path, key: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in path.read_text().splitlines()
            if line.startswith(f"# {key}:")]


@pytest.mark.skipif(not FOLDERS, reason="no tests/mutants here (a student copy)")
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_mutant_names_the_words_its_failure_message_must_hold(folder):
    """A kill counts only when the failing test names the mistake (``# expect:``)."""
    missing = [p.name for p in sorted(folder.glob("*.mutant")) if not any(_header(p, "expect"))]
    assert len(missing) <= PENDING_EXPECT.get(folder.name, 0), (
        f"{folder.name}: mutants without an '# expect: words' line (the words the failing "
        f"test's message must hold): {missing}")


@pytest.mark.skipif(not FOLDERS, reason="no tests/mutants here (a student copy)")
@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_misconceptions_row_has_a_mutant_whose_message_names_it(lab):
    """Each row of the lab README's Misconceptions table is tied to a planted mistake by a
    ``# misconception: words`` line (words the row holds); that mutant has ``# expect:``
    words, so ``make mutants`` requires the test that kills it to name the misconception."""
    rows = [_plain(r) for r in misconception_rows(lab / "README.md")]
    tied = {row: [] for row in rows}
    stale = []
    for path in sorted((MUTANTS / lab.name).glob("*.mutant")):
        for words in _header(path, "misconception"):
            hits = [row for row in rows if _plain(words) in row]
            if not hits:
                stale.append(f"{path.name}: {words!r}")
            for row in hits:
                tied[row].append(path)
    assert not stale, (f"{lab.name}: '# misconception:' words that no row of the README's "
                       "Misconceptions table holds:\n  " + "\n  ".join(stale))
    unnamed = [p.name for paths in tied.values() for p in paths if not any(_header(p, "expect"))]
    untied = [row for row, paths in tied.items()
              if not [p for p in paths if any(_header(p, "expect"))]]
    assert len(untied) <= PENDING_ROWS.get(lab.name, 0), (
        f"{lab.name}/README.md: Misconceptions rows no named mutant ties to (add '# "
        "misconception: <words of the row>' and '# expect:' to the mutant that plants it):\n  "
        + "\n  ".join(untied))
    assert not unnamed or lab.name in PENDING_EXPECT, (
        f"{lab.name}: row mutants without '# expect:' words: {unnamed}")
