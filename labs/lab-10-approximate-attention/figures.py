"""Draw lab-10's README figures from the lab's own functions, and print its tables.

    make figures                                          (every lab)
    python labs/lab-10-approximate-attention/figures.py   (this lab; prints the tables too)

Writes into labs/lab-10-approximate-attention/figures/:
  pattern_zoo.png        which (query, key) pairs each method scores, N = 64
  cost_vs_n.png          FLOPs and score bytes per head vs N, log-log
  error_vs_n.png         the retrieval task: each method's error against exact attention vs N
  spectrum_and_rank.png  singular values of softmax matrices; Linformer's error vs rank
  lsh_mass.png           softmax mass inside the LSH buckets vs bucket count and rounds
  favor_variance.png     variance of the FAVOR+ estimate of exp(q . k) vs number of features

Every number comes from the lab's functions (``solution.py``) and the given ``provided.py``;
"naive" memory is ``common.reference_attention``, the float64 dense reference. Nothing is
timed: costs are counted (FLOPs, bytes), memory is measured with tracemalloc.
"""

from __future__ import annotations

import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for `common`

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common import load_impl, reference_attention  # noqa: E402
from common.loader import load_lab_module  # noqa: E402
from common.testing import peak_memory  # noqa: E402

lab = load_impl(__file__, "solution")
provided = load_lab_module(__file__, "provided")
OUT = HERE / "figures"
PNG_METADATA = {"Software": None}  # same bytes on every matplotlib version

D = 16  # head dim of every measurement
SIZES = [256, 512, 1024, 2048, 4096]
# The settings every table and figure uses (per head, bidirectional).
WINDOW, STRIDE, BLOCK, SUMMARY, RANDOM = 64, 64, 64, 8, 8
BUCKET_SIZE, ROUNDS, RANK, FEATURES = 32, 2, 64, 64


