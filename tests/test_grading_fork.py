"""The warm front door's children (``grading.sandbox.zygote_client.ForkedChild``): a forked
test process or seed is waited for, timed out and killed as ``subprocess.Popen`` would be,
so the runner's limits hold for it too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grading.sandbox.zygote_client import ForkedChild

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _fork(body) -> ForkedChild:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        try:
            body()
        finally:
            os._exit(0)
    return ForkedChild(pid)


def test_a_forked_child_gives_its_exit_code_as_popen_does():
    child = _fork(lambda: os._exit(3))
    assert child.wait(timeout=60) == 3
    assert child.poll() == 3


def test_a_forked_child_that_outlives_its_limit_raises_timeout_then_dies_by_signal():
    import time

    child = _fork(lambda: time.sleep(60))
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    child.kill()
    assert child.wait(timeout=60) == -9  # a signal, negative, as Popen says it


@pytest.mark.slow
def test_the_front_door_forks_its_seed_before_the_grader_imports_itself():
    """What the seed's image can hold: ``python -m grading`` forks it after importing torch
    and before importing the grader's run, plugin or tools, a lab or the reference (the
    manifest, which names the preloads, is the one course module it may hold)."""
    code = (
        "import os, sys\n"
        "from grading.sandbox import zygote\n"
        "def fork():\n"
        "    print(' '.join(sorted(sys.modules)))\n"
        "    raise SystemExit(0)\n"
        "os.fork = fork\n"
        "zygote.start_seed()\n"
    )
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300, check=False)
    assert probe.returncode == 0, probe.stderr
    modules = probe.stdout.split()
    assert "torch" in modules and "numpy" in modules
    grader = [m for m in modules if m.startswith(("grading.run.cli", "grading.run.lab",
                                                  "grading.plugin", "grading.tools", "labs",
                                                  "lab_", "common.reference", "conftest"))]
    # The one course module the seed reads: the manifest, to learn the labs' declared
    # preloads from their public lab.toml (nothing of a test, a solution or the grader).
    grader = [m for m in grader if m not in ("labs", "labs.manifest")]
    assert grader == [], f"in the seed's image: {grader}"
