"""Turning an exception into one readable message: the misconception, never a traceback.

``NotImplementedError: TODO ...`` / ``(raised at starter.py:42, in merge)`` /
``Failing test case: test_merge(a=..., b=...)``; and the gist of a collection error.
"""

from __future__ import annotations

import builtins
import re
import traceback
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the grading run imports this module too, and needs no pytest
    import pytest

from grading.plugin.time_limits import CollectionTimeout, PerTestTimeout

MAX_LINES = 12
MAX_CHARS = 1500

# Python 3.11+; on 3.10 nothing is a group (hypothesis then raises its own error types).
_GROUP: Any = getattr(builtins, "BaseExceptionGroup", ())


def describe_exception(excinfo: pytest.ExceptionInfo, lab_dir: Path, test_file: str) -> str:
    """The exception's first lines, where the graded code raised it, hypothesis' example.

    ``NotImplementedError: TODO ...`` / ``(raised at starter.py:42, in merge)`` /
    ``Failing test case: test_merge(a=..., b=...)``: a message, never a traceback.
    """
    exc = excinfo.value
    extra = ""
    if isinstance(exc, _GROUP):  # hypothesis: several distinct failures
        leaves = _leaves(exc)
        exc = leaves[0]
        if len(leaves) > 1:
            extra = f"\n(and {len(leaves) - 1} more distinct failure(s))"
    notes = [str(n) for n in getattr(exc, "__notes__", None) or []]
    lines = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    note_lines = sum(len(n.splitlines()) for n in notes)
    text = "\n".join(lines[: len(lines) - note_lines] if note_lines < len(lines) else lines)
    if isinstance(exc, PerTestTimeout) or getattr(exc, "plain_message", False):
        text = str(exc)  # the grader's own words (a sandboxed call that timed out or crashed)
    elif isinstance(exc, SystemExit):
        text = (
            f"the graded code called sys.exit({exc.code!r}) (SystemExit): functions must "
            "return their result, never exit"
        )
    text = clip(tidy(text), max_lines=8)
    # a sandboxed worker's exception says where it was raised (grading.plugin.remote)
    where = getattr(exc, "__graded_where__", None) or _where(exc.__traceback__, lab_dir, test_file)
    if where and not isinstance(exc, AssertionError):
        text += f"\n  (raised at {where})"
    for note in notes:
        note = _one_line(tidy(note))
        if note:
            text += "\n" + (note if len(note) <= 300 else note[:300] + " [...]")
    return text + extra


def _one_line(note: str) -> str:
    """hypothesis' multi-line example ``f(\\n    x=1,  # or any ...\\n)`` -> ``f(x=1)``."""
    note = re.sub(r"\s+#[^\n]*", "", note)  # comments hypothesis adds to arguments
    note = " ".join(note.split())
    note = re.sub(r"\(\s+", "(", note)
    return re.sub(r",?\s*\)", ")", note)


def _leaves(group: Any) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, _GROUP) else [e])
    return out


def _frames(tb: types.TracebackType | None):
    while tb is not None:
        yield tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name
        tb = tb.tb_next


def _is_graded_file(filename: str, lab_dir: Path, test_file: str) -> bool:
    path = Path(filename)
    try:
        path.resolve().relative_to(lab_dir.resolve())
    except (ValueError, OSError):
        return False
    return path.name != test_file and path.name != "conftest.py"


def _where(tb: types.TracebackType | None, lab_dir: Path, test_file: str) -> str | None:
    """``starter.py:42, in online_softmax``: the innermost frame of the graded code."""
    found = None
    for filename, lineno, func in _frames(tb):
        if _is_graded_file(filename, lab_dir, test_file):
            found = f"{Path(filename).name}:{lineno}, in {func}"
    return found


def raised_in_graded_code(excinfo: pytest.ExceptionInfo, lab_dir: Path, test_file: str) -> bool:
    return any(
        _is_graded_file(f, lab_dir, test_file) for f, _, _ in _frames(excinfo.value.__traceback__)
    )


def tidy(text: str) -> str:
    """Drop what changes from run to run or only helps a debugger (addresses, blobs)."""
    text = re.sub(
        r"<(function|bound method|built-in function) ([\w.]+)[^>]* at 0x[0-9a-f]+>", r"\2", text
    )
    text = re.sub(r" at 0x[0-9a-f]+", "", text)
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith(("You can reproduce this example", "You can reproduce this test"))
    ]
    return "\n".join(lines)


def clip(text: str, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> str:
    """At most ``max_lines`` lines and ``max_chars`` characters, marked when cut."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    cut = len(lines) > max_lines
    text = "\n".join(lines[:max_lines])
    if len(text) > max_chars:
        text, cut = text[:max_chars], True
    return text + (" [...]" if cut else "")


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Timeout)\b.*)$")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_SHORT_LINE = re.compile(r"^(\S+\.py):(\d+): in ")


def summarize_collect_error(text: str) -> str:
    """The gist of a collection error report: the exception line and the graded file's line.

    pytest reports an import failure as text (``E   SyntaxError: ...`` after a short
    traceback); keep the last exception line and the last ``File "...", line N`` that is
    not in the standard library or site-packages.
    """
    lines = [re.sub(r"^E\s{1,3}", "", line.rstrip()) for line in text.splitlines()]
    exc_line = next((m.group(1) for m in map(_EXC_LINE.match, reversed(lines)) if m), None)
    where = None
    for line in lines:
        m = _FILE_LINE.search(line) or _SHORT_LINE.match(line)
        if m and not re.search(r"site-packages|/lib/python|^<|(^|/)common/", m.group(1)):
            where = f"{Path(m.group(1)).name}:{m.group(2)}"
    if exc_line is not None:
        exc_line = exc_line.replace(
            f"{CollectionTimeout.__module__}.{CollectionTimeout.__name__}: ", ""
        )
    if exc_line is None:
        nonblank = [line for line in lines if line.strip()]
        return clip("\n".join(nonblank[-MAX_LINES:]))
    return clip(exc_line + (f"\n  (at {where})" if where else ""))


def import_problem(summary: str) -> str:
    """The report line for tests that could not be imported: when the error is in the graded
    file itself (a syntax error in starter.py), say so, not "could not import the tests"."""
    graded = re.search(r"\(at ((?:starter|solution)\.py):\d+\)", summary)
    if graded:
        return f"{graded.group(1)} cannot be imported, so no test could run: {summary}"
    return f"could not import the tests: {summary}"
