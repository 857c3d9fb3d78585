"""The web book in a real browser: `make book`'s site, driven by headless Chromium.

Each page loads from the file system with no console error and no request off the machine;
the controls step the animations and the numbers shown at a step are the trace's; a trace
from a starter that forgets to rescale ``acc`` is shown differing at the right step; every
page weighs under 200 KB gzipped. Screenshots (wide and narrow) are kept under
``build/book-screenshots/`` with ``weights.json``, the pages' gzipped weights.

Needs Debian's ``chromium`` (installed here with apt-get when the tests run as root and it
is missing) and the pins of ``requirements-book.txt`` (``make test`` installs them).
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.parse
from decimal import Decimal
from typing import Any

import pytest

# A wait returns as soon as its condition holds: the limit only bounds a broken page, so it is
# generous (a loaded 2-core machine must not fail a correct page).
WAIT_MS = 60_000
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "book-screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGE_BUDGET = 200 * 1024  # bytes, gzipped
pytestmark = pytest.mark.timeout(600)  # the first test may apt-get install chromium
# The built site in Chromium: a whole-pipeline check (MkDocs, then a browser), run by
# `make test-slow`; the traces and link rewriting are checked by `make test` below.
BROWSER = pytest.mark.slow
ACC_LINE = "            acc = alpha[:, None] * acc + p @ v[k0:k1]"
SCALE_LINE = "    scaled = raw / math.sqrt(d)"  # lab 08: a starter that divides by d instead
KPM_LINE = "    return ~key_padding_mask[:, None, None, :]"  # and reads the padding mask backwards
STRIDE_LINE = "    mask = (np.abs(i - j) < stride) | ((i - j) % stride == 0)"  # lab 10
STRIDE_WRONG = STRIDE_LINE.replace("(i - j) % stride", "j % stride")  # absolute, not relative
PREEMPT_LINE = "        victim = self.running.pop()"  # lab 11: preempt the newest request

sys.path.insert(0, str(ROOT))
from book.alignment_trace import NAME as ALIGNMENT_TRACE  # noqa: E402
from book.approximation_trace import NAME as APPROX_TRACE  # noqa: E402
from book.attention_trace import NAME as ATTENTION_TRACE  # noqa: E402
from book.build import main as build_main  # noqa: E402
from book.traces import KERNEL_TRACES, read_script  # noqa: E402
from book.traces import main as traces_main  # noqa: E402
from common.triton_env import HAVE_TRITON  # noqa: E402
from labs import manifest  # noqa: E402

VIZ = tuple(page.name for page, _ in manifest.pages())  # every visualisation of the book
STARTER_TRACES = sorted(e.number for e in manifest.traced("starter"))  # make trace's labs


def chromium_path() -> str | None:
    """Debian's Chromium, installed with apt-get where missing and possible."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found or os.environ.get("BOOK_NO_INSTALL"):
        return found
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
    return shutil.which("chromium")


def printed(path: pathlib.Path) -> Any:
    """A trace as written: its numbers as ``Decimal`` (the digits the file holds)."""
    return read_script(path, parse_float=Decimal)


def trace_differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where two traces differ beyond what a machine changes. The structure, the strings,
    the integers and the booleans must match exactly; a measured number may move by one unit
    in its last printed digit (the finer of the two), by 1e-5 of itself (a float32 sum's few
    ulps), or by 1e-5 (round-off: an exact method's error, a float32 check). Another CPU
    sums float32 in another order, and the last printed digit moves."""
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(got) != sorted(want):
            return [f"{where or 'the trace'}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in trace_differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want))
                for d in trace_differences(g, w, f"{where}[{i}]")]
    if isinstance(want, Decimal) and isinstance(got, (Decimal, int)) and not isinstance(got, bool):
        unit = min(Decimal(1).scaleb(x.as_tuple().exponent) for x in (got, want)
                   if isinstance(x, Decimal))  # the finer one's: 14.18 is no 14.17923
        slack = max(unit, Decimal("1e-5") * max(abs(got), abs(want)), Decimal("1e-5"))
        return [] if abs(got - want) <= slack else [f"{where}: {got} != {want}"]
    return [] if type(got) is type(want) and got == want else [f"{where}: {got!r} != {want!r}"]


def test_a_stale_trace_differs_beyond_a_machines_last_digit():
    """What the staleness checks below forgive (a float32 sum's last digit, round-off) and
    what they do not (a changed value, key, length or string)."""
    d = Decimal
    same = [({"x": d("14.17924")}, {"x": d("14.17923")}), ([d("4.4841")], [d("4.48411")]),
            ({"err": d("2.7e-06")}, {"err": d("4e-06")}), ([d("1.48e-16")], [d("9.21e-16")])]
    for got, want in same:
        assert trace_differences(got, want) == [], (got, want)
    changed = [({"x": d("14.18")}, {"x": d("14.17923")}), ({"x": 1}, {"y": 1}),
               ([1, 2], [1]), (["a"], ["b"]), ({"n": 3}, {"n": 4}), ([True], [1]),
               ([d("0.836")], [d("0.838")])]
    for got, want in changed:
        assert trace_differences(got, want), (got, want)


def assert_trace_is_current(made: pathlib.Path, name: str, command: str) -> None:
    """The trace ``made`` just now equals the committed ``book/viz/traces/name``."""
    committed = ROOT / "book" / "viz" / "traces" / name
    diff = trace_differences(printed(made), printed(committed))
    assert not diff, (f"book/viz/traces/{name} is stale: run .venv/bin/python -m {command} "
                      "and commit it. " + "; ".join(diff[:5]))


def reference(lab: str) -> dict:
    """The reference trace of lab ``lab`` ("00") or of a page ("ring")."""
    name = f"lab{lab}" if lab.isdigit() else lab
    return read_script(ROOT / "book" / "viz" / "traces" / f"{name}-reference.js")


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The book, built as `make book` builds it, with wrong lab-00, lab-08 and lab-10
    starters' traces."""
    pytest.importorskip("mkdocs", reason="the book's tools are not installed: `make test` "
                        "installs requirements-book.txt")
    pytest.importorskip("material", reason="mkdocs-material is not installed "
                        "(requirements-book.txt)")
    tmp = tmp_path_factory.mktemp("book")
    traces = tmp / "traces"
    solution = ROOT / "labs" / "lab-00-online-softmax" / "solution.py"
    if solution.is_file():  # the instructor's tree: a starter that forgets to rescale acc
        lab = tmp / "lab-00-online-softmax"
        shutil.copytree(solution.parent, lab, ignore=shutil.ignore_patterns("__pycache__"))
        code = solution.read_text()
        assert ACC_LINE in code, "the planted mistake no longer applies to lab 00's solution"
        wrong = code.replace(ACC_LINE, "            acc = acc + p @ v[k0:k1]")
        (lab / "starter.py").write_text(wrong)
        (lab / "solution.py").unlink()
        assert traces_main(["--impl", "starter", "--lab", "00", "--lab-dir", str(lab),
                            "--out", str(traces)]) == 0
    solution = ROOT / "labs" / "lab-08-attention-from-scratch" / "solution.py"
    if solution.is_file():  # scale_experiment divides by d; True in key_padding_mask = attend
        lab = tmp / solution.parent.name
        shutil.copytree(solution.parent, lab, ignore=shutil.ignore_patterns("__pycache__"))
        code = solution.read_text()
        assert SCALE_LINE in code and KPM_LINE in code, \
            "the planted mistakes no longer apply to lab 08's solution"
        code = code.replace(SCALE_LINE, "    scaled = raw / d")
        (lab / "starter.py").write_text(code.replace(KPM_LINE, KPM_LINE.replace("~", "")))
        (lab / "solution.py").unlink()
        assert traces_main(["--impl", "starter", "--lab", "08", "--lab-dir", str(lab),
                            "--out", str(traces)]) == 0
    solution = ROOT / "labs" / "lab-10-approximate-attention" / "solution.py"
    if solution.is_file():  # strided_mask: every stride-th key counted from 0, not from i
        lab = tmp / solution.parent.name
        shutil.copytree(solution.parent, lab, ignore=shutil.ignore_patterns("__pycache__"))
        code = solution.read_text()
        assert STRIDE_LINE in code, "the planted mistake no longer applies to lab 10's solution"
        (lab / "starter.py").write_text(code.replace(STRIDE_LINE, STRIDE_WRONG))
        (lab / "solution.py").unlink()
        assert traces_main(["--impl", "starter", "--lab", "10", "--lab-dir", str(lab),
                            "--out", str(traces)]) == 0
    plant_kernel_mistakes(tmp, traces)
    out = ROOT / "build" / "book-test"
    assert build_main(["--out", str(out), "--src", str(tmp / "src"),
                       "--starter-traces", str(traces)]) == 0
    return out


# Kernel mistakes planted for the kernel-traces page (tests/mutants): lab 00's causal key loop
# runs to Lq (program (0, 0, 0), query rows 0..15, loads key tile 2, keys 16..19, which no
# row of it may see); lab 09's add_vectors launches a floor(n / block) grid (program (2, 0,
# 0) never runs, so its load of x is missing).
KERNEL_MISTAKES = (("00", "triton-causal-loop-runs-to-lq", ["--kernel"]),
                   ("09", "p2-grid-floor", []))


def plant_kernel_mistakes(tmp: pathlib.Path, traces: pathlib.Path) -> None:
    """``make trace LAB=00 KERNEL=1`` and ``LAB=09`` on starters holding a kernel mistake
    (the instructor's tree, with triton installed)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return
    from grading.tools.mutants import apply_mutant, parse_mutant

    for lab, mutant, flags in KERNEL_MISTAKES:
        folder = next((ROOT / "labs").glob(f"lab-{lab}-*"))
        if not (folder / "solution.py").is_file():
            return
        copy = tmp / "kernels" / lab / folder.name
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__", "figures"))
        apply_mutant(parse_mutant(ROOT / "tests" / "mutants" / folder.name / f"{mutant}.mutant",
                                  folder.name), copy)
        (copy / "solution.py").rename(copy / "starter.py")
        assert traces_main(["--impl", "starter", "--lab", lab, *flags, "--lab-dir", str(copy),
                            "--out", str(traces)]) == 0


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: "
                                   "`make test` installs requirements-book.txt")
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium: install Debian's package (apt-get install chromium) to run "
                    "the book's browser tests")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A page of the book, with what it logged and every request it made."""

    def __init__(self, browser, book: pathlib.Path, rel: str, width: int = 1280, **ctx) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": 900}, **ctx)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto((book / rel).as_uri())
        self.page.wait_for_load_state("load")

    def value(self, selector: str):
        return json.loads(self.page.get_attribute(selector, "data-value"))

    def step(self, viz: str) -> int:
        return int(self.page.get_attribute(f"#{viz}", "data-step"))

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_page(browser, book):
    pages: list[Page] = []

    def opener(rel: str, **kw) -> Page:
        pages.append(Page(browser, book, rel, **kw))
        return pages[-1]
    yield opener
    for p in pages:
        p.close()


@BROWSER
def test_the_book_holds_every_lab_the_glossary_search_and_the_visualisations(book):
    assert (book / "index.html").is_file()
    for readme in (ROOT / "labs").glob("*/README.md"):
        assert (book / "labs" / readme.parent.name / "index.html").is_file(), readme
        for fig in (readme.parent / "figures").glob("*.png"):
            if f"figures/{fig.name}" in readme.read_text():
                assert (book / "labs" / readme.parent.name / "figures" / fig.name).is_file(), fig
    for name in VIZ:
        assert (book / "viz" / f"{name}.html").is_file()
    assert (book / "search" / "search_index.js").is_file(), "file:// search needs this index"
    if (ROOT / "GLOSSARY.md").is_file():
        assert (book / "GLOSSARY.html").is_file()
        lesson = book / "labs" / "lab-00-online-softmax" / "index.html"
        assert "<abbr title=" in lesson.read_text(), "glossary terms need hover definitions"


@BROWSER
@pytest.mark.parametrize("rel", [f"viz/{n}.html" for n in VIZ] + [
    "index.html", "viz/index.html", "labs/lab-00-online-softmax/index.html", "GLOSSARY.html"])
def test_every_page_loads_with_no_console_error_and_no_network(open_page, rel):
    """Also: the page's gzipped weight, and (a visualisation) a 390-pixel-wide screen."""
    if rel == "GLOSSARY.html" and not (ROOT / "GLOSSARY.md").is_file():
        pytest.skip("the repository has no GLOSSARY.md yet: the book has no glossary page")
    p = open_page(rel)
    p.page.wait_for_timeout(150)
    assert p.errors == [], f"{rel}: console errors {p.errors}"
    remote = [u for u in p.requests if not u.startswith(("file:", "data:", "about:", "blob:"))]
    assert remote == [], f"{rel} reaches the network: {remote}"
    SHOTS.mkdir(parents=True, exist_ok=True)
    name = rel.replace("/", "_").removesuffix(".html")
    p.page.screenshot(path=str(SHOTS / f"{name}.png"))
    if rel.startswith("viz/") and rel != "viz/index.html":
        files = {pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(u).path))
                 for u in p.requests if u.startswith("file:")}
        index = {f for f in files if f.name == "search_index.js"}  # the whole site's, shared
        weight = sum(len(gzip.compress(f.read_bytes(), 9)) for f in files - index)
        weights = json.loads((SHOTS / "weights.json").read_text()) if (
            SHOTS / "weights.json").is_file() else {}
        weights[rel] = weight
        weights["search/search_index.js (shared by every page)"] = sum(
            len(gzip.compress(f.read_bytes(), 9)) for f in index)
        (SHOTS / "weights.json").write_text(json.dumps(weights, indent=1, sort_keys=True))
        assert weight < PAGE_BUDGET, f"{rel} weighs {weight} bytes gzipped (budget {PAGE_BUDGET})"
        # the same page on a phone: one column, nothing wider than the screen
        p.page.set_viewport_size({"width": 390, "height": 844})
        p.page.wait_for_timeout(100)
        overflow = p.page.evaluate("""() => [...document.querySelectorAll('.viz')].map(
            v => v.scrollWidth - v.clientWidth)""")
        p.page.locator(".viz").first.screenshot(path=str(SHOTS / f"{name}-narrow.png"))
        assert overflow and max(overflow) <= 1, f"{rel} is wider than a phone: {overflow}"
        wraps = "() => getComputedStyle(document.querySelector('.viz-main')).flexWrap"
        assert p.page.evaluate(wraps) == "wrap"


