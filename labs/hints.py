"""The labs' hints (``labs/<folder>/HINTS.md``), read: the steps, their levels, and which step
and level a failing test points to.

    from labs import hints
    hints.read_steps(path)                       # {step: (title, body)}
    hints.hint_levels(body)                      # {level: text}
    hints.hint_for_test(lab_dir, name, message)  # (step, level) or None

A ``HINTS.md`` has a section ``## Step N: name`` per function (or group of functions) the
learner writes, with three ``<details>`` levels: 1 the idea, 2 the API or the shape that
matters, 3 near-code. A step may say which misconceptions its levels answer, in a sentence
the learner reads too: ``If a test says "not rescaled": hint 2.``

The grade report (``grading/run/report.py``) prints ``see: make hint LAB=NN STEP=S LEVEL=L``
under a failing test: the step and level of the misconception its message names; otherwise
level 1 of the step of the first function the test calls (read from the test file with
``ast``, never imported).
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

STEP = re.compile(r"^## Step (\d+): (.+?)\s*$", re.MULTILINE)
LEVEL = re.compile(
    r"<details[^>]*>\s*<summary>\s*Hint (\d)[^<]*</summary>(.*?)</details>", re.DOTALL
)
POINTS_TO = re.compile(r'If a test says "([^"]+)": hint (\d)')
TEST_FILES = ("test_lab.py",)
# the words of a step's title that are not names: "add_vectors and _add_vectors_kernel"
TITLE_WORDS = {"and", "its", "launcher", "is", "given", "used", "by", "the"}


def read_steps(path: pathlib.Path) -> dict[int, tuple[str, str]]:
    """``{step number: (title, body)}`` of a ``HINTS.md``."""
    text = path.read_text(encoding="utf-8")
    heads = list(STEP.finditer(text))
    steps: dict[int, tuple[str, str]] = {}
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        steps[int(head[1])] = (head[2], text[head.end() : end])
    return steps


def hint_levels(body: str) -> dict[int, str]:
    """``{level: text}`` of one step's ``<details>`` blocks."""
    return {int(m[1]): m[2].strip() for m in LEVEL.finditer(body)}


def step_functions(title: str) -> list[str]:
    """The function names a step's title names: ``"write_kv, gather_kv"`` -> both."""
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", title.replace("`", " "))


def misconception_levels(body: str) -> list[tuple[str, int]]:
    """``[(phrase, level)]`` of a step's ``If a test says "phrase": hint N.`` sentences."""
    return [(m[1], int(m[2])) for m in POINTS_TO.finditer(" ".join(body.split()))]


def _names_used(node: ast.AST) -> list[str]:
    """Attribute names, string constants and called names of ``node``, in source order."""
    found: list[tuple[int, int, str]] = []
    for sub in ast.walk(node):
        pos = (getattr(sub, "lineno", 0), getattr(sub, "col_offset", 0))
        if isinstance(sub, ast.Attribute):
            found.append((*pos, sub.attr))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.append((*pos, sub.value))
        elif isinstance(sub, ast.Name):
            found.append((*pos, sub.id))
    return [name for *_, name in sorted(found)]


@functools.lru_cache(maxsize=64)
def steps_of_tests(lab_dir: pathlib.Path) -> dict[str, list[int]]:
    """``{test function: [steps of the lab functions it uses, first use first]}``, following
    the test file's own helpers one level down."""
    steps = read_steps(lab_dir / "HINTS.md")
    by_name = {fn: n for n, (title, _) in sorted(steps.items()) for fn in step_functions(title)}
    out: dict[str, list[int]] = {}
    for file in TEST_FILES:
        path = lab_dir / file
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs: dict[str, ast.AST] = {n.name: n for n in ast.walk(tree)
                                    if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        # module-level names: tables of cases, and tests bound by assignment
        # (``test_x = bad_input_test(CASES, ...)``)
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        defs.setdefault(target.id, node.value)
        helpers = {n: _names_used(fn) for n, fn in defs.items() if not n.startswith("test")}
        kernels = [n for n, (title, _) in sorted(steps.items())
                   if any(f.endswith("_kernel") for f in step_functions(title))]
        for name, fn in defs.items():
            if not name.startswith("test"):
                continue
            used, todo, seen = [], list(_names_used(fn)), set()
            while todo:  # the test's words, then its helpers' words, transitively
                word = todo.pop(0)
                used.append(word)
                if word in helpers and word not in seen:
                    seen.add(word)
                    todo += helpers[word]
            found = list(dict.fromkeys(by_name[w] for w in used if w in by_name))
            # the graded compile names no function: it compiles the lab's kernels
            out[name] = found or (kernels if "compile" in name else [])
    return out


def hint_for_test(lab_dir: pathlib.Path, test_name: str, message: str = "",
                  ) -> tuple[int, int] | None:
    """``(step, level)`` a failing test points to, or ``None`` (the lab has no ``HINTS.md``
    or the test uses none of its steps' functions). ``test_name`` may carry its parameters
    (``test_x[case]``); ``message`` is its failure message."""
    lab_dir = pathlib.Path(lab_dir).resolve()
    if not (lab_dir / "HINTS.md").is_file():
        return None
    steps = read_steps(lab_dir / "HINTS.md")
    called = steps_of_tests(lab_dir).get(test_name.split("[", 1)[0], [])
    said = " ".join(message.split()).lower()
    matches = [(n, level) for n, (_, body) in sorted(steps.items())
               for phrase, level in misconception_levels(body) if phrase.lower() in said]
    # the steps the test calls first, then the nearest to them (a kernel beside its launcher)
    matches.sort(key=lambda m: min([abs(m[0] - c) for c in called] or [0]))
    if matches:
        return matches[0]
    return (called[0], 1) if called else None


def hint_command(lab_dir: pathlib.Path, test_name: str, message: str = "") -> str:
    """``"make hint LAB=00 STEP=2 LEVEL=2"`` for a failing test, or ``""``."""
    found = hint_for_test(lab_dir, test_name, message)
    if found is None:
        return ""
    number = pathlib.Path(lab_dir).name.split("-")[1]
    return f"make hint LAB={number} STEP={found[0]} LEVEL={found[1]}"


def readme_section(lab_dir: pathlib.Path) -> str:
    """The README's collapsible pointers to the hints, one ``<details>`` per step (made from
    ``HINTS.md``; ``tests/test_hints.py`` checks that each README holds its own)."""
    lab_dir = pathlib.Path(lab_dir)
    number = lab_dir.name.split("-")[1]
    lines = ["### Hints, in levels", "",
             "Stuck on a function? Open its step. Level 1 is the idea, 2 the API and the shapes,",
             "3 near-code; each level stays closed until you ask for it. Failing tests point to",
             f"one: `make grade LAB={number}` prints `see: make hint LAB={number} STEP=S LEVEL=L`.",
             ""]
    for n, (title, _) in read_steps(lab_dir / "HINTS.md").items():
        names = ", ".join(f"<code>{name}</code>" for name in step_functions(title)
                          if name not in TITLE_WORDS)
        lines += [f"<details><summary>Step {n}: {names}</summary>", "",
                  f"`make hint LAB={number} STEP={n} LEVEL=1` (the idea), then `LEVEL=2` (the API),"
                  f" then `LEVEL=3` (near-code); or read step {n} of [HINTS.md](HINTS.md).", "",
                  "</details>", ""]
    return "\n".join(lines)
