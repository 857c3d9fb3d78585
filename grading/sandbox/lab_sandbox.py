"""Where the graded code runs under the grader, and the grading run around it.

For each lab the trusted test process (``grading.plugin.proxy``) sets up a
:class:`LabSandbox`:

- a **scratch copy** of what the graded code needs (:mod:`grading.sandbox.zygote_client`):
  ``common/``, the grader's sandbox package, and the lab's folder with the submitted
  ``starter.py`` and the given ``provided.py``, without any test file, the solution (when
  grading starters) or ``__pycache__``; the worker runs there, in a clean environment
  (``HOME`` and ``TMPDIR`` inside it, ``PYTHONHASHSEED=0``);
- a **user switch** when the grader runs as root (Gradescope): every process of the graded
  code gets a uid of its own from the lab's block (``COURSE_SANDBOX_UIDS``, default a free
  block in 61000-64999; no account is needed), sharing the lab's group for the scratch
  folder (:mod:`grading.sandbox.host`). :func:`lock_tree` has made the tests unreadable and
  the source tree and the results not writable for it. Ending "everything of that uid" ends
  everything it started, double forks and ``setsid`` included. Without root (a student's
  laptop) the same process split runs without the switch: the graded code cannot patch the
  grader's process, but it runs with the grader's own permissions;
- a **zygote** (:mod:`grading.sandbox.zygote`) that imported torch once and forks workers
  and lab scripts on request (:mod:`grading.sandbox.zygote_client` talks to it).

Around a grading run, :func:`grading_session` chooses the mode, gives each lab a uid block,
locks the source tree (:func:`lock_tree`: with a user switch, the tests and solutions
unreadable and the tree and the results unwritable for the sandbox uids), starts the run's
warm zygote, and at the end kills whatever the graded code left behind (:func:`sweep`) and
restores the tree.

``python -m grading.sandbox.lab_sandbox script ...`` is what ``COURSE_SCRIPT_PREFIX`` runs
for a ``common.testing.LabScript``; ``python -m grading.sandbox.lab_sandbox check`` says
which mode this machine gets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grading.sandbox import frames, host
from grading.sandbox.confine import Rehearsal
from grading.sandbox.host import (
    Mode,
    SandboxError,
    SandboxRefused,
    choose_mode,
    kill_block,
    release,
)
from grading.sandbox.zygote_client import (
    ENV_DIR,
    ZYGOTE_START_TIMEOUT,
    Mother,
    WorkerProcess,
    ZygoteClient,
    is_test_file,
    lab_imports,
    make_scratch,
    run_script,
    sandbox_env,
)

# ---- session -----------------------------------------------------------------------------


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


def sweep(blocks: list[tuple[int, int]], descendants: bool) -> None:
    """Kill every process of the sandbox uids and (``descendants``) every process left below
    this one: with the subreaper set, a double-forked daemon of the graded code is one."""
    for block in blocks:
        kill_block(block)
    if descendants and host.have_proc():
        host.reap(host.kill_tree({os.getpid()}, include_roots=False))


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
    with Rehearsal() as prepare:  # the pre-flight sees what a sandboxed process will
        mode, blocks = choose_mode(len(labs), prepare)
    if mode.refused:
        raise SandboxRefused(mode.refusal())
    if top_level:
        host.set_subreaper()
    restore = lock_tree(root, results, impl) if mode.uids is not None else (lambda: None)
    session = Session(f"{mode.describe(blocks)}; {host.memory_accounting()}", True,
                      dict(zip(labs, blocks)))
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


# ---- sandbox -----------------------------------------------------------------------------


PROGRAM_REPLY_LIMIT = 8 << 20  # bytes a sandboxed program may answer (plain JSON)
ENV_ENABLE = "COURSE_SANDBOX"  # "1": load_impl returns a proxy (set by the grader)
ENV_ZYGOTE = "COURSE_SANDBOX_ZYGOTE"  # a sandbox the grader started for the test process


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "").strip() not in ("", "0")


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
                    [sys.executable, "-m", "grading.sandbox.zygote", json.dumps(config)],
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

    def spawn_worker(self, generation: int, deadline: float, measure: bool = False
                     ) -> WorkerProcess:
        client = self.connect()
        self.count += 1
        parent, child = socket.socketpair()
        log = self.private / f"worker-{self.count}.log"
        stack = self.private / f"stack-{self.count}.txt"
        with open(log, "wb") as log_file, open(stack, "wb") as stack_file:
            reply = client.request(
                {"op": "worker", "gen": generation, "lab_dir": str(self.scratch_lab),
                 "impl": self.impl, "cwd": str(self.scratch), "measure": measure},
                fds=[child.fileno(), log_file.fileno(), stack_file.fileno()],
                deadline=deadline,
            )
        child.close()
        return WorkerProcess(reply["pid"], parent, log, stack)

    def run_program(self, argv: list[str], stdin: bytes, deadline: float,
                    max_reply: int = PROGRAM_REPLY_LIMIT,
                    env: dict[str, str] | None = None) -> tuple[int | None, bytes, str]:
        """Run ``python <argv>`` as a fresh interpreter in the sandbox (forked by the zygote,
        in the sandbox before it ``exec`` s), ``stdin`` as its input; ``(exit code or None
        when it was killed at ``deadline`` or for a reply over ``max_reply`` bytes, its
        standard output, the tail of its log)``. Its own client connection: the test
        process's control connection is not needed."""
        self.connect()
        client = ZygoteClient(self.socket_path, deadline)
        self.count += 1
        log = self.private / f"program-{self.count}.log"
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        full_env = sandbox_env(self.scratch, self.impl) | dict(env or {})
        try:
            with open(log, "wb") as log_file:
                reply = client.request(
                    {"op": "program", "argv": list(argv), "cwd": str(self.scratch),
                     "env": full_env},
                    fds=[in_r, out_w, log_file.fileno()], deadline=deadline)
            os.close(in_r)
            os.close(out_w)
            in_r = out_w = -1
            pid = reply["pid"]
            writer = [in_w]
            in_w = -1
            out, complete = _read_bounded(out_r, writer, stdin, deadline, max_reply)
            in_w = writer[0]
            code = None
            if complete:
                left = max(deadline - time.monotonic(), 0.1)
                code = client.request({"op": "wait", "pid": pid},
                                      deadline=time.monotonic() + left).get("code")
            if code is None:
                client.request({"op": "kill", "pid": pid}, deadline=time.monotonic() + 60)
            return code, out, _file_tail(log)
        except (OSError, EOFError, TimeoutError, KeyError, frames.FrameError) as exc:
            return None, b"", f"{_file_tail(log)}\n(the sandbox: {exc!r})"
        finally:
            for fd in (in_r, out_w, out_r, in_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            client.close()

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
            host.kill_tree({self.zygote.pid}, sessions={self.zygote.pid})
            if self.zygote.poll() is None:
                self.zygote.kill()
                self.zygote.wait()
        elif self.mother is not None and self.spawn_id is not None:
            self.mother.end(self.spawn_id)
        if self.mode.uids is not None:
            kill_block(self.mode.uids)
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)


