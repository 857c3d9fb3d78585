"""The student release: which files of the project are candidates for the copy.

The files git knows (tracked, plus untracked ones that ``.gitignore`` does not exclude), or,
outside a git checkout, every file; never ``.git``, virtual environments, caches,
``results.json`` or build output; and which of them are solution files by their name.
:mod:`common.grading.release` decides what of these is copied.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

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
