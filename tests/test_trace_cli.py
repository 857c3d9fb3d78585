"""`make trace` (book/traces.py) on planted starters: what the command line says (not graded).

The page and the command line number steps alike (from 1), and each quantity is compared on
its own: a wrong ``lse`` is reported as ``lse``, not as an ``acc`` derived from it.
"""

from __future__ import annotations

import pathlib
import shutil

import pytest

from book.traces import main as traces_main
from book.traces import read_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAB00 = ROOT / "labs" / "lab-00-online-softmax"
LSE_LINE = "        lse[q0:q1] = m + np.log(l)\n"
ACC_LINE = "            acc = alpha[:, None] * acc + p @ v[k0:k1]\n"


def planted(tmp_path: pathlib.Path, find: str, replace: str) -> pathlib.Path:
    if not (LAB00 / "solution.py").is_file():
        pytest.skip("the wrong starter is planted in a copy of solution.py (instructor's tree)")
    lab = tmp_path / LAB00.name
    shutil.copytree(LAB00, lab, ignore=shutil.ignore_patterns("__pycache__", "figures"))
    code = (lab / "solution.py").read_text()
    assert find in code, "the planted mistake no longer applies to lab 00's solution"
    (lab / "starter.py").write_text(code.replace(find, replace))
    (lab / "solution.py").unlink()
    return lab


def run(lab: pathlib.Path, out: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict,
                                                                                           str]:
    assert traces_main(["--impl", "starter", "--lab", "00", "--lab-dir", str(lab),
                        "--out", str(out)]) == 0
    return read_script(out / "lab00-starter.js")["first_diff"], capsys.readouterr().out


def test_an_lse_without_its_max_is_reported_as_lse_at_step_1(tmp_path, capsys):
    lab = planted(tmp_path, LSE_LINE, "        lse[q0:q1] = np.log(l)\n")
    diff, printed = run(lab, tmp_path / "traces", capsys)
    assert diff["field"] == "lse" and diff["step"] == 0, diff
    assert "first difference at step 1 " in printed and printed.split("\n")[0].endswith("lse")


def test_an_acc_not_rescaled_is_reported_as_acc_at_the_page_s_step_number(tmp_path, capsys):
    lab = planted(tmp_path, ACC_LINE, "            acc = acc + p @ v[k0:k1]\n")
    diff, printed = run(lab, tmp_path / "traces", capsys)
    assert diff["field"] == "acc", diff
    assert f"first difference at step {diff['step'] + 1} " in printed, printed


# ---- the Triton kernels (book/kernel_traces.py): make trace LAB=09, LAB=00 KERNEL=1 -----------


def mutated_copy(tmp_path: pathlib.Path, lab: str, mutant: str) -> pathlib.Path:
    """A copy of the lab whose starter.py is its solution with ``tests/mutants`` mistake."""
    from grading.tools.mutants import apply_mutant, parse_mutant

    folder = next((ROOT / "labs").glob(f"lab-{lab}-*"))
    if not (folder / "solution.py").is_file():
        pytest.skip("the mistake is planted in a copy of solution.py (instructor's tree)")
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__", "figures"))
    apply_mutant(parse_mutant(ROOT / "tests" / "mutants" / folder.name / f"{mutant}.mutant",
                              folder.name), copy)
    (copy / "solution.py").rename(copy / "starter.py")
    return copy


def kernel_diff(copy: pathlib.Path, lab: str, tmp_path: pathlib.Path, *flags: str) -> dict:
    assert traces_main(["--impl", "starter", "--lab", lab, *flags, "--lab-dir", str(copy),
                        "--out", str(tmp_path / "traces")]) == 0
    name = "lab00-kernel-starter.js" if flags else f"lab{lab}-starter.js"
    return read_script(tmp_path / "traces" / name)["first_diff"]


@pytest.mark.triton
def test_trace_09_names_the_program_a_floor_grid_leaves_out(tmp_path, capsys):
    diff = kernel_diff(mutated_copy(tmp_path, "09", "p2-grid-floor"), "09", tmp_path)
    assert (diff["step"], diff["program"], diff["field"]) == (1, "(2, 0, 0)", "stores of out")
    assert diff["yours"] == "none" and diff["reference"] == "elements 32..36 (5)", diff
    assert "first difference at step 2 (puzzle 2 (add_vectors), program (2, 0, 0))" in \
        capsys.readouterr().out


@pytest.mark.triton
def test_trace_00_kernel_names_the_program_that_loads_keys_past_its_causal_bound(tmp_path):
    copy = mutated_copy(tmp_path, "00", "triton-causal-loop-runs-to-lq")
    diff = kernel_diff(copy, "00", tmp_path, "--kernel")
    assert (diff["program"], diff["field"]) == ("(0, 0, 0)", "loads of k"), diff


@pytest.mark.triton
def test_trace_00_kernel_reports_an_lse_without_its_max_as_lse(tmp_path):
    diff = kernel_diff(mutated_copy(tmp_path, "00", "triton-lse-without-max"), "00", tmp_path,
                       "--kernel")
    assert diff["field"] == "lse", diff


@pytest.mark.triton
def test_trace_09_of_the_reference_itself_has_no_difference(tmp_path):
    folder = ROOT / "labs" / "lab-09-triton-primer"
    if not (folder / "solution.py").is_file():
        pytest.skip("instructor's tree only")
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__", "figures"))
    (copy / "solution.py").rename(copy / "starter.py")
    assert kernel_diff(copy, "09", tmp_path) is None
