"""Counting a lab's points when its tests cannot be imported (a starter with a syntax error).

First its tests are collected again with ``load_impl`` answering a stub
(``--points-stub-impl``: nothing of the lab's code is imported); if that fails too, they
are read from the source of the test files (an approximation the report marks as such).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from common.grading.discovery import graded_files
from common.grading.runner import Options, run_pytest

STUB_COLLECT_TIMEOUT = 60.0

Marks = list[tuple[str, list[ast.expr]]]


def count_tests(lab: Path, opts: Options) -> tuple[list[dict], str]:
    """The lab's tests and points without running (or importing) the graded code."""
    run = run_pytest(lab, opts, STUB_COLLECT_TIMEOUT, ["--collect-only", "--points-stub-impl"])
    if run.collected and not run.of("collect_error"):
        return run.collected, "stub collection"
    tests = [t for f in graded_files(lab) for t in static_tests(f)]
    return tests, "static scan of the test files (approximate)"


def _mark(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """``pytest.mark.NAME(args)`` / ``mark.NAME`` -> (NAME, args)."""
    args: list[ast.expr] = []
    if isinstance(node, ast.Call):
        args, node = list(node.args), node.func
    if isinstance(node, ast.Attribute):
        base = node.value
        if (isinstance(base, ast.Attribute) and base.attr == "mark") or (
            isinstance(base, ast.Name) and base.id == "mark"
        ):
            return node.attr, args
    return None


def _marks(exprs: list[ast.expr]) -> Marks:
    out = []
    for e in exprs:
        items = e.elts if isinstance(e, ast.List | ast.Tuple) else [e]
        out += [m for m in map(_mark, items) if m is not None]
    return out


def _pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
    return [
        node.value
        for node in body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]


@lru_cache(maxsize=1)
def _has_cuda() -> bool:
    from common.device import has_cuda

    return has_cuda()


def _is_test(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def _cases(marks: Marks) -> int:
    """How many tests a literal ``parametrize`` list makes (1 if none, or not literal)."""
    cases = 1
    for name, args in marks:
        if name == "parametrize" and len(args) >= 2 and isinstance(args[1], ast.List | ast.Tuple):
            cases *= max(len(args[1].elts), 1)
    return cases


@lru_cache(maxsize=1)
def _triton_missing() -> str | None:
    """conftest.py's reason for skipping ``triton`` tests here, or None if triton imports."""
    from common.triton_env import HAVE_TRITON, TRITON_MISSING

    return None if HAVE_TRITON else f"not run: {TRITON_MISSING}"


def _skip_reason(marks: Marks) -> str | None:
    if any(name == "gpu" for name, _ in marks) and not _has_cuda():
        return "needs a CUDA GPU (gpu marker)"
    if any(name == "triton" for name, _ in marks):
        return _triton_missing()
    return None


def _entries(node: ast.FunctionDef, rel: str, prefix: str, outer: Marks) -> list[dict]:
    marks = _marks(node.decorator_list) + outer  # closest first, like get_closest_marker
    points = next((m[1] for m in marks if m[0] == "points" and m[1]), None)
    value = points[0].value if points and isinstance(points[0], ast.Constant) else 1
    cases = _cases(marks)
    skip = _skip_reason(marks)
    entries = []
    for i in range(cases):
        name = node.name + (f"[{i}]" if cases > 1 else "")
        entries.append(
            {"nodeid": f"{rel}::{prefix}{name}", "name": name, "points": float(value), "skip": skip}
        )
    return entries


def static_tests(test_file: Path) -> list[dict]:
    """Tests and points read from the source of ``test_file`` (no import).

    Understands ``@pytest.mark.points(n)`` (also on a class or in ``pytestmark``), ``gpu``
    (not counted without CUDA), ``triton`` (not run without triton) and ``parametrize``
    with a literal list of cases (each case is a test). Not understood, so counted as one
    test: parametrize over a computed list, ``pytest_generate_tests``, tests imported from
    elsewhere.
    """
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return []
    rel = f"{test_file.parent.parent.name}/{test_file.parent.name}/{test_file.name}"
    tests: list[dict] = []
    module_marks = _marks(_pytestmark(tree.body))
    for node in tree.body:
        if _is_test(node):
            tests += _entries(node, rel, "", module_marks)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            class_marks = _marks(node.decorator_list) + _marks(_pytestmark(node.body))
            for sub in filter(_is_test, node.body):
                tests += _entries(sub, rel, f"{node.name}::", class_marks + module_marks)
    return tests
