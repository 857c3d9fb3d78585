"""Build the student copy of the course: everything except the solutions.

    python -m grading.tools.release --out ../student-copy    # make release OUT=../student-copy
    python -m grading.tools.release --out ../student-copy --force  # ... FORCE=1

What is copied (:func:`candidate_files`): the files git knows (tracked, plus untracked ones
that ``.gitignore`` does not exclude), or, outside a git checkout, every file; never
``.git``, virtual environments, caches, ``results.json`` or build output.

What is left out, and checked afterwards in the output folder:
- every ``solution.py`` (and ``solution_*.py``, ``*_solution.py``, ``solutions/``;
  :func:`is_solution_file`);
- instructors' hidden tests (``labs/<lab>/test_hidden*.py``, graded by ``make grade``) and
  planted mistakes (``tests/mutants/``, ``make mutants``);
- every lab's ``figures.py`` that loads the solution or embeds its code (the PNGs it drew
  stay, so the READMEs still show them);
- nothing else is dropped silently: a Python file that holds solution code (a function
  body of a ``solution.py``, or a big statement of one, compared as code: see
  :mod:`grading.tools.leaks`) stops the release with the file and what it holds; a
  document whose Python code blocks do is reported as a warning.

What is changed (:mod:`grading.tools.student_copy`): instructors-only blocks are dropped
from the README files and the Makefile, and ``README.md`` gets a "Student copy" section at
the top. The copy's documents are then checked for what a student cannot follow
(instructor commands, ``LAB_IMPL=solution``, files the copy lacks): reported as warnings.

The output folder must be empty (or absent) unless ``--force``; with ``--force`` a folder
made by an earlier release is emptied first, anything else is written over.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grading.run.discovery import PROJECT_ROOT
from grading.tools import leaks
from grading.tools.student_copy import (
    MARKER,
    coherence_problems,
    strip_instructor_blocks,
    student_readme,
)

# ---- release files -----------------------------------------------------------------------


EXCLUDED_DIRS = {
    ".git", ".hg", ".venv", ".venv-vllm", "venv", "__pycache__", ".pytest_cache",
    ".hypothesis", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints", "build", "dist",
    "node_modules", "solutions", ".mutants-scratch",
}  # fmt: skip
EXCLUDED_FILES = {"results.json", "results.json.tmp", ".DS_Store"}
EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".egg-info")
SOLUTION_NAME = re.compile(r"^(solution([_.-].*)?|.*_solution)\.py$")


def is_excluded(rel: Path) -> bool:
    parts = rel.parts
    if any(p in EXCLUDED_DIRS or p.endswith(".egg-info") or p.startswith(".venv") for p in parts):
        return True
    return rel.name in EXCLUDED_FILES or rel.name.endswith(EXCLUDED_SUFFIXES)


def is_solution_file(rel: Path) -> bool:
    return bool(SOLUTION_NAME.match(rel.name)) or "solutions" in rel.parts


def candidate_files(root: Path, skip: Path | None = None) -> list[Path]:
    """The project's files (relative paths), as git sees them where possible."""
    names: list[str] | None = None
    if (root / ".git").exists() and shutil.which("git"):
        proc = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
        )
        if proc.returncode == 0:
            names = [n for n in proc.stdout.decode().split("\0") if n]
    if names is None:
        names = [str(p.relative_to(root)) for p in root.rglob("*")]
    files = []
    for name in sorted(set(names)):
        rel = Path(name)
        path = root / rel
        if not path.is_file() or path.is_symlink() or is_excluded(rel):
            continue
        if skip is not None and _inside(path, skip):
            continue
        files.append(rel)
    return files


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


# ---- release -----------------------------------------------------------------------------


HIDDEN_TESTS = "instructor-only hidden tests"  # dropped from the release, kept by the autograder
MUTANTS = ("tests", "mutants")
LOADS_SOLUTION = re.compile(r"""(load_impl\([^)]*["']solution["']|\bimport\s+solution\b|"""
                            r"""from\s+\.?solution\s+import|["']solution\.py["'])""")  # fmt: skip
# A real starter gives away some helpers verbatim (a third of the solution's function
# bodies in this course); a starter with this share of them is a solved or mutated copy.
SOLVED_STARTER_SHARE = 0.8


class ReleaseError(Exception):
    """The release cannot be built safely; the message says why and what to do."""


@dataclass
class Plan:
    files: list[Path]  # relative to the root, to copy
    dropped: dict[Path, str] = field(default_factory=dict)  # relative path -> why
    warnings: list[str] = field(default_factory=list)


# ---- the plan --------------------------------------------------------------------------------


def _why_dropped(rel: Path) -> str | None:
    if is_solution_file(rel):
        return "solution"
    if rel.name.startswith("test_hidden") and rel.suffix == ".py":
        return HIDDEN_TESTS
    if rel.parts[:2] == MUTANTS:
        return "instructors' planted mistakes (make mutants)"
    return None


