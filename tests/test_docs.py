"""The course's documents follow the course's rules (not graded; run with the suite):

- every glossary term a README uses is linked to ``GLOSSARY.md`` at least once, and every
  link to ``GLOSSARY.md#slug`` names a heading that exists;
- every lab README follows the template stated in CONTRIBUTING.md ("Conventions every lab
  shares"): the lesson headings in order, a figure, a Misconceptions table whose tests
  exist, a reading list with arXiv ids, then ``## Reference``; the lesson part stays short;
- every ``figures.py`` saves its PNGs without the matplotlib version in them, so
  ``make figures`` on the pinned stack rewrites no committed figure.

How a term is matched is written in ``tools/glossary.py`` (``python -m tools.glossary
--fix FILE.md`` links every unlinked term at its first use).
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from tools.glossary import (
    CODE_SPAN,
    COMMENT,
    FENCE,
    GLOSSARY,
    LINK,
    github_slug,
    glossary_links,
    glossary_terms,
    term_uses,
)
from tools.tree import course_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAB_READMES = sorted((ROOT / "labs").glob("lab-*/README.md"))
# The top README (the student's door) and the pages that hold what it used to: platforms and
# commands, the developers' guide, the grading manual and the benchmarks.
TOP_PAGES = [ROOT / "PLATFORMS.md", ROOT / "CONTRIBUTING.md", ROOT / "grading" / "README.md",
             ROOT / "bench" / "README.md"]
READMES = [ROOT / "README.md", *TOP_PAGES, *LAB_READMES]
TOP_README_WORDS = 1500  # words of the top README, HTML comments excluded

# The lab README template: these level-2 headings, in this order (other level-2 headings
# may sit between them). A heading matches when it equals the name or starts with the name
# followed by ":" (e.g. "## Worked example: 2 tiles of 4 numbers").
TEMPLATE = [
    "Run it",
    "The idea in plain words",
    "Worked example",
    "What you build (Contract)",
    "Misconceptions",
    "Say it out loud",
    "Reading list",
    "Reference",
]
LESSON_WORDS = 2500  # words before "## Reference", code blocks and HTML comments excluded

@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_glossary_term_a_readme_uses_is_linked(readme):
    terms = glossary_terms()
    linked = {slug for _, slug in glossary_links(readme)}
    unlinked = [
        f"{terms[slug][0]!r} (as {words!r}, line {line}) -> #{slug}"
        for slug, (words, line) in term_uses(readme.read_text(encoding="utf-8")).items()
        if slug not in linked
    ]
    where = pathlib.Path(os.path.relpath(GLOSSARY, readme.parent)).as_posix()
    assert not unlinked, (
        f"{readme.relative_to(ROOT)} uses glossary terms it never links; link each once, "
        f"on first use, as [term]({where}#slug):\n  " + "\n  ".join(unlinked)
    )


def test_every_glossary_link_names_an_existing_heading():
    slugs = set(glossary_terms()) | {
        github_slug(line.lstrip("#")) for line in GLOSSARY.read_text().splitlines()
        if line.startswith("#")
    }
    documents = course_files(ROOT, ".md")
    broken = []
    for doc in documents:
        for target, slug in glossary_links(doc):
            file = target.partition("#")[0]
            if (doc.parent / file).resolve() != GLOSSARY.resolve():
                broken.append(f"{doc.relative_to(ROOT)}: {target} is not the root GLOSSARY.md")
            elif slug and slug not in slugs:
                broken.append(f"{doc.relative_to(ROOT)}: {target} names no heading")
    assert not broken, "\n".join(broken)


def test_glossary_headings_are_unique():
    headings = [line for line in GLOSSARY.read_text().splitlines() if line.startswith("### ")]
    slugs = [github_slug(h[4:]) for h in headings]
    assert len(slugs) == len(set(slugs)), sorted(s for s in slugs if slugs.count(s) > 1)


def level2_headings(markdown: str) -> list[tuple[int, str]]:
    """(offset, text) of every ``## `` heading outside code blocks."""
    blanked = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown)
    return [(m.start(), m.group(1).strip()) for m in re.finditer(r"^## (.+)$", blanked, re.M)]


