"""Load the implementation a lab's tests grade: ``starter.py`` or ``solution.py``.

``LAB_IMPL=solution`` (the default) or ``LAB_IMPL=starter``. With ``starter`` the
solution file is never opened, so a student's grade can only come from their own code.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from types import ModuleType

ALLOWED_IMPLS = ("solution", "starter")


def lab_impl() -> str:
    """The value of ``LAB_IMPL``; raises ``ValueError`` naming the allowed values."""
    impl = os.environ.get("LAB_IMPL", "solution").strip() or "solution"
    if impl not in ALLOWED_IMPLS:
        raise ValueError(
            f"LAB_IMPL={impl!r} is not allowed: use one of {', '.join(ALLOWED_IMPLS)} "
            "(solution is the default; starter grades your own work)"
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
    file = lab_dir / f"{impl}.py"
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist (LAB_IMPL={impl})")
    name = f"{lab_dir.name.replace('-', '_')}.{impl}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
