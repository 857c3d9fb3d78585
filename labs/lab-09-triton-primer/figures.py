"""Draw lab-09's README figures from a trace of the Triton interpreter running the lab's kernels.

    make figures                                  (every lab)
    python labs/lab-09-triton-primer/figures.py   (this lab)

Each figure runs the reference kernels on small buffers inside ``provided.record_memory()``
(which notes every ``tl.load`` and ``tl.store`` the interpreter executes: program id,
addresses, mask) and colours each element of a buffer by the program (or the loop step)
that touched it. Writes into labs/lab-09-triton-primer/figures/:
  vectors.png         puzzles 1-2: one program with a mask; a 1-D grid of cdiv(n, block)
  transpose.png       puzzle 3: 2-D tiles of a padded row-major x stored into out
  rows.png            puzzles 4-5: one program per row, the masked lanes of each row
  outer.png           puzzle 7: one program's rank-1 steps, a column of a and a row of b
  matmul.png          puzzles 6-8: the zero pad of a small tl.dot; one program's K steps
  online_softmax.png  puzzle 9: program 0 streams the columns of S and the rows of V
"""

from __future__ import annotations

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for `common`
os.environ.setdefault("TRITON_INTERPRET", "1")  # the recorder reads the interpreter

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from common import load_impl  # noqa: E402
from common.loader import load_lab_module  # noqa: E402

lab = load_impl(__file__, "solution")
provided = load_lab_module(__file__, "provided")
OUT = HERE / "figures"
COLORS = plt.get_cmap("tab10").colors
MARGIN, UNTOUCHED, MASKED = -2, -1, -3  # cell codes besides program / step numbers
PNG_METADATA = {"Software": None}  # same bytes on every matplotlib version


def buffer(rows: int, cols: int, fill: float = float("nan")) -> torch.Tensor:
    return torch.full((rows, cols), fill, dtype=torch.float32)


def label_grid(t: torch.Tensor, region: tuple[int, int],
               hits: list[tuple[int, np.ndarray]]) -> np.ndarray:  # fmt: skip
    """A ``t``-shaped grid of codes: margin, untouched data, or the label of the hit."""
    rows, cols = t.shape if t.ndim == 2 else (1, t.shape[0])
    grid = np.full((rows, cols), MARGIN)
    grid[: region[0], : region[1]] = UNTOUCHED
    s0, s1 = (t.stride(0), t.stride(1)) if t.ndim == 2 else (t.shape[0], 1)
    for label, flat in hits:
        i, j = (flat // s0, flat % s0) if s1 == 1 else (flat % s1, flat // s1)
        ok = (i < rows) & (j < cols)
        grid[i[ok], j[ok]] = label
    return grid


def draw(ax, grid: np.ndarray, title: str, region: tuple[int, int], labels: int) -> None:
    """Cells coloured by label (0..labels-1), the data region outlined."""
    cmap = ListedColormap([(0.93, 0.93, 0.93), (0.8, 0.8, 0.8), (1, 1, 1), *COLORS[:labels]])
    ax.imshow(grid + 3, cmap=cmap, vmin=0, vmax=labels + 2, interpolation="nearest")
    ax.add_patch(Rectangle((-0.5, -0.5), region[1], region[0], fill=False, lw=1.8, ec="black"))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)


def legend(ax, names: list[str], extra: tuple[str, ...] = ("margin (NaN / sentinel)",)) -> None:
    handles = [Patch(color=COLORS[i], label=n) for i, n in enumerate(names)]
    handles.append(Patch(color=(0.8, 0.8, 0.8), label=extra[0]))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)  # fmt: skip


def by_program(trace, t: torch.Tensor, kind: str, key=lambda p: p[0]) -> list:
    return [(key(p), ix) for p, ix in trace.elements(t, kind)]


