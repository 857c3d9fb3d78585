"""Where the graded code runs under the grader: a scratch copy, another uid, a zygote.

For each lab the trusted test process (``common.grading.proxy``) sets up a
:class:`LabSandbox`:

- a **scratch copy** of what the graded code needs: ``common/``, and the lab's folder with
  the submitted ``starter.py`` and the given ``provided.py``, without any test file, the
  solution (when grading starters) or ``__pycache__``; the worker runs there, in a clean
  environment (``HOME`` and ``TMPDIR`` inside it, ``PYTHONHASHSEED=0``);
- a **user switch** when the grader runs as root (Gradescope): every process of the graded
  code gets a uid of its own from the lab's block (``COURSE_SANDBOX_UIDS``, default a free
  block in 61000-64999; no account is needed), sharing the lab's group for the scratch
  folder. :func:`lock_tree` has made the tests unreadable and the source tree and the
  results not writable for it. Ending "everything of that uid" ends everything it started,
  double forks and ``setsid`` included (:mod:`common.grading.procs`). Without root (a
  student's laptop) the same process split runs without the switch: the graded code cannot
  patch the grader's process, but it runs with the grader's own permissions;
- a **zygote** (:mod:`common.grading.worker`) that imported torch once and forks workers
  and lab scripts on request.

``python -m common.grading.sandbox script ...`` is what ``COURSE_SCRIPT_PREFIX`` runs for a
``common.testing.LabScript``: the lab script is forked from the zygote into the sandbox;
paths of the source tree become paths of the scratch copy, and an existing output folder
the test passed becomes a sandbox folder whose files are copied back when the script ends.
``python -m common.grading.sandbox check`` says which mode this machine gets.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.grading import procs, wire

ENV_ENABLE = "COURSE_SANDBOX"  # "1": load_impl returns a proxy (set by the grader)
ENV_UIDS = "COURSE_SANDBOX_UIDS"  # "61000-61063" (a lab's block), "none", or unset (auto)
ENV_DIR = "COURSE_SANDBOX_DIR"  # where scratch copies go (default: the system temp folder)
UID_RANGE = (61000, 65000)
UIDS_PER_LAB = 64
ZYGOTE_START_TIMEOUT = 300.0  # importing torch on a loaded machine; not the student's time
ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TRITON_INTERPRET",
            "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OPENBLAS_NUM_THREADS")
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")


class SandboxError(RuntimeError):
    """The sandbox could not be set up (not the graded code's fault)."""


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "").strip() not in ("", "0")


