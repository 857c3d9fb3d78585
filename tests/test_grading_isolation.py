"""Labs share nothing, and memory cannot be hidden: what a sandboxed worker can reach, and
what a forked child's memory, or work done in an arena touched before the call, counts,
probed by planted submissions (not graded).

A lab of a small copy of the course whose ``starter.py`` has a ``probe()``; its test calls
it and reports what it saw. Meanwhile this test process (standing in for another lab, or
anything else on the machine) holds an abstract Unix socket, a TCP port on 127.0.0.1 and a
file in ``/dev/shm``. Graded as root (the user switch), the worker must reach none of them,
nor the internet, nor see this process in ``/proc``; its own loopback still works (a lab's
ranks talk over it), and so does its own ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from grading.sandbox.host import choose_mode

ROOT = Path(__file__).resolve().parents[1]
# whole grading runs on a busy machine: a backstop, not a measurement
pytestmark = pytest.mark.timeout(900)
ABSTRACT = "course-isolation-probe"
SHM_FILE = "course-isolation-probe"

PROBE = f'''
import errno
import os
import socket


def _try(what):
    try:
        what()
        return "reached"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def probe(port, pid):
    """What this process can reach."""
    def abstract():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect("\\0{ABSTRACT}")

    def tcp():
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass

    def internet():
        with socket.create_connection(("1.1.1.1", 53), timeout=5):
            pass

    def own_loopback():
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=5):
                pass

    def own_shm():
        with open("/dev/shm/mine", "w") as f:
            f.write("x")

    return {{"abstract": _try(abstract), "tcp": _try(tcp), "internet": _try(internet),
            "own_loopback": _try(own_loopback), "own_shm": _try(own_shm),
            "shm": sorted(os.listdir("/dev/shm")), "sees_pid": os.path.exists(f"/proc/{{pid}}"),
            "pids": len([p for p in os.listdir("/proc") if p.isdigit()])}}
'''

TESTS = '''
import contextlib
import json

import pytest

from common import load_impl

impl = load_impl(__file__)


@pytest.mark.points(1)
def test_probe():
    port, pid = {port}, {pid}
    pytest.fail("PROBE " + json.dumps(impl.probe(port, pid)))
'''


MEMORY = """
import os
import time


def honest(n):
    \"\"\"Holds n MiB, touched.\"\"\"
    data = b"x" * (n << 20)
    return len(data) >> 20


def forked(n):
    \"\"\"Holds n MiB in a forked child, which the call waits for.\"\"\"
    pid = os.fork()
    if pid == 0:
        data = b"x" * (n << 20)
        time.sleep(0.5)
        os._exit(len(data) & 1)
    os.waitpid(pid, 0)
    return n


def short_fork(n):
    \"\"\"Holds n MiB in a forked child that exits at once (well within 10 ms).\"\"\"
    pid = os.fork()
    if pid == 0:
        data = bytearray(n << 20)
        data[::4096] = b"x" * len(data[::4096])  # every page touched, then gone
        os._exit(0)
    os.waitpid(pid, 0)
    return n


def shm_fork(n):
    \"\"\"Holds n MiB in a file of /dev/shm, written by a fork that removes it and exits: in
    no process's resident memory, ever.\"\"\"
    pid = os.fork()
    if pid == 0:
        path = f"/dev/shm/course-probe-{os.getpid()}"
        with open(path, "wb") as f:
            for _ in range(n):
                f.write(_CHUNK)
        os.unlink(path)
        os._exit(0)
    os.waitpid(pid, 0)
    return n


def idle(n):
    \"\"\"Holds nothing more than the import did.\"\"\"
    return n


_CHUNK = b"y" * (1 << 20)
_LAZY = None


def _fill(arena, n):
    for offset in range(0, n << 20, 1 << 20):  # no temporary: the arena's own pages
        arena[offset:offset + (1 << 20)] = _CHUNK
    return n


_ARENA = bytearray(96 << 20)  # planted: an arena touched at import
_fill(_ARENA, 96)


def arena(n):
    \"\"\"Does its n MiB of work in the arena touched at import.\"\"\"
    return _fill(_ARENA, n)


def warm():
    \"\"\"An unmeasured call that touches an arena for later calls.\"\"\"
    global _LAZY
    _LAZY = bytearray(b"x" * (96 << 20))


def lazy_arena(n):
    \"\"\"Does its n MiB of work in the arena an earlier call touched (if this worker has it).\"\"\"
    return _fill(_LAZY if _LAZY is not None else bytearray(n << 20), n)
"""
MEMORY_TESTS = """
import contextlib
import json

import pytest

from common import load_impl
from common.testing import peak_memory

impl = load_impl(__file__)


@pytest.mark.points(1)
def test_peaks():
    impl.warm()
    peaks = {name: peak_memory(getattr(impl, name), 64)[1]
             for name in ("idle", "honest", "forked", "short_fork", "shm_fork", "arena",
                           "lazy_arena")}
    pytest.fail("PEAKS " + json.dumps(peaks))