def _is(heading: str, name: str) -> bool:
    return heading == name or heading.startswith(name + ":")


def _section(markdown: str, name: str) -> str:
    heads = level2_headings(markdown)
    for i, (start, heading) in enumerate(heads):
        if _is(heading, name):
            end = heads[i + 1][0] if i + 1 < len(heads) else len(markdown)
            return markdown[start:end]
    return ""


def lesson_words(markdown: str) -> int:
    heads = [start for start, h in level2_headings(markdown) if _is(h, "Reference")]
    lesson = markdown[: heads[0]] if heads else markdown
    return len(COMMENT.sub(" ", FENCE.sub(" ", lesson)).split())


@pytest.mark.parametrize("readme", LAB_READMES, ids=lambda p: p.parent.name)
def test_lab_readme_follows_the_template(readme):
    markdown = readme.read_text(encoding="utf-8")
    headings = [h for _, h in level2_headings(markdown)]
    found = [next((h for h in headings if _is(h, name)), None) for name in TEMPLATE]
    missing = [name for name, h in zip(TEMPLATE, found) if h is None]
    assert not missing, (
        f"{readme.parent.name}/README.md lacks the template's headings {missing} "
        f"(required, in order: {TEMPLATE})"
    )
    order = [headings.index(h) for h in found]
    assert order == sorted(order), (
        f"{readme.parent.name}/README.md: the template's headings are out of order; "
        f"required order {TEMPLATE}, found {[headings[i] for i in sorted(order)]}"
    )
    words = lesson_words(markdown)
    assert words <= LESSON_WORDS, (
        f"{readme.parent.name}/README.md: the lesson (everything before ## Reference) has "
        f"{words} words; keep it under {LESSON_WORDS} by moving detail into ## Reference"
    )
    lesson = markdown[: markdown.index("\n## Reference")]
    assert re.search(r"!\[[^\]]*\]\([^)]*\.(png|svg)\)", lesson), (
        f"{readme.parent.name}/README.md: the lesson shows no figure"
    )


@pytest.mark.parametrize("readme", LAB_READMES, ids=lambda p: p.parent.name)
def test_every_misconception_is_named_by_a_test_that_exists(readme):
    section = _section(readme.read_text(encoding="utf-8"), "Misconceptions")
    rows = [r for r in section.splitlines()
            if r.startswith("|") and not re.match(r"\|[\s|:-]+\|?$", r)]
    assert len(rows) >= 2, (
        f"{readme.parent.name}/README.md: ## Misconceptions needs a table "
        "| misconception | the test that names it |"
    )
    tests = set()
    for file in readme.parent.glob("test_*.py"):
        tests |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", file.read_text(), re.M))
        tests |= set(re.findall(r"^class (Test\w+)", file.read_text(), re.M))
        tests |= set(re.findall(r"^(test_\w+) = ", file.read_text(), re.M))  # a made test
    unnamed, unknown = [], []
    for row in rows[1:]:  # the first row is the header
        names = re.findall(r"`((?:test_|Test)\w+)`", row)
        if not names:
            unnamed.append(row[:80])
        unknown += [n for n in names if n not in tests]
    lab = readme.parent.name
    assert not unnamed, f"{lab}: misconceptions no test names:\n" + "\n".join(unnamed)
    assert not unknown, f"{lab}: the Misconceptions table names tests that do not exist: {unknown}"


@pytest.mark.parametrize("readme", LAB_READMES, ids=lambda p: p.parent.name)
def test_reading_list_cites_papers_by_arxiv_id(readme):
    section = _section(readme.read_text(encoding="utf-8"), "Reading list")
    assert re.search(r"arXiv[: ]\s*\d{4}\.\d{4,5}|arxiv\.org/abs/\d{4}\.\d{4,5}", section), (
        f"{readme.parent.name}/README.md: ## Reading list cites no paper by arXiv id"
    )
    assert re.search(r"\]\(https?://", section), (
        f"{readme.parent.name}/README.md: ## Reading list links nothing"
    )


@pytest.mark.parametrize("figures", sorted((ROOT / "labs").glob("lab-*/figures.py")),
                         ids=lambda p: p.parent.name)
