"""Inside the sandbox: a worker (and a lab script), forked by the zygote, and the worker's side
of the wire.

A worker drops to the sandbox uid (when there is one), imports the graded module
(``starter.py``), sends a manifest of its public names, and answers requests
``(op, target, name, args, kwargs, instrument, releases)`` built by
:mod:`grading.plugin.client`: calls, method calls, attribute reads and special methods. A
lab script (``LabScript``) runs with ``runpy`` the same way.

Its side of the wire (:mod:`grading.sandbox.wire`): objects that stay in the worker, by
number (:class:`Handles`); results pickled with them as handles; a call's arguments
unpickled; an exception as data (its classes, message, notes, "starter.py:42, in merge");
and which arrays and tensors among the arguments a call wrote into.
"""

from __future__ import annotations

import faulthandler
import inspect
import io
import os
import pickle
import runpy
import signal
import socket
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from grading.sandbox import frames, launches, wire
from grading.sandbox.confine import enter_sandbox

# ---- worker wire -------------------------------------------------------------------------


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
        if pid[0] == "earlier":
            return EarlierResult(pid[1])
        return self.handles.get(pid)


class EarlierResult:
    """A batch step's argument that stands for an earlier step's result (``common.testing.
    Earlier`` on the trusted side): the batch puts that result in before the step runs."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = int(index)


def with_earlier(step: tuple, results: list[Any]) -> tuple:
    """``step`` (``(op, target, name, args, kwargs)``) with its :class:`EarlierResult`
    arguments replaced by those steps' results."""
    op, target, name, args, kwargs = step  # call_all names only earlier steps
    args = tuple(results[a.index] if type(a) is EarlierResult else a for a in args)
    return op, target, name, args, kwargs


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
    for path, leaf in wire.iter_leaves(args, kwargs):
        out.append((path, leaf, wire.leaf_bytes(leaf), wire.leaf_grad(leaf)))
    return out


def changed(snaps: list[tuple[tuple, Any, bytes, Any]]) -> list[tuple[tuple, Any, Any]]:
    """``(path, new value or None, new grad or None)`` for arguments the call wrote into."""
    out = []
    for path, leaf, before, grad in snaps:
        new_grad = wire.leaf_grad(leaf)
        value_changed = wire.leaf_bytes(leaf) != before
        grad_changed = new_grad is not None and new_grad is not grad
        if value_changed or grad_changed:
            out.append((path, leaf if value_changed else None, new_grad if grad_changed else None))
    return out


# ---- worker ------------------------------------------------------------------------------


SPECIAL = {
    "len": len, "iter": iter, "next": next, "bool": bool, "hash": hash, "repr": repr,
    "str": str, "int": int, "float": float, "index": lambda o: o.__index__(),
    "contains": lambda o, x: x in o, "getitem": lambda o, k: o[k],
    "setitem": lambda o, k, v: o.__setitem__(k, v), "delitem": lambda o, k: o.__delitem__(k),
    "eq": lambda o, x: o == x, "ne": lambda o, x: o != x, "lt": lambda o, x: o < x,
    "le": lambda o, x: o <= x, "gt": lambda o, x: o > x, "ge": lambda o, x: o >= x,
    "instancecheck": lambda o, x: isinstance(x, o), "subclasscheck": lambda o, x: issubclass(x, o),
    "enter": lambda o: o.__enter__(), "exit": lambda o, *a: o.__exit__(*a),
    "dir": lambda o: sorted(dir(o)), "array": lambda o, *a: __import__("numpy").asarray(o, *a),
    "setattr": setattr, "delattr": delattr,
}


