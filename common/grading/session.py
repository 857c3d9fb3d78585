"""Around a grading run: the isolation of every lab's graded code, set up and torn down.

:func:`grading_session` chooses the mode, gives each lab a uid block, locks the source tree
(:func:`lock_tree`: with a user switch, the tests and solutions unreadable and the tree and
the results unwritable for the sandbox uids), starts the run's warm zygote, and at the end
kills whatever the graded code left behind (:func:`sweep`) and restores the tree.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.grading import procs
from common.grading.scratch import is_test_file, lab_imports
from common.grading.uids import SandboxError, choose_mode, kill_block, release
from common.grading.zygote_client import Mother


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
