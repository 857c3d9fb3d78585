"""The zygotes, from the trusted side: talking to one, and the run's warm one.

:class:`ZygoteClient` is one connection to a zygote (:mod:`common.grading.zygote`): JSON
requests with file descriptors attached. :class:`Mother` is a grading run's warm zygote:
it imports torch once and forks the zygote of each lab.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.grading import frames, procs
from common.grading.scratch import ENV_DIR, _chown_tree, sandbox_env

ZYGOTE_START_TIMEOUT = 300.0  # importing torch on a loaded machine; not the student's time


class ZygoteClient:
    """One connection to a zygote: JSON requests, file descriptors attached; replies carry
    their request's id, so a request need not wait for its reply (thread-safe)."""

    def __init__(self, path: str, deadline: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lock = threading.Lock()
        self.last_id = 0
        self.pending: dict[int, dict[str, Any]] = {}
        while True:
            try:
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def send(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> int:
        """Send a request without waiting; returns its id (see :meth:`result`)."""
        with self.lock:
            self.last_id += 1
            rid = self.last_id
            frames.send_frame(self.sock, json.dumps(dict(message, id=rid)).encode(), fds)
        return rid

    def result(self, rid: int, deadline: float | None = None) -> dict[str, Any]:
        with self.lock:
            while rid not in self.pending:
                reply = self.receive(deadline)
                self.pending[reply.get("id")] = reply
            return self.pending.pop(rid)

    def request(self, message: dict[str, Any], fds: list[int] | tuple[int, ...] = (),
                deadline: float | None = None) -> dict[str, Any]:
        return self.result(self.send(message, fds), deadline)

    def receive(self, deadline: float | None = None) -> dict[str, Any]:
        data, _ = frames.recv_frame(self.sock, deadline, max_size=1 << 24)
        return json.loads(data)

    def close(self) -> None:
        self.sock.close()


@dataclass
class WorkerProcess:
    pid: int
    sock: socket.socket
    log: Path
    stack: Path


class Mother:
    """The grading run's warm zygote: it imports torch, triton and ``common`` once and forks
    the zygote of each lab (:class:`LabSandbox`), so that a lab's sandbox costs a fork
    instead of a second torch import beside the lab's pytest. Never runs graded code."""

    def __init__(self, root: Path, probe_uid: int | None, modules: list[str]) -> None:
        base = os.environ.get(ENV_DIR) or None
        self.scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-", dir=base))
        shutil.copytree(root / "common", self.scratch / "common", symlinks=True)
        if probe_uid is not None:
            os.chmod(self.scratch, 0o755)
            _chown_tree(self.scratch / "common", 0, 0o755, 0o644)
        self.private = Path(tempfile.mkdtemp(prefix="course-grading-"))
        path = str(self.private / "mother.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        config = {"listen_fd": listener.fileno(), "probe_uid": probe_uid, "lab_dir": None,
                  "uids": None, "gid": None, "modules": modules}
        with open(self.private / "mother.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "common.grading.zygote", json.dumps(config)],
                cwd=self.scratch, env=sandbox_env(self.scratch, "starter"),
                pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        listener.close()
        self.client = ZygoteClient(path, time.monotonic() + 60)
        self.client.send({"op": "control"})  # its reply comes once torch is imported

    def spawn(self, config: dict[str, Any], listen_fd: int) -> int:
        """Ask for a lab's zygote listening on ``listen_fd``; returns the request's id at
        once (the lab's pytest starts meanwhile and waits on that socket)."""
        return self.client.send({"op": "lab", "config": config}, fds=[listen_fd])

    def end(self, spawn_id: int) -> None:
        """After the lab: its zygote has exited (its test process went); else kill it."""
        try:
            pid = self.client.result(spawn_id, time.monotonic() + ZYGOTE_START_TIMEOUT)["pid"]
            if self.client.request({"op": "wait", "pid": pid},
                                   deadline=time.monotonic() + 10).get("code") is None:
                self.client.request({"op": "kill", "pid": pid}, deadline=time.monotonic() + 60)
        except (OSError, EOFError, TimeoutError, KeyError, frames.FrameError):
            pass

    def close(self) -> None:
        self.client.close()  # it kills everything it started, then exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        procs.kill_tree({self.proc.pid}, sessions={self.proc.pid})
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)