@BROWSER
def test_flash_attention_steps_show_lab_00s_numbers(open_page):
    ref = reference("00")
    p = open_page("viz/flash-attention-tiling.html")
    assert p.step("fa-viz") == 0
    for _ in range(5):
        p.page.click("#fa-viz [data-action=step]")
    assert p.step("fa-viz") == 5
    row = ref["steps"][5]["rows"]
    for n in range(len(row)):
        assert p.value(f"#fa-m-{n}") == row[n]["m"]
        assert p.value(f"#fa-l-{n}") == row[n]["l"]
        assert p.value(f"#fa-acc-{n}") == row[n]["acc"]
    assert p.value("#fa-hbm") == ref["steps"][5]["hbm"]
    assert p.value("#fa-flops") == ref["steps"][5]["flops"]
    p.page.focus("#fa-viz")
    p.page.keyboard.press("ArrowRight")
    assert p.step("fa-viz") == 6
    p.page.keyboard.press("ArrowLeft")
    p.page.keyboard.press("ArrowLeft")
    assert p.step("fa-viz") == 4
    p.page.keyboard.press("End")
    assert p.step("fa-viz") == len(ref["steps"]) - 1
    p.page.keyboard.press("Home")
    assert p.step("fa-viz") == 0
    p.page.keyboard.press("+")
    p.page.keyboard.press("+")
    p.page.keyboard.press(" ")
    assert p.page.get_attribute("#fa-viz", "data-playing") == "true"
    p.page.wait_for_function("() => Number(document.querySelector('#fa-viz').dataset.step) >= 1",
                             timeout=WAIT_MS)
    p.page.keyboard.press(" ")
    assert p.page.get_attribute("#fa-viz", "data-playing") == "false"
    p.page.click("#fa-mode-standard")
    assert p.step("fa-viz") == 0
    assert p.value("#fa-hbm") == ref["standard"][0]["hbm_total"]
    p.page.keyboard.press("End")
    assert p.value("#fa-hbm") == ref["standard"][-1]["hbm_total"]
    assert ref["standard"][-1]["hbm_total"] > ref["steps"][-1]["hbm"]


def first_step_whose_max_grew(ref: dict) -> tuple[int, int]:
    """(step, row) of the first tile after a Q tile's first where a row's running max grew:
    where a starter that does not rescale acc goes wrong first."""
    for n, st in enumerate(ref["steps"]):
        for r in st["rows"]:
            if st["kt"] > 0 and r["alpha"] < 1:
                return n, r["i"]
    raise AssertionError("the inputs never raise a row's max: the trace shows no rescale")


@BROWSER
def test_a_starter_that_does_not_rescale_acc_differs_at_the_tile_where_the_max_grew(open_page):
    if not (ROOT / "labs" / "lab-00-online-softmax" / "solution.py").is_file():
        pytest.skip("the wrong starter is planted in a copy of solution.py (instructor's tree)")
    step, row = first_step_whose_max_grew(reference("00"))
    p = open_page("viz/flash-attention-tiling.html")
    panel = "#starter-00"
    assert p.page.get_attribute(panel, "data-state") == "differs"
    assert int(p.page.get_attribute(panel, "data-first-diff")) == step
    assert "acc" in p.page.inner_text(panel)
    p.page.click(f"{panel} [data-action=goto-diff]")
    assert p.step("fa-viz") == step
    assert p.page.get_attribute("#fa-state tr.differs", "data-row") == str(row)
    assert p.page.locator("#fa-yours-acc-0").count() == 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "viz_flash-attention-tiling-wrong-starter.png"
    p.page.locator("#fa-viz").screenshot(path=str(shot))


