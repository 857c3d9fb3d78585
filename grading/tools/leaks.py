"""Solution code, recognised as code: what the student copy must not contain.

A solution is identified by the bodies of its functions, compared as syntax trees (no
comments, docstrings, formatting or line numbers), and by every statement inside them that
is big enough to mean something (a loop, a long formula). Lines such as ``except
ValueError as e:``, ``return out, lse`` or a shape check are too generic to identify
anything: a body counts from ``BODY_NODES`` syntax-tree nodes, a statement from
``STATEMENT_NODES``.

Given code is public: a unit that appears in any lab's ``starter.py`` or ``provided.py``
(the code starter and solution share by design) is never a leak.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# Syntax-tree nodes (ast.walk) a function body or a statement needs to identify a solution:
# `return out, lse` has 7, `m_new = np.maximum(m, s.max(axis=-1))` 17, the usual
# `scale = 1.0 / math.sqrt(d) if scale is None else float(scale)` 21; a three-line body
# that computes something is about 30, a loop over the K/V blocks well over 40.
BODY_NODES = 25
STATEMENT_NODES = 40
GIVEN_FILES = ("starter.py", "provided.py")
FENCED_PYTHON = re.compile(r"^```(?:python|py)\s*\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Unit:
    """One function body or statement: its normalised code and where it is."""

    code: str  # ast.dump of the node(s): names and constants kept, positions dropped
    label: str  # "merge() (line 42)" / "a statement of merge() (line 45)" / "line 45"
    body: bool = False  # a whole function body (not one statement)
    size: int = 0  # its syntax-tree nodes: two units of equal code have equal sizes


def _sizes(tree: ast.AST) -> dict[int, int]:
    """The number of nodes under each node (itself included), in one pass."""
    sizes: dict[int, int] = {}
    for node in reversed(list(ast.walk(tree))):  # children before their parents
        sizes[id(node)] = 1 + sum(sizes[id(c)] for c in ast.iter_child_nodes(node))
    return sizes


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _dump(nodes: list[ast.stmt]) -> str:
    return ast.dump(ast.Module(body=nodes, type_ignores=[]), annotate_fields=False)


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def function_units(source: str) -> list[Unit]:
    """The identifying units of ``source``'s functions: each body and each big statement."""
    tree = _parse(source)
    if tree is None:
        return []
    sizes = _sizes(tree)
    units: list[Unit] = []
    for fn in _functions(tree):
        body = _without_docstring(fn.body)
        size = sum(sizes[id(s)] for s in body)
        if size >= BODY_NODES:
            units.append(Unit(_dump(body), f"{fn.name}() (line {fn.lineno})", True, size))
        for node in (n for s in body for n in ast.walk(s)):
            if isinstance(node, ast.stmt) and sizes[id(node)] >= STATEMENT_NODES:
                label = f"a statement of {fn.name}() (line {node.lineno})"
                units.append(Unit(_dump([node]), label, size=sizes[id(node)]))
    return units


def all_units(source: str, only: Collection[int] | None = None) -> list[Unit]:
    """Every function body and every big statement of ``source`` (where a leak could sit).

    ``only``: just the units of these sizes (those that can equal a solution's), which
    spares dumping the rest: most of the cost of scanning a big file.
    """
    tree = _parse(source)
    if tree is None:
        return []
    sizes = _sizes(tree)
    units = []
    for fn in _functions(tree):
        body = _without_docstring(fn.body)
        size = sum(sizes[id(s)] for s in body)
        if only is None or size in only:
            units.append(Unit(_dump(body), f"{fn.name}() (line {fn.lineno})", True, size))
    for node in ast.walk(tree):
        size = sizes[id(node)]
        big = isinstance(node, ast.stmt) and size >= STATEMENT_NODES
        if big and (only is None or size in only):
            units.append(Unit(_dump([node]), f"line {node.lineno}", size=size))
    return units


