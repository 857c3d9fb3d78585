"""Inside the sandbox: the worker's side of the wire (:mod:`common.grading.wire`).

Objects that stay in the worker, by number (:class:`Handles`); results pickled with them as
handles; a call's arguments unpickled; an exception as data (its classes, message, notes,
"starter.py:42, in merge"); and which arrays and tensors among the arguments a call wrote
into.
"""

from __future__ import annotations

import io
import pickle
import traceback
import types
from pathlib import Path
from typing import Any

from common.grading import leaves, wire


class Handles:
    """Objects that stay in the worker, by number; the trusted side holds their handles."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.objects: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(obj) -> handle number
        self.next = 1

    def register(self, obj: Any) -> tuple:
        hid = self.ids.get(id(obj))
        if hid is None or self.objects.get(hid) is not obj:
            hid, self.next = self.next, self.next + 1
            self.objects[hid] = obj
            self.ids[id(obj)] = hid
        kind = "class" if isinstance(obj, type) else ("callable" if callable(obj) else "object")
        return ("h", self.generation, hid, kind, _type_name(obj))

    def get(self, pid: Any) -> Any:
        if pid[1] != self.generation or pid[2] not in self.objects:
            raise LookupError("this object belonged to an earlier worker, which was restarted")
        return self.objects[pid[2]]

    def release(self, hids: list[int]) -> None:
        for hid in hids:
            obj = self.objects.pop(hid, None)
            if obj is not None and self.ids.get(id(obj)) == hid:
                del self.ids[id(obj)]


def _type_name(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls.__name__)}"


class ResultPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, handles: Handles) -> None:
        super().__init__(file, protocol=wire.PROTOCOL)
        self.handles = handles

    def reducer_override(self, obj: Any) -> Any:
        return wire.reduce_special(obj)

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _ATOMIC or wire.by_value(obj):
            return None
        return self.handles.register(obj)


_ATOMIC = frozenset((type(None), bool, int, float, str, bytes, tuple, list, dict))


def dumps_result(obj: Any, handles: Handles) -> bytes:
    buf = io.BytesIO()
    ResultPickler(buf, handles).dump(obj)
    return buf.getvalue()


class ArgsUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, handles: Handles, module: types.ModuleType) -> None:
        super().__init__(io.BytesIO(data))
        self.handles, self.module = handles, module

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "mod":
            return getattr(self.module, pid[1])
        return self.handles.get(pid)


def where(tb: types.TracebackType | None, lab_dir: Path) -> str | None:
    """``starter.py:42, in merge``: the innermost frame in the lab's own files."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        try:
            path = Path(frame.f_code.co_filename).resolve()
            path.relative_to(lab_dir)
        except (ValueError, OSError):
            continue
        found = f"{path.name}:{lineno}, in {frame.f_code.co_name}"
    return found


def _text(fn: Any, default: str = "") -> str:
    try:
        return str(fn())[:4000]
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        return default


def error_info(exc: BaseException, lab_dir: Path, handles: Handles) -> dict[str, Any]:
    cls = type(exc)
    info: dict[str, Any] = {
        "mro": [(c.__module__, c.__qualname__) for c in cls.__mro__ if c is not object],
        "message": _text(lambda: exc, _text(lambda: repr(exc), cls.__name__)),
        "where": where(exc.__traceback__, lab_dir),
        "notes": [_text(lambda n=n: n) for n in getattr(exc, "__notes__", None) or []][:5],
        "code": _exit_code(exc),
        "exception": None,
    }
    if wire.by_value(exc):
        try:
            info["exception"] = dumps_result(exc, handles)
        except BaseException:  # noqa: BLE001
            pass
    return info


def _exit_code(exc: BaseException) -> int | str | None:
    if isinstance(exc, SystemExit) and isinstance(exc.code, int | str):
        return exc.code if isinstance(exc.code, int) else exc.code[:200]
    return None


def snapshot(args: tuple, kwargs: dict) -> list[tuple[tuple, Any, bytes, Any]]:
    """Each array or tensor among the arguments with its bytes before the call."""
    out = []
    for path, leaf in leaves.iter_leaves(args, kwargs):
        out.append((path, leaf, leaves.leaf_bytes(leaf), leaves.leaf_grad(leaf)))
    return out


def changed(snaps: list[tuple[tuple, Any, bytes, Any]]) -> list[tuple[tuple, Any, Any]]:
    """``(path, new value or None, new grad or None)`` for arguments the call wrote into."""
    out = []
    for path, leaf, before, grad in snaps:
        new_grad = leaves.leaf_grad(leaf)
        value_changed = leaves.leaf_bytes(leaf) != before
        grad_changed = new_grad is not None and new_grad is not grad
        if value_changed or grad_changed:
            out.append((path, leaf if value_changed else None, new_grad if grad_changed else None))
    return out