def save(fig, name: str) -> None:
    OUT.mkdir(exist_ok=True)
    fig.savefig(OUT / name, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    print(f"wrote {OUT / name}")


def vectors() -> None:
    fig, axes = plt.subplots(2, 1, figsize=(9, 2.2))
    n1, n2 = 13, 37
    x, out = torch.randn(n1 + 11), torch.full((n1 + 11,), -1.0)
    with provided.record_memory() as trace:
        lab.add_constant(x, out, n1, 1.0, block=16)
    grid = label_grid(out, (1, n1), by_program(trace, out, "store"))
    grid[0, n1:16] = MASKED
    draw(axes[0], grid, "puzzle 1: one program, block 16, n = 13: lanes 13-15 are masked off",
         (1, n1), 1)  # fmt: skip
    x, y, out = torch.randn(n2 + 19), torch.randn(n2 + 19), torch.full((n2 + 19,), -1.0)
    with provided.record_memory() as trace:
        lab.add_vectors(x, y, out, n2, block=16)
    grid = label_grid(out, (1, n2), by_program(trace, out, "store"))
    grid[0, n2:48] = MASKED
    draw(axes[1], grid, "puzzle 2: cdiv(37, 16) = 3 programs; program 2 stores 5 lanes, masks 11",
         (1, n2), 3)  # fmt: skip
    legend(axes[1], [f"program {p}" for p in range(3)], ("masked lane / margin",))
    fig.tight_layout()
    save(fig, "vectors.png")


def transpose() -> None:
    m, n = 21, 35
    x, out = buffer(m + 5, n + 5), buffer(n + 5, m + 5, -1.0)
    x[:m, :n] = torch.randn(m, n)
    with provided.record_memory() as trace:
        lab.transpose(x, out, m, n, block_m=16, block_n=16)
    grid_n = 3  # programs (pid_m, pid_n) numbered pid_m * 3 + pid_n

    def key(p):
        return p[0] * grid_n + p[1]

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), gridspec_kw={"width_ratios": [40, 26]})
    draw(axes[0], label_grid(x, (m, n), by_program(trace, x, "load", key)),
         "x [21 x 35] in a 26 x 40 buffer: loads", (m, n), 6)  # fmt: skip
    draw(axes[1], label_grid(out, (n, m), by_program(trace, out, "store", key)),
         "out [35 x 21]: stores", (n, m), 6)  # fmt: skip
    legend(axes[1], [f"program ({p // 3}, {p % 3})" for p in range(6)])
    fig.tight_layout()
    save(fig, "transpose.png")


def rows() -> None:
    m, n = 6, 13
    x, out = buffer(m + 2, 20), buffer(m + 2, 20, -1.0)
    x[:m, :n] = torch.randn(m, n)
    with provided.record_memory() as trace:
        lab.softmax_rows(x, out, m, n)
    grid = label_grid(x, (m, n), by_program(trace, x, "load"))
    grid[:m, n:16] = MASKED
    fig, ax = plt.subplots(figsize=(7, 2.6))
    draw(ax, grid, "puzzles 4-5: program r loads row r\n(13 values in a block of 16: 3 lanes "
         "masked)", (m, n), m)  # fmt: skip
    legend(ax, [f"program {r}" for r in range(m)], ("masked lane / margin",))
    fig.tight_layout()
    save(fig, "rows.png")


def outer() -> None:
    m, n, k = 20, 20, 6
    a, b, c = buffer(m + 4, k + 4), buffer(k + 4, n + 4), buffer(m + 4, n + 4, -1.0)
    a[:m, :k], b[:k, :n] = torch.randn(m, k), torch.randn(k, n)
    with provided.record_memory() as trace:
        lab.outer_accumulate(a, b, c, m, n, k, block_m=16, block_n=16)

    def steps(t):
        return list(enumerate(ix for p, ix in trace.elements(t, "load") if p == (0, 0, 0)))

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6), gridspec_kw={"width_ratios": [10, 24]})
    draw(axes[0], label_grid(a, (m, k), steps(a)), "puzzle 7: program (0, 0)\nreads column "
         "kk of a", (m, k), k)  # fmt: skip
    draw(axes[1], label_grid(b, (k, n), steps(b)), "and row kk of b at step kk: acc += their "
         "outer product", (k, n), k)  # fmt: skip
    legend(axes[1], [f"step kk = {i}" for i in range(k)])
    fig.tight_layout()
    save(fig, "outer.png")


