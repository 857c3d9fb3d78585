"""Inside each lab's test process: its sandboxes, one per lab (:mod:`common.grading.sandbox`).

Started on demand (or attached to the one the grader started), replaced when a zygote dies,
and all ended, with everything the graded code started, by :func:`shutdown`. The registry
of these sandboxes is what ``COURSE_SCRIPT_PREFIX`` hands to lab scripts.
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.grading import procs
from common.grading.lab_script import Registry
from common.grading.sandbox import ENV_ZYGOTE, LabSandbox
from common.grading.uids import Mode, SandboxError, choose_mode

if TYPE_CHECKING:
    from common.grading.client import Client


_sandboxes: dict[Path, LabSandbox] = {}
_clients: dict[tuple[Path, str], Client] = {}


_state: dict[str, Any] = {"mode": None, "registry": None, "subreaper": False, "active": False,
                          "given": None}


def active() -> bool:
    """Is this the trusted test process of a sandboxed run (the plugin configured here)?"""
    return bool(_state["active"])


def _mode() -> Mode:
    if _state["mode"] is None:
        _state["mode"], _ = choose_mode()
    return _state["mode"]


def lab_root(lab_dir: Path) -> Path:
    """The project root of ``labs/<lab>``."""
    if lab_dir.parent.name != "labs":
        raise SandboxError(f"{lab_dir} is not a folder of labs/: cannot sandbox it")
    return lab_dir.parent.parent


def sandbox_for(lab_dir: Path, impl: str) -> LabSandbox:
    lab_dir = lab_dir.resolve()
    box = _sandboxes.get(lab_dir)
    if box is None:
        if not _state["subreaper"]:
            _state["subreaper"] = procs.set_subreaper()
            atexit.register(shutdown)
        given = _given_sandboxes().get(lab_dir.name)
        if given is not None and Path(given["lab"]) == lab_dir and given["impl"] == impl:
            box = LabSandbox.attach(given)
        else:
            box = LabSandbox(lab_root(lab_dir), lab_dir, impl, _mode())
        _sandboxes[lab_dir] = box
        if _state["registry"] is None:
            _state["registry"] = Registry()
            os.environ["COURSE_SCRIPT_PREFIX"] = _state["registry"].prefix()
        _state["registry"].add(lab_dir.name, box.registry_entry())
    return box


def _given_sandboxes() -> dict[str, Any]:
    """Sandboxes the grader started for this process (``COURSE_SANDBOX_ZYGOTE``)."""
    if _state["given"] is None:
        try:
            _state["given"] = json.loads(os.environ.get(ENV_ZYGOTE, "") or "{}")
        except ValueError:
            _state["given"] = {}
    return _state["given"]


def replace_sandbox(old: LabSandbox) -> LabSandbox:
    """A fresh sandbox for ``old``'s lab (its zygote died), owned by this process."""
    try:
        old.close()
    except (OSError, EOFError):
        pass
    box = LabSandbox(old.root, old.lab, old.impl, old.mode)
    _sandboxes[old.lab.resolve()] = box
    if _state["registry"] is not None:
        _state["registry"].add(old.lab.name, box.registry_entry())
    box.connect()
    return box


def shutdown() -> None:
    """End every sandbox of this process and everything its graded code started."""
    for key in list(_clients):
        _clients.pop(key).close()
    for lab in list(_sandboxes):
        _sandboxes.pop(lab).close()
    if _state["registry"] is not None:
        _state["registry"].close()
        _state["registry"] = None
        os.environ.pop("COURSE_SCRIPT_PREFIX", None)
    if _state["subreaper"] and procs.have_proc():
        procs.reap(procs.kill_tree({os.getpid()}, include_roots=False))


def describe_mode() -> str:
    return _mode().describe()
