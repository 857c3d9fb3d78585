"""The lessons show their visualisations: each lab README with book pages embeds a static
picture of one (``book/screenshots/``, made by ``python -m book.screenshots`` from the built
book) with a link to the live page; every picture exists and is used; and the numbers a
README copies from a trained model's trace are the trace's."""

from __future__ import annotations

import pathlib
import re

from book.screenshots import SHOTS
from book.traces import read_script
from labs import manifest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHOT_DIR = ROOT / "book" / "screenshots"
IMAGE = re.compile(r"!\[[^\]]*\]\((\.\./\.\./book/screenshots/[^)\s]+\.png)\)")


def pictures(readme: pathlib.Path) -> list[str]:
    return IMAGE.findall(readme.read_text(encoding="utf-8"))


def test_every_lab_with_a_visualisation_shows_one_in_its_readme_with_a_live_link():
    for entry in manifest.labs():
        pages = {p.name for p in entry.pages}
        if not pages:
            continue
        readme = entry.dir / "README.md"
        shots = [pathlib.Path(p).stem for p in pictures(readme)]
        text = readme.read_text(encoding="utf-8")
        assert set(shots) & pages, f"{readme.relative_to(ROOT)} embeds no picture of {pages}"
        for name in set(shots) & pages:
            assert f"../../book/pages/{name}.md" in text, \
                f"{readme.relative_to(ROOT)}: the picture of {name} needs a link to the live page"


def test_every_readme_picture_exists_and_every_screenshot_is_used():
    used = set()
    for readme in sorted((ROOT / "labs").glob("*/README.md")):
        for rel in pictures(readme):
            path = (readme.parent / rel).resolve()
            assert path.is_file(), f"{readme.relative_to(ROOT)} shows {rel}, which is missing"
            used.add(path.stem)
    made = {p.stem for p in SHOT_DIR.glob("*.png")}
    assert made == set(SHOTS), f"book/screenshots/ vs book.screenshots.SHOTS: {made ^ set(SHOTS)}"
    assert made <= used, f"screenshots no README shows: {sorted(made - used)}"


def test_lab_10s_table_of_a_trained_models_heads_is_the_trace():
    ref = read_script(ROOT / "book" / "viz" / "traces" / "adder-approx-reference.js")
    text = next((ROOT / "labs").glob("lab-10-*/README.md")).read_text(encoding="utf-8")
    for s, r in zip(ref["spectrum"], ref["retrieval"]):
        row = (f"| {s['layer']}.{s['head']} | {s['rank90']} | "
               + " | ".join(f"{r['error'][m]:.3g}" for m in ref["methods"]) + " |")
        assert row in text, f"lab 10's README is stale for head {s['layer']}.{s['head']}: {row}"
