"""Measurements the graded code cannot replace (not graded).

A hostile lab-00 submission computes the whole ``Lq x Lk`` score matrix and replaces
``common.testing``'s memory instrument in its worker with one that reports 0 bytes. Graded
by ``make grade`` in a copy of the project (user switch as root, process split otherwise),
both memory tests must still fail: ``peak_memory`` is measured by the trusted side, from the
worker's resident-memory high-water mark in ``/proc/<pid>``. Slow: it grades lab-00 (about
15 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab-00-online-softmax"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # grading a lab, on a loaded machine
    pytest.mark.skipif(not (ROOT / "labs" / LAB / "solution.py").exists(),
                       reason="a student copy has no solution to build the submission from"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)"),
]

HOSTILE = '''

def _naive_forward(q, k, v, block_q=16, block_k=16, scale=None, causal=False):
    """The whole Lq x Lk score matrix at once."""
    q, k, v = provided.check_qkv(q, k, v)
    s = (q @ k.T) * provided.scale_for(q.shape[1], scale)  # [Lq, Lk]
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    m = s.max(axis=1, initial=-np.inf)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m_safe[:, None])
    l = p.sum(axis=1)
    with np.errstate(all="ignore"):
        return (np.where(l[:, None] > 0, (p @ v) / l[:, None], 0.0),
                np.where(l > 0, m_safe + np.log(l), -np.inf))


flash_attention_forward = _naive_forward


def _reports_nothing(fn, *args, **kwargs):
    return fn(*args, **kwargs), 0


import common.testing as _testing  # noqa: E402

_testing.INSTRUMENTS["peak_memory"] = _reports_nothing
_testing.peak_memory = _reports_nothing
'''


def project_copy(dest: Path) -> Path:
    """The files git knows (the project as a fresh clone has it), without other labs."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        rel = Path(name)
        if rel.parts[0] == "labs" and len(rel.parts) > 2 and rel.parts[1] != LAB:  # labs/*.py stay
            continue
        if (ROOT / rel).is_file() and not rel.parts[0].startswith("."):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


@pytest.fixture
def course() -> Iterator[Path]:
    """A copy of the project in a folder the sandbox users can reach (pytest's own temporary
    folders are private to their owner)."""
    if not (ROOT / ".git").exists() or not shutil.which("git"):
        pytest.skip("copies the project as git sees it")
    folder = Path(tempfile.mkdtemp(prefix="course-measurements-"))
    try:
        folder.chmod(0o755)
        yield project_copy(folder / "course")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_replaced_memory_instrument_does_not_hide_an_lq_by_lk_array(course):
    root = course
    lab = root / "labs" / LAB
    (lab / "starter.py").write_text((lab / "solution.py").read_text() + HOSTILE)
    (lab / "solution.py").unlink()
    results = root / "results.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "PYTEST_ADDOPTS", "LAB_IMPL")}
    done = subprocess.run(["make", "grade", "LAB=00", "LAB_IMPL=starter", f"PY={sys.executable}"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert results.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    tests = {t["name"].split(" › ")[-1]: t for t in json.loads(results.read_text())["tests"]}
    for name in ("test_flash_attention_forward_never_builds_an_lq_by_lk_array",
                 "test_flash_attention_forward_never_builds_a_row_block_of_all_keys"):
        assert tests[name]["score"] == 0, f"{name} passed a hidden Lq x Lk array: {tests[name]}"
        assert "peak memory" in tests[name].get("output", ""), tests[name]
    values = [t for name, t in tests.items()
              if name.startswith("test_flash_attention_forward_equals_the_float64_reference")]
    assert values and all(t["score"] > 0 for t in values), (
        f"the naive forward's values must pass: {values}")
