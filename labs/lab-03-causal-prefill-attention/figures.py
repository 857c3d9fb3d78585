"""Draw lab 03's README figures from the lab's own code (``make figures``).

figures/causal_alignment.png  top-left vs bottom-right masks, and a chunk as a band of
                              the one-shot triangle
figures/tile_skipping.png     which K/V tiles a causal kernel visits, masks or skips
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for ``common``

from common import load_impl  # noqa: E402

lab = load_impl(HERE, "solution")
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
    fig.savefig(OUT / "causal_alignment.png", dpi=110)
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
    fig.savefig(OUT / "tile_skipping.png", dpi=110)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    causal_alignment()
    tile_skipping()
    print(f"wrote {OUT / 'causal_alignment.png'} and {OUT / 'tile_skipping.png'}")


if __name__ == "__main__":
    main()
