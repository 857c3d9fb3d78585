"""The course on a laptop without triton (macOS, Windows: triton ships Linux wheels only).

In an environment where ``import triton`` fails (``tools/no_triton.py``: every package of
this Python but triton), with the reference solutions (in a student copy, which has none:
the starters, and only what does not depend on them being solved):

- every module imports (labs, their tests, the shared tests);
- every test not marked ``triton`` runs and passes (not in a student copy);
- every ``triton`` test is skipped with the reason ("not run: ... Linux, WSL2, the dev
  container"), and nothing else is skipped for want of triton;
- the grader does not count the Triton tests, and gives full marks for what ran (in a
  student copy: the marks of your starters, not checked).

Run by ``make test-no-triton`` and ``make check-setup`` (``CHECK_SETUP=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from common.triton_env import TRITON_MISSING
from tools import no_triton

ROOT = Path(__file__).resolve().parent.parent

LABS = sorted(p.name for p in ROOT.glob("labs/lab-*") if (p / "test_lab.py").exists())
# Not re-run without triton: these files (they start this run), and the grader's own tests
# (minutes of grading in subprocesses; the grader itself is run below).
NOT_RERUN = ["tests/test_setup.py", "tests/test_setup_no_triton.py", "tests/test_grading.py"]

if os.environ.get("CHECK_SETUP") != "1":
    pytest.skip(
        "runs the suite again without triton (minutes): `make test-no-triton`",
        allow_module_level=True,
    )
SOLVED = bool(list(ROOT.glob("labs/*/solution.py")))  # False in a student copy
IMPL = "solution" if SOLVED else "starter"

pytestmark = [pytest.mark.setup, pytest.mark.timeout(1800)]  # minutes on a loaded machine


def env_for(python: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CHECK_SETUP", "PYTEST_ADDOPTS")}
    return {**env, "PYTHONPATH": str(ROOT), "LAB_IMPL": IMPL, **extra}


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return no_triton.build(tmp_path_factory.mktemp("venv") / "no-triton")


@pytest.fixture(scope="module")
def outcomes(python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("outcomes") / "outcomes.json"
    cmd = [
        str(python),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tools.pytest_outcomes",
        "--continue-on-collection-errors",
        "labs",
        "tests",
        *[f"--ignore={p}" for p in NOT_RERUN],
    ]
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env_for(python, PYTEST_OUTCOMES=str(out)),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print("\n".join(done.stdout.strip().splitlines()[-3:]))
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def lab_of(nodeid: str) -> str | None:
    return next((lab for lab in LABS if nodeid.startswith(f"labs/{lab}/")), None)


def test_import_triton_fails_there_as_on_a_mac(python):
    code = (
        "import importlib.util, sys\n"
        "from common.triton_env import HAVE_TRITON\n"
        "print(importlib.util.find_spec('triton'), HAVE_TRITON)\n"
        "import triton\n"
    )
    done = subprocess.run(
        [str(python), "-c", code],
        cwd=ROOT,
        env=env_for(python),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.split() == ["None", "False"], done.stdout + done.stderr
    assert "ModuleNotFoundError: No module named 'triton'" in done.stderr


def test_every_module_imports_without_triton(outcomes):
    errors = {k: v["reason"] for k, v in outcomes.items() if v["outcome"] == "error"}
    assert not errors, "\n\n".join(f"{k}:\n{v}" for k, v in errors.items())


def triton_only(outcomes: dict[str, dict]) -> set[str]:
    """Labs whose every test is marked ``triton`` (the primer): nothing of them runs here."""
    return {lab for lab in LABS
            if all("triton" in v["markers"] for k, v in outcomes.items() if lab_of(k) == lab)}


@pytest.mark.skipif(not SOLVED, reason="a student copy has no reference solutions: whether "
                    "your starters pass is `make test`'s question")
def test_every_test_not_marked_triton_passes_with_the_solutions(outcomes):
    failed = {
        k: v["reason"][-600:]
        for k, v in outcomes.items()
        if v["outcome"] == "failed" and "triton" not in v["markers"]
    }
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())
    for lab in LABS:
        if lab in triton_only(outcomes):
            continue  # the Triton primer: every test is a kernel, all "not run" here
        ran = [k for k, v in outcomes.items() if lab_of(k) == lab and v["outcome"] == "passed"]
        assert ran, f"{lab}: no test ran without triton"


def test_every_triton_test_is_skipped_with_the_reason(outcomes):
    """Tests marked both ``gpu`` and ``triton`` may give either reason: both are true."""
    triton_tests = {k: v for k, v in outcomes.items() if "triton" in v["markers"]}
    assert triton_tests, "no test is marked triton"
    reasons = {f"not run: {TRITON_MISSING}"}
    wrong = {
        k: f"{v['outcome']}: {v['reason'][:300]}"
        for k, v in triton_tests.items()
        if v["outcome"] != "skipped"
        or not (v["reason"] in reasons or ("gpu" in v["markers"] and "CUDA" in v["reason"]))
    }
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_nothing_else_is_skipped_for_want_of_triton(outcomes):
    other = {
        k: v["reason"]
        for k, v in outcomes.items()
        if v["outcome"] == "skipped"
        and "triton" not in v["markers"]
        and "triton" in v["reason"].lower()
    }
    assert not other, "skipped without the triton marker:\n" + "\n".join(
        f"{k}: {v}" for k, v in other.items()
    )


def test_the_grader_counts_only_what_ran(python, outcomes, tmp_path):
    not_run = {lab_of(k) for k, v in outcomes.items() if v["reason"].startswith("not run:")}
    results = tmp_path / "results.json"
    cmd = [
        str(python),
        "-m",
        "grading",
        "--impl",
        IMPL,
        "--root",
        str(ROOT),
        "--results",
        str(results),
        "--lab-timeout",
        "900",
        "--test-timeout",
        "300",
    ]
    done = subprocess.run(
        cmd, cwd=ROOT, env=env_for(python), capture_output=True, text=True, timeout=3600
    )
    assert results.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    labs = json.loads(results.read_text())["extra_data"]["labs"]
    assert sorted(lab["name"] for lab in labs) == LABS
    for lab in labs:
        if lab["name"] in triton_only(outcomes):
            assert lab["possible"] == 0, f"{lab['name']}: Triton tests counted without triton"
            continue
        assert lab["possible"] > 0, f"{lab['name']}: nothing graded without triton"
        if lab["name"] in not_run:
            assert lab.get("not_run", lab["skipped"]) > 0, f"{lab['name']}: Triton tests counted"
        assert not SOLVED or lab["score"] == lab["possible"], (
            f"{lab['name']}: {lab['score']}/{lab['possible']} with the solutions and no "
            f"triton: {lab.get('problems')}\n{done.stdout[-3000:]}"
        )