def _read_bounded(out_r: int, writer: list[int], data: bytes, deadline: float, limit: int
                  ) -> tuple[bytes, bool]:
    """Write ``data`` to ``writer[0]`` (then close it and set -1 there) while reading
    ``out_r`` to its end; ``(what was read, True)``, or ``False`` at ``deadline`` or past
    ``limit`` bytes."""
    import selectors

    in_w = writer[0]
    chunks: list[bytes] = []
    size = 0
    sel = selectors.DefaultSelector()
    os.set_blocking(in_w, False)
    sel.register(out_r, selectors.EVENT_READ)
    if data:
        sel.register(in_w, selectors.EVENT_WRITE)
    else:
        os.close(in_w)
        writer[0] = -1
    view = memoryview(data)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), False
            for key, _ in sel.select(min(left, 1.0)):
                if key.fd == out_r:
                    chunk = os.read(out_r, 1 << 16)
                    if not chunk:
                        return b"".join(chunks), True
                    size += len(chunk)
                    if size > limit:
                        return b"", False
                    chunks.append(chunk)
                else:
                    try:
                        view = view[os.write(in_w, view[: 1 << 16]):]
                    except BrokenPipeError:
                        view = view[:0]
                    if not view:
                        sel.unregister(in_w)
                        os.close(in_w)
                        writer[0] = -1
    finally:
        sel.close()


def _file_tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_bytes()[-size:].decode("utf-8", "replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading.sandbox.lab_sandbox")
    sub = parser.add_subparsers(dest="command", required=True)
    script = sub.add_parser("script", help="run a lab script in a lab's sandbox")
    script.add_argument("--registry", required=True)
    script.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("check", help="say how the graded code would be isolated here")
    args = parser.parse_args(argv)
    if args.command == "check":
        with Rehearsal() as prepare:
            mode, _ = choose_mode(prepare=prepare)
        if mode.refused:
            print(mode.refusal(), file=sys.stderr)
            return 1
        print(mode.describe())
        return 0
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return run_script(args)


if __name__ == "__main__":
    sys.exit(main())
