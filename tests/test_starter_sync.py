"""Course rule (not graded): every lab's starter.py stays in sync with its solution.py.

Read from the source (no import), so it holds for every lab that exists, labs added later
included:

- every function, class and method the starter defines, the solution defines too, with the
  same signature (annotations and defaults included);
- their docstrings are equal. A member the student writes may carry, in the starter only, a
  trailing section of steps that starts at a line beginning with ``TODO``; the rest of its
  docstring equals the solution's;
- a starter body holds no solution logic: a docstring and then only
  ``raise NotImplementedError(...)``, ``tl.static_assert(False, ...)`` (a kernel) or
  ``pass``; code the starter gives is marked by a comment line starting with ``# Given``
  right above the definition, and equals the solution's code;
- every other top-level statement of the starter (imports apart) appears verbatim in the
  solution (given re-exports and wrappers are the same in both).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAIRS = sorted(
    p for p in (ROOT / "labs").glob("lab-*")
    if (p / "starter.py").is_file() and (p / "solution.py").is_file()
)
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _members(tree: ast.Module) -> dict[str, Definition]:
    """Top-level functions and classes, and methods as ``Class.method``."""
    out: dict[str, Definition] = {}
    for node in tree.body:
        if isinstance(node, Definition):
            out[node.name] = node
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        out[f"{node.name}.{item.name}"] = item
    return out


def _signature(node: Definition) -> str:
    if isinstance(node, ast.ClassDef):
        return "class(" + ", ".join(ast.unparse(b) for b in node.bases) + ")"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"({ast.unparse(node.args)}){returns}"


def _spec(doc: str | None) -> str:
    """A docstring without its trailing ``TODO`` section (the starter's steps)."""
    lines = (doc or "").splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("TODO"):
            lines = lines[:i]
            break
    return "\n".join(lines).rstrip()


def _body(node: Definition) -> list[ast.stmt]:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _is_placeholder(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return ast.unparse(exc) == "NotImplementedError"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        return ast.unparse(call.func).endswith("static_assert") and bool(call.args) \
            and ast.unparse(call.args[0]) == "False"
    return False


def _is_given(node: Definition, lines: list[str]) -> bool:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    above = lines[first - 2].strip() if first >= 2 else ""
    return above.startswith("# Given")


def _load(lab: pathlib.Path, kind: str) -> tuple[ast.Module, list[str]]:
    text = (lab / f"{kind}.py").read_text()
    return ast.parse(text), text.splitlines()


@pytest.mark.parametrize("lab", PAIRS, ids=lambda p: p.name)
def test_the_solution_defines_every_starter_member_with_the_same_signature(lab):
    starter, solution = _members(_load(lab, "starter")[0]), _members(_load(lab, "solution")[0])
    missing = sorted(starter.keys() - solution.keys())
    assert not missing, f"{lab.name}: starter.py defines what solution.py does not: {missing}"
    differ = {n: (_signature(starter[n]), _signature(solution[n])) for n in starter
              if _signature(starter[n]) != _signature(solution[n])}
    assert not differ, f"{lab.name}: (starter, solution) signatures differ: {differ}"
    extra = sorted(n for n in solution.keys() - starter.keys()
                   if not any(part.startswith("_") for part in n.split(".")))
    assert not extra, f"{lab.name}: public names only solution.py defines: {extra}"


@pytest.mark.parametrize("lab", PAIRS, ids=lambda p: p.name)
def test_starter_and_solution_docstrings_are_equal(lab):
    starter, solution = _members(_load(lab, "starter")[0]), _members(_load(lab, "solution")[0])
    differ = []
    for name, node in starter.items():
        if name not in solution:
            continue
        ours, theirs = ast.get_docstring(node, clean=True), ast.get_docstring(solution[name])
        if _spec(ours) != (theirs or "").rstrip():
            differ.append(name)
    assert not differ, (
        f"{lab.name}: the docstrings of {differ} differ between starter.py and solution.py "
        "(the starter may only add a trailing section that starts with a 'TODO' line)"
    )


@pytest.mark.parametrize("lab", PAIRS, ids=lambda p: p.name)
def test_starter_bodies_hold_no_solution_logic(lab):
    tree, lines = _load(lab, "starter")
    solution = _members(_load(lab, "solution")[0])
    logic, drifted = [], []
    for name, node in _members(tree).items():
        if isinstance(node, ast.ClassDef):
            continue  # its methods are checked one by one
        if _is_given(node, lines):
            theirs = solution.get(name)
            if theirs is None or ast.dump(ast.Module(_body(node), [])) != ast.dump(
                ast.Module(_body(theirs), [])
            ):
                drifted.append(name)
            continue
        body = _body(node)
        if not (len(body) == 1 and _is_placeholder(body[0])):
            logic.append(f"{name} (line {node.lineno})")
    assert not logic, (
        f"{lab.name}/starter.py: these bodies hold more than a docstring and "
        f"`raise NotImplementedError(...)`: {logic}. Given code is marked by a '# Given' "
        "comment line right above its definition"
    )
    assert not drifted, f"{lab.name}: given code differs from solution.py's: {drifted}"


@pytest.mark.parametrize("lab", PAIRS, ids=lambda p: p.name)
def test_starter_top_level_statements_are_the_solutions(lab):
    tree, _ = _load(lab, "starter")
    theirs = {ast.unparse(node) for node in _load(lab, "solution")[0].body}
    own = [
        ast.unparse(node).splitlines()[0]
        for node in tree.body[1:]
        if not isinstance(node, ast.Import | ast.ImportFrom | Definition)
        and ast.unparse(node) not in theirs
    ]
    assert not own, f"{lab.name}: top-level statements of starter.py not in solution.py: {own}"
