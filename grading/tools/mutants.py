"""Spec strength, measured: every planted mistake must make its lab's tests fail.

    python -m grading.tools.mutants                 # make mutants: every lab
    python -m grading.tools.mutants --lab 03        # make mutants LAB=03
    python -m grading.tools.mutants --list          # what is planted, nothing run

A mutant is a plausible wrong implementation, kept as a text file
``tests/mutants/<lab folder>/<name>.mutant``::

    # the accumulator is not rescaled when the running max grows
    # file: solution.py
    <<<<<<< find
            acc = acc * alpha[:, None] + p @ v
    =======
            acc = acc + p @ v
    >>>>>>> replace

The first comment line says what the mistake is. ``# file:`` names the lab file the blocks
below it edit (default ``solution.py``; ``provided.py`` also works; a path with a ``/``, such
as ``common/launch_plan.py``, is a shared file of the repository). ``# expect: words``
(optional) are words the failure message must contain: the test that catches the mistake
must also name it, or the mutant counts as UNNAMED, not killed. ``# misconception: words``
(optional) ties the mutant to the row of its lab README's Misconceptions table that holds
those words (``tests/test_mutant_expect.py`` requires a mutant for every row). A mutant may hold
several blocks; each ``find`` text must occur exactly once in its file. The runner copies
the lab to a scratch folder inside the repository (so ``conftest.py`` applies), applies the
mutant, runs the lab's tests with ``LAB_IMPL=solution`` and requires them to fail. It first
checks that the unmutated copy passes, so a failure is the mutant's doing. A mutant the
tests cannot even import (a syntax error) is reported as broken, not as killed.

Mutants of shared code live in ``tests/mutants/common/`` (``# file: common/testing.py``).
Each runs against every lab that imports the mutated module (directly or through another
module of ``common/``), on a scratch copy of the repository's code, and against the course's
own tests that import it (``tests/test_*.py``; ``--lab 03`` runs lab 03's share, reported
only). Its ``# expect:`` words hold per run: it is killed when at least one of those runs
fails AND names it. A run that fails without the words is reported UNNAMED beside it (a lab
that catches a shared mistake by accident need not name it); a mutant no run names is UNNAMED.
The course's tests run first and the runs stop at the first that kills it (the status is the
same; a planner's mistake is invisible to every lab on a CPU, so the lab runs are the slow
part).

Instructors add their own mutants the same way; ``make release`` drops ``tests/mutants``.
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = Path("tests") / "mutants"
SCRATCH = ".mutants-scratch"
BLOCK = re.compile(
    r"^<<<<<<< find\n(?P<find>.*?)^=======\n(?P<replace>.*?)^>>>>>>> replace\n?",
    re.MULTILINE | re.DOTALL,
)
PER_RUN_TIMEOUT = 240  # seconds: a mutant that hangs a lab counts as killed only by the limit
SHARED = "common"  # tests/mutants/common/: mutants of the shared code
# Copied into a shared mutant's scratch root (the rest of the repository is linked, read-only).
COPIED = ("common", "conftest.py", "pyproject.toml")
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+common(?:\.(\w+))?[ \t]+import[ \t]+(\([^)]*\)|[\w \t,]+)"
    r"|import[ \t]+common\.(\w+))",
    re.MULTILINE,
)


class MutantError(ValueError):
    """A mutant file that cannot be applied (no match, two matches, unknown file)."""


@dataclass
class Mutant:
    lab: str
    name: str
    description: str
    edits: list[tuple[str, str, str]]  # (file, find, replace)
    expect: str = ""  # words the failure message must contain ('# expect:' line)


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # "killed" | "SURVIVED" | "BROKEN" | "UNNAMED" (killed, message unnamed)
    detail: str


def parse_mutant(path: Path, lab: str) -> Mutant:
    """Read one ``.mutant`` file."""
    text = path.read_text()
    description = ""
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith(("# file:", "# expect:",
                                                            "# misconception:")):
            description = line.lstrip("# ").strip()
            break
    expect = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                   if line.startswith("# expect:")), "")
    edits: list[tuple[str, str, str]] = []
    current_file = "solution.py"
    pos = 0
    for match in BLOCK.finditer(text):
        for line in text[pos : match.start()].splitlines():
            if line.startswith("# file:"):
                current_file = line.split(":", 1)[1].strip()
        edits.append((current_file, match["find"], match["replace"]))
        pos = match.end()
    if not edits:
        raise MutantError(f"{path}: no <<<<<<< find / ======= / >>>>>>> replace block")
    if not description:
        raise MutantError(f"{path}: the first line must be a '# description' of the mistake")
    return Mutant(lab=lab, name=path.stem, description=description, edits=edits, expect=expect)


def names_it(output: str, expect: str) -> bool:
    """Whether pytest's ``output`` holds the words ``expect`` (case and line breaks aside)."""
    lines = (re.sub(r"^E\s+", "", line.strip()) for line in output.splitlines())
    return " ".join(expect.lower().split()) in " ".join(" ".join(lines).lower().split())