@BROWSER
def test_kernel_traces_outline_a_planted_kernel_mistake_at_its_program_and_tile(open_page):
    pytest.importorskip("triton", reason="the kernels are traced through Triton's interpreter")
    if not (ROOT / "labs" / "lab-00-online-softmax" / "solution.py").is_file():
        pytest.skip("the mistakes are planted in copies of solution.py (instructor's tree)")
    p = open_page("viz/kernel-traces.html")
    assert not p.errors, p.errors
    # lab 00: the causal loop that runs to Lq loads key tile 2 in program (0, 0, 0)
    viz = p.page.locator("#kt00-viz")
    assert viz.locator(".viz-starter").get_attribute("data-state") == "differs"
    assert (viz.get_attribute("data-first-diff-program"),
            viz.get_attribute("data-first-diff-tile")) == ("(0, 0, 0)", "1")
    outlined = viz.locator("td.first-diff")
    assert outlined.count() == 1
    assert (outlined.get_attribute("data-program"), outlined.get_attribute("data-tile")) == (
        "(0, 0, 0)", "1")
    assert "yours: keys 16..19 (4)" in outlined.inner_text(), outlined.inner_text()
    assert "key tile 2" in viz.locator(".viz-starter").inner_text()
    # the running state of that program's rows, per tile, is shown (the reference's numbers)
    state = reference("lab00-kernel")["tiles"]["(0, 0, 0)"]["tiles"][0]
    table = p.page.inner_text("#kt00-state")
    assert f"{state['m'][0]:.3f}, {state['l'][0]:.3f}" in table, table
    p.page.click("#kt00-grid button[data-program='(2, 0, 0)']")
    assert viz.get_attribute("data-program") == "(2, 0, 0)"
    # lab 09: the floor grid never runs program (2, 0, 0) of add_vectors (puzzle 2): its
    # store, the third call of the reference's program, is missing
    viz = p.page.locator("#kt09-viz")
    assert viz.get_attribute("data-puzzle") == "1"
    assert viz.get_attribute("data-first-diff-program") == "(2, 0, 0)"
    outlined = viz.locator("td.first-diff")
    assert outlined.count() == 1 and outlined.get_attribute("data-program") == "(2, 0, 0)"
    assert outlined.get_attribute("data-call") == "2"
    assert "stores of out 32..36 (5)" in outlined.inner_text()
    assert "yours: —" in outlined.inner_text(), outlined.inner_text()
    SHOTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#kt00-viz").screenshot(path=str(SHOTS / "viz_kernel-traces-wrong-kernel.png"))


@BROWSER
def test_split_kv_merge_orders_show_lab_04s_states_and_one_answer(open_page):
    ref = reference("04")
    p = open_page("viz/split-kv-merge.html")
    p.page.click("#split-order-sequential")
    for j, mg in enumerate(ref["orders"]["sequential"]["merges"]):
        p.page.click("#split-viz [data-action=step]")
        assert p.value(f"#split-m-{j}") == mg["state"]["m"]
        assert p.value(f"#split-l-{j}") == mg["state"]["l"]
    p.page.click("#split-viz [data-action=end]")
    for name, order in ref["orders"].items():
        assert p.value(f"#split-out-{name}") == order["out"]
        assert p.value(f"#split-lse-{name}") == order["lse"]


@BROWSER
def test_paged_blocks_show_lab_07s_tables_and_lab_01s_slots(open_page):
    ref, ref01 = reference("07"), reference("01")
    p = open_page("viz/paged-attention-blocks.html")
    cow = next(n for n, ev in enumerate(ref["events"]) if ev.get("copies"))
    p.page.focus("#paged-viz")
    for _ in range(cow):
        p.page.keyboard.press("ArrowRight")
    assert p.step("paged-viz") == cow
    assert p.value("#paged-free") == ref["events"][cow]["free_blocks"]
    assert p.value("#paged-copies") == len(ref["events"][cow]["copies"])
    assert p.page.locator("#paged-cow").count() == 1
    p.page.focus("#slots-viz")
    p.page.keyboard.press("End")
    last = ref01["steps"][-1]
    assert p.page.get_attribute("#slots-caption", "data-slot") == str(last["slot"])
    p.page.focus("#stream-viz")
    p.page.keyboard.press("ArrowRight")
    assert p.value("#stream-used-paged") == ref["paged"]["used"][1]
    for run in ("paged", "contiguous"):  # the whole-run readouts are lab 07's Stats
        st = ref[run]
        assert p.value(f"#stream-steps-{run}") == st["steps"]
        assert p.value(f"#stream-filled-{run}") == pytest.approx(1 - st["waste"])
        assert p.value(f"#stream-pool-{run}") == st["mean_utilisation"]
    assert ref["paged"]["waste"] < ref["contiguous"]["waste"], \
        "paging must fill more of what it holds"
    why = p.page.inner_text("#stream-why")  # the lower pool use of paged, explained on the page
    assert f"{ref['paged']['steps']} steps instead of {ref['contiguous']['steps']}" in why
    assert p.value("#stream-used-contiguous") == ref["contiguous"]["used"][1]


@BROWSER
def test_engine_steps_show_lab_11s_batches_block_tables_preemption_and_prefix_hits(open_page):
    ref = reference("11")
    steps = ref["steps"]
    preempted = [n for n, st in enumerate(steps) if st["preempted"]]
    hits = [n for n, st in enumerate(steps) if any(r["cached"] for r in st["rows"])]
    assert preempted and hits, "the page's workload must preempt and hit the prefix cache"
    assert any(r["kind"] == "recompute" for st in steps[preempted[0]:] for r in st["rows"])
    p = open_page("viz/serving-engine-steps.html")
    assert p.page.get_attribute("#starter-11", "data-state") == "none"
    p.page.focus("#engine-viz")
    for n, st in enumerate(steps):  # every step's batch, slots and tables are the trace's
        if n:
            p.page.keyboard.press("ArrowRight")
        assert p.step("engine-viz") == n
        assert p.value("#engine-free") == st["free_blocks"]
        assert p.value("#engine-tokens") == len(st["positions"])
        assert p.value("#engine-preempted") == st["preempted"]
        start = 0
        for r, row in enumerate(st["rows"]):
            assert p.page.get_attribute(f"#engine-row-{r}", "data-request") == row["request"]
            assert p.page.get_attribute(f"#engine-row-{r}", "data-kind") == row["kind"]
            assert p.value(f"#engine-pos-{r}") == st["positions"][start:start + row["tokens"]]
            assert p.value(f"#engine-slots-{r}") == st["slots"][start:start + row["tokens"]]
            start += row["tokens"]
        assert p.page.locator("[id^=engine-tok-]").count() == len(st["positions"])
        for rid, table in st["tables"].items():
            assert p.page.locator(f"[id^=engine-entry-{rid}-]").count() == len(table), (n, rid)
    assert p.value("#engine-free") == ref["engine"]["num_blocks"], "every block comes back"
    p.page.click("#engine-viz [data-action=reset]")
    p.page.click("#engine-next-preempt")  # the jump buttons land on the trace's own steps
    assert p.step("engine-viz") == preempted[0]
    victim = steps[preempted[0]]["preempted"][0]
    assert f"{victim} lost its blocks" in p.page.inner_text("#engine-caption")
    assert victim not in steps[preempted[0]]["tables"]
    later = next(n for n in hits if n > preempted[0])
    p.page.click("#engine-next-hit")
    assert p.step("engine-viz") == later
    row = next(r for r in steps[later]["rows"] if r["cached"])
    assert p.value("#engine-hit") == sum(r["cached"] for r in steps[later]["rows"])
    dash = p.page.get_attribute(f"#engine-entry-{row['request']}-0", "stroke-dasharray")
    assert dash, "a block found in the prefix cache is drawn as a hit"
    assert p.value("#engine-hit-total") == ref["hit_tokens"]


@BROWSER
def test_kv_cache_presets_show_lab_06s_bytes_per_token(open_page):
    ref = reference("06")
    p = open_page("viz/kv-cache-evolution.html")
    for i, preset in enumerate(ref["presets"]):
        p.page.select_option("#kv-preset", str(i))
        assert p.value("#kv-preset-bytes") == preset["bytes_per_token"]
        for kind in preset["kinds"]:  # the bars are the picked model's shape, not a fixed one
            assert p.value(f"#kv-bar-{kind['kind']}") == kind["bytes_per_token"], preset["name"]
        assert p.value(f"#kv-bar-{preset['kind']}") == preset["bytes_per_token"], \
            f"{preset['name']}: its own kind's bar must equal its readout"
        assert p.value(f"#kv-bar-request-{preset['kind']}") == \
            preset["bytes_per_token"] * 2 ** 15, "bytes per request = per token × context"
    p.page.focus("#kv-context")
    p.page.keyboard.press("ArrowRight")
    assert "65,536 tokens" in p.page.inner_text("#kv-context-label")


@BROWSER
def test_reduced_motion_turns_the_transitions_off(open_page):
    p = open_page("viz/flash-attention-tiling.html", reduced_motion="reduce")
    assert "reduced-motion" in p.page.get_attribute("#fa-viz", "class")
    duration = p.page.evaluate(
        "() => getComputedStyle(document.querySelector('#fa-viz .viz-svg rect'))"
        ".transitionDuration")
    assert duration == "0s"


