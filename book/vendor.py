"""Vendor the book's third-party scripts: D3 (its modules) and KaTeX, pinned by npm.

    python -m book.vendor        (make vendor; needs npm and the npm registry)

``book/vendor/package.json`` pins the packages and ``package-lock.json`` their exact
tarballs; this runs ``npm ci --ignore-scripts`` in ``book/vendor/`` (into its
``node_modules/``, which git ignores) and copies their browser builds into
``book/viz/vendor/``, which is committed, so that building the book needs no npm:

- ``d3/d3-core.min.js`` (selections and transitions, with what they import) and
  ``d3/d3-scale.min.js`` (scales and axes, with what they import): the UMD builds of the
  D3 modules the pages use, concatenated in dependency order (both extend one global
  ``d3``; a page that only animates loads the first, about 18 KB gzipped; one with axes
  both); each module keeps its own version banner. ``d3/LICENSES.txt``: their ISC licences.
- ``katex/``: ``katex.min.js``, ``katex.min.css``, the ``woff2`` fonts (every browser the
  book supports reads woff2; the CSS's woff and ttf fallbacks are never fetched) and
  ``LICENSE``.

``VERSIONS`` lists what was copied (``name version``), read by a test that checks the
files still carry those versions.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

BOOK = pathlib.Path(__file__).resolve().parent
PINS = BOOK / "vendor"
OUT = BOOK / "viz" / "vendor"
# UMD order: each module after the ones it imports (they all extend one global `d3`);
# d3-scale.min.js is loaded after d3-core.min.js (d3-scale imports d3-interpolate)
D3_FILES = {"d3-core.min.js": ("d3-color", "d3-dispatch", "d3-ease", "d3-interpolate",
                               "d3-selection", "d3-timer", "d3-transition"),
            "d3-scale.min.js": ("d3-array", "d3-format", "d3-scale", "d3-axis")}
D3_MODULES = tuple(m for mods in D3_FILES.values() for m in mods)


def versions() -> dict[str, str]:
    """The pinned ``{package: version}`` of ``book/vendor/package.json``."""
    return json.loads((PINS / "package.json").read_text())["dependencies"]


def copy(modules: pathlib.Path, out: pathlib.Path = OUT) -> dict[str, str]:
    """Copy the browser builds from an installed ``node_modules`` into ``out``."""
    pins = versions()
    d3 = out / "d3"
    shutil.rmtree(d3, ignore_errors=True)
    d3.mkdir(parents=True)
    licences = []
    for file, names in D3_FILES.items():
        parts = []
        for name in names:
            installed = json.loads((modules / name / "package.json").read_text())["version"]
            if installed != pins[name]:
                raise ValueError(f"{name}: node_modules has {installed}, package.json pins "
                                 f"{pins[name]}: run npm ci in book/vendor")
            parts.append((modules / name / "dist" / f"{name}.min.js").read_text().strip())
            licences.append(f"== {name} {installed} ==\n"
                            + (modules / name / "LICENSE").read_text().strip())
        (d3 / file).write_text("\n".join(parts) + "\n")
    (d3 / "LICENSES.txt").write_text("\n\n".join(licences) + "\n")
    katex = out / "katex"
    shutil.rmtree(katex, ignore_errors=True)
    (katex / "fonts").mkdir(parents=True)
    dist = modules / "katex" / "dist"
    for f in ("katex.min.js", "katex.min.css"):
        shutil.copyfile(dist / f, katex / f)
    for font in sorted((dist / "fonts").glob("*.woff2")):
        shutil.copyfile(font, katex / "fonts" / font.name)
    shutil.copyfile(modules / "katex" / "LICENSE", katex / "LICENSE")
    copied = {name: pins[name] for name in (*D3_MODULES, "katex")}
    (out / "VERSIONS").write_text("".join(f"{n} {v}\n" for n, v in copied.items()))
    return copied


def main() -> int:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("make vendor needs npm (the book itself does not: the vendored "
                         "files are committed under book/viz/vendor/)")
    subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=PINS,
                   check=True)
    for name, version in copy(PINS / "node_modules").items():
        print(f"{name} {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