# ---- uids ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """How the graded code is isolated: ``uids`` is ``(first, stop)`` of a lab's block, or
    ``None`` for the process split alone (``reason`` says why)."""

    uids: tuple[int, int] | None
    reason: str = ""

    def describe(self) -> str:
        if self.uids is not None:
            return (f"user switch: the graded code runs as uids {self.uids[0] + 1}-"
                    f"{self.uids[1] - 1} in a scratch copy; it cannot read the tests or "
                    "write the source tree or the results")
        return (f"process split only ({self.reason}): the graded code runs in a separate "
                "worker process, so it cannot patch the tests or the grader, but it has the "
                "grader's own file permissions")


def _uid_in_use(uid: int, running: set[int]) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return uid in running


def can_switch_user(uid: int) -> str | None:
    """``None`` if this process can run a child as ``uid``, else why not."""
    if not hasattr(os, "setuid") or not hasattr(os, "fork"):
        return "this platform has no user switch"
    if os.geteuid() != 0:
        return "not running as root"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return f"cannot switch to uid {uid} here (a user namespace without it?)"
    return None


_reserved: dict[int, int] = {}  # block start -> open, locked file (held by this process)


def _reserve(start: int) -> bool:
    """Hold ``start``'s block for as long as this process lives (a lock file that the
    kernel releases when the process dies): concurrent gradings never share a uid."""
    import fcntl

    folder = Path(tempfile.gettempdir()) / "course-sandbox-uids"
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / f"block-{start}", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _reserved[start] = fd
    return True


def release(blocks: list[tuple[int, int]]) -> None:
    for start, _ in blocks:
        fd = _reserved.pop(start, None)
        if fd is not None:
            os.close(fd)


def allocate_uid_blocks(count: int, rng: random.Random | None = None) -> list[tuple[int, int]]:
    """``count`` blocks of :data:`UIDS_PER_LAB` uids that no account and no process uses,
    reserved for this process (see :func:`_reserve`)."""
    rng = rng or random.Random()
    running = {u for _, _, u in procs.proc_table().values()} if procs.have_proc() else set()
    lo, hi = UID_RANGE
    starts = list(range(lo, hi - UIDS_PER_LAB + 1, UIDS_PER_LAB))
    rng.shuffle(starts)
    blocks = []
    for start in starts:
        if any(_uid_in_use(u, running) for u in range(start, start + UIDS_PER_LAB)):
            continue
        if _reserve(start):
            blocks.append((start, start + UIDS_PER_LAB))
            if len(blocks) == count:
                return blocks
    raise SandboxError(f"no free block of {UIDS_PER_LAB} uids in {lo}-{hi - 1}")


def parse_uids(spec: str) -> tuple[int, int]:
    first, _, last = spec.partition("-")
    lo, hi = int(first), int(last or first) + 1
    if hi - lo < 2 or lo <= 0:
        raise ValueError(f"{ENV_UIDS}={spec!r}: give a block such as 61000-61063")
    return lo, hi


def choose_mode(labs: int = 1) -> tuple[Mode, list[tuple[int, int]]]:
    """The mode for this machine and, with a user switch, one uid block per lab."""
    spec = os.environ.get(ENV_UIDS, "").strip().lower()
    if spec in ("none", "off", "no", "0"):
        return Mode(None, f"{ENV_UIDS}={spec}"), []
    if spec:
        block = parse_uids(spec)
        return Mode(block), [block] * labs
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return Mode(None, "not running as root, so there is no other user to switch to"), []
    try:
        blocks = allocate_uid_blocks(labs)
    except SandboxError as exc:
        return Mode(None, str(exc)), []
    reason = can_switch_user(blocks[0][0])
    if reason is not None:
        return Mode(None, reason), []
    return Mode(blocks[0]), blocks


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


# ---- the scratch copy ----------------------------------------------------------------------


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


# ---- the zygote, from the trusted side ------------------------------------------------------


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
            wire.send_frame(self.sock, json.dumps(dict(message, id=rid)).encode(), fds)
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
        data, _ = wire.recv_frame(self.sock, deadline, max_size=1 << 24)
        return json.loads(data)

    def close(self) -> None:
        self.sock.close()


@dataclass
class WorkerProcess:
    pid: int
    sock: socket.socket
    log: Path
    stack: Path


ENV_ZYGOTE = "COURSE_SANDBOX_ZYGOTE"  # a sandbox the grader started for the test process


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
                [sys.executable, "-m", "common.grading.worker", json.dumps(config)],
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
        except (OSError, EOFError, TimeoutError, KeyError, wire.FrameError):
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


class LabSandbox:
    """The scratch copy, the zygote and the uid block of one lab, for one test process.

    The grader starts it next to the lab's pytest process (the zygote imports torch while
    pytest does) and hands it over in ``COURSE_SANDBOX_ZYGOTE`` (:meth:`attach`); the test
    process holds the zygote's control connection, and when it goes the zygote kills
    everything it started and exits.
    """

    owner = True

    def __init__(self, root: Path, lab: Path, impl: str, mode: Mode,
                 mother: Mother | None = None) -> None:
        self.root, self.lab, self.impl, self.mode = root.resolve(), lab.resolve(), impl, mode
        uids = mode.uids
        self.gid = uids[0] if uids else None
        base = os.environ.get(ENV_DIR) or None
        self.scratch = make_scratch(self.root, self.lab, impl, self.gid,
                                    Path(base) if base else None)
        self.private = Path(tempfile.mkdtemp(prefix="course-grading-"))  # 0700, ours only
        self.socket_path = str(self.private / "zygote.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        listener.listen(64)
        config = {"listen_fd": listener.fileno(), "gid": self.gid,
                  "lab_dir": str(self.scratch / "labs" / self.lab.name),
                  "uids": [uids[0] + 1, uids[1]] if uids else None}
        self.zygote_log = self.private / "zygote.log"
        self.zygote: subprocess.Popen | None = None
        self.mother, self.spawn_id = mother, None
        env = sandbox_env(self.scratch, impl)
        if mother is not None:  # forked from the run's warm zygote: torch is imported already
            self.spawn_id = mother.spawn(dict(config, cwd=str(self.scratch), env=env),
                                         listener.fileno())
        else:
            with open(self.zygote_log, "wb") as log:
                self.zygote = subprocess.Popen(
                    [sys.executable, "-m", "common.grading.worker", json.dumps(config)],
                    cwd=self.scratch, env=env, pass_fds=[listener.fileno()],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        listener.close()
        self.client: ZygoteClient | None = None
        self.count = 0

    def info(self) -> dict[str, Any]:
        return {"root": str(self.root), "lab": str(self.lab), "impl": self.impl,
                "uids": self.mode.uids, "scratch": str(self.scratch),
                "private": str(self.private), "socket": self.socket_path}

    @classmethod
    def attach(cls, info: dict[str, Any]) -> LabSandbox:
        """The test process's view of a sandbox the grader started (it does not own it)."""
        box = cls.__new__(cls)
        box.owner = False
        box.root, box.lab, box.impl = Path(info["root"]), Path(info["lab"]), info["impl"]
        uids = tuple(info["uids"]) if info.get("uids") else None
        box.mode = Mode(uids, "" if uids else "set by the grader")  # type: ignore[arg-type]
        box.gid = uids[0] if uids else None
        box.scratch, box.private = Path(info["scratch"]), Path(info["private"])
        box.socket_path = info["socket"]
        box.zygote_log = box.private / "zygote.log"
        box.zygote = None  # type: ignore[assignment]
        box.client = None
        box.count = 0
        return box

    @property
    def scratch_lab(self) -> Path:
        return self.scratch / "labs" / self.lab.name

    def connect(self) -> ZygoteClient:
        """The control connection, once the zygote has finished importing."""
        if self.client is None:
            deadline = time.monotonic() + ZYGOTE_START_TIMEOUT
            try:
                client = ZygoteClient(self.socket_path, deadline)
                reply = client.request({"op": "control"}, deadline=deadline)
                if "error" in reply:
                    raise OSError(reply["error"])
            except (OSError, EOFError, TimeoutError) as exc:
                raise SandboxError(f"the sandbox did not start: {exc!r}\n{self.log_tail()}"
                                   ) from None
            self.client = client
        return self.client

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.zygote_log.read_bytes()[-size:].decode("utf-8", "replace")
        except OSError:
            return ""

    def spawn_worker(self, generation: int, deadline: float) -> WorkerProcess:
        client = self.connect()
        self.count += 1
        parent, child = socket.socketpair()
        log = self.private / f"worker-{self.count}.log"
        stack = self.private / f"stack-{self.count}.txt"
        with open(log, "wb") as log_file, open(stack, "wb") as stack_file:
            reply = client.request(
                {"op": "worker", "gen": generation, "lab_dir": str(self.scratch_lab),
                 "impl": self.impl, "cwd": str(self.scratch)},
                fds=[child.fileno(), log_file.fileno(), stack_file.fileno()],
                deadline=deadline,
            )
        child.close()
        return WorkerProcess(reply["pid"], parent, log, stack)

    def kill(self, pid: int, wait: bool = True) -> None:
        """End ``pid`` and everything it started (``wait=False``: do not wait for it)."""
        if self.client is not None:
            if wait:
                self.client.request({"op": "kill", "pid": pid}, deadline=time.monotonic() + 60)
            else:
                self.client.send({"op": "kill", "pid": pid})

    def exit_code(self, pid: int, timeout: float = 2.0) -> int | None:
        if self.client is None:
            return None
        try:
            return self.client.request({"op": "wait", "pid": pid},
                                       deadline=time.monotonic() + timeout).get("code")
        except TimeoutError:
            return None

    def registry_entry(self) -> dict[str, Any]:
        return {"socket": self.socket_path, "trusted": str(self.root),
                "scratch": str(self.scratch), "gid": self.gid}

    def close(self) -> None:
        """Kill every process of this lab's sandbox and delete the scratch copy."""
        if self.client is not None:
            self.client.close()  # the zygote kills everything it started, then exits
            self.client = None
        if not self.owner:
            return
        if self.zygote is not None:
            try:
                self.zygote.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            procs.kill_tree({self.zygote.pid}, sessions={self.zygote.pid})
            if self.zygote.poll() is None:
                self.zygote.kill()
                self.zygote.wait()
        elif self.mother is not None and self.spawn_id is not None:
            self.mother.end(self.spawn_id)
        if self.mode.uids is not None:
            kill_block(self.mode.uids)
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)


