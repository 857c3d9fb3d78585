"""Which labs there are and which of their test files carry points.

Labs are discovered, never listed: a new ``labs/lab-NN-*/test_lab.py`` is graded with no
change here.
"""

from __future__ import annotations

import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def discover_labs(root: Path) -> list[Path]:
    """Every ``labs/lab-*/`` folder that has a ``test_lab.py``, in order."""
    return sorted(p.parent for p in (root / "labs").glob("lab-*/test_lab.py"))


GRADED_PATTERNS = ("test_lab.py", "test_hidden*.py")


def graded_files(lab: Path) -> list[Path]:
    """The test files that carry a lab's points: ``test_lab.py`` plus any instructor-only
    ``test_hidden*.py`` dropped beside it (never part of a student release)."""
    return [lab / "test_lab.py", *sorted(lab.glob("test_hidden*.py"))]


def _matching(labs: list[Path], spec: str) -> list[Path]:
    name = Path(spec.rstrip("/")).name
    if name.isdigit():
        name = f"lab-{int(name):02d}"
    return [
        lab for lab in labs if lab.name == name or re.match(re.escape(name) + r"(-|$)", lab.name)
    ]


def select_labs(labs: list[Path], wanted: list[str]) -> list[Path]:
    """Labs named by number (``1``, ``01``) or folder name; ``ValueError`` names the choices."""
    if not wanted:
        return labs
    chosen: list[Path] = []
    for spec in (s.strip() for w in wanted for s in w.split(",")):
        if not spec:
            continue
        matches = _matching(labs, spec)
        if len(matches) != 1:
            choices = ", ".join(lab.name for lab in labs) or "none found"
            what = "matches no lab" if not matches else "is ambiguous"
            raise ValueError(f"--lab {spec!r} {what}; labs: {choices}")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen
