"""The Gradescope autograder: build its zip, and grade a submission inside it.

    python -m grading.tools.autograder [--out dist/autograder.zip]   # make autograder
    python -m grading.tools.autograder run                           # what run_autograder runs

The zip is the student copy (``grading.tools.release``: no solutions) plus, at its root, the two
files Gradescope wants:

- ``setup.sh``: run once when Gradescope builds the image (Ubuntu base image, as root, in
  ``/autograder/source``): a venv in ``/autograder/source/.venv`` with torch from the
  PyTorch CPU index and everything else pinned in ``requirements-cpu.txt``. Choose a base
  image with Python >= 3.10 (Ubuntu 22.04 or 24.04).
- ``run_autograder``: run for each submission. It copies the submitted ``starter.py``
  files into ``/autograder/source/labs/<lab>/``, grades ``LAB_IMPL=starter`` with
  ``grading`` and writes ``/autograder/results/results.json``. The tests run in a
  trusted process; the submitted code runs in sandboxed workers under uids of their own
  (Gradescope runs this as root; no account needs creating), which cannot read the tests,
  write the source tree or the results, or outlive the run (:mod:`grading.sandbox.lab_sandbox`).
  Labs are graded in parallel, one per core (``GRADE_JOBS`` overrides). Instructors' hidden
  tests (``test_hidden*.py``) are ``after_published`` (``GRADE_HIDDEN_VISIBILITY``).

Accepted submission layouts (searched anywhere under ``/autograder/submission``, so a
zip with a top-level folder works too):

- ``labs/lab-00-online-softmax/starter.py`` or ``lab-00-online-softmax/starter.py``
  (the lab's folder, full name or ``lab00``/``lab-00``), or
- a file named after its lab: ``lab00_starter.py``, ``lab-00-starter.py``,
  ``lab-00-online-softmax.py``, ``lab_00.py`` (``lab`` + the two-digit number first).

The folder form wins over the file-name form; the shallowest path wins among several.
A lab with no file is graded from its untouched starter (0 points). Nothing else of the
submission is used (tests, common/ and helpers always come from the autograder). Finding
and placing the files: :func:`find_submission_files`, :func:`place_submission`.

``AUTOGRADER_ROOT`` (default ``/autograder``) moves the whole layout, so the run can be
simulated in a temporary folder; ``AUTOGRADER_PYTHON`` picks the interpreter.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from grading.run.calibration import load_factor
from grading.run.discovery import discover_labs
from grading.run.lab import grade
from grading.run.report import (
    DEFAULT_HIDDEN_VISIBILITY,
    gradescope_results,
    plain_summary,
    write_json,
)
from grading.run.runner import Options
from grading.sandbox.host import SandboxRefused
from grading.tools.release import (
    HIDDEN_TESTS,
    PROJECT_ROOT,
    ReleaseError,
    build_release,
    is_solution_file,
)

# ---- submission --------------------------------------------------------------------------


def _lab_by_number(number: str, labs: list[str]) -> str | None:
    found = [lab for lab in labs if re.match(rf"lab-0*{int(number)}(-|$)", lab)]
    return found[0] if len(found) == 1 else None


def lab_of(path: Path, labs: list[str]) -> tuple[str | None, int]:
    """Which lab a submitted file is for, and how sure (0 folder form, 1 file name)."""
    if path.name == "starter.py":
        folder = path.parent.name
        if folder in labs:
            return folder, 0
        m = re.match(r"^lab[-_]?(\d+)(?:[-_].*)?$", folder, re.IGNORECASE)
        return (_lab_by_number(m.group(1), labs) if m else None), 0
    m = re.match(r"^lab[-_]?(\d+)(?![\d])", path.stem, re.IGNORECASE)
    return (_lab_by_number(m.group(1), labs) if m else None), 1


def _own_file(path: Path, submission: Path) -> bool:
    """A regular file inside the submission: a link (to a hidden test, say) never counts."""
    return (
        not path.is_symlink() and path.is_file() and path.resolve().is_relative_to(submission)
    )


def find_submission_files(submission: Path, labs: list[str]) -> tuple[dict[str, Path], list[str]]:
    """``{lab: submitted file}``, and the files that look like starters but were not used."""
    chosen: dict[str, tuple[tuple[int, int, str], Path]] = {}
    ignored = []
    real = submission.resolve()
    files = (
        sorted(p for p in submission.rglob("*.py") if _own_file(p, real))
        if submission.is_dir()
        else []
    )
    for path in files:
        rel = path.relative_to(submission)
        if any(part.startswith((".", "__")) for part in rel.parts):
            continue
        lab, form = lab_of(path, labs)
        if lab is None:
            if "starter" in path.name.lower() or path.name.lower().startswith("lab"):
                ignored.append(str(rel))  # meant as a lab's file, probably: say so
            continue
        rank = (form, len(rel.parts), str(rel))
        if lab not in chosen or rank < chosen[lab][0]:
            if lab in chosen:
                ignored.append(str(chosen[lab][1].relative_to(submission)))
            chosen[lab] = (rank, path)
        else:
            ignored.append(str(rel))
    return {lab: path for lab, (_, path) in chosen.items()}, ignored


def place_submission(submission: Path, source: Path) -> list[str]:
    """Copy the submitted starters into ``source/labs``; returns lines for the report."""
    labs = [lab.name for lab in discover_labs(source)]
    found, ignored = find_submission_files(submission, labs)
    lines = ["Submitted files:"]
    for lab in labs:
        if lab in found:
            target = source / "labs" / lab / "starter.py"
            target.unlink(missing_ok=True)  # never write through a link
            with open(found[lab], "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            lines.append(f"  {lab}: {found[lab].relative_to(submission)}")
        else:
            lines.append(f"  {lab}: no file for this lab, graded the untouched starter")
    if ignored:
        lines.append("  not used: " + ", ".join(sorted(ignored)[:20]))
        lines.append(
            "  (name a lab's file labs/<lab>/starter.py or lab<NN>_starter.py, e.g. "
            f"labs/{labs[0] if labs else 'lab-00-...'}/starter.py or lab00_starter.py)"
        )
    return lines


# ---- autograder --------------------------------------------------------------------------


__all__ = ["build_zip", "find_submission_files", "lab_of", "main", "place_submission", "run"]

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image. It installs the
# CPU packages the labs need into /autograder/source/.venv: torch from the PyTorch CPU index
# (no CUDA download), everything else pinned in requirements-cpu.txt.
set -euxo pipefail
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
py=""
for candidate in python3.12 python3.11 python3.10 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    py="$candidate"; break
  fi
done
if [ -z "$py" ]; then
  apt-get update && apt-get install -y python3 python3-venv python3-pip
  py=python3
fi
if ! "$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  apt-get update && { apt-get install -y "${py}-venv" || apt-get install -y python3-venv; }
fi
"$py" -m venv .venv
.venv/bin/python -m pip install --upgrade pip
torch_pin="$(grep -E '^torch==' requirements-cpu.txt || true)"
if [ -n "$torch_pin" ]; then
  .venv/bin/python -m pip install --index-url https://download.pytorch.org/whl/cpu "$torch_pin"
fi
.venv/bin/python -m pip install -r requirements-cpu.txt
.venv/bin/python -c "import numpy, torch, triton, pytest, pytest_timeout, hypothesis"
# How the graded code will be isolated (as root: a user switch to unused uids, no account
# needed; the grader sets it up for every submission).
.venv/bin/python -m grading.sandbox.lab_sandbox check || true
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission. AUTOGRADER_ROOT (default /autograder) moves the
# layout (source/, submission/, results/) to simulate a run; AUTOGRADER_PYTHON picks python.
set -uo pipefail
root="${AUTOGRADER_ROOT:-/autograder}"
python="${AUTOGRADER_PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/source/.venv/bin/python" ]; then
    python="$root/source/.venv/bin/python"
  else
    python=python3
  fi
fi
cd "$root/source"
exec "$python" -m grading.tools.autograder run --root "$root"
"""

