"""Inside each lab's test process: its sandboxes, and how long a call to one may take.

The process's sandboxes, one per lab (:class:`grading.sandbox.lab_sandbox.LabSandbox`):
started on demand (or attached to the one the grader started), replaced when a zygote dies,
and all ended, with everything the graded code started, by :func:`shutdown`. The registry
of these sandboxes is what ``COURSE_SCRIPT_PREFIX`` hands to lab scripts.

How long a call may take: the running test's deadline (set by the plugin in
:mod:`grading.plugin.proxy` through :data:`LIMITS`), else a per-call limit
(``COURSE_SANDBOX_CALL_TIMEOUT``); and the limit on a worker importing the graded module.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grading.sandbox import host
from grading.sandbox.confine import Rehearsal
from grading.sandbox.host import Mode, SandboxError, SandboxRefused, choose_mode
from grading.sandbox.lab_sandbox import ENV_ZYGOTE, LabSandbox
from grading.sandbox.zygote_client import Registry

# ---- call limits -------------------------------------------------------------------------


DEFAULT_CALL_LIMIT = 60.0
DEFAULT_IMPORT_LIMIT = 60.0


# set by the plugin: the running test's deadline and limit, the import and per-test limits
LIMITS: dict[str, Any] = {"deadline": None, "test_limit": None, "import": None,
                          "per_test": None, "needs_kernel": False}


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def current_deadline() -> tuple[float, float]:
    """``(deadline, limit)`` for a call now: the running test's, else a call limit."""
    if LIMITS["deadline"] is not None:
        return LIMITS["deadline"], LIMITS["test_limit"]
    limit = env_float("COURSE_SANDBOX_CALL_TIMEOUT", DEFAULT_CALL_LIMIT)
    return time.monotonic() + limit, limit


def import_limit() -> float:
    """Seconds for a worker to import the graded module. Under the grader the collection
    limit of ``pytest_points`` (``--points-collect-timeout``) acts first, with its message."""
    value = LIMITS["import"]
    if value:
        return value + 1.0
    return env_float("COURSE_SANDBOX_IMPORT_TIMEOUT", DEFAULT_IMPORT_LIMIT)


# ---- lab sandboxes -----------------------------------------------------------------------


SANDBOXES: dict[Path, LabSandbox] = {}
_at_shutdown: list[Callable[[], None]] = []  # run first by shutdown()


STATE: dict[str, Any] = {"mode": None, "registry": None, "subreaper": False, "active": False,
                          "given": None}


def active() -> bool:
    """Is this the trusted test process of a sandboxed run (the plugin configured here)?"""
    return bool(STATE["active"])


def mode() -> Mode:
    if STATE["mode"] is None:
        with Rehearsal() as prepare:
            found, _ = choose_mode(prepare=prepare)
        if found.refused:  # as root without the user switch: graded code never runs as root
            raise SandboxRefused(found.refusal())
        STATE["mode"] = found
    return STATE["mode"]


def lab_root(lab_dir: Path) -> Path:
    """The project root of ``labs/<lab>``."""
    if lab_dir.parent.name != "labs":
        raise SandboxError(f"{lab_dir} is not a folder of labs/: cannot sandbox it")
    return lab_dir.parent.parent


def sandbox_for(lab_dir: Path, impl: str) -> LabSandbox:
    lab_dir = lab_dir.resolve()
    box = SANDBOXES.get(lab_dir)
    if box is None:
        if not STATE["subreaper"]:
            STATE["subreaper"] = host.set_subreaper()
            atexit.register(shutdown)
        given = given_sandboxes().get(lab_dir.name)
        if given is not None and Path(given["lab"]) == lab_dir and given["impl"] == impl:
            box = LabSandbox.attach(given)
        else:
            box = LabSandbox(lab_root(lab_dir), lab_dir, impl, mode())
        SANDBOXES[lab_dir] = box
        if STATE["registry"] is None:
            STATE["registry"] = Registry()
            os.environ["COURSE_SCRIPT_PREFIX"] = STATE["registry"].prefix()
        STATE["registry"].add(lab_dir.name, box.registry_entry())
    return box


def given_sandboxes() -> dict[str, Any]:
    """Sandboxes the grader started for this process (``COURSE_SANDBOX_ZYGOTE``)."""
    if STATE["given"] is None:
        try:
            STATE["given"] = json.loads(os.environ.get(ENV_ZYGOTE, "") or "{}")
        except ValueError:
            STATE["given"] = {}
    return STATE["given"]


def replace_sandbox(old: LabSandbox) -> LabSandbox:
    """A fresh sandbox for ``old``'s lab (its zygote died), owned by this process."""
    try:
        old.close()
    except (OSError, EOFError):
        pass
    box = LabSandbox(old.root, old.lab, old.impl, old.mode)
    SANDBOXES[old.lab.resolve()] = box
    if STATE["registry"] is not None:
        STATE["registry"].add(old.lab.name, box.registry_entry())
    box.connect()
    return box


def on_shutdown(close: Callable[[], None]) -> None:
    """Run ``close`` first when this process's sandboxes are shut down (once per ``close``)."""
    if close not in _at_shutdown:
        _at_shutdown.append(close)


def shutdown() -> None:
    """End every sandbox of this process and everything its graded code started."""
    for close in _at_shutdown:
        close()
    for lab in list(SANDBOXES):
        SANDBOXES.pop(lab).close()
    if STATE["registry"] is not None:
        STATE["registry"].close()
        STATE["registry"] = None
        os.environ.pop("COURSE_SCRIPT_PREFIX", None)
    if STATE["subreaper"] and host.have_proc():
        host.reap(host.kill_tree({os.getpid()}, include_roots=False))


def describe_mode() -> str:
    return mode().describe()
