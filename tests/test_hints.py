"""Course rule (not graded): a starter states the task, the hints come in levels.

For every lab with a ``HINTS.md``:

- each ``## Step N: name`` section has three levels, opened on purpose: Hint 1 (the idea),
  Hint 2 (the API or the shape that matters), Hint 3 (near-code), as ``<details>`` blocks;
  ``python -m tools.hint`` (``make hint LAB=00 STEP=2 LEVEL=1``) prints one;
- every function the starter leaves to the learner has a step, and its TODO points at it;
- no starter TODO, comment or docstring holds an expression that the solution's body holds
  (beyond the signatures and the given code): the code that solves a function is in the
  hints, at level 3, never in the starter.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

from labs.hints import (
    hint_levels,
    misconception_levels,
    read_steps,
    readme_section,
    steps_of_tests,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = sorted(p for p in (ROOT / "labs").glob("lab-*") if (p / "HINTS.md").is_file())
# Expressions shorter than this (without spaces) are vocabulary, not solutions ("x - m").
MIN_EXPRESSION = 14


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def _squash(text: str) -> str:
    return re.sub(r"[\s`]+", "", text)


def _solution_expressions(fn: ast.FunctionDef) -> set[str]:
    """Every compound expression of the body (calls, arithmetic, indexing), spaces removed."""
    body = fn.body[1:] if ast.get_docstring(fn) else fn.body
    out: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.BinOp | ast.Call | ast.Subscript | ast.Compare | ast.BoolOp):
                text = _squash(ast.unparse(node))
                if len(text) >= MIN_EXPRESSION:
                    out.add(text)
    return out


def _starter_prose(source: str, fn: ast.FunctionDef) -> str:
    """The starter's words for ``fn``: its docstring, the comments and strings of its body."""
    lines = source.splitlines(keepends=True)[fn.lineno - 1 : fn.end_lineno]
    words = [ast.get_docstring(fn) or ""]
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            words.append(tok.string)
    return _squash(" ".join(words))


def _given(source: str) -> str:
    """Code the starter gives, which may repeat the solution: the signatures, the bodies of
    the functions it does not leave to the learner, its module-level statements."""
    tree = ast.parse(source)
    todo = set(_todo_functions(tree))
    given = [ast.unparse(fn.args) for fn in _functions(tree).values()]
    given += [ast.unparse(node) for node in tree.body
              if not (isinstance(node, ast.FunctionDef) and node.name in todo)]
    return _squash(" ".join(given))


def _contract(lab: pathlib.Path) -> str:
    """The README's "What you build (Contract)" section: the contract the learner is given."""
    text = (lab / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^## [^\n]*Contract[^\n]*\n(.*?)(?=^## )", text, re.M | re.S)
    return found[1] if found else ""


def _todo_functions(tree: ast.Module) -> list[str]:
    """The functions the starter leaves to the learner: their body raises
    NotImplementedError, is a kernel's ``tl.static_assert``, or is only ``pass`` (a kernel)."""
    def left(fn: ast.FunctionDef) -> bool:
        body = fn.body[1:] if ast.get_docstring(fn) else fn.body
        return all(isinstance(s, ast.Pass) for s in body) or any(
            isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s) or (
                isinstance(s, ast.Expr) and "static_assert" in ast.unparse(s)) for s in body)
    return [name for name, fn in _functions(tree).items() if left(fn)]


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_step_has_three_levels_of_hints(lab):
    steps = read_steps(lab / "HINTS.md")
    assert steps, f"{lab.name}/HINTS.md has no '## Step N: name' section"
    for number, (title, body) in steps.items():
        levels = hint_levels(body)
        assert sorted(levels) == [1, 2, 3], (
            f"{lab.name}/HINTS.md, step {number} ({title}): expected Hint 1, Hint 2 and Hint 3 "
            f"as <details> blocks, found levels {sorted(levels)}"
        )


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_todo_of_the_starter_points_at_a_step_of_the_hints(lab):
    source = (lab / "starter.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    titles = " ".join(title for title, _ in read_steps(lab / "HINTS.md").values())
    functions = _functions(tree)
    unpointed = [name for name in _todo_functions(tree)
                 if "HINTS.md" not in _starter_prose(source, functions[name])]
    assert not unpointed, f"{lab.name}: the TODOs of {unpointed} do not point at HINTS.md"
    missing = [name for name in _todo_functions(tree) if name not in titles]
    assert not missing, f"{lab.name}/HINTS.md has no step for {missing}"


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_no_starter_todo_or_docstring_holds_the_solutions_code(lab):
    if not (lab / "solution.py").is_file():
        pytest.skip("a student copy: there is no solution.py to compare with")
    starter = (lab / "starter.py").read_text(encoding="utf-8")
    solution = ast.parse((lab / "solution.py").read_text(encoding="utf-8"))
    given = _given(starter) + _squash((lab / "provided.py").read_text(encoding="utf-8"))
    given += _squash(_contract(lab))  # the README's Contract is given, not the solution's code
    starter_tree = ast.parse(starter)
    solved = _functions(solution)
    leaks = []
    for name in _todo_functions(starter_tree):
        prose = _starter_prose(starter, _functions(starter_tree)[name])
        for expression in sorted(_solution_expressions(solved[name])):
            if expression in prose and expression not in given:
                leaks.append(f"{name}: {expression}")
    assert not leaks, (
        f"{lab.name}/starter.py spells out the solution's code (move it to HINTS.md, level 3, "
        f"and say the idea instead): {leaks}"
    )


# ---- the grade report points a failing test at a step and a level (labs/hints.py) ----------


def _squashed_lower(text: str) -> str:
    return " ".join(text.split()).lower()


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_misconception_a_hint_answers_is_one_a_test_of_the_lab_says(lab):
    tests = _squashed_lower("".join(p.read_text(encoding="utf-8") for p in lab.glob("test_*.py")))
    tests += _squashed_lower((ROOT / "common" / "testing.py").read_text(encoding="utf-8"))
    unsaid = [(n, phrase) for n, (_, body) in read_steps(lab / "HINTS.md").items()
              for phrase, level in misconception_levels(body) if phrase.lower() not in tests]
    assert not unsaid, (f"{lab.name}/HINTS.md: 'If a test says \"...\"' names words no test of "
                        f"the lab says, so the grade report never points there: {unsaid}")


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_every_test_of_the_learners_code_points_at_a_step(lab):
    tree = ast.parse((lab / "test_lab.py").read_text(encoding="utf-8"))
    uses_impl = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
                 and fn.name.startswith("test") and any(
                     isinstance(n, ast.Name) and n.id == "impl" for n in ast.walk(fn))}
    steps = steps_of_tests(lab.resolve())
    lost = sorted(name for name in uses_impl if not steps.get(name))
    assert not lost, (f"{lab.name}: these tests call the learner's code but no HINTS.md step "
                      f"names a function they use, so a failure points nowhere: {lost}")


