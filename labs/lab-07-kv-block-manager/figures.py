"""Draw lab 07's README figures from the lab's own code (``make figures``) and print the
numbers the README quotes.

figures/prefix_sharing.png  the README's worked example: two requests sharing the blocks of
                            a cached prefix (reference counts, hashes, free queue), then a
                            fork whose first write copies the shared partial block
figures/utilisation.png     KV-pool utilisation over time of one workload, paged (simulate)
                            against contiguous max_model_len reservations
                            (simulate_contiguous), with the PagedAttention paper's range
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the repository root, for `common`
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No "Software: matplotlib x.y" text chunk in the PNG: a rerun writes the same bytes.
PNG_METADATA = {"Software": None}
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from common.loader import load_impl, load_lab_module  # noqa: E402

OUT = HERE / "figures"
lab = load_impl(HERE, "solution")
provided = load_lab_module(HERE, "provided")
Request = provided.Request

BLOCK_SIZE, NUM_BLOCKS = 4, 8
T = list(range(100, 110))  # the README's request A: ten prompt tokens
U = [200, 201, 202]
COLORS = {"A": "#4C72B0", "B": "#DD8452", "B2": "#55A868", "C": "#8172B3"}
FREE = "#EEEEEE"

# The simulated workload of section 7 (see README): chat-like lengths, two arrivals per step.
WORKLOAD = dict(num_requests=200, seed=0, mean_prompt=160, mean_output=340, max_model_len=1024,
                arrivals_per_step=2.0)
POOL = dict(num_blocks=512, block_size=16)
MAX_NUM_SEQS, MAX_MODEL_LEN = 256, 1024


# ---- the worked example ---------------------------------------------------------------------


def worked_example(verbose: bool = True):
    """Run the README's example through the solution; returns the two states drawn."""
    pool = lab.BlockPool(NUM_BLOCKS, BLOCK_SIZE)
    manager = lab.KVCacheManager(pool)
    a, b = Request("A", T), Request("B", T[:8] + U)
    log = print if verbose else (lambda *args: None)
    for request in (a, b):
        hit = manager.get_computed_blocks(request)
        new = manager.allocate_slots(request, request.num_tokens - hit[1])
        log(f"{request.request_id}: get_computed_blocks -> {hit}, allocate_slots -> {new}, "
            f"block_table {manager.block_table(request)}")
    log("ref counts", [pool.ref_count(x) for x in range(NUM_BLOCKS)], "free queue",
        pool.free_block_ids())
    log("slot_mapping(B, [8, 9, 10]) =", manager.slot_mapping(b, [8, 9, 10]).tolist())
    c = Request("C", T[:8])
    log("C = T[:8]: get_computed_blocks ->", manager.get_computed_blocks(c))
    first = state(pool, manager, {"A": a, "B": b})
    manager.free(a)
    log("after free(A): free queue", pool.free_block_ids())
    b2 = manager.fork(b, "B2")
    log("fork(B, 'B2'): ref counts", [pool.ref_count(x) for x in range(NUM_BLOCKS)])
    b = b.appended(300)
    log("B appends 300: allocate_slots ->", manager.allocate_slots(b, 1), "copies",
        manager.take_copies(), "B", manager.block_table(b), "B2", manager.block_table(b2))
    b2 = b2.appended(400)
    log("B2 appends 400: allocate_slots ->", manager.allocate_slots(b2, 1), "copies",
        manager.take_copies(), "B2", manager.block_table(b2))
    second = state(pool, manager, {"B": b, "B2": b2}, copied=(3, 2))
    return first, second