@BROWSER
def test_ring_attention_steps_show_lab_04s_ring_step_states(open_page):
    ref = reference("ring")
    p = open_page("viz/ring-attention-rotation.html")
    p.page.focus("#ring-viz")
    p.page.keyboard.press("ArrowRight")
    for d in ref["runs"]["full"]["steps"][1]["devices"]:
        assert p.value(f"#ring-m-{d['device']}") == d["m"]
    p.page.click("#ring-run-causal")
    assert p.step("ring-viz") == 1
    for d in ref["runs"]["causal"]["steps"][1]["devices"]:
        assert p.value(f"#ring-l-{d['device']}") == d["l"]
        dash = p.page.get_attribute(f"#ring-holds-{d['device']}", "stroke-dasharray")
        assert (dash is not None) == d["masked"], "a masked shard is drawn dashed"


@BROWSER
def test_sliding_window_reach_is_lab_06s_window_composed(open_page):
    ref = reference("window")
    p = open_page("viz/sliding-window-receptive-field.html")
    p.page.focus("#window-w")
    p.page.keyboard.press("Home")
    p.page.focus("#window-layers")
    p.page.keyboard.press("End")
    w = ref["inputs"]["windows"][0]
    field = ref["windows"][str(w)]["receptive_field"][-1]
    assert p.value("#window-reach") == len(field)
    assert len(field) == ref["inputs"]["layers"] * (w - 1) + 1


@BROWSER
def test_memory_hierarchy_shows_lab_00s_score_matrix_bytes(open_page):
    ref = reference("memory")
    p = open_page("viz/gpu-memory-hierarchy.html")
    p.page.focus("#memory-seq")
    p.page.keyboard.press("End")
    assert p.value("#memory-s") == ref["score_matrix_bytes"][-1]
    assert "Sources:" in p.page.inner_text("#memory-viz")


@BROWSER
def test_scoring_functions_show_lab_08s_scale_experiment_at_each_d_k(open_page):
    ref = reference("08")
    p = open_page("viz/attention-scoring-functions.html")
    p.page.focus("#scoring-d")
    p.page.keyboard.press("Home")
    for n, st in enumerate(ref["steps"]):
        if n:
            p.page.keyboard.press("ArrowRight")
        assert p.page.get_attribute("#scoring-viz", "data-d") == str(st["d"])
        for field in ("variance_unscaled", "variance_scaled", "entropy_unscaled",
                      "entropy_scaled"):
            kind, scaled = field.split("_")  # e.g. #scoring-var-unscaled
            assert p.value(f"#scoring-{kind[:3]}-{scaled}") == st["stats"][field], (st["d"], field)
        for fn, ex in st["example"].items():
            assert p.value(f"#scoring-ent-{fn}") == ex["entropy"]
            assert p.value(f"#scoring-scores-{fn}") == ex["scores"]
            assert p.value(f"#scoring-bar-{fn}-0") == ex["weights"][0]
    last = ref["steps"][-1]["stats"]
    assert last["entropy_unscaled"] < 1 < last["entropy_scaled"], "the lesson the slider shows"


@BROWSER
def test_a_scale_experiment_that_divides_by_d_differs_from_d_k_2_on(open_page):
    if not (ROOT / "labs" / "lab-08-attention-from-scratch" / "solution.py").is_file():
        pytest.skip("the wrong starter is planted in a copy of solution.py (instructor's tree)")
    p = open_page("viz/attention-scoring-functions.html")
    panel = "#starter-08"
    assert p.page.get_attribute(panel, "data-state") == "differs"
    dims = reference("08")["inputs"]["dims"]
    assert int(p.page.get_attribute(panel, "data-first-diff")) == dims.index(2), \
        "at d_k = 1, dividing by d and by sqrt(d) agree: the first difference is d_k = 2"
    assert "scale_experiment" in p.page.inner_text(panel)
    p.page.click(f"{panel} [data-action=goto-diff]")
    assert p.page.get_attribute("#scoring-viz", "data-d") == "2"


@BROWSER
def test_bahdanau_steps_show_lab_08s_additive_weights_and_context(open_page):
    ref = reference("bahdanau")
    p = open_page("viz/attention-bahdanau-alignment.html")
    p.page.focus("#bahdanau-viz")
    p.page.keyboard.press("ArrowRight")
    p.page.keyboard.press("ArrowRight")
    assert p.step("bahdanau-viz") == 2
    st = ref["steps"][2]
    for j, w in enumerate(st["weights"]):
        assert p.value(f"#bahdanau-w-{j}") == w
        assert p.value(f"#bahdanau-e-{j}") == st["scores"][j]
        assert p.value(f"#bahdanau-cell-2-{j}") == w
        assert p.page.get_attribute(f"#bahdanau-cell-3-{j}", "data-value") is None, \
            "a decoder step not reached yet has no row"
    assert p.value("#bahdanau-entropy") == st["entropy"]
    assert p.value("#bahdanau-context") == st["context"]
    p.page.keyboard.press("End")
    assert p.step("bahdanau-viz") == ref["inputs"]["target"] - 1


@BROWSER
def test_multihead_maps_are_lab_08s_heads_and_masks(open_page):
    ref = reference("08")["multihead"]
    p = open_page("viz/attention-multihead-self.html")
    L = ref["inputs"]["L"]

    def check(run: str, head) -> None:
        r = ref["runs"][run]
        m = r["average"] if head == "avg" else r["heads"][head]
        assert p.page.get_attribute("#mh-viz", "data-run") == run
        for i in range(L):
            for j in range(L):
                assert p.value(f"#mh-cell-{i}-{j}") == m[i][j], (run, head, i, j)
        assert r["heads_average_to_mha"] is True
    check("full-whole", 0)
    p.page.select_option("#mh-head", "2")
    p.page.click("#mh-causal")
    check("causal-whole", 2)
    assert p.value(f"#mh-cell-0-{L - 1}") == 0, "causal: query 0 cannot read the last key"
    p.page.click("#mh-padding")
    check("causal-padded", 2)
    p.page.focus("#mh-viz")
    p.page.keyboard.press("a")
    p.page.keyboard.press("c")
    check("full-padded", "avg")
    assert p.value("#mh-kpm") == [int(b) for b in ref["runs"]["full-padded"]["key_padding_mask"]]
    if (ROOT / "labs" / "lab-08-attention-from-scratch" / "solution.py").is_file():
        # the planted starter reads key_padding_mask backwards: the maps first differ with
        # padding on (no mask at all is the same either way), at head 0
        p.page.click("#mh-padding")
        p.page.click("#mh-causal")
        assert p.page.get_attribute("#starter-08", "data-state") == "differs"
        p.page.click("#starter-08 [data-action=goto-diff]")
        assert p.page.get_attribute("#mh-viz", "data-run") == "full-padded"
        assert p.page.input_value("#mh-head") == "0"


@BROWSER
def test_fa1_vs_fa2_programs_come_from_lab_00s_launch_grid(open_page):
    ref = reference("fagrid")
    sys.path.insert(0, str(ROOT))
    from common.loader import load_lab_module

    provided = load_lab_module(ROOT / "labs" / "lab-00-online-softmax", "provided")
    i = ref["inputs"]
    grid = provided.attention_grid(i["batch"], i["heads"], i["L"], i["tile"])
    p = open_page("viz/fa1-vs-fa2-parallelism.html")
    assert p.value("#fagrid-programs") == grid[0] == ref["schedules"]["fa2"]["grid"][0]
    p.page.focus("#fagrid-viz")
    p.page.keyboard.press("ArrowRight")
    st = ref["schedules"]["fa2"]["steps"][1]
    for w in st["work"]:
        assert p.value(f"#fagrid-m-{w['program']}") == w["m"]
        assert p.value(f"#fagrid-l-{w['program']}") == w["l"]
        cell = f"#fagrid-cell-{w['bh']}-{w['qt']}-{w['kt']}"
        assert p.page.get_attribute(cell, "data-active") == "true"
    assert p.value("#fagrid-hbm") == st["hbm"]
    p.page.click("#fagrid-mode-fa1")
    assert p.step("fagrid-viz") == 0
    assert p.value("#fagrid-programs") == i["batch"] * i["heads"]
    p.page.keyboard.press("End")
    fa1 = ref["schedules"]["fa1"]["steps"]
    assert p.value("#fagrid-steps") == len(fa1) == ref["n_q"] * ref["n_k"]
    assert p.value("#fagrid-hbm") == fa1[-1]["hbm"] > ref["schedules"]["fa2"]["steps"][-1]["hbm"]
    # the same tile pair gives the same state in both orders
    last = {(w["bh"], w["qt"]): w for w in fa1[-1]["work"]}
    for w in ref["schedules"]["fa2"]["steps"][-1]["work"]:
        if (w["bh"], w["qt"]) in last:
            assert last[(w["bh"], w["qt"])]["m"] == w["m"]