def apply_mutant(mutant: Mutant, lab_dir: Path) -> None:
    """Apply every edit of ``mutant`` to the lab folder ``lab_dir`` in place (a ``file``
    with a ``/`` is relative to the root holding ``lab_dir``'s ``labs/``)."""
    for file, find, replace in mutant.edits:
        target = lab_dir.parent.parent / file if "/" in file else lab_dir / file
        if not target.is_file():
            raise MutantError(f"{mutant.lab}/{mutant.name}: no file {file} in the lab")
        source = target.read_text()
        count = source.count(find)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            first = find.strip().splitlines()[0] if find.strip() else "(empty)"
            raise MutantError(
                f"{mutant.lab}/{mutant.name}: the find text {where} in {file}: {first!r}"
            )
        target.write_text(source.replace(find, replace))


def discover(root: Path, wanted: str | None) -> dict[str, list[Mutant]]:
    """Lab folder name -> its mutants (sorted by file name)."""
    labs = sorted(p for p in (root / "labs").glob("lab-*") if p.is_dir())
    if wanted:
        labs = [p for p in labs if p.name == wanted or p.name.startswith(f"lab-{wanted}")]
        if not labs:
            raise SystemExit(f"--lab {wanted}: no such lab under labs/")
    found: dict[str, list[Mutant]] = {}
    for lab in labs:
        files = sorted((root / MUTANTS_DIR / lab.name).glob("*.mutant"))
        found[lab.name] = [parse_mutant(f, lab.name) for f in files]
    return found


def _imports(text: str, modules: set[str]) -> set[str]:
    """The modules of ``common/`` that ``text`` imports (``__init__`` for its own names)."""
    found = set()
    for sub, names, plain in _IMPORT.findall(text):
        if plain or sub:
            found.add(plain or sub)
            continue
        for name in re.findall(r"\w+", names):
            found.add(name if name in modules else "__init__")
    return found & modules


def labs_using(root: Path, file: str) -> list[str]:
    """The labs whose code or tests import the shared module ``file`` (``common/x.py``),
    directly or through other modules of ``common/`` (the test machinery's own imports, in
    ``conftest.py``, do not count: every lab would use everything)."""
    common = root / SHARED
    modules = {p.stem for p in common.glob("*.py")}
    deps = {m: _imports((common / f"{m}.py").read_text(), modules) for m in modules}
    deps["__init__"] = deps.get("__init__", set())

    def closure(start: set[str]) -> set[str]:
        seen, todo = set(), list(start)
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += deps.get(m, set())
        return seen

    target = Path(file).stem
    users = []
    for lab in sorted(p for p in (root / "labs").glob("lab-*") if p.is_dir()):
        text = "\n".join(f.read_text() for f in lab.glob("*.py"))
        if target in closure(_imports(text, modules) | {"__init__"}):
            users.append(lab.name)
    return users