def state(pool, manager, requests: dict, copied=None) -> dict:
    """What a panel shows: tables, token count, slot contents, refs, hashes, free queue."""
    slots: dict[tuple[int, int], str] = {}
    for request in requests.values():
        table = manager.block_table(request)
        for p in range(manager.num_tokens(request)):
            block, offset = table[p // BLOCK_SIZE], p % BLOCK_SIZE
            slots.setdefault((block, offset), str(request.token_ids[p]))
    return dict(
        tables={n: manager.block_table(r) for n, r in requests.items()},
        slots=slots,
        refs=[pool.ref_count(x) for x in range(NUM_BLOCKS)],
        hashed=[pool.block_hash(x) is not None for x in range(NUM_BLOCKS)],
        free=pool.free_block_ids(),
        copied=copied,
    )


def draw_panel(ax, s: dict, title: str) -> None:
    """The pool as a row of blocks (slots stacked), one request's table above, one below."""
    width, height, gap = 1.0, 0.55, 1.3
    top = BLOCK_SIZE * height
    ax.set_xlim(-1.6, NUM_BLOCKS * gap + 0.2)
    ax.set_ylim(-3.6, top + 4.9)
    ax.axis("off")
    ax.set_title(title, fontsize=10.5, loc="left")
    owners: dict[int, list[str]] = {}
    for name, table in s["tables"].items():
        for block in table:
            owners.setdefault(block, []).append(name)
    for block in range(NUM_BLOCKS):
        x = block * gap
        who = owners.get(block, [])
        color = COLORS[who[0]] if len(who) == 1 else ("#937860" if who else FREE)
        for offset in range(BLOCK_SIZE):
            y = top - (offset + 1) * height
            token = s["slots"].get((block, offset))
            ax.add_patch(Rectangle((x, y), width, height * 0.92, ec="white",
                                   color=color if token else FREE))
            if token:
                ax.text(x + width / 2, y + height * 0.46, token, ha="center", va="center",
                        fontsize=7.5, color="white")
        notes = [f"block {block}", f"ref {s['refs'][block]}"]
        if s["hashed"][block]:
            notes.append("hashed")
        if block in s["free"]:
            notes.append(f"free #{s['free'].index(block)}")
        if s["copied"] and block == s["copied"][1]:
            notes.append(f"copy of {s['copied'][0]}")
        ax.text(x + width / 2, top + 0.1, "\n".join(notes), ha="center", va="bottom",
                fontsize=7.5, color="#C44E52" if "copy" in notes[-1] else "#333333")
    for i, (name, table) in enumerate(s["tables"].items()):
        above = i == 0
        y0 = top + 3.4 if above else -2.6
        ax.text(-1.5, y0 + 0.25, name, fontsize=10, color=COLORS[name], weight="bold",
                va="center")
        for j, block in enumerate(table):
            x = j * gap * 1.6
            ax.add_patch(Rectangle((x, y0), width * 1.3, 0.5, color=COLORS[name], alpha=0.85))
            ax.text(x + width * 0.65, y0 + 0.25, f"logical {j}", ha="center", va="center",
                    fontsize=7, color="white")
            start = (x + width * 0.65, y0 if above else y0 + 0.5)
            end = (block * gap + width / 2, top + 1.25 if above else -0.05)
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=8,
                                         lw=0.9, color=COLORS[name], alpha=0.75))
        ax.text(len(table) * gap * 1.6 - 0.2, y0 + 0.25, f"block table {table}", fontsize=8.5,
                color=COLORS[name], va="center")
    ax.text(-1.5, -3.4, "brown: held by several block tables (read-only); grey: free slot",
            fontsize=7.5, color="#555555")


def draw_prefix_sharing() -> pathlib.Path:
    first, second = worked_example(verbose=False)
    fig, axes = plt.subplots(1, 2, figsize=(15, 6.2))
    draw_panel(axes[0], first, "1. B hits A's two cached prompt blocks: blocks 0, 1 have ref 2")
    draw_panel(axes[1], second, "2. A finished; B forked into B2; B's first write copied block 3")
    fig.tight_layout()
    path = OUT / "prefix_sharing.png"
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return path


# ---- the simulation -----------------------------------------------------------------------


def simulations(verbose: bool = True):
    workload = provided.synthetic_workload(**WORKLOAD)
    paged = lab.simulate(workload, POOL["num_blocks"], POOL["block_size"], MAX_NUM_SEQS)
    contiguous = lab.simulate_contiguous(workload, POOL["num_blocks"], POOL["block_size"],
                                         MAX_NUM_SEQS, MAX_MODEL_LEN)
    if verbose:
        lengths = [len(p) + out for _, p, out in workload]
        print(f"workload: {len(workload)} requests, mean prompt "
              f"{np.mean([len(p) for _, p, _ in workload]):.0f}, mean output "
              f"{np.mean([out for _, _, out in workload]):.0f}, mean total {np.mean(lengths):.0f},"
              f" last arrival step {workload[-1].arrival}")
        for name, s in (("paged", paged), ("contiguous", contiguous)):
            print(f"{name:>10}: steps {s.steps}, mean utilisation {s.mean_utilisation:.1%}, "
                  f"waste {s.waste:.1%}, preemptions {s.preemptions}, "
                  f"mean running {np.mean(s.num_running):.1f}")
        shared = provided.synthetic_workload(**{**WORKLOAD, "shared_prefix_len": 256})
        hits = lab.simulate(shared, POOL["num_blocks"], POOL["block_size"], MAX_NUM_SEQS)
        print(f"with a 256-token shared system prompt: prefix hit rate {hits.prefix_hit_rate:.1%}"
              f", steps {hits.steps}, preemptions {hits.preemptions}")
    return paged, contiguous


def draw_utilisation(paged, contiguous) -> pathlib.Path:
    fig, ax = plt.subplots(figsize=(10, 4.4))
    ax.axhspan(0.204, 0.382, color="#C44E52", alpha=0.12,
               label="paper: 20.4%-38.2% of KV memory held tokens (pre-paging systems)")
    for name, s, color in (("paged (simulate)", paged, "#4C72B0"),
                           ("contiguous max_model_len (simulate_contiguous)", contiguous,
                            "#C44E52")):
        ax.plot(s.utilisation, color=color, lw=1.0,
                label=f"{name}: mean {s.mean_utilisation:.0%}, waste {s.waste:.1%}")
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("share of the KV pool holding tokens")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"One workload, two allocators ({WORKLOAD['num_requests']} requests, "
                 f"{POOL['num_blocks']} blocks of {POOL['block_size']} slots, max_model_len "
                 f"{MAX_MODEL_LEN})", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path = OUT / "utilisation.png"
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return path


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    worked_example()
    print(draw_prefix_sharing())
    if "--no-sim" not in sys.argv:
        print(draw_utilisation(*simulations()))
