"""Inside the Gradescope autograder: which submitted file is which lab's, and placing them.

Accepted layouts (searched anywhere under the submission folder): the lab's folder
(``labs/lab-00-online-softmax/starter.py``, ``lab-00-online-softmax/starter.py``,
``lab00/starter.py``), or a file named after its lab (``lab00_starter.py``,
``lab-00-online-softmax.py``, ``lab_00.py``). The folder form wins over the file-name form;
the shallowest path wins among several; a link never counts. See
:mod:`common.grading.autograder`.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from common.grading.discovery import discover_labs


def _lab_by_number(number: str, labs: list[str]) -> str | None:
    found = [lab for lab in labs if re.match(rf"lab-0*{int(number)}(-|$)", lab)]
    return found[0] if len(found) == 1 else None


def lab_of(path: Path, labs: list[str]) -> tuple[str | None, int]:
    """Which lab a submitted file is for, and how sure (0 folder form, 1 file name)."""
    if path.name == "starter.py":
        folder = path.parent.name
        if folder in labs:
            return folder, 0
        m = re.match(r"^lab[-_]?(\d+)(?:[-_].*)?$", folder, re.IGNORECASE)
        return (_lab_by_number(m.group(1), labs) if m else None), 0
    m = re.match(r"^lab[-_]?(\d+)(?![\d])", path.stem, re.IGNORECASE)
    return (_lab_by_number(m.group(1), labs) if m else None), 1


def _own_file(path: Path, submission: Path) -> bool:
    """A regular file inside the submission: a link (to a hidden test, say) never counts."""
    return (
        not path.is_symlink() and path.is_file() and path.resolve().is_relative_to(submission)
    )


def find_submission_files(submission: Path, labs: list[str]) -> tuple[dict[str, Path], list[str]]:
    """``{lab: submitted file}``, and the files that look like starters but were not used."""
    chosen: dict[str, tuple[tuple[int, int, str], Path]] = {}
    ignored = []
    real = submission.resolve()
    files = (
        sorted(p for p in submission.rglob("*.py") if _own_file(p, real))
        if submission.is_dir()
        else []
    )
    for path in files:
        rel = path.relative_to(submission)
        if any(part.startswith((".", "__")) for part in rel.parts):
            continue
        lab, form = lab_of(path, labs)
        if lab is None:
            if "starter" in path.name.lower() or path.name.lower().startswith("lab"):
                ignored.append(str(rel))  # meant as a lab's file, probably: say so
            continue
        rank = (form, len(rel.parts), str(rel))
        if lab not in chosen or rank < chosen[lab][0]:
            if lab in chosen:
                ignored.append(str(chosen[lab][1].relative_to(submission)))
            chosen[lab] = (rank, path)
        else:
            ignored.append(str(rel))
    return {lab: path for lab, (_, path) in chosen.items()}, ignored


def place_submission(submission: Path, source: Path) -> list[str]:
    """Copy the submitted starters into ``source/labs``; returns lines for the report."""
    labs = [lab.name for lab in discover_labs(source)]
    found, ignored = find_submission_files(submission, labs)
    lines = ["Submitted files:"]
    for lab in labs:
        if lab in found:
            target = source / "labs" / lab / "starter.py"
            target.unlink(missing_ok=True)  # never write through a link
            with open(found[lab], "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            lines.append(f"  {lab}: {found[lab].relative_to(submission)}")
        else:
            lines.append(f"  {lab}: no file for this lab, graded the untouched starter")
    if ignored:
        lines.append("  not used: " + ", ".join(sorted(ignored)[:20]))
        lines.append(
            "  (name a lab's file labs/<lab>/starter.py or lab<NN>_starter.py, e.g. "
            f"labs/{labs[0] if labs else 'lab-00-...'}/starter.py or lab00_starter.py)"
        )
    return lines
