"""The trusted side of a lab's sandbox: its scratch copy, the zygotes, and lab scripts.

- The scratch copy (:func:`make_scratch`): what the graded code may see. ``common/``, the
  grader's ``sandbox`` package (:data:`SANDBOX_CODE`), and the lab's folder with the
  submitted ``starter.py`` and the given ``provided.py``, without any test file, the
  solution (when grading starters) or ``__pycache__``; a clean environment with ``HOME``
  and ``TMPDIR`` inside the copy (:func:`sandbox_env`); and the modules a lab's files
  import, which its zygote imports first (:func:`lab_imports`).
- The zygotes: :class:`ZygoteClient` is one connection to a zygote
  (:mod:`grading.sandbox.zygote`): JSON requests with file descriptors attached.
  :class:`Mother` is a grading run's warm zygote: it imports torch once and forks the
  zygote of each lab.
- The seed (:func:`grading.sandbox.zygote.start_seed`): ``python -m grading`` imports
  numpy, torch and Triton once, before the grader reads anything of the course, and forks
  a child that waits; the run's :class:`Mother` becomes that child
  (:func:`grading.sandbox.zygote.serve_seed`) instead of a fresh interpreter importing
  torch again, and the lab's test process is forked from the same warm parent
  (:class:`ForkedChild`, :mod:`grading.run.runner`).
- Lab scripts (``common.testing.LabScript``): :class:`Registry` holds the sandboxes of one
  test process, in a file that ``COURSE_SCRIPT_PREFIX`` names;
  ``python -m grading.sandbox.lab_sandbox script --registry FILE -- script.py ...`` (what
  ``COURSE_SCRIPT_PREFIX`` runs, :func:`run_script`) forks the lab script from the lab's
  zygote into the sandbox; paths of the source tree become paths of the scratch copy, and
  an existing output folder the test passed becomes a sandbox folder whose files are copied
  back when the script ends.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import json
import os
import select
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from grading.sandbox import frames, host

# ---- scratch -----------------------------------------------------------------------------


ENV_DIR = "COURSE_SANDBOX_DIR"  # where scratch copies go (default: the system temp folder)


ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TRITON_INTERPRET",
            "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OPENBLAS_NUM_THREADS")
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")


BOOK_FILES = ("figures.py", "traces.py")  # a lab's figures and traces: the book's, not graded
PREIMPORTABLE = {"numpy", "torch", "triton", "scipy", "common"}


def lab_imports(lab_dir: Path) -> list[str]:
    """The modules a lab's files import (read, never run): what its zygote imports first."""
    names: list[str] = []
    for path in sorted(lab_dir.glob("*.py")):
        if is_test_file(path.name) or path.name in BOOK_FILES:  # never imported by graded
            continue  # code (tests are not even in the scratch copy): not the zygote's concern
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


# What of the project the sandbox runs: ``common`` and the grader's sandbox package (the
# zygote and the worker), never its plugin, its run or its tools.
SANDBOX_CODE = ("common", "grading/sandbox")
# ... and the GPU report's compiler, which the sandboxed compile step runs
# (:mod:`grading.sandbox.compiler`): trusted code, run there because it imports the graded file.
COMPILE_CODE = ("bench/__init__.py", "bench/gpu_compile.py", "bench/gpu_kernels.py",
                "bench/kernels.py", "bench/workloads.py", "bench/shapes.py", "bench/counts.py")
# ... less the float64 reference the tests compare with: graded code cannot import it,
# unless its lab's given provided.py imports it (lab-02 measures SDPA against it).
HIDDEN_FROM_SANDBOX = ("reference.py",)
REFERENCE_MODULE = "common.reference"


def gives_reference(lab_dir: Path) -> bool:
    """Does the lab's given ``provided.py`` import :data:`REFERENCE_MODULE` (read, never
    run; the submitted starter has no say)?"""
    path = lab_dir / "provided.py"
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == REFERENCE_MODULE:
            return True
        if isinstance(node, ast.Import) and any(a.name == REFERENCE_MODULE for a in node.names):
            return True
    return False


def copy_code(root: Path, scratch: Path, owned_by_root: bool, reference: bool = False) -> None:
    """Copy :data:`SANDBOX_CODE` of ``root`` into ``scratch`` (read-only to the sandbox),
    without :data:`HIDDEN_FROM_SANDBOX` (``reference``: with it)."""
    hidden = () if reference else HIDDEN_FROM_SANDBOX
    for rel in SANDBOX_CODE:
        shutil.copytree(root / rel, scratch / rel, symlinks=True,
                        ignore=shutil.ignore_patterns("*.tmp", "__pycache__", *hidden))
    shutil.copy2(root / "grading" / "__init__.py", scratch / "grading" / "__init__.py")
    for rel in COMPILE_CODE:
        if (root / rel).is_file():
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, scratch / rel)
    if owned_by_root:
        copy_code_owner(scratch)


