"""A Python environment in which ``import triton`` fails, as on a Mac or a Windows laptop.

    python tools/no_triton.py [--venv .venv-no-triton]    # prints the new venv's python

triton publishes Linux wheels only, so on macOS and Windows the labs run without it. This
builds a small venv (no pip, nothing downloaded) that sees every package of the Python
running this script (normally the project's ``.venv``) *except* triton: a path finder that
answers "no such module" for ``triton`` and ``triton.*`` and hides triton's distribution
from ``importlib.metadata``. ``importlib.util.find_spec("triton")`` returns None and
``import triton`` raises ``ModuleNotFoundError``, exactly as when it is not installed.

The hook is installed by a ``.pth`` file of the new venv, so it holds in every process that
venv's python starts (the grader's per-lab workers, lab scripts), whatever their
``PYTHONPATH`` or ``-I``. ``make test-no-triton`` and ``tests/test_setup_no_triton.py`` use it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import venv
from pathlib import Path

HOOK_MODULE = "_course_no_triton"

HOOK_SOURCE = '''"""Installed by tools/no_triton.py: triton is not importable here."""

import sys
from importlib.machinery import PathFinder


def _is_triton(name):
    return name == "triton" or name.startswith("triton.")


class NoTritonPathFinder(PathFinder):
    """The standard path finder, on a machine where triton is not installed."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if _is_triton(fullname):
            return None
        return super().find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in super().find_distributions(*args, **kwargs):
            name = (dist.metadata["Name"] or "").lower() if dist.metadata else ""
            if name != "triton":
                yield dist


sys.meta_path[:] = [NoTritonPathFinder if f is PathFinder else f for f in sys.meta_path]
'''


def site_dirs(python: str) -> list[str]:
    """The purelib and platlib directories of ``python`` (deduplicated, in order)."""
    code = "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])"
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True)
    return list(dict.fromkeys(out.stdout.split()))


def build(target: Path, base_python: str = sys.executable) -> Path:
    """Create (or recreate) the no-triton venv at ``target``; returns its python."""
    if target.exists():
        shutil.rmtree(target)
    venv.EnvBuilder(with_pip=False, symlinks=sys.platform != "win32").create(target)
    python = target / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    own_site = Path(site_dirs(str(python))[0])
    (own_site / f"{HOOK_MODULE}.py").write_text(HOOK_SOURCE, encoding="utf-8")
    lines = [f"import {HOOK_MODULE}"]
    # addsitedir (not a bare path line) so the base's own .pth files are processed too.
    lines += [f"import site; site.addsitedir({d!r})" for d in site_dirs(base_python)]
    (own_site / "00-course-no-triton.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")
    check = "import importlib.util as u, sys; sys.exit(u.find_spec('triton') is not None)"
    subprocess.run([str(python), "-c", check], check=True)
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(".venv-no-triton"))
    args = parser.parse_args(argv)
    print(build(args.venv.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
