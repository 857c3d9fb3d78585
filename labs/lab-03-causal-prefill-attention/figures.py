"""Draw lab 03's README figures from the lab's own code (``make figures``).

figures/causal_alignment.png  top-left vs bottom-right masks, and a chunk as a band of
                              the one-shot triangle
figures/tile_skipping.png     which K/V tiles a causal kernel visits, masks or skips
figures/gqa_packing.png       one program per query head (128-row tiles) vs the GQA-packed
                              16-row tile of vLLM 0.33.0, and what each launch reads for a
                              mixed batch (prints the numbers the README quotes)
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
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for ``common``

from common import load_impl  # noqa: E402
from common.loader import load_lab_module  # noqa: E402

lab = load_impl(HERE, "solution")
provided = load_lab_module(HERE, "provided")
OUT = HERE / "figures"

MASKED, ATTEND, DIAGONAL = 0, 1, 2
CELL_COLOURS = ListedColormap(["#f2f2f2", "#4c72b0", "#dd8452"])


def cells(mask: np.ndarray, start_pos: int) -> np.ndarray:
    """Mask cells coloured: attended, the diagonal (key = the query's own position), masked."""
    grid = np.where(mask, ATTEND, MASKED)
    for i in range(mask.shape[0]):
        j = start_pos + i
        if 0 <= j < mask.shape[1] and mask[i, j]:
            grid[i, j] = DIAGONAL
    return grid


def draw_mask(ax, grid, title, row_labels=None):
    ax.imshow(grid, cmap=CELL_COLOURS, vmin=0, vmax=2)
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    if row_labels is not None:
        ax.set_yticklabels(row_labels)
    ax.set_xticks(np.arange(-0.5, grid.shape[1]), minor=True)
    ax.set_yticks(np.arange(-0.5, grid.shape[0]), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("key position")
    ax.set_title(title, fontsize=10)


def causal_alignment() -> None:
    num_queries, num_keys = 4, 10
    start_pos = num_keys - num_queries
    top_left = lab.causal_mask(num_queries, num_keys, "top_left")
    bottom_right = lab.causal_mask(num_queries, num_keys, "bottom_right")
    one_shot = lab.causal_mask(num_keys, num_keys, "bottom_right")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1, 1, 1]})
    draw_mask(
        axes[0],
        cells(top_left, 0),
        "top_left (SDPA is_causal=True)\nquery i sees keys 0..i: wrong for a chunk",
    )
    axes[0].set_ylabel("query i of the chunk")
    draw_mask(
        axes[1],
        cells(bottom_right, start_pos),
        f"bottom_right (FlashAttention >= 2.1, causal_lower_right)\n"
        f"query i sits at start_pos + i = {start_pos} + i",
        row_labels=[f"{i} (pos {start_pos + i})" for i in range(num_queries)],
    )
    draw_mask(
        axes[2],
        cells(one_shot, 0),
        f"one-shot prefill of {num_keys} tokens\nthe chunk is the band of rows "
        f"{start_pos}..{num_keys - 1}",
    )
    axes[2].set_ylabel("query position")
    axes[2].add_patch(
        Rectangle(
            (-0.5, start_pos - 0.5),
            num_keys,
            num_queries,
            fill=False,
            edgecolor="#c44e52",
            linewidth=2.5,
        )
    )
    fig.legend(
        handles=[
            Patch(color="#4c72b0", label="attended"),
            Patch(color="#dd8452", label="diagonal: the query's own key (included)"),
            Patch(color="#f2f2f2", label="masked: never read"),
            Patch(facecolor="none", edgecolor="#c44e52", label="the 4-token chunk"),
        ],
        loc="lower center",
        ncol=4,
        frameon=False,
    )
    fig.suptitle(
        f"A chunk of {num_queries} queries after {start_pos} cached tokens: "
        "the mask is bottom-right aligned",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(OUT / "causal_alignment.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def tile_classes(num_queries: int, num_keys: int, tile: int) -> np.ndarray:
    """Per (query tile, key tile): 2 = full (no mask), 1 = straddles the diagonal, 0 = skipped."""
    mask = lab.causal_mask(num_queries, num_keys, "bottom_right")
    rows, cols = -(-num_queries // tile), -(-num_keys // tile)
    classes = np.zeros((rows, cols), dtype=int)
    for r in range(rows):
        for c in range(cols):
            block = mask[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
            classes[r, c] = 2 if block.all() else (1 if block.any() else 0)
    return classes


def draw_tiles(ax, classes, title):
    colours = ListedColormap(["#f2f2f2", "#dd8452", "#4c72b0"])
    ax.imshow(classes, cmap=colours, vmin=0, vmax=2)
    rows, cols = classes.shape
    ax.set_xticks(np.arange(-0.5, cols), minor=True)
    ax.set_yticks(np.arange(-0.5, rows), minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="both", length=0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("K/V tiles (loop over keys)")
    ax.set_ylabel("query tiles (one program each)")
    visited = int((classes > 0).sum())
    ax.set_title(
        f"{title}\n{visited} of {classes.size} tiles visited, {int((classes == 1).sum())} "
        f"of them masked\n(a non-causal pass does {classes.size / visited:.2f}x the work)",
        fontsize=10,
    )


def tile_skipping() -> None:
    tile = 32
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4), gridspec_kw={"width_ratios": [1, 1.6]})
    draw_tiles(axes[0], tile_classes(256, 256, tile), "one-shot prefill: 256 tokens, tiles of 32")
    draw_tiles(
        axes[1],
        tile_classes(160, 416, tile),
        "a chunk: 160 queries after 256 cached tokens",
    )
    fig.legend(
        handles=[
            Patch(color="#4c72b0", label="below the diagonal: every key visible, no mask"),
            Patch(color="#dd8452", label="straddles the diagonal: mask key_pos <= query_pos"),
            Patch(color="#f2f2f2", label="above the diagonal: the loop never gets there"),
        ],
        loc="lower center",
        ncol=3,
        frameon=False,
    )
    fig.suptitle("The causal mask as a loop bound: tiles above the diagonal are skipped")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(OUT / "tile_skipping.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


# ---- GQA packing ---------------------------------------------------------------------------

# A Llama-3-8B-like layer (32 query heads on 8 KV heads, d = 128, bf16) serving one mixed
# step: a 512-token chunk after 1,024 cached tokens, and 63 decode rows at 4,096 tokens.
EXAMPLE = {
    "heads": (32, 8),
    "head_dim": 128,
    "bytes": 2,
    "batch": [(1024, 512)] + [(4095, 1)] * 63,
}  # (cached, new) per sequence


def launch_counts(
    batch: list[tuple[int, int]], heads: tuple[int, int], head_dim: int, nbytes: int, packed: bool
) -> dict[str, float]:
    """Programs, tile rows and K/V bytes of one launch over ``batch``.

    ``packed=False``: one program per (128-token query tile, query head), the kernel this lab
    had before; ``packed=True``: one program per (BLOCK_Q tokens, KV head), BLOCK_M = 16 rows
    (the lab's GPU tiles, vLLM 0.33.0's). Keys read per program = its kv_end (the causal
    loop bound), per KV head it reads.
    """
    num_heads, num_kv_heads = heads
    group = num_heads // num_kv_heads
    if packed:
        rows, tokens, programs_per_tile = 16, 16 // group, num_kv_heads
    else:
        rows, tokens, programs_per_tile = 128, 128, num_heads
    programs = keys = decode_programs = 0
    for cached, new in batch:
        for first in range(0, new, tokens):
            programs += programs_per_tile
            keys += programs_per_tile * (cached + min(first + tokens, new))
            decode_programs += programs_per_tile * (new == 1)
    real_rows = sum(new for _, new in batch) * num_heads
    num_tokens, num_seqs = sum(new for _, new in batch), len(batch)
    grid = (
        provided.varlen_grid(num_tokens, num_seqs, programs_per_tile, tokens)
        if packed
        else (num_tokens // 128 + num_seqs, num_heads)
    )
    return {
        "programs": programs,
        "grid": grid[0] * grid[1],
        "rows computed": programs * rows,
        "real rows": real_rows,
        "K/V bytes read": keys * 2 * head_dim * nbytes,
        "K/V bytes (each KV head once)": sum(c + n for c, n in batch)
        * num_kv_heads
        * 2
        * head_dim
        * nbytes,
        "decode programs": decode_programs,
        "wasted rows per decode program": rows - (group if packed else 1),
    }


def draw_tile(ax, labels, title, colours):
    """A column of tile rows: each row labelled with its (token, head) or left empty."""
    n = len(labels)
    tall = n > 32  # a 128-row tile: no cell borders, and its real rows drawn 3 rows high
    ax.add_patch(Rectangle((0, 0), 1, n, facecolor="#f2f2f2", edgecolor="none"))
    for r, label in enumerate(labels):
        if label is None:
            if not tall:
                ax.add_patch(Rectangle((0, n - 1 - r), 1, 1, facecolor="none", edgecolor="white"))
            continue
        height = 3 if tall else 1
        colour = colours[label[1] % len(colours)]
        ax.add_patch(Rectangle((0, n - height - r), 1, height, facecolor=colour, edgecolor="white"))
        if not tall:
            text = f"t{label[0]} h{label[1]}"
            ax.text(0.5, n - 0.5 - r, text, ha="center", va="center", fontsize=7, color="white")
    if tall:
        empty = sum(label is None for label in labels)
        ax.text(0.5, n / 2, f"{empty}\nempty\nrows", ha="center", va="center", fontsize=9)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, n)
    ax.set_xticks([])
    ax.set_yticks([0, n])
    ax.set_title(title, fontsize=9)


def gqa_packing() -> dict[str, dict[str, float]]:
    group = 4
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    block_m = provided.fit_group(provided.INTERPRETER_TILES, group, 16)["block_m"]
    block_q = block_m // group  # query tokens per tile, as the launcher computes it
    # Row r of a packed tile is query token r // GROUP, query head r % GROUP (solution.py).
    prefill = [(r // group, r % group) for r in range(block_m)]
    decode = [(0, r % group) if r // group < 1 else None for r in range(block_m)]
    fig, axes = plt.subplots(
        1, 5, figsize=(14, 5.6), gridspec_kw={"width_ratios": [0.5, 0.5, 0.6, 0.6, 3.2]}
    )
    empty = [None] * 127
    draw_tile(
        axes[0], [(0, 0), *empty], "before: decode row,\nquery head 0\n(1 of 128 rows)", colours
    )
    draw_tile(
        axes[1], [(0, 1), *empty], "... head 1\n(3 more programs\nread the same K/V)", colours
    )
    draw_tile(
        axes[2], prefill, f"packed: a prefill\nblock, {block_q} tokens\nx {group} heads", colours
    )
    draw_tile(axes[3], decode, f"packed: a decode\nrow, {group} of\n{block_m} rows", colours)
    counts = {
        name: launch_counts(
            EXAMPLE["batch"], EXAMPLE["heads"], EXAMPLE["head_dim"], EXAMPLE["bytes"], packed
        )
        for name, packed in (("before", False), ("after", True))
    }
    ax = axes[4]
    metrics = ["programs", "rows computed", "K/V bytes read"]
    x = np.arange(len(metrics))
    for i, (name, colour) in enumerate((("before", "#8c8c8c"), ("after", "#4c72b0"))):
        values = [counts[name][m] / counts["before"][m] for m in metrics]
        bars = ax.bar(
            x + (i - 0.5) * 0.38,
            values,
            0.38,
            color=colour,
            label="one program per query head, 128-row tiles"
            if name == "before"
            else "GQA-packed, 16-row tiles (vLLM 0.33.0)",
        )
        for bar, m in zip(bars, metrics):
            value = counts[name][m]
            text = f"{value / 1e6:.0f} MB" if "bytes" in m else f"{value:,.0f}"
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height() + 0.02,
                text,
                ha="center",
                fontsize=8,
            )
    ax.set_xticks(x, metrics)
    ax.set_ylabel("relative to before")
    ax.set_ylim(0, 1.25)
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    ax.set_title(
        "one step of a Llama-3-8B-like layer (32 q / 8 kv heads, d=128, bf16):\n"
        "a 512-token chunk after 1,024 cached + 63 decode rows at 4,096 tokens",
        fontsize=9,
    )
    fig.suptitle(
        "GQA packing: the query heads of one KV head share the rows of one tile, so "
        "each K/V tile is loaded once per group"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(OUT / "gqa_packing.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return counts


def chunking_example(seed: int = 0) -> dict[str, float]:
    """The README's worked example: max |chunked - one-shot| for several chunkings of a
    12-token prompt (4 query heads on 2 KV heads, d = 8), and the error of a second chunk
    that is given start_pos = 0."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((12, 4, 8))
    k = rng.standard_normal((12, 2, 8))
    v = rng.standard_normal((12, 2, 8))
    one_shot, _ = lab.prefill_attention(q, k, v, 0)
    diffs = {}
    for sizes in ([12], [5, 7], [4, 4, 4], [3, 1, 8], [1] * 12):
        chunked = lab.chunked_prefill(q, k, v, sizes)
        diffs[str(sizes)] = float(np.abs(chunked - one_shot).max())
    wrong, _ = lab.prefill_attention(q[5:], k, v, 0)  # the second chunk of [5, 7] at 0
    diffs["[5, 7] with start_pos=0 for the second chunk"] = float(
        np.abs(wrong - one_shot[5:]).max()
    )
    return diffs


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, diff in chunking_example().items():
        print(f"max |chunked - one-shot| for {name}: {diff:.3g}")
    causal_alignment()
    tile_skipping()
    counts = gqa_packing()
    for name, values in counts.items():
        print(f"{name}: " + ", ".join(f"{k} {v:,.0f}" for k, v in values.items()))
    print(
        f"wrote {OUT / 'causal_alignment.png'}, {OUT / 'tile_skipping.png'} and "
        f"{OUT / 'gqa_packing.png'}"
    )


if __name__ == "__main__":
    main()
