"""Draw lab 12's README figures from the lab's given code (``provided.py``: the e4m3 grid)
and the float64 reference, so they draw the same in the student copy.

    MPLBACKEND=Agg python labs/lab-12-fp8-kv-and-cascade/figures.py

1. ``figures/e4m3_grid.png``: the non-negative e4m3 values on a log axis (the spacing
   doubles every power of two; 448 is the last one), and the relative error per channel of a
   K tensor with two outlier channels and one outlier token, snapped to the grid with one
   scale per tensor or one per token-head (bf16 for comparison).
2. ``figures/cascade.png``: one pass of every request's query over the shared prefix,
   merged with each request's own suffix; and the K/V bytes one decode step reads, per
   request vs cascade, as the number of requests sharing a 2,000-token prompt grows
   (modelled arithmetic for a Llama-3-8B-like layer).
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

provided = load_lab_module(__file__, "provided")
OUT = pathlib.Path(__file__).resolve().parent / "figures"


def snap(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``x`` snapped to the e4m3 grid times ``scale`` (nearest value, saturating): a
    picture's helper, not the exercise's rounding rule (ties are not treated here)."""
    grid = provided.E4M3_POSITIVE
    y = np.clip(np.abs(x) / scale, 0, provided.E4M3_MAX)
    i = np.clip(np.searchsorted(grid, y), 1, len(grid) - 1)
    nearest = np.where(y - grid[i - 1] <= grid[i] - y, grid[i - 1], grid[i])
    return np.sign(x) * nearest * scale


def bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (8 significant bits), ties to even, by hand."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def e4m3_grid() -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.2), height_ratios=[1, 1.6])
    grid = provided.E4M3_POSITIVE[1:]  # without 0 (log axis)
    subnormal = grid < provided.E4M3_MIN_NORMAL
    top.vlines(grid[~subnormal], 0, 1, color="tab:blue", lw=0.8, label="normal values")
    top.vlines(grid[subnormal], 0, 1, color="tab:orange", lw=0.8,
               label="subnormals (fixed step 2^-9)")
    top.set_xscale("log", base=2)
    top.set_yticks([])
    top.set_xlim(2**-10, 2**9.2)
    top.annotate("448 = 2^8 x 1.75: the largest value", (448, 1), (2**3, 1.35),
                 arrowprops={"arrowstyle": "->"}, fontsize=9)
    top.set_title("e4m3: 8 values per power of two, so the step doubles with the value "
                  "(relative error <= 2^-4)", fontsize=10)
    top.set_ylim(0, 1.6)
    top.legend(loc="upper left", fontsize=8, frameon=False)

    rng = np.random.default_rng(5)
    tokens, head_dim = 64, 32
    x = rng.standard_normal((tokens, head_dim))
    x[:, [1, head_dim - 3]] *= 20.0  # outlier channels
    x[0] *= 1000.0  # an outlier token (attention-sink-like)
    rest = x[1:]
    per_tensor = snap(rest, np.abs(x).max() / 448)
    per_row = snap(rest, np.abs(rest).max(axis=1, keepdims=True) / 448)
    channels = np.arange(head_dim)

    def error(approx: np.ndarray) -> np.ndarray:
        return np.linalg.norm(approx - rest, axis=0) / np.linalg.norm(rest, axis=0)

    width = 0.4
    bottom.bar(channels - width / 2, error(per_tensor), width, label="fp8, one scale per tensor")
    bottom.bar(channels + width / 2, error(per_row), width, label="fp8, one scale per token-head")
    bottom.plot(channels, error(bf16(rest)), "k.", label="bf16 (no scale)")
    bottom.set_yscale("log")
    bottom.set_xlabel("channel of the head dim (1 and 29 are outlier channels, ~20x)")
    bottom.set_ylabel("relative error (tokens 1..63)")
    bottom.set_title("token 0 is 1000x larger: with one scale it pushes every other token's "
                     "small channels into the subnormals", fontsize=10)
    bottom.legend(fontsize=8, frameon=False, ncol=3, loc="upper center")
    fig.tight_layout()
    fig.savefig(OUT / "e4m3_grid.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def cascade() -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), width_ratios=[1.15, 1])
    left.set_xlim(0, 10)
    left.set_ylim(-0.5, 5.5)
    left.axis("off")
    left.add_patch(plt.Rectangle((0.2, 1.5), 3.2, 2.0, color="tab:blue", alpha=0.35))
    left.text(1.8, 2.5, "shared prefix\nP tokens\nread ONCE\n(B queries x 1 pass)",
              ha="center", va="center", fontsize=9)
    for b in range(4):
        y = 4.5 - 1.3 * b
        left.add_patch(plt.Rectangle((4.6, y - 0.35), 1.6, 0.7, color="tab:orange", alpha=0.4))
        left.text(5.4, y, f"suffix {b}", ha="center", va="center", fontsize=8)
        left.annotate("", (7.4, y), (6.2, y), arrowprops={"arrowstyle": "->"})
        left.annotate("", (7.4, y), (3.4, 2.5), arrowprops={"arrowstyle": "->", "alpha": 0.5})
        left.text(8.6, y, f"merge -> out {b}", ha="center", va="center", fontsize=8)
    left.set_title("cascade: (out, lse) of the prefix + (out, lse) of each suffix", fontsize=10)

    row = 2 * 8 * 128 * 2  # one token's K and V in one layer: 8 KV heads, d 128, bf16
    prefix, own = 2000, 100
    requests = np.array([1, 2, 4, 8, 16, 32, 64])
    per_request = (requests * (prefix + own)) * row / 2**20
    cascaded = (prefix + requests * own) * row / 2**20
    right.plot(requests, per_request, "o-", label="per-request decode (prefix x B)")
    right.plot(requests, cascaded, "s-", label="cascade (prefix once)")
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_xlabel("requests sharing a 2,000-token prompt (100 own tokens each)")
    right.set_ylabel("K/V MiB read per layer per step")
    right.set_title("modelled: Llama-3-8B-like layer, bf16", fontsize=10)
    right.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(OUT / "cascade.png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    e4m3_grid()
    cascade()


if __name__ == "__main__":
    main()
