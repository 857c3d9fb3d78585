"""Every number a lab README quotes from the compiled report matches the report.

A paragraph of ``labs/*/README.md`` that names ``captured_outputs/gpu-report`` quotes the
report (a paragraph that names only the command, ``make gpu-report``, may describe other
configs, compiled to choose the shipped one); in it these
forms are checked against ``captured_outputs/gpu-report.json`` (the lab's own rows and plan
checks): ``N registers``, ``N B`` of spills (``spills N B``), ``N CTAs``, ``N waves``,
``HGMMA xN`` / ``HMMA xN`` / ``UTCHMMA xN``, ``model N %`` / ``model fraction 0.NN``,
``N KB in flight``. A number the report does not hold fails with its paragraph: the text was
written for another version of the kernel or its launch plan (``make gpu-report``).
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPORT = ROOT / "captured_outputs" / "gpu-report.json"
LABS = sorted(p.parent for p in (ROOT / "labs").glob("lab-*/README.md"))

CLAIMS = {  # form -> how to read the values of a lab's rows / plan checks
    r"(\d+) registers": lambda rows, plans: {r["regs"] for r in rows},
    r"spills? (\d+) B\b": lambda rows, plans: {r["spill_stores"] for r in rows},
    r"(\d+) CTAs": lambda rows, plans: {p["ctas"] for p in plans},
    r"(\d+(?:\.\d+)?) waves": lambda rows, plans: {p["waves"] for p in plans},
    r"((?:UTCHMMA|HGMMA|HMMA) x\d+)": lambda rows, plans: {
        part.strip() for r in rows for part in r["mma_kind"].split(",")},
    r"model(?: fraction)? (0\.\d\d)": lambda rows, plans: {p["model_fraction"] for p in plans},
    r"(\d+(?:\.\d+)?) KB in flight": lambda rows, plans: {p["in_flight_kb"] for p in plans},
}


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if "captured_outputs/gpu-report" in p]


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def wrong_numbers(text: str, rows: list[dict], plans: list[dict]) -> list[str]:
    """The quoted numbers of ``text`` that ``rows`` / ``plans`` do not hold, with context."""
    wrong = []
    for paragraph in _paragraphs(text):
        flat = " ".join(paragraph.split())
        for form, values_of in CLAIMS.items():
            values = {_number(str(v)) for v in values_of(rows, plans)}
            for quoted in re.findall(form, flat):
                if _number(quoted) not in values:
                    wrong.append(f"{quoted!r} (form {form!r}) in: {flat[:160]}...")
    return wrong


@pytest.mark.points(1)
def test_a_number_the_report_does_not_hold_is_caught():
    rows = [{"regs": 188, "spill_stores": 0, "mma_kind": "HGMMA x24"}]
    plans = [{"ctas": 4160, "waves": 31.52, "model_fraction": 0.74, "in_flight_kb": 64.0}]
    good = "`captured_outputs/gpu-report.md`: 188 registers, HGMMA x24, 4160 CTAs, 31.52 waves."
    assert not wrong_numbers(good, rows, plans)
    stale = good.replace("188 registers", "237 registers").replace("x24", "x16")
    assert len(wrong_numbers(stale, rows, plans)) == 2
    assert not wrong_numbers(stale.replace("captured_outputs/", ""), rows, plans)


@pytest.mark.points(1)
@pytest.mark.parametrize("lab", LABS, ids=[p.name for p in LABS])
def test_numbers_quoted_from_the_gpu_report_match_it(lab: pathlib.Path):
    report = json.loads(REPORT.read_text())
    rows = [r for r in report["rows"] if r["lab"] == lab.name]
    plans = [p for p in report.get("plan_checks", []) if p["lab"] == lab.name]
    wrong = wrong_numbers((lab / "README.md").read_text(), rows, plans)
    assert not wrong, (f"{lab.name}/README.md quotes numbers captured_outputs/gpu-report.json "
                       "does not hold for this lab:\n" + "\n".join(wrong))  # fmt: skip