EXECUTABLE = {"setup.sh", "run_autograder"}


# ---- building the zip ----------------------------------------------------------------------


def build_zip(root: Path, out: Path) -> list[str]:
    """Write the autograder zip; returns the names it holds."""
    with tempfile.TemporaryDirectory(prefix="autograder-") as tmp:
        source = Path(tmp) / "source"
        plan = build_release(root, source, quiet=True)
        for warning in plan.warnings:
            print(f"  warning: {warning}")
        for rel, why in plan.dropped.items():  # the grader, unlike a student, gets hidden tests
            if why == HIDDEN_TESTS:
                shutil.copy2(root / rel, source / rel)
        (source / "setup.sh").write_text(SETUP_SH, encoding="utf-8")
        (source / "run_autograder").write_text(RUN_AUTOGRADER, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        names = []
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(source.rglob("*")):
                if not path.is_file():
                    continue
                rel = path.relative_to(source).as_posix()
                info = zipfile.ZipInfo.from_file(path, rel)
                mode = 0o755 if rel in EXECUTABLE or os.access(path, os.X_OK) else 0o644
                info.external_attr = (stat.S_IFREG | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, path.read_bytes())
                names.append(rel)
    leaked = [n for n in names if is_solution_file(Path(n))]
    if leaked:
        out.unlink()
        raise ReleaseError(f"the autograder zip would contain solution files: {leaked}")
    return names


# ---- grading a submission ------------------------------------------------------------------


def parallel_jobs(labs: int) -> int:
    """Labs graded at once: ``GRADE_JOBS``, else one per core this process may use (each
    lab's tests and its worker share a core: most of the time one waits for the other)."""
    if os.environ.get("GRADE_JOBS", "").strip():
        return max(1, int(float(os.environ["GRADE_JOBS"])))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(labs, cores))