class Registry:
    """The sandboxes of one test process, for the script helper (``COURSE_SCRIPT_PREFIX``)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="course-scripts-"))  # 0700, ours only
        self.path = self.folder / "sandboxes.json"
        self.entries: dict[str, dict[str, Any]] = {}

    def add(self, lab: str, entry: dict[str, Any]) -> None:
        self.entries[lab] = entry
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries), encoding="utf-8")
        os.replace(tmp, self.path)

    def prefix(self) -> str:
        return shlex.join([sys.executable, "-m", "common.grading.sandbox", "script",
                           "--registry", str(self.path), "--"])

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# ---- protecting the source tree (with a user switch) ---------------------------------------


def lock_tree(root: Path, results: Path | None = None, impl: str = "starter"
              ) -> Callable[[], None]:
    """Make ``root`` unwritable and unlistable for other users (they may still pass through
    its folders, to the venv say), its tests (and solutions, when grading starters)
    unreadable; ``results``' folder unwritable. Returns ``restore()``."""
    saved: list[tuple[str, int]] = []

    def set_mode(path: str, mode: int) -> None:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return
        old = stat.S_IMODE(st.st_mode)
        if mode != old:
            os.chmod(path, mode)
            saved.append((path, old))

    secret_dirs = {"tests"}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith((".venv", ".git"))]
        rel = Path(dirpath).relative_to(root)
        hidden_dir = bool(rel.parts) and rel.parts[0] in secret_dirs
        mode = stat.S_IMODE(os.lstat(dirpath).st_mode) & ~0o066  # others may pass, not list
        set_mode(dirpath, mode & ~0o077 if hidden_dir else mode)
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = stat.S_IMODE(os.lstat(path).st_mode) & ~0o022
            secret = hidden_dir or is_test_file(name) or name.startswith("test_") or (
                impl == "starter" and name.startswith("solution")) or name.endswith(".mutant")
            set_mode(path, mode & ~0o077 if secret else mode)
    if results is not None:
        folder = results.parent
        folder.mkdir(parents=True, exist_ok=True)
        set_mode(str(folder), stat.S_IMODE(os.lstat(folder).st_mode) & ~0o022)
        if results.exists():
            set_mode(str(results), stat.S_IMODE(os.lstat(results).st_mode) & ~0o077)

    def restore() -> None:
        for path, mode in reversed(saved):
            try:
                os.chmod(path, mode)
            except OSError:
                pass

    return restore


