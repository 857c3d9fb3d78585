"""One hint of a lab, at the level you ask for: ``python -m tools.hint LAB STEP [LEVEL]``.

    make hint LAB=00                    the steps of lab 00 that have hints
    make hint LAB=00 STEP=2 LEVEL=1     step 2's first hint: the idea
    make hint LAB=09 STEP=online_softmax LEVEL=2

Each lab's ``HINTS.md`` has a section ``## Step N: name`` per function you write, with three
levels: 1 the idea, 2 the API or the shape that matters, 3 near-code. The same file reads
on GitHub and in the web book as collapsed sections; this prints one level, so the next one
stays unread until you ask for it.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from labs.hints import hint_levels, read_steps, step_functions

__all__ = ["hint_levels", "main", "read_steps"]

ROOT = pathlib.Path(__file__).resolve().parents[1]


def lab_dir(lab: str) -> pathlib.Path:
    found = sorted((ROOT / "labs").glob(f"lab-{lab.zfill(2)}*")) if lab.isdigit() else [
        ROOT / "labs" / lab]
    if not found or not (found[0] / "HINTS.md").is_file():
        raise SystemExit(f"LAB={lab}: no lab with a HINTS.md (labs/lab-{lab}*/HINTS.md)")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.hint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lab", help="00, 09, ... or the lab folder's name")
    parser.add_argument("step", nargs="?", help="a step number or its function's name")
    parser.add_argument("level", nargs="?", type=int, default=1, help="1, 2 or 3 (default 1)")
    args = parser.parse_args(argv)
    lab = lab_dir(args.lab)
    steps = read_steps(lab / "HINTS.md")
    if not args.step:
        print(f"{lab.name}: hints for")
        for number, (title, _) in steps.items():
            print(f"  STEP={number}  {title}")
        print("then: make hint LAB=.. STEP=.. LEVEL=1 (the idea), 2 (the API, the shapes), "
              "3 (near-code)")
        return 0
    chosen = [n for n, (title, _) in steps.items()
              if args.step == str(n) or args.step in step_functions(title)]
    if not chosen:
        print(f"STEP={args.step}: no such step in {lab.name}/HINTS.md (make hint "
              f"LAB={args.lab} lists them)", file=sys.stderr)
        return 2
    title, body = steps[chosen[0]]
    levels = hint_levels(body)
    if args.level not in levels:
        print(f"LEVEL={args.level}: step {chosen[0]} has levels {sorted(levels)}", file=sys.stderr)
        return 2
    print(f"{lab.name}, step {chosen[0]} ({title}), hint {args.level} of {max(levels)}:\n")
    print(levels[args.level])
    return 0


if __name__ == "__main__":
    sys.exit(main())
