"""The glossary's link rule, and a fixer: ``python -m tools.glossary [--fix] FILE.md ...``.

Every term of ``GLOSSARY.md`` that a README uses is linked there once, on its first use
(``tests/test_docs.py`` checks it). Without ``--fix`` this lists the terms each file uses
and never links; with ``--fix`` it links each one at its first use in prose that can hold
a link (not a heading, code, a link, an image, a URL, an HTML tag or an instructor-only
block), and lists the terms it could not place.

How a term is matched: its heading and the spellings in the ``<!-- match: ... -->``
comment under it, as whole words (``-`` counts as part of a word, so "flash-decoding" does
not use "decode"), with an optional plural ``s``/``es``; case-insensitive, except that a
spelling written in capitals (``SM``, ``MMA``, ``FLOP``) matches only in capitals, so the
``sm`` of ``sm_90`` is not the term SM. A match inside a longer match of another term
belongs to that term ("chunked prefill" is a use of Chunked prefill, not of Prefill).
Fenced code blocks, code spans, HTML comments, link text and targets, image alt text and
bare URLs are not prose and do not count as a use.
"""

from __future__ import annotations

import argparse
import bisect
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "GLOSSARY.md"

FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1[^\n]*$", re.MULTILINE | re.DOTALL)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]*)(?:\s+\"[^\"]*\")?\)")
URL = re.compile(r"https?://\S+")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' dropped,
    spaces to '-' (code spans keep their text)."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def glossary_terms() -> dict[str, list[str]]:
    """slug -> the spellings that count as a use of the term (heading first)."""
    terms: dict[str, list[str]] = {}
    slug = None
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
            slug = github_slug(heading)
            terms[slug] = [heading]
        elif slug and (m := re.match(r"<!--\s*match:\s*(.*?)\s*-->", line)):
            terms[slug] += [s.strip() for s in m.group(1).split(",") if s.strip()]
    return terms


def _blank(match: re.Match[str]) -> str:
    return " " + "\n" * match.group(0).count("\n")  # keeps line numbers


def prose(markdown: str) -> str:
    """What a reader reads as words: no code, comments, link targets, images or URLs."""
    text = FENCE.sub(_blank, markdown)
    text = COMMENT.sub(_blank, text)
    text = CODE_SPAN.sub(_blank, text)
    text = IMAGE.sub(_blank, text)
    text = LINK.sub(lambda m: m.group(1) + "\n" * m.group(2).count("\n"), text)
    return URL.sub(" ", text)


def term_pattern(spelling: str) -> re.Pattern[str]:
    words = r"\s+".join(re.escape(w) for w in spelling.split())
    flags = 0 if re.search(r"[A-Z]", spelling) and spelling == spelling.upper() else re.I
    return re.compile(rf"(?<![\w-]){words}(?:s|es)?(?![\w-])", flags)


def glossary_links(path: pathlib.Path) -> list[tuple[str, str]]:
    """(target as written, slug) of every link from ``path`` to the glossary."""
    text = COMMENT.sub(" ", FENCE.sub(" ", path.read_text(encoding="utf-8")))
    out = []
    for _, target in LINK.findall(CODE_SPAN.sub(" ", text)):
        file, _, slug = target.partition("#")
        if file.endswith("GLOSSARY.md"):
            out.append((target, slug))
    return out


def term_uses(markdown: str) -> dict[str, tuple[str, int]]:
    """slug -> (the words, the line) of the first use of that glossary term in ``markdown``.

    Link text is not prose here (a link cannot hold another link), and a match inside a
    longer match of another term is that term's use: "chunked prefill" uses Chunked
    prefill, not Prefill."""
    text = prose(LINK.sub(_blank, markdown))
    matches = sorted(
        (m.start(), m.end(), slug)
        for slug, spellings in glossary_terms().items()
        for spelling in spellings
        for m in term_pattern(spelling).finditer(text)
    )
    starts = [start for start, _, _ in matches]
    first: dict[str, tuple[str, int]] = {}
    for start, end, slug in matches:
        if slug in first:
            continue
        lo, hi = bisect.bisect_left(starts, start - 80), bisect.bisect_right(starts, start)
        nearby = matches[lo:hi]
        if any(s <= start and end <= e and e - s > end - start and other != slug
               for s, e, other in nearby):
            continue
        first[slug] = (" ".join(text[start:end].split()), text.count("\n", 0, start) + 1)
    return first


INSTRUCTOR_BLOCK = re.compile(
    r"<!-- >>> not in the student copy.*?<!-- <<< not in the student copy -->", re.DOTALL
)


def _cannot_hold_a_link(text: str) -> list[tuple[int, int]]:
    spans = []
    for rx in (FENCE, COMMENT, CODE_SPAN, IMAGE, LINK, URL, re.compile(r"^#{1,6} .*$", re.M),
               re.compile(r"<[^>\n]+>"), INSTRUCTOR_BLOCK):
        spans += [(m.start(), m.end()) for m in rx.finditer(text)]
    return spans


def link_first_uses(path: pathlib.Path) -> tuple[str, list[str]]:
    """``path``'s text with a glossary link on the first use of each unlinked term, and
    the slugs of the terms it could not place."""
    text = path.read_text(encoding="utf-8")
    here = path.resolve().parent
    target = pathlib.Path(*[".."] * len(here.relative_to(ROOT).parts), "GLOSSARY.md").as_posix()
    terms = glossary_terms()
    linked = {slug for _, slug in glossary_links(path)}
    uses = term_uses(text)
    spans = _cannot_hold_a_link(text)
    every = [(m.start(), m.end(), slug) for slug, spellings in terms.items()
             for spelling in spellings for m in term_pattern(spelling).finditer(text)]

    def free(start: int, end: int, slug: str) -> bool:
        if any(start < b and a < end for a, b in spans):
            return False
        return not any(a <= start and end <= b and b - a > end - start and other != slug
                       for a, b, other in every)

    chosen, unplaced = [], []
    for slug, spellings in sorted(terms.items(), key=lambda kv: -max(map(len, kv[1]))):
        if slug in linked or slug not in uses:
            continue
        found = [m.span() for spelling in spellings for m in term_pattern(spelling).finditer(text)
                 if free(*m.span(), slug)]
        if not found:
            unplaced.append(slug)
            continue
        chosen.append((*min(found), slug))
        spans.append(min(found))
    for start, end, slug in sorted(chosen, reverse=True):
        text = f"{text[:start]}[{text[start:end]}]({target}#{slug}){text[end:]}"
    return text, unplaced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=pathlib.Path)
    parser.add_argument("--fix", action="store_true", help="link each term at its first use")
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        if args.fix:
            text, unplaced = link_first_uses(path)
            path.write_text(text, encoding="utf-8")
        linked = {slug for _, slug in glossary_links(path)}
        uses = term_uses(path.read_text(encoding="utf-8"))
        missing = [slug for slug in uses if slug not in linked]
        for slug in missing:
            print(f"{path}:{uses[slug][1]}: uses #{slug} ({uses[slug][0]!r}) and never links it")
        status |= bool(missing)
    return status


if __name__ == "__main__":
    sys.exit(main())