def n_buckets(n: int) -> int:
    """Reformer grows the bucket count with N so a bucket holds about BUCKET_SIZE keys."""
    return max(2, 2 * (n // (2 * BUCKET_SIZE)))


# ---------------------------------------------------------------------------------------
# The methods, as the README's tables name them: (q, k, v) -> out
# ---------------------------------------------------------------------------------------


def methods(n: int) -> dict[str, callable]:
    """Each approximation at length n, with the settings above."""
    glob = [0]
    return {
        "exact, chunked (Rabe & Staats)": lambda q, k, v: lab.chunked_attention(q, k, v)[0],
        f"window {WINDOW} + 1 global (Longformer)": lambda q, k, v: lab.sparse_attention(
            q, k, v, lab.window_global_mask(n, WINDOW, glob))[0],
        f"+ {RANDOM} random (BigBird)": lambda q, k, v: lab.sparse_attention(
            q, k, v, lab.bigbird_mask(n, WINDOW, glob, RANDOM, seed=0))[0],
        f"strided {STRIDE} (Sparse Transformer)": lambda q, k, v: lab.sparse_attention(
            q, k, v, lab.strided_mask(n, STRIDE, causal=False))[0],
        f"fixed {BLOCK}/{SUMMARY} (Sparse Transformer)": lambda q, k, v: lab.sparse_attention(
            q, k, v, lab.fixed_mask(n, BLOCK, SUMMARY, causal=False))[0],
        f"LSH N/{BUCKET_SIZE} buckets x {ROUNDS} rounds (Reformer)": lambda q, k, v:
            lab.lsh_attention(q, k, v, provided.random_rotations(D, n_buckets(n), ROUNDS, 0))[0],
        f"Linformer k={RANK}, mean pooling": lambda q, k, v: lab.linformer_attention(
            q, k, v, provided.mean_pooling_projection(RANK, n),
            provided.mean_pooling_projection(RANK, n)),
        f"Performer m={FEATURES}": lambda q, k, v: lab.performer_attention(
            q, k, v, provided.performer_omega(D, FEATURES, seed=0)),
        "linear attention, elu+1": lambda q, k, v: lab.linear_attention_parallel(
            q, k, v, causal=False),
    }  # fmt: skip


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def retrieval_errors() -> dict[str, dict[int, tuple[float, float]]]:
    """``{method: {N: (relative error of the retrieval row, RMS error over all rows)}}``
    against exact attention (the values are N(0, 1): an RMS error of 1 is as large as a
    value itself)."""
    errors: dict[str, dict[int, tuple[float, float]]] = {}
    for n in SIZES:
        q, k, v, _ = provided.retrieval_task(n, D, seed=0)
        exact_all = np.concatenate(  # common's float64 reference, 256 query rows at a time
            [reference_attention(q[i : i + 256], k, v)[0] for i in range(0, n, 256)])
        exact = exact_all[-1:]  # the retrieval row
        for name, fn in methods(n).items():
            out = fn(q, k, v)
            errors.setdefault(name, {})[n] = (relative(out[-1:], exact), rms(out, exact_all))
    return errors


# ---------------------------------------------------------------------------------------
# Costs: counted, per head, forward pass (a multiply-add is 2 FLOPs)
# ---------------------------------------------------------------------------------------


def pairs_scored(n: int) -> dict[str, int]:
    """How many (query, key) scores each method computes at length n, from its mask or
    its shapes: exact N^2; masks: their True cells; LSH: the union of shared buckets of
    random vectors; Linformer N k; Performer and linear attention score no pairs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, D))
    h = lab.lsh_buckets(x, provided.random_rotations(D, n_buckets(n), ROUNDS, seed=0))
    lsh = int((h[:, :, None] == h[:, None, :]).any(axis=0).sum())
    return {
        "exact": n * n,
        "window+global": int(lab.window_global_mask(n, WINDOW, [0]).sum()),
        "bigbird": int(lab.bigbird_mask(n, WINDOW, [0], RANDOM, seed=0).sum()),
        "strided": int(lab.strided_mask(n, STRIDE, causal=False).sum()),
        "fixed": int(lab.fixed_mask(n, BLOCK, SUMMARY, causal=False).sum()),
        "lsh": lsh,
        "linformer": n * RANK,
    }


def costs(n: int) -> dict[str, tuple[int, int]]:
    """``{method: (FLOPs, bytes of the largest intermediate in FP16)}`` at length n.

    A scored pair costs 4 d FLOPs (q . k and p v); its score is 2 bytes if kept. Linformer
    adds the projections E K and F V (4 N k d). Performer: phi(Q), phi(K) (4 N d m),
    phi(K)^T V and phi(Q) times it (4 N m d); it keeps phi(Q), phi(K) (2 N m values).
    Linear attention is Performer with m = d features. Chunked exact attention does the
    exact FLOPs and keeps one 64 x 64 block of scores.
    """
    pairs = pairs_scored(n)
    table = {name: (4 * D * p, 2 * p) for name, p in pairs.items()}
    table["linformer"] = (4 * D * pairs["linformer"] + 4 * n * RANK * D, 2 * n * RANK)
    table["performer"] = (8 * n * D * FEATURES, 2 * 2 * n * FEATURES)
    table["linear"] = (8 * n * D * D, 2 * (D * D + D))
    table["exact"] = (4 * D * n * n, lab.score_matrix_bytes(n))
    table["chunked"] = (4 * D * n * n, 2 * 64 * 64)
    return table


def memory_table() -> list[tuple[int, int, int]]:
    """``(N, naive peak bytes, chunked peak bytes)``, tracemalloc, float64, d = 16."""
    rows = []
    for n in SIZES:
        rng = np.random.default_rng(1)
        q, k, v = (rng.standard_normal((n, D)) for _ in range(3))
        _, naive = peak_memory(reference_attention, q, k, v)
        _, chunked = peak_memory(lab.chunked_attention, q, k, v, 64, 64)
        rows.append((n, naive, chunked))
    return rows


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------


def pattern_zoo(path: pathlib.Path) -> None:
    n = 64
    x = np.random.default_rng(3).standard_normal((n, 8))
    h = lab.lsh_buckets(x, provided.random_rotations(8, 4, 1, seed=1))[0]
    order = np.argsort(h, kind="stable")  # show the LSH mask in bucket order
    panels = {
        "exact (dense)": np.ones((n, n), dtype=bool),
        "strided, stride 8 (causal)": lab.strided_mask(n, 8),
        "fixed, block 8, 2 summary (causal)": lab.fixed_mask(n, 8, 2),
        "window 4 + global token 0": lab.window_global_mask(n, 4, [0]),
        "+ 3 random per row (BigBird)": lab.bigbird_mask(n, 4, [0], 3, seed=0),
        "LSH, 4 buckets (rows, cols sorted by bucket)": (h[:, None] == h[None, :])[order][
            :, order
        ],
    }
    fig, axes = plt.subplots(2, 3, figsize=(10.5, 7.8))
    for ax, (title, mask) in zip(axes.flat, panels.items()):
        ax.imshow(mask, cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
        ax.set_title(f"{title}\n{mask.sum()} of {n * n} pairs ({mask.mean():.0%})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("key j", fontsize=8)
        ax.set_ylabel("query i", fontsize=8)
    fig.suptitle("Which scores each pattern computes (blue), N = 64: everything else is never "
                 "read", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def against_n(ax) -> None:
    """Log-log axes against the sequence length, one tick per size of SIZES."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_xticks(SIZES, [str(n) for n in SIZES])
    ax.minorticks_off()
    ax.grid(alpha=0.3)


def cost_vs_n(path: pathlib.Path) -> None:
    table = {n: costs(n) for n in SIZES}
    names = list(table[SIZES[0]])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    for name in names:
        style = "o-" if name in ("exact", "chunked") else "s--"
        label = "exact = chunked (FLOPs)" if name == "exact" else name
        ax1.plot(SIZES, [table[n][name][0] for n in SIZES], style, label=label, ms=4)
        ax2.plot(SIZES, [table[n][name][1] for n in SIZES], style, label=name, ms=4)
    ax1.set_title("FLOPs per head (counted)")
    ax2.set_title("bytes of the largest intermediate, FP16")
    for ax in (ax1, ax2):
        against_n(ax)
    ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Cost vs N, d = {D}: slope 2 is quadratic, slope 1 linear (window {WINDOW}, "
                 f"stride {STRIDE}, buckets of ~{BUCKET_SIZE} x {ROUNDS}, k = {RANK}, "
                 f"m = {FEATURES})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def error_vs_n(path: pathlib.Path, errors: dict[str, dict[int, tuple[float, float]]]) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    # float64 round-off (the exact method's 1e-16..1e-15, whose digits differ from one CPU
    # to the next with its summation order) is drawn on one floor: the figure is the same
    # on every machine; the README's table gives the values
    floor = 1e-14
    for name, by_n in errors.items():
        style = "o-" if name.startswith("exact") else "s--"
        ax1.plot(SIZES, [max(by_n[n][0], floor) for n in SIZES], style, label=name, ms=4)
        ax2.plot(SIZES, [max(by_n[n][1], floor) for n in SIZES], style, ms=4)
    for ax in (ax1, ax2):
        ax.axhline(floor, color="0.5", lw=0.8, ls=":")
        ax.annotate("float64 round-off (< 1e-14)", (SIZES[0], floor), xytext=(0, 4),
                    textcoords="offset points", fontsize=7, color="0.4")
    ax1.set_title("the retrieval row (key planted at N/8): relative error")
    ax2.set_title("all rows: RMS error (values are N(0, 1))")
    ax1.set_ylabel("error against exact attention")
    for ax in (ax1, ax2):
        against_n(ax)
    ax1.legend(fontsize=7)
    fig.suptitle("The retrieval task: what each approximation gets wrong (d = 16, float64)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def spectrum_and_rank(path: pathlib.Path) -> dict[str, dict[int, float]]:
    n = 512
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((n, D)) for _ in range(3))
    temperatures = {0.5: "scores x 0.5 (diffuse)", 1.0: "scores x 1", 4.0: "scores x 4 (sharp)"}
    ranks = [8, 16, 32, 64, 128, 256, 512]
    shown = ranks[:-1]  # k = N is exact for pooling (error ~1e-16): in the table, not the plot
    lin_err: dict[str, dict[int, float]] = {}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    for t, label in temperatures.items():
        scale = t / math.sqrt(D)
        sv = lab.attention_singular_values(q, k, scale=scale)
        ax1.semilogy(np.arange(1, n + 1), sv / sv[0], label=label)
        exact = lab.chunked_attention(q, k, v, scale=scale)[0]
        pooled = {r: provided.mean_pooling_projection(r, n) for r in ranks}
        lin_err[f"{label}, mean pooling"] = {
            r: rms(lab.linformer_attention(q, k, v, pooled[r], pooled[r], scale=scale), exact)
            for r in ranks
        }
        line = ax2.plot(shown, [lin_err[f"{label}, mean pooling"][r] for r in shown], "o-",
                        label=f"{label}, mean pooling")
        lin_err[f"{label}, best rank-k P (SVD)"] = best_rank_k_errors(q, k, v, scale, ranks)
        ax2.plot(shown, [lin_err[f"{label}, best rank-k P (SVD)"][r] for r in shown], ":",
                 color=line[0].get_color(), label=f"{label}, best rank-k P (SVD)")
    gauss = {r: (provided.linformer_projection(r, n, 1), provided.linformer_projection(r, n, 2))
             for r in ranks}
    exact = lab.chunked_attention(q, k, v)[0]
    lin_err["scores x 1, random Gaussian E, F"] = {
        r: rms(lab.linformer_attention(q, k, v, *gauss[r]), exact) for r in ranks
    }
    ax2.plot(shown, [lin_err["scores x 1, random Gaussian E, F"][r] for r in shown], "s--",
             color="grey", label="scores x 1, random Gaussian E, F (untrained)")
    ax1.set_title(f"singular values of softmax(q kᵀ·scale), N = {n}, d = {D}")
    ax1.set_xlabel("index")
    ax1.set_ylabel("σ_i / σ_1")
    ax1.legend(fontsize=8)
    ax2.set_title("Linformer RMS error vs rank k (values are N(0, 1))")
    ax2.set_xlabel("k")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(shown, [str(r) for r in shown])
    ax2.minorticks_off()
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return lin_err


def best_rank_k_errors(q, k, v, scale, ranks) -> dict[int, float]:
    """RMS error of ``P_k V`` where ``P_k`` is the best rank-k approximation of the softmax
    matrix (truncated SVD, Eckart-Young): a floor no rank-k projection of P can beat."""
    p = reference_attention(q, k, np.eye(len(k)), scale=scale)[0]  # [N, N]: P itself
    u, s, vt = np.linalg.svd(p)
    exact = p @ v
    return {r: rms((u[:, :r] * s[:r]) @ (vt[:r] @ v), exact) for r in ranks}


def clustered(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Queries and keys around 16 shared centres: the data LSH is meant for."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((16, D)) * 2.0
    pick_q, pick_k = rng.integers(0, 16, n), rng.integers(0, 16, n)
    return (centres[pick_q] + 0.5 * rng.standard_normal((n, D)),
            centres[pick_k] + 0.5 * rng.standard_normal((n, D)))  # fmt: skip


def lsh_mass(path: pathlib.Path) -> dict[int, dict[int, float]]:
    n = 512
    q, k = clustered(n, 11)
    bucket_counts = [2, 4, 8, 16, 32, 64]
    rounds = [1, 2, 4, 8]
    mass: dict[int, dict[int, float]] = {r: {} for r in rounds}
    for b in bucket_counts:
        rot = provided.random_rotations(D, b, max(rounds), seed=b)
        for r in rounds:
            mass[r][b] = float(np.mean(lab.lsh_mass_captured(q, k, rot[:r])))
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for r in rounds:
        ax.semilogx(bucket_counts, list(mass[r].values()), "o-", base=2, label=f"{r} round(s)")
    ax.set_xticks(bucket_counts, [str(b) for b in bucket_counts])
    ax.minorticks_off()
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("buckets per round")
    ax.set_ylabel("mean softmax mass inside the query's buckets")
    ax.set_title(f"Reformer LSH on clustered q, k (N = {n}, d = {D}): more buckets lose mass, "
                 "more rounds win it back", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return mass


def favor_variance(path: pathlib.Path) -> dict[int, tuple[float, float]]:
    q = np.array([[0.6, -0.2, 0.3, 0.1]])
    k = np.array([[0.4, 0.1, 0.5, -0.3]])
    exact = float(np.exp(q @ k.T)[0, 0])
    theory_one = exact**2 * (math.exp(float(((q + k) ** 2).sum())) - 1.0)
    counts = [4, 16, 64, 256, 1024]
    trials = 400
    result: dict[int, tuple[float, float]] = {}
    for m in counts:
        est = [
            float((lab.positive_random_features(q, om) * lab.positive_random_features(k, om)).sum())
            for om in (provided.performer_omega(4, m, seed=s) for s in range(trials))
        ]
        result[m] = (float(np.var(est, ddof=1)), theory_one / m)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.loglog(counts, [result[m][0] for m in counts], "o", base=2,
              label=f"measured, {trials} draws of ω")  # fmt: skip
    ax.loglog(counts, [result[m][1] for m in counts], "-", base=2,
              label="theory exp(2qᵀk)(exp|q+k|² − 1) / m")  # fmt: skip
    ax.set_xticks(counts, [str(m) for m in counts])
    ax.minorticks_off()
    ax.set_xlabel("number of random features m")
    ax.set_ylabel("variance of φ(q)ᵀφ(k)")
    ax.set_title(f"FAVOR+ estimates exp(qᵀk) = {exact:.4f} without bias; variance ∝ 1/m",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return result


# ---------------------------------------------------------------------------------------
# The worked example and the tables
# ---------------------------------------------------------------------------------------


def worked_example() -> str:
    """The README's N = 4, d = 2 Performer example, step by step (scale = 1, m = 3)."""
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, -0.5], [1.0, 1.0]])
    v = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 3.0]])
    omega = provided.performer_omega(2, 3, seed=0)
    phi_q, phi_k = lab.positive_random_features(q, omega), lab.positive_random_features(k, omega)
    np.set_printoptions(precision=3, suppress=True)
    out = lab.performer_attention(q, k, v, omega, scale=1.0)
    exact = reference_attention(q, k, v, scale=1.0)[0]
    return "\n".join([
        f"omega [d=2, m=3] =\n{omega}",
        f"phi(Q) [4, 3] =\n{phi_q}",
        f"phi(K) [4, 3] =\n{phi_k}",
        f"phi(K)^T V [3, 2] =\n{phi_k.T @ v}",
        f"phi(K)^T 1 [3] = {phi_k.sum(axis=0)}",
        f"estimated exp(q k^T) = phi(Q) phi(K)^T (never built by performer_attention) =\n"
        f"{phi_q @ phi_k.T}",
        f"true exp(q k^T) =\n{np.exp(q @ k.T)}",
        f"performer out =\n{out}",
        f"exact softmax out =\n{exact}",
    ])  # fmt: skip


