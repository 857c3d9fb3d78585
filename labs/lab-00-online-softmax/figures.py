"""Draw lab-00's README figures from the lab's own code, and print the worked example.

    make figures                                   (every lab)
    python labs/lab-00-online-softmax/figures.py   (this lab; prints the worked example too)

Writes into labs/lab-00-online-softmax/figures/:
  running_max_and_denominator.png  m and l after every tile of a score vector
  causal_tile_schedule.png         which (query tile, key tile) pairs a causal pass computes
  score_matrix_bytes.png           the N x N score matrix vs one tile, in bytes
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for `common`

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No "Software: matplotlib x.y" text chunk in the PNG: a rerun writes the same bytes.
PNG_METADATA = {"Software": None}
import numpy as np  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from common import load_impl  # noqa: E402

lab = load_impl(__file__, "solution")
OUT = HERE / "figures"

# The README's worked example: one query, 8 keys in 2 tiles of 4, scores already scaled.
EXAMPLE_SCORES = np.array([1.0, 3.0, 2.0, 0.0, 5.0, 1.0, 4.0, 2.0])
EXAMPLE_VALUES = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
EXAMPLE_TILE = 4


def worked_example() -> str:
    """m, l and acc after each tile, read off the lab's own functions."""
    steps = lab.online_softmax_steps(EXAMPLE_SCORES, EXAMPLE_TILE)
    lines = ["tile  keys  m      alpha=exp(m_old-m)  l        acc      acc/l"]
    m_old = -np.inf
    for t, (m, l) in enumerate(steps):
        end = (t + 1) * EXAMPLE_TILE
        # out after a prefix of keys is acc / l for that prefix, so acc = out * l
        out, _ = lab.flash_attention_forward(
            np.ones((1, 1)),
            EXAMPLE_SCORES[:end, None],
            EXAMPLE_VALUES[:end, None],
            block_k=EXAMPLE_TILE,
            scale=1.0,
        )
        acc = float(out[0, 0]) * l
        alpha = np.exp(m_old - m)
        lines.append(
            f"{t + 1:>4}  {t * EXAMPLE_TILE}-{end - 1}   {m:<5g}  {alpha:<18.4f}  "
            f"{l:<7.4f}  {acc:<7.4f}  {acc / l:.4f}"
        )
        m_old = m
    out, lse = lab.flash_attention_forward(
        np.ones((1, 1)), EXAMPLE_SCORES[:, None], EXAMPLE_VALUES[:, None], block_k=4, scale=1.0
    )
    p = np.exp(EXAMPLE_SCORES - EXAMPLE_SCORES.max())
    dense = float(p @ EXAMPLE_VALUES / p.sum())
    lines.append(f"final: out = {out[0, 0]:.6f}, lse = m + log(l) = {lse[0]:.6f}")
    lines.append(f"dense softmax(s) @ v       = {dense:.6f}")
    return "\n".join(lines)