def kill_block(block: tuple[int, int]) -> None:
    """Kill every process running under a uid of ``block``."""
    lo, hi = block
    running = {u for _, _, u in procs.proc_table().values()} if procs.have_proc() else set(
        range(lo, hi))
    for uid in range(lo, hi):
        if uid in running:
            procs.kill_uid(uid, lo)


def sweep(blocks: list[tuple[int, int]], descendants: bool) -> None:
    """Kill every process of the sandbox uids and (``descendants``) every process left below
    this one: with the subreaper set, a double-forked daemon of the graded code is one."""
    for block in blocks:
        kill_block(block)
    if descendants and procs.have_proc():
        procs.reap(procs.kill_tree({os.getpid()}, include_roots=False))


@dataclass
class Session:
    """How one grading run isolates the graded code (see :func:`grading_session`)."""

    description: str
    sandboxed: bool
    blocks: dict[str, tuple[int, int]]  # lab -> its uid block (with the user switch)
    mother: Mother | None = None


@contextlib.contextmanager
def grading_session(root: Path, labs: list[str], enabled: bool, results: Path | None = None,
                    impl: str = "starter", top_level: bool = False):
    """Around a grading run: choose the mode, give each lab a uid block, lock the source
    tree, start the run's warm zygote, and at the end kill whatever the graded code left
    behind (``top_level``: also every descendant of this process) and restore the tree.
    Yields a :class:`Session`."""
    if not enabled:
        yield Session("none (--no-sandbox): the graded code runs inside the test process",
                      False, {})
        return
    if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        yield Session("none: this platform cannot fork a sandboxed worker (Windows), so the "
                      "graded code runs inside the test process", False, {})
        return
    mode, blocks = choose_mode(len(labs))
    if top_level:
        procs.set_subreaper()
    restore = lock_tree(root, results, impl) if mode.uids is not None else (lambda: None)
    session = Session(mode.describe(), True, dict(zip(labs, blocks)))
    try:
        try:
            modules = sorted({m for lab in labs for m in lab_imports(root / "labs" / lab)})
            session.mother = Mother(root, blocks[0][0] if blocks else None, modules)
        except (OSError, SandboxError):
            session.mother = None  # each lab starts a zygote of its own instead
        yield session
    finally:
        if session.mother is not None:
            session.mother.close()
        sweep(blocks, descendants=top_level)
        restore()
        release(blocks)