# Course tests that run whole pipelines (grading runs, the suite without triton): too slow to
# run per mutant, and never the only place a shared mistake shows.
WHOLE_PIPELINE = ("test_grading", "test_setup", "test_trusted", "test_student_copy")


def tests_using(root: Path, file: str) -> list[str]:
    """The course's own tests (``tests/test_*.py``) that import the shared module ``file``
    directly: a planner's mistake may be invisible to every lab on a CPU and still be
    caught by ``tests/test_launch_plan.py``."""
    modules = {p.stem for p in (root / SHARED).glob("*.py")}
    target = Path(file).stem
    return [f"tests/{p.name}" for p in sorted((root / "tests").glob("test_*.py"))
            if not p.name.startswith(WHOLE_PIPELINE) and target in _imports(p.read_text(), modules)]


def _run_course_test(root: Path, mutant: Mutant, test_file: str) -> Outcome:
    """``test_file`` (``tests/...``) run on a scratch copy of the repository with the shared
    ``mutant`` applied: ``common/`` and ``tests/`` copied, the rest linked."""
    base = root / SCRATCH
    base.mkdir(exist_ok=True)
    holder = Path(tempfile.mkdtemp(dir=base))
    try:
        for entry in root.iterdir():
            if entry.name in (*COPIED, "tests"):
                if entry.is_dir():
                    shutil.copytree(entry, holder / entry.name,
                                    ignore=shutil.ignore_patterns("__pycache__", "mutants"))
                else:
                    shutil.copy2(entry, holder / entry.name)
            elif entry.name not in (SCRATCH, ".git") and not entry.name.startswith(".venv"):
                (holder / entry.name).symlink_to(entry)
        try:
            apply_mutant(mutant, holder / "labs" / "-")
        except MutantError as e:
            return Outcome(mutant, "BROKEN", str(e))
        env = dict(os.environ, LAB_IMPL="solution", PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, "-m", "pytest", test_file, "-x", "-q", "-rf", "--no-header",
               "-p", "no:cacheprovider", "-m", "not slow and not gpu_report and not gpu_compile"]
        try:
            proc = subprocess.run(cmd, cwd=holder, env=env, capture_output=True, text=True,
                                  timeout=PER_RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            return Outcome(mutant, "killed", f"the tests hit the {PER_RUN_TIMEOUT} s limit")
        output = proc.stdout + proc.stderr
        if proc.returncode == 0:
            return Outcome(mutant, "SURVIVED", "every test passed")
        if proc.returncode == 1 and mutant.expect and not names_it(output, mutant.expect):
            return Outcome(mutant, "UNNAMED", f"{_first_failure(output)} failed without "
                           f"naming the mistake (expected the words {mutant.expect!r})")
        if proc.returncode == 1:
            return Outcome(mutant, "killed", _first_failure(output))
        return Outcome(mutant, "BROKEN", f"pytest exit {proc.returncode}: {_first_failure(output)}")
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def _scratch_root(root: Path, lab: str) -> Path:
    """A scratch copy of the repository's shared code with ``lab`` as its only lab: the
    directories a mutant may edit copied, the rest linked; returns the copy's lab folder."""
    base = root / SCRATCH
    base.mkdir(exist_ok=True)
    holder = Path(tempfile.mkdtemp(dir=base))
    for entry in root.iterdir():
        if entry.name in COPIED:
            if entry.is_dir():
                shutil.copytree(entry, holder / entry.name,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(entry, holder / entry.name)
        elif entry.name not in ("labs", SCRATCH, ".git") and not entry.name.startswith(".venv"):
            (holder / entry.name).symlink_to(entry)
    dest = holder / "labs" / lab
    shutil.copytree(root / "labs" / lab, dest,
                    ignore=shutil.ignore_patterns("__pycache__", "figures", "*.png"))
    return dest


def _run_lab_tests(root: Path, lab_copy: Path) -> tuple[int, str]:
    env = dict(os.environ, LAB_IMPL="solution", PYTHONDONTWRITEBYTECODE="1")
    env.pop("HYPOTHESIS_PROFILE", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(lab_copy),
        "-x",
        "-q",
        "-rf",
        "--no-header",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        # The grader's limits: a failing property stops at its first counterexample, and a
        # hang (inside @given too) costs its test only.
        "-p",
        "grading.plugin.points",
        "--points-fast-hypothesis",
        "--points-test-timeout=120",
        "--timeout=0",
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, timeout=PER_RUN_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return -1, f"the tests hit the {PER_RUN_TIMEOUT} s limit"
    return proc.returncode, proc.stdout + proc.stderr


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split("::", 1)[-1]
    return output.strip().splitlines()[-1] if output.strip() else "(no output)"


def _scratch_copy(root: Path, lab: str) -> Path:
    base = root / SCRATCH
    base.mkdir(exist_ok=True)
    holder = Path(tempfile.mkdtemp(dir=base))
    dest = holder / lab
    shutil.copytree(
        root / "labs" / lab, dest, ignore=shutil.ignore_patterns("__pycache__", "figures", "*.png")
    )
    return dest


def run_one(root: Path, mutant: Mutant | None, lab: str) -> Outcome | tuple[int, str]:
    """Run the lab's tests on a scratch copy with ``mutant`` applied (None: unmutated). A
    mutant of shared code gets a scratch root of its own (``_scratch_root``)."""
    if mutant is not None and lab.startswith("tests/"):
        return _run_course_test(root, mutant, lab)
    shared = mutant is not None and any("/" in file for file, _, _ in mutant.edits)
    copy = _scratch_root(root, lab) if shared else _scratch_copy(root, lab)
    where = copy.parent.parent if shared else root
    try:
        if mutant is None:
            return _run_lab_tests(root, copy)
        try:
            apply_mutant(mutant, copy)
        except MutantError as e:
            return Outcome(mutant, "BROKEN", str(e))
        rc, output = _run_lab_tests(where, copy)
        if rc == 0:
            return Outcome(mutant, "SURVIVED", "every test passed")
        if rc == 1 and mutant.expect and not names_it(output, mutant.expect):
            return Outcome(mutant, "UNNAMED", f"{_first_failure(output)} failed without "
                           f"naming the mistake (expected the words {mutant.expect!r})")
        if rc in (1, -1):
            return Outcome(mutant, "killed", _first_failure(output) if rc == 1 else output)
        return Outcome(mutant, "BROKEN", f"pytest exit {rc}: {_first_failure(output)}")
    finally:
        shutil.rmtree(copy.parent.parent if shared else copy.parent, ignore_errors=True)


def shared_mutants(root: Path, wanted: str | None) -> list[tuple[Mutant, list[str]]]:
    """The mutants of shared code, each with the labs (matching ``wanted``) it runs against."""
    out = []
    for path in sorted((root / MUTANTS_DIR / SHARED).glob("*.mutant")):
        mutant = parse_mutant(path, SHARED)
        files = [f for f, _, _ in mutant.edits if "/" in f]
        if not files:
            raise MutantError(f"{path}: a shared mutant edits a shared file (# file: common/...)")
        labs = sorted(set().union(*(labs_using(root, f) for f in files)))
        if wanted:
            labs = [lab for lab in labs if lab.startswith((f"lab-{wanted}", wanted))]
        labs = [lab for lab in labs if (root / "labs" / lab / "solution.py").is_file()]
        if not wanted:
            labs += sorted(set().union(*(tests_using(root, f) for f in files)))
        if labs:
            out.append((mutant, labs))
    return out


def shared_status(statuses: list[str]) -> str:
    """A shared mutant's status from its runs' statuses: killed when one run fails naming it
    (a run failing without the words does not count, and is reported beside it)."""
    for status in ("killed", "UNNAMED", "BROKEN"):
        if status in statuses:
            return status
    return "SURVIVED"


def _first_kill(root: Path, mutant: Mutant, targets: list[str]) -> list[tuple[str, Outcome]]:
    """``mutant`` run against ``targets`` one after another, the course's own tests first
    (they are what is meant to catch a shared mistake on a CPU, and they are quick), until
    one run kills it naming the mistake: the status is the same as running them all."""
    ordered = sorted(targets, key=lambda t: not t.startswith("tests/"))
    runs = []
    for target in ordered:
        outcome = run_one(root, mutant, target)
        assert isinstance(outcome, Outcome)
        runs.append((target, outcome))
        if outcome.status == "killed":
            break
    return runs


def run_shared(root: Path, wanted: str | None, jobs: int) -> tuple[int, int]:
    """Run every shared mutant against the labs and course tests that use it until one run
    kills it; ``(killed, total)``: killed when at least one run fails naming it (its
    ``# expect:`` words). With ``wanted`` (one lab's share) every run of that lab is made."""
    found = shared_mutants(root, wanted)
    if not found:
        return 0, 0
    print(f">> {SHARED}: {len(found)} mutants of shared code, each against the labs using it",
          flush=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda f: _first_kill(root, *f), found))
    if wanted:
        print("   (one lab's share: a lab need not catch every mistake in shared code it uses; "
              "make mutants, over every lab, requires each to be killed by at least one)")
    killed = 0
    for (mutant, targets), mine in zip(found, results):
        status = shared_status([o.status for _, o in mine])
        killed += status == "killed"
        skipped = len(targets) - len(mine)
        print(f"   {status:8s} {mutant.name}: {mutant.description}")
        for target, o in mine:
            print(f"            {target}: {o.status} {o.detail}")
        if skipped:
            print(f"            ({skipped} more runs not needed: a run above killed it)")
    print(f"   {SHARED}: {killed}/{len(found)} mutants killed", flush=True)
    return killed, len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grading.tools.mutants",
        description="Every planted mistake must fail its lab.",
    )
    parser.add_argument("--lab", help="one lab: 03 or lab-03-causal-prefill-attention")
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = parser.parse_args(argv)
    root = args.root.resolve()
    found = discover(root, args.lab)
    if args.list:
        for lab, mutants in found.items():
            print(f"{lab}: {len(mutants)} mutants")
            for m in mutants:
                print(f"  {m.name}: {m.description}")
        for m, labs in shared_mutants(root, args.lab):
            print(f"  {SHARED}/{m.name}: {m.description} (against {', '.join(labs)})")
        return 0
    failed = False
    total_killed = total = 0
    for lab, mutants in found.items():
        if not (root / "labs" / lab / "solution.py").is_file():
            print(f"{lab}: no solution.py here (a student copy?): skipped")
            continue
        print(f">> {lab}: checking that the unmutated lab passes", flush=True)
        rc, output = run_one(root, None, lab)  # type: ignore[misc]
        if rc != 0:
            print(f"   the unmutated lab fails (pytest exit {rc}): {_first_failure(output)}")
            failed = True
            continue
        if len(mutants) < 10:
            print(f"   only {len(mutants)} mutants (the course asks for at least ten per lab)")
            failed = True
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            outcomes = list(pool.map(lambda m, lab=lab: run_one(root, m, lab), mutants))
        for o in outcomes:
            assert isinstance(o, Outcome)
            print(f"   {o.status:8s} {o.mutant.name}: {o.mutant.description}")
            print(f"            {o.detail}")
        killed = sum(o.status == "killed" for o in outcomes)
        total_killed += killed
        total += len(outcomes)
        print(f"   {lab}: {killed}/{len(outcomes)} mutants killed", flush=True)
        failed |= killed != len(outcomes)
    shared_killed, shared_total = run_shared(root, args.lab, args.jobs)
    if not args.lab:  # with --lab, the shared mutants are that lab's share: reported only
        total_killed, total = total_killed + shared_killed, total + shared_total
        failed |= shared_killed != shared_total
    print(f"mutants: {total_killed}/{total} killed" + ("" if not failed else " -- FAILED"))
    try:  # each run removed its own copies; another run may still be using the folder
        (root / SCRATCH).rmdir()
    except OSError:
        pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
