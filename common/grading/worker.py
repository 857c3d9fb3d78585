"""The sandboxed side of grading: a zygote that forks workers (and lab scripts).

    python -m common.grading.worker '<json config>'      # started by common.grading.proxy

The **zygote** runs in a scratch copy of one lab (the student's file, the lab's given code,
``common``; never a test) with a clean environment. It imports numpy, torch, Triton and
``common`` once, then serves requests on a Unix socket from the trusted test process:

- ``worker``: fork a **worker** that drops to the sandbox uid (when there is one), imports the
  graded module (``starter.py``) and answers calls over the socket it was given;
- ``script``: fork a lab script (``LabScript``: lab-04's torch.distributed ring) the same way;
- ``kill``: end a worker or script and everything it started; ``wait``: its exit status.

Forking from a warm zygote makes a restart after a crash cost milliseconds, not the few
seconds that importing torch takes. The zygote itself never runs graded code. It is a
"child subreaper" (Linux): orphans of a worker's double forks come back to it, to be killed.

A worker answers requests ``(op, target, name, args, kwargs, instrument, releases)`` built
by :mod:`common.grading.proxy`; see there for the protocol.
"""

from __future__ import annotations

import faulthandler
import importlib
import inspect
import io
import json
import os
import pickle
import pkgutil
import resource
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

from common.grading import procs, wire
from common.grading.scratch import PREIMPORTABLE, lab_imports

FILE_SIZE_LIMIT = 256 * 2**20
NPROC_LIMIT = 512
SKIP_STDLIB = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__main__",
               "lib2to3", "ensurepip", "pydoc_data", "test", "msvcrt", "winreg", "winsound",
               "_winapi", "nt", "msilib", "_msi", "_overlapped", "_wmi", "ntpath", "_scproxy",
               "_dbm", "_gdbm", "dbm", "curses", "_curses", "_curses_panel", "readline",
               "distutils", "venv"}
COMMON_STDLIB = ("heapq", "bisect", "dataclasses", "itertools", "functools", "collections",
                 "math", "cmath", "typing", "enum", "hashlib", "struct", "random", "copy",
                 "operator", "statistics", "fractions", "decimal", "array", "string", "re",
                 "json", "textwrap", "inspect", "ast", "tokenize", "linecache", "contextlib",
                 "warnings", "weakref", "abc", "numbers", "queue", "threading", "time",
                 "pathlib", "argparse", "datetime", "socket", "tempfile", "shutil", "uuid",
                 "multiprocessing", "multiprocessing.connection", "concurrent.futures",
                 "pprint", "traceback", "dis", "codeop", "zlib", "base64", "binascii")


# ---- the zygote ------------------------------------------------------------------------------


def preimport(modules: list[str], full_stdlib: bool) -> None:
    """What the workers will import, imported once here (forks share it): ``modules`` (the
    installed packages and ``common`` modules the labs' files name, see
    :func:`common.grading.scratch.lab_imports`) and some standard library (all of it when
    the sandbox uid cannot read the interpreter's files)."""
    stdlib = set(getattr(sys, "stdlib_module_names", ())) - SKIP_STDLIB
    names = list(COMMON_STDLIB) + (sorted(stdlib) if full_stdlib else [])
    from common.device import configure_triton

    configure_triton()  # TRITON_INTERPRET before anything imports triton
    names += [n for n in modules if n.split(".")[0] in PREIMPORTABLE | stdlib]
    names += ["common.loader", "common.testing"]
    for name in names:
        _try_import(name)
    if full_stdlib:  # and the submodules imported lazily (multiprocessing.popen_fork, ...)
        for name in sorted(stdlib):
            module = sys.modules.get(name)
            for info in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
                parts = info.name.split(".")[1:]
                if not any(p in SKIP_STDLIB or p.startswith("test") or p == "__main__"
                           for p in parts):
                    _try_import(info.name)


def _try_import(name: str) -> None:
    try:
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - a module this platform lacks
        pass


