"""The grader against submissions that attack it (not graded).

Each attack of issue 14 is a hostile ``lab<NN>_starter.py`` in one submission, graded by
the autograder zip in a simulated ``/autograder`` the way Gradescope runs it (as root here,
so the graded code runs under sandbox uids of its own). Every lab's tests are the same six
points on ``mul(a, b)``; the expected score is what the submitted code earns honestly:

- lab-00: writes a ``conftest.py`` that passes every test into every lab folder it can
  reach, then ``os._exit(1)`` so that the lab would be re-run with it (it scored 255/258);
- lab-01: monkeypatches ``grading.plugin.points`` (absent from the sandbox: then
  ``common.testing``) to pass everything, 1000 points each, and multiplies wrongly;
- lab-02: a double-forked ``setsid`` daemon waits for ``results.json`` and rewrites it;
- lab-03: raises an exception carrying the source of every ``test_hidden*.py`` it can read
  (the lab has an instructor's hidden test with a secret in it);
- lab-04: an endless loop inside a hypothesis ``@given`` test and five ``os._exit`` calls;
  the other tests of the lab must still be graded;
- lab-05: an honest, correct submission (the later lab the conftest attack aimed at);
- lab-06: returns an object whose ``__eq__`` is always true (and ``__ne__`` always false,
  ``__bool__`` true): comparisons and truth tests never run the graded code;
- lab-07: returns an object-dtype numpy array of such objects (``==`` on it is elementwise,
  ``np.array_equal`` said True): only numeric arrays cross;
- lab-08: multiplies correctly, but leaves a 1 MB file and a folder in ``/tmp`` (once enough
  to fail every later lab: a ``/tmp/pytest-of-root`` owned by another user): each lab's
  test process has a temp folder of its own, with the user switch the graded code's
  ``/tmp`` is its lab's own (a mount namespace), and what the lab's uids leave in the shared
  temp folders is removed when the lab ends;
- lab-09: multiplies through the float64 reference the tests use (``common.reference``),
  which is not in the sandbox.

A second run, without the user switch (``COURSE_SANDBOX_UIDS=none``: a student's laptop),
shows what the process split alone defends. ``test_the_proxy_*`` check what crosses
between the tests and the worker, through plain pytest runs of a small lab.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from grading.run.report import validate_gradescope
from grading.sandbox import host
from grading.sandbox.host import UID_RANGE, choose_mode
from grading.tools import autograder

ROOT = Path(__file__).resolve().parents[1]
SECRET = "SECRET-HIDDEN-TEST-MARKER-7319"

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
from hypothesis import given, strategies as st

from common import load_impl

impl = load_impl(__file__)


@pytest.mark.points(2)
def test_mul_multiplies():
    assert impl.mul(2, 3) == 6, "mul(2, 3) must be 6"


@pytest.mark.points(2)
def test_mul_by_zero_is_zero():
    assert impl.mul(5, 0) == 0


@pytest.mark.points(2)
@given(st.integers(-9, 9), st.integers(-9, 9))
def test_mul_is_commutative(a, b):
    assert impl.mul(a, b) == impl.mul(b, a) == a * b
"""
HIDDEN_TESTS = f"""
import pytest

from common import load_impl

impl = load_impl(__file__)


@pytest.mark.points(3)
def test_secret_hidden_case():
    # {SECRET}
    assert impl.mul(7, 6) == 42, "the hidden test's own message"
"""
CRASH_STARTER = """
import os


def mul(a, b):
    return a * b


def loop(x):
    while True:
        pass


def leave(x):
    os._exit(3)
"""
CRASH_TESTS = """
import pytest
from hypothesis import given, strategies as st

from common import load_impl

impl = load_impl(__file__)


@pytest.mark.points(1)
def test_a_before_everything():
    assert impl.mul(2, 3) == 6


@pytest.mark.points(1)
@given(st.integers(0, 9))
def test_b_endless_loop_inside_given(x):
    impl.loop(x)


@pytest.mark.points(1)
@pytest.mark.parametrize("n", range(5))
def test_c_os_exit(n):
    impl.leave(n)


@pytest.mark.points(1)
def test_d_between_the_crashes():
    assert impl.mul(3, 3) == 9


@pytest.mark.points(1)
@given(st.integers(-9, 9))
def test_e_after_the_crashes(a):
    assert impl.mul(a, 2) == 2 * a


@pytest.mark.points(1)
def test_f_last():
    assert impl.mul(0, 1) == 0
"""  # possible 10; honest score 4 (a, d, e, f)

