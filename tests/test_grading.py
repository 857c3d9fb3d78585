"""Tests of the grader, the student release and the Gradescope autograder (not graded).

They never grade the real labs: each builds a small fake project in a temporary folder (a
copy of conftest.py, pyproject.toml, common/ and grading/, plus tiny labs written below) and
runs the real commands on it; one builds the student copy of the real course (no grading). They test
mechanisms, never times: a busy machine cannot fail them. ``TRITON_INTERPRET=1`` keeps torch
out of the graded processes, so a lab costs well under a second; the end-to-end runs start
together in one fixture.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from common.loader import default_impl
from grading.plugin.messages import summarize_collect_error
from grading.run import runner
from grading.run.discovery import select_labs
from grading.run.lab import static_tests
from grading.run.report import validate_gradescope
from grading.run.runner import Options, Run, timeout_allowance
from grading.tools import autograder
from grading.tools.autograder import find_submission_files
from grading.tools.release import ReleaseError, build_release, plan_release
from grading.tools.student_copy import coherence_problems, make_targets, strip_instructor_blocks

ROOT = Path(__file__).resolve().parents[1]
# Its shared fixtures grade several fake labs at once (a hostile one among them): a minute or
# more at load 15, so the limit only stops a hang, never a slow machine.
pytestmark = pytest.mark.timeout(1800)

# ---- the fake labs ----------------------------------------------------------------------------

ADD_SOLUTION = '''
"""Add one."""
import numpy as np


def add_one(x):
    """x + 1, elementwise."""
    out = np.array(x, dtype=float, copy=True)
    out += 1
    return out.astype(np.asarray(x).dtype)


def twice(n):
    """2 n."""
    doubled_value_of_the_argument = 0
    for _ in range(2):
        doubled_value_of_the_argument = doubled_value_of_the_argument + n
    return int(doubled_value_of_the_argument)
'''

ADD_STARTER = '''
"""Add one."""
import numpy as np


def add_one(x):
    """x + 1, elementwise."""
    raise NotImplementedError("TODO: add one to every entry")


def twice(n):
    """2 n."""
    raise NotImplementedError("TODO: double it")
'''

ADD_TESTS = """
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from common import load_impl
from common.testing import assert_close

impl = load_impl(__file__)


@pytest.mark.points(2)
def test_add_one_adds_one_to_every_entry():
    assert_close(impl.add_one(np.zeros(3)), np.ones(3), what="add_one")


@pytest.mark.points(1)
@pytest.mark.parametrize("n", [1, 2])
def test_twice_doubles_its_argument(n):
    assert impl.twice(n) == 2 * n, "twice must double its argument"


@pytest.mark.points(1)
@settings(max_examples=5)
@given(st.integers(-5, 5))
def test_add_one_works_on_integers(x):
    assert int(impl.add_one(x)) == x + 1


@pytest.mark.points(3)
@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_add_one_on_the_gpu():
    raise AssertionError("never runs here")


@pytest.mark.points(2)
@pytest.mark.triton
def test_add_one_in_a_triton_kernel():
    assert impl.add_one(1) == 2
"""  # possible here: 2 + 1 + 1 + 1 = 5 (the GPU test, and the triton one without triton, do
# not count)

ADD_FIGURES = """
from common import load_impl

impl = load_impl(__file__, "solution")
print(impl.twice(3))
"""

MUL_SOLUTION = '''
def mul(a, b):
    """a b."""
    return a * b
'''
MUL_STARTER = '''
def mul(a, b):
    """a b."""
    raise NotImplementedError("TODO: multiply")
'''
MUL_TESTS = """
import pytest

from common import load_impl

impl = load_impl(__file__)
pytestmark = pytest.mark.points(2)


def test_mul_multiplies():
    assert impl.mul(2, 3) == 6, "mul(2, 3) must be 6"


@pytest.mark.points(4)
def test_mul_by_zero_is_zero():
    assert impl.mul(5, 0) == 0
"""  # possible: 2 + 4 = 6

HOSTILE_STARTER = """
import ctypes
import os
import sys

import numpy as np


def fine(x):
    return x + 1


def loop(x):
    while True:
        pass


def leave(x):
    sys.exit(4)


def chatter(x):
    for _ in range(15_000):
        print("all work and no play makes a dull kernel " * 2)
    raise NotImplementedError("TODO: stop printing and compute")


def nan(x):
    return np.full(3, np.nan)


def hard_exit(x):
    os._exit(3)


def segfault(x):
    ctypes.string_at(0)


def skip_me(x):
    import pytest
    pytest.skip("nothing to see")


def count_and_check(x):
    return x % 5 != 3  # wrong on some inputs
"""

HOSTILE_TESTS = """
import os

import numpy as np
import pytest
from hypothesis import Phase, given, settings, strategies as st

from common import load_impl
from common.testing import assert_close

impl = load_impl(__file__)


@pytest.mark.points(1)
def test_a_fine_function_passes():
    assert impl.fine(1) == 2