def fmt_bytes(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            x = b / size
            return f"{x:.0f} {unit}" if x >= 100 else f"{x:.3g} {unit}"
    return f"{int(b)} B"


def tables(errors, lin_err, mass, variance) -> str:
    lines = ["### The N^2 wall (score_matrix_bytes, FP16)", "",
             "| N | one head | 16 heads x 24 layers |", "|---|---|---|"]
    for n in (512, 2048, 8192, 32768):
        lines.append(f"| {n} | {fmt_bytes(lab.score_matrix_bytes(n))} | "
                     f"{fmt_bytes(lab.score_matrix_bytes(n, 16, 24))} |")
    lines += ["", "### Retrieval task: error against exact (retrieval row, relative / all rows, "
              "RMS)",
              "", "| method | " + " | ".join(f"N={n}" for n in SIZES) + " |",
              "|---|" + "---|" * len(SIZES)]
    for name, by_n in errors.items():
        cells = " | ".join(f"{by_n[n][0]:.2g} / {by_n[n][1]:.2g}" for n in SIZES)
        lines.append(f"| {name} | {cells} |")
    lines += ["", "### Cost per head (FLOPs; bytes of the largest FP16 intermediate)", "",
              "| method | " + " | ".join(f"N={n}" for n in (1024, 4096)) + " |", "|---|---|---|"]
    c1, c4 = costs(1024), costs(4096)
    for name in c1:
        lines.append(f"| {name} | {c1[name][0]:.3g} FLOPs; {fmt_bytes(c1[name][1])} | "
                     f"{c4[name][0]:.3g} FLOPs; {fmt_bytes(c4[name][1])} |")
    lines += ["", "### Peak memory, tracemalloc (float64, d = 16)", "",
              "| N | dense reference | chunked_attention (64 x 64) |", "|---|---|---|"]
    for n, naive, chunked in memory_table():
        lines.append(f"| {n} | {fmt_bytes(naive)} | {fmt_bytes(chunked)} |")
    lines += ["", "### Linformer RMS error vs rank k (N = 512, d = 16, random q, k, v)", "",
              "| projection | " + " | ".join(f"k={r}" for r in next(iter(lin_err.values()))) + " |",
              "|---|" + "---|" * len(next(iter(lin_err.values())))]
    for t, by_r in lin_err.items():
        lines.append(f"| {t} | " + " | ".join(f"{e:.2g}" for e in by_r.values()) + " |")
    lines += ["", "### LSH: mean softmax mass inside the buckets (clustered q, k, N = 512)", "",
              "| rounds | " + " | ".join(f"{b} buckets" for b in mass[1]) + " |",
              "|---|" + "---|" * len(mass[1])]
    for r, by_b in mass.items():
        lines.append(f"| {r} | " + " | ".join(f"{x:.2f}" for x in by_b.values()) + " |")
    lines += ["", "### FAVOR+ variance of phi(q).phi(k) (400 draws)", "",
              "| m | measured | theory |", "|---|---|---|"]
    for m, (meas, theory) in variance.items():
        lines.append(f"| {m} | {meas:.3g} | {theory:.3g} |")
    return "\n".join(lines)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    pattern_zoo(OUT / "pattern_zoo.png")
    cost_vs_n(OUT / "cost_vs_n.png")
    errors = retrieval_errors()
    error_vs_n(OUT / "error_vs_n.png", errors)
    lin_err = spectrum_and_rank(OUT / "spectrum_and_rank.png")
    mass = lsh_mass(OUT / "lsh_mass.png")
    variance = favor_variance(OUT / "favor_variance.png")
    print(worked_example())
    print()
    print(tables(errors, lin_err, mass, variance))
    print(f"\nwrote {', '.join(sorted(p.name for p in OUT.glob('*.png')))} to {OUT}")


if __name__ == "__main__":
    main()
