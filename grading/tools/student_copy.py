"""The student copy's README and Makefile, written for a student, and a check that they are.

Text that is only for the instructor's tree (solutions, instructor commands) is marked
where it is written, in any Markdown file or the Makefile::

    <!-- >>> not in the student copy (`make release` drops this block) -->
    ...
    <!-- <<< not in the student copy -->

    # >>> not in the student copy (`make release` drops this block)
    ...
    # <<< not in the student copy

``make release`` removes each block (markers included), puts a "Student copy" section
(set-up, working on a lab, grading yourself, submitting) under the README's title, and then
checks the copy's documents: no instructor command (``make release``, ``make autograder``,
``make mutants``), no ``LAB_IMPL=solution``, no ``make`` target the copy's Makefile lacks,
no bare ``pytest``/``python`` command (the venv's interpreter, or ``make``), and no file the
copy does not have (``solution.py``, a dropped ``figures.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "<!-- student copy: section written by grading/tools/student_copy.py -->"
BLOCK_START, BLOCK_END = ">>> not in the student copy", "<<< not in the student copy"

INSTRUCTOR_WORDS = [
    (re.compile(r"\bmake (release|autograder|mutants)\b"), "an instructor command"),
    (re.compile(r"\bgrading\.tools\.(release|autograder|mutants)\b"), "an instructor command"),
    (re.compile(r"\bfor instructors\b", re.IGNORECASE), "an instructor section"),
    (re.compile(r"LAB_IMPL=solution\b"), "LAB_IMPL=solution (there is no solution here)"),
    (re.compile(r"(?<![\w/.-])(?<!-m )pytest (?=labs/|tests/|-)"), "a bare pytest (use .venv)"),
    (re.compile(r"(?<![\w/.\\-])python3? (?=labs/|tests/|-m pytest)"), "a bare python (use .venv)"),
]
MAKE_TARGET = re.compile(r"(?:^\s*|`)make ([a-z][\w-]*)")  # `make x`, or a code line of it
PY_FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b")
FENCE = re.compile(r"^\s*```")


def strip_instructor_blocks(text: str) -> str:
    """``text`` without its not-in-the-student-copy blocks; ``ValueError`` if one is open."""
    out, inside = [], False
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if BLOCK_START in line:
            if inside:
                raise ValueError(f"line {number}: a not-in-the-student-copy block inside another")
            inside = True
        elif BLOCK_END in line:
            if not inside:
                raise ValueError(f"line {number}: a not-in-the-student-copy block ends, none began")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("a not-in-the-student-copy block is never closed")
    return re.sub(r"\n{3,}", "\n\n", "".join(out))


def student_section(labs: list[str]) -> str:
    first = labs[0] if labs else "lab-00-online-softmax"
    number = re.match(r"lab-(\d+)", first)
    nn = number.group(1) if number else "00"
    listing = "\n".join(f"- [`labs/{lab}/`](labs/{lab}/README.md)" for lab in labs)
    return f"""{MARKER}
## Student copy: how to work on the labs and grade yourself

This copy has everything except the solutions. In every lab you complete `starter.py`;
`test_lab.py` is the specification and the grader. You need Python 3.10–3.13 and `make`.

1. **Set up once:** `make setup` creates `.venv` with the pinned packages of
   `requirements-cpu.txt` (torch 2.13.0, triton on Linux, numpy, pytest, hypothesis,
   matplotlib); later commands install nothing. On Linux without a GPU, run
   `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu`: PyPI's Linux torch is the
   CUDA build (about 2.8 GB with its CUDA libraries). No GPU is needed: Triton kernels run
   on the CPU through Triton's interpreter. triton publishes Linux wheels only: on a Mac or
   Windows the numpy half of every lab runs and the Triton tests are reported "not run"
   (see "Which laptop?" in PLATFORMS.md for WSL2 and the dev container).