@pytest.mark.points(1)
def test_b_an_endless_loop_times_out():
    impl.loop(1)


@pytest.mark.points(1)
def test_c_sys_exit_is_a_failure():
    impl.leave(1)


@pytest.mark.points(1)
def test_d_megabytes_of_prints_do_not_block():
    impl.chatter(1)


@pytest.mark.points(1)
def test_e_nan_is_explained():
    assert_close(impl.nan(1), np.zeros(3), what="out")


@pytest.mark.points(1)
def test_f_skip_from_graded_code_is_a_failure():
    impl.skip_me(1)


@pytest.mark.points(1)
def test_g_os_exit_kills_the_process():
    impl.hard_exit(1)


@pytest.mark.points(2)
def test_h_a_segfault_kills_the_process():
    impl.segfault(1)


@pytest.mark.points(1)
def test_i_a_test_after_the_crashes_still_runs():
    assert impl.fine(2) == 3


@pytest.mark.points(1)
@given(st.integers(0, 10))
def test_j_an_endless_loop_inside_given_costs_only_itself(x):
    impl.loop(x)


@pytest.mark.points(1)
@settings(max_examples=50, phases=list(Phase))  # the test asks for shrinking: not under the grader
@given(st.integers(0, 10**6))
def test_k_a_failing_property_stops_at_its_first_counterexample(x):
    with open(os.environ["CALL_LOG"], "a") as log:  # the test counts the calls it makes
        log.write(f"{x}\\n")
    assert impl.count_and_check(x), f"wrong for {x}"


@pytest.mark.points(1)
def test_l_a_test_after_the_loops_still_runs():
    assert impl.fine(3) == 4
"""  # possible 13; earned 3 (a, i and l)

HANG_STARTER = """
import signal
import time


def deaf(x):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # the per-test alarm cannot stop it now
    time.sleep(600)


def slow(x):
    time.sleep(600)


def fine(x):
    return x + 1
"""

HANG_TESTS = """
import pytest

from common import load_impl

impl = load_impl(__file__)


@pytest.mark.points(3)
def test_a_hangs_beyond_the_reach_of_the_alarm():
    impl.deaf(1)


@pytest.mark.points(1)
def test_b_runs_after_the_hang():
    assert impl.fine(1) == 2


@pytest.mark.points(2)
def test_c_sleeps_past_its_limit():
    impl.slow(1)
"""

IMPORT_HOSTILE = {  # lab -> starter whose import goes wrong (the tests are MUL_TESTS: 6 points)
    "lab-03-exit-on-import": "import os\nos._exit(3)\n",
    "lab-04-syntax-error": "def mul(a, b:\n    return a * b\n",
    "lab-05-loop-on-import": "import time\nwhile True:\n    time.sleep(0.01)\n",
    "lab-06-sys-exit-on-import": "import sys\nsys.exit(5)\n",
}


def write_lab(root: Path, name: str, starter: str, tests: str, solution: str | None = None):
    lab = root / "labs" / name
    lab.mkdir(parents=True)
    (lab / "starter.py").write_text(textwrap.dedent(starter).lstrip())
    (lab / "test_lab.py").write_text(textwrap.dedent(tests).lstrip())
    (lab / "README.md").write_text(f"# {name}\n\n![figure](figures/plot.png)\n")
    if solution is not None:
        (lab / "solution.py").write_text(textwrap.dedent(solution).lstrip())
    return lab


def fake_project(root: Path) -> Path:
    """conftest, pyproject, Makefile, requirements, common/ and grading/ of the real project, no
    labs."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("conftest.py", "pyproject.toml", "Makefile", "requirements-cpu.txt", ".gitignore"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, root / name)
    for package in ("common", "grading"):
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (root / "README.md").write_text("# The course\n\nHow the course works.\n")
    return root


def clean_project(root: Path) -> Path:
    """Two well-behaved labs with starters, solutions, a figure script and its PNG."""
    fake_project(root)
    add = write_lab(root, "lab-00-add", ADD_STARTER, ADD_TESTS, ADD_SOLUTION)
    (add / "figures.py").write_text(ADD_FIGURES)
    (add / "figures").mkdir()
    (add / "figures" / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n fake")
    write_lab(root, "lab-01-mul", MUL_STARTER, MUL_TESTS, MUL_SOLUTION)
    return root


def no_triton() -> Path:
    """A folder whose ``triton`` package refuses to import (put on PYTHONPATH). Every user
    may read it: the grader's pre-flight checks that the sandbox users can read the packages
    on its path (else, as root, it refuses to grade)."""
    folder = Path(tempfile.mkdtemp(prefix="no-triton-"))
    folder.chmod(0o755)
    atexit.register(shutil.rmtree, folder, True)
    (folder / "triton").mkdir(parents=True, exist_ok=True)
    (folder / "triton" / "__init__.py").write_text(
        'raise ImportError("the fake labs of the grader tests do not use triton")\n'
    )
    return folder


def env(pythonpath: Path | None = None, **extra: str) -> dict[str, str]:
    """The graded processes' environment: no torch (TRITON_INTERPRET set), and with
    ``pythonpath=no_triton(...)`` no triton either: conftest.py imports it only to mark
    ``triton`` tests skippable, the fake labs have none, and it is a fifth of a start-up.
    """
    e = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(pythonpath or ""), **extra)
    for name in ("GRADE_LAB_TIMEOUT", "GRADE_TEST_TIMEOUT", "GRADE_JOBS", "PYTEST_ADDOPTS"):
        e.pop(name, None)
    return e


