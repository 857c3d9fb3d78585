"""Build the web book: the course's own Markdown plus the visualisations, with MkDocs.

    python -m book.build [--out build/book]

Steps (nothing is written outside ``build/``):
1. assemble ``build/book-src/docs/`` from the single sources: the top README (as the home
   page), every ``labs/*/README.md`` with its figures, ``GLOSSARY.md`` when the repository
   has one, and the visualisation pages, scripts and traces of ``book/``; relative links
   are rewritten for the site (a link to a file the book does not hold keeps its text);
2. turn the glossary's ``### Term`` sections into hover definitions: one abbreviation line
   per term (``*[Term]: first sentence``), appended to every page by pymdownx.snippets, and
   a ``title`` on every link into the glossary;
3. take the reference traces from ``book/viz/traces/`` (committed: a student copy has no
   solutions), or, in the instructor's tree, write them afresh from the solutions; copy the
   learner's traces from ``build/traces/`` (``make trace``) next to the reference
   traces, or an empty one per lab so a page always finds its script;
4. run MkDocs' build (config: ``book/mkdocs.yml``) into ``build/book/``.

The site works from ``file://`` (no directory URLs, Material's offline plugin for search)
and with ``python -m http.server -d build/book``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import pathlib
import re
import shutil

from book.traces import main as traces_main
from labs import manifest

REPO = pathlib.Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
SRC = REPO / "build" / "book-src"
# The labs, their order (the learner path) and their visualisations: labs/manifest.py.
VISUALISATIONS = tuple((f"{page.name}.md", page.title) for page, _ in manifest.pages())
TRACE_LABS = tuple(sorted(e.number for e in manifest.traced("starter")))
KERNEL_TRACES = ("09", "00-kernel")  # make trace LAB=09, LAB=00 KERNEL=1 (kernel-traces page)
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+(?:\([^()]*\))?[^()\s]*)"
                  r"(\s+\"[^\"]*\")?\)")
REF_DEF = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*)(\S+)(.*)$", re.M)
IMAGE_EXT = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp")


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation other than '-' and '_' dropped,
    spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def abbreviations(glossary: dict[str, str]) -> str:
    """One ``*[term]: definition`` line per term, and one for its lower-case use in prose
    ("Tensor core" also as "tensor core", "Warp" as "warp"; not acronyms or CamelCase names
    such as "KV cache" or "FlashAttention", and not "attention", which is every sentence)."""
    lines = {}
    for term, text in sorted(glossary.items()):
        lines[term] = text
        first = term.split()[0]
        if first[:1].isupper() and first[1:].islower() and term.lower() != "attention":
            lines.setdefault(term[0].lower() + term[1:], text)
    return "".join(f"*[{t}]: {d}\n" for t, d in lines.items())


def glossary_terms(path: pathlib.Path) -> dict[str, str]:
    """``{term: first sentence of its definition}`` from the ``### Term`` sections."""
    if not path.is_file():
        return {}
    terms: dict[str, str] = {}
    for section in re.split(r"^### ", path.read_text(encoding="utf-8"), flags=re.M)[1:]:
        term, _, body = section.partition("\n")
        paragraph = re.split(r"\n\s*\n", body.strip().split("\n#")[0], maxsplit=1)[0]
        text = " ".join(paragraph.split())
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links -> their text
        text = re.sub(r"[`*]", "", text).replace('"', "'").replace("]", ")").replace("[", "(")
        first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
        if term.strip() and first:
            terms[term.strip()] = first[:300]
    return terms


class Site:
    """Which repository files the book holds, and where (repo path -> docs path)."""

    def __init__(self, docs: pathlib.Path) -> None:
        self.docs = docs
        self.pages: dict[pathlib.Path, pathlib.Path] = {REPO / "README.md": docs / "index.md"}
        for readme in sorted((REPO / "labs").glob("*/README.md")):
            self.pages[readme] = docs / "labs" / readme.parent.name / "README.md"
        if (REPO / "GLOSSARY.md").is_file():
            self.pages[REPO / "GLOSSARY.md"] = docs / "GLOSSARY.md"
        # a README may link a visualisation page (book/pages/, copied to viz/ below)
        self.viz = {page: docs / "viz" / page.name for page in (BOOK / "pages").glob("*.md")}
        self.glossary = glossary_terms(REPO / "GLOSSARY.md")
        self.slugs = {github_slug(t): d for t, d in self.glossary.items()}

    def target(self, src: pathlib.Path, link: str) -> str | None:
        """The rewritten link, or None when the book has no such file."""
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I) or link.startswith("#"):
            return link
        path, _, anchor = link.partition("#")
        resolved = (src.parent / path).resolve()
        if resolved.is_dir() and (resolved / "README.md").is_file():
            resolved = resolved / "README.md"
        dst_page = self.pages[src]
        if resolved in self.pages:
            dest = self.pages[resolved]
        elif resolved in self.viz:
            dest = self.viz[resolved]
        elif resolved.suffix.lower() in IMAGE_EXT and resolved.is_file():
            dest = self.docs / resolved.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(resolved, dest)
        else:
            return None
        rel = os.path.relpath(dest, dst_page.parent).replace(os.sep, "/")
        return rel + (f"#{anchor}" if anchor else "")

    def rewrite(self, src: pathlib.Path, text: str) -> str:
        def link(m: re.Match) -> str:
            bang, label, url, title = m.groups()
            new = self.target(src, url)
            if new is None:
                return label if bang == "" else f"*{label}*"
            anchor = url.partition("#")[2]
            if not title and url.split("#")[0].endswith("GLOSSARY.md") and anchor in self.slugs:
                title = ' "' + self.slugs[anchor] + '"'
            return f"{bang}[{label}]({new}{title or ''})"

        def ref(m: re.Match) -> str:
            new = self.target(src, m.group(2))
            return f"{m.group(1)}{new}{m.group(3)}" if new else f"{m.group(1)}#{m.group(3)}"

        out, fence = [], False
        for chunk in re.split(r"(^```.*?$)", text, flags=re.M):
            if chunk.startswith("```"):
                fence = not fence
                out.append(chunk)
            elif fence:
                out.append(chunk)
            else:
                out.append(REF_DEF.sub(ref, LINK.sub(link, chunk)))
        return "".join(out)


