"""A lab's scratch copy: what the graded code may see, and the environment it runs in.

``common/`` and the lab's folder with the submitted ``starter.py`` and the given
``provided.py``, without any test file, the solution (when grading starters) or
``__pycache__`` (:func:`make_scratch`); a clean environment with ``HOME`` and ``TMPDIR``
inside the copy (:func:`sandbox_env`); and the modules a lab's files import, which its
zygote imports first (:func:`lab_imports`).
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from pathlib import Path

ENV_DIR = "COURSE_SANDBOX_DIR"  # where scratch copies go (default: the system temp folder)


ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TRITON_INTERPRET",
            "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OPENBLAS_NUM_THREADS")
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")


PREIMPORTABLE = {"numpy", "torch", "triton", "scipy", "common"}


def lab_imports(lab_dir: Path) -> list[str]:
    """The modules a lab's files import (read, never run): what its zygote imports first."""
    names: list[str] = []
    for path in sorted(lab_dir.glob("*.py")):
        try:
            if path.stat().st_size > 1 << 20:
                continue
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
    return list(dict.fromkeys(names))


def is_test_file(name: str) -> bool:
    return any(Path(name).match(p) for p in TEST_FILE_PATTERNS)


def _copy_lab(src: Path, dst: Path, impl: str) -> None:
    other = {"starter.py", "solution.py"} - {f"{impl}.py"}
    dst.mkdir(parents=True)
    for entry in os.scandir(src):
        if entry.is_symlink() or entry.name in other or entry.name == "__pycache__":
            continue  # a symlink could point at the tests; never follow one
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in ("tests", "figures"):
                _copy_lab(Path(entry.path), dst / entry.name, impl)
        elif entry.is_file(follow_symlinks=False) and not is_test_file(entry.name):
            shutil.copy2(entry.path, dst / entry.name, follow_symlinks=False)


def _chown_tree(path: Path, gid: int, dir_mode: int, file_mode: int) -> None:
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, 0, gid)
        os.chmod(dirpath, dir_mode)
        for name in filenames:
            file = os.path.join(dirpath, name)
            os.chown(file, 0, gid, follow_symlinks=False)
            os.chmod(file, file_mode)


def make_scratch(root: Path, lab: Path, impl: str, gid: int | None, base: Path | None = None
                 ) -> Path:
    """The scratch tree of one lab (see the module docstring); returns its root."""
    scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-", dir=base))
    shutil.copytree(root / "common", scratch / "common",
                    ignore=shutil.ignore_patterns("*.tmp"), symlinks=True)
    src = root / "labs" / lab.name
    _copy_lab(src, scratch / "labs" / lab.name, impl)
    for name in ("home", "tmp", "out"):
        (scratch / name).mkdir()
    if gid is not None:  # root owns it all; the lab's group may write its own folders
        os.chmod(scratch, 0o755)
        _chown_tree(scratch / "common", 0, 0o755, 0o644)
        for name in ("home", "tmp", "out", f"labs/{lab.name}"):
            _chown_tree(scratch / name, gid, 0o2770, 0o660)
        os.chmod(scratch / "labs", 0o755)
    return scratch


def sandbox_env(scratch: Path, impl: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.update(
        HOME=str(scratch / "home"), TMPDIR=str(scratch / "tmp"), USER="sandbox",
        LOGNAME="sandbox", PYTHONPATH=str(scratch), PYTHONHASHSEED="0", PYTHONNOUSERSITE="1",
        MPLBACKEND="Agg", LAB_IMPL=impl, TRITON_CACHE_DIR=str(scratch / "home" / ".triton"),
    )
    env.setdefault("PATH", os.defpath)
    return env