def by_lab(results: dict) -> dict[str, dict]:
    return {lab["name"]: lab for lab in results["extra_data"]["labs"]}


def output_of(results: dict, lab: str, test: str) -> str:
    [found] = [t for t in results["tests"] if t["name"] == f"{lab} › {test}"]
    return found["output"]


def start_grading(
    root: Path,
    impl: str,
    results: str,
    *args: str,
    pythonpath: Path | None = None,
    **extra_env: str,
) -> subprocess.Popen:
    """The grader on ``root``. Its time limits are backstops that a run on a busy machine
    never reaches (a few seconds per lab when idle); the tests check mechanisms, not times."""
    return subprocess.Popen(
        [sys.executable, "-m", "grading", "--root", str(root), "--results", results]
        + ["--test-timeout", "10", "--lab-timeout", "100", "--jobs", "2", *args],
        cwd=root,
        env=env(pythonpath, LAB_IMPL=impl, **extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def simulated_gradescope(clean: Path, tmp: Path) -> tuple[Path, list[str], dict[str, int]]:
    """Build the autograder zip and lay out /autograder (source, submission) under ``tmp``."""
    zip_path = tmp / "autograder.zip"
    assert autograder.main(["--root", str(clean), "--out", str(zip_path)]) == 0
    ag = tmp / "autograder"
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        zf.extractall(ag / "source")
    for name, mode in modes.items():  # zipfile does not restore permissions; Gradescope does
        (ag / "source" / name).chmod(mode)
    shutil.copy2(ag / "source" / "run_autograder", ag / "run_autograder")  # as Gradescope does
    sub = ag / "submission" / "my-work"
    (sub / "labs" / "lab-00-add").mkdir(parents=True)
    (sub / "labs" / "lab-00-add" / "starter.py").write_text(ADD_SOLUTION)
    (sub / "lab01_starter.py").write_text("def mul(a, b):\n    return a + b\n")  # wrong
    (sub / "notes.py").write_text("print('not a lab')\n")
    return ag, names, modes


RESULTS_FILES = {
    "solution": "solution.json",
    "hostile": "h.json",
    "imports": "imports.json",
    "hangs": "hangs.json",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every end-to-end run, started together (they are mostly waiting) and awaited once.

    - ``solution``: the clean project graded with LAB_IMPL=solution;
    - ``hostile``: a solved lab next to a lab whose functions loop, exit and crash;
    - ``imports``: labs whose starters cannot be imported (exit, syntax error, loop);
    - ``hangs``: a test that ignores the per-test alarm, one after it, one that sleeps;
    - ``release``: the student copy of the clean project, graded (starters);
    - ``gradescope``: the autograder zip run on a submission in a simulated /autograder.
    """
    tmp = tmp_path_factory.mktemp("grading")
    clean = clean_project(tmp / "clean")
    hostile = fake_project(tmp / "hostile")
    write_lab(hostile, "lab-00-add", ADD_SOLUTION, ADD_TESTS)  # a student who solved it
    write_lab(hostile, "lab-01-hostile", HOSTILE_STARTER, HOSTILE_TESTS)
    write_lab(hostile, "lab-02-hangs", HANG_STARTER, HANG_TESTS)
    for name, starter in IMPORT_HOSTILE.items():
        write_lab(hostile, name, starter, MUL_TESTS)
    release = tmp / "student"
    build_release(clean, release, quiet=True)
    ag, names, modes = simulated_gradescope(clean, tmp)

    fast = no_triton()

    calls = tmp / "calls.txt"

    def start(root: Path, impl: str, results: str, *args: str) -> subprocess.Popen:
        return start_grading(root, impl, results, *args, pythonpath=fast, CALL_LOG=str(calls))

    jobs = {
        "solution": (clean, start(clean, "solution", "solution.json")),
        "hostile": (
            hostile,
            # limits no busy machine reaches for a call that returns at once (CI is shared)
            start(hostile, "starter", "h.json", "--lab", "0,1", "--test-timeout", "20"),
        ),
        "imports": (
            hostile,
            start(hostile, "starter", "imports.json", "--lab", "3,4,5,6", "--test-timeout", "5"),
        ),
        "hangs": (
            hostile,
            # in the test process (--no-sandbox), where code can ignore the per-test alarm
            start(hostile, "starter", "hangs.json", "--lab", "2", "--test-timeout", "5",
                  "--no-sandbox"),
        ),
        "release": (release, start(release, "starter", "results.json")),
    }
    gradescope = subprocess.Popen(
        ["bash", str(ag / "run_autograder")],
        env=env(
            fast,
            AUTOGRADER_ROOT=str(ag),
            AUTOGRADER_PYTHON=sys.executable,
            GRADE_TEST_TIMEOUT="10",
            GRADE_LAB_TIMEOUT="100",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: dict = {"release_dir": release, "zip_names": names, "zip_modes": modes}
    out.update(calls=calls, hostile_root=hostile)
    for key, (root, proc) in jobs.items():
        text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, text
        path = root / RESULTS_FILES.get(key, "results.json")
        out[key] = (json.loads(path.read_text()), text)
    text, _ = gradescope.communicate(timeout=120)
    assert gradescope.returncode == 0, text
    out["gradescope"] = (json.loads((ag / "results" / "results.json").read_text()), text)
    return out


# ---- grading -------------------------------------------------------------------------------


@pytest.mark.slow
def test_solutions_get_full_marks(runs):
    results, out = runs["solution"]
    assert validate_gradescope(results) == []
    labs = by_lab(results)
    assert (labs["lab-00-add"]["score"], labs["lab-00-add"]["possible"]) == (5, 5)
    assert (labs["lab-01-mul"]["score"], labs["lab-01-mul"]["possible"]) == (6, 6)
    assert labs["lab-00-add"]["skipped"] == 2  # the GPU test: not counted on a CPU machine
    assert results["score"] == 11 and all(t["status"] == "passed" for t in results["tests"])
    assert "Total" in out and "11 / 11" in out


@pytest.mark.slow
def test_tests_that_need_a_missing_triton_are_not_run_on_this_machine_not_failed(runs):
    results, out = runs["solution"]  # the graded processes cannot import triton
    lab = by_lab(results)["lab-00-add"]
    assert lab["not_run"] == 1 and lab["possible"] == 5  # not in the possible points
    assert lab["notes"] == "1 not run on this machine, 1 skipped, not counted"
    assert "Not run on this machine: 1 test(s), neither failed nor counted" in out
    assert "the triton package is not installed here" in out  # and why, with what to do
    assert not [t for t in results["tests"] if "triton_kernel" in t["name"]]


@pytest.mark.slow
def test_a_solved_lab_keeps_full_marks_next_to_hostile_labs(runs):
    results, out = runs["hostile"]
    assert validate_gradescope(results) == []
    labs = by_lab(results)
    assert (labs["lab-00-add"]["score"], labs["lab-00-add"]["possible"]) == (5, 5)
    assert set(labs) == {"lab-00-add", "lab-01-hostile"}
    # every crash and hang cost only its own test: in the sandbox none stops the lab
    assert labs["lab-01-hostile"]["problems"] == [] and "What went wrong" not in out


@pytest.mark.slow
def test_each_hostile_test_costs_only_itself_with_its_reason(runs):
    results, _ = runs["hostile"]
    lab = "lab-01-hostile"
    assert (by_lab(results)[lab]["score"], by_lab(results)[lab]["possible"]) == (3, 13)
    out = {t["name"].split(" › ")[1]: t for t in results["tests"] if t["name"].startswith(lab)}
    assert out["test_a_fine_function_passes"]["score"] == 1
    assert out["test_i_a_test_after_the_crashes_still_runs"]["score"] == 1  # ran after a re-run
    assert out["test_l_a_test_after_the_loops_still_runs"]["score"] == 1
    expected = {
        "test_b_an_endless_loop_times_out": "timed out after 20 s (the per-test limit) in loop",
        "test_c_sys_exit_is_a_failure": "sys.exit(4)",
        "test_d_megabytes_of_prints_do_not_block": "NotImplementedError: TODO: stop printing",
        "test_e_nan_is_explained": "NaN reached the output",
        "test_f_skip_from_graded_code_is_a_failure": "called pytest.skip()",
        "test_g_os_exit_kills_the_process": "the worker exited with code 3 in hard_exit",
        "test_h_a_segfault_kills_the_process": "the worker crashed with signal SIGSEGV",
        "test_j_an_endless_loop_inside_given_costs_only_itself": "timed out after 20 s",
        "test_k_a_failing_property_stops_at_its_first_counterexample": "Failing test case:",
    }
    for test, reason in expected.items():
        assert out[test]["score"] == 0 and reason in out[test]["output"], out[test]
        assert len(out[test]["output"]) < 1000  # a message, not a traceback or the prints
    for looped in (
        "test_b_an_endless_loop_times_out",
        "test_j_an_endless_loop_inside_given_costs_only_itself",
    ):
        assert "(it was running starter.py:" in out[looped]["output"]  # where it looped


@pytest.mark.slow
def test_a_failing_property_is_not_shrunk_and_uses_no_example_database(runs):
    results, _ = runs["hostile"]
    test = "test_k_a_failing_property_stops_at_its_first_counterexample"
    message = output_of(results, "lab-01-hostile", test)
    calls = [int(x) for x in runs["calls"].read_text().split()]
    # Generation stops at the first counterexample, which is replayed once to report it; a
    # shrinking run would go on calling with ever smaller examples (down to x=3).
    bad = [i for i, x in enumerate(calls) if x % 5 == 3]
    assert bad and len(calls) == bad[0] + 2 and calls[-1] == calls[bad[0]], calls
    assert f"wrong for {calls[-1]}" in message and f"x={calls[-1]}" in message
    assert not (runs["hostile_root"] / ".hypothesis" / "examples").exists()  # no database


@pytest.mark.slow
def test_a_test_that_ignores_its_time_limit_is_stopped_and_costs_only_itself(runs):
    results, _ = runs["hangs"]
    lab = by_lab(results)["lab-02-hangs"]
    assert (lab["score"], lab["possible"]) == (1, 6)
    deaf = output_of(results, "lab-02-hangs", "test_a_hangs_beyond_the_reach_of_the_alarm")
    assert "timed out after 5 s (the per-test limit) during this test" in deaf
    assert "test_b_runs_after_the_hang" not in " ".join(lab["problems"])
    slow = output_of(results, "lab-02-hangs", "test_c_sleeps_past_its_limit")
    assert slow.startswith("timed out after 5 s (the per-test limit)")


def test_a_lab_that_outlives_its_time_limit_is_killed_and_timed_out_tests_extend_it(tmp_path):
    opts = Options(test_timeout=5)  # the budget of a timed-out test: 5 s + 5 s of grace
    log = tmp_path / "events.jsonl"
    log.write_text("")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert runner._wait(sleeper, log, limit=0.2, opts=opts) == (True, 0.0)  # killed
    finally:
        sleeper.kill()
    sleeper.wait()
    run = Run([], sleeper.returncode, timed_out=True, limit=3, output_tail="", elapsed=3.2)
    assert run.exit_reason() == "timed out after 3 s (the lab's time limit)"
    events = [
        {"event": "result", "nodeid": "t1", "outcome": "failed", "message": "timed out after 5 s"},
        {"event": "result", "nodeid": "t2", "outcome": "failed", "message": "AssertionError"},
        {"event": "timeout", "nodeid": "t3", "seconds": 5},  # the watchdog: a restart too
    ]
    assert timeout_allowance(events, 5) == 10 + (10 + runner.RESTART_ALLOWANCE)
    log.write_text("".join(json.dumps(e) + "\n" for e in events[:1]))
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert runner._wait(quick, log, limit=0.01, opts=opts) == (False, 10.0)  # extended, not killed
    hard = Run(events, 124, timed_out=False, limit=60, output_tail="", elapsed=5)
    assert hard.exit_reason() == "timed out after 5 s (the per-test limit)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("lab", "note", "reason"),
    [
        ("lab-03-exit-on-import", "tests cannot be imported", "exited with code 3 while importing"),
        ("lab-04-syntax-error", "starter.py cannot be imported", "SyntaxError"),
        ("lab-05-loop-on-import", "cannot be imported", "took more than 5 s"),
        ("lab-06-sys-exit-on-import", "cannot be imported", "SystemExit: 5"),
    ],
)
def test_a_starter_that_cannot_be_imported_scores_zero_of_known_points(runs, lab, note, reason):
    results, _ = runs["imports"]
    summary = by_lab(results)[lab]
    assert (summary["score"], summary["possible"]) == (0, 6)  # points known without importing
    assert summary["counted_by"] == "stub collection"
    assert summary["notes"].endswith(note) and reason in summary["problems"][0]
    tests = [t for t in results["tests"] if t["name"].startswith(lab)]
    assert len(tests) == 2 and all(reason in t["output"] for t in tests)


# ---- release ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_release_has_no_solution_code_and_keeps_figures(runs):
    release = runs["release_dir"]
    files = {p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file()}
    assert not [f for f in files if f.endswith("solution.py")]
    assert "labs/lab-00-add/figures.py" not in files  # it loads the solution
    assert "labs/lab-00-add/figures/plot.png" in files
    assert {"labs/lab-00-add/starter.py", "labs/lab-01-mul/test_lab.py"} <= files
    for path in release.rglob("*.py"):
        assert "doubled_value_of_the_argument" not in path.read_text()
    readme = (release / "README.md").read_text()
    assert readme.startswith("# The course") and "make grade LAB=00" in readme
    assert "How the course works." in readme
    assert "LAB_IMPL=solution" not in (release / "Makefile").read_text()


@pytest.mark.slow
def test_the_grader_runs_the_tests_in_the_release_and_untouched_starters_get_zero(runs):
    results, _ = runs["release"]
    assert validate_gradescope(results) == []
    assert results["score"] == 0 and results["extra_data"]["possible"] == 11
    assert len(results["tests"]) == 6
    for t in results["tests"]:
        assert t["output"].startswith("NotImplementedError: TODO"), t
        assert "(raised at starter.py:" in t["output"]


@pytest.mark.slow  # whole-tree (builds a release): make test-slow, which CI runs
def test_the_release_refuses_a_non_empty_folder_unless_forced(tmp_path):
    clean = clean_project(tmp_path / "course")
    release = tmp_path / "student"
    build_release(clean, release, quiet=True)
    with pytest.raises(ReleaseError, match="not empty"):
        build_release(clean, release, quiet=True)
    (release / "stale.txt").write_text("from an earlier copy")
    build_release(clean, release, force=True, quiet=True)  # an earlier copy: emptied first
    assert not (release / "stale.txt").exists()
    assert (release / "README.md").read_text().count("Student copy") == 1
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    build_release(clean, other, force=True, quiet=True)
    assert (other / "notes.txt").exists() and (other / "labs" / "lab-01-mul").is_dir()
    with pytest.raises(ReleaseError, match="inside the project"):
        build_release(clean, clean / "labs", force=True, quiet=True)
    with pytest.raises(ReleaseError, match="the project itself"):
        build_release(clean, clean, force=True, quiet=True)


@pytest.mark.slow  # whole-tree (builds a release): make test-slow, which CI runs
def test_the_release_stops_when_solution_code_leaks_outside_the_solution(tmp_path):
    root = clean_project(tmp_path / "course")
    (root / "common" / "helpers.py").write_text(ADD_SOLUTION)  # someone pasted the solution
    with pytest.raises(ReleaseError, match="common/helpers.py holds code of"):
        plan_release(root)
    (root / "common" / "helpers.py").unlink()
    starter = root / "labs" / "lab-00-add" / "starter.py"
    real_starter = starter.read_text()
    starter.write_text(ADD_SOLUTION)  # a mutant or solved copy left behind
    with pytest.raises(ReleaseError, match="starter.py holds 100% of the function bodies"):
        plan_release(root)
    starter.write_text(real_starter)
    (root / "labs" / "lab-00-add" / "NOTES.md").write_text(f"```python\n{ADD_SOLUTION}```\n")
    assert any("NOTES.md holds code of" in w for w in plan_release(root).warnings)


GIVEN = '''
def check_shape(x, n):
    """Given to students: both starter and solution load it."""
    if len(x) != n:
        raise ValueError(f"x must have {n} entries, got {len(x)}: check the caller's shape")
    return list(x)
'''


def test_the_release_counts_function_bodies_not_generic_lines_or_given_code(tmp_path):
    root = fake_project(tmp_path / "course")
    solution = (
        MUL_SOLUTION
        + GIVEN
        + '''

def table(rows):
    """Rows that multiply; generic lines like the ones below are in the tests too."""
    import warnings

    try:
        out = [mul(a, b) for a, b in rows]
    except ValueError as e:
        raise RuntimeError(e) from None
    warnings.simplefilter("ignore")
    return out
'''
    )
    lab = write_lab(root, "lab-01-mul", MUL_STARTER, MUL_TESTS, solution)
    (lab / "provided.py").write_text(GIVEN)
    (lab / "test_extra.py").write_text(
        "import warnings\n\n\ndef test_x():\n    try:\n        pass\n"
        "    except ValueError as e:\n        raise RuntimeError(e) from None\n"
        '    warnings.simplefilter("ignore")\n' + GIVEN
    )
    assert plan_release(root).warnings == []  # generic lines and provided code: no leak
    (lab / "test_extra.py").write_text(solution)  # the solution's own bodies: a leak
    with pytest.raises(
        ReleaseError, match=r"(?s)test_extra.py holds code of .*solution.py's table\(\)"
    ):
        plan_release(root)


# ---- autograder ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_autograder_zip_has_its_scripts_and_no_solution(runs):
    names, modes = runs["zip_names"], runs["zip_modes"]
    assert {"setup.sh", "run_autograder", "labs/lab-00-add/test_lab.py"} <= set(names)
    assert "requirements-cpu.txt" in names
    assert not [n for n in names if n.endswith("solution.py")]
    assert modes["run_autograder"] == 0o755 and modes["setup.sh"] == 0o755


@pytest.mark.slow
def test_the_autograder_grades_a_submission_in_a_simulated_gradescope(runs):
    results, _ = runs["gradescope"]
    assert validate_gradescope(results) == []
    labs = by_lab(results)
    assert (labs["lab-00-add"]["score"], labs["lab-00-add"]["possible"]) == (5, 5)
    assert (labs["lab-01-mul"]["score"], labs["lab-01-mul"]["possible"]) == (0, 6)
    assert "mul(2, 3) must be 6" in output_of(results, "lab-01-mul", "test_mul_multiplies")
    assert "lab-01-mul: my-work/lab01_starter.py" in results["output"]
    assert "lab-00-add: my-work/labs/lab-00-add/starter.py" in results["output"]
    assert "notes.py" not in results["output"]  # not a lab's file: silently ignored


# ---- pieces, without subprocesses ----------------------------------------------------------


def test_labs_are_chosen_by_number_or_folder_name():
    labs = [Path("labs/lab-00-add"), Path("labs/lab-01-mul"), Path("labs/lab-10-ten")]
    assert select_labs(labs, []) == labs
    assert select_labs(labs, ["01"]) == [labs[1]]
    assert select_labs(labs, ["1", "lab-00-add"]) == [labs[1], labs[0]]
    assert select_labs(labs, ["00,10"]) == [labs[0], labs[2]]
    with pytest.raises(ValueError, match="matches no lab; labs: lab-00-add"):
        select_labs(labs, ["07"])


def test_the_static_scan_counts_points_markers_and_literal_parametrize(tmp_path):
    lab = tmp_path / "labs" / "lab-09-x"
    lab.mkdir(parents=True)
    (lab / "test_lab.py").write_text(ADD_TESTS.replace("skipif(True", "gpu  # (") + MUL_TESTS)
    got = {
        t["name"]: (t["points"], t["skip"] is not None) for t in static_tests(lab / "test_lab.py")
    }
    assert got["test_add_one_adds_one_to_every_entry"] == (2.0, False)
    assert got["test_twice_doubles_its_argument[0]"] == got["test_twice_doubles_its_argument[1]"]
    assert got["test_mul_multiplies"] == (2.0, False)  # the module's pytestmark
    assert got["test_mul_by_zero_is_zero"] == (4.0, False)
    assert len(got) == 8


def test_results_validation_catches_what_gradescope_rejects():
    good = {"score": 1, "tests": [{"name": "t", "score": 1, "max_score": 1, "output": ""}]}
    assert validate_gradescope(good) == []
    assert validate_gradescope({"score": float("nan"), "tests": []})
    assert validate_gradescope({"tests": [{"score": 2, "max_score": 1}], "score": 2})
    assert validate_gradescope({"score": 0, "tests": [{"visibility": "sometimes"}]})


def test_collection_errors_are_summarized_to_the_exception_and_its_line():
    text = (
        "labs/lab-04-x/test_lab.py:3: in <module>\n    impl = load_impl(__file__)\n"
        "common/loader.py:52: in load_impl\n    spec.loader.exec_module(module)\n"
        "labs/lab-04-x/starter.py:3: in <module>\n    undefined + 1\n"
        "E   NameError: name 'undefined' is not defined\n"
    )
    assert summarize_collect_error(text) == (
        "NameError: name 'undefined' is not defined\n  (at starter.py:3)"
    )


def test_submitted_files_are_matched_to_labs_by_folder_or_name(tmp_path):
    labs = ["lab-00-add", "lab-01-mul", "lab-02-x"]
    files = {
        "zip/labs/lab-00-add/starter.py": "",
        "lab00_starter.py": "",  # the folder form wins
        "lab-01-mul.py": "",
        "lab02/starter.py": "",
        "test_lab.py": "",
        "starter.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found, ignored = find_submission_files(tmp_path, labs)
    assert {lab: p.relative_to(tmp_path).as_posix() for lab, p in found.items()} == {
        "lab-00-add": "zip/labs/lab-00-add/starter.py",
        "lab-01-mul": "lab-01-mul.py",
        "lab-02-x": "lab02/starter.py",
    }
    assert sorted(ignored) == ["lab00_starter.py", "starter.py"]  # test_lab.py: not a starter


HIDDEN_TESTS = """
import pytest

from common import load_impl

impl = load_impl(__file__)


@pytest.mark.points(3)
def test_mul_is_commutative():
    assert impl.mul(3, 4) == impl.mul(4, 3) == 12
"""


@pytest.mark.slow  # a whole grading run, a release and an autograder zip
def test_instructors_hidden_tests_are_graded_and_never_released(tmp_path):
    course = fake_project(tmp_path / "course")
    lab = write_lab(course, "lab-01-mul", MUL_STARTER, MUL_TESTS, MUL_SOLUTION)
    (lab / "test_hidden_extra.py").write_text(HIDDEN_TESTS.lstrip())
    proc = start_grading(course, "solution", "r.json", pythonpath=no_triton())
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, text
    results = json.loads((course / "r.json").read_text())
    summary = by_lab(results)["lab-01-mul"]
    assert (summary["score"], summary["possible"]) == (9, 9), text  # 6 + 3 hidden points
    assert any("test_mul_is_commutative" in t["name"] for t in results["tests"])
    release = tmp_path / "student"
    build_release(course, release, quiet=True)
    assert not (release / "labs" / "lab-01-mul" / "test_hidden_extra.py").exists()
    assert (release / "labs" / "lab-01-mul" / "test_lab.py").exists()
    zip_path = tmp_path / "autograder.zip"  # Gradescope's copy is the instructor's: it keeps them
    assert autograder.main(["--root", str(course), "--out", str(zip_path)]) == 0
    with zipfile.ZipFile(zip_path) as zf:
        assert "labs/lab-01-mul/test_hidden_extra.py" in zf.namelist()


# ---- the student copy of the real course -----------------------------------------------------


def test_the_student_copy_drops_marked_blocks_and_flags_what_a_student_cannot_follow(tmp_path):
    text = (
        "# Course\n\nFor everyone.\n"
        "<!-- >>> not in the student copy (`make release` drops this block) -->\n"
        "Run `make mutants` and read solution.py.\n<!-- <<< not in the student copy -->\n"
        "The end.\n"
    )
    assert strip_instructor_blocks(text) == "# Course\n\nFor everyone.\nThe end.\n"
    with pytest.raises(ValueError, match="never closed"):
        strip_instructor_blocks("<!-- >>> not in the student copy -->\ntext\n")
    (tmp_path / "Makefile").write_text("test:\n\techo\ngrade:\n\techo\n")
    (tmp_path / "labs" / "lab-00-x").mkdir(parents=True)
    readme = tmp_path / "labs" / "lab-00-x" / "README.md"
    readme.write_text(
        "Run `make grade`, then\n\n```bash\npytest labs/lab-00-x -q\nmake figures\n"
        ".venv/bin/python -m pytest labs/lab-00-x -q\n```\n\nas solution.py does. To make the"
        " kernel fast, see vllm/v1/attention/backend.py.\n"
    )
    problems = coherence_problems(
        tmp_path, [Path("labs/lab-00-x/README.md")], [Path("labs/lab-00-x/solution.py")]
    )
    assert [p.split(": ", 2)[:2] for p in problems] == [
        ["labs/lab-00-x/README.md:4", "a bare pytest (use .venv)"],
        ["labs/lab-00-x/README.md:5", "`make figures` is not a target of the Makefile"],
        [
            "labs/lab-00-x/README.md:9",
            "refers to solution.py, which the student copy does not have",
        ],
    ]


@pytest.mark.slow  # `make release` of the whole course
@pytest.mark.skipif(
    not list(ROOT.glob("labs/*/solution.py")), reason="a student copy has no solutions to release"
)
def test_make_release_on_the_real_course_gives_a_copy_written_for_a_student(tmp_path):
    out = tmp_path / "student"
    proc = subprocess.run(
        ["make", "release", f"OUT={out}", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    labs = sorted(p.parent.name for p in ROOT.glob("labs/lab-*/test_lab.py"))
    assert labs and all(f"labs/{lab}/starter.py" in files for lab in labs)
    assert not [f for f in files if f.endswith("solution.py") or "/test_hidden" in f]
    assert not [f for f in files if f.startswith("tests/mutants/")]
    for figures in out.glob("labs/*/figures.py"):
        assert "solution" not in figures.read_text(), figures
    assert default_impl(out) == "starter"  # LAB_IMPL unset: the starters, no FileNotFoundError
    # Every document of the copy is written for a student: nothing the release flags.
    flagged = [line for line in proc.stdout.splitlines() if "not for a student:" in line]
    assert not flagged, "wrap instructor-only text in not-in-the-student-copy markers:\n" + (
        "\n".join(flagged))
    readme, makefile = (out / "README.md").read_text(), (out / "Makefile").read_text()
    assert readme.startswith("# ") and readme.split("\n## ", 2)[1].startswith("Student copy")
    for word in ("For instructors", "make release", "make autograder", "make mutants"):
        assert word not in readme and word not in makefile
    assert {"setup", "test", "grade", "test-lab"} <= make_targets(makefile)
    assert not {"release", "autograder", "mutants"} & make_targets(makefile)
    dry = subprocess.run(
        ["make", "-n", "test", "test-lab", "grade", "LAB=00", f"PY={sys.executable}"],
        cwd=out,
        # the copy's defaults, not the caller's LAB_IMPL or (under `make test`) make's flags
        env={k: v for k, v in os.environ.items()
             if k not in ("LAB_IMPL", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")},  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0 and "LAB_IMPL=solution" not in dry.stdout, dry.stdout + dry.stderr
    commands = [line for line in dry.stdout.splitlines()
                if not line.startswith(("echo", "make["))]  # fmt: skip
    assert len(commands) == 3 and all(c.startswith("LAB_IMPL=starter ") for c in commands)


def test_the_load_calibration_started_early_gives_a_factor_and_leaves_no_child():
    from grading.run import calibration

    pending = calibration.start()
    assert pending is not None and 1.0 <= pending.result() <= calibration.MAX_LOAD_FACTOR
    assert pending.result() == pending.result()  # read once, kept
    with pytest.raises(ChildProcessError):
        os.waitpid(pending.pid, 0)  # reaped
    unused = calibration.start()  # the limits were given: the child is ended, not waited for
    unused.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(unused.pid, 0)