2. **Work on a lab:** edit `labs/<lab>/starter.py` and run its tests, stopping at the first
   failure:

   ```bash
   LAB_IMPL=starter .venv/bin/python -m pytest labs/{first} -x -q
   ```

   Each failing test says what is wrong (for example "NaN reached the output ... a loop
   bound or mask is wrong"), not just that two arrays differ.
3. **Grade yourself:** `make grade LAB={nn}` grades one lab and lists every test with its
   points and message; `make grade` grades every lab. You get a table (points earned /
   possible, tests passed, time) and `results.json`, the file Gradescope reads.

The grader runs each lab in its own process: a test that loops forever fails after 30 s
and costs only itself, code that crashes loses the test it crashed in, and the table says
why. A failing property-based test stops at the first example it fails on and prints it.
`make test` here runs the tests on your starters, so it fails until every lab is solved.
The README figures were drawn from the reference solutions, which are not in this copy.

**Submitting to Gradescope:** upload your `starter.py` files, either in their folders
(`labs/{first}/starter.py` or `{first}/starter.py`, a zip of the `labs/` folder works) or
renamed after their lab (`lab{nn}_starter.py`, `lab-{nn}-starter.py`). A lab you do not
upload is graded from the untouched starter (0 points). Only `starter.py` is graded: keep
your code in it.

The labs:

{listing}

---

"""


def student_readme(text: str, labs: list[str]) -> str:
    """The course README for a student: its title, the student section, the rest."""
    if MARKER in text:  # a copy of a copy: replace the old section
        before, _, after = text.partition(MARKER)
        text = before + after.partition("\n---\n\n")[2]
    text = strip_instructor_blocks(text)
    title, rest = "", text
    if text.startswith("# "):  # keep the course title first
        title, _, rest = text.partition("\n")
        title += "\n\n"
    return title + student_section(labs) + rest.lstrip("\n")


def make_targets(makefile: str) -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*)\s*::?(?!=)", makefile, re.MULTILINE))


def _lines(text: str, markdown: bool) -> list[tuple[int, str, bool]]:
    """(number, line, is code) for the lines a reader follows: a Makefile's non-comment
    lines (all code), every line of a document (code inside fenced blocks)."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if MARKER in line:
            continue
        if markdown:
            if FENCE.match(line):
                fenced = not fenced
                continue
            out.append((number, line, fenced))
        elif not line.lstrip().startswith("#"):
            out.append((number, line, True))
    return out


def _problems_in(rel: Path, text: str, targets: set[str], missing: set[str]) -> list[str]:
    problems = []
    markdown = rel.suffix == ".md"
    for number, line, code in _lines(text, markdown):
        where = f"{rel}:{number}"
        for pattern, what in INSTRUCTOR_WORDS:
            if pattern.search(line):
                problems.append(f"{where}: {what}: {line.strip()[:100]}")
        for match in MAKE_TARGET.finditer(line) if markdown else ():
            backticked = match.group(0).startswith("`")
            if (code or backticked) and targets and match.group(1) not in targets:
                problems.append(f"{where}: `make {match.group(1)}` is not a target of the Makefile")
        for name in PY_FILE.findall(line):
            if Path(name).name in missing:
                problems.append(f"{where}: refers to {name}, which the student copy does not have")
    return problems


def coherence_problems(out: Path, documents: list[Path], dropped: list[Path]) -> list[str]:
    """Lines of the copy's ``documents`` (relative paths) that a student cannot follow.

    ``dropped``: the files left out of the copy; a document naming one of them (by path or
    file name) is a problem unless the copy has a file of that name where the name points.
    """
    makefile = out / "Makefile"
    targets = make_targets(makefile.read_text(encoding="utf-8")) if makefile.is_file() else set()
    missing = {rel.name for rel in dropped}
    problems = []
    for rel in documents:
        text = (out / rel).read_text(encoding="utf-8", errors="replace")
        problems += [
            p for p in _problems_in(rel, text, targets, missing) if not _present(out, rel, p)
        ]
    return problems


def _present(out: Path, rel: Path, problem: str) -> bool:
    """A "refers to X" problem where X is in fact in the copy (e.g. another lab's file)."""
    m = re.search(r"refers to (\S+), which", problem)
    return bool(m) and ((out / m.group(1)).is_file() or (out / rel.parent / m.group(1)).is_file())
