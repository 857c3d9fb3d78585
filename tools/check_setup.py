"""Resolve the pinned requirements for every supported laptop, against the public index.

    python tools/check_setup.py                       # the whole matrix (make check-setup)
    python tools/check_setup.py --target macos-arm64 --python 3.12 --list

For each target (Linux x86-64 and aarch64, macOS arm64, Windows amd64) and each Python
(3.10-3.13) this runs

    pip install --isolated --dry-run --ignore-installed --only-binary=:all: \\
        --platform <the target's wheel tags> --python-version <3.x> --report - \\
        --target <an empty scratch dir> -r requirements-cpu.txt

``--isolated`` ignores this machine's pip configuration (local wheels, extra indexes,
constraints), so it sees what a student's laptop sees: PyPI and nothing else.

One thing pip does not do for us: ``--platform`` selects wheel tags but environment markers
(``platform_system == "Linux"`` in torch's own dependencies, our triton marker) are still
evaluated against the machine running pip. So pip runs here with its marker environment
set to the target's (``sys_platform``, ``platform_system``, ``platform_machine``,
``os_name``, ``python_version``); without that, a "Windows" resolution would still pull
torch's Linux-only CUDA packages and triton.

For Linux targets pip runs with ``--use-feature=fast-deps``: it reads each wheel's metadata
with HTTP range requests instead of downloading it, where the index serves no PEP 658
metadata files (torch's Linux wheels pull about 2.8 GB of CUDA libraries). The macOS and
Windows sets (under 200 MB) are quicker to download whole than to read piecewise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
import venv
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - pip always vendors it
    from pip._vendor.packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-cpu.txt"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
INDEX_JSON = "https://pypi.org/simple/{name}/"


def _manylinux(arch: str) -> list[str]:
    """Wheel tags a glibc-2.28 Linux (torch 2.13's floor) accepts, newest first."""
    return [f"manylinux_2_{minor}_{arch}" for minor in range(28, 16, -1)] + [
        f"manylinux2014_{arch}"  # pip adds manylinux2010/manylinux1 where they exist
    ]


@dataclass(frozen=True)
class Target:
    """A laptop: the wheel tags it accepts and the marker environment it evaluates."""

    name: str
    platforms: tuple[str, ...]
    markers: dict[str, str] = field(hash=False)
    triton: bool  # does the project want triton there?


TARGETS = {
    t.name: t
    for t in (
        Target(
            "linux-x86_64",
            tuple(_manylinux("x86_64")),
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
            tuple(_manylinux("aarch64")),
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
            ("macosx_14_0_arm64",),  # torch 2.13 wheels need macOS 14; pip adds 11.0-13.x
            {
                "sys_platform": "darwin",
                "platform_system": "Darwin",
                "platform_machine": "arm64",
                "os_name": "posix",
            },
            triton=False,
        ),
        Target(
            "windows-amd64",
            ("win_amd64",),
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

# Runs pip with the marker environment of the target (see the module docstring).
PIP_WITH_TARGET_MARKERS = """
import json, sys
import pip._vendor.packaging.markers as markers
target = json.loads(sys.argv[1])
host = markers.default_environment
def target_environment():
    env = dict(host())
    env.update(target)
    return env
markers.default_environment = target_environment
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@dataclass
class Resolution:
    target: str
    python: str
    ok: bool
    installs: dict[str, str] = field(default_factory=dict)  # name -> version
    urls: dict[str, str] = field(default_factory=dict)  # name -> wheel url
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


def pip_command(
    target: Target, python: str, requirements: Path, fast_deps: bool, scratch: str
) -> list[str]:
    """``scratch``: an empty directory for ``--target`` (pip < 23.3 wants one with
    ``--platform`` even in a dry run; nothing is written there)."""
    cmd = [
        "install",
        "--isolated",
        "--dry-run",
        "--ignore-installed",
        "--target",
        scratch,
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--report",
        "-",
        "--python-version",
        python,
        "--implementation",
        "cp",
    ]
    for platform in target.platforms:
        cmd += ["--platform", platform]
    if fast_deps:
        cmd += ["--use-feature=fast-deps"]
    return [*cmd, "-r", str(requirements)]


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


def resolve(
    target: Target,
    python: str,
    requirements: Path = REQUIREMENTS,
    pip_python: str = sys.executable,
    fast_deps: bool | None = None,
) -> Resolution:
    """One dry-run resolution; checks the pins and the triton rule on the result."""
    if fast_deps is None:
        fast_deps = target.markers["sys_platform"] == "linux"
    env_json = json.dumps(marker_environment(target, python))
    with tempfile.TemporaryDirectory(prefix="check-setup-") as scratch:
        args = pip_command(target, python, requirements, fast_deps, scratch)
        cmd = [pip_python, "-c", PIP_WITH_TARGET_MARKERS, env_json, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0 and fast_deps and "invalid choice" in done.stderr:
        # a pip that dropped the feature: fall back to whole-wheel downloads
        return resolve(target, python, requirements, pip_python, fast_deps=False)
    res = Resolution(target.name, python, ok=done.returncode == 0, log=done.stderr)
    if not res.ok:
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")]
        res.problems.append("; ".join(errors[-2:]) or done.stderr[-500:])
        return res
    report = json.loads(done.stdout)
    for item in report["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        res.installs[name] = item["metadata"]["version"]
        res.urls[name] = item.get("download_info", {}).get("url", "")
    for name, version in pinned(requirements, target, python).items():
        if res.installs.get(name) != version:
            res.problems.append(f"{name}=={version} pinned, resolved {res.version(name)}")
    if ("triton" in res.installs) != target.triton:
        res.problems.append(
            f"triton {'missing' if target.triton else 'pulled in'} on {target.name}"
        )
    res.ok = not res.problems
    return res


def download_bytes(res: Resolution) -> int:
    """Sum of the wheel sizes the resolution would download (from the index's JSON API)."""
    total = 0
    for name, url in res.urls.items():
        request = urllib.request.Request(
            INDEX_JSON.format(name=name), headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
        total += next((f.get("size") or 0 for f in files if f["url"] == url), 0)
    return total


PIP_VERSION = "26.3"  # resolves the matrix about 4x faster than pip 23 (ensurepip of 3.11)


def pip_venv(directory: Path, base_python: str = sys.executable) -> str:
    """A venv with a recent pip to run the resolutions (the pip, not the Python, matters);
    returns its python. Built once per run, from PyPI, ignoring this machine's pip config."""
    venv.EnvBuilder(with_pip=True).create(directory)
    python = str(directory / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--quiet",
            "--disable-pip-version-check",
            f"pip=={PIP_VERSION}",
        ],
        check=True,
    )
    return python


def run_matrix(
    targets: list[Target],
    pythons: list[str],
    jobs: int = 8,
    requirements: Path = REQUIREMENTS,
    pip_python: str | None = None,
) -> list[Resolution]:
    """Every (target, python) resolution, ``jobs`` at once; with a fresh pip unless
    ``pip_python`` (a Python whose pip to use) is given."""
    cases = [(t, p) for t in targets for p in pythons]
    with tempfile.TemporaryDirectory(prefix="check-setup-pip-") as tmp:
        pip = pip_python or pip_venv(Path(tmp) / "venv")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(
                pool.map(lambda c: resolve(*c, requirements=requirements, pip_python=pip), cases)
            )


def table(results: list[Resolution], sizes: dict[tuple[str, str], int] | None = None) -> str:
    head = f"{'target':<15}{'python':<8}{'result':<8}{'torch':<9}{'triton':<8}{'numpy':<8}"
    head += f"{'packages':>9}" + (f"{'download':>11}" if sizes else "")
    lines = [head]
    for r in results:
        line = (
            f"{r.target:<15}{r.python:<8}{'ok' if r.ok else 'FAIL':<8}{r.version('torch'):<9}"
            f"{r.version('triton'):<8}{r.version('numpy'):<8}{len(r.installs):>9}"
        )
        if sizes:
            line += f"{sizes[(r.target, r.python)] / 1e6:>8.0f} MB"
        lines.append(line)
        lines += [f"    {p}" for p in r.problems]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS))
    parser.add_argument("--python", action="append", choices=PYTHONS)
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    parser.add_argument("--jobs", type=int, default=8, help="pips at once (network-bound)")
    parser.add_argument("--sizes", action="store_true", help="sum the wheel sizes (MB)")
    parser.add_argument("--list", action="store_true", help="print every resolved package")
    parser.add_argument("--pip-python", help=f"use this Python's pip (default: pip {PIP_VERSION})")
    args = parser.parse_args(argv)
    targets = [TARGETS[t] for t in (args.target or TARGETS)]
    pythons = args.python or list(PYTHONS)
    results = run_matrix(targets, pythons, args.jobs, args.requirements, args.pip_python)
    sizes = (
        {(r.target, r.python): download_bytes(r) for r in results if r.ok} if args.sizes else None
    )
    if sizes is not None:
        sizes.update({(r.target, r.python): 0 for r in results if not r.ok})
    print(f"pip dry-run resolution of {args.requirements.name} against PyPI (--isolated)")
    print(table(results, sizes))
    if args.list:
        for r in results:
            pkgs = " ".join(f"{n}=={v}" for n, v in sorted(r.installs.items()))
            print(f"\n{r.target} / Python {r.python}: {pkgs}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