def run(root: Path) -> int:
    """Grade ``root/submission`` into ``root/results/results.json``; never fails silently."""
    source, submission = root / "source", root / "submission"
    results = root / "results" / "results.json"
    start = time.monotonic()
    try:
        placed = place_submission(submission, source)
        print("\n".join(placed), flush=True)
        opts = Options(root=source, impl="starter")
        if not any(os.environ.get(n) for n in ("GRADE_LAB_TIMEOUT", "GRADE_TEST_TIMEOUT")):
            factor = load_factor()  # the default limits scaled to this machine's load now
            opts.lab_timeout, opts.test_timeout = (opts.lab_timeout * factor,
                                                   opts.test_timeout * factor)
            print(f"limits: {opts.test_timeout:g} s per test, {opts.lab_timeout:g} s per lab "
                  f"(load calibration x{factor:g})", flush=True)
        for name, attr in (
            ("GRADE_LAB_TIMEOUT", "lab_timeout"),
            ("GRADE_TEST_TIMEOUT", "test_timeout"),
            ("GRADE_RUN_TIMEOUT", "run_timeout"),
        ):
            if os.environ.get(name):
                setattr(opts, attr, float(os.environ[name]))
        opts.sandbox = os.environ.get("GRADE_SANDBOX", "1").strip() not in ("0", "no", "off")
        labs = discover_labs(source)
        report = grade(labs, opts, jobs=parallel_jobs(len(labs)), results_file=results,
                       top_level=True)
        summary = plain_summary(report)
        print(summary, flush=True)
        visibility = os.environ.get("GRADE_HIDDEN_VISIBILITY", DEFAULT_HIDDEN_VISIBILITY)
        write_json(results, gradescope_results(report, "\n".join(placed) + "\n\n" + summary,
                                               hidden_visibility=visibility))
        return 0
    except SandboxRefused as exc:  # as root without the user switch: no score at all
        print(f"autograder: {exc}", file=sys.stderr, flush=True)
        return 3
    except Exception:  # noqa: BLE001 - always leave a results.json behind
        error = traceback.format_exc()
        print(error, file=sys.stderr)
        write_json(
            results,
            {
                "score": 0,
                "execution_time": round(time.monotonic() - start, 2),
                "output": "The autograder itself failed; please tell the course staff.\n\n"
                + error[-3000:],
                "visibility": "visible",
                "tests": [],
            },
        )
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m grading.tools.autograder",
        description="Build the Gradescope autograder zip (default), or grade a submission (run).",
    )
    p.add_argument("command", nargs="?", choices=("build", "run"), default="build")
    p.add_argument("--out", type=Path, default=PROJECT_ROOT / "dist" / "autograder.zip")
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="build: the project (default this one); run: the Gradescope folder (/autograder)",
    )
    args = p.parse_args(argv)
    if args.command == "run":
        root = args.root or Path(os.environ.get("AUTOGRADER_ROOT", "/autograder"))
        return run(root.resolve())
    try:
        names = build_zip((args.root or PROJECT_ROOT).resolve(), args.out.resolve())
    except ReleaseError as exc:
        print(f"autograder: {exc}", file=sys.stderr)
        return 1
    labs = sorted({n.split("/")[1] for n in names if n.startswith("labs/lab-") and "/" in n[5:]})
    print(f"wrote {args.out} ({len(names)} files; labs: {', '.join(labs)})")
    print("Upload it as the autograder of a Gradescope programming assignment (base image with")
    print("Python >= 3.10); students upload labs/<lab>/starter.py files or lab<NN>_starter.py.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