def markdown_units(text: str, only: Collection[int] | None = None) -> list[Unit]:
    """The units of the Python code blocks of a Markdown document (``only``: as all_units)."""
    return [u for block in FENCED_PYTHON.findall(text) for u in all_units(block, only)]


def found_in(units: list[Unit], secret: dict[str, str]) -> list[tuple[str, str]]:
    """(where in the file, which part of the solution) for each unit that is solution code."""
    hits: dict[str, str] = {}
    for unit in units:
        if unit.code in secret:
            hits.setdefault(secret[unit.code], unit.label)
    return sorted((where, what) for what, where in hits.items())


def solved_share(starter: list[Unit], solution: list[Unit]) -> float:
    """The share of a solution's function bodies that a starter holds verbatim (as code)."""
    bodies = [u for u in solution if u.body]
    if len(bodies) < 2:
        return 0.0
    theirs = {u.code for u in starter}
    return sum(u.code in theirs for u in bodies) / len(bodies)


class LeakFinder:
    """The solutions of a project and where its other files hold their code.

    ``solutions``: the solution files (relative paths); ``files``: every file of the project.
    """

    def __init__(self, root: Path, files: list[Path], solutions: list[Path]) -> None:
        self.root = root
        self._units: dict[Path, list[Unit]] = {}
        theirs = {sol: function_units(_read(root / sol)) for sol in solutions}
        # Only a unit of a solution unit's size can hold its code: the others are not dumped.
        self._sizes = {u.size for units in theirs.values() for u in units}
        given = self._given([rel for rel in files if rel.name in GIVEN_FILES])
        self.secret: dict[Path, dict[str, str]] = {}
        self.of_lab: dict[Path, dict[str, str]] = {}  # minus only its own lab's given code
        for sol, mine in theirs.items():
            own = self._given([rel for rel in files if rel.parent == sol.parent])
            self.secret[sol] = {u.code: u.label for u in mine if u.code not in given}
            self.of_lab[sol] = {u.code: u.label for u in mine if u.code not in own}

    def units(self, rel: Path) -> list[Unit]:
        if rel not in self._units:
            text = _read(self.root / rel) if rel.suffix in (".py", ".md") else ""
            scan = markdown_units if rel.suffix == ".md" else all_units
            self._units[rel] = scan(text, self._sizes)
        return self._units[rel]

    def _given(self, files: list[Path]) -> set[str]:
        return {u.code for rel in files if rel.name in GIVEN_FILES for u in self.units(rel)}

    def found(self, rel: Path) -> list[str]:
        """One text per solution whose code ``rel`` holds.

        A starter is compared with the other labs' solutions (minus their own given code);
        any other file with every solution (minus all given code).
        """
        units = self.units(rel)
        starter = rel.name == "starter.py"
        found = []
        for sol in self.secret if units else ():
            if starter and sol.parent == rel.parent:
                continue  # its own solution: solved_starters' business
            hits = found_in(units, self.of_lab[sol] if starter else self.secret[sol])
            if hits:
                shown = [f"at {where}: {sol.name}'s {what}" for where, what in hits[:3]]
                shown += [f"(and {len(hits) - 3} more)"] if len(hits) > 3 else []
                found.append(f"{rel} holds code of {sol}:\n      " + "\n      ".join(shown))
        return found

    def solved_starters(self, threshold: float) -> list[str]:
        """Starters that hold ``threshold`` of their solution's bodies: solved or mutated."""
        problems = []
        for sol in self.secret:
            starter = sol.parent / "starter.py"
            if not (self.root / starter).is_file():
                continue
            share = solved_share(self.units(starter), function_units(_read(self.root / sol)))
            if share >= threshold:
                problems.append(
                    f"{starter} holds {share:.0%} of the function bodies of {sol}: a solved (or "
                    "mutated) copy of the solution? Restore the real starter first"
                )
        return problems


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")
