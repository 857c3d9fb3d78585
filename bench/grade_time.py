"""How long ``make grade LAB=NN`` takes beside bare pytest of the same lab (``make bench-grade``).

    python -m bench.grade_time [--lab 00 --lab 05] [--rounds 2] [--impl solution] [--cold]
                               [--before DIR]   # and the grade of another checkout, e.g. main

Per lab, the two commands a student runs, each as a fresh process, wall clock:

* grade: ``python -m grading --lab NN`` (the sandboxed grader, results.json to a temp file);
* pytest: ``python -m pytest labs/lab-NN-*`` (the lab's tests in this process' user).

They run interleaved (grade, pytest, grade, pytest, ...) so that the load other processes put
on the machine meanwhile falls on both; the table gives each one's median, their ratio and
the load average before and after the lab, and the CPU seconds each process tree used
(less sensitive to the load than wall time). One untimed pytest run first fills the compile
cache (``build/grade-compile/``, shared by both): the timed runs then compare the same
work. ``--before DIR`` also times the grade of another checkout of the course (its compile
cache gets a copy of this one's: the same inputs hash to the same keys), interleaved with
the others: the table then has the ratio before and after a change, measured under the
same load. ``--cold`` empties the compile caches before every timed run instead, so every
run pays the sm_90 compile (a student's loop after an edit; a minute per lab on two cores).

Both run as from a student's shell: in the environment ``make`` was given (not with the
``TRITON_INTERPRET=1`` this process sets for itself: without it, pytest imports torch to look
for a GPU, as in the student's shell), and with ``PYTHONDONTWRITEBYTECODE`` removed (the
grader sets it again for its test process, whose bytecode it never writes).

A benchmark, not a test: nothing here asserts a time (``captured_outputs/cpu/grade-time-idle-
final.txt`` is its output for every lab on the course's 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMPILE_CACHE = ROOT / "build" / "grade-compile"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _run(root: pathlib.Path, cmd: list[str], env: dict[str, str]
         ) -> tuple[float, float, int, str]:
    """``(wall seconds, CPU seconds of the process tree, exit status, last output line)`` of
    one run of ``cmd`` from ``root`` (CPU: user + system of every descendant reaped)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    return wall, cpu, proc.returncode, lines[-1] if lines else ""


def commands(folder: str, results: str) -> dict[str, list[str]]:
    """The two timed commands for lab ``folder`` (``lab-NN-name``)."""
    number = folder.split("-")[1]
    return {"grade": [sys.executable, "-m", "grading", "--lab", number, "--results", results,
                      "--no-details"],
            "pytest": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       f"labs/{folder}"]}


def _measure(kinds: tuple[str, ...], roots: dict[str, pathlib.Path | None],
             cmds: dict[str, list[str]], env: dict[str, str], rounds: int, cold: bool
             ) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """``rounds`` interleaved runs of each of ``kinds``: wall and CPU seconds, exit status."""
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    status = 0
    for _ in range(rounds):
        for kind in kinds:
            if cold:
                for root in filter(None, set(roots.values())):
                    shutil.rmtree(root / "build" / "grade-compile", ignore_errors=True)
            root = roots[kind]
            assert root is not None
            seconds, used, code, last = _run(root, cmds[kind.replace("before", "grade")], env)
            wall[kind].append(seconds)
            cpu[kind].append(used)
            if code != 0:
                status = 1
                print(f"   {kind} exited {code}: {last}")
    return wall, cpu, status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.grade_time", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lab", action="append", default=[],
                   help="a lab number (repeat); default every lab of the manifest")
    p.add_argument("--rounds", type=int, default=2, help="timed (grade, pytest) pairs per lab")
    p.add_argument("--impl", choices=("solution", "starter"), default="solution")
    p.add_argument("--cold", action="store_true",
                   help="empty the compile cache before every timed run")
    p.add_argument("--before", type=pathlib.Path, default=None,
                   help="another checkout whose grade is timed too (the ratio before a change)")
    args = p.parse_args(argv)
    before_root = args.before.resolve() if args.before else None
    from labs import manifest

    folders = [e.folder for e in manifest.labs()
               if not args.lab or e.folder.split("-")[1] in {n.zfill(2) for n in args.lab}]
    folders.sort()
    from bench import GIVEN_ENV

    env = dict(GIVEN_ENV, LAB_IMPL=args.impl)  # not this process's TRITON_INTERPRET=1
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    kinds = ("before", "grade", "pytest") if before_root else ("grade", "pytest")
    print(f"LAB_IMPL={args.impl}, {args.rounds} interleaved ({', '.join(kinds)}) rounds per lab, "
          f"compile cache {'emptied before each run' if args.cold else 'warm'}; "
          f"{os.cpu_count()} CPUs; wall seconds, medians"
          + (f"; before: the grade of {before_root}" if before_root else ""))
    cols = ["before", "ratio"] if before_root else []
    cols += ["grade", "pytest", "ratio", "cpu gr", "cpu py", "ratio"]
    print(f"{'lab':<34}" + "".join(f"{c:>8}" for c in cols) + "  load before -> after")
    ratios: dict[str, list[float]] = {"wall": [], "cpu": [], "before": []}
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for folder in folders:
            cmds = commands(folder, str(pathlib.Path(tmp) / "results.json"))
            roots = {"before": before_root, "grade": ROOT, "pytest": ROOT}
            load = _load()
            if not args.cold:
                _run(ROOT, cmds["pytest"], env)  # fills the compile cache, untimed
                if before_root:  # the same inputs, the same keys: the other checkout's too
                    (before_root / "build" / "grade-compile").mkdir(parents=True, exist_ok=True)
                    for path in COMPILE_CACHE.glob("*.json"):
                        shutil.copy2(path, before_root / path.relative_to(ROOT))
            wall, cpu, code = _measure(kinds, roots, cmds, env, args.rounds, args.cold)
            status = status or code
            med = {k: statistics.median(wall[k]) for k in kinds}
            med_cpu = {k: statistics.median(cpu[k]) for k in kinds}
            cells = []
            if before_root:
                ratios["before"].append(med["before"] / med["pytest"])
                cells += [med["before"], ratios["before"][-1]]
            ratios["wall"].append(med["grade"] / med["pytest"])
            ratios["cpu"].append(med_cpu["grade"] / med_cpu["pytest"])
            cells += [med["grade"], med["pytest"], ratios["wall"][-1], med_cpu["grade"],
                      med_cpu["pytest"], ratios["cpu"][-1]]
            print(f"{folder:<34}" + "".join(f"{c:8.2f}" for c in cells)
                  + f"  {load} -> {_load()}", flush=True)
    for name, values in ratios.items():
        if values:
            what = {"wall": "grade / pytest, wall", "cpu": "grade / pytest, CPU",
                    "before": "before / pytest, wall"}[name]
            print(f"{what}: largest {max(values):.2f}, median {statistics.median(values):.2f}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