LABS = {  # lab -> tests (a test_hidden file is added to lab-03)
    "lab-00-conftest": MUL_TESTS,
    "lab-01-patch": MUL_TESTS,
    "lab-02-daemon": MUL_TESTS,
    "lab-03-hidden": MUL_TESTS,
    "lab-04-crashes": CRASH_TESTS,
    "lab-05-honest": MUL_TESTS,
    "lab-06-liar": MUL_TESTS,
    "lab-07-object-array": MUL_TESTS,
    "lab-08-temp": MUL_TESTS,
    "lab-09-reference": MUL_TESTS,
}


def attacks(source: Path, results: Path, marks: Path) -> dict[str, str]:
    """The submitted file of each lab (``lab<NN>_starter.py``)."""
    conftest = textwrap.dedent("""
        import pytest

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item, call):
            report = yield
            report.outcome = "passed"
            return report
    """)
    return {
        "lab-00-conftest": f"""
import glob, os
CONFTEST = {conftest!r}
here = os.path.dirname(os.path.abspath(__file__))
for lab in glob.glob(os.path.join(here, "..", "*")) + glob.glob({str(source / "labs" / "*")!r}) \\
        + [os.path.join({str(source / "labs")!r}, name) for name in {list(LABS)!r}]:
    try:
        with open(os.path.join(lab, "conftest.py"), "w") as f:
            f.write(CONFTEST)
        open(os.path.join({str(marks)!r}, "conftest-" + os.path.basename(lab)), "w").close()
    except OSError:
        pass
os._exit(1)
""",
        "lab-01-patch": """
try:
    import grading.plugin.points as points
except ImportError:  # the scratch copy holds the grader's sandbox package only
    import common.testing as points

points._combine = lambda phases: ("passed", "")
points.points_of = lambda item: 1000.0
points.describe_exception = lambda *args: ""


def mul(a, b):
    return a + b
""",
        "lab-02-daemon": f"""
import json, os, time

def _daemon():
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    open(os.path.join({str(marks)!r}, f"daemon-{{os.getpid()}}"), "w").close()
    for _ in range(900):
        time.sleep(0.1)
        try:
            if os.path.exists({str(results)!r}):
                time.sleep(0.3)
                with open({str(results)!r}, "w") as f:
                    json.dump({{"score": 999, "tests": []}}, f)
                open(os.path.join({str(marks)!r}, "rewrote"), "w").close()
                break
        except OSError:
            pass
    os._exit(0)

_daemon()


def mul(a, b):
    return a * b
""",
        "lab-03-hidden": f"""
import glob, os

def _steal():
    here = os.path.dirname(os.path.abspath(__file__))
    paths = glob.glob(os.path.join(here, "test_hidden*.py"))
    paths += [{str(source / "labs" / "lab-03-hidden" / "test_hidden_extra.py")!r}]
    paths += glob.glob({str(source / "labs" / "*" / "test_hidden*.py")!r})
    paths += glob.glob({str(source / "labs" / "*" / "__pycache__" / "test_hidden*")!r})
    paths += glob.glob(f"/proc/{{os.getppid()}}/cwd/labs/*/test_hidden*.py")
    found = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                found.append(" ".join(f.read().decode("utf-8", "replace").split()))
        except OSError as exc:
            found.append(type(exc).__name__)
    return " | ".join(found)


def mul(a, b):
    raise ValueError("stolen: " + _steal())
""",
        "lab-04-crashes": CRASH_STARTER,
        "lab-05-honest": MUL_SOLUTION,
        "lab-06-liar": LIAR + """

def mul(a, b):
    return Liar()
""",
        "lab-07-object-array": "import numpy as np\n" + LIAR + """

def mul(a, b):
    return np.array([Liar(), Liar()], dtype=object)
""",
        "lab-08-temp": f"""
import os

for folder in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        os.makedirs(os.path.join(folder, {marks.name!r} + "-dir"), exist_ok=True)
        with open(os.path.join(folder, {marks.name!r} + "-file"), "wb") as f:
            f.write(bytes(1 << 20))
    except OSError:
        pass


def mul(a, b):
    return a * b
""",
        "lab-09-reference": """
def mul(a, b):
    from common.reference import to_float64

    return int(to_float64(a) * b)
""",
    }


LIAR = """
class Liar:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    def __hash__(self):
        return 0

    def __repr__(self):
        return "6"
"""


