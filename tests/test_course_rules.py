"""The course's own rules, checked on every lab that exists (not graded):
every graded test carries points, and grading a starter never imports a solution."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = sorted(p for p in (ROOT / "labs").glob("lab-*") if (p / "test_lab.py").is_file())


def _has_points(decorators: list[ast.expr]) -> bool:
    return any("points" in ast.unparse(d) for d in decorators)


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_lab_calls_the_code_under_test_on_copies(lab):
    """Nothing the graded code touched is trusted: under the grader, what a call writes into
    its arguments is copied back, so a lab's tests reach the code under test only through
    ``impl = called_on_copies(load_impl(__file__))`` (common/testing.py), and an expected
    value computed from an argument after the call is still the test's own."""
    text = (lab / "test_lab.py").read_text()
    assert text.count("load_impl(") == 1 and "called_on_copies(load_impl(__file__)" in text, (
        f"{lab.name}/test_lab.py: write `impl = called_on_copies(load_impl(__file__))` "
        "(writes={...} for a function specified to write into an argument)")


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_graded_test_carries_points(lab):
    tree = ast.parse((lab / "test_lab.py").read_text())
    module_points = any(
        isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
        and "points" in ast.unparse(node.value)
        for node in tree.body
    )
    missing = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and not _has_points(node.decorator_list)
    ]
    assert module_points or not missing, f"{lab.name}: tests without a points marker: {missing}"


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_starter_never_mentions_the_solution(lab):
    source = (lab / "starter.py").read_text()
    for word in ("import solution", "from solution", "solution.py", '"solution"'):
        assert word not in source, f"{lab.name}/starter.py refers to the solution ({word!r})"


