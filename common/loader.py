"""Load the implementation a lab's tests grade: ``starter.py`` or ``solution.py``.

``LAB_IMPL=solution`` or ``LAB_IMPL=starter``; unset, it is ``solution`` in the instructor's
tree and ``starter`` in a student copy (which has no solution.py). With ``starter`` the
solution file is never opened, so a student's grade can only come from their own code.
:func:`lab_impl` is the one place the variable is read.

Under the grader (``COURSE_SANDBOX=1``), :func:`load_impl` returns a proxy module whose
functions run in a sandboxed worker process: the grader's pytest plugin registers that
loader with :func:`register_impl_loader` (``common`` never imports the grader); plain pytest
imports the module in-process.

A lab's given code (validation, constants, types both files share) lives in
``<lab>/provided.py``; ``starter.py`` and ``solution.py`` load it with
``provided = load_lab_module(__file__, "provided")``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from collections.abc import Callable
from types import ModuleType

ALLOWED_IMPLS = ("solution", "starter")
SANDBOX_ENV = "COURSE_SANDBOX"  # set by the grader: load_impl returns a proxy of a sandbox


REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

ImplLoader = Callable[[pathlib.Path, str], "ModuleType | None"]
_impl_loaders: list[ImplLoader] = []


def register_impl_loader(loader: ImplLoader) -> None:
    """Let a pytest plugin serve :func:`load_impl`: ``loader(lab_dir, impl)`` returns the
    module the tests get, or ``None`` to leave it to the next loader (the last registered
    is asked first; in the end the file is imported here)."""
    if loader not in _impl_loaders:
        _impl_loaders.append(loader)


def default_impl(root: pathlib.Path = REPO_ROOT) -> str:
    """``solution`` where the tree has solutions (the instructor's), else ``starter``."""
    return "solution" if any(root.glob("labs/*/solution.py")) else "starter"


def lab_impl(default: str | None = None) -> str:
    """The value of ``LAB_IMPL`` (unset: ``default``, else ``default_impl()``); raises
    ``ValueError`` naming the allowed values."""
    impl = os.environ.get("LAB_IMPL", "").strip() or default or default_impl()
    if impl not in ALLOWED_IMPLS:
        raise ValueError(
            f"LAB_IMPL={impl!r} is not allowed: use one of {', '.join(ALLOWED_IMPLS)} "
            "(starter is your own work, solution the reference)"
        )
    return impl


def load_impl(path: str | os.PathLike[str], impl: str | None = None) -> ModuleType:
    """Import ``<lab>/<impl>.py`` where ``path`` is the lab folder or any file inside it.

    Each lab's module gets its own name (``lab_00_online_softmax.starter``) so labs never
    collide in ``sys.modules`` and never import each other.
    """
    impl = impl or lab_impl()
    if impl not in ALLOWED_IMPLS:
        raise ValueError(f"impl={impl!r} is not one of {ALLOWED_IMPLS}")
    lab_dir = pathlib.Path(path).resolve()
    if lab_dir.is_file():
        lab_dir = lab_dir.parent
    if not (lab_dir / f"{impl}.py").is_file():
        raise FileNotFoundError(f"{lab_dir / f'{impl}.py'} does not exist (LAB_IMPL={impl})")
    for loader in reversed(_impl_loaders):
        # Under the grader: the tests' process never imports the graded code; calls go to a
        # sandboxed worker (the grader's plugin registered the loader). Plain pytest imports
        # it here.
        module = loader(lab_dir, impl)
        if module is not None:
            return module
    _refuse_outside_sandbox()
    return load_lab_module(lab_dir, impl)


def _refuse_outside_sandbox() -> None:
    """A process that a test started under the grader (so it inherited ``COURSE_SANDBOX``)
    must not import the graded code outside the sandbox: it gets a ``RuntimeError`` saying
    what to use instead."""
    if os.environ.get(SANDBOX_ENV, "").strip() not in ("", "0"):
        raise RuntimeError(
            "under the grader the graded code runs only in its sandbox: a test must run a "
            "script that imports it with common.testing.LabScript (and load the plugin "
            "-p grading.plugin.proxy in the test process)"
        )


def load_lab_module(path: str | os.PathLike[str], module: str) -> ModuleType:
    """Import ``<lab>/<module>.py`` (``path`` is the lab folder or a file inside it) once.

    Used for a lab's given code: ``provided = load_lab_module(__file__, "provided")``.
    """
    lab_dir = pathlib.Path(path).resolve()
    if lab_dir.is_file():
        lab_dir = lab_dir.parent
    file = lab_dir / f"{module}.py"
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist")
    name = f"{lab_dir.name.replace('-', '_')}.{module}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[name]
        raise
    return loaded
