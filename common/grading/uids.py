"""The user switch of the sandbox: a block of uids per lab, when the grader runs as root.

:func:`choose_mode` says how the graded code is isolated on this machine (a :class:`Mode`):
``COURSE_SANDBOX_UIDS`` names a block, or ``none``; else, as root, a free block of
:data:`UIDS_PER_LAB` uids in 61000-64999 that no account and no process uses, reserved for
this process by a lock file; else the process split alone. :func:`kill_block` ends every
process of a block.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common.grading import procs

ENV_UIDS = "COURSE_SANDBOX_UIDS"  # "61000-61063" (a lab's block), "none", or unset (auto)


UID_RANGE = (61000, 65000)
UIDS_PER_LAB = 64


class SandboxError(RuntimeError):
    """The sandbox could not be set up (not the graded code's fault)."""


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


def kill_block(block: tuple[int, int]) -> None:
    """Kill every process running under a uid of ``block``."""
    lo, hi = block
    running = {u for _, _, u in procs.proc_table().values()} if procs.have_proc() else set(
        range(lo, hi))
    for uid in range(lo, hi):
        if uid in running:
            procs.kill_uid(uid, lo)