@pytest.mark.slow  # whole-tree (grades every lab's starter): make test-slow, which CI runs
def test_grading_starters_never_imports_a_solution_module():
    """Import every lab's tests with LAB_IMPL=starter in a fresh interpreter and list the
    files it loaded: no solution.py may be among them."""
    script = (
        "import importlib.util, json, pathlib, sys\n"
        "for t in sorted(pathlib.Path('labs').glob('lab-*/test_lab.py')):\n"
        "    spec = importlib.util.spec_from_file_location('t_' + t.parent.name, t)\n"
        "    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "files = [getattr(m, '__file__', None) or '' for m in list(sys.modules.values())]\n"
        "print(json.dumps([f for f in files if f.endswith('solution.py')]))\n"
    )
    env = {**os.environ, "LAB_IMPL": "starter", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", "import conftest\n" + script],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"LAB_IMPL=starter imported solution files: {loaded}"


def _fresh_module(lab: pathlib.Path, kind: str):
    """``<lab>/<kind>.py`` imported anew under a private name (never a cached copy)."""
    import importlib.util

    name = f"course_rules_{lab.name.replace('-', '_')}.{kind}"
    spec = importlib.util.spec_from_file_location(name, lab / f"{kind}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _public_api(module, lab: pathlib.Path) -> dict[str, str]:
    """Public name -> signature (or kind) of what a lab module defines or re-exports from its
    own folder (functions, classes, kernels); imports from numpy/torch/common are not API."""
    import inspect

    own = {module.__name__, f"{lab.name.replace('-', '_')}.provided"}
    api: dict[str, str] = {}
    for name, obj in vars(module).items():
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        try:
            target = getattr(obj, "fn", obj)  # a triton.jit kernel wraps its Python function
        except Exception:  # triton's stand-in without triton (common.triton_env): not API
            continue
        if getattr(target, "__module__", "") not in own:
            continue
        if inspect.isclass(obj):
            api[name] = "class"
        elif callable(target):
            try:
                api[name] = str(inspect.signature(target))
            except (TypeError, ValueError):
                api[name] = "callable"
    return api


@pytest.mark.parametrize(
    "lab", [p for p in LABS if (p / "solution.py").is_file()], ids=lambda p: p.name
)
def test_starter_and_solution_expose_the_same_public_names_and_signatures(lab):
    starter = _public_api(_fresh_module(lab, "starter"), lab)
    solution = _public_api(_fresh_module(lab, "solution"), lab)
    assert starter.keys() == solution.keys(), (
        f"{lab.name}: only in starter.py: {sorted(starter.keys() - solution.keys())}; "
        f"only in solution.py: {sorted(solution.keys() - starter.keys())}"
    )
    differ = {n: (starter[n], solution[n]) for n in starter if starter[n] != solution[n]}
    assert not differ, f"{lab.name}: (starter, solution) signatures differ: {differ}"


# What grading an untouched starter reads, besides its own lab folder (a lab's pass is kept
# in CACHE under the hash of these, the lab's files and the versions of the stack).
SHARED_INPUTS = ("common/*.py", "grading/plugin/*.py", "conftest.py", "pyproject.toml",
                 "requirements-cpu.txt")
STACK = ("numpy", "torch", "triton", "pytest", "hypothesis")
CACHE = ROOT / "build" / "test-cache" / "untouched-starter"


def untouched_starter_inputs(lab: pathlib.Path) -> str:
    """sha256 of what grading ``lab``'s untouched starter reads: the lab's files (not its
    solution, figures or README), the shared code above, and Python's and the stack's
    versions."""
    import hashlib
    from importlib import metadata

    digest = hashlib.sha256()
    files = [p for p in sorted(lab.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
             and p.name != "solution.py" and p.suffix not in (".md", ".png")]
    files += [p for pattern in SHARED_INPUTS for p in sorted(ROOT.glob(pattern))]
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    for name in STACK:
        try:
            digest.update(f"{name}=={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent".encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()


@pytest.mark.slow
@pytest.mark.timeout(900)  # every lab's tests in one process: minutes on a loaded machine
@pytest.mark.skipif(not list(ROOT.glob("labs/*/solution.py")),
                    reason="a student copy: its starters are the student's, not untouched ones")
def test_an_untouched_starter_earns_no_points(tmp_path):
    """A test that an untouched starter passes grades given code, not the student's: it must
    be worth points(0). Runs the tests of every lab whose inputs changed since its last pass
    (``untouched_starter_inputs``, kept in ``build/test-cache/``; a fresh clone runs all) on
    the starters, in one pytest process."""
    hashes = {lab: untouched_starter_inputs(lab) for lab in LABS}
    stale = [lab for lab in LABS if not (CACHE / f"{lab.name}.json").is_file() or json.loads(
        (CACHE / f"{lab.name}.json").read_text()).get("inputs") != hashes[lab]]
    if not stale:
        return  # every lab passed with exactly these inputs
    log = tmp_path / "points.jsonl"
    env = dict(os.environ, LAB_IMPL="starter")
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "grading.plugin.points", f"--points-log={log}", "--points-fast-hypothesis",
         # gpu_compile: compiling every starter kernel for sm_90 takes minutes; an untouched
         # starter kernel stops at its tl.static_assert there too (grading/plugin/compile_check.py)
         "-m", "not gpu and not gpu_compile", *[str(lab) for lab in stale]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    events = [json.loads(line) for line in log.read_text().splitlines()]
    points = {t["nodeid"]: t["points"] for e in events if e["event"] == "collected"
              for t in e["tests"]}  # fmt: skip
    free = [f"{e['nodeid']} ({points.get(e['nodeid'])} points)" for e in events
            if e["event"] == "result" and e["outcome"] == "passed" and points.get(e["nodeid"])]
    assert points, "no test was collected"
    for lab in stale:
        collected = any(n.startswith(f"labs/{lab.name}/") for n in points)
        if collected and not any(f.startswith(f"labs/{lab.name}/") for f in free):
            CACHE.mkdir(parents=True, exist_ok=True)
            (CACHE / f"{lab.name}.json").write_text(json.dumps({"inputs": hashes[lab]}))
    assert not free, ("an untouched starter passes these graded tests (mark them points(0), or "
                      "make them exercise the student's code):\n  " + "\n  ".join(free))


def _helpers(lab: pathlib.Path) -> dict[str, str]:
    """A lab test file's module-level helper functions (not tests): name -> source, unparsed
    without its docstring (so formatting and wording do not count)."""
    helpers = {}
    for node in ast.parse((lab / "test_lab.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
            if ast.get_docstring(node):
                node.body = node.body[1:]
            helpers[node.name] = ast.unparse(node)
    return helpers


def test_a_helper_name_means_one_thing_in_every_lab():
    """Two labs' test files may share a helper's name only for the same code: a reader who
    met ``check_triton`` in one lab must not find a different function under that name in
    the next. A helper that differs gets a lab-specific name (``check_forward_kernel``)."""
    seen: dict[str, tuple[str, str]] = {}
    clashes = []
    for lab in LABS:
        for name, source in _helpers(lab).items():
            first = seen.setdefault(name, (lab.name, source))
            if first[1] != source:
                clashes.append(f"{name}: {first[0]} and {lab.name}")
    assert not clashes, "helpers that share a name but differ: " + "; ".join(clashes)
