"""Finding and ending every process the graded code started, however it tried to hide.

- :func:`kill_uid`: with a user switch, each sandboxed process runs under a uid of its own,
  so ``kill(-1, SIGKILL)`` sent *as that uid* ends all of them at once, including a
  double-forked ``setsid`` daemon; the kernel blocks forks while it delivers the signal.
- :func:`set_subreaper` and :func:`kill_tree`: without one (a student's laptop), a process
  that marks itself "child subreaper" (Linux) inherits the orphans of its descendants, so a
  double fork cannot leave its tree; the tree is frozen (SIGSTOP) until it stops growing,
  then killed.

Linux reads ``/proc``; elsewhere only process groups and sessions can be reached.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def have_proc() -> bool:
    return Path("/proc/self/stat").exists()


def set_subreaper() -> bool:
    """Make this process inherit its descendants' orphans (Linux); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def proc_table() -> dict[int, tuple[int, int, int]]:
    """``{pid: (ppid, session id, real uid)}`` of every process (Linux ``/proc``)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            fields = stat[stat.rindex(")") + 2 :].split()
            uid = entry.stat(follow_symlinks=False).st_uid
        except (OSError, ValueError):
            continue  # it exited while we looked
        if fields[0] == "Z":
            continue  # a zombie: already dead, only waiting to be reaped
        table[int(entry.name)] = (int(fields[1]), int(fields[3]), uid)
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int, int]]) -> set[int]:
    """Every process below ``roots`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(roots: set[int], include_roots: bool = True, sessions: set[int] = frozenset(),
              spare: set[int] = frozenset()) -> set[int]:
    """SIGKILL the processes below ``roots`` (and the roots, and every member of
    ``sessions``), except ``spare``; stop them first so that none can fork a new one in
    between. Returns the pids that were killed."""
    if not have_proc():
        for pid in roots | set(sessions):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return set()
    me = os.getpid()
    stopped: set[int] = set()
    for _ in range(50):
        table = proc_table()
        found = descendants(roots, table)
        found |= {p for p, (_, sid, _) in table.items() if sid in sessions}
        if include_roots:
            found |= {p for p in roots if p in table}
        found -= set(spare) | {me} | stopped
        if not found:
            break
        _signal_all(found, signal.SIGSTOP)
        stopped |= found
    _signal_all(stopped, signal.SIGKILL)
    return stopped


def kill_uid(uid: int, gid: int | None = None) -> None:
    """SIGKILL every process whose real uid is ``uid`` (needs root): ``kill -KILL -1`` run
    as that uid, which may signal exactly the processes of its own uid."""
    gid = uid if gid is None else gid
    if have_proc() and not any(u == uid for _, _, u in proc_table().values()):
        return
    kill = shutil.which("kill")
    if kill is not None:
        try:
            subprocess.run([kill, "-s", "KILL", "--", "-1"], user=uid, group=gid,
                           extra_groups=[], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            kill = None
    if kill is None:
        kill_uid_by_fork(uid, gid)
    for _ in range(100):  # the kernel delivers at once; wait until they are gone
        if not have_proc() or not any(u == uid for _, _, u in proc_table().values()):
            return
        time.sleep(0.01)


def kill_uid_by_fork(uid: int, gid: int) -> None:
    """The same from a forked child (for a single-threaded caller such as the zygote)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def reap(pids: set[int]) -> None:
    """Collect the exit status of dead children among ``pids`` (no zombies left behind)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
