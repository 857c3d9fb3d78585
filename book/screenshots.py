"""Static pictures of the visualisations, for the lab READMEs: ``python -m book.screenshots``.

GitHub and a learner's editor cannot run a page's scripts, so each lab README shows a
screenshot of its visualisation at the point it teaches, with a link to the live page.
This script builds nothing itself: it opens the built book (``make book`` first) in
headless Chromium (Debian's package, through Playwright, as ``tests/test_book.py`` does),
drives each page to a chosen step, and saves the visualisation's box as
``book/screenshots/<page>.png`` (light scheme, 1100 pixels wide). ``SHOTS`` says which
pages and steps; ``tests/test_readme_screenshots.py`` checks that every README picture exists
and that every screenshot is used.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil

REPO = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO / "book" / "screenshots"
# page -> number of "Step" presses before the picture (the moment the README teaches)
SHOTS = {
    "flash-attention-tiling": 5,
    "paged-attention-blocks": 3,
    "split-kv-merge": 2,
    "kv-cache-evolution": 0,
    "attention-scoring-functions": 0,
    "bahdanau-trained-alignment": 10,
    "attention-multihead-self": 0,
    "attention-pattern-zoo": 0,
    "approximations-on-a-trained-model": 0,
}
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--book", type=pathlib.Path, default=REPO / "build" / "book")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or not (args.book / "index.html").is_file():
        raise SystemExit("needs Debian's chromium and a built book (make book)")
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        ctx = browser.new_context(viewport={"width": 1100, "height": 900}, color_scheme="light",
                                  reduced_motion="reduce")
        for name, steps in SHOTS.items():
            page = ctx.new_page()
            page.goto((args.book / "viz" / f"{name}.html").as_uri())
            page.wait_for_load_state("load")
            # the site's fixed header would cover the top of a tall visualisation
            page.add_style_tag(content=".md-header, .viz-starter { display: none !important; }")
            viz = page.locator(".viz").last if name in (
                "attention-multihead-self",) else page.locator(".viz").first
            for _ in range(steps):
                viz.locator("[data-action=step]").first.click()
            page.mouse.move(0, 0)  # no button tooltip in the picture
            page.evaluate("document.activeElement && document.activeElement.blur()")
            page.wait_for_timeout(600)
            viz.screenshot(path=str(args.out / f"{name}.png"))
            page.close()
            print(f"   wrote {args.out / f'{name}.png'}")
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