EXPECTED = {  # (score, possible) the submitted code earns honestly
    "lab-00-conftest": (0, 6),
    "lab-01-patch": (0, 6),
    "lab-02-daemon": (6, 6),
    "lab-03-hidden": (0, 9),
    "lab-04-crashes": (4, 10),
    "lab-05-honest": (6, 6),
    "lab-06-liar": (0, 6),
    "lab-07-object-array": (0, 6),
    "lab-08-temp": (6, 6),
    "lab-09-reference": (0, 6),
}


def course(root: Path) -> Path:
    """conftest, pyproject, requirements, common/ and grading/ of the real project, and the labs."""
    root.mkdir(parents=True)
    for name in ("conftest.py", "pyproject.toml", "Makefile", "requirements-cpu.txt"):
        shutil.copy2(ROOT / name, root / name)
    for package in ("common", "grading"):
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (root / "README.md").write_text("# The course\n")
    for name, tests in LABS.items():
        lab = root / "labs" / name
        lab.mkdir(parents=True)
        (lab / "test_lab.py").write_text(tests)
        crash = name == "lab-04-crashes"
        (lab / "solution.py").write_text(CRASH_STARTER if crash else MUL_SOLUTION)
        (lab / "starter.py").write_text(CRASH_STARTER if crash else MUL_STARTER)
        (lab / "README.md").write_text(f"# {name}\n")
    (root / "labs" / "lab-03-hidden" / "test_hidden_extra.py").write_text(HIDDEN_TESTS)
    return root


