"""Draw lab-05's README figure from the lab's own code, and print the README's numbers.

    make figures                                            (every lab)
    python labs/lab-05-flash-attention-backward/figures.py  (this lab; prints the numbers too)

Writes into labs/lab-05-flash-attention-backward/figures/:
  causal_tiles_visited.png  which (query tile, key tile) pairs each Triton kernel reads under
                            causal attention, found by poisoning one tile at a time with NaN
                            and seeing which outputs turn NaN

Prints: the worked 2 x 2 example (from the lab's functions), and the memory / FLOP trade of
recomputation (arithmetic on the shapes).
"""

from __future__ import annotations

import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for `common`

from common.device import configure_triton  # noqa: E402

configure_triton()  # TRITON_INTERPRET=1 before triton is imported, where there is no GPU

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No "Software: matplotlib x.y" text chunk in the PNG: a rerun writes the same bytes.
PNG_METADATA = {"Software": None}
import numpy as np  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from common import load_impl, reference_attention  # noqa: E402

lab = load_impl(__file__, "solution")
OUT = HERE / "figures"

# ---- the worked example ---------------------------------------------------------------------

EXAMPLE = dict(
    q=np.array([[1.0, 0.0], [0.0, 2.0]]),
    k=np.array([[1.0, 0.0], [1.0, 1.0]]),
    v=np.array([[1.0, 2.0], [3.0, 4.0]]),
    do=np.array([[1.0, 0.0], [0.0, 1.0]]),  # loss = out[0, 0] + out[1, 1]
)


def fmt(x: np.ndarray) -> str:
    return np.array2string(np.asarray(x), precision=4, suppress_small=True, floatmode="fixed")


def worked_example() -> str:
    """Every quantity of the 2 x 2 example; the gradients come from the lab's functions."""
    q, k, v, do = (EXAMPLE[n] for n in ("q", "k", "v", "do"))
    scale = 1.0
    o, lse = reference_attention(q, k, v, scale=scale)
    s = q @ k.T * scale
    p = np.exp(s - lse[:, None])  # the recomputation: P from S and lse alone
    dp = do @ v.T
    delta = lab.backward_delta(o, do)
    ds = p * (dp - delta[:, None])
    naive = lab.attention_backward_naive(q, k, v, do, scale=scale)
    tiled = lab.flash_attention_backward(q, k, v, o, lse, do, block_q=1, block_k=1, scale=scale)
    without_d = (p * dp) @ k * scale
    lines = [
        "scale = 1 (to keep the numbers small)",
        f"S = q k^T          = {fmt(s)}",
        f"lse                = {fmt(lse)}",
        f"P = exp(S - lse)   = {fmt(p)}",
        f"O = P v            = {fmt(o)}",
        f"dV = P^T dO        = {fmt(p.T @ do)}",
        f"dP = dO v^T        = {fmt(dp)}",
        f"rowsum(P * dP)     = {fmt((p * dp).sum(axis=1))}",
        f"D = rowsum(dO * O) = {fmt(delta)}   (backward_delta)",
        f"dS = P * (dP - D)  = {fmt(ds)}",
        f"dQ = dS k          = {fmt(ds @ k)}",
        f"dK = dS^T q        = {fmt(ds.T @ q)}",
        f"attention_backward_naive: dq = {fmt(naive[0])}, dk = {fmt(naive[1])}, "
        f"dv = {fmt(naive[2])}",
        f"flash_attention_backward (1 x 1 tiles): dq = {fmt(tiled[0])}, dk = {fmt(tiled[1])}, "
        f"dv = {fmt(tiled[2])}",
        f"without D: dQ = (P * dP) k = {fmt(without_d)}",
    ]
    return "\n".join(lines)


# ---- the memory / FLOP trade ------------------------------------------------------------------


def recompute_trade(seq_lens=(2048, 8192, 32768), head_dim: int = 128) -> str:
    """Per head and layer: bytes of a stored P (fp16) vs lse + D (fp32), and the matmul FLOPs
    of forward and backward (2 N^2 d per N x N x d matmul, causal not halved)."""
    lines = [f"per head, per layer, d = {head_dim}, no causal halving",
             "N       P in fp16      lse + D in fp32   fwd FLOP   bwd FLOP (5 mm)   (7 mm)"]
    for n in seq_lens:
        p_bytes = n * n * 2
        stats = 2 * n * 4
        mm = 2 * n * n * head_dim  # one [N, N] x [N, d] (or [N, d] x [d, N]) matmul
        lines.append(
            f"{n:<7} {p_bytes / 2**20:>8.0f} MiB {stats / 2**10:>12.0f} KiB   "
            f"{2 * mm:9.3g}   {5 * mm:9.3g} (2.5x)   {7 * mm:9.3g} (3.5x)"
        )
    return "\n".join(lines)


# ---- which tiles each kernel reads (causal) -------------------------------------------------