def test_figures_are_saved_reproducibly(figures):
    """PNG bytes must not depend on the matplotlib version: no Software text chunk."""
    source = figures.read_text(encoding="utf-8")
    calls = re.findall(r"\.savefig\((.*)\)", source)
    bad = [c for c in calls if "metadata" not in c]
    assert not bad, (
        f"{figures.parent.name}/figures.py: savefig without metadata={{'Software': None}}: {bad}"
    )
    assert 'matplotlib.use("Agg")' in source or "matplotlib.use('Agg')" in source, (
        f"{figures.parent.name}/figures.py does not select the Agg backend"
    )


def _anchors(path: pathlib.Path) -> set[str]:
    """The slugs of every heading in ``path`` (GitHub numbers repeats: slug-1, slug-2, ...)."""
    blanked = FENCE.sub(" ", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", blanked, re.M):
        slug = github_slug(LINK.sub(lambda m: m.group(1), heading))
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


@pytest.mark.parametrize("readme", [*READMES, GLOSSARY], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_heading_resolves(readme):
    """Sections move between the lesson and the reference: a link must still land."""
    text = COMMENT.sub(" ", FENCE.sub(" ", readme.read_text(encoding="utf-8")))
    broken = []
    for _, target in LINK.findall(CODE_SPAN.sub(" ", text)):
        file, hash_, slug = target.partition("#")
        if not hash_ or "://" in file or (file.endswith("GLOSSARY.md") and readme != GLOSSARY):
            continue
        doc = (readme.parent / file).resolve() if file else readme
        if doc.suffix == ".md" and doc.is_file() and slug not in _anchors(doc):
            broken.append(target)
    assert not broken, f"{readme.relative_to(ROOT)}: links to headings that do not exist: {broken}"


@pytest.mark.parametrize("readme", LAB_READMES, ids=lambda p: p.parent.name)
def test_run_it_opens_with_the_same_two_commands(readme):
    """One spelling of "Run it" in every lab: the first code block under ``## Run it`` starts
    with the starter's tests and then ``make grade``; any other line runs the starter too."""
    lab, text = readme.parent.name, readme.read_text(encoding="utf-8")
    section = text.split("## Run it", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    want = [f"LAB_IMPL=starter .venv/bin/python -m pytest labs/{lab} -q",
            f"make grade LAB={lab[4:6]}"]
    assert commands[:2] == want, f"{lab}: Run it opens with {commands[:2]}"
    plain = [c for c in commands if "-m pytest" in c and not c.startswith("LAB_IMPL=starter ")]
    assert not plain, f"{lab}: pytest lines that do not say which file they grade: {plain}"


def test_the_top_readme_is_the_students_door():
    """What the course teaches, the two commands, the learner path, how a lab works and where
    to go next, in at most TOP_README_WORDS words; the rest lives in the pages it links."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    # a student copy's README opens with the release's own section (up to its `---` rule):
    # the release's text, not the door's, so not counted against the door's budget
    head, copy_section, rest = text.partition("## Student copy")
    door = head + rest.partition("\n---\n")[2] if copy_section else text
    words = len(COMMENT.sub(" ", door).split())
    assert words <= TOP_README_WORDS, (
        f"README.md has {words} words (at most {TOP_README_WORDS}): move platform detail to "
        "PLATFORMS.md, conventions to CONTRIBUTING.md, grading to grading/README.md")
    headings = [h for _, h in level2_headings(text)]
    start = "Student copy" if headings and headings[0].startswith("Student copy") else (
        "Quick start")  # a student copy's README opens with its own section (make release)
    for name in (start, "What this course teaches", "The learner path", "How a lab works",
                 "Where to go next"):
        assert any(_is(h, name) or h.startswith(name) for h in headings), (
            f"README.md lacks ## {name}")
    assert "make grade" in text and "make test" in text, "README.md: the two commands"
    for page in TOP_PAGES:
        link = pathlib.Path(os.path.relpath(page, ROOT)).as_posix()
        assert f"]({link}" in text, f"README.md's Where to go next does not link {link}"
