"""Course rule: the layering of the code, checked on its import graph (read with ``ast``, never
imported).

- ``grading/`` (the grader) has no import cycle, ``TYPE_CHECKING`` imports included;
- no module imports another module's private name (``from m import _x``, ``m._x``);
- nothing in ``common/`` or ``labs/`` imports the grader (``common`` gets the grader's loader
  by registration: ``common.loader.register_impl_loader``);
- a lab never imports another lab;
- each top-level room imports only the rooms below it (``MAY_IMPORT``): ``common`` nothing,
  the labs ``common``, ``bench/`` and ``book/`` the labs and ``common`` (never each other or
  the grader), the grader those and ``bench/`` (the graded compile).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("grading", "common")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of ``path``, parsed once for all these checks (read, never changed)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


MODULES = project_modules()


def _resolve(importer: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(name: str, path: Path) -> tuple[set[str], list[str]]:
    """The project modules ``name`` imports (anywhere in the file), and the private names it
    takes from other modules (``from m import _x`` or ``m._x`` on an imported module)."""
    tree = parsed(path)
    deps: set[str] = set()
    private: list[str] = []
    aliases: dict[str, str] = {}  # local name -> project module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    deps.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, path, node)
            for alias in node.names:
                child = f"{source}.{alias.name}"
                if child in MODULES:
                    deps.add(child)
                    aliases[alias.asname or alias.name] = child
                elif source in MODULES:
                    deps.add(source)
                    if alias.name.startswith("_") and source != name:
                        private.append(f"from {source} import {alias.name}")
    private += private_attributes(tree, aliases, name)
    return deps - {name}, private


def private_attributes(tree: ast.AST, aliases: dict[str, str], name: str) -> list[str]:
    """``m._x`` where ``m`` is another project module this one imported."""
    return [f"{aliases[node.value.id]}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and node.attr.startswith("_")
            and not node.attr.startswith("__") and aliases[node.value.id] != name]


@functools.cache
def import_graph() -> dict[str, tuple[set[str], list[str]]]:
    """``{module: (its project imports, the private names it takes)}``, built once, when a
    test first asks (not while pytest collects, which every worker of ``-n 2`` does)."""
    return {name: imports_of(name, path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_grader_has_no_import_cycle():
    graph = {name: {d for d in deps if d.startswith("grading")}
             for name, (deps, _) in import_graph().items() if name.startswith("grading")}
    # a package's __init__ imported on the way to its modules is no edge of the cycle check
    graph = {name: {d for d in deps if not name.startswith(d + ".")}
             for name, deps in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_imports_another_modules_private_names():
    found = [f"{name}: {what}" for name, (_, private) in import_graph().items() for what in private]
    assert not found, "private names imported across modules (give them public names):\n" + (
        "\n".join(found))


GRADER_MODULE = re.compile(r"grading(\.\w+)*")  # a string naming a module of the grader


def _imports_grading(path: Path) -> list[str]:
    tree = parsed(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "grading"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] == "grading":
                found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if GRADER_MODULE.fullmatch(node.value):  # sys.modules.get("grading.plugin.proxy"),
                found.append(node.value)  # importlib.import_module("grading...")
    return found


def shared_and_lab_files() -> list[Path]:
    files = sorted((ROOT / "common").rglob("*.py")) + sorted((ROOT / "labs").rglob("*.py"))
    return [p for p in files if "__pycache__" not in p.parts]


def test_common_and_the_labs_never_import_the_grader():
    found = [f"{p.relative_to(ROOT)}: {', '.join(names)}"
             for p in shared_and_lab_files() if (names := _imports_grading(p))]
    assert not found, ("common/ and labs/ must not import the grader (common.loader gets the "
                       "grader's loader by registration):\n" + "\n".join(found))


LAB_DIRS = sorted(p for p in (ROOT / "labs").glob("lab-*") if p.is_dir())


@pytest.mark.parametrize("lab", LAB_DIRS, ids=[p.name for p in LAB_DIRS])
def test_a_lab_never_imports_another_lab(lab):
    others = {p.name for p in LAB_DIRS} - {lab.name}
    other_modules = {name.replace("-", "_") for name in others}
    found = []
    for path in sorted(lab.rglob("*.py")):
        tree = parsed(path)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # load_lab_module("../lab-01-.../solution.py", ...): a path into another lab
                names = [n for n in others if f"{n}/" in node.value or f"{n}\\" in node.value]
            for n in names:
                if n.split(".")[0] in other_modules or n in others:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {n}")
    assert not found, "a lab imports another lab (shared code belongs in common/):\n" + (
        "\n".join(found))


def test_common_stays_small():
    """``common/`` holds only what labs share: under 2,950 lines (the grader, single-lab
    helpers and tools live elsewhere; the launch planner with its cost model, which six
    labs' launchers call, is about 790 of them, the kernel-memory instruments about 400,
    the split-KV merge labs 03 and 06 both launch 85, the failure messages that name a
    misconception in several labs' tests about 120, ``call_all``'s batches, whose steps
    may stop at a None or pass an earlier result on, about 60). A helper only one lab uses belongs
    in that lab."""
    lines = sum(len(p.read_text(encoding="utf-8").splitlines())
                for p in (ROOT / "common").glob("*.py"))
    assert lines < 2950, f"common/ has {lines} lines: move what only one lab uses into that lab"


# Who may import whom, by top-level folder (``labs`` is the lab folders and labs/manifest.py).
MAY_IMPORT = {
    "common": set(),
    "labs": {"common"},
    "bench": {"common", "labs"},
    "book": {"common", "labs"},
    "grading": {"common", "labs", "bench"},
}


def _top_level_imports(path: Path) -> set[tuple[str, int]]:
    """``(room, line)`` for every absolute import of another room of MAY_IMPORT in ``path``."""
    found = set()
    for node in ast.walk(parsed(path)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        found |= {(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in MAY_IMPORT}
    return found


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_each_room_imports_only_the_rooms_below_it(room):
    found = [f"{p.relative_to(ROOT)}:{line}: imports {other}"
             for p in sorted((ROOT / room).rglob("*.py")) if "__pycache__" not in p.parts
             for other, line in sorted(_top_level_imports(p))
             if other != room and other not in MAY_IMPORT[room]]
    assert not found, (f"{room}/ may import only {sorted(MAY_IMPORT[room]) or 'nothing'} "
                       "(a fact two rooms need belongs in the lower one):\n" + "\n".join(found))
