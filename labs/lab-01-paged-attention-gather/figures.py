"""Draw lab 01's README figures from the lab's own code (``make figures``).

figures/block_table.png    two sequences' logical blocks -> shuffled physical blocks, with
                           every slot a kernel must not read shown as NaN
figures/running_state.png  one decode step streamed block by block: scores, running max m,
                           log-sum-exp and denominator l after each block
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

from common.loader import load_impl  # noqa: E402
from common.paged import blocks_needed, build_paged_kv  # noqa: E402

OUT = HERE / "figures"
lab = load_impl(HERE, "solution")

BLOCK_SIZE = 4
SEQ_LENS = {"A": 10, "B": 5}
COLORS = {"A": "#4C72B0", "B": "#DD8452"}
POISON = "#D9D9D9"


def example_cache():
    """The README's example: sequences A (10 tokens) and B (5 tokens), block size 4.

    One KV head, head_dim 1; K and V are the token numbers so every cell is readable.
    """
    ks = [np.arange(n, dtype=float).reshape(n, 1, 1) for n in SEQ_LENS.values()]
    return build_paged_kv(ks, ks, BLOCK_SIZE, rng=1, extra_blocks=3)


def draw_block_table() -> pathlib.Path:
    paged = example_cache()
    num_blocks = paged.num_blocks
    fig, ax = plt.subplots(figsize=(11, 6.2))
    ax.set_xlim(-0.5, 15.5)
    ax.set_ylim(-1.6, num_blocks + 1.2)
    ax.axis("off")

    # Right: the physical pool, one row per block; y grows upwards, block 0 at the top.
    pool_x = 10.0
    def row_y(block: int) -> float:
        return num_blocks - 1 - block

    owner = {}  # (block, offset) -> label
    for b, name in enumerate(SEQ_LENS):
        n = SEQ_LENS[name]
        slots = lab.slot_mapping(paged.block_tables[b], np.arange(n), BLOCK_SIZE)
        for t, slot in enumerate(slots):
            owner[divmod(int(slot), BLOCK_SIZE)] = (name, t)
    for block in range(num_blocks):
        y = row_y(block)
        ax.text(pool_x - 0.25, y + 0.4, f"block {block}", ha="right", va="center", fontsize=9)
        for offset in range(BLOCK_SIZE):
            who = owner.get((block, offset))
            color = COLORS[who[0]] if who else POISON
            ax.add_patch(Rectangle((pool_x + offset, y), 0.92, 0.8, color=color,
                                   hatch=None if who else "///", ec="white"))
            label = f"{who[0]}{who[1]}" if who else "NaN"
            ax.text(pool_x + offset + 0.46, y + 0.4, label, ha="center", va="center",
                    fontsize=8, color="white" if who else "#7F7F7F")
        if block in paged.unused_blocks:
            ax.text(pool_x + BLOCK_SIZE + 0.1, y + 0.4, "unreferenced", fontsize=8,
                    va="center", color="#7F7F7F")
    ax.text(pool_x + 2, num_blocks + 0.9, "physical KV cache (k_cache[block, slot])",
            ha="center", fontsize=10, weight="bold")

    # Left: each sequence's logical blocks, with its block table and an arrow per block.
    ax.text(2.2, num_blocks + 0.9, "logical view (what attention sees)", ha="center",
            fontsize=10, weight="bold")
    y = num_blocks - 1
    for b, name in enumerate(SEQ_LENS):
        n = SEQ_LENS[name]
        table = paged.block_tables[b]
        ax.text(0, y + 1.0, f"sequence {name}: seq_len={n}, block_table={table.tolist()}",
                fontsize=9, color=COLORS[name], weight="bold")
        for logical in range(blocks_needed(n, BLOCK_SIZE)):
            for offset in range(BLOCK_SIZE):
                t = logical * BLOCK_SIZE + offset
                inside = t < n
                ax.add_patch(Rectangle((offset, y), 0.92, 0.8, ec="white",
                                       color=COLORS[name] if inside else POISON,
                                       hatch=None if inside else "///"))
                ax.text(offset + 0.46, y + 0.4, f"{name}{t}" if inside else "past\nseq_len",
                        ha="center", va="center", fontsize=8 if inside else 6,
                        color="white" if inside else "#7F7F7F")
            ax.text(BLOCK_SIZE + 0.1, y + 0.4, f"logical {logical}", fontsize=8, va="center")
            physical = int(table[logical])
            ax.add_patch(FancyArrowPatch((BLOCK_SIZE + 1.6, y + 0.4),
                                         (pool_x - 1.5, row_y(physical) + 0.4),
                                         arrowstyle="-|>", mutation_scale=12,
                                         color=COLORS[name], lw=1.2))
            y -= 1
        y -= 0.8

    ax.text(0, -1.2,
            "Token t of a sequence lives at k_cache[block_table[t // 4], t % 4]. Grey "
            "slots hold NaN in the tests:\nslots past seq_len in a last block and blocks no table "
            "references. Padding entries (-1) are never followed.", fontsize=9)
    OUT.mkdir(exist_ok=True)
    path = OUT / "block_table.png"
    fig.savefig(path, dpi=130, bbox_inches="tight", metadata=PNG_METADATA)
    plt.close(fig)
    return path


def running_state():
    """Sequence A's decode, one query head: scores, and (m, lse, l) after each block."""
    paged = example_cache()
    table, n = paged.block_tables[0], SEQ_LENS["A"]
    q = np.array([[1.0]])
    scores = np.array([0.5, 1.0, -0.3, 0.2, 2.0, 0.1, 0.4, 1.5, 3.0, 0.0])
    # Fresh NaN caches, filled through the write path: with q = 1 and scale = 1 the key of
    # token t is its score, and its value is t.
    k_cache = np.full_like(paged.k_cache, np.nan)
    v_cache = np.full_like(paged.v_cache, np.nan)
    slots = lab.slot_mapping(table, np.arange(n), BLOCK_SIZE)
    lab.write_kv(k_cache, v_cache, scores.reshape(n, 1, 1),
                 np.arange(n, dtype=float).reshape(n, 1, 1), slots)
    states = []
    for logical in range(blocks_needed(n, BLOCK_SIZE)):
        upto = min((logical + 1) * BLOCK_SIZE, n)
        out, lse = lab.paged_decode_attention(q, k_cache, v_cache, table, upto, scale=1.0)
        m = scores[:upto].max()
        states.append((upto, m, float(lse[0]), float(np.exp(lse[0] - m)), float(out[0, 0])))
    return scores, states