def test_the_grade_report_says_which_hint_level_a_failing_tests_misconception_points_to():
    from grading.run.report import LabResult, Report, TestResult, details, gradescope_results

    lab = "lab-00-online-softmax"
    source = (ROOT / "labs" / lab / "test_lab.py").read_text(encoding="utf-8")
    said = "the accumulator was not rescaled when the running max grew"  # NO_RESCALE_ACC
    assert said in source, "lab 00's rescale misconception changed its words"
    name = "test_the_accumulator_is_rescaled_when_the_running_max_grows[True]"
    cases = [
        (name, f"{said}: max abs diff 0.3", "see: make hint LAB=00 STEP=4 LEVEL=2"),
        # a Triton test of the same misconception: the kernel's step, beside its launcher
        ("test_triton_kernel_matches_the_reference_at_several_tile_shapes[x]", said,
         "see: make hint LAB=00 STEP=6 LEVEL=3"),
        # no misconception named: the idea of the step of the function the test calls
        ("test_naive_attention_equals_the_float64_reference[1]", "NotImplementedError: TODO",
         "see: make hint LAB=00 STEP=1 LEVEL=1"),
    ]
    for test, message, want in cases:
        result = LabResult(lab, [TestResult(f"labs/{lab}/test_lab.py::{test}", test, 2,
                                            "failed", message)])
        text = details(result, ascii_only=True)
        assert want in text, (test, text)
        output = gradescope_results(Report("starter", [result], 1.0))["tests"][0]["output"]
        assert want in output, output
    passed = LabResult(lab, [TestResult(f"labs/{lab}/test_lab.py::{name}", name, 2, "passed")])
    assert "make hint" not in details(passed, ascii_only=True)


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_the_readme_opens_each_step_of_the_hints_in_a_collapsed_section(lab):
    readme = (lab / "README.md").read_text(encoding="utf-8")
    assert readme_section(lab) in readme, (
        f"{lab.name}/README.md: its 'Hints, in levels' section (one <details> per step of "
        "HINTS.md) is missing or stale: paste labs.hints.readme_section(lab) under ## Reference")
    assert readme.index(readme_section(lab)) > readme.index("\n## Reference"), (
        "the hints' section is reference, below ## Reference (the lesson's word budget)")


ALL_LABS = sorted(p for p in (ROOT / "labs").glob("lab-*") if (p / "README.md").is_file())


@pytest.mark.parametrize("lab", ALL_LABS, ids=lambda p: p.name)
def test_say_it_out_loud_asks_the_learner_to_defend_a_design_decision(lab):
    """Every lab leaves at least one decision to the learner (a loop order, a tile plan, the
    state between tiles, where a scale or a sink enters), tested by behaviour only; the
    README's "Say it out loud" asks them to defend it."""
    text = (lab / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^## Say it out loud\n(.*?)(?=^## )", text, re.M | re.S)
    assert found, f"{lab.name}/README.md has no '## Say it out loud' section"
    assert re.search(r"\bdefend\b", found[1], re.I), (
        f"{lab.name}/README.md: 'Say it out loud' asks the learner to defend none of the "
        "decisions the lab leaves to them ('Then defend your ...')")


@pytest.mark.parametrize("lab", ALL_LABS, ids=lambda p: p.name)
def test_every_lab_has_hints_in_levels(lab):
    assert (lab / "HINTS.md").is_file(), (
        f"{lab.name} has no HINTS.md: the hints in levels live there, not in the starter "
        "(CONTRIBUTING.md, 'Adding a lab')")
