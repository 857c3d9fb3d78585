"""The set-up works on every supported laptop, not only on this machine.

Offline checks (they run with the suite): the pins and their markers, the ranges in
pyproject.toml, the Makefile's set-up lines, the dev container, and no Python beyond 3.10
anywhere in the code. The resolution of the pins against PyPI for every laptop and Python
(``setup`` marker: network, a few minutes) runs with ``make check-setup``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.tree import course_files

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli there
    import tomli as tomllib

from packaging.requirements import Requirement

from tools import check_setup

ROOT = Path(__file__).resolve().parent.parent

REQUIREMENTS = ROOT / "requirements-cpu.txt"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

needs_network = pytest.mark.skipif(
    os.environ.get("CHECK_SETUP") != "1",
    reason="resolves the pins against PyPI (network, minutes): run `make check-setup`",
)


def requirement_lines() -> list[str]:
    lines = REQUIREMENTS.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def pins() -> dict[str, Requirement]:
    return {Requirement(ln).name.lower(): Requirement(ln) for ln in requirement_lines()}


def marker_env(platform: str, machine: str, python: str = "3.11") -> dict[str, str]:
    system = {"linux": "Linux", "darwin": "Darwin", "win32": "Windows"}[platform]
    return {
        "sys_platform": platform,
        "platform_system": system,
        "platform_machine": machine,
        "os_name": "nt" if platform == "win32" else "posix",
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


# (sys_platform, platform_machine) -> does triton install there?
TRITON_WHERE = {
    ("linux", "x86_64"): True,
    ("linux", "aarch64"): True,  # also Docker / the dev container on Apple silicon
    ("linux", "ppc64le"): False,
    ("darwin", "arm64"): False,
    ("darwin", "x86_64"): False,  # Intel Macs
    ("win32", "AMD64"): False,
    ("win32", "ARM64"): False,
}


# ---- the pins ------------------------------------------------------------------------------


def test_every_requirement_is_an_exact_pin():
    for path in check_setup.REQUIREMENTS_FILES:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            specs = list(Requirement(line).specifier)
            assert len(specs) == 1 and specs[0].operator == "==", (
                f"{path.name}: {line!r} is not an exact pin"
            )


def makefile_requirements() -> set[str]:
    """The requirements files the Makefile installs (`pip install ... -r <file>`)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"-r (requirements[\w.-]*\.txt)", makefile))


def test_make_check_setup_resolves_every_requirements_file_the_makefile_installs():
    """A new requirements file must join tools/check_setup.py's REQUIREMENTS_FILES, so that
    `make check-setup` resolves it with the others for every laptop and Python."""
    checked = {p.name for p in check_setup.REQUIREMENTS_FILES}
    present = {p.name for p in ROOT.glob("requirements*.txt")}
    assert present <= checked, (
        f"{sorted(present - checked)} exist but `make check-setup` does not resolve them: add "
        "them to REQUIREMENTS_FILES in tools/check_setup.py"
    )
    installed = makefile_requirements()
    assert installed <= checked, (
        f"the Makefile installs {sorted(installed - checked)}, which `make check-setup` does "
        "not resolve: add them to REQUIREMENTS_FILES in tools/check_setup.py"
    )
    assert checked <= present, f"REQUIREMENTS_FILES names missing files: {checked - present}"


def test_the_requirements_file_check_sees_a_new_file(tmp_path, monkeypatch):
    """The check above fails for a requirements file that is not in the list."""
    for path in check_setup.REQUIREMENTS_FILES:
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "requirements-serving.txt").write_text("transformers==5.19.0\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(
        check_setup, "REQUIREMENTS_FILES", tuple(tmp_path / p.name for p in
                                                  check_setup.REQUIREMENTS_FILES)
    )
    with pytest.raises(AssertionError, match="requirements-serving.txt"):
        test_make_check_setup_resolves_every_requirements_file_the_makefile_installs()