def tiles_read(length: int, block_m: int, block_n: int) -> tuple[np.ndarray, np.ndarray]:
    """(dkdv_reads, dq_reads): [query tiles, key tiles] booleans, measured with NaN.

    dK/dV kernel: poison query tile i (q and dO rows); key tile j's dK turns NaN iff the
    program of key tile j read query tile i. dQ kernel: poison key tile j (K and V rows);
    query tile i's dQ turns NaN iff the program of query tile i read key tile j.
    """
    import torch

    from common.triton_env import DEVICE

    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, length, 16, generator=gen) for _ in range(4))
    o, lse = (torch.tensor(x, dtype=torch.float32) for x in reference_attention(
        q[0, 0].double().numpy(), k[0, 0].double().numpy(), v[0, 0].double().numpy(),
        mask=np.tril(np.ones((length, length), dtype=bool))))
    o, lse = o[None, None], lse[None, None]
    n_q, n_k = math.ceil(length / block_m), math.ceil(length / block_n)
    dkdv = np.zeros((n_q, n_k), dtype=bool)
    dq = np.zeros((n_q, n_k), dtype=bool)

    def run(q_, k_, v_, do_):
        args = [x.to(DEVICE) for x in (q_, k_, v_, o, lse, do_)]
        return lab.flash_attention_backward_triton(*args, causal=True, block_m=block_m,
                                                   block_n=block_n)

    for i in range(n_q):
        q_bad, do_bad = q.clone(), do.clone()
        q_bad[..., i * block_m:(i + 1) * block_m, :] = float("nan")
        do_bad[..., i * block_m:(i + 1) * block_m, :] = float("nan")
        _, dk, _ = run(q_bad, k, v, do_bad)
        for j in range(n_k):
            dkdv[i, j] = bool(torch.isnan(dk[..., j * block_n:(j + 1) * block_n, :]).any())
    for j in range(n_k):
        k_bad, v_bad = k.clone(), v.clone()
        k_bad[..., j * block_n:(j + 1) * block_n, :] = float("nan")
        v_bad[..., j * block_n:(j + 1) * block_n, :] = float("nan")
        dq_, _, _ = run(q, k_bad, v_bad, do)
        for i in range(n_q):
            dq[i, j] = bool(torch.isnan(dq_[..., i * block_m:(i + 1) * block_m, :]).any())
    return dkdv, dq


def causal_tiles_visited(path: pathlib.Path, length: int = 80, block_m: int = 16,
                         block_n: int = 32) -> str:
    dkdv, dq = tiles_read(length, block_m, block_n)
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
    titles = (
        "dK/dV kernel: one program per key tile (column),\nlooping DOWN over query tiles",
        "dQ kernel: one program per query tile (row),\nlooping RIGHT over key tiles",
    )
    colours = {"full": "#4c72b0", "diagonal": "#dd8452", "skipped": "#eeeeee"}
    for ax, reads, title, arrow in zip(axes, (dkdv, dq), titles, ("down", "right")):
        for i in range(reads.shape[0]):
            for j in range(reads.shape[1]):
                r0, r1 = i * block_m, min((i + 1) * block_m, length)
                c0, c1 = j * block_n, min((j + 1) * block_n, length)
                if reads[i, j]:
                    kind = "diagonal" if c1 - 1 > r0 else "full"  # some key > some query
                else:
                    kind = "skipped"
                ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=colours[kind],
                                       edgecolor="black", linewidth=0.8))
        ax.plot([0, length], [0, length], color="black", linestyle="--", linewidth=1)
        if arrow == "down":
            for j in range(reads.shape[1]):
                c = j * block_n + min(block_n, length - j * block_n) / 2
                ax.annotate("", xy=(c, length - 2), xytext=(c, j * block_n + 2),
                            arrowprops=dict(arrowstyle="->", color="white", lw=1.5))
        else:
            for i in range(reads.shape[0]):
                r = i * block_m + min(block_m, length - i * block_m) / 2
                ax.annotate("", xy=(min(length, (i + 1) * block_m) - 2, r), xytext=(2, r),
                            arrowprops=dict(arrowstyle="->", color="white", lw=1.5))
        ax.set_xlim(0, length)
        ax.set_ylim(length, 0)
        ax.set_aspect("equal")
        ax.set_xlabel(f"key position (tiles of block_n = {block_n})")
        ax.set_ylabel(f"query position (tiles of block_m = {block_m})")
        ax.set_title(f"{title}\n{int(reads.sum())} of {reads.size} tiles read", fontsize=10)
    fig.legend(
        handles=[Patch(facecolor=colours["full"], label="read, every pair visible"),
                 Patch(facecolor=colours["diagonal"],
                       label="read, masked (straddles the diagonal)"),
                 Patch(facecolor=colours["skipped"], edgecolor="black", label="never read")],
        loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"Causal backward, L = {length}: the tiles each kernel reads "
                 "(measured: poison one tile with NaN, see which outputs turn NaN)", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return (f"dK/dV kernel reads {int(dkdv.sum())} of {dkdv.size} tiles, dQ kernel reads "
            f"{int(dq.sum())} of {dq.size} (L = {length}, {block_m} x {block_n} tiles)")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    print("worked example:\n" + worked_example() + "\n")
    print("recomputation trade:\n" + recompute_trade() + "\n")
    print(causal_tiles_visited(OUT / "causal_tiles_visited.png"))


if __name__ == "__main__":
    main()
