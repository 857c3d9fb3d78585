"""Write the visualisations' traces: the labs' own code run on the pages' small inputs.

    python -m book.traces                    # the reference (solution.py): book/viz/traces/
    python -m book.traces --impl starter --lab 00 --out build/traces
                                             # your starter.py, compared with the reference

A trace is a JavaScript file that sets ``window.BOOK_TRACES[<name>]`` to plain JSON data (a
script, not a ``fetch``, so the pages also work from ``file://``). The pages only play
traces back: every number they show was computed here by a lab's public functions, or is
plain arithmetic on such numbers (counters, differences), never by JavaScript re-doing
what a lab computes.

Each lab's traces live beside its figures, in ``labs/<lab>/traces.py`` (which labs have one,
and which pages a trace feeds: their ``lab.toml``, read by ``labs/manifest.py``): ``trace``
(the lab's trace), ``diff`` (a starter's first difference), ``PAGE_DIFFS`` (one per page,
where a trace feeds several) and ``EXTRA`` (reference-only traces of other pages). This
file runs them and writes the scripts.

A starter trace carries ``first_diff``: the first step where the learner's run differs from
the reference trace (same inputs), or where their code raised.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from book import kernel_traces  # noqa: E402
from common.loader import load_impl, load_lab_module  # noqa: E402
from labs import manifest  # noqa: E402

# The labs with a trace and the labs `make trace` runs on a starter (labs/manifest.py).
LABS = {e.number: e.folder for e in manifest.traced("reference")}
TRACEABLE = tuple(sorted(e.number for e in manifest.traced("starter")))
REFERENCE_DIR = REPO / "book" / "viz" / "traces"


# ---- the labs' traces (labs/<lab>/traces.py) -------------------------------------------------


def lab_traces(lab: str) -> ModuleType:
    """``labs/<lab>/traces.py`` of lab ``lab`` ("04"), imported once."""
    return load_lab_module(REPO / "labs" / LABS[lab], "traces")


BUILDERS: dict[str, Callable[[Any], dict]] = {n: lab_traces(n).trace for n in LABS}
DIFFS = {n: lab_traces(n).diff for n in TRACEABLE}
# Reference-only traces of other pages: name -> (lab, builder).
EXTRA = {name: (n, builder) for n in LABS
         for name, builder in getattr(lab_traces(n), "EXTRA", {}).items()}
# Labs whose trace feeds several pages: each page shows its own first difference.
PAGE_DIFFS = {n: lab_traces(n).PAGE_DIFFS for n in LABS if hasattr(lab_traces(n), "PAGE_DIFFS")}
# The Triton kernels, through the interpreter (book/kernel_traces.py): the kernel-traces page
# and the command line say where the first difference is (make trace LAB=09, LAB=00 KERNEL=1).
KERNEL_TRACES = {
    "09": ("lab-09-triton-primer", kernel_traces.trace_lab09, kernel_traces.diff_lab09),
    "00-kernel": ("lab-00-online-softmax", kernel_traces.trace_lab00_kernel,
                  kernel_traces.diff_lab00_kernel),
}
for _n, (_folder, _builder, _diff) in KERNEL_TRACES.items():
    LABS[_n], BUILDERS[_n], DIFFS[_n] = _folder, _builder, _diff
TRACEABLE = (*TRACEABLE, *KERNEL_TRACES)


# ---- writing the scripts ------------------------------------------------------------------


def as_script(name: str, data: dict) -> str:
    body = json.dumps(data, separators=(",", ":"), sort_keys=True)
    return ("window.BOOK_TRACES = window.BOOK_TRACES || {};\n"
            f"window.BOOK_TRACES[{json.dumps(name)}] = {body};\n")


def model_trace_main(name: str, build_trace: Callable[[], dict], doc: str,
                     argv: list[str] | None = None) -> int:
    """The command line of a trace built from a trained model (``book.attention_trace``,
    ``book.alignment_trace``, ``book.approximation_trace``): ``--out`` folder, one script."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=REFERENCE_DIR)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.js").write_text(as_script(name, build_trace()))
    print(f"   wrote {args.out / f'{name}.js'}")
    return 0


def read_script(path: pathlib.Path, parse_float: Callable[[str], Any] = float) -> dict | None:
    """The trace a ``window.BOOK_TRACES[...] = {...};`` script holds (numbers: ``parse_float``)."""
    text = path.read_text()
    return json.loads(text.split("] = ", 1)[1].rstrip().rstrip(";"), parse_float=parse_float)