def test_the_torch_line_is_the_bare_pin_the_autograder_greps():
    """grading/tools/autograder.py's setup.sh installs `grep -E '^torch==' ...` from the
    PyTorch CPU index: that line must be one bare, valid requirement."""
    torch_lines = [ln for ln in REQUIREMENTS.read_text().splitlines() if re.match(r"^torch==", ln)]
    assert len(torch_lines) == 1
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", torch_lines[0]), torch_lines[0]


@pytest.mark.parametrize("where", sorted(TRITON_WHERE), ids=lambda w: "-".join(w))
def test_triton_is_required_exactly_where_it_has_wheels(where):
    want = TRITON_WHERE[where]
    env = marker_env(*where)
    pinned = pins()["triton"]
    assert pinned.marker is not None and pinned.marker.evaluate(env) is want
    ranged = [Requirement(d) for d in PYPROJECT["project"]["dependencies"]]
    (triton,) = [r for r in ranged if r.name == "triton"]
    assert triton.marker is not None and triton.marker.evaluate(env) is want


def test_the_pyproject_ranges_admit_every_pin():
    ranged = {
        Requirement(d).name.lower(): Requirement(d) for d in PYPROJECT["project"]["dependencies"]
    }
    for name, pin in pins().items():
        version = next(iter(pin.specifier)).version
        if name in ranged:
            assert ranged[name].specifier.contains(version), (
                f"{name} {ranged[name].specifier} does not admit the pinned {version}"
            )


def test_requires_python_admits_exactly_the_supported_pythons_of_the_matrix():
    requires = PYPROJECT["project"]["requires-python"]
    low, high = check_setup.PYTHONS[0], check_setup.PYTHONS[-1]
    major, minor = (int(x) for x in high.split("."))
    assert requires == f">={low},<{major}.{minor + 1}", (
        f"requires-python {requires!r} must admit exactly the Pythons the pins have wheels for "
        f"({low} to {high})"
    )
    classified = [
        c.rsplit(" ", 1)[-1]
        for c in PYPROJECT["project"]["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    ]
    assert classified == list(check_setup.PYTHONS)


# ---- the Makefile and the dev container ----------------------------------------------------


def make_dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "setup", "VENV=/nonexistent-venv", "PYTHON=python3", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_setup_installs_wheels_only_from_the_default_index():
    plan = make_dry_run()
    assert "--only-binary=:all:" in plan and "-r requirements-cpu.txt" in plan
    assert "--index-url" not in plan


def test_make_setup_takes_torch_from_the_index_it_is_given():
    plan = make_dry_run(f"TORCH_INDEX={CPU_INDEX}")
    assert f"--index-url {CPU_INDEX} torch==" in plan
    torch_first = plan.index(f"--index-url {CPU_INDEX}")
    assert torch_first < plan.index("-r requirements-cpu.txt"), "torch must come first"


def test_make_setup_refuses_a_python_outside_3_10_to_3_13():
    plan = make_dry_run()
    assert "sys.version_info[:2] <= (3, 13)" in plan and "(3, 10) <=" in plan


def test_the_dev_container_is_a_linux_python_that_runs_make_setup():
    config = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())
    version = re.search(r"python:(?:\d-)?(3\.\d+)", config["image"])
    assert version and version.group(1) in check_setup.PYTHONS, config["image"]
    assert "make setup" in config["postCreateCommand"]


# ---- Python 3.10 ---------------------------------------------------------------------------

# Standard-library names that appeared after Python 3.10 (module -> names; None: the module).
NEWER_THAN_310: dict[str, set[str] | None] = {
    "tomllib": None,
    "typing": {
        "Self",
        "Never",
        "LiteralString",
        "assert_never",
        "assert_type",
        "reveal_type",
        "Required",
        "NotRequired",
        "TypeVarTuple",
        "Unpack",
        "dataclass_transform",
        "override",
        "TypeAliasType",
        "get_overloads",
        "clear_overloads",
        "ReadOnly",
        "TypeIs",
        "get_protocol_members",
        "is_protocol",
    },
    "math": {"exp2", "cbrt", "sumprod", "fma"},
    "enum": {
        "StrEnum",
        "ReprEnum",
        "EnumCheck",
        "FlagBoundary",
        "verify",
        "member",
        "nonmember",
        "global_enum",
        "show_flag_values",
    },
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"},
    "contextlib": {"chdir"},
    "datetime": {"UTC"},
    "hashlib": {"file_digest"},
    "itertools": {"batched"},
    "operator": {"call"},
    "logging": {"getLevelNamesMapping"},
    "inspect": {"getmembers_static", "markcoroutinefunction"},
    "re": {"NOFLAG"},
    "sys": {"exception", "monitoring", "activate_stack_trampoline"},
    "warnings": {"deprecated"},
    "copy": {"replace"},
}
NEWER_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}


