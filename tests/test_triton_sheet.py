"""Course rule (not graded): every example of lab 09's Triton sheet runs and checks itself.

Each fenced ``python`` block of ``labs/lab-09-triton-primer/triton-sheet.md`` is written to a
file of its own (``@triton.jit`` reads a kernel's source from its file) and run through the
interpreter; its own asserts are the check. The sheet's table names every call the examples
use, so a renamed or removed call in a new triton fails here, not in a learner's kernel.
"""

from __future__ import annotations

import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHEET = ROOT / "labs" / "lab-09-triton-primer" / "triton-sheet.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", SHEET.read_text(encoding="utf-8"), re.M | re.S)
# The calls the issue asked the sheet to name (and lab 09's puzzles and lab 00 use).
NAMED = ["tl.program_id", "tl.arange", "tl.load", "tl.store", "other=", "tl.zeros", "tl.full",
         ".to(", "element_ty", "tl.maximum", "tl.max", "tl.sum", "tl.exp", "tl.exp2",
         "tl.dot", "tl.constexpr", "stride", "tl.where", "range("]

pytestmark = pytest.mark.triton


def test_the_sheet_names_every_call_the_labs_need():
    text = SHEET.read_text(encoding="utf-8")
    missing = [call for call in NAMED if call not in text]
    assert not missing, f"{SHEET.name} does not name {missing}"
    assert len(BLOCKS) >= 5, f"{SHEET.name}: expected runnable examples, found {len(BLOCKS)}"


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"example-{i + 1}")
def test_every_example_of_the_sheet_runs_and_checks_itself(index, tmp_path):
    script = tmp_path / f"sheet_example_{index + 1}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    try:
        runpy.run_path(str(script), run_name="__sheet__")
    except AssertionError as err:
        pytest.fail(f"{SHEET.name}, example {index + 1}: its own check failed ({err!r}):\n"
                    f"{BLOCKS[index]}")