def start(tmp: Path, uids: str | None) -> dict:
    """Build the autograder zip, submit the attacks and start ``run_autograder``."""
    zip_path = tmp / "autograder.zip"
    assert autograder.main(["--root", str(course(tmp / "course")), "--out", str(zip_path)]) == 0
    ag = tmp / "autograder"
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(ag / "source")
        for info in zf.infolist():
            (ag / "source" / info.filename).chmod((info.external_attr >> 16) & 0o777)
    (ag / "results").mkdir()
    # where the attacks may write: not in /tmp or /dev/shm, which are each sandboxed
    # process's own with the user switch (as root: /var/lib; else the temp folder, unswitched)
    shared = "/var/lib" if os.access("/var/lib", os.W_OK) else None
    marks = Path(tempfile.mkdtemp(prefix="attack-marks-", dir=shared))
    marks.chmod(0o777)
    sub = ag / "submission"
    sub.mkdir()
    results = ag / "results" / "results.json"
    for name, text in attacks(ag / "source", results, marks).items():
        (sub / f"lab{name[4:6]}_starter.py").write_text(text.lstrip())
    # readable by the sandbox users: the grader's pre-flight checks the packages on its path
    no_triton = Path(tempfile.mkdtemp(prefix="no-triton-")) / "triton"
    no_triton.parent.chmod(0o755)
    no_triton.mkdir()
    (no_triton / "__init__.py").write_text('raise ImportError("not in these labs")\n')
    env = dict(os.environ, AUTOGRADER_ROOT=str(ag), AUTOGRADER_PYTHON=sys.executable,
               TRITON_INTERPRET="1", PYTHONPATH=str(no_triton.parent), GRADE_TEST_TIMEOUT="3",
               GRADE_LAB_TIMEOUT="120")
    for name in ("PYTEST_ADDOPTS", "COURSE_SANDBOX", "COURSE_SANDBOX_ZYGOTE", "GRADE_SANDBOX",
                 "GRADE_JOBS"):
        env.pop(name, None)
    if uids is not None:
        env["COURSE_SANDBOX_UIDS"] = uids
    proc = subprocess.Popen(["bash", str(ag / "source" / "run_autograder")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return {"proc": proc, "results": results, "marks": marks, "source": ag / "source",
            "no_triton": no_triton.parent}


def finish(run: dict) -> dict:
    """Wait for the run; the results, the output, and what the attacks left behind."""
    output, _ = run["proc"].communicate(timeout=900)
    assert run["proc"].returncode == 0, output
    time.sleep(2.0)  # a daemon that survived would rewrite results.json meanwhile
    raw = run["results"].read_text()
    out = {"results": json.loads(raw), "output": output, "raw": raw, "source": run["source"],
           "marks": sorted(p.name for p in run["marks"].iterdir()), "marks_dir": run["marks"]}
    shutil.rmtree(run["marks"], ignore_errors=True)
    shutil.rmtree(run["no_triton"], ignore_errors=True)
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):  # what lab-08 left without the switch
        shutil.rmtree(Path(folder, run["marks"].name + "-dir"), ignore_errors=True)
        Path(folder, run["marks"].name + "-file").unlink(missing_ok=True)
    return out


def labs_of(results: dict) -> dict[str, tuple[float, float]]:
    return {lab["name"]: (lab["score"], lab["possible"]) for lab in results["extra_data"]["labs"]}


def outputs_of(results: dict, lab: str) -> dict[str, dict]:
    return {t["name"].split(" › ")[1]: t for t in results["tests"] if t["name"].startswith(lab)}


def _user_switch_reason() -> str | None:
    mode, _ = choose_mode()
    return None if mode.uids is not None else mode.reason


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Both simulations, started together (the grader mostly waits on its workers)."""
    reason = _user_switch_reason()
    started = {"split": start(tmp_path_factory.mktemp("split"), "none")}
    if reason is None:
        started["switched"] = start(tmp_path_factory.mktemp("switched"), None)
    done = {key: finish(run) for key, run in started.items()}
    done["switched_skip"] = reason
    return done


@pytest.fixture(scope="module")
def switched(runs) -> dict:
    if runs["switched_skip"] is not None:
        pytest.skip(f"the user switch needs root and a usable uid range "
                    f"({runs['switched_skip']})")
    return runs["switched"]


@pytest.fixture(scope="module")
def split_only(runs) -> dict:
    return runs["split"]


# ---- with the user switch (Gradescope) ------------------------------------------------------


@pytest.mark.slow
def test_every_attack_scores_what_the_submitted_code_earns(switched):
    results = switched["results"]
    assert validate_gradescope(results) == []
    assert labs_of(results) == EXPECTED
    assert results["score"] == sum(s for s, _ in EXPECTED.values())
    assert "user switch" in results["extra_data"]["sandbox"]


@pytest.mark.slow
def test_a_conftest_written_at_import_reaches_no_lab(switched):
    written = [m for m in switched["marks"] if m.startswith("conftest-")]
    assert written == ["conftest-lab-00-conftest"]  # its own folder of its scratch copy only
    assert not list(switched["source"].glob("labs/*/conftest.py"))
    tests = outputs_of(switched["results"], "lab-00-conftest")
    assert all("exited with code 1 while importing" in t["output"] for t in tests.values())


@pytest.mark.slow
def test_patching_the_points_plugin_patches_only_the_worker(switched):
    tests = outputs_of(switched["results"], "lab-01-patch")
    assert [t["max_score"] for t in tests.values()] == [2, 2, 2]
    assert "mul(2, 3) must be 6" in tests["test_mul_multiplies"]["output"]


@pytest.mark.slow
def test_a_double_forked_daemon_cannot_rewrite_the_results(switched):
    assert [m for m in switched["marks"] if m.startswith("daemon-")], "the attack did not run"
    assert "rewrote" not in switched["marks"]
    assert switched["results"]["score"] == sum(s for s, _ in EXPECTED.values())
    # Only this run's uids: another grader on the machine (CI is shared) has its own block.
    described = switched["results"]["extra_data"]["sandbox"]
    blocks = [(int(a), int(b)) for a, b in re.findall(r"(\d+)-(\d+)", described.split(
        " in a scratch copy")[0])]
    assert len(blocks) == len(LABS), described
    assert all(UID_RANGE[0] <= first <= last < UID_RANGE[1] for first, last in blocks)
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if any(first <= entry.stat().st_uid <= last for first, last in blocks):
                    left.append(entry.name)
            except OSError:
                pass
    assert not left, f"sandbox processes of this run outlived the grading: {left}"


@pytest.mark.slow
def test_nothing_a_lab_leaves_in_the_shared_temp_folders_outlives_it(switched):
    token = Path(switched["marks_dir"]).name
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        for suffix in ("-dir", "-file"):
            assert not Path(folder, token + suffix).exists(), f"{folder}/{token}{suffix} stayed"


@pytest.mark.slow
def test_hidden_tests_are_neither_readable_nor_shown(switched):
    results, raw = switched["results"], switched["raw"]
    assert SECRET not in raw and "the hidden test's own message" not in results["output"]
    tests = outputs_of(results, "lab-03-hidden")
    assert tests["test_secret_hidden_case"]["visibility"] == "after_published"
    visible = [t for name, t in tests.items() if name != "test_secret_hidden_case"]
    assert visible and all(t["visibility"] == "visible" for t in visible)
    assert "test_secret_hidden_case" not in results["output"]
    assert all("PermissionError" in t["output"] or "stolen: " in t["output"] for t in visible)


@pytest.mark.slow
def test_a_loop_inside_given_and_five_exits_cost_only_their_tests(switched):
    tests = outputs_of(switched["results"], "lab-04-crashes")
    passed = sorted(name for name, t in tests.items() if t["status"] == "passed")
    assert passed == ["test_a_before_everything", "test_d_between_the_crashes",
                      "test_e_after_the_crashes", "test_f_last"]
    assert "timed out after 3 s (the per-test limit) in loop" in tests[
        "test_b_endless_loop_inside_given"]["output"]
    for n in range(5):
        assert "the worker exited with code 3 in leave" in tests[f"test_c_os_exit[{n}]"]["output"]


def test_python_the_sandbox_users_cannot_read_refuses_to_grade_as_root(
        tmp_path, monkeypatch, capsys):
    """The pre-flight: a project (or its .venv) inside a folder only root may enter would
    fail every Triton test in the sandbox, and the process split would run the graded code
    as root: the grader refuses, says why and what to do, exits non-zero and writes no
    results.json."""
    monkeypatch.delenv("COURSE_SANDBOX_UIDS", raising=False)
    if _user_switch_reason() is not None:
        pytest.skip(f"the user switch needs root ({_user_switch_reason()})")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "package.py").write_text("")
    monkeypatch.setattr(host, "python_files", lambda: [str(private / "package.py")])
    mode, blocks = choose_mode(2)
    assert mode.uids is None and blocks == [] and mode.refused
    assert "refusing to grade" in mode.refusal() and "never runs as root" in mode.refusal()
    assert f"the sandbox users cannot read {private / 'package.py'}" in mode.refusal()
    from grading.run import cli

    results = tmp_path / "results.json"
    code = cli.main(["--root", str(ROOT), "--lab", "09", "--results", str(results),
                     "--quiet"])
    assert code != 0 and not results.exists()
    assert "refusing to grade" in capsys.readouterr().err


def test_without_root_the_process_split_is_allowed_and_said(monkeypatch):
    """A student's laptop: the code runs as the student, who owns everything anyway."""
    monkeypatch.delenv("COURSE_SANDBOX_UIDS", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    mode, _ = choose_mode()
    assert mode.uids is None and not mode.refused
    assert "process split only (not running as root" in mode.describe()


# ---- without it (a student's laptop): the process split alone --------------------------------


@pytest.mark.slow
def test_the_process_split_alone_stops_patching_crashes_hangs_and_daemons(split_only):
    results = split_only["results"]
    assert "process split only" in results["extra_data"]["sandbox"]
    assert labs_of(results) == EXPECTED  # the grader only ever loads its own conftest.py
    assert [m for m in split_only["marks"] if m.startswith("daemon-")]
    assert "rewrote" not in split_only["marks"]
    # What it does not stop: code running as the grader's own user can write into the
    # source tree (here a conftest.py in every lab) and read the hidden tests.
    assert [m for m in split_only["marks"] if m.startswith("conftest-")]
    assert SECRET in split_only["raw"]


# ---- what crosses between the tests and the worker ------------------------------------------

PROXY_PROVIDED = '''
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class State(NamedTuple):
    m: np.ndarray
    l: np.ndarray


@dataclass
class Stats:
    hits: int
    rate: float


class NoFreeBlocks(RuntimeError):
    """The pool cannot serve the request."""
'''
PROXY_STARTER = '''
import os

import numpy as np
import torch

from common.loader import load_lab_module

provided = load_lab_module(__file__, "provided")
State, Stats, NoFreeBlocks = provided.State, provided.Stats, provided.NoFreeBlocks
BLOCK = 16


def whoami():
    return os.getuid()


def read(path):
    with open(path) as f:
        return f.read()


def write_kv(k_cache, slots, k):
    """Writes the caches in place (as lab-01's write_kv)."""
    k_cache[slots] = k


def scale_(t):
    t.mul_(2)
    return t.sum()


def strided(t):
    return t.stride(), t.is_contiguous(), t


def state(n):
    return State(np.zeros(n), np.ones(n))


def stats(state):
    return Stats(hits=len(state.m), rate=float(state.l.sum()))


def tile(x, *, block_m=None, block_n=None):
    return x, block_m, block_n


def check(x):
    if x < 0:
        raise ValueError(f"x must be >= 0, got {x}")
    raise NoFreeBlocks(f"no block for {x}")


class MyError(KeyError):
    pass


def mine():
    raise MyError("mine")


def grad_of(x):
    (x * x).sum().backward()


def big(n):
    return np.ones(n)


def syncing(t):
    return float(t.sum().item())


class BlockPool:
    def __init__(self, num_blocks):
        self.free = list(range(num_blocks))
        self.owner = {}

    @property
    def num_free_blocks(self):
        return len(self.free)

    def allocate(self, n):
        if n > len(self.free):
            raise NoFreeBlocks(f"asked for {n}, {len(self.free)} free")
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, blocks):
        self.free.extend(blocks)

    def __len__(self):
        return len(self.free)

    def __contains__(self, block):
        return block in self.free


class Manager:
    def __init__(self, pool):
        self.pool = pool

    def take(self, n):
        return self.pool.allocate(n)


class Liar:
    def __eq__(self, other):
        return True

    __ne__ = __lt__ = __gt__ = lambda self, other: False
    __bool__ = lambda self: True


def liar():
    return Liar()


def liars():
    return [1, Liar()]


def object_array():
    return np.array([Liar(), Liar()], dtype=object)


def state_of_liars():
    return State(Liar(), np.ones(2))


def raises_with_a_liar():
    raise ValueError(Liar())


def forever():
    while True:
        pass


def write_tmp(name):
    with open(os.path.join("/tmp", name), "w") as f:
        f.write("left by the graded code")
    return os.path.exists(os.path.join("/tmp", name))


def reference():
    from common.reference import reference_attention

    return reference_attention is not None


def huge_view():
    return torch.zeros(1).expand(500_000_000)  # one element, claiming 2 GB


def huge_reply():
    return np.ones(10_000_000)  # 80 MB
'''
PROXY_SCRIPT = '''
import os
import sys

import numpy as np

from common.loader import load_impl

impl = load_impl(__file__)
out = sys.argv[sys.argv.index("--out") + 1]
np.save(os.path.join(out, "state.npy"), impl.state(3).l)
print("uid", os.getuid(), "cwd", os.getcwd())
'''
PROXY_TESTS = '''
import os
import pathlib
import inspect

import numpy as np
import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from common import load_impl
from common.testing import (LabScript, Earlier, call_all, called_on_copies, host_syncs,
                            peak_memory)

impl = load_impl(__file__)
SWITCHED = os.environ["EXPECT_SWITCH"] == "1"


def test_the_graded_code_runs_in_another_process():
    assert impl.whoami() != os.getuid() if SWITCHED else True
    assert type(impl.write_kv).__name__ == "RemoteFunction"


def test_the_tests_are_not_readable_with_the_user_switch():
    if not SWITCHED:
        pytest.skip("without the user switch the worker has the grader's permissions")
    with pytest.raises((PermissionError, FileNotFoundError)):  # not even there: its own /tmp
        impl.read(__file__)


def test_arrays_written_in_place_are_copied_back():
    cache = np.full((4, 2), np.nan)
    impl.write_kv(cache, np.array([2, 0]), np.arange(4.0).reshape(2, 2))
    assert np.array_equal(cache[[2, 0]], np.arange(4.0).reshape(2, 2))
    assert np.isnan(cache[[1, 3]]).all()
    t = torch.ones(3)
    assert float(impl.scale_(t)) == 6.0 and torch.equal(t, torch.full((3,), 2.0))


def test_a_read_only_input_stays_read_only():
    cache = np.zeros((4, 2))
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        impl.write_kv(cache, np.array([0]), np.ones((1, 2)))


def test_tensor_strides_survive_the_trip():
    t = torch.arange(12.0).reshape(3, 4).t()
    stride, contiguous, back = impl.strided(t)
    assert stride == (1, 4) and not contiguous and back.stride() == (1, 4)
    assert torch.equal(back, t)
    half = torch.ones(2, dtype=torch.bfloat16)
    assert impl.strided(half)[2].dtype == torch.bfloat16


def test_given_types_come_back_as_the_trusted_classes():
    s = impl.state(3)
    assert isinstance(s, impl.State) and type(s).__module__.endswith(".provided")
    stats = impl.stats(impl.State(np.zeros(2), np.ones(2)))
    assert stats == impl.Stats(hits=2, rate=2.0)
    assert impl.BLOCK == 16


def test_exceptions_keep_their_type_and_message():
    with pytest.raises(ValueError, match="x must be >= 0, got -1"):
        impl.check(-1)
    with pytest.raises(impl.NoFreeBlocks, match="no block for 3"):
        impl.check(3)
    with pytest.raises(KeyError, match="MyError"):
        impl.mine()


def test_signatures_are_those_of_the_graded_functions():
    params = inspect.signature(impl.tile).parameters
    assert params["block_m"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["block_m"].default is None


def test_gradients_computed_in_the_worker_come_back():
    x = torch.ones(3, requires_grad=True)
    impl.grad_of(x)
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_objects_of_student_classes_are_remote_handles():
    pool = impl.BlockPool(5)
    assert isinstance(pool, impl.BlockPool) and not isinstance(pool, impl.Manager)
    assert pool.num_free_blocks == 5 and len(pool) == 5 and 4 in pool
    assert pool.allocate(2) == [0, 1] and pool.num_free_blocks == 3
    with pytest.raises(impl.NoFreeBlocks, match="asked for 9"):
        pool.allocate(9)
    manager = impl.Manager(pool)
    assert manager.take(1) == [2] and manager.pool.num_free_blocks == 2


def test_batched_calls_are_the_calls_one_by_one_in_one_request():
    pool = impl.BlockPool(6)
    got = call_all([(pool.allocate, (2,)), (pool.allocate, (1,)), (impl.state, (2,))])
    assert got[:2] == [[0, 1], [2]] and pool.num_free_blocks == 3
    assert type(got[2]) is impl.State and np.array_equal(got[2].l, np.ones(2))
    cache = np.full((3, 1), np.nan)
    call_all([(impl.write_kv, (cache, np.array([1]), np.ones((1, 1))))])
    assert cache[1, 0] == 1 and np.isnan(cache[[0, 2]]).all()  # written back, per step
    with pytest.raises(impl.NoFreeBlocks, match="asked for 9"):  # the first error ends it
        call_all([(pool.allocate, (1,)), (pool.allocate, (9,)), (pool.allocate, (1,))])
    assert pool.num_free_blocks == 2  # the step after the error never ran
    reads = [(getattr, (pool, "num_free_blocks")), (pool.allocate, (1,)),
             (getattr, (pool, "num_free_blocks"))]
    assert call_all(reads) == [2, [4], 1]  # attributes read in order, between the calls
    with pytest.raises(BaseException, match="BlockPool.allocate is a method"):
        call_all([(getattr, (pool, "allocate"))])  # a batch reads data, it calls methods
    assert call_all([(getattr, (pool, "num_free_blocks"))]) == [1]
    gated = [(pool.release, ([7],)), (pool.allocate, (1,))]
    assert call_all(gated, stop_if_none=0) == [None] and pool.num_free_blocks == 2  # None
    assert call_all(gated[::-1], stop_if_none=0)[1:] == [None]  # ends it; a list goes on
    assert pool.num_free_blocks == 2
    built = call_all([(impl.BlockPool, (4,)), (impl.Manager, (Earlier(0),)),  # one trip:
                      (impl.state, (2,)), (impl.stats, (Earlier(2),))])  # a step's result
    assert isinstance(built[1], impl.Manager) and built[3] == impl.stats(built[2])  # is an
    assert built[1].take(1) == [0] and built[0].num_free_blocks == 3  # argument of a later
    with pytest.raises(ValueError, match="must name an earlier call"):
        call_all([(impl.Manager, (Earlier(0),))])
    with pytest.raises(BaseException, match="an object of the class Liar"):
        call_all([(impl.big, (2,)), (impl.liars, ())])  # still plain data only
    assert call_all([]) == [] and call_all([(len, ([1, 2],))]) == [2]
    kept, written, one = np.zeros((3, 1)), np.zeros((3, 1)), np.ones((1, 1))
    call_all([(called_on_copies(impl).write_kv, (kept, np.array([1]), one)),  # in one batch,
              (called_on_copies(impl, {"write_kv": (0,)}).write_kv,  # each on its copies
               (written, np.array([2]), one))])
    assert not kept.any() and written[2, 0] == 1 and not written[:2].any()


def test_measurements_are_taken_in_the_worker():
    result, peak = peak_memory(impl.big, 100_000)
    assert result.shape == (100_000,) and peak >= 800_000
    value, syncs = host_syncs(impl.syncing, torch.ones(4))
    assert value == 4.0 and syncs and "starter.py" in syncs[0]


def test_a_lab_script_runs_in_the_sandbox(tmp_path):
    script = LabScript(__file__, "script.py", "--out", str(tmp_path))
    code, output = script.result(timeout=60)
    assert code == 0, output
    assert np.array_equal(np.load(tmp_path / "state.npy"), np.ones(3))
    uid = int(output.split()[1])
    assert (uid != os.getuid()) if SWITCHED else uid == os.getuid()


def test_comparisons_and_truth_tests_never_run_the_graded_code():
    liar = impl.liar()
    with pytest.raises(TypeError, match="does not let it be compared"):
        assert liar == 6
    with pytest.raises(TypeError, match="does not let it be compared"):
        assert liar != 5
    with pytest.raises(TypeError, match="does not let it be tested for truth"):
        assert liar


def test_only_plain_data_comes_back_and_a_wrong_type_says_what_was_expected():
    with pytest.raises(BaseException, match="numpy array of dtype object.*the grader accepts "
                       "numeric numpy arrays"):
        impl.object_array()
    with pytest.raises(BaseException, match="an object of the class Liar .*at result.1."):
        impl.liars()
    with pytest.raises(BaseException, match="at result.m"):
        impl.state_of_liars()
    with pytest.raises(ValueError) as info:
        impl.raises_with_a_liar()
    assert not any(type(a).__name__.startswith("Remote") for a in info.value.args)


def test_with_the_user_switch_the_graded_code_has_a_tmp_of_its_own():
    name = f"proxy-lab-tmp-{os.getpid()}"
    try:
        assert impl.write_tmp(name) is True
        assert os.path.exists(os.path.join("/tmp", name)) is not SWITCHED
    finally:
        if os.path.exists(os.path.join("/tmp", name)):
            os.unlink(os.path.join("/tmp", name))


def test_the_reference_is_not_importable_from_graded_code():
    with pytest.raises(ImportError, match="common.reference"):
        impl.reference()


def test_replies_are_bounded_before_they_are_decoded():
    with pytest.raises(BaseException, match="decodes to more than 256 MiB"):
        impl.huge_view()
    with pytest.raises(BaseException, match="returned too much: a frame of 80000"):
        impl.huge_reply()
    assert impl.big(10).shape == (10,)  # the next call gets a fresh worker


@pytest.mark.timeout(6)
def test_an_endless_loop_times_out():
    with pytest.raises(BaseException, match="timed out after 6 s"):
        impl.forever()


@pytest.mark.timeout(6)
def test_an_endless_loop_times_out_again():
    with pytest.raises(BaseException, match="timed out after 6 s"):
        impl.forever()


def test_a_function_that_timed_out_twice_fails_its_later_calls_at_once():
    with pytest.raises(BaseException, match="timed out 2 times already in this lab"):
        impl.forever()


class Pool(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = impl.BlockPool(8)
        self.held = []

    @rule(n=st.integers(1, 3))
    def allocate(self, n):
        if n <= self.pool.num_free_blocks:
            self.held += self.pool.allocate(n)

    @rule()
    def release(self):
        self.pool.release(self.held)
        self.held = []

    @invariant()
    def blocks_are_conserved(self):
        assert self.pool.num_free_blocks + len(self.held) == 8


TestPoolMachine = Pool.TestCase
TestPoolMachine.settings = settings(max_examples=10, stateful_step_count=10, deadline=None)
'''


def proxy_lab(root: Path) -> Path:
    root.mkdir(parents=True)
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    for package in ("common", "grading"):
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    lab = root / "labs" / "lab-00-proxy"
    lab.mkdir(parents=True)
    for name, text in (("provided.py", PROXY_PROVIDED), ("starter.py", PROXY_STARTER),
                       ("script.py", PROXY_SCRIPT), ("test_lab.py", PROXY_TESTS)):
        (lab / name).write_text(text.lstrip())
    return root


@pytest.fixture(scope="module")
def proxy_runs(tmp_path_factory) -> dict:
    """The proxy lab under plain pytest with the sandbox on, with and without the switch."""
    modes = {"split": "none"}
    if _user_switch_reason() is None:
        modes["switched"] = ""
    procs = {}
    for key, uids in modes.items():
        root = proxy_lab(tmp_path_factory.mktemp(f"proxy-{key}") / "course")
        env = dict(os.environ, COURSE_SANDBOX="1", LAB_IMPL="starter", TRITON_INTERPRET="1",
                   EXPECT_SWITCH="1" if key == "switched" else "0")
        env.pop("COURSE_SANDBOX_ZYGOTE", None)
        env["COURSE_SANDBOX_UIDS"] = uids
        if key == "switched":
            env.pop("COURSE_SANDBOX_UIDS")
        procs[key] = subprocess.Popen(
            [sys.executable, "-m", "pytest", "labs/lab-00-proxy", "-q", "-p", "no:cacheprovider",
             "-p", "grading.plugin.proxy", "-rs"],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return {key: (proc.communicate(timeout=600)[0], proc.returncode)
            for key, proc in procs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["switched", "split"])
def test_the_proxy_carries_arrays_tensors_types_objects_errors_and_scripts(proxy_runs, mode):
    if mode not in proxy_runs:
        pytest.skip(f"the user switch needs root ({_user_switch_reason()})")
    output, code = proxy_runs[mode]
    assert code == 0, output
    assert " passed" in output and "failed" not in output