def fresh_run(folder: pathlib.Path, impl_name: str, builder: Callable[[Any], dict]) -> dict:
    """``builder`` on ``folder``'s ``impl_name`` module, imported afresh: the lab's modules
    are cached by the folder's name, and a copy of the folder (a test's) has the same name.
    The modules cached before are put back afterwards."""
    prefix = folder.name.replace("-", "_") + "."
    saved = {n: m for n, m in sys.modules.items() if n.startswith(prefix)}
    for name in saved:
        del sys.modules[name]
    try:
        return builder(load_impl(folder, impl_name))
    finally:
        for name in [n for n in sys.modules if n.startswith(prefix)]:
            del sys.modules[name]
        sys.modules.update(saved)


def build(lab: str, impl_name: str, lab_dir: pathlib.Path | None = None) -> dict:
    """The trace of ``lab`` run with ``impl_name`` (``solution`` or ``starter``) from
    ``lab_dir`` (default: the repository's lab folder)."""
    folder = lab_dir or REPO / "labs" / LABS[lab]
    try:
        data = fresh_run(folder, impl_name, BUILDERS[lab])
    except Exception as e:  # noqa: BLE001 - a starter that does not even import
        return {"lab": lab, "impl": impl_name, "import_error": str(e),
                "first_diff": {"step": 0, "field": "import", "where": "import", "yours": str(e),
                               "reference": None}}
    data["impl"] = impl_name
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", default="solution", choices=("solution", "starter"))
    ap.add_argument("--lab", action="append",
                    help=f"{', '.join(sorted(LABS))} (default: all)")
    ap.add_argument("--lab-dir", type=pathlib.Path, help="the lab folder to load (tests)")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    ap.add_argument("--kernel", action="store_true",
                    help="lab 00: trace the Triton kernel instead of the numpy functions")
    args = ap.parse_args(argv)
    labs = args.lab or (list(BUILDERS) if args.impl == "solution" else list(TRACEABLE))
    out = args.out or (REFERENCE_DIR if args.impl == "solution" else REPO / "build" / "traces")
    out.mkdir(parents=True, exist_ok=True)
    if args.impl == "solution" and not args.lab:
        for name, (lab, builder) in EXTRA.items():
            data = fresh_run(REPO / "labs" / LABS[lab], "solution", builder)
            path = out / f"{name}-reference.js"
            path.write_text(as_script(f"{name}-reference", data))
            print(f"   wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    for lab in labs:
        lab = lab if lab in BUILDERS else lab.removeprefix("lab-")[:2]
        if args.kernel and lab == "00":
            lab = "00-kernel"
        if lab not in BUILDERS or (args.impl == "starter" and lab not in TRACEABLE):
            print(f"!! no trace for lab {lab}: make trace works for labs {', '.join(TRACEABLE)}")
            return 2
        data = build(lab, args.impl, args.lab_dir)
        name = f"lab{lab}-{'reference' if args.impl == 'solution' else 'starter'}"
        if args.impl == "starter":
            ref = read_script(REFERENCE_DIR / f"lab{lab}-reference.js")
            if "first_diff" not in data:
                data["first_diff"] = DIFFS[lab](data, ref)
                data["page_diffs"] = {page: fn(data, ref)
                                      for page, fn in PAGE_DIFFS.get(lab, {}).items()}
            diff = data["first_diff"]
            print(f">> lab {lab}: " + ("your trace matches the reference at every step"
                  if diff is None else f"first difference at step {diff['step'] + 1} "
                  f"({diff['where']}): {diff['field']}"))  # steps from 1, as on the page
        path = out / f"{name}.js"
        path.write_text(as_script(name, data))
        print(f"   wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        if args.impl == "starter" and diff is not None and lab in KERNEL_TRACES:
            print(f"   yours: {diff['yours']}\n   reference: {diff['reference']}")
        if args.impl == "starter" and args.out is None:
            _show_in_book(path, lab)
    return 0


def _show_in_book(path: pathlib.Path, lab: str) -> None:
    """Put the learner's trace into the built book, if there is one, and say which pages."""
    pages = ("kernel-traces",) if lab in KERNEL_TRACES else manifest.lab(lab).trace_pages
    book = REPO / "build" / "book" / "viz"
    names = " and ".join(f"build/book/viz/{page}.html" for page in pages)
    if (book / "traces").is_dir():
        shutil.copyfile(path, book / "traces" / path.name)
        print(f">> reload {names}: {'they show' if len(pages) > 1 else 'it shows'} your run "
              "beside the reference")
    else:
        print(f">> run `make book`, then open {names}")


if __name__ == "__main__":
    raise SystemExit(main())
