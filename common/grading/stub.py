"""Counting a lab's tests without importing its code: ``load_impl`` answers a stub.

The grader collects (``--collect-only --points-stub-impl``) the tests of a lab whose starter
cannot be imported: whatever the test module touches at import time is a stub.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any


class _Stub:
    """Stands in for anything the test module touches at import time."""

    def __init__(self, name: str = "stub") -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub(f"{self._name}()")

    def __getitem__(self, key: Any) -> _Stub:
        return _Stub(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")


def _stub_load_impl(path: Any, impl: str | None = None) -> types.ModuleType:
    return _StubModule(f"stub_of_{Path(str(path)).stem}")


def install_stub_loader() -> None:
    import common
    import common.loader

    common.loader.load_impl = _stub_load_impl
    common.load_impl = _stub_load_impl
