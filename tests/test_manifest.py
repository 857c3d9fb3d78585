"""Course rule: the lab manifest (``labs/manifest.py`` and each ``labs/*/lab.toml``) and the
tree agree, so adding a lab is its own folder plus one line of ``PATH``
(CONTRIBUTING.md, "Adding a lab"). Each failure names the file to edit."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from labs import manifest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAB_DIRS = sorted(p.name for p in (ROOT / "labs").glob("lab-*") if p.is_dir())
LABS = manifest.labs()


def test_every_lab_folder_is_on_the_learner_path_and_every_entry_is_a_folder():
    assert len(set(manifest.PATH)) == len(manifest.PATH), "labs/manifest.py: PATH repeats a lab"
    missing = sorted(set(LAB_DIRS) - set(manifest.PATH))
    assert not missing, f"{missing}: add one line per lab to PATH in labs/manifest.py"
    stale = sorted(set(manifest.PATH) - set(LAB_DIRS))
    assert not stale, f"labs/manifest.py's PATH names {stale}, which labs/ does not hold"
    no_toml = [d for d in LAB_DIRS if not (ROOT / "labs" / d / "lab.toml").is_file()]
    assert not no_toml, f"{no_toml} have no lab.toml (CONTRIBUTING.md, 'Adding a lab')"
    assert [e.folder for e in LABS] == list(manifest.PATH)
    assert [e.step for e in LABS] == list(range(1, len(LABS) + 1))
    numbers = [e.number for e in LABS]
    assert len(set(numbers)) == len(numbers), f"two labs share a number: {numbers}"


def test_a_bad_declaration_is_refused_with_the_key_named():
    good = 'title = "x"\n'
    assert manifest.parse("lab-99-x", good, 1).track == "core"
    for text, word in [('title = "x"\ncolour = 1\n', "colour"), ("track = 'core'\n", "title"),
                       ('title = "x"\ntrack = "hard"\n', "track"),
                       ('title = "x"\n[book]\ntrace = "yes"\n', "trace"),
                       ('title = "x"\n[kernels]\nbench = "flash"\n', "bench"),
                       ('title = "x"\n[compile]\nbig_pointers = "("\n', "big_pointers"),
                       ('title = "x"\n[grade]\npreload = "torch"\n', "preload"),
                       ('title = "x"\n[book]\npages = [{ name = "a" }]\n', "page"),
                       ('title = = "x"\n', "TOML")]:
        with pytest.raises(ValueError, match=word):
            manifest.parse("lab-99-x", text, 1)


def test_the_lookup_by_number_or_folder():
    assert manifest.lab("4").folder == manifest.lab("lab-04").folder == manifest.lab("04").folder
    assert manifest.lab(LABS[0].folder) == LABS[0]
    with pytest.raises(KeyError, match="no lab"):
        manifest.lab("98")


def test_every_visualisation_page_is_owned_by_one_lab_and_exists():
    declared = [page.name for page, _ in manifest.pages()]
    assert len(set(declared)) == len(declared), f"a page is declared twice: {declared}"
    on_disk = sorted(p.stem for p in (ROOT / "book" / "pages").glob("*.md") if p.stem != "index")
    assert sorted(declared) == on_disk, (
        "book/pages/ and the labs' [book] pages differ: declare each page in the lab.toml of "
        f"the lab it draws from (only in pages/: {sorted(set(on_disk) - set(declared))}; only "
        f"declared: {sorted(set(declared) - set(on_disk))})")
    for name in declared:
        assert (ROOT / "book" / "viz" / f"{name}.js").is_file(), f"book/viz/{name}.js is missing"
    for e in LABS:
        unknown = sorted(set(e.trace_pages) - set(declared))
        assert not unknown, f"labs/{e.folder}/lab.toml: trace_pages {unknown} are no pages"
        if e.trace == "starter":
            assert e.trace_pages, f"labs/{e.folder}/lab.toml: a starter trace shows on a page"


def test_the_traced_labs_have_their_builders_and_committed_traces():
    from book import alignment_trace, approximation_trace, attention_trace, traces

    ref = {e.number for e in manifest.traced("reference")}
    starter = {e.number for e in manifest.traced("starter")}
    with_file = {e.number for e in LABS if (e.dir / "traces.py").is_file()}
    assert with_file == ref, (
        "a lab has labs/<lab>/traces.py exactly when its lab.toml sets [book] trace: "
        f"traces.py without trace {sorted(with_file - ref)}, trace without traces.py "
        f"{sorted(ref - with_file)}")
    kernels = set(traces.KERNEL_TRACES)  # the Triton kernels' traces (book/kernel_traces.py)
    assert set(traces.BUILDERS) - kernels == ref
    no_diff = sorted(n for n in starter if not callable(getattr(traces.lab_traces(n), "diff", 0)))
    assert not no_diff, f"labs {no_diff}: a starter trace needs diff(mine, ref) in traces.py"
    extra = {name: e.number for e in LABS for name in e.extra_traces}
    assert {n: lab for n, (lab, _) in traces.EXTRA.items()} == extra, (
        "the reference-only traces (labs/<lab>/traces.py's EXTRA) vs the labs' [book] "
        "extra_traces")
    committed = {p.name for p in (ROOT / "book" / "viz" / "traces").glob("*-reference.js")}
    wanted = {f"lab{n}-reference.js" for n in ref | kernels} | {f"{n}-reference.js" for n in extra}
    wanted.add(f"{attention_trace.NAME}.js")  # the trained model's heads (book/attention_trace.py)
    wanted.add(f"{alignment_trace.NAME}.js")  # the date model's alignment (book/alignment_trace.py)
    wanted.add(f"{approximation_trace.NAME}.js")  # lab 10 on the model's q/k
    assert committed == wanted, (
        f"book/viz/traces/ vs the manifest: run `python -m book.traces` and commit "
        f"(missing {sorted(wanted - committed)}, stale {sorted(committed - wanted)})")


def test_the_kernel_tables_hold_exactly_the_declared_kernels():
    from bench.gpu_kernels import GPU_KERNELS
    from bench.kernels import KERNELS

    bench = {(s.lab, s.name) for s in KERNELS}
    declared = {(e.folder, name) for e in LABS for name in e.bench}
    assert bench == declared, (
        "bench/kernels.py's KERNELS vs the labs' [kernels] bench: "
        f"only in bench/kernels.py {sorted(bench - declared)}, "
        f"only declared {sorted(declared - bench)}")
    compiled = {(g.lab, g.kernel) for g in GPU_KERNELS}
    declared = {(e.folder, name) for e in LABS for name in e.triton}
    assert compiled == declared, (
        "bench/gpu_kernels.py's GPU_KERNELS vs the labs' [kernels] triton: "
        f"only in bench/gpu_kernels.py {sorted(compiled - declared)}, "
        f"only declared {sorted(declared - compiled)}")
    for e in LABS:
        source = e.dir / ("solution.py" if (e.dir / "solution.py").is_file() else "starter.py")
        text = source.read_text(encoding="utf-8")
        for name in e.triton:
            assert re.search(rf"^def {re.escape(name)}\(", text, re.M), (
                f"labs/{e.folder}/lab.toml declares {name}, which {source.name} does not define")
        if e.big_pointers or e.small_tensors:
            assert e.triton, f"labs/{e.folder}/lab.toml: [compile] rules for a lab with no kernel"


def _learner_path_rows() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The learner path", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\|[^|]*\|\s*\[[^\]]*\]\(labs/(lab-[^/]+)/README\.md\)", section, re.M)


def test_the_readmes_learner_path_is_the_manifests():
    rows = _learner_path_rows()
    assert rows == list(manifest.PATH), (
        "README.md's learner path table lists the labs in PATH order (labs/manifest.py): "
        f"README {rows}, PATH {list(manifest.PATH)}")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The learner path", 1)[1].split("\n## ", 1)[0]
    for e in LABS:
        row = next(r for r in section.splitlines() if f"(labs/{e.folder}/README.md)" in r)
        step = row.split("|")[1].strip()
        assert step == (f"advanced {e.step}" if e.track == "advanced" else str(e.step)), (
            f"README.md's learner path: {e.folder} is step {e.step} ({e.track}), not {step!r}")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_makefile_offers_make_trace_for_the_manifests_labs():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("make trace"))
    labs = " ".join(sorted(e.number for e in manifest.traced("starter")))
    assert f"(labs {labs})" in line, line


def test_what_a_lab_preloads_for_the_grade_is_a_module_its_files_import():
    """``[grade] preload`` names modules the lab's code imports (the seed imports them once)."""
    import importlib.util

    for entry in LABS:
        text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(entry.dir.glob("*.py")))
        for name in entry.preload:
            top = name.split(".")[0]
            assert re.search(rf"\b(import|from) {re.escape(top)}\b", text), (
                f"labs/{entry.folder}/lab.toml preloads {name}, which no file of the lab "
                "imports")
            if importlib.util.find_spec(top) is not None:
                assert importlib.util.find_spec(name) is not None, (
                    f"labs/{entry.folder}/lab.toml preloads {name}: no such module")