"""


def _report(results: dict, marker: str, test: str) -> dict:
    [found] = [t for t in results["tests"] if t["name"].endswith(test)]
    assert marker + " " in found["output"], found["output"]
    return json.loads(found["output"].split(marker + " ", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    if choose_mode()[0].uids is None:
        pytest.skip("needs the user switch (run as root)")
    if not sys.platform.startswith("linux"):
        pytest.skip("namespaces are Linux's")
    root = tmp_path_factory.mktemp("isolation")
    root.chmod(0o755)
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    for package in ("common", "grading"):
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    lab = root / "labs" / "lab-00-probe"
    lab.mkdir(parents=True)
    memory = root / "labs" / "lab-01-memory"
    memory.mkdir(parents=True)
    (memory / "starter.py").write_text(MEMORY)
    (memory / "test_lab.py").write_text(MEMORY_TESTS)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as abstract, socket.socket() as tcp:
        abstract.bind("\0" + ABSTRACT)
        abstract.listen(1)
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(1)
        (lab / "starter.py").write_text(PROBE)
        (lab / "test_lab.py").write_text(textwrap.dedent(TESTS).format(
            port=tcp.getsockname()[1], pid=os.getpid()))
        shm = Path("/dev/shm") / SHM_FILE
        shm.write_text("another lab's hidden input")
        try:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("GRADE_", "COURSE_", "PYTEST_"))}
            proc = subprocess.run(
                [sys.executable, "-m", "grading", "--root", str(root), "--results",
                 str(root / "results.json")], cwd=root, env=dict(env, LAB_IMPL="starter"),
                capture_output=True, text=True, timeout=600)
        finally:
            shm.unlink()
    results = json.loads((root / "results.json").read_text())
    assert len(results["tests"]) == 2, proc.stdout[-3000:]
    return {**_report(results, "PROBE", "test_probe"),
            "peaks": _report(results, "PEAKS", "test_peaks")}


@pytest.mark.slow
def test_a_worker_reaches_no_abstract_socket_no_port_and_no_network(probed):
    assert probed["abstract"] != "reached", "an abstract Unix socket of another namespace"
    assert probed["tcp"] != "reached", "a TCP port on the machine's loopback"
    assert probed["internet"] == "ENETUNREACH", probed["internet"]
    assert probed["own_loopback"] == "reached", "its own loopback must work (a lab's ranks)"


@pytest.mark.slow
def test_a_worker_has_a_dev_shm_and_a_proc_of_its_own(probed):
    assert SHM_FILE not in probed["shm"], "another process's /dev/shm file is visible"
    assert probed["own_shm"] == "reached"
    assert not probed["sees_pid"], "the worker sees the grader's processes in /proc"
    assert probed["pids"] < 5, probed["pids"]


@pytest.mark.slow
def test_memory_a_forked_child_holds_is_counted(probed):
    """The fork attack: the work done in a forked child (which exits before the call
    returns) shows in the peak as the work done in the worker does."""
    honest, forked = probed["peaks"]["honest"], probed["peaks"]["forked"]
    assert honest >= 48 << 20, probed["peaks"]
    assert forked >= 48 << 20, f"the forked child's 64 MiB went unseen: {probed['peaks']}"


@pytest.mark.slow
def test_memory_a_short_fork_or_a_fork_s_dev_shm_file_is_counted(probed):
    """A fork that allocates 64 MiB and exits at once (it can fall between two 10 ms
    samples), and one that holds 64 MiB in a ``/dev/shm`` file it removes before it exits
    (in no process's resident memory, so no sample ever sees it): the measured worker's
    memory cgroup holds the whole tree's peak (skipped where none can be made: there the
    peak is sampled, and the report says so)."""
    from grading.sandbox.host import MemoryCgroup

    if MemoryCgroup.available() is None:
        pytest.skip("no memory cgroup can be made here: a fork's memory is only sampled")
    peaks = probed["peaks"]  # each over the import's own (its 96 MiB arena): ``idle``
    assert peaks["short_fork"] - peaks["idle"] >= 48 << 20, f"a short fork hid 64 MiB: {peaks}"
    assert peaks["shm_fork"] - peaks["idle"] >= 48 << 20, f"/dev/shm hid 64 MiB: {peaks}"
    assert peaks["honest"] - peaks["idle"] < 96 << 20, f"64 MiB counted as much more: {peaks}"
    leftover = [e.name for parent, _ in MemoryCgroup.parents()
                for e in os.scandir(parent) if e.name.startswith("course-grade-")]
    assert not leftover, f"memory cgroups left behind: {leftover}"


@pytest.mark.slow
def test_memory_written_into_an_arena_touched_before_the_call_is_counted(probed):
    """The arena attack: 64 MiB written into an arena touched at import, or by an earlier
    (unmeasured) call, shows in the peak as fresh memory does (the call is measured in a
    fresh worker, from before it imports the submission)."""
    peaks = probed["peaks"]
    assert peaks["arena"] >= 48 << 20, f"the import-time arena hid 64 MiB: {peaks}"
    assert peaks["lazy_arena"] >= 48 << 20, f"an earlier call's arena hid 64 MiB: {peaks}"


def test_every_link_of_a_venv_symlink_chain_under_temp_is_made_again(tmp_path, monkeypatch):
    """``.venv -> /tmp/link -> the venv``: both links lie under a private temp folder, so
    both must be made again inside the sandbox (the second was missed: 708.5 of 1108.5
    points, ``No module named 'triton.experimental'``)."""
    from grading.sandbox import confine

    venv = tmp_path / "venv"
    (venv / "lib" / "site-packages").mkdir(parents=True)
    (tmp_path / "link").symlink_to(venv)
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(tmp_path / "link")
    prefix = str(clone / ".venv")
    monkeypatch.setattr(sys, "prefix", prefix)
    monkeypatch.setattr(sys, "exec_prefix", prefix)
    monkeypatch.setattr(sys, "executable", prefix + "/bin/python")
    monkeypatch.setattr(sys, "path", [prefix + "/lib/site-packages"])
    links = dict(confine._links_under((str(tmp_path),)))
    assert links == {str(clone / ".venv"): str(tmp_path / "link"),
                     str(tmp_path / "link"): str(venv)}, links


def _user_switch_or_skip() -> None:
    if not sys.platform.startswith("linux") or choose_mode()[0].uids is None:
        pytest.skip("no user switch here (not root, or no mount namespaces)")


def test_a_0700_checkout_under_temp_whose_venv_is_a_symlink_keeps_the_user_switch(tmp_path):
    """A clone in a 0700 folder under /tmp, ``.venv -> the venv``: the sandbox makes the link
    again in its private /tmp, so the pre-flight must rehearse that too (it could not read
    numpy through the link and fell back to running the graded code as root)."""
    _user_switch_or_skip()
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running from a venv")
    clone = tmp_path / "clone"
    clone.mkdir(mode=0o700)
    os.chmod(clone, 0o700)
    shutil.copytree(ROOT / "grading", clone / "grading",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (clone / ".venv").symlink_to(os.path.realpath(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_SANDBOX_UIDS", "PYTHONPATH")}
    out = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m",
                          "grading.sandbox.lab_sandbox", "check"], cwd=clone, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("user switch"), out.stdout


def test_the_course_models_behind_a_0700_folder_are_readable_by_the_sandbox_uid():
    """A 0700 checkout outside /tmp is covered by an empty folder in the sandbox: its
    ``models/`` (lab 11's trained model) must be bound back read-only, and nothing else."""
    from grading.sandbox import confine

    _user_switch_or_skip()
    mode, _ = choose_mode()
    uid = mode.uids[0] + 1  # type: ignore[index]
    checkout = tempfile.mkdtemp(prefix="course-0700-", dir="/dev/shm")  # not a private temp
    try:
        os.chmod(checkout, 0o700)
        models = os.path.join(checkout, "models", "adder")
        os.makedirs(models, mode=0o755)
        with open(os.path.join(models, "config.json"), "w") as f:
            f.write("{}")
        os.chmod(os.path.join(checkout, "models"), 0o755)
        with open(os.path.join(checkout, "secret.txt"), "w") as f:
            f.write("tests")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - in the child
            code = 1
            try:
                os.environ["COURSE_MODELS_DIR"] = os.path.join(checkout, "models")
                confine.confine_files(None)
                confine.drop_privileges(uid, uid)
                with open(os.path.join(models, "config.json")) as f:
                    code = 0 if f.read() == "{}" else 2
                if os.path.exists(os.path.join(checkout, "secret.txt")):
                    code = 3
                with contextlib.suppress(OSError):
                    open(os.path.join(models, "new"), "w").close()
                    code = 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        assert code == 0, {1: "models/ unreadable by the sandbox uid", 2: "wrong file",
                           3: "the rest of the checkout is visible",
                           4: "models/ is writable"}.get(code, code)
    finally:
        shutil.rmtree(checkout, ignore_errors=True)


def test_every_process_of_a_lab_gets_the_private_temp_not_only_the_first():
    """The first sandboxed process leaves, in the lab's /tmp, the empty folder it mounted the
    scratch copy back on; the next one must mount it again, not take that folder for it
    (it found no ``tmp`` there and fell back to the machine's shared /tmp)."""
    from grading.sandbox import confine

    _user_switch_or_skip()
    scratch = tempfile.mkdtemp(prefix="course-sandbox-test-")
    try:
        os.mkdir(os.path.join(scratch, "tmp"))
        for attempt in range(2):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - in the child
                code = 1
                try:
                    ok = confine.private_temp(os.path.join(scratch, "tmp"))
                    code = 0 if ok and os.path.samefile("/tmp", os.path.join(scratch, "tmp")) \
                        else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, f"process {attempt + 1}: shared /tmp"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
