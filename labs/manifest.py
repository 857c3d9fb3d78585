"""The course's labs: the learner path (one line per lab) and each lab's ``lab.toml``.

    from labs import manifest
    manifest.labs()                 # every Lab, in learner-path order
    manifest.lab("04")              # by number (or folder name)

``PATH`` is the one ordered list: the learner path of the top README and the book's order.
Everything else about a lab is declared in its own folder, ``labs/<folder>/lab.toml``
(CONTRIBUTING.md, "Adding a lab", lists the keys); ``bench/``, ``book/``, the grader's
compile check, the Makefile and the tests read it from here. ``tests/test_manifest.py``
fails when a lab folder is missing from ``PATH`` (or has no ``lab.toml``), when ``PATH``
names a folder that is not there, and when a declaration disagrees with the tree.

    python -m labs.manifest [KEY]   # print the manifest (or one key per lab: starter_trace)
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
import sys
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, the backport pytest itself depends on there
    import tomli as tomllib  # type: ignore[no-redef]

LABS_DIR = pathlib.Path(__file__).resolve().parent

# The learner path, in order: adding a lab is one line here (plus its own folder).
PATH: tuple[str, ...] = (
    "lab-08-attention-from-scratch",
    "lab-10-approximate-attention",
    "lab-09-triton-primer",
    "lab-00-online-softmax",
    "lab-01-paged-attention-gather",
    "lab-03-causal-prefill-attention",
    "lab-04-flash-decoding-partitions",
    "lab-02-backend-selection",
    "lab-05-flash-attention-backward",
    "lab-06-mla-window-sinks",
    "lab-07-kv-block-manager",
    "lab-11-serving-engine",
    "lab-12-fp8-kv-and-cascade",
)

TRACKS = ("core", "advanced")
TRACES = ("", "reference", "starter")


@dataclasses.dataclass(frozen=True)
class Page:
    """A visualisation of the book: ``book/pages/<name>.md`` and ``book/viz/<name>.js``."""

    name: str
    title: str


@dataclasses.dataclass(frozen=True)
class Lab:
    """One lab's declaration (``labs/<folder>/lab.toml``)."""

    folder: str  # "lab-04-flash-decoding-partitions"
    title: str  # the short name the learner path and the book show: "flash-decoding"
    track: str  # "core" or "advanced"
    step: int  # 1-based position on the learner path (PATH)
    # the book (book/README.md): "" no trace; "reference": labs/<folder>/traces.py builds the
    # reference trace; "starter": `make trace LAB=NN` runs it on the learner's starter too
    trace: str = ""
    pages: tuple[Page, ...] = ()  # the visualisations this lab owns, in nav order
    trace_pages: tuple[str, ...] = ()  # the pages a learner's trace shows on (make trace)
    extra_traces: tuple[str, ...] = ()  # reference-only traces of other pages this lab builds
    # the kernels: bench/kernels.py entries (make bench) and the @triton.jit kernels of
    # bench/gpu_kernels.py (make gpu-report; make grade compiles them for sm_90)
    bench: tuple[str, ...] = ()
    triton: tuple[str, ...] = ()
    # the graded compile's 64-bit-offset rule (grading/plugin/compile_check.py): extra pointer
    # arguments (a regex) that address more than 2^31 elements at production sizes, or
    # small_tensors = true where every tensor stays below 2^31 elements (no rule)
    big_pointers: str = ""
    small_tensors: bool = False
    # the grade (grading/sandbox/zygote.py's seed): libraries both the tests and the graded
    # code import (lab 11: transformers' Llama), imported once in the process the test
    # process and the sandbox are forked from, instead of once in each
    preload: tuple[str, ...] = ()

    @property
    def number(self) -> str:
        """``"04"``."""
        return self.folder.split("-")[1]

    @property
    def dir(self) -> pathlib.Path:
        return LABS_DIR / self.folder


_KEYS = {
    "": {"title", "track", "book", "kernels", "compile", "grade"},
    "book": {"trace", "pages", "trace_pages", "extra_traces"},
    "kernels": {"bench", "triton"},
    "compile": {"big_pointers", "small_tensors"},
    "grade": {"preload"},
}


