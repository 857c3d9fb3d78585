"""The lessons' code snippets stay true: every fenced ``python`` block right after a
``<!-- snippet: run -->`` comment in a README is run as a doctest (its ``>>>`` lines, with
their printed results checked), from the repository's root; a block after
``<!-- snippet: vllm -->`` is compiled always and run where vLLM is installed
(``make engine-check``'s venv), since vLLM is not part of this course's CPU stack."""

from __future__ import annotations

import doctest
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SNIPPET = re.compile(r"<!-- snippet: (run|vllm) -->\n```python\n(.*?)\n```", re.S)
READMES = sorted([ROOT / "README.md", *(ROOT / "labs").glob("*/README.md")])
SNIPPETS = [(readme, kind, code, i) for readme in READMES
            for i, (kind, code) in enumerate(SNIPPET.findall(readme.read_text(encoding="utf-8")))]


def test_the_lessons_carry_the_series_snippets():
    """SDPA with a chosen backend, transformers' GQA config field, vLLM's LLM, and the
    serving-cost arithmetic of a "why it matters" callout."""
    text = "\n".join(code for _, _, code, _ in SNIPPETS)
    for needle in ("sdpa_kernel", "num_key_value_heads", "from vllm import LLM", "serve("):
        assert needle in text, f"no tested README snippet uses {needle!r}"


@pytest.mark.parametrize("readme,kind,code,index", SNIPPETS,
                         ids=[f"{r.parent.name}-{i}" for r, _, _, i in SNIPPETS])
def test_a_readme_snippet_runs_and_prints_what_the_lesson_says(readme, kind, code, index,
                                                               monkeypatch):
    monkeypatch.chdir(ROOT)
    if kind == "vllm":
        compile(code, f"{readme.name}#{index}", "exec")
        pytest.importorskip("vllm", reason="vLLM is not installed (make engine-check's venv)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        exec(compile(code, f"{readme.name}#{index}", "exec"), {})
        return
    test = doctest.DocTestParser().get_doctest(code, {}, f"{readme.parent.name}#{index}",
                                               str(readme), 0)
    assert test.examples, f"{readme}: snippet {index} has no >>> lines to check"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0, f"{readme}: snippet {index} no longer prints what it says"
