"""The sandboxed side of grading: a zygote that forks workers (and lab scripts).

    python -m grading.sandbox.zygote '<json config>'      # started by grading.sandbox.lab_sandbox

The **zygote** runs in a scratch copy of one lab (the student's file, the lab's given code,
``common``; never a test) with a clean environment. It imports numpy, torch, Triton and
``common`` once, then serves requests on a Unix socket from the trusted test process:

- ``worker``: fork a **worker** that drops to the sandbox uid (when there is one), imports the
  graded module (``starter.py``) and answers calls over the socket it was given;
- ``script``: fork a lab script (``LabScript``: lab-04's torch.distributed ring) the same way;
- ``program``: fork a child that enters the sandbox and ``exec`` s a fresh interpreter on one
  of the grader's programs (the compile step, :mod:`grading.sandbox.compiler`);
- ``kill``: end a worker or script and everything it started; ``wait``: its exit status.

Forking from a warm zygote makes a restart after a crash cost milliseconds, not the few
seconds that importing torch takes. The zygote itself never runs graded code. It is a
"child subreaper" (Linux): orphans of a worker's double forks come back to it, to be killed.

The worker's side is :mod:`grading.sandbox.worker`; entering the sandbox,
:mod:`grading.sandbox.confine`; what the zygote imports first, :mod:`grading.sandbox.confine`.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from grading.sandbox import frames, host
from grading.sandbox.confine import preimport, readable_by
from grading.sandbox.worker import run_program, run_script, run_worker
from grading.sandbox.zygote_client import exit_child, keep_seed, lab_imports


def _own_common(scratch: str) -> None:
    """A lab's zygote forked from the run's warm one: ``common``'s modules still to be
    imported come from the lab's scratch copy (which may hold the reference), not the warm
    zygote's."""
    common = sys.modules.get("common")
    if common is not None and hasattr(common, "__path__"):
        common.__path__[:] = [os.path.join(scratch, "common")]
        importlib.invalidate_caches()


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
        if host.have_proc() and any(u == uid for _, _, u in host.proc_table().values()):
            host.kill_uid_by_fork(uid, self.gid if self.gid is not None else uid)
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
            frames.send_frame(conn, json.dumps(message).encode())
        except OSError:
            pass

    def handle(self, conn: socket.socket) -> None:
        try:
            data, fds = frames.recv_frame(conn, time.monotonic() + 30, max_size=1 << 24,
                                        max_fds=frames.MAX_FDS)
        except (EOFError, OSError, frames.FrameError, TimeoutError):
            self.closed(conn)
            return
        request = json.loads(data)
        op, rid = request["op"], request.get("id")
        if op in ("worker", "script", "program"):
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
        gc.freeze()  # what the zygote holds is never collected in a child, so never copied
        pid = os.fork()
        if pid == 0:  # pragma: no cover - in the child
            run = {"worker": run_worker, "script": run_script, "program": run_program}
            exit_child(lambda: run[request["op"]](dict(request, uid=uid, gid=gid), fds))
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
                host.set_subreaper()  # not inherited through fork
                os.chdir(config["cwd"])
                os.environ.clear()
                os.environ.update(config["env"])
                sys.path.insert(0, config["cwd"])
                _own_common(config["cwd"])
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
            host.kill_uid_by_fork(child["uid"], child["gid"])
        others = {p for p in self.children if p != pid}
        if host.have_proc():
            table = host.proc_table()
            me = os.getpid()
            orphans = {p for p, (ppid, _, _) in table.items() if ppid == me} - others - {pid}
            host.kill_tree({pid} | orphans, sessions={pid},
                            spare=others | host.descendants(others, table))
        else:
            host.kill_tree({pid}, sessions={pid})
        self.reap()

    def shutdown(self) -> None:
        for uid in self.uids:
            if host.have_proc() and any(u == uid for _, _, u in host.proc_table().values()):
                host.kill_uid_by_fork(uid, self.gid if self.gid is not None else uid)
        host.kill_tree({os.getpid()}, include_roots=False)
        os._exit(0)