def assemble(docs: pathlib.Path) -> list[tuple[str, str]]:
    """Write the docs folder; return the lab pages' (nav title, docs-relative path)."""
    if docs.exists():
        shutil.rmtree(docs)
    docs.mkdir(parents=True)
    site = Site(docs)
    for src, dst in site.pages.items():
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(site.rewrite(src, src.read_text(encoding="utf-8")), encoding="utf-8")
    includes = docs.parent / "includes"
    includes.mkdir(exist_ok=True)
    (includes / "abbreviations.md").write_text(abbreviations(site.glossary), encoding="utf-8")
    # the visualisations: pages, scripts, styles and the reference traces
    (docs / "viz").mkdir()
    for name, _ in VISUALISATIONS:
        shutil.copyfile(BOOK / "pages" / name, docs / "viz" / name)
    shutil.copyfile(BOOK / "pages" / "index.md", docs / "viz" / "index.md")
    shutil.copytree(BOOK / "viz", docs / "viz" / "assets",
                    ignore=shutil.ignore_patterns("traces", "__pycache__"))
    shutil.copytree(BOOK / "viz" / "traces", docs / "viz" / "traces")
    if any((REPO / "labs").glob("*/solution.py")):  # the instructor's tree: trace them afresh
        with contextlib.redirect_stdout(io.StringIO()):
            traces_main(["--out", str(docs / "viz" / "traces")])
    install_starter_traces(docs / "viz" / "traces")
    labs = []
    for readme in sorted((REPO / "labs").glob("*/README.md"), key=_lab_key):
        labs.append(f"labs/{readme.parent.name}/README.md")
    return labs


def install_starter_traces(traces: pathlib.Path, source: pathlib.Path | None = None) -> None:
    """The learner's traces (``make trace``) into ``traces``; labs without one get a trace of
    ``null`` (the page then says how to make one)."""
    source = source or REPO / "build" / "traces"
    for lab in (*TRACE_LABS, *KERNEL_TRACES):
        name = f"lab{lab}-starter"
        mine = source / f"{name}.js"
        if mine.is_file():
            shutil.copyfile(mine, traces / f"{name}.js")
        else:
            (traces / f"{name}.js").write_text(
                "window.BOOK_TRACES = window.BOOK_TRACES || {};\n"
                f'window.BOOK_TRACES["{name}"] = null;\n')


def _lab_key(readme: pathlib.Path) -> tuple[int, str]:
    """Learner-path order (labs/manifest.py); a folder not in it follows in name order."""
    order = [e.folder for e in manifest.labs()]
    name = readme.parent.name
    return (order.index(name) if name in order else len(order), name)


def write_config(src: pathlib.Path, out: pathlib.Path, labs: list[str]) -> pathlib.Path:
    """``book/mkdocs.yml`` with this build's folders and nav appended."""
    nav = ["nav:", "  - Home: index.md", "  - Labs:"]
    nav += [f"      - {lab}" for lab in labs]
    nav += ["  - Visualisations:", "      - viz/index.md"]
    nav += [f"      - '{title}': viz/{name}" for name, title in VISUALISATIONS]
    if (REPO / "GLOSSARY.md").is_file():
        nav.append("  - Glossary: GLOSSARY.md")
    config = (BOOK / "mkdocs.yml").read_text(encoding="utf-8")
    config += (f"\ndocs_dir: docs\nsite_dir: {os.path.relpath(out, src)}\n"
               + "\n".join(nav) + "\n")
    path = src / "mkdocs.yml"
    path.write_text(config, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the web book into build/book/.")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "build" / "book")
    ap.add_argument("--src", type=pathlib.Path, default=SRC)
    ap.add_argument("--starter-traces", type=pathlib.Path, default=None,
                    help="folder of the learner's traces (default build/traces)")
    args = ap.parse_args(argv)
    out, src = args.out.resolve(), args.src.resolve()
    labs = assemble(src / "docs")
    if args.starter_traces:
        install_starter_traces(src / "docs" / "viz" / "traces", args.starter_traces)
    config = write_config(src, out, labs)
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config

    logging.getLogger("mkdocs").setLevel(logging.WARNING)
    cwd = os.getcwd()
    try:
        os.chdir(src)  # the snippets' base_path is relative to where mkdocs runs
        mkdocs_build(load_config(str(config)))
    finally:
        os.chdir(cwd)
    print(f">> the book is in {os.path.relpath(out, REPO)}/: open "
          f"{os.path.relpath(out / 'index.html', REPO)} in a browser, or serve it with "
          f"'.venv/bin/python -m http.server -d {os.path.relpath(out, REPO)}'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
