"""The course's own files: a walk of the tree that never enters what is not the course's.

``Path.rglob`` from the repository root walks ``.venv`` (tens of thousands of files) before a
filter can drop them: seconds per call. This walk prunes those folders as it meets them.
"""

from __future__ import annotations

import os
from pathlib import Path

# hidden folders (.git, .venv, .mutants-scratch ...) are never entered either
NOT_THE_COURSE = frozenset({"__pycache__", "build", "dist", "node_modules"})


def course_files(root: Path, suffix: str) -> list[Path]:
    """Every file under ``root`` whose name ends with ``suffix`` (``".md"``), sorted, outside
    hidden folders and :data:`NOT_THE_COURSE`."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_THE_COURSE]
        found += [Path(folder) / f for f in files if f.endswith(suffix)]
    return sorted(found)