def _check_keys(where: str, data: dict[str, Any]) -> None:
    for table, allowed in _KEYS.items():
        section = data.get(table, {}) if table else data
        if not isinstance(section, dict):
            raise ValueError(f"{where}: [{table}] must be a table")
        unknown = set(section) - allowed
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)} in "
                             f"[{table or 'top level'}] (allowed: {sorted(allowed)})")


def _names(where: str, section: dict[str, Any], key: str) -> tuple[str, ...]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _pages(where: str, book: dict[str, Any]) -> tuple[Page, ...]:
    pages = []
    for page in book.get("pages", []):
        if not isinstance(page, dict) or set(page) != {"name", "title"}:
            raise ValueError(f"{where}: each [book] page is {{ name = ..., title = ... }}")
        pages.append(Page(page["name"], page["title"]))
    return tuple(pages)


def parse(folder: str, text: str, step: int) -> Lab:
    """The ``Lab`` of ``folder`` from its ``lab.toml`` text; ``ValueError`` naming the key
    that is unknown, missing or of the wrong kind."""
    where = f"labs/{folder}/lab.toml"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{where}: not valid TOML: {e}") from e
    _check_keys(where, data)
    book, kernels, comp = data.get("book", {}), data.get("kernels", {}), data.get("compile", {})
    if not isinstance(data.get("title"), str) or not data["title"]:
        raise ValueError(f"{where}: title must be a non-empty string")
    if data.get("track", "core") not in TRACKS:
        raise ValueError(f"{where}: track must be one of {TRACKS}, got {data.get('track')!r}")
    if book.get("trace", "") not in TRACES:
        raise ValueError(f"{where}: [book] trace must be one of {TRACES}")
    big = comp.get("big_pointers", "")
    try:
        re.compile(big)
    except (re.error, TypeError) as e:
        raise ValueError(f"{where}: [compile] big_pointers is not a regex: {e}") from e
    return Lab(folder=folder, title=data["title"], track=data.get("track", "core"), step=step,
               trace=book.get("trace", ""), pages=_pages(where, book),
               trace_pages=_names(where, book, "trace_pages"),
               extra_traces=_names(where, book, "extra_traces"),
               bench=_names(where, kernels, "bench"), triton=_names(where, kernels, "triton"),
               big_pointers=big, small_tensors=bool(comp.get("small_tensors", False)),
               preload=_names(where, data.get("grade", {}), "preload"))


@functools.cache
def _load(labs_dir: pathlib.Path) -> tuple[Lab, ...]:
    out = []
    for step, folder in enumerate(PATH, start=1):
        path = labs_dir / folder / "lab.toml"
        if path.is_file():  # a lab the tree does not hold (tests/test_manifest.py says so)
            out.append(parse(folder, path.read_text(encoding="utf-8"), step))
    return tuple(out)


def labs(labs_dir: pathlib.Path = LABS_DIR) -> tuple[Lab, ...]:
    """Every lab of ``PATH`` that has a ``lab.toml``, in learner-path order."""
    return _load(labs_dir)


def lab(key: str) -> Lab:
    """The lab numbered ``key`` (``"4"``, ``"04"``, ``"lab-04"``) or of folder ``key``;
    ``KeyError`` naming the labs there are."""
    number = key.removeprefix("lab-")[:2].zfill(2) if key[:1].isdigit() or key.startswith(
        "lab-") else key
    for entry in labs():
        if key == entry.folder or number == entry.number:
            return entry
    raise KeyError(f"no lab {key!r} in labs/manifest.py (labs: "
                   f"{', '.join(e.number for e in labs())})")


def traced(kind: str = "reference") -> tuple[Lab, ...]:
    """Labs with a reference trace (``kind="reference"``: every traced lab) or whose starter
    ``make trace`` runs (``"starter"``), in learner-path order."""
    return tuple(e for e in labs() if e.trace == "starter" or (e.trace and kind == "reference"))


def pages() -> tuple[tuple[Page, Lab], ...]:
    """Every visualisation with the lab that owns it, in learner-path order."""
    return tuple((page, e) for e in labs() for page in e.pages)


def main(argv: list[str] | None = None) -> int:
    """Print each lab (``number folder``), or one key per lab (``starter_trace``: the
    numbers ``make trace`` accepts, for the Makefile)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["starter_trace"]:
        print(" ".join(e.number for e in traced("starter")))
        return 0
    for e in labs():
        print(f"{e.step:>2} {e.number} {e.folder} ({e.track}): {e.title}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
