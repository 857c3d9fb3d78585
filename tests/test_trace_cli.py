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
