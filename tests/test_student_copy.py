"""The student copy's own commands work once its labs are solved (not graded).

``make release`` builds the copy, every ``starter.py`` is replaced by its lab's
``solution.py`` (a student who solved everything), and the copy's ``make test`` must pass:
the instructor-only tests skip there with a reason (the untouched-starter rule, the committed
GPU report compiled from the solutions), and nothing fails for want of a solution.

Budget: the copy's whole ``make test`` is the whole suite again (minutes on a loaded 2-core
machine), so this runs it on a representative part, chosen by ``PYTEST_ADDOPTS``: the shared
tests that behave differently in a copy (course rules, GPU report, documents, setup) and two
labs, one of them with the ``LabScript`` ring of lab-04. Slow: it builds the copy (about 30 s)
and runs that part (about a minute). ``make test-no-triton`` in a copy (minutes: a second
virtual environment and the suite again) is checked by hand; here only that it is wired to
the starters.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.parent.name for p in ROOT.glob("labs/lab-*/solution.py"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a release and part of a suite, on a loaded machine
    pytest.mark.skipif(not LABS, reason="a student copy has no solutions to release"),
]

# The part of the copy's suite this test runs (see the module docstring).
REPRESENTATIVE = [
    "tests/test_course_rules.py",
    "tests/test_gpu_report.py",
    "tests/test_docs.py",
    "tests/test_launcher_contract.py",
    "tests/test_setup_no_triton.py",
    "labs/lab-02-backend-selection",
    "labs/lab-04-flash-decoding-partitions",
]
# What skips in a copy, and why: each reason must be shown (pytest -rs).
COPY_SKIPS = ["a student copy: no solution.py to read the launchers from"]
# ... and in its `make test-slow` (the untouched-starter rule and the captured report's
# recompile are slow tests), run on these files of the copy.
SLOW_COPY_SKIPS = [
    "a student copy: its starters are the student's, not untouched ones",
    "a student copy: the committed report was compiled from the instructor's",
]
SLOW_REPRESENTATIVE = [
    "tests/test_course_rules.py",
    "tests/test_gpu_report.py::"
    "test_the_captured_report_was_compiled_from_this_tree_and_every_sm_90_config_passes",
]


def copy_env(**extra: str) -> dict[str, str]:
    """The copy's defaults: not the caller's LAB_IMPL, nor (under `make test`) make's flags."""
    drop = ("LAB_IMPL", "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTEST_ADDOPTS", "CHECK_SETUP")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


@pytest.fixture(scope="module")
def solved_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "student"
    made = subprocess.run(["make", "release", f"OUT={out}", f"PY={sys.executable}"], cwd=ROOT,
                          env=copy_env(), capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    for lab in LABS:
        assert not (out / "labs" / lab / "solution.py").exists()
        shutil.copyfile(ROOT / "labs" / lab / "solution.py", out / "labs" / lab / "starter.py")
    return out


def test_make_test_passes_in_a_student_copy_whose_labs_are_solved(solved_copy: Path):
    part = [p for p in REPRESENTATIVE if (solved_copy / p).exists()]
    done = subprocess.run(
        ["make", "test", f"PY={sys.executable}"], cwd=solved_copy,
        env=copy_env(PYTEST_ADDOPTS=" ".join(["-rs", "-p", "no:cacheprovider", *part])),
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the solved copy's make test failed:\n{output[-6000:]}"
    assert "LAB_IMPL=starter" in output, "the copy must test its starters"
    for reason in COPY_SKIPS:
        assert reason in output, f"expected the skip {reason!r}:\n{output[-4000:]}"
    assert "solution.py does not exist" not in output, (
        f"a test of the copy skipped for want of a solution:\n{output[-4000:]}")
    slow = subprocess.run(
        ["make", "test-slow", f"PY={sys.executable}"], cwd=solved_copy,
        env=copy_env(PYTEST_ADDOPTS=" ".join(["-rs", "-p", "no:cacheprovider",
                                               *SLOW_REPRESENTATIVE])),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = slow.stdout + slow.stderr
    assert slow.returncode == 0, f"the solved copy's make test-slow failed:\n{output[-6000:]}"
    for reason in SLOW_COPY_SKIPS:
        assert reason in output, f"expected the skip {reason!r}:\n{output[-4000:]}"


def test_the_copys_other_test_commands_run_the_starters(solved_copy: Path):
    """``make test-no-triton`` and ``make test-slow`` test the copy's starters (the slow
    tests compile the student's kernels for sm_90; ``make gpu-report`` checks them too)."""
    for target in ("test-no-triton", "test-slow"):
        dry = subprocess.run(["make", "-n", target, f"PY={sys.executable}"], cwd=solved_copy,
                             env=copy_env(), capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0 and "LAB_IMPL=starter" in dry.stdout, (
            f"make {target}: {dry.stdout}{dry.stderr}")