class Worker:
    def __init__(self, sock: socket.socket, request: dict[str, Any]) -> None:
        self.sock = sock
        self.lab_dir = Path(request["lab_dir"]).resolve()
        self.impl = request["impl"]
        self.handles = Handles(request["gen"])
        self.module: types.ModuleType | None = None
        self.measure = request.get("measure") is True

    def send(self, message: Any) -> None:
        try:
            data = dumps_result(message, self.handles)
        except BaseException as exc:  # noqa: BLE001 - the result itself cannot be sent
            info = error_info(exc, self.lab_dir, self.handles)
            info["transfer"] = True
            data = dumps_result(("error", info), self.handles)
        if len(data) > frames.MAX_FRAME:
            info = {"mro": [("builtins", "MemoryError")], "transfer": True, "where": None,
                    "message": f"the result is {len(data) >> 20} MB: too large to send back",
                    "notes": [], "code": None, "exception": None}
            data = dumps_result(("error", info), self.handles)
        frames.send_frame(self.sock, data)

    def start(self) -> None:
        from common.loader import load_lab_module

        if self.measure:  # the grader notes this process's memory before the import
            self.send(("forked",))
            try:
                frames.recv_frame(self.sock, alone=True)
            except EOFError:
                return
        launches.install(str(self.lab_dir / f"{self.impl}.py"))
        try:
            self.module = load_lab_module(self.lab_dir, self.impl)
        except BaseException as exc:  # noqa: BLE001 - a submission that cannot be imported
            self.send(("error", error_info(exc, self.lab_dir, self.handles)))
            return
        self.send(("ready", manifest(self.module, self.handles)))
        while True:
            try:
                data, _ = frames.recv_frame(self.sock, alone=True)
            except EOFError:
                return
            try:
                request = ArgsUnpickler(data, self.handles, self.module).load()
                reply = self.execute(*request)
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
                reply = ("error", error_info(exc, self.lab_dir, self.handles))
            self.send(reply)

    def resolve(self, target: tuple) -> Any:
        if target[0] == "mod":
            return getattr(self.module, target[1])
        return self.handles.get(target)

    def execute(self, op: str, target: tuple, name: str | None, args: tuple, kwargs: dict,
                instrument: str | None, releases: list[int], record_launches: bool = True
                ) -> tuple:
        self.handles.release(releases)
        if op == "batch":  # calls in order, up to the first that raises (or the None of
            replies: list[tuple] = []  # step ``name``, when it names one)
            results: list[Any] = []  # each step's own result, for the steps after it
            for i, step in enumerate(args):
                try:
                    reply = self.execute(*with_earlier(step, results), None, [],
                                         record_launches)
                except BaseException as exc:  # noqa: BLE001 - goes back as that step's reply
                    replies.append(("error", error_info(exc, self.lab_dir, self.handles)))
                    break
                replies.append(reply)
                results.append(reply[1] if reply[0] == "ok" else None)
                if i == name and reply[:2] == ("ok", None):
                    break
            return ("batch", replies)
        obj = self.resolve(target)
        if op == "getattr":
            value = getattr(obj, name)
            if inspect.ismethod(value) and value.__self__ is obj or (
                inspect.isbuiltin(value) and getattr(value, "__self__", None) is obj
            ):
                # a plain function of the class, not shadowed by the instance: the same
                # name is a method of every object of this class (the caller may remember)
                of_class = inspect.isfunction(inspect.getattr_static(type(obj), name, None))
                shadowed = name in getattr(obj, "__dict__", {})
                return ("method", name, of_class and not shadowed)
            return ("ok", value, [])
        if op == "special":
            result = SPECIAL[name](obj, *args)
            return ("self", None, []) if result is obj and name in ("iter", "enter") else (
                "ok", result, [])
        fn = obj if op == "call" else getattr(obj, name)
        snaps = snapshot(args, kwargs)
        if not record_launches:  # no Triton test: nobody reads a record of the launches
            return ("ok", self.call(fn, instrument, args, kwargs), changed(snaps))
        before = launches.tensors_before(args, kwargs)
        with launches.recording(before, args, kwargs) as record:
            result = self.call(fn, instrument, args, kwargs)
        return ("ok", result, changed(snaps),
                launches.report(record, result, before, args, kwargs))

    @staticmethod
    def call(fn: Any, instrument: str | None, args: tuple, kwargs: dict) -> Any:
        if instrument:
            from common.testing import INSTRUMENTS

            return INSTRUMENTS[instrument](fn, *args, **kwargs)
        return fn(*args, **kwargs)


def signature_info(fn: Any) -> list | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        default = p.default
        if default is inspect.Parameter.empty:
            shown: Any = ("empty",)
        elif default is None or isinstance(default, bool | int | float | str):
            shown = ("value", default)
        else:
            shown = ("repr", _text(lambda d=default: repr(d)))
        annotation = "" if p.annotation is inspect.Parameter.empty else (
            p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(
                p.annotation))
        params.append((p.name, int(p.kind), shown, annotation))
    ret = sig.return_annotation
    ret = "" if ret is inspect.Signature.empty else (
        ret if isinstance(ret, str) else inspect.formatannotation(ret))
    return [params, ret]


def manifest(module: types.ModuleType, handles: Handles) -> dict[str, Any]:
    """What the proxy module needs to stand in for ``module``: one entry per public name."""
    entries: dict[str, Any] = {"__doc__": ("value", dumps_result(module.__doc__, handles))}
    for name, value in list(vars(module).items()):
        if name.startswith("_"):
            continue
        try:
            if isinstance(value, types.ModuleType):
                entries[name] = ("module", value.__name__)
            elif isinstance(value, type):
                entries[name] = (("global", value.__module__, value.__qualname__)
                                 if wire.allowed_by_name(value) else ("class",))
            elif callable(value):
                entries[name] = ("function", _text(lambda v=value: v.__doc__ or ""),
                                 signature_info(value))
            else:
                entries[name] = ("value", dumps_result(value, handles))
        except Exception:  # noqa: BLE001 - a name we cannot describe is left out
            continue
    return entries


def run_worker(request: dict[str, Any], fds: list[int]) -> int:
    sock_fd, log_fd, stack_fd = fds
    devnull = os.open(os.devnull, os.O_RDONLY)
    enter_sandbox({0: devnull, 1: log_fd, 2: log_fd, 3: sock_fd, 4: stack_fd},
                  request.get("uid"), request.get("gid"), request["cwd"])
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    stack = open(4, "w", closefd=False)  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    Worker(socket.socket(fileno=3), request).start()
    return 0


def run_program(request: dict[str, Any], fds: list[int]) -> int:
    """A trusted program of the grader (``python -m grading.sandbox.compiler``) run as a fresh
    interpreter inside the sandbox: it enters it, then ``exec`` s ``request["argv"]`` (after
    ``sys.executable``) with ``request["env"]``. Nothing it does reaches the trusted side but
    what it writes to its standard output, which the trusted side reads as plain data."""
    stdin, stdout, stderr = fds
    enter_sandbox({0: stdin, 1: stdout, 2: stderr}, request.get("uid"), request.get("gid"),
                  request["cwd"])
    argv = [sys.executable, *request["argv"]]
    os.execve(sys.executable, argv, dict(request["env"]))
    return 70  # pragma: no cover - execve does not return


def run_script(request: dict[str, Any], fds: list[int]) -> int:
    stdin, stdout, stderr = fds
    enter_sandbox({0: stdin, 1: stdout, 2: stderr}, request.get("uid"), request.get("gid"),
                  request["cwd"])
    sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", buffering=0))
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0