# ---- the script helper (COURSE_SCRIPT_PREFIX) -----------------------------------------------


def _map_path(value: str, trusted: Path, scratch: Path, outputs: list[tuple[Path, Path]],
              gid: int | None) -> str:
    path = Path(value)
    if not path.is_absolute():
        return value
    try:
        return str(scratch / path.resolve().relative_to(trusted))
    except ValueError:
        pass
    if path.is_dir():  # an output folder of the test: the script writes a sandbox copy
        out = scratch / "out" / f"{os.getpid()}-{len(outputs)}"
        out.mkdir(parents=True)
        if gid is not None:
            os.chown(out, 0, gid)
            os.chmod(out, 0o2770)
        outputs.append((path, out))
        return str(out)
    return value


def _copy_back(outputs: list[tuple[Path, Path]], limit: int = 256 * 2**20) -> None:
    budget = limit
    for original, sandboxed in outputs:
        for dirpath, dirnames, filenames in os.walk(sandboxed):
            rel = Path(dirpath).relative_to(sandboxed)
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                src = Path(dirpath) / name
                st = src.lstat()
                if not stat.S_ISREG(st.st_mode) or st.st_size > budget:
                    continue
                budget -= st.st_size
                (original / rel).mkdir(parents=True, exist_ok=True)
                with open(src, "rb") as fin, open(original / rel / name, "wb") as fout:
                    shutil.copyfileobj(fin, fout)


def run_script(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and Path(argv[0]).name.startswith("python"):
        argv = argv[1:]
    if not argv or argv[0].startswith("-"):
        print(f"sandbox script: expected a script path, got {argv!r}", file=sys.stderr)
        return 2
    script = Path(argv[0]).resolve()
    entries = json.loads(Path(args.registry).read_text(encoding="utf-8"))
    entry = next((e for e in entries.values()
                  if script.is_relative_to(Path(e["trusted"]) / "labs")
                  and (Path(e["scratch"]) / script.relative_to(e["trusted"])).exists()), None)
    if entry is None:
        print(f"sandbox script: {script} is not a script of a sandboxed lab", file=sys.stderr)
        return 2
    trusted, scratch, gid = Path(entry["trusted"]), Path(entry["scratch"]), entry["gid"]
    outputs: list[tuple[Path, Path]] = []
    mapped = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.startswith("-"):
            mapped.append(f"{key}={_map_path(value, trusted, scratch, outputs, gid)}")
        else:
            mapped.append(_map_path(arg, trusted, scratch, outputs, gid))
    cwd = _map_path(os.getcwd(), trusted, scratch, [], gid)
    if not Path(cwd).is_relative_to(scratch):
        cwd = str(scratch)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COURSE_", "PYTEST_", "HYPOTHESIS"))}
    env.update({k: v for k, v in sandbox_env(scratch, env.get("LAB_IMPL", "starter")).items()
                if k not in ("PATH",)})
    client = ZygoteClient(entry["socket"], time.monotonic() + 30)
    reply = client.request({"op": "script", "argv": mapped, "cwd": cwd, "env": env},
                           fds=[0, 1, 2], deadline=time.monotonic() + ZYGOTE_START_TIMEOUT)
    pid = reply["pid"]
    while True:
        message = client.receive()
        if message.get("exit") == pid:
            code = message["code"]
            break
    _copy_back(outputs)
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.grading.sandbox")
    sub = parser.add_subparsers(dest="command", required=True)
    script = sub.add_parser("script", help="run a lab script in a lab's sandbox")
    script.add_argument("--registry", required=True)
    script.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("check", help="say how the graded code would be isolated here")
    args = parser.parse_args(argv)
    if args.command == "check":
        mode, _ = choose_mode()
        print(mode.describe())
        return 0
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return run_script(args)


if __name__ == "__main__":
    sys.exit(main())
