"""Course rule (not graded): every Triton lab has the same launcher contract.

Read from the source (no import). A *launcher* is a public function of a lab's
``solution.py`` that launches a ``@triton.jit`` kernel (``kernel[grid](...)``). In every lab:

- the student writes the kernel and its launcher: both are exercises in ``starter.py``
  (``tests/test_starter_sync.py`` checks that their bodies hold no solution logic), or the lab
  gives both, equal to the solution's; the one stated exception is ``GIVEN_LAUNCHERS``;
- tensors are typed ``torch.Tensor`` (never ``Any``), and so is what a launcher returns;
- ``scale``, where a launcher takes one, is keyword-only and the first keyword-only parameter;
- tiles come from one pattern: ``tile_config(t, gpu=provided.<x>gpu_tiles(...),
  interpreter=provided.<X>INTERPRETER_TILES, <tile overrides>)``.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = sorted(p for p in (ROOT / "labs").glob("lab-*") if (p / "solution.py").is_file())
pytestmark = pytest.mark.skipif(
    not LABS, reason="a student copy: no solution.py to read the launchers from")


@functools.cache  # parsed once: collection (CASES) and the tests read the same files
def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _kernels(tree: ast.Module) -> set[str]:
    return {
        node.name for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("jit" in ast.unparse(d) for d in node.decorator_list)
    }


def _launched(fn: ast.FunctionDef) -> set[str]:
    """Names ``k`` of the ``k[grid](...)`` calls in ``fn``."""
    return {
        node.func.value.id for node in ast.walk(fn)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Name)
    }


@functools.cache
def launchers(lab: pathlib.Path) -> dict[str, ast.FunctionDef]:
    tree = _tree(lab / "solution.py")
    kernels = _kernels(tree)
    return {
        node.name: node for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
        and _launched(node) & kernels
    }


# Launchers a lab gives while the student writes their kernel, each with the reason its
# README states: the primer's first puzzle is the mask alone, and its launcher is the model
# every later launcher follows.
GIVEN_LAUNCHERS = {("lab-09-triton-primer", "add_constant")}

CASES = [(lab, name) for lab in LABS for name in launchers(lab)]


def test_the_triton_labs_have_launchers():
    labs = {lab.name[:6] for lab, _ in CASES}
    assert {"lab-00", "lab-01", "lab-03", "lab-04", "lab-05", "lab-06", "lab-09"} <= labs


@pytest.mark.parametrize("lab, name", CASES, ids=[f"{lab.name[:6]}-{n}" for lab, n in CASES])
def test_the_student_writes_the_launcher_and_its_kernels_or_the_lab_gives_both(lab, name):
    starter, solution = _tree(lab / "starter.py"), _tree(lab / "solution.py")
    mine = {n.name: n for n in starter.body if isinstance(n, ast.FunctionDef)}
    theirs = {n.name: n for n in solution.body if isinstance(n, ast.FunctionDef)}
    assert name in mine, f"{lab.name}: the starter does not define the launcher {name}"
    kernels = sorted(_launched(theirs[name]) & _kernels(solution))
    missing = [k for k in kernels if k not in mine]
    assert not missing, f"{lab.name}: {name} launches {missing}, not in the starter"
    given = [n for n in (name, *kernels) if ast.dump(mine[n]) == ast.dump(theirs[n])]
    if (lab.name, name) in GIVEN_LAUNCHERS:
        assert given == [name], f"{lab.name}: {name} is listed as given with its kernel to write"
        return
    assert given in ([], [name, *kernels]), (
        f"{lab.name}: the starter gives {given} of {[name, *kernels]}: the student writes the "
        "launcher and its kernels, or the lab gives both (a worked example)")


def _annotation(arg: ast.arg) -> str:
    return ast.unparse(arg.annotation) if arg.annotation is not None else ""


@pytest.mark.parametrize("lab, name", CASES, ids=[f"{lab.name[:6]}-{n}" for lab, n in CASES])
def test_launcher_types_its_tensors_and_takes_scale_by_keyword(lab, name):
    fn = launchers(lab)[name]
    args = fn.args
    untyped = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
               if "Any" in _annotation(a) or not _annotation(a)]
    assert not untyped, f"{lab.name}: {name} leaves {untyped} untyped or Any"
    returns = ast.unparse(fn.returns) if fn.returns else ""
    assert "Any" not in returns and returns, f"{lab.name}: {name} returns {returns or '?'}"
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    assert "scale" not in positional, (
        f"{lab.name}: {name} takes scale positionally; it is keyword-only, first after *")
    if any(a.arg == "scale" for a in args.kwonlyargs):
        assert args.kwonlyargs[0].arg == "scale", (
            f"{lab.name}: scale must be {name}'s first keyword-only parameter")


@functools.cache
def _tile_config_calls(lab: pathlib.Path) -> list[ast.Call]:
    calls = []
    for file in ("solution.py", "provided.py"):
        if (lab / file).is_file():
            calls += [
                node for node in ast.walk(_tree(lab / file))
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("tile_config")
            ]
    return calls


@pytest.mark.parametrize("lab", [lab for lab in LABS if _tile_config_calls(lab)],
                         ids=lambda lab: lab.name[:6])
def test_tiles_come_from_the_one_pattern(lab):
    for call in _tile_config_calls(lab):
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        gpu, interpreter = keywords.get("gpu", ""), keywords.get("interpreter", "")
        where = f"{lab.name}: {ast.unparse(call)}"
        assert gpu.split("(")[0].endswith("gpu_tiles") and "(" in gpu, (
            f"{where}: gpu= must be a provided <x>gpu_tiles(...) call (the launch plan's)")
        assert interpreter.endswith("INTERPRETER_TILES"), (
            f"{where}: interpreter= must be a provided <X>INTERPRETER_TILES dict")
