"""Where the graded code runs under the grader: a scratch copy, another uid, a zygote.

For each lab the trusted test process (``common.grading.proxy``) sets up a
:class:`LabSandbox`:

- a **scratch copy** of what the graded code needs: ``common/``, and the lab's folder with
  the submitted ``starter.py`` and the given ``provided.py``, without any test file, the
  solution (when grading starters) or ``__pycache__``; the worker runs there, in a clean
  environment (``HOME`` and ``TMPDIR`` inside it, ``PYTHONHASHSEED=0``)
  (:mod:`common.grading.scratch`);
- a **user switch** when the grader runs as root (Gradescope): every process of the graded
  code gets a uid of its own from the lab's block (``COURSE_SANDBOX_UIDS``, default a free
  block in 61000-64999; no account is needed), sharing the lab's group for the scratch
  folder (:mod:`common.grading.uids`). :func:`~common.grading.session.lock_tree` has made
  the tests unreadable and the source tree and the results not writable for it. Ending
  "everything of that uid" ends everything it started, double forks and ``setsid``
  included (:mod:`common.grading.procs`). Without root (a student's laptop) the same
  process split runs without the switch: the graded code cannot patch the grader's
  process, but it runs with the grader's own permissions;
- a **zygote** (:mod:`common.grading.zygote`) that imported torch once and forks workers
  and lab scripts on request (:mod:`common.grading.zygote_client` talks to it).

A grading run sets all this up around its labs in :mod:`common.grading.session`.

``python -m common.grading.sandbox script ...`` is what ``COURSE_SCRIPT_PREFIX`` runs for a
``common.testing.LabScript`` (:mod:`common.grading.lab_script`): the lab script is forked
from the zygote into the sandbox; paths of the source tree become paths of the scratch
copy, and an existing output folder the test passed becomes a sandbox folder whose files
are copied back when the script ends.
``python -m common.grading.sandbox check`` says which mode this machine gets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.grading import procs
from common.grading.lab_script import Registry, run_script
from common.grading.scratch import ENV_DIR, PREIMPORTABLE, lab_imports, make_scratch, sandbox_env
from common.grading.session import grading_session, lock_tree
from common.grading.uids import ENV_UIDS, UID_RANGE, Mode, SandboxError, choose_mode, kill_block
from common.grading.zygote_client import ZYGOTE_START_TIMEOUT, Mother, WorkerProcess, ZygoteClient

__all__ = [  # also here, where they lived before the sandbox was split into modules
    "ENV_ENABLE", "ENV_UIDS", "ENV_ZYGOTE", "PREIMPORTABLE", "UID_RANGE", "LabSandbox", "Mode",
    "Registry", "SandboxError", "choose_mode", "enabled", "grading_session", "kill_block",
    "lab_imports", "lock_tree", "main",
]

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
                    [sys.executable, "-m", "common.grading.zygote", json.dumps(config)],
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