def matmul() -> None:
    fig, axes = plt.subplots(1, 4, figsize=(11, 3.4),
                             gridspec_kw={"width_ratios": [28, 40, 40, 40]})
    a, b, c = buffer(20, 20), buffer(20, 20), buffer(20, 20, -1.0)
    a[:5, :7], b[:7, :3] = torch.randn(5, 7), torch.randn(7, 3)
    with provided.record_memory() as trace:
        lab.small_matmul(a, b, c, 5, 3, 7)
    grid = label_grid(a, (5, 7), by_program(trace, a, "load"))[:16, :16]
    grid[(grid == UNTOUCHED) | (grid == MARGIN)] = MASKED
    draw(axes[0], grid, "puzzle 6: a [5 x 7]\nin a 16 x 16 tile\n(light grey: 0)", (5, 7), 1)
    m = n = k = 40
    a, b, c = buffer(m, k), buffer(k, n), buffer(m, n, -1.0)
    a[:], b[:] = torch.randn(m, k), torch.randn(k, n)
    with provided.record_memory() as trace:
        lab.matmul(a, b, c, m, n, k, block_m=16, block_n=16, block_k=16)

    def steps(t, kind, program=(1, 0, 0)):
        hits = [ix for p, ix in trace.elements(t, kind) if p == program]
        return list(enumerate(hits))

    def mine(t, region, hits):  # grey: what other programs read or write
        grid = label_grid(t, region, hits)
        grid[grid == UNTOUCHED] = MARGIN
        return grid

    draw(axes[1], mine(a, (m, k), steps(a, "load")), "puzzle 8: program (1, 0)\nreads "
         "row block 1 of a", (m, k), 3)  # fmt: skip
    draw(axes[2], mine(b, (k, n), steps(b, "load")), "and column block 0 of b,\n16 of K "
         "per step (step 2: 8)", (k, n), 3)  # fmt: skip
    draw(axes[3], mine(c, (m, n), [(0, ix) for _, ix in steps(c, "store")]),
         "then stores its 16 x 16\ntile of out once", (m, n), 3)  # fmt: skip
    legend(axes[3], ["K step 0 (or: stored)", "K step 1", "K step 2"], ("not this program's",))
    fig.tight_layout()
    save(fig, "matmul.png")


def online_softmax() -> None:
    m, n, dv = 20, 37, 16
    s, v = buffer(m + 4, n + 11), buffer(n + 11, dv + 4)
    out, lse = buffer(m + 4, dv + 4, -1.0), torch.full((m + 4,), -1.0)
    s[:m, :n], v[:n, :dv] = torch.randn(m, n), torch.randn(n, dv)
    with provided.record_memory() as trace:
        lab.online_softmax(s, v, out, lse, m, n, dv, block_m=16, block_n=16)

    def steps(t):
        return list(enumerate(ix for p, ix in trace.elements(t, "load") if p == (0, 0, 0)))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [48, 20]})
    draw(axes[0], label_grid(s, (m, n), steps(s)), "puzzle 9: program 0 reads rows 0-15 of S,\n"
         "16 columns per step (m, l, acc carried over)", (m, n), 3)  # fmt: skip
    draw(axes[1], label_grid(v, (n, dv), steps(v)), "and the matching rows of V", (n, dv), 3)
    legend(axes[1], ["step 0", "step 1", "step 2 (5 of 16 columns)"])
    fig.tight_layout()
    save(fig, "online_softmax.png")


if __name__ == "__main__":
    torch.manual_seed(0)
    for draw_figure in (vectors, transpose, rows, outer, matmul, online_softmax):
        draw_figure()