def readable_by(uid: int | None, gid: int | None) -> bool:
    """Can ``uid`` read the interpreter's standard library? (Forks a probe that drops to it.)"""
    if uid is None:
        return True
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        code = 1
        try:
            drop_privileges(uid, gid)
            os.listdir(os.path.dirname(os.__file__))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def drop_privileges(uid: int | None, gid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setgid(uid if gid is None else gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("could not switch to the sandbox user")


def no_new_privileges() -> None:
    """setuid binaries (su, sudo, mount) cannot raise this process's privileges (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        except (OSError, AttributeError):
            pass


def limit_resources(switched: bool) -> None:
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)]
    if switched:  # counts the uid's processes: only meaningful for a uid of its own
        limits.append((resource.RLIMIT_NPROC, NPROC_LIMIT))
    for which, value in limits:
        try:
            _, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError):
            pass
    try:  # the first process the kernel kills when memory runs out: never the trusted one
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def enter_sandbox(fds: dict[int, int], uid: int | None, gid: int | None, cwd: str) -> None:
    """In a freshly forked child: a new session, only ``fds`` open (``{target: source}``),
    the sandbox uid, resource limits, ``cwd``."""
    import fcntl

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    os.setsid()
    high = {target: fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for target, fd in fds.items()}
    for target, fd in high.items():
        os.dup2(fd, target, inheritable=target <= 2)
    os.closerange(max(fds) + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    no_new_privileges()
    drop_privileges(uid, gid)
    limit_resources(uid is not None)
    os.umask(0o007)
    os.chdir(cwd)


class Zygote:
    """Forks workers and scripts on request; see the module docstring."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.listener = socket.socket(fileno=config["listen_fd"])
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, dict[str, Any]] = {}  # pid -> {kind, uid, conn}
        self.statuses: dict[int, int] = {}
        self.waiters: dict[int, list[tuple[socket.socket, Any]]] = {}
        self.control: socket.socket | None = None
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        uids = config.get("uids")
        self.gid: int | None = config.get("gid")
        self.uids = list(range(uids[0], uids[1])) if uids else []
        self.turn = 0

    def next_uid(self) -> int | None:
        """A uid of its own for each process (so that killing "everything of that uid" ends
        exactly that process and what it started); a uid is reused only after its old
        processes are killed."""
        if not self.uids:
            return None
        uid = self.uids[self.turn % len(self.uids)]
        self.turn += 1
        if procs.have_proc() and any(u == uid for _, _, u in procs.proc_table().values()):
            procs.kill_uid_by_fork(uid, self.gid if self.gid is not None else uid)
        return uid

    def serve(self) -> None:
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    self.sel.register(conn, selectors.EVENT_READ, "conn")
                elif key.data == "wake":
                    os.read(self.wake_r, 4096)
                    self.reap()
                else:
                    self.handle(key.fileobj)

    def reply(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            wire.send_frame(conn, json.dumps(message).encode())
        except OSError:
            pass

    def handle(self, conn: socket.socket) -> None:
        try:
            data, fds = wire.recv_frame(conn, time.monotonic() + 30, max_size=1 << 24,
                                        max_fds=wire.MAX_FDS)
        except (EOFError, OSError, wire.FrameError, TimeoutError):
            self.closed(conn)
            return
        request = json.loads(data)
        op, rid = request["op"], request.get("id")
        if op in ("worker", "script"):
            self.reply(conn, {"id": rid, "pid": self.fork(request, fds, conn)})
        elif op == "wait":
            pid = request["pid"]
            if pid in self.statuses or pid not in self.children:
                self.reply(conn, {"id": rid, "pid": pid, "code": self.statuses.get(pid)})
            else:
                self.waiters.setdefault(pid, []).append((conn, rid))
        elif op == "kill":
            self.kill(request["pid"])
            self.reply(conn, {"id": rid, "ok": True})
        elif op == "lab":  # a zygote for one lab, forked from this warm one
            self.reply(conn, {"id": rid, "pid": self.fork_lab(request, fds, conn)})
        elif op == "control":  # the trusted test process: when it goes, everything goes
            if self.control is not None and self.control is not conn:
                self.reply(conn, {"id": rid, "error": "this sandbox already has its test process"})
            else:
                self.control = conn
                self.reply(conn, {"id": rid, "ok": True, "pid": os.getpid()})
        elif op == "ping":
            self.reply(conn, {"id": rid, "ok": True})
        elif op == "shutdown":
            self.shutdown()
        else:
            self.reply(conn, {"id": rid, "error": f"unknown op {op!r}"})

    def closed(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        conn.close()
        if conn is self.control:
            self.shutdown()
        for pid, child in list(self.children.items()):
            if child["conn"] is conn and child["kind"] == "script":
                self.kill(pid)  # its launcher went away (LabScript.stop)

    def fork(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> int:
        uid = self.next_uid()
        gid = (self.gid if self.gid is not None else uid) if uid is not None else None
        pid = os.fork()
        if pid == 0:  # pragma: no cover - in the child
            code = 70
            try:
                request = dict(request, uid=uid, gid=gid)
                code = (run_worker if request["op"] == "worker" else run_script)(request, fds)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        for fd in fds:
            os.close(fd)
        self.children[pid] = {"kind": request["op"], "uid": uid, "gid": gid, "conn": conn}
        return pid

    def fork_lab(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> int:
        """A child that becomes the zygote of one lab (its listening socket is ``fds[0]``):
        everything imported here is already imported there."""
        pid = os.fork()
        if pid == 0:  # pragma: no cover - in the child
            code = 0
            try:
                self.sel.close()
                for fd in (self.listener.fileno(), self.wake_r):
                    os.close(fd)
                if self.control is not None:
                    self.control.close()
                conn.close()
                config = dict(request["config"], listen_fd=fds[0])
                procs.set_subreaper()  # not inherited through fork
                os.chdir(config["cwd"])
                os.environ.clear()
                os.environ.update(config["env"])
                sys.path.insert(0, config["cwd"])
                preimport(lab_imports(Path(config["lab_dir"])), full_stdlib=False)
                Zygote(config).serve()
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 70
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        self.children[pid] = {"kind": "lab", "uid": None, "gid": None, "conn": conn}
        return pid

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            child = self.children.pop(pid, None)
            if child is None:
                continue  # an orphan that came back to us (subreaper) and was killed
            self.statuses[pid] = code
            for conn, rid in self.waiters.pop(pid, []):
                self.reply(conn, {"id": rid, "pid": pid, "code": code})
            if child["kind"] == "script":
                self.reply(child["conn"], {"exit": pid, "code": code})

    def kill(self, pid: int) -> None:
        """End ``pid``, everything it started, and every orphan that came back to us."""
        child = self.children.get(pid)
        if child is not None and child["uid"] is not None:
            procs.kill_uid_by_fork(child["uid"], child["gid"])
        others = {p for p in self.children if p != pid}
        if procs.have_proc():
            table = procs.proc_table()
            me = os.getpid()
            orphans = {p for p, (ppid, _, _) in table.items() if ppid == me} - others - {pid}
            procs.kill_tree({pid} | orphans, sessions={pid},
                            spare=others | procs.descendants(others, table))
        else:
            procs.kill_tree({pid}, sessions={pid})
        self.reap()

    def shutdown(self) -> None:
        for uid in self.uids:
            if procs.have_proc() and any(u == uid for _, _, u in procs.proc_table().values()):
                procs.kill_uid_by_fork(uid, self.gid if self.gid is not None else uid)
        procs.kill_tree({os.getpid()}, include_roots=False)
        os._exit(0)


# ---- the worker: imports the graded module and answers calls ---------------------------------


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

    def send(self, message: Any) -> None:
        try:
            data = dumps_result(message, self.handles)
        except BaseException as exc:  # noqa: BLE001 - the result itself cannot be sent
            info = error_info(exc, self.lab_dir, self.handles)
            info["transfer"] = True
            data = dumps_result(("error", info), self.handles)
        if len(data) > wire.MAX_FRAME:
            info = {"mro": [("builtins", "MemoryError")], "transfer": True, "where": None,
                    "message": f"the result is {len(data) >> 20} MB: too large to send back",
                    "notes": [], "code": None, "exception": None}
            data = dumps_result(("error", info), self.handles)
        wire.send_frame(self.sock, data)

    def start(self) -> None:
        from common.loader import load_lab_module

        try:
            self.module = load_lab_module(self.lab_dir, self.impl)
        except BaseException as exc:  # noqa: BLE001 - a submission that cannot be imported
            self.send(("error", error_info(exc, self.lab_dir, self.handles)))
            return
        self.send(("ready", manifest(self.module, self.handles)))
        while True:
            try:
                data, _ = wire.recv_frame(self.sock, alone=True)
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
                instrument: str | None, releases: list[int]) -> tuple:
        self.handles.release(releases)
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
        if instrument:
            from common.testing import INSTRUMENTS

            result = INSTRUMENTS[instrument](fn, *args, **kwargs)
        else:
            result = fn(*args, **kwargs)
        return ("ok", result, changed(snaps))


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


def main(argv: list[str] | None = None) -> int:
    config = json.loads((argv or sys.argv[1:])[0])
    uids, gid = config.get("uids"), config.get("probe_uid") or config.get("gid")
    procs.set_subreaper()
    probe = config.get("probe_uid") or (uids[0] if uids else None)
    full = not readable_by(probe, gid if gid is not None else probe)
    lab = config.get("lab_dir")
    preimport(lab_imports(Path(lab)) if lab else config.get("modules", []), full_stdlib=full)
    zygote = Zygote(config)
    print("zygote ready", flush=True)
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