def copy_code_owner(scratch: Path) -> None:
    """Root owns the copied code; the sandbox may read it."""
    for top in {rel.split("/")[0] for rel in (*SANDBOX_CODE, *COMPILE_CODE)}:
        if (scratch / top).is_dir():
            _chown_tree(scratch / top, 0, 0o755, 0o644)


def make_scratch(root: Path, lab: Path, impl: str, gid: int | None, base: Path | None = None
                 ) -> Path:
    """The scratch tree of one lab (see the module docstring); returns its root."""
    scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-", dir=base))
    src = root / "labs" / lab.name
    copy_code(root, scratch, owned_by_root=False, reference=gives_reference(src))
    _copy_lab(src, scratch / "labs" / lab.name, impl)
    for name in ("home", "tmp", "out"):
        (scratch / name).mkdir()
    if gid is not None:  # root owns it all; the lab's group may write its own folders
        os.chmod(scratch, 0o755)
        copy_code_owner(scratch)
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
        # the trained weights the course ships (public): a private /tmp mounts them back
        COURSE_MODELS_DIR=str(Path(__file__).resolve().parents[2] / "models"),
    )
    env.setdefault("PATH", os.defpath)
    return env


# ---- zygote client -----------------------------------------------------------------------


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


def exit_child(body: Callable[[], int], run_exit_handlers: bool = False) -> NoReturn:
    """In a forked child: ``body()``, then leave with its status (a ``SystemExit``'s code; 70
    and the traceback printed for any other exception) through ``os._exit``, so nothing of
    the parent's clean-up runs here; output is flushed first, and the child's own exit
    handlers run before it when ``run_exit_handlers``."""
    code = 70
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            if run_exit_handlers:
                atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class ForkedChild:
    """A child this process forked (the seed, a lab's test process), seen as
    :class:`subprocess.Popen` sees one: ``pid``, ``poll``, ``wait(timeout)``, ``kill``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (the run's sweep)
                self.returncode = -9
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = -1
        try:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
                if pidfd >= 0:
                    select.select([pidfd], [], [], left)
                else:
                    time.sleep(0.02 if left is None else min(left, 0.02))
        finally:
            if pidfd >= 0:
                os.close(pidfd)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


_SEED: dict[str, Any] = {"preloaded": False, "pid": None, "sock": None}


def keep_seed(pid: int | None, sock: socket.socket | None) -> None:
    """This process is warm (:func:`grading.sandbox.zygote.start_seed` imported torch here);
    ``pid``/``sock``: its seed, for the run's :class:`Mother`."""
    _SEED.update(preloaded=True, pid=pid, sock=sock)


def preloaded() -> bool:
    """Did :func:`grading.sandbox.zygote.start_seed` import torch in this process (the
    front door)?"""
    return bool(_SEED["preloaded"])


def _take_seed() -> tuple[int, socket.socket] | None:
    pid, sock = _SEED["pid"], _SEED["sock"]
    _SEED.update(pid=None, sock=None)
    return None if pid is None else (pid, sock)


class Mother:
    """The grading run's warm zygote: it imports torch, triton and ``common`` once and forks
    the zygote of each lab (:class:`LabSandbox`), so that a lab's sandbox costs a fork
    instead of a second torch import beside the lab's pytest. Never runs graded code."""

    def __init__(self, root: Path, probe_uid: int | None, modules: list[str]) -> None:
        base = os.environ.get(ENV_DIR) or None
        self.scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-", dir=base))
        copy_code(root, self.scratch, owned_by_root=probe_uid is not None)
        if probe_uid is not None:
            os.chmod(self.scratch, 0o755)
        self.private = Path(tempfile.mkdtemp(prefix="course-grading-"))
        path = str(self.private / "mother.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        config = {"listen_fd": listener.fileno(), "probe_uid": probe_uid, "lab_dir": None,
                  "uids": None, "gid": None, "modules": modules}
        env = sandbox_env(self.scratch, "starter")
        seed = _take_seed()
        self.proc: subprocess.Popen | ForkedChild
        with open(self.private / "mother.log", "wb") as log:
            if seed is not None:  # the seed: torch is imported there already
                frames.send_frame(seed[1], json.dumps(
                    dict(config, cwd=str(self.scratch), env=env)).encode(),
                    [listener.fileno(), log.fileno()])
                seed[1].close()
                self.proc = ForkedChild(seed[0])
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "grading.sandbox.zygote", json.dumps(config)],
                    cwd=self.scratch, env=env, pass_fds=[listener.fileno()],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
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
        host.kill_tree({self.proc.pid}, sessions={self.proc.pid})
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)


# ---- lab script --------------------------------------------------------------------------


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
        return shlex.join([sys.executable, "-m", "grading.sandbox.lab_sandbox", "script",
                           "--registry", str(self.path), "--"])

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


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