def python_files() -> list[Path]:
    return course_files(ROOT, ".py")


def guarded_imports(tree: ast.AST) -> set[ast.AST]:
    """Imports in a ``try`` whose handler catches the ImportError of an older Python."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            guarded |= {n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    return guarded


def newer_than_310(tree: ast.AST) -> list[str]:
    aliases: dict[str, str] = {}
    found = []
    guarded = guarded_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name
                if (
                    a.name in NEWER_THAN_310
                    and NEWER_THAN_310[a.name] is None
                    and node not in guarded
                ):
                    found.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module in NEWER_THAN_310:
            names = NEWER_THAN_310[node.module]
            for a in node.names:
                if names is None or a.name in names:
                    found.append(f"line {node.lineno}: from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module in NEWER_THAN_310 and node.attr in (NEWER_THAN_310[module] or ()):
                found.append(f"line {node.lineno}: {module}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            found.append(f"line {node.lineno}: {node.id}")
    return found


@pytest.mark.slow  # whole-tree (parses every .py, 3 s): make test-slow, which CI runs
def test_no_code_needs_more_than_python_3_10():
    """Syntax (except*, type statements, generic classes...) and standard-library names
    added in 3.11+ (tomllib, typing.Self, math.exp2, ExceptionGroup...)."""
    problems = []
    for path in python_files():
        rel = path.relative_to(ROOT)
        source = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(source, filename=str(rel), feature_version=(3, 10))
        except SyntaxError as e:
            problems.append(f"{rel}:{e.lineno}: {e.msg}")
            continue
        problems += [f"{rel}: {p}" for p in newer_than_310(tree)]
    assert not problems, "needs Python > 3.10:\n" + "\n".join(problems)


def test_the_3_10_check_catches_what_it_is_meant_to():
    source = (
        "import tomllib\nfrom typing import Self\nimport math as m\nm.exp2(1)\nExceptionGroup\n"
    )
    assert len(newer_than_310(ast.parse(source))) == 4
    guarded = "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n"
    assert newer_than_310(ast.parse(guarded)) == []
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))


# ---- the resolution against PyPI (make check-setup) ----------------------------------------


@pytest.mark.setup
@pytest.mark.timeout(1800)
@needs_network
def test_the_pins_resolve_on_pypi_for_every_laptop_and_python():
    """`uv pip compile --only-binary :all: --python-platform ... --python-version ...` of
    every requirements file the Makefile installs (cpu, book, check: together, as they share
    .venv) for Linux x86-64/aarch64, macOS arm64 and Windows amd64 x Python 3.10-3.13
    (3.11 is 3.11.0): every pin of every file resolves as pinned, triton only on Linux."""
    results = check_setup.run_matrix(list(check_setup.TARGETS.values()), list(check_setup.PYTHONS))
    table = check_setup.table(results)
    print("\n" + table)
    assert len(results) == 16 and all(r.ok for r in results), table
    for r in results:
        assert r.installs["torch"] == "2.13.0"
        assert {"mkdocs-material", "playwright", "uv", "transformers"} <= set(r.installs), table
        assert ("triton" in r.installs) is check_setup.TARGETS[r.target].triton, table
        if r.target == "windows-amd64":  # the target's markers reached pip:
            assert not [n for n in r.installs if n.startswith(("nvidia-", "cuda-"))]
            assert "colorama" in r.installs  # pytest's `sys_platform == "win32"` dependency