@BROWSER
def test_pattern_zoo_shows_lab_10s_masks_and_their_errors(open_page):
    ref = reference("10")["zoo"]
    p = open_page("viz/attention-pattern-zoo.html")
    p.page.focus("#zoo-pattern-0")
    for i, pt in enumerate(ref["patterns"]):
        if i:
            p.page.keyboard.press("ArrowRight")  # radio buttons: the arrow picks the next one
        assert p.page.get_attribute("#zoo-viz", "data-pattern") == pt["name"]
        assert p.value("#zoo-pairs") == pt["pairs"]
        assert p.value("#zoo-error") == pt["relative_error"]
        n = ref["inputs"]["n"]
        for i_, j in ((n - 1, 0), (n - 1, n - 1), (0, n - 1), (5, 2)):
            assert p.page.get_attribute(f"#zoo-cell-{i_}-{j}", "data-value") == pt["rows"][i_][j]
    assert ref["patterns"][0]["relative_error"] == 0, "the dense pattern is exact"
    if (ROOT / "labs" / "lab-10-approximate-attention" / "solution.py").is_file():
        # the planted strided_mask (j % stride) first differs on the strided pattern
        strided = next(i for i, pt in enumerate(ref["patterns"]) if pt["name"] == "strided")
        assert int(p.page.get_attribute("#starter-10", "data-first-diff")) == strided
        p.page.click("#starter-10 [data-action=goto-diff]")
        assert p.page.get_attribute("#zoo-viz", "data-pattern") == "strided"
        # query 5 sees key 1 (4 back), not key 0 (5 back): the planted mask has it the other way
        assert p.page.get_attribute("#zoo-cell-5-1", "data-yours") == "0"
        assert p.page.get_attribute("#zoo-cell-5-0", "data-yours") == "1"
        assert p.page.locator("#zoo-viz rect[data-yours]").count() > 0


@BROWSER
def test_lsh_buckets_and_mass_are_lab_10s(open_page):
    ref = reference("10")["lsh"]
    p = open_page("viz/lsh-attention-bucketing.html")
    q = 4
    p.page.click(f"#lsh-point-{q}")
    assert p.page.get_attribute("#lsh-viz", "data-query") == str(q)
    p.page.focus("#lsh-rounds")
    for r in range(1, ref["inputs"]["rounds"] + 1):
        if r > 1:
            p.page.keyboard.press("ArrowRight")
        by = ref["by_rounds"][r - 1]
        assert p.value("#lsh-mass") == by["mass"][q]
        assert p.value("#lsh-error") == by["error"][q]
        share = [j for j in range(ref["inputs"]["n"])
                 if any(ref["buckets"][t][j] == ref["buckets"][t][q] for t in range(r))]
        assert p.value("#lsh-keys") == len(share)
        for j in range(ref["inputs"]["n"]):
            assert p.page.get_attribute(f"#lsh-point-{j}", "data-bucket") == \
                str(ref["buckets"][r - 1][j])
    masses = [b["mass"][q] for b in ref["by_rounds"]]
    assert masses == sorted(masses), "more rounds never lose keys"


@BROWSER
def test_complexity_scaling_shows_lab_10s_costs_and_errors_at_each_n(open_page):
    ref = reference("complexity")
    sizes = ref["inputs"]["sizes"]
    p = open_page("viz/attention-complexity-scaling.html")
    p.page.select_option("#complexity-metric", "error")
    assert p.page.get_attribute("#complexity-viz", "data-metric") == "error"
    p.page.focus("#complexity-n")
    p.page.keyboard.press("Home")
    for k, n in enumerate(sizes):
        if k:
            p.page.keyboard.press("ArrowRight")
        assert p.page.get_attribute("#complexity-viz", "data-n") == str(n)
        for m in ref["methods"]:
            slug = re.sub(r"[^a-z0-9]+", "-", m["name"], flags=re.I).lower()  # as the page
            for field in ("flops", "bytes", "error", "rms"):
                assert p.value(f"#complexity-{field}-{slug}") == m[field][k], (n, m["name"])
    exact = next(m for m in ref["methods"] if m["name"] == "exact")
    assert exact["flops"][-1] / exact["flops"][0] == (sizes[-1] / sizes[0]) ** 2
    # beyond the measured sizes, to about a million tokens: costs only, the modelled trace
    p.page.select_option("#complexity-metric", "flops")
    p.page.focus("#complexity-n")
    for j, n in enumerate(ref["inputs"]["model_sizes"]):
        p.page.keyboard.press("ArrowRight")
        assert p.page.get_attribute("#complexity-viz", "data-n") == str(n)
        for m in ref["modelled"]:
            slug = re.sub(r"[^a-z0-9]+", "-", m["name"], flags=re.I).lower()
            for field in ("flops", "bytes"):
                assert p.value(f"#complexity-{field}-{slug}") == m[field][j], (n, m["name"])
        assert p.page.locator("#complexity-error-exact").count() == 0, "no error is run there"
    assert ref["inputs"]["model_sizes"][-1] >= 10 ** 6
    for metric in ("flops", "bytes", "error", "rms"):  # ticks in plain units, never 1.0e+9
        p.page.select_option("#complexity-metric", metric)
        ticks = p.page.locator("#complexity-viz .y-tick").all_text_contents()
        assert ticks and not any(re.search(r"\de[+-]?\d", t) for t in ticks), (metric, ticks)
    marks = p.page.locator("#complexity-viz .context-mark")
    marked = marks.evaluate_all("els => els.map(e => e.getAttribute('data-n'))")
    assert [int(x) for x in marked] == \
        [c[1] for c in ref["inputs"]["contexts"]], "real models' context lengths are marked"


@BROWSER
def test_search_works_from_the_file_system(open_page):
    p = open_page("index.html")
    p.page.fill("input.md-search__input", "running max")
    p.page.wait_for_selector(".md-search-result__item", timeout=WAIT_MS)
    assert p.page.locator(".md-search-result__item").count() > 0
    assert p.errors == []


def test_glossary_terms_become_hover_definitions_and_link_titles(tmp_path):
    """Without a browser: GLOSSARY.md's `### Term` sections -> abbreviations and link titles."""
    from book.build import Site, abbreviations, github_slug, glossary_terms

    glossary = tmp_path / "GLOSSARY.md"
    glossary.write_text("# Glossary\n\n### KV cache\nThe keys and values kept for every token. "
                        "More.\n\nNext paragraph.\n\n### Tensor core\nA unit that multiplies "
                        "[tiles](https://example.org).\n")
    terms = glossary_terms(glossary)
    assert terms == {"KV cache": "The keys and values kept for every token.",
                     "Tensor core": "A unit that multiplies tiles."}
    assert glossary_terms(tmp_path / "missing.md") == {}
    abbr = abbreviations(terms)  # lower-case uses in prose get the hover too, acronyms do not
    assert "*[Tensor core]: A unit" in abbr and "*[tensor core]: A unit" in abbr
    assert "*[KV cache]:" in abbr and "*[kV cache]" not in abbr and "*[kv cache]" not in abbr
    assert github_slug("KV cache") == "kv-cache" and github_slug("Tensor core") == "tensor-core"
    site = Site(tmp_path / "docs")
    site.pages[ROOT / "GLOSSARY.md"] = tmp_path / "docs" / "GLOSSARY.md"
    site.slugs = {github_slug(t): d for t, d in terms.items()}
    lab = ROOT / "labs" / "lab-00-online-softmax" / "README.md"
    text = site.rewrite(lab, "a [KV cache](../../GLOSSARY.md#kv-cache) and [x](solution.py)\n"
                             "```\n[kept](in/code.md)\n```\n")
    assert '[KV cache](../../GLOSSARY.md#kv-cache "The keys and values kept for every token.")' \
        in text
    assert "and x\n" in text, "a link to a file the book does not hold keeps its text"
    assert "[kept](in/code.md)" in text, "code blocks are left alone"


# (lab, line of solution.py, the planted mistake, expected first difference (step, field))
PLANTED = {
    "01": ("    logical_block, offset = np.divmod(positions, block_size)",
           "    logical_block, offset = np.divmod(positions + 1, block_size)", "slot"),
    "04": ("    l = alpha * a.l + beta * b.l", "    l = a.l + b.l", "merge"),
    "07": ("        copy_on_write = self._must_copy(table, num_tokens, n)",
           "        copy_on_write = 0", "tables"),
    "08": (SCALE_LINE, "    scaled = raw / d", "scale_experiment"),
    "10": (STRIDE_LINE, STRIDE_WRONG, "mask"),
    "11": (PREEMPT_LINE, PREEMPT_LINE.replace("pop()", "pop(0)"), "rows"),  # the oldest
}


def expected_step(lab: str) -> int:
    if lab == "01":
        return 0  # every slot is one late, the first token's too
    if lab == "04":
        return len(reference("04")["partitions"])  # partitions are right; the first merge is not
    if lab == "08":
        return reference("08")["inputs"]["dims"].index(2)  # at d = 1, d and sqrt(d) agree
    if lab == "11":  # the batches agree until the pool first runs out
        return next(n for n, st in enumerate(reference("11")["steps"]) if st["preempted"])
    if lab == "10":  # the dense pattern is right; the strided one is not
        return [pt["name"] for pt in reference("10")["zoo"]["patterns"]].index("strided")
    return next(n for n, ev in enumerate(reference("07")["events"]) if ev.get("copies"))


@pytest.mark.parametrize("lab", [  # lab 11's trace runs the engine (3 s): make test-slow
    pytest.param(lab, marks=pytest.mark.slow) if lab == "11" else lab for lab in sorted(PLANTED)])