def draw_running_state() -> pathlib.Path:
    scores, states = running_state()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    t = np.arange(len(scores))
    block_colors = ["#4C72B0", "#55A868", "#C44E52"]
    for i in range(len(states)):
        lo, hi = i * BLOCK_SIZE, min((i + 1) * BLOCK_SIZE, len(scores))
        top.bar(t[lo:hi], scores[lo:hi], color=block_colors[i], alpha=0.6,
                label=f"scores of block {i}")
    edges = [0] + [s[0] for s in states]
    for i, (upto, m, lse, l, _) in enumerate(states):
        x = [edges[i] - 0.5, upto - 0.5]
        top.plot(x, [m, m], color="black", lw=2, label="running max m" if i == 0 else None)
        top.plot(x, [lse, lse], color="purple", lw=2, ls="--",
                 label="lse = m + log(l)" if i == 0 else None)
        bottom.plot(x, [l, l], color="darkgreen", lw=2, label="l (sum of exp(s - m))"
                    if i == 0 else None)
        bottom.text(upto - 0.55, l + 0.08, f"l={l:.2f}", ha="right", fontsize=8)
    for i in range(1, len(states)):
        m_old, m_new = states[i - 1][1], states[i][1]
        if m_new > m_old:
            bottom.annotate(f"m: {m_old:g} -> {m_new:g}, old l times exp({m_old:g} - {m_new:g})",
                            xy=(edges[i] - 0.5, states[i][3]), xytext=(edges[i] - 3.4, 0.6),
                            fontsize=7, arrowprops=dict(arrowstyle="->", lw=0.8))
    top.set_ylabel("score")
    top.legend(fontsize=8, loc="upper left")
    top.set_title("One decode step, streamed block by block (sequence A, one head)")
    bottom.set_ylabel("denominator l")
    bottom.set_xlabel("token position t (blocks of 4; the last block holds 2 tokens)")
    bottom.set_ylim(0, max(s[3] for s in states) + 0.6)
    bottom.legend(fontsize=8, loc="upper left")
    bottom.set_xticks(t)
    OUT.mkdir(exist_ok=True)
    path = OUT / "running_state.png"
    fig.tight_layout()
    fig.savefig(path, dpi=130, metadata=PNG_METADATA)
    plt.close(fig)
    return path


if __name__ == "__main__":
    for path in (draw_block_table(), draw_running_state()):
        print(f"wrote {path.relative_to(HERE.parent.parent)}")
    for upto, m, lse, l, out in running_state()[1]:
        print(f"after {upto:2d} tokens: m={m:.4f} l={l:.4f} lse={lse:.4f} out={out:.4f}")
