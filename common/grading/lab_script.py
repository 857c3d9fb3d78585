"""The script helper: a ``common.testing.LabScript`` run in its lab's sandbox.

:class:`Registry`: the sandboxes of one test process, in a file that
``COURSE_SCRIPT_PREFIX`` names.

``python -m common.grading.sandbox script --registry FILE -- script.py ...`` (what
``COURSE_SCRIPT_PREFIX`` runs): the lab script is forked from the lab's zygote into the
sandbox; paths of the source tree become paths of the scratch copy, and an existing output
folder the test passed becomes a sandbox folder whose files are copied back when the
script ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.grading.scratch import sandbox_env
from common.grading.zygote_client import ZYGOTE_START_TIMEOUT, ZygoteClient


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