def test_make_trace_finds_the_first_step_a_planted_mistake_changes(tmp_path, lab):
    """`make trace LAB=nn` for labs 01, 04, 07, 08, 10, 11 (lab 00: in the browser test
    above)."""
    folder = next((ROOT / "labs").glob(f"lab-{lab}-*"))
    if not (folder / "solution.py").is_file():
        pytest.skip("the mistake is planted in a copy of solution.py (instructor's tree)")
    line, wrong, field = PLANTED[lab]
    code = (folder / "solution.py").read_text()
    assert line in code, f"the planted mistake no longer applies to lab {lab}'s solution"
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "starter.py").write_text(code.replace(line, wrong))
    (copy / "solution.py").unlink()
    assert traces_main(["--impl", "starter", "--lab", lab, "--lab-dir", str(copy),
                        "--out", str(tmp_path)]) == 0
    trace = read_script(tmp_path / f"lab{lab}-starter.js")
    diff = trace["first_diff"]
    assert diff is not None and (diff["step"], diff["field"]) == (expected_step(lab), field), diff
    if lab == "08":
        assert trace["page_diffs"]["multihead"] is None, "the scale mistake leaves the masks"
    if lab == "10":
        assert trace["page_diffs"]["lsh"] is None, "a wrong strided mask leaves the buckets"
    (copy / "starter.py").write_text(code)  # the reference itself: no difference anywhere
    assert traces_main(["--impl", "starter", "--lab", lab, "--lab-dir", str(copy),
                        "--out", str(tmp_path)]) == 0
    assert read_script(tmp_path / f"lab{lab}-starter.js")["first_diff"] is None


@pytest.mark.skipif(not list(ROOT.glob("labs/*/solution.py")),
                    reason="a student copy: its starters are the student's, not untouched ones")
@pytest.mark.parametrize("lab", STARTER_TRACES)
def test_an_untouched_starter_is_traced_with_its_todo(tmp_path, lab):
    assert traces_main(["--impl", "starter", "--lab", lab, "--out", str(tmp_path)]) == 0
    trace = read_script(tmp_path / f"lab{lab}-starter.js")
    assert trace["first_diff"] is not None and trace["first_diff"]["step"] == 0
    assert any("NotImplementedError" in e for e in trace["errors"]), trace["errors"]


def test_the_committed_reference_traces_are_the_solutions_current_output(tmp_path):
    """A student copy has no solutions: its book plays the committed traces."""
    if not any((ROOT / "labs").glob("*/solution.py")):
        pytest.skip("the reference traces are made from solution.py (instructor's tree)")
    assert traces_main(["--out", str(tmp_path)]) == 0
    # The kernels' traces run through Triton's interpreter: without triton (a Mac) they hold
    # the error instead, and the committed ones (made where triton runs) stay the reference.
    unmade = set() if HAVE_TRITON else {f"lab{n}-reference.js" for n in KERNEL_TRACES}
    for made in sorted(tmp_path.glob("*.js")):
        if made.name not in unmade:
            assert_trace_is_current(made, made.name, "book.traces")
    extra = sorted({f.name for f in (ROOT / "book" / "viz" / "traces").glob("*.js")}
                   - {f.name for f in tmp_path.glob("*.js")}
                   - {f"{ATTENTION_TRACE}.js"}  # book.attention_trace's, checked below
                   - {f"{ALIGNMENT_TRACE}.js"}  # book.alignment_trace's, checked below
                   - {f"{APPROX_TRACE}.js"})  # book.approximation_trace's, checked below
    assert not extra, f"{extra} are no longer written by book.traces: delete them"


SVG_CHECK = (ROOT / "tests" / "book_svg_check.js").read_text()


@BROWSER
@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("rel", [f"viz/{n}.html" for n in VIZ] + [
    "index.html", "viz/index.html", "labs/lab-00-online-softmax/index.html"])
def test_every_page_is_legible_in_both_colour_schemes_with_no_overlapping_labels(open_page, rel,
                                                                                  scheme):
    """axe-core's colour-contrast rule finds no violation in the HTML, and no SVG text label
    falls under WCAG's 4.5:1 against what is drawn under it or overlaps another label: wide
    and narrow, at the first step and the last."""
    axe = pytest.importorskip("axe_playwright_python.sync_playwright",
                              reason="axe-playwright-python is not installed "
                              "(requirements-book.txt)")
    for width in (1280, 390):
        p = open_page(rel, width=width, color_scheme=scheme)
        p.page.wait_for_timeout(100)
        expected = "slate" if scheme == "dark" else "default"
        assert p.page.get_attribute("body", "data-md-color-scheme") == expected
        for moment in ("first", "last"):
            if moment == "last":
                if p.page.locator(".viz [data-action=end]").count() == 0:
                    continue
                p.page.focus(".viz")  # the key, not a click: no hover tooltip in the way
                p.page.keyboard.press("End")
                p.page.wait_for_timeout(450)  # the header's fade, the panels' transitions
            found = axe.Axe().run(p.page, options={"runOnly": ["color-contrast"]}).response
            bad = [(n["target"], n["any"][0]["message"] if n["any"] else "")
                   for v in found["violations"] for n in v["nodes"]]
            assert bad == [], f"{rel} ({scheme}, {width} px, {moment} step): {bad[:5]}"
            svg = p.page.evaluate(SVG_CHECK)
            assert svg["low"] == [], \
                f"{rel} ({scheme}, {width} px, {moment} step): labels too faint {svg['low'][:5]}"
            assert svg["overlaps"] == [], \
                f"{rel} ({scheme}, {width} px, {moment} step): labels overlap {svg['overlaps'][:5]}"
        if scheme == "dark" and width == 1280:
            SHOTS.mkdir(parents=True, exist_ok=True)
            name = rel.replace("/", "_").removesuffix(".html")
            p.page.screenshot(path=str(SHOTS / f"{name}-dark.png"))


@BROWSER
def test_a_trained_models_heads_are_the_traces_and_the_named_head_is_the_measured_one(open_page):
    ref = reference("adder")
    scores = ref["scores"]
    for s, name in enumerate(ref["score_names"]):  # the named head is the argmax, not a pick
        best = max(((l_, h) for l_ in range(ref["layers"]) for h in range(ref["heads"])),
                   key=lambda lh: scores[s][lh[0]][lh[1]])
        assert (ref["found"][name]["layer"], ref["found"][name]["head"]) == best, name
    assert all(r["correct"] for r in ref["runs"]), "the trained model should add correctly"
    p = open_page("viz/attention-multihead-self.html")
    top = ref["found"]["aligned digits"]
    assert p.page.get_attribute("#adder-viz", "data-view") == f"0-{top['layer']}-{top['head']}"
    for run in range(len(ref["runs"])):
        p.page.select_option("#adder-problem", str(run))
        for layer in range(ref["layers"]):
            p.page.select_option("#adder-layer", str(layer))
            for head in range(ref["heads"]):
                p.page.select_option("#adder-head", str(head))
                assert p.page.get_attribute("#adder-viz", "data-view") == f"{run}-{layer}-{head}"
                w = ref["runs"][run]["weights"][layer][head]
                for i, j in ((len(w) - 1, 0), (8, 1), (9, 6), (5, 4)):
                    assert p.value(f"#adder-cell-{i}-{j}") == w[i][j], (run, layer, head, i, j)
                assert p.value("#adder-aligned") == scores[1][layer][head]
                assert p.value("#adder-prev") == scores[0][layer][head]
    p.page.click("[data-action=show-previous-token]")
    prev = ref["found"]["previous token"]
    view = p.page.get_attribute("#adder-viz", "data-view")
    assert view.endswith(f"-{prev['layer']}-{prev['head']}")


def test_the_committed_attention_trace_is_the_trained_models_current_output(tmp_path):
    """`python -m book.attention_trace` reproduces the committed trace (one torch thread)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from book.attention_trace import main as attention_main
    assert attention_main(["--out", str(tmp_path)]) == 0
    assert_trace_is_current(tmp_path / "adder-reference.js", "adder-reference.js",
                            "book.attention_trace")


@BROWSER
def test_a_trained_alignment_is_the_traces_beside_the_expected_permutation(open_page):
    """Every date and decoder step of the date model's page shows the trace's weights, the
    expected copy and the held-out measurements; the model learned the reordering."""
    ref = reference("dates")
    held = ref["held_out"]
    assert held["exact"] == 1.0 and held["digits_argmax"] > 0.95, held
    assert all(r["correct"] and r["held_out"] for r in ref["runs"])
    p = open_page("viz/bahdanau-trained-alignment.html")
    exp = ref["expected_source"]
    for run, r in enumerate(ref["runs"]):
        p.page.select_option("#dates-date", str(run))
        p.page.click("#dates-viz [data-action=reset]")
        for k in range(len(r["weights"])):
            assert p.page.get_attribute("#dates-viz", "data-view") == f"{run}-{k}"
            for j in range(len(r["source"])):
                assert p.value(f"#dates-cell-{k}-{j}") == r["weights"][k][j], (run, k, j)
                assert p.value(f"#dates-w-{j}") == r["weights"][k][j]
                assert p.value(f"#dates-e-{j}") == r["scores"][k][j]
                on = k < len(exp) and exp[k] == j and r["source"][j].isdigit()
                assert p.value(f"#dates-expected-{k}-{j}") == int(on), (run, k, j)
            if k < len(exp):
                assert p.value("#dates-mass-here") == held["mass_on_copied"][k]
            assert p.value("#dates-argmax") == held["digits_argmax"]
            p.page.click("#dates-viz [data-action=step]")


def test_the_committed_alignment_trace_is_the_date_models_current_output(tmp_path):
    """`python -m book.alignment_trace` reproduces the committed trace (one torch thread)."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    if not (ROOT / "labs" / "lab-08-attention-from-scratch" / "solution.py").is_file():
        pytest.skip("the trace runs lab 08's solution (instructor's tree)")
    from book.alignment_trace import main as alignment_main
    assert alignment_main(["--out", str(tmp_path)]) == 0
    assert_trace_is_current(tmp_path / "dates-reference.js", "dates-reference.js",
                            "book.alignment_trace")


