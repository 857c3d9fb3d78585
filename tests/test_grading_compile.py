"""The graded compile step and the Triton tests' kernel requirement, against submissions that
attack them (not graded).

Each case is the primer (lab-09) of a copy of the course with a planted ``starter.py``,
graded by ``python -m grading`` as it runs for an instructor (as root here: the user
switch). The compile step imports the submission only inside the lab's sandbox
(``grading/sandbox/compiler.py``); its plain-data reply is judged on the trusted side.

- ``tail``: the solution plus a tail run at import (so also by the compile step) that
  appends to the tree's ``grading/plugin/points.py`` and ``conftest.py`` and writes "passed"
  events with 1000 points into every points log it finds in ``/proc``: it earns what the
  solution earns, the possible points are not inflated, the tree is untouched;
- ``torch``: ``add_vectors`` computes with torch and launches nothing: its Triton tests and
  its compile test score 0, the rest full marks;
- ``scratch``: ``add_vectors`` launches its kernel into a scratch buffer of as many elements
  and computes the answer with torch; ``row_sum_max`` launches its kernel on zeros into the
  real outputs, then overwrites them with torch's sums and maxes: every Triton test of both
  with data scores 0 (the output must hold what the kernel stored there), the rest full
  marks;
- ``copy``: ``add_vectors`` and ``row_sum_max`` compute the answer with torch into buffers
  of their own (one of them behind an output argument the launcher overwrote first) and
  launch a kernel of the file that only copies it into the outputs: every Triton test of
  both with data scores 0 ("copied an answer computed elsewhere"), the rest full marks;
- ``tf32``: ``matmul``'s launcher passes ``input_precision="tf32"`` for float32 inputs: the
  compile of what the launcher launches catches it (the interpreter ignores precision);
- ``starter``: the untouched starter: the grade exits 0, scores 0, and the compile tests
  say the kernels are not written yet (nothing to compile).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.sandbox.host import choose_mode

ROOT = Path(__file__).resolve().parents[1]
# whole grading runs on a busy machine: a backstop, not a measurement
pytestmark = pytest.mark.timeout(2400)
LAB = "lab-09-triton-primer"

TAIL = '''

def _attack():  # planted: runs when the module is imported, in every process that does
    import json as _json
    import os as _os
    root = {root!r}
    for rel in ("grading/plugin/points.py", "conftest.py"):
        try:
            with open(_os.path.join(root, rel), "a") as f:
                f.write("\\nraise SystemExit('patched by the submission')\\n")
        except OSError:
            pass
    for pid in _os.listdir("/proc"):
        try:
            with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\\0")
        except OSError:
            continue
        for arg in args:
            if arg.startswith("--points-log="):
                try:
                    with open(arg.split("=", 1)[1], "a") as log:
                        for n in range(60):
                            log.write(_json.dumps({{"event": "result", "nodeid": f"x{{n}}",
                                                    "outcome": "passed", "points": 1000}}) + "\\n")
                except OSError:
                    pass


_attack()
'''
TORCH_ADD = '''

def add_vectors(x, y, out, n, *, block=None):  # planted: torch, no kernel
    """``out[:n] = x[:n] + y[:n]``."""
    out[:n] = x[:n] + y[:n]
'''

SCRATCH = '''

def add_vectors(x, y, out, n, *, block=None):  # planted: a kernel for show, torch's answer
    """``out[:n] = x[:n] + y[:n]``."""
    if n:
        scratch = torch.empty(n, dtype=out.dtype)  # as many elements as the output needs
        _add_vectors_kernel[(cdiv(n, 16),)](x, y, scratch, n, BLOCK=16)
        out[:n] = x[:n] + y[:n]


def row_sum_max(x, sums, maxes, m, n, *, block_n=None):  # planted: outputs overwritten
    """``sums[:m] = x[:m, :n].sum(1)`` and ``maxes[:m] = x[:m, :n].max(1)``."""
    if m:
        zeros = torch.zeros((m, max(n, 1)), dtype=x.dtype)
        _row_sum_max_kernel[(m,)](zeros, sums, maxes, n, *zeros.stride(),
                                  BLOCK_N=max(16, triton.next_power_of_2(n)))
        if n:
            sums[:m] = x[:m, :n].sum(1)
            maxes[:m] = x[:m, :n].amax(1)
'''

COPY = '''

@triton.jit
def _copy_kernel(Src, Dst, n, BLOCK: tl.constexpr):  # planted: stores what it loads
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Dst + offs, tl.load(Src + offs, mask=offs < n), mask=offs < n)


def add_vectors(x, y, out, n, *, block=None):  # planted: torch's answer, copied by a kernel
    """``out[:n] = x[:n] + y[:n]``."""
    if n:
        answer = (x[:n] + y[:n]).contiguous()
        _copy_kernel[(cdiv(n, 16),)](answer, out, n, BLOCK=16)


def row_sum_max(x, sums, maxes, m, n, *, block_n=None):  # planted: the outputs copied onto
    """``sums[:m] = x[:m, :n].sum(1)`` and ``maxes[:m] = x[:m, :n].max(1)``."""
    if m and n:
        sums[:m] = x[:m, :n].sum(1)  # torch writes the argument itself, the kernel "stores" it
        _copy_kernel[(cdiv(m, 16),)](sums, sums, m, BLOCK=16)
        answer = x[:m, :n].amax(1).contiguous()
        _copy_kernel[(cdiv(m, 16),)](answer, maxes, m, BLOCK=16)
'''


def _copy(tmp: Path, name: str, starter: str) -> Path:
    root = tmp / name
    root.mkdir(mode=0o755)
    for item in ("conftest.py", "pyproject.toml"):
        shutil.copy2(ROOT / item, root / item)
    for package in ("common", "grading", "bench"):
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "labs" / LAB, root / "labs" / LAB,
                    ignore=shutil.ignore_patterns("__pycache__", "figures"))
    for path in (ROOT / "labs").glob("*.py"):  # the lab manifest (its [compile] rules)
        shutil.copy2(path, root / "labs" / path.name)
    (root / "labs" / LAB / "starter.py").write_text(starter.replace("{ROOT}", str(root)))
    return root


def _solution() -> str:
    return (ROOT / "labs" / LAB / "solution.py").read_text()


def _start(root: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRADE_", "COURSE_", "PYTEST_"))}
    env.update(LAB_IMPL="starter", TRITON_INTERPRET="1")
    return subprocess.Popen(
        [sys.executable, "-m", "grading", "--root", str(root), "--lab", "09",
         "--results", str(root / "results.json")],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    if choose_mode()[0].uids is None:
        pytest.skip("needs the user switch (run as root)")
    tmp = tmp_path_factory.mktemp("compile")
    tmp.chmod(0o755)
    solution = _solution()
    tail = solution + TAIL.format(root="{ROOT}")
    tf32 = solution.replace("DOT_PRECISION=dot_precision(a.dtype))",
                            'DOT_PRECISION="tf32")', 1)
    assert tf32 != solution
    cases = {"tail": tail, "torch": solution + TORCH_ADD, "scratch": solution + SCRATCH,
             "copy": solution + COPY, "tf32": tf32,
             "starter": (ROOT / "labs" / LAB / "starter.py").read_text()}
    roots = {name: _copy(tmp, name, text) for name, text in cases.items()}
    before = {name: {rel: (root / rel).read_bytes()
                     for rel in ("grading/plugin/points.py", "conftest.py")}
              for name, root in roots.items()}
    procs = {name: _start(root) for name, root in roots.items()}
    out = {}
    for name, proc in procs.items():
        text, _ = proc.communicate(timeout=1800)
        results = json.loads((roots[name] / "results.json").read_text())
        out[name] = {"code": proc.returncode, "text": text, "results": results,
                     "root": roots[name], "before": before[name]}
    return out


def _tests(run: dict) -> dict[str, dict]:
    return {t["name"].split(" › ", 1)[1]: t for t in run["results"]["tests"]}


def _cheats(tests: dict[str, dict]) -> dict[str, dict]:
    """The interpreter tests of the two cheating functions that launch something (n = 0 or
    m = 0 launch nothing, and a row of n = 0 is what the kernel stored: no cheat)."""
    return {n: t for n, t in tests.items()
            if ("add_vectors" in n and "n=0" not in n or "row_sum_and_max" in n
                and "-0-None" not in n) and "sm_90" not in n}


def _others_full(tests: dict[str, dict]) -> None:
    """Every test of the honest functions keeps its full score."""
    others = [t for n, t in tests.items() if "add_vectors" not in n and "row_sum" not in n]
    assert all(t["score"] == t["max_score"] for t in others), [
        (t["name"], t["output"][:300]) for t in others if t["score"] < t["max_score"]]


def _possible(run: dict) -> float:
    return sum(t["max_score"] for t in run["results"]["tests"])


@pytest.mark.slow
def test_a_tail_run_at_import_earns_only_what_the_solution_earns(graded):
    run = graded["tail"]
    assert run["code"] == 0, run["text"]
    for rel, data in run["before"].items():
        assert (run["root"] / rel).read_bytes() == data, f"the submission changed {rel}"
    tests = _tests(run)
    assert not [n for n, t in tests.items() if t["score"] < t["max_score"]], run["text"]
    assert _possible(run) == _possible(graded["torch"]), "the possible points were inflated"
    assert run["results"]["score"] == _possible(run)


@pytest.mark.slow
def test_a_launcher_that_computes_with_torch_scores_zero_on_its_triton_tests(graded):
    run = graded["torch"]
    assert run["code"] == 0, run["text"]
    tests = _tests(run)
    # (the degenerate n = 0 case launches nothing, whoever computes it: no kernel to require)
    add = {n: t for n, t in tests.items() if "add_vectors" in n and "n=0" not in n}
    assert add and all(t["score"] == 0 for t in add.values()), add
    assert "without launching a Triton kernel" in next(iter(add.values()))["output"]
    compile_add = [t for n, t in tests.items() if "sm_90" in n and "_add_vectors_kernel" in n]
    assert compile_add and compile_add[0]["score"] == 0
    assert "never launched" in compile_add[0]["output"]
    others = [t for n, t in tests.items() if "add_vectors" not in n and "_add_vectors" not in n]
    assert all(t["score"] == t["max_score"] for t in others), [
        (t["name"], t["output"][:300]) for t in others if t["score"] < t["max_score"]]


@pytest.mark.slow
def test_a_kernel_that_stores_elsewhere_or_is_overwritten_scores_zero(graded):
    run = graded["scratch"]
    assert run["code"] == 0, run["text"]
    tests = _tests(run)
    cheats = _cheats(tests)
    assert len(cheats) >= 8 and all(t["score"] == 0 for t in cheats.values()), {
        n: (t["score"], t["output"][:200]) for n, t in cheats.items()}
    assert all("holds what" in t["output"] for n, t in cheats.items()
               if "loads_only" not in n), [t["output"][:300] for t in cheats.values()]
    _others_full(tests)


@pytest.mark.slow
def test_a_kernel_that_copies_an_answer_torch_computed_scores_zero(graded):
    run = graded["copy"]
    assert run["code"] == 0, run["text"]
    tests = _tests(run)
    cheats = {n: t for n, t in _cheats(tests).items() if "loads_only" not in n}
    assert len(cheats) >= 6 and all(t["score"] == 0 for t in cheats.values()), {
        n: (t["score"], t["output"][:200]) for n, t in cheats.items()}
    assert all("copied an answer computed elsewhere" in t["output"]
               for t in cheats.values()), [t["output"][:300] for t in cheats.values()]
    _others_full(tests)


@pytest.mark.slow
def test_a_tf32_precision_chosen_in_the_launcher_fails_the_compile_test(graded):
    tests = _tests(graded["tf32"])
    [matmul] = [t for n, t in tests.items() if "sm_90" in n and "_matmul_kernel" in n]
    assert matmul["score"] == 0 and "TF32" in matmul["output"], matmul["output"]
    assert "as matmul launched it, fp32" in matmul["output"]


@pytest.mark.slow
def test_untouched_starters_exit_zero_score_zero_and_have_nothing_to_compile(graded):
    run = graded["starter"]
    assert run["code"] == 0, run["text"]
    assert run["results"]["score"] == 0
    compiles = [t for n, t in _tests(run).items() if "sm_90" in n]
    assert compiles and all("nothing to compile" in t["output"] for t in compiles), [
        t["output"][:300] for t in compiles]