def running_max_and_denominator(path: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    tile = 4
    x = np.round(rng.normal(0.0, 1.0, 24) + np.repeat([0.0, 1.5, 0.5, 3.0, 2.0, 3.5], tile), 1)
    steps = lab.online_softmax_steps(x, tile)
    m = np.array([s[0] for s in steps])
    l = np.array([s[1] for s in steps])
    n_tiles = len(steps)
    ends = np.arange(1, n_tiles + 1) * tile

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.2), sharex=True, height_ratios=[3, 2])
    colors = plt.cm.tab10(np.arange(n_tiles) % 10)
    ax1.bar(np.arange(len(x)), x, color=colors[np.arange(len(x)) // tile], alpha=0.8)
    ax1.step(np.r_[0, ends] - 0.5, np.r_[m[0], m], where="pre", color="black", lw=2)
    for t in range(n_tiles):
        ax1.axvline(t * tile - 0.5, color="grey", lw=0.5)
        if t and m[t] > m[t - 1]:
            alpha = np.exp(m[t - 1] - m[t])
            ax1.annotate(
                f"max grows: old l and acc\n× exp({m[t - 1]:g} − {m[t]:g}) = {alpha:.2f}",
                xy=(ends[t] - 0.5, m[t]),
                xytext=(ends[t] - 3.9, m[t] + 0.9),
                fontsize=7.5,
                arrowprops={"arrowstyle": "->", "lw": 0.7},
            )
    ax1.set_ylabel("score x")
    ax1.set_ylim(min(x.min(), 0) - 0.5, m.max() + 2.3)
    ax1.set_title("Online softmax, tiles of 4: running max m (black) after each tile")

    ax2.plot(ends - 0.5, l, "o-", color="tab:red")
    for t in range(n_tiles):
        ax2.annotate(
            f"{l[t]:.2f}",
            (ends[t] - 0.5, l[t]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=8,
        )
    ax2.set_ylabel("l = Σ exp(x − m)")
    ax2.set_xlabel("position in the vector (a tile ends at each vertical line)")
    ax2.set_ylim(0, l.max() * 1.3)
    ax2.set_title("Running denominator l: drops when the max grows (rescaled), else only adds")
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=PNG_METADATA)
    plt.close(fig)


def causal_tile_schedule(path: pathlib.Path) -> None:
    block = 16
    cases = [(128, 128, "Lq = Lk = 128"), (48, 128, "Lq = 48 < Lk = 128 (top-left)")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), width_ratios=[1, 1])
    colors = {"full": "#4c9a2a", "diag": "#f2b134", "skip": "#eeeeee"}
    for ax, (lq, lk, title) in zip(axes, cases):
        counts = {"full": 0, "diag": 0, "skip": 0}
        n_qt, n_kt = -(-lq // block), -(-lk // block)
        for qt in range(n_qt):
            q0, q1 = qt * block, min((qt + 1) * block, lq)
            visited = {k0: k1 for k0, k1 in lab._key_tiles(q1, lk, block, causal=True)}
            for kt in range(n_kt):
                k0 = kt * block
                if k0 not in visited:
                    kind = "skip"
                elif visited[k0] - 1 <= q0:  # every row of the tile sees every key of it
                    kind = "full"
                else:
                    kind = "diag"
                counts[kind] += 1
                k1 = visited.get(k0, min(k0 + block, lk))
                ax.add_patch(
                    Rectangle(
                        (k0, q0),
                        k1 - k0,
                        q1 - q0,
                        facecolor=colors[kind],
                        edgecolor="white",
                        lw=1.2,
                    )
                )
        ax.set_xlim(0, lk)
        ax.set_ylim(lq, 0)
        ax.set_aspect("equal")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_title(
            f"{title}\n{counts['full']} full + {counts['diag']} masked tiles computed, "
            f"{counts['skip']} skipped",
            fontsize=9,
        )
    fig.legend(
        handles=[
            Patch(color=colors["full"], label="computed, no mask needed"),
            Patch(color=colors["diag"], label="on the diagonal: computed with the causal mask"),
            Patch(color=colors["skip"], label="above the diagonal: never loaded"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=8,
    )
    fig.suptitle(f"Causal FlashAttention, {block} x {block} tiles: the mask is a loop bound")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120, metadata=PNG_METADATA)
    plt.close(fig)


def score_matrix_memory(path: pathlib.Path) -> None:
    n = 2.0 ** np.arange(9, 18)  # 512 … 128k
    per_head = [lab.score_matrix_bytes(int(s)) for s in n]
    model = [lab.score_matrix_bytes(int(s), num_heads=16, num_layers=24) for s in n]
    tile = 128 * 128 * 4  # one fp32 score tile in on-chip memory
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ax.loglog(n, per_head, "o-", base=2, label="N x N scores, one head, FP16")
    ax.loglog(n, model, "s-", base=2, label="x 16 heads x 24 layers")
    ax.axhline(tile, color="tab:green", ls="--", label="FlashAttention: one 128 x 128 fp32 tile")
    for s, b in zip(n, per_head):
        if int(s) in (512, 8192, 32768):
            label = f"{b / 2**20:g} MiB" if b < 2**30 else f"{b / 2**30:g} GiB"
            ax.annotate(label, (s, b), textcoords="offset points", xytext=(-10, 8), fontsize=8)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes")
    ticks = {16: "64 KiB", 20: "1 MiB", 25: "32 MiB", 30: "1 GiB", 35: "32 GiB", 40: "1 TiB"}
    ax.set_yticks([2.0**e for e in ticks], list(ticks.values()))
    ax.minorticks_off()
    ax.set_xticks(n)
    ax.set_xticklabels([f"{int(s) // 1024}k" if s >= 1024 else str(int(s)) for s in n])
    ax.set_title("What naive attention writes to HBM (score_matrix_bytes) vs one on-chip tile")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=PNG_METADATA)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    running_max_and_denominator(OUT / "running_max_and_denominator.png")
    causal_tile_schedule(OUT / "causal_tile_schedule.png")
    score_matrix_memory(OUT / "score_matrix_bytes.png")
    print(worked_example())
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('*.png')))} to {OUT}")


if __name__ == "__main__":
    main()