def test_the_date_models_training_is_seeded(tmp_path):
    """Two short runs of `models.bahdanau` write the same weights and log (the shipped model
    comes from `make model-dates`, the same code at 500 steps)."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from models import bahdanau
    for name in ("a", "b"):
        bahdanau.train(steps=3, seed=0, batch_size=8, lr=5e-3, out=tmp_path / name)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "model.safetensors").read_bytes()
    log = [(tmp_path / n / "train_log.txt").read_text().splitlines()[:-1] for n in "ab"]
    assert log[0] == log[1]


@BROWSER
def test_lab_10_on_a_trained_models_qk_shows_the_traces_spectrum_and_errors(open_page):
    """Every head's singular values, ranks and method errors on the page are the trace's."""
    ref = reference("adder-approx")
    p = open_page("viz/approximations-on-a-trained-model.html")
    flattest = max(range(len(ref["spectrum"])), key=lambda i: (ref["spectrum"][i]["rank90"], -i))
    assert p.page.get_attribute("#approx-viz", "data-view") == str(flattest)
    for h, (sp, rt) in enumerate(zip(ref["spectrum"], ref["retrieval"])):
        p.page.select_option("#approx-head", str(h))
        assert p.page.get_attribute("#approx-viz", "data-view") == str(h)
        assert p.value("#approx-rank") == sp["rank90"]
        for i, v in enumerate(sp["sv"]):
            assert p.value(f"#approx-sv-head-{i}") == v
        for i, m in enumerate(ref["methods"]):
            assert p.value(f"#approx-err-{i}") == rt["error"][m], (h, m)
            assert p.value(f"#approx-task-{i}") == ref["synthetic"]["task_error"][m]
    assert p.value("#approx-rank-random") == ref["synthetic"]["random_rank90"]
    exact = ref["methods"].index("chunked (exact)")
    assert all(r["error"]["chunked (exact)"] < 1e-12 for r in ref["retrieval"]), exact


def test_the_committed_approximation_trace_is_lab_10_on_the_models_current_qk(tmp_path):
    """`python -m book.approximation_trace` reproduces the committed trace (one torch thread)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not (ROOT / "labs" / "lab-10-approximate-attention" / "solution.py").is_file():
        pytest.skip("the trace runs lab 10's solution (instructor's tree)")
    from book.approximation_trace import main as approx_main
    assert approx_main(["--out", str(tmp_path)]) == 0
    assert_trace_is_current(tmp_path / f"{APPROX_TRACE}.js", f"{APPROX_TRACE}.js",
                            "book.approximation_trace")
def test_the_vendored_d3_and_katex_are_the_pinned_versions_with_their_licences():
    """book/viz/vendor/ holds what `make vendor` copies at book/vendor/package.json's pins."""
    from book.vendor import D3_FILES, D3_MODULES, versions
    vendor = ROOT / "book" / "viz" / "vendor"
    pins = versions()
    listed = dict(line.split() for line in (vendor / "VERSIONS").read_text().splitlines())
    assert listed == {n: pins[n] for n in (*D3_MODULES, "katex")}, "run make vendor"
    d3 = "".join((vendor / "d3" / f).read_text() for f in D3_FILES)
    banners = re.findall(r"^// https://d3js.org/(d3-[a-z]+)/ v(\S+) ", d3, flags=re.M)
    assert banners == [(n, pins[n]) for n in D3_MODULES], "d3/*.min.js: not the pinned modules"
    licences = (vendor / "d3" / "LICENSES.txt").read_text()
    assert all(f"== {n} {pins[n]} ==" in licences for n in D3_MODULES)
    katex = (vendor / "katex" / "katex.min.js").read_text()
    assert f'version:"{pins["katex"]}"' in katex.replace(" ", ""), "katex.min.js is not the pin"
    assert "MIT" in (vendor / "katex" / "LICENSE").read_text()
    css = (vendor / "katex" / "katex.min.css").read_text()
    fonts = re.findall(r"url\(fonts/([\w-]+\.woff2)\)", css)
    assert fonts and all((vendor / "katex" / "fonts" / f).is_file() for f in fonts), \
        "every woff2 font KaTeX's stylesheet names is vendored (the book works offline)"


def test_the_fa3_timelines_are_fa3_schedule_and_never_double_book_a_unit():
    """The FA3 page's model: each unit (copy engine, tensor cores, exponentials) runs one
    operation at a time, a tile's GEMM waits for its copy, and the same work takes less time
    when one warpgroup's softmax hides under the other's wgmma."""
    from common.loader import load_lab_module
    traces = load_lab_module(ROOT / "labs" / "lab-00-online-softmax", "traces")
    ref = reference("fa3")
    assert ref["modelled"] is True
    unit = {"tma": "tma", "wgmma": "tensor", "softmax": "sfu"}
    for mode in ("fa2", "fa3"):
        run = traces.fa3_schedule(mode)
        assert run == ref["runs"][mode], f"book/viz/traces/fa3-reference.js is stale ({mode})"
        for u in set(unit.values()):
            spans = sorted((b["start"], b["end"]) for b in run["bars"] if unit[b["kind"]] == u)
            assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:])), (mode, u)
        copies = {b["tile"]: b["end"] for b in run["bars"] if b["kind"] == "tma"}
        assert all(b["start"] >= copies[b["tile"]] for b in run["bars"] if b["kind"] == "wgmma")
        gemms = sum(b["end"] - b["start"] for b in run["bars"] if b["kind"] == "wgmma")
        assert run["tensor_busy"] == pytest.approx(gemms / run["total_ns"], abs=1e-4)
    assert ref["runs"]["fa3"]["total_ns"] < ref["runs"]["fa2"]["total_ns"]
    with pytest.raises(ValueError, match="mode"):
        traces.fa3_schedule("fa4")


@BROWSER
def test_fa3_page_plays_fa3_schedules_timelines_with_their_totals(open_page):
    ref = reference("fa3")
    p = open_page("viz/fa3-warp-specialization.html")
    assert "a model" in p.page.inner_text("h1")
    for run in ("fa2", "fa3"):
        assert p.value(f"#fa3-total-{run}") == ref["runs"][run]["total_ns"]
        assert p.value(f"#fa3-tflops-{run}") == ref["runs"][run]["tflops"]
        bars = p.page.locator(f"#fa3-{run} rect.bar")
        assert bars.count() == len(ref["runs"][run]["bars"])
    assert p.value("#fa3-speedup") == ref["speedup"]
    p.page.focus("#fa3-viz")
    p.page.keyboard.press("End")
    p.page.wait_for_timeout(700)  # the bars' transitions
    t = float(p.page.get_attribute("#fa3-viz", "data-time"))
    assert t == ref["runs"]["fa2"]["total_ns"]
    for run in ("fa2", "fa3"):
        assert p.value(f"#fa3-tiles-{run}") == ref["inputs"]["kv_tiles"]
        widths = p.page.locator(f"#fa3-{run} rect.bar").evaluate_all(
            "els => els.map(e => Number(e.getAttribute('width')))")
        assert min(widths) > 0, "at the end every bar is drawn"
    p.page.keyboard.press("Home")
    p.page.wait_for_timeout(700)
    assert p.value("#fa3-tiles-fa3") == 0


@BROWSER
def test_ring_wall_times_are_lab_04s_ring_timeline_and_the_shards_travel(open_page):
    ref = reference("ring")
    p = open_page("viz/ring-attention-rotation.html")
    names = ["ring overlapped", "ring, no overlap", "all-gather, then compute"]
    for shard in ref["timing_inputs"]["shards"]:
        tm = ref["timing"][str(shard)]
        p.page.select_option("#ring-shard", str(shard))
        for i, name in enumerate(names):
            assert p.value(f"#ring-wall-{i}") == tm["wall_us"][name], (shard, name)
            assert p.value(f"#ring-mem-{i}") == tm["kv_memory"][name], (shard, name)
        assert p.page.get_attribute("#ring-hidden", "data-hidden") == str(tm["hidden"]).lower()
        assert f"{shard:,} tokens per device" in p.page.text_content("#ring-timeline")
    small, large = (ref["timing"][str(s)] for s in (ref["timing_inputs"]["shards"][0],
                                                    ref["timing_inputs"]["shards"][-1]))
    assert not small["hidden"] and large["hidden"], "compute grows as the shard squared"
    before = p.page.get_attribute("#ring-chip-0", "transform")
    p.page.focus("#ring-viz")
    p.page.keyboard.press("ArrowRight")
    p.page.wait_for_timeout(900)  # the shard's transition along the ring
    assert p.page.get_attribute("#ring-chip-0", "transform") != before, "K/V shard 0 moved on"
    tm = ref["timing"][str(ref["timing_inputs"]["shards"][-1])]
    two = sum(max(s["compute_us"], s["send_us"]) for s in tm["steps"][:2])
    assert p.value("#ring-wall-now-overlapped") == pytest.approx(two, abs=1e-3)


