"""Draw lab 04's README figures from the float64 reference and the lab's
given code (``provided.py``), so they draw the same in the student copy.

    MPLBACKEND=Agg python labs/lab-04-flash-decoding-partitions/figures.py

1. ``figures/merge_tree.png``: 16 keys of one head in 4 partitions, the state ``(m, l)`` of
   each partition and of each node of a merge tree up to the root (all 16 keys).
2. ``figures/ring_schedule.png``: which K/V shard each of 4 devices holds at each ring step,
   and which of those blocks a causal mask leaves empty.
3. ``figures/sm_occupancy.png``: programs launched for one long decode, with and without a
   split, against the SMs of an A100 (108) and an H100 (132).
4. ``figures/partitions_vs_segments.png``: splits per sequence and tokens per split as the
   context grows, for 512-token partitions and for vLLM's 16 fixed segments.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No "Software: matplotlib x.y" text chunk in the PNG: a rerun writes the same bytes.
PNG_METADATA = {"Software": None}
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.loader import load_lab_module  # noqa: E402
from common.reference import reference_attention  # noqa: E402

provided = load_lab_module(__file__, "provided")
OUT = pathlib.Path(__file__).resolve().parent / "figures"


def merge_tree() -> None:
    rng = np.random.default_rng(4)
    n, parts = 16, 4
    q = rng.standard_normal((1, 8))
    k = rng.standard_normal((n, 1, 8)) * np.linspace(0.6, 1.6, n)[:, None, None]
    v = rng.standard_normal((n, 1, 8))
    s = (k[:, 0] @ q[0]) / np.sqrt(8)  # the scores, for the bar chart
    bounds = [(i * n // parts, (i + 1) * n // parts) for i in range(parts)]

    def state(lo: int, hi: int) -> provided.AttentionState:
        """The state of keys lo..hi-1, read off the reference: m = max s, l = e^(lse - m)."""
        out, lse = reference_attention(q[None], k[lo:hi], v[lo:hi])
        m = s[lo:hi].max(keepdims=True)
        l = np.exp(lse[0] - m)
        return provided.AttentionState(m, l, out[0] * l[:, None])

    leaves = [state(lo, hi) for lo, hi in bounds]
    left, right, root = state(0, n // 2), state(n // 2, n), state(0, n)
    alpha = np.exp(left.m - root.m), np.exp(right.m - root.m)
    merged_l = alpha[0] * left.l + alpha[1] * right.l  # the merge, applied by hand at the root

    fig = plt.figure(figsize=(11, 6.4))
    ax_s = fig.add_axes([0.06, 0.08, 0.88, 0.2])
    colors = plt.cm.tab10(np.arange(parts))
    for i, (lo, hi) in enumerate(bounds):
        ax_s.bar(np.arange(lo, hi), s[lo:hi], color=colors[i], width=0.8)
        ax_s.hlines(leaves[i].m[0], lo - 0.4, hi - 0.6, color="k", lw=1.5)
    ax_s.set_xlabel("key position (bars: scores s_j; black line: the partition's max m)")
    ax_s.set_ylabel("score")
    ax_s.set_xlim(-0.6, n - 0.4)

    ax = fig.add_axes([0.02, 0.3, 0.96, 0.68])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")

    def node(x, y, title, st, color="white"):
        text = f"{title}\nm = {st.m[0]:.3f}\nl = {st.l[0]:.3f}"
        ax.text(x, y, text, ha="center", va="center", fontsize=9, family="monospace",
                bbox={"boxstyle": "round,pad=0.4", "fc": color, "ec": "0.3"})

    def edge(x0, y0, x1, y1, child, parent):
        ax.annotate("", xy=(x1, y1 - 0.07), xytext=(x0, y0 + 0.08),
                    arrowprops={"arrowstyle": "->", "color": "0.4"})
        factor = np.exp(child.m[0] - parent.m[0])
        ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"x{factor:.3f}", fontsize=8, color="0.25",
                ha="center", va="center", bbox={"fc": "white", "ec": "none", "pad": 0.5})

    xs = [0.12, 0.37, 0.63, 0.88]
    for i, (lo, hi) in enumerate(bounds):
        tint = colors[i] * [1, 1, 1, 0.35]
        node(xs[i], 0.14, f"partition {i}: keys {lo}-{hi - 1}", leaves[i], tint)
    node(0.245, 0.5, "merge(P0, P1)", left)
    node(0.755, 0.5, "merge(P2, P3)", right)
    node(0.5, 0.84, "root = merge(left, right)", root, "#fff4cc")
    for i, parent, px in ((0, left, 0.245), (1, left, 0.245), (2, right, 0.755), (3, right, 0.755)):
        edge(xs[i], 0.14, px, 0.5, leaves[i], parent)
    edge(0.245, 0.5, 0.5, 0.84, left, root)
    edge(0.755, 0.5, 0.5, 0.84, right, root)
    ax.text(0.5, 0.985, f"root: lse = m + log l = {root.m[0] + np.log(root.l[0]):.6f};   "
            f"merging its two children gives l = {merged_l[0]:.6f}",
            ha="center", va="top", fontsize=10)
    ax.text(0.01, 0.8, "edge label: exp(m_child - m_parent),\nthe rescale applied to the "
            "child's\nl and acc before adding", fontsize=8, color="0.3", va="center")
    fig.savefig(OUT / "merge_tree.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def ring_schedule(world: int = 4) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    colors = plt.cm.Set2(np.arange(world))
    for ax, causal in zip(axes, (False, True)):
        for step in range(world):
            for dev in range(world):
                shard = (dev - step) % world  # what the simulated ring holds
                empty = causal and shard > dev  # every key after every query: fully masked
                diagonal = causal and shard == dev
                face = "0.92" if empty else colors[shard]
                ax.add_patch(plt.Rectangle((step, world - 1 - dev), 0.94, 0.94, fc=face,
                                           ec="0.3", hatch="//" if empty else None))
                label = f"K/V {shard}" + ("\n(masked:\nskip)" if empty else
                                          "\n(triangle)" if diagonal else "")
                ax.text(step + 0.47, world - 1 - dev + 0.47, label, ha="center", va="center",
                        fontsize=8)
        ax.set_xlim(0, world)
        ax.set_ylim(0, world)
        ax.set_xticks(np.arange(world) + 0.47, [f"step {t}" for t in range(world)])
        ax.set_yticks(np.arange(world) + 0.47, [f"device {d}\n(Q {d})" for d in
                                               reversed(range(world))])
        ax.set_title("non-causal: every block counts" if not causal else
                     "causal: blocks after the queries are empty")
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
    fig.suptitle("Ring attention: Q shards stay, K/V shards move one device per step")
    fig.tight_layout()
    fig.savefig(OUT / "ring_schedule.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def sm_occupancy() -> None:
    seq_len, heads, kv_heads, partition = 32768, 32, 8, 512
    cases = [
        ("one program per head\n(batch 1, 32 heads)", heads),
        ("one program per KV head\n(GQA packed, 8 KV heads)", kv_heads),
        (f"split into {seq_len // partition} partitions\nof {partition} (x 8 KV heads)",
         kv_heads * seq_len // partition),
    ]
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    names = [c[0] for c in cases]
    programs = [c[1] for c in cases]
    bars = ax.barh(names, programs, color=["#d95f02", "#d95f02", "#1b9e77"])
    for sms, style, gpu, side in ((108, "--", "A100", "right"), (132, "-", "H100", "left")):
        ax.axvline(sms, color="k", ls=style, lw=1)
        ax.text(sms, -0.75, f" {sms} SMs ({gpu}) ", fontsize=8, ha=side, va="center")
    for bar, p in zip(bars, programs):
        busy = min(p, 132) / 132
        ax.text(p * 1.08, bar.get_y() + bar.get_height() / 2,
                f"{p} programs: {busy:.0%} of an H100's SMs busy", va="center", fontsize=8,
                bbox={"fc": "white", "ec": "none", "pad": 1})
    ax.set_xscale("log")
    ax.set_xlim(4, 30000)
    ax.set_ylim(-1.0, 2.5)
    ax.set_xlabel("programs (thread blocks) in the decode launch, log scale")
    ax.set_title(f"Decode at batch 1, {seq_len // 1024}k context: the grid without a split "
                 "is smaller than the GPU")
    fig.tight_layout()
    fig.savefig(OUT / "sm_occupancy.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def partitions_vs_segments() -> None:
    """The trade-off of the two split modes, from the launcher's own grid arithmetic."""
    contexts = np.unique(np.geomspace(256, 1 << 20, 200).astype(int))
    block_n = provided.gpu_tiles(128)["block_n"]  # d = 128: the GPU tile
    modes = {
        f"partitions of {provided.DEFAULT_PARTITION_SIZE} tokens": [
            provided.num_splits(n, provided.DEFAULT_PARTITION_SIZE, None) for n in contexts],
        f"{provided.VLLM_NUM_SEGMENTS} segments (vLLM's 3D path)": [
            provided.num_splits(n, provided.DEFAULT_PARTITION_SIZE, provided.VLLM_NUM_SEGMENTS)
            for n in contexts],
    }
    segment_len = [-(-n // (provided.VLLM_NUM_SEGMENTS * block_n)) * block_n for n in contexts]
    fig, (ax_p, ax_t) = plt.subplots(1, 2, figsize=(10.5, 3.8))
    for (label, splits), color in zip(modes.items(), ("#d95f02", "#1b9e77")):
        ax_p.plot(contexts, splits, color=color, label=label)
    ax_p.set_ylabel("splits per sequence (grid size / (batch x KV heads))")
    ax_p.set_title("launch shape: grows with the context, or fixed")
    ax_t.plot(contexts, np.full(len(contexts), provided.DEFAULT_PARTITION_SIZE),
              color="#d95f02", label=f"partitions of {provided.DEFAULT_PARTITION_SIZE}")
    ax_t.plot(contexts, segment_len, color="#1b9e77",
              label=f"{provided.VLLM_NUM_SEGMENTS} segments of whole {block_n}-token tiles")
    ax_t.set_ylabel("tokens per split (work per program)")
    ax_t.set_title("work per program: fixed, or grows with the context")
    for ax in (ax_p, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("tokens in the longest sequence")
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "partitions_vs_segments.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    merge_tree()
    ring_schedule()
    sm_occupancy()
    partitions_vs_segments()
    for f in sorted(OUT.glob("*.png")):
        print(f"wrote {f.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