def plan_release(root: Path, skip: Path | None = None) -> Plan:
    """Decide what to copy; raises ``ReleaseError`` if solution code would leak.

    Code given in any ``starter.py`` or ``provided.py`` is public. A starter that holds code
    of *another* lab's solution is only reported (a given helper, or a leak: a person
    decides); a document's code blocks likewise; any other Python file stops the release.
    """
    everything = candidate_files(root, skip)
    solutions = [rel for rel in everything if is_solution_file(rel) and rel.suffix == ".py"]
    found = leaks.LeakFinder(root, everything, solutions)
    plan = Plan(files=[])
    errors = found.solved_starters(SOLVED_STARTER_SHARE)
    for rel in everything:
        why = _why_dropped(rel)
        if why is None and rel.name == "figures.py":
            if LOADS_SOLUTION.search(_read(root / rel)) or found.found(rel):
                why = "draws from the solution (its PNGs are kept)"
        if why is not None:
            plan.dropped[rel] = why
            continue
        for what in found.found(rel):
            if rel.name == "starter.py":
                plan.warnings.append(what + "\n    (given code, or another lab's answer?)")
            elif rel.suffix == ".py":
                errors.append(what)
            else:
                plan.warnings.append(what)
        plan.files.append(rel)
    if errors:
        raise ReleaseError(
            "solution code would leak into the student copy:\n  "
            + "\n  ".join(errors)
            + "\nFix the files above (solution code belongs in solution.py only) and retry."
        )
    return plan


# ---- building --------------------------------------------------------------------------------


def check_output(out: Path) -> list[str]:
    """Problems in a built copy: solution files, or starters that load the solution."""
    problems = []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if path.is_file() and is_solution_file(rel):
            problems.append(f"{rel}: a solution file")
        if path.name == "starter.py" and LOADS_SOLUTION.search(_read(path)):
            problems.append(f"{rel}: the starter loads the solution")
    return problems


def _check_destination(root: Path, out: Path, force: bool) -> None:
    """Refuse an output folder that is the project, inside it, or holds other files."""
    if out == root or _inside(root, out):
        raise ReleaseError(f"--out {out} is the project itself or contains it: pick another folder")
    if _inside(out, root) and out.relative_to(root).parts[0] not in ("dist", "build"):
        raise ReleaseError(
            f"--out {out} is inside the project itself: pick a folder outside it "
            "(or under its dist/ or build/, which are never copied)"
        )
    if out.exists() and not out.is_dir():
        raise ReleaseError(f"--out {out} is a file")
    if out.exists() and any(out.iterdir()) and not force:
        raise ReleaseError(
            f"{out} is not empty: refusing to write into it (make release OUT=... FORCE=1, "
            "or --force, writes into it anyway)"
        )


def _empty_earlier_copy(out: Path) -> None:
    """With --force: a folder made by an earlier release is emptied first."""
    readme = out / "README.md"
    if readme.is_file() and MARKER in _read(readme):
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _for_students(out: Path, files: list[Path]) -> list[Path]:
    """Rewrite the copy's documents for a student; returns the documents to check."""
    labs = sorted(p.parent.name for p in (out / "labs").glob("lab-*/test_lab.py"))
    documents = [rel for rel in files if rel.suffix == ".md" or rel.name == "Makefile"]
    for rel in documents:
        path = out / rel
        try:
            text = strip_instructor_blocks(_read(path))
        except ValueError as exc:
            raise ReleaseError(f"{rel}: {exc}") from None
        if rel == Path("README.md"):
            text = student_readme(text, labs)
        path.write_text(text, encoding="utf-8")
    if Path("README.md") not in documents:
        (out / "README.md").write_text(student_readme("", labs), encoding="utf-8")
        documents.append(Path("README.md"))
    return documents


def build_release(root: Path, out: Path, force: bool = False, quiet: bool = False) -> Plan:
    """Write the student copy of ``root`` into ``out``; returns what was copied and dropped.

    The plan's warnings include what the copy's documents still say that a student cannot
    follow (see :func:`grading.tools.student_copy.coherence_problems`).
    """
    root, out = root.resolve(), out.resolve()
    _check_destination(root, out, force)
    if out.exists() and force:
        _empty_earlier_copy(out)
    plan = plan_release(root, skip=out)
    out.mkdir(parents=True, exist_ok=True)
    for rel in plan.files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, out / rel)
    documents = _for_students(out, plan.files)
    problems = check_output(out)
    if problems:
        raise ReleaseError(f"the copy in {out} is not clean:\n  " + "\n  ".join(problems))
    incoherent = coherence_problems(out, documents, list(plan.dropped))
    plan.warnings += [f"not for a student: {p}" for p in incoherent]
    if not quiet:
        labs = len(list((out / "labs").glob("lab-*/test_lab.py")))
        print(f"student copy written to {out}: {len(plan.files)} files, {labs} labs")
        for rel, why in sorted(plan.dropped.items()):
            print(f"  left out {rel} ({why})")
        for warning in plan.warnings:
            print(f"  warning: {warning}")
    return plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m grading.tools.release",
        description="Build the student copy (no solutions).",
    )
    p.add_argument("--out", required=True, help="folder to write (must be empty unless --force)")
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    p.add_argument("--root", type=Path, default=PROJECT_ROOT, help="project to copy")
    args = p.parse_args(argv)
    if not args.out.strip():
        print("say where to write the student copy: make release OUT=../student-copy",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        build_release(args.root, Path(args.out).expanduser(), force=args.force)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