@BROWSER
def test_flash_tiles_travel_into_sram_and_both_schedules_hbm_bytes_sit_side_by_side(open_page):
    ref = reference("00")
    p = open_page("viz/flash-attention-tiling.html")
    # one step, and in the same task where the K/V tile starts: on its strip, in flight
    start, flying = p.page.evaluate("""() => {
        const v = document.querySelector('#fa-viz');
        v.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowRight', bubbles: true}));
        const r = document.querySelector('#fa-mover-kv rect');
        return [Number(r.getAttribute('y')), !!r.__transition];
    }""")
    assert flying, "the K/V tile travels (a D3 transition), it does not jump"
    p.page.wait_for_function("y => Number(document.querySelector('#fa-mover-kv rect')"
                             ".getAttribute('y')) > y + 300", arg=start, timeout=WAIT_MS)
    st = ref["steps"][1]
    assert p.value("#fa-meter-flash") == st["hbm"]
    assert p.value("#fa-meter-standard") == ref["standard"][-1]["hbm_total"]
    box = p.page.locator("#fa-tile-box")
    assert float(box.get_attribute("x")) > float(p.page.locator("#fa-viz svg rect").first
                                                 .get_attribute("x")), "the outline is on tile 1"
    p.page.click("#fa-mode-standard")
    p.page.wait_for_timeout(500)
    assert p.value("#fa-meter-standard") == ref["standard"][0]["hbm_total"]
    assert p.value("#fa-meter-flash") == ref["steps"][-1]["hbm"]
    assert "so far" in p.page.inner_text("#fa-viz .viz-meter")


@BROWSER
def test_lsh_hash_regions_are_lab_10s_buckets_and_turn_with_the_round(open_page):
    ref = reference("10")["lsh"]
    p = open_page("viz/lsh-attention-bucketing.html")
    for r, regions in enumerate(ref["regions"]):
        covered = sum(g["to"] - g["from"] for g in regions)
        assert covered == 360, "the wedges of a round cover the plane once"
        if r:
            before = p.page.get_attribute(f"#lsh-region-{regions[0]['bucket']}", "d")
            p.page.focus("#lsh-rounds")
            p.page.keyboard.press("ArrowRight")
            p.page.wait_for_function(
                "([b, d]) => document.querySelector('#lsh-region-' + b).getAttribute('d') !== d",
                arg=[regions[0]["bucket"], before], timeout=WAIT_MS)
        assert p.page.get_attribute("#lsh-regions", "data-round") == str(r + 1)
        for g in regions:
            assert p.page.get_attribute(f"#lsh-region-{g['bucket']}", "data-from") == \
                str(g["from"] % 360)


@BROWSER
def test_fa1_vs_fa2_occupancy_at_a_real_size_is_sm_occupancy_for_every_batch(open_page):
    ref = reference("fagrid")
    p = open_page("viz/fa1-vs-fa2-parallelism.html")
    for gpu, rows in ref["occupancy"].items():
        p.page.select_option("#fagrid-gpu", gpu)
        for i, r in enumerate(rows):
            p.page.select_option("#fagrid-batch", str(i))
            assert p.page.get_attribute("#fagrid-occupancy", "data-batch") == str(r["batch"])
            for n in ("fa1", "fa2"):
                assert p.value(f"#fagrid-occ-programs-{n}") == r[n]["programs"]
                assert p.value(f"#fagrid-occ-waves-{n}") == r[n]["waves"]
                assert p.value(f"#fagrid-occ-time-{n}") == r[n]["time"]
            assert p.value("#fagrid-occ-speedup") == r["speedup"]
        first, last = rows[0], rows[-1]
        assert first["speedup"] > 2 > 1.1 > last["speedup"], \
            "at batch 1 FlashAttention-2 fills the SMs; at a large batch both do"
        assert first["fa1"]["programs"] < ref["sms"][gpu] <= first["fa2"]["programs"]


@BROWSER
@pytest.mark.parametrize("rel", ["labs/lab-00-online-softmax/index.html",
                                 "viz/fa3-warp-specialization.html"])
def test_a_tap_on_a_glossary_term_opens_its_definition(open_page, rel):
    """On a touch screen (no hover): a tap on a term shows its definition; every term is
    also reachable with Tab (its tooltip follows focus)."""
    if not (ROOT / "GLOSSARY.md").is_file():
        pytest.skip("the repository has no GLOSSARY.md: the book has no glossary")
    p = open_page(rel, width=390, has_touch=True, is_mobile=True)
    term = p.page.locator("article abbr[title]").first
    definition = term.get_attribute("title")
    term.scroll_into_view_if_needed()
    term.tap()
    tip = p.page.locator(".md-tooltip2--active")
    tip.wait_for(state="visible", timeout=WAIT_MS)
    assert definition[:40] in tip.inner_text(), "the tooltip shows the term's definition"
    unreachable = p.page.locator("article abbr[title]:not([tabindex='0'])").count()
    assert unreachable == 0, "every glossary term can be focused (Tab, or a tap)"


SVG_CLIP = (ROOT / "tests" / "book_svg_clip.js").read_text()


@BROWSER
@pytest.mark.parametrize("rel", [f"viz/{n}.html" for n in VIZ])
def test_no_svg_label_is_clipped_by_its_drawing_or_runs_over_its_box(open_page, rel):
    """From the SVG's bounding boxes (tests/book_svg_clip.js): every label inside its
    drawing, and a label written on a box inside that box; wide and narrow, first and last
    step."""
    for width in (1280, 390):
        p = open_page(rel, width=width)
        p.page.wait_for_timeout(100)
        for moment in ("first", "last"):
            if moment == "last":
                if p.page.locator(".viz [data-action=end]").count() == 0:
                    continue
                p.page.focus(".viz")
                p.page.keyboard.press("End")
                p.page.wait_for_timeout(900)  # the D3 transitions (at most 700 ms)
            found = p.page.evaluate(SVG_CLIP)
            assert found["outside"] == [], \
                f"{rel} ({width} px, {moment}): cut off {found['outside'][:5]}"
            assert found["overflow"] == [], \
                f"{rel} ({width} px, {moment}): runs over its box {found['overflow'][:5]}"


# the button's label is `label` and the visualisation is full screen exactly when it says so
FULLSCREEN_SHOWN = """([id, label]) => {
  const b = document.querySelector('#' + id + ' > .viz-frame [data-action=fullscreen]');
  const full = document.fullscreenElement === document.getElementById(id);
  return b !== null && b.innerText.trim() === label && full === (label === 'Exit full screen');
}"""

@BROWSER
@pytest.mark.parametrize("rel", [f"viz/{n}.html" for n in VIZ])
def test_every_visualisation_has_full_screen_and_new_tab_buttons_that_do_what_they_say(
        open_page, rel):
    p = open_page(rel)
    ids = p.page.locator(".viz[id]").evaluate_all("els => els.map(e => e.id)")
    assert ids
    for vid in ids:
        full = p.page.locator(f"#{vid} > .viz-frame [data-action=fullscreen]")
        assert full.inner_text() == "Full screen"
        for label in ("Exit full screen", "Full screen"):
            full.click()  # the label follows the fullscreenchange event, which comes after
            p.page.wait_for_function(FULLSCREEN_SHOWN, arg=[vid, label], timeout=WAIT_MS)
        link = p.page.locator(f"#{vid} > .viz-frame [data-action=new-tab]")
        assert link.get_attribute("target") == "_blank"
        href = link.get_attribute("href")
        assert href.endswith(f"?viz={vid}")
        solo = p.context.new_page()
        solo.goto(href)
        solo.wait_for_load_state("load")
        solo.locator(f"#{vid}").wait_for(state="visible", timeout=WAIT_MS)  # the new tab shows it
        solo.locator(".md-header").wait_for(state="hidden", timeout=WAIT_MS)  # ... alone, without
        solo.locator("article h1").wait_for(state="hidden", timeout=WAIT_MS)  # the site around it
        solo.close()


@BROWSER
def test_a_new_request_mid_stream_is_out_of_memory_when_contiguous_and_fits_paged(open_page):
    ref = reference("07")
    p = open_page("viz/paged-attention-blocks.html")
    button = p.page.locator("#stream-arrive")
    assert button.inner_text() == "A new request arrives now"
    p.page.focus("#stream-viz")
    p.page.keyboard.press("ArrowRight")
    button.click()
    assert button.inner_text() == "Take the new request back"
    total, k = ref["paged"]["total_slots"], 1
    for run in ("contiguous", "paged"):
        assert p.value(f"#stream-free-{run}") == total - ref[run]["reserved"][k], run
    assert p.value("#stream-need-contiguous") == ref["stream"]["max_model_len"]
    assert p.page.get_attribute("#stream-arrival-contiguous", "data-fits") == "false"
    assert p.page.get_attribute("#stream-arrival-paged", "data-fits") == "true"
    assert p.page.text_content("#stream-verdict-contiguous") == "OOM"
    assert p.page.locator("#stream-new-paged").count() == 1
    button.click()
    assert p.page.locator("#stream-arrival").count() == 0