def graded_preloads(argv: list[str]) -> list[str]:
    """The modules the labs ``python -m grading argv`` grades declare for the seed (their
    ``lab.toml``'s ``[grade] preload``; every lab's without ``--lab``): a public list,
    nothing of a test or a solution."""
    keys: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--lab" and i + 1 < len(argv):
            keys += argv[i + 1].split(",")
        elif arg.startswith("--lab="):
            keys += arg.removeprefix("--lab=").split(",")
    try:
        from labs import manifest

        entries = [manifest.lab(k.strip()) for k in keys if k.strip()] or manifest.labs()
    except (ImportError, KeyError, ValueError, OSError):
        return []
    return list(dict.fromkeys(name for entry in entries for name in entry.preload))


def start_seed() -> bool:
    """In ``python -m grading``, before the grader imports itself or reads a file of the
    course (tests, solutions: nothing of them may be in a forked image): numpy, torch,
    Triton and the graded labs' declared preloads (:func:`graded_preloads`) imported once
    (``TRITON_INTERPRET`` chosen first), then a child forked that waits
    to become the run's warm zygote (``zygote_client.Mother``). True when this process is
    warm (its lab test processes may be forked from it too: ``zygote_client.preloaded``).
    Nothing happens where
    a fork could not share it safely (no ``fork``, torch missing, CUDA already initialised,
    threads running)."""
    if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return False
    try:
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # no CUDA context here
        import numpy  # noqa: F401
        import torch

        from common.device import configure_triton
    except ImportError:
        return False
    configure_triton()  # before triton is imported
    try:
        import triton.language  # noqa: F401
    except ImportError:  # not installed here: its tests are "not run"
        pass
    for name in graded_preloads(sys.argv[1:]):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - then each fork imports it itself, as before
            pass
    import threading

    if torch.cuda.is_initialized() or threading.active_count() > 1:
        return False
    keep_seed(None, None)
    parent, child = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        code = 70
        try:
            parent.close()
            code = serve_seed(child)
        finally:
            os._exit(code)
    child.close()
    keep_seed(pid, parent)
    return True


def serve_seed(sock: socket.socket) -> int:
    """The seed's side (:func:`start_seed`): a child of the
    front door forked right after it imported numpy, torch and Triton, before it read any
    file of the course. It waits for its orders (the run's :class:`Mother` config, its
    listening socket and log), then makes itself what ``python -m grading.sandbox.zygote``
    would be: a new session, only those descriptors, the scratch copy as its folder, the
    clean environment, and every module of the course dropped and imported again from the
    scratch copy (``common`` without the reference); then :func:`main`. Exits when the front
    door goes without using it."""
    import gc

    gc.freeze()  # the parent's objects: never collected here (their descriptors are gone)
    try:
        data, fds = frames.recv_frame(sock, None, max_size=1 << 24, max_fds=2)
    except (EOFError, OSError, frames.FrameError):
        return 0
    config = json.loads(data)
    if len(fds) != 2:
        return 70
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for target in (1, 2):
        os.dup2(fds[1], target)
    os.dup2(fds[0], 3, inheritable=False)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    cwd, env = config.pop("cwd"), config.pop("env")
    config["listen_fd"] = 3
    os.chdir(cwd)
    given = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    os.environ.clear()
    os.environ.update(env)
    import tempfile

    tempfile.tempdir = None
    # sys.path as a fresh interpreter in the scratch copy has it: no folder of the course
    import site

    given.add(site.getusersitepackages())  # PYTHONNOUSERSITE=1
    sys.path[:] = [cwd, *(p for p in sys.path[1:] if p and p not in given)]
    for name in [n for n in sys.modules
                 if n.split(".")[0] in COURSE_PACKAGES or n.startswith("lab_")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    fresh = importlib.import_module("grading.sandbox.zygote")
    return fresh.main([json.dumps(config)])


COURSE_PACKAGES = ("common", "grading", "bench", "labs", "conftest")


def main(argv: list[str] | None = None) -> int:
    config = json.loads((argv or sys.argv[1:])[0])
    uids, gid = config.get("uids"), config.get("probe_uid") or config.get("gid")
    host.set_subreaper()
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
