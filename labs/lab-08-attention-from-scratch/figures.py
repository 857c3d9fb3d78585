"""Draw lab-08's README figures from the lab's own code, and print the worked examples.

    make figures                                          (every lab)
    python labs/lab-08-attention-from-scratch/figures.py  (this lab; prints the examples too)

Writes into labs/lab-08-attention-from-scratch/figures/:
  scale_variance_entropy.png  score variance and softmax entropy against d, with and
                              without 1/sqrt(d) (scale_experiment)
  mask_conventions.png        one padded causal batch row in the four mask conventions
  attention_heatmap.png       the weights of a causal head over a padded sequence
  rope_relative.png           q_m · k_n after RoPE: constant along every diagonal m - n
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
import torch  # noqa: E402

from common import load_impl  # noqa: E402

lab = load_impl(__file__, "solution")
OUT = HERE / "figures"
np.set_printoptions(precision=4, suppress=True)


# ---- worked examples (the README's numbers) ----------------------------------------------


def scores_example() -> str:
    q = np.array([[1.0, 0.0], [1.0, 1.0]])  # 2 queries, d = 2
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # 3 keys
    w = np.array([[1.0, 0.0], [0.0, 2.0]])
    w_q, w_k, v_a = np.eye(2), np.eye(2), np.array([1.0, 1.0])
    return "\n".join([
        f"q =\n{q}\nk =\n{k}",
        f"dot_scores (q @ k.T) =\n{lab.dot_scores(q, k)}",
        f"general_scores with w = diag(1, 2) =\n{lab.general_scores(q, k, w)}",
        f"scaled_dot_scores (/ sqrt 2) =\n{lab.scaled_dot_scores(q, k)}",
        f"additive_scores (w_q = w_k = I, v_a = [1, 1]) =\n"
        f"{lab.additive_scores(q, k, w_q, w_k, v_a)}",
        f"softmax(scaled) =\n{lab.softmax(lab.scaled_dot_scores(q, k))}",
    ])  # fmt: skip


def sdpa_example() -> str:
    q = np.array([[[1.0, 0.0], [1.0, 1.0]]])  # [H=1, Lq=2, d=2]
    k = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    v = np.array([[[10.0], [20.0], [30.0]]])  # [H=1, Lk=3, dv=1]
    mask = np.array([[True, True, False], [True, True, True]])
    return "\n".join([
        f"weights, no mask =\n{lab.attention_weights(q, k)[0]}",
        f"out, no mask = {lab.scaled_dot_product_attention(q, k, v)[0, :, 0]}",
        f"weights, key 2 hidden from query 0 =\n{lab.attention_weights(q, k, mask)[0]}",
        f"out = {lab.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0, :, 0]}",
        f"causal out = {lab.scaled_dot_product_attention(q, k, v, is_causal=True)[0, :, 0]}",
    ])  # fmt: skip


def mask_example() -> str:
    kpm = lab.key_padding_mask(np.array([3]), 4)
    return "\n".join([
        f"causal_mask(3, 4) =\n{lab.causal_mask(3, 4).astype(int)}",
        f"key_padding_mask([3], 4) = {kpm.astype(int)}   (True = padding)",
        f"key_padding_to_attn_mask = {lab.key_padding_to_attn_mask(kpm)[0, 0, 0].astype(int)}"
        "   (True = attend)",
        f"bool_to_additive(causal & not padding) =\n"
        f"{lab.bool_to_additive(lab.causal_mask(3, 4) & ~kpm[0])}",
    ])  # fmt: skip


def gqa_example() -> str:
    k = np.arange(2.0)[None, :, None, None] * np.ones((1, 2, 1, 1))  # KV heads 0, 1
    got = lab.repeat_kv(k, 2)[0, :, 0, 0]
    tiled = np.concatenate([k] * 2, axis=1)[0, :, 0, 0]
    return f"repeat_kv: query heads 0..3 read KV heads {got} (np.tile would give {tiled})"


def mha_example() -> str:
    x = np.array([[[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]])
    eye = np.eye(4)
    w = lab.MultiHeadWeights(eye, eye, eye, eye)
    heads = lab.split_heads(x, 2)
    out, avg = lab.multi_head_attention(x, x, x, w, 2, is_causal=True)
    return "\n".join([
        f"x [1, 3, 4] =\n{x[0]}",
        f"split_heads(x, 2): head 0 =\n{heads[0, 0]}\nhead 1 =\n{heads[0, 1]}",
        f"causal self-attention, identity projections: out =\n{out[0]}",
        f"head-averaged weights =\n{avg[0]}",
    ])  # fmt: skip


def positions_example() -> str:
    pe = lab.sinusoidal_positions(3, 4)
    x = np.array([[1.0, 0.0, 1.0, 0.0]])
    rows = [f"sinusoidal_positions(3, 4) =\n{pe}"]
    for p in (0, 1, 2):
        rows.append(f"apply_rope([1, 0, 1, 0], position {p}) = {lab.apply_rope(x, [p])[0]}")
    q, k = np.array([[1.0, 2.0, 0.5, -1.0]]), np.array([[0.5, -1.0, 2.0, 1.0]])
    for m, n in ((3, 1), (10, 8), (102, 100)):
        s = float(lab.apply_rope(q, [m])[0] @ lab.apply_rope(k, [n])[0])
        rows.append(f"q at {m} · k at {n} = {s:.6f}")
    return "\n".join(rows)


def experiment_example() -> str:
    rows = ["   d  var(q·k)  var(q·k/√d)  H(raw)  H(scaled)   (nats; log 256 = 5.545)"]
    for d in (4, 16, 64, 256):
        s = lab.scale_experiment(d)
        rows.append(
            f"{d:>4}  {s.variance_unscaled:8.2f}  {s.variance_scaled:11.3f}  "
            f"{s.entropy_unscaled:6.3f}  {s.entropy_scaled:9.3f}"
        )
    return "\n".join(rows)


def nan_example() -> str:
    """What PyTorch does with NaN in a key that the mask hides (why the tests poison with
    huge finite values instead)."""
    q, k = torch.ones(1, 1, 2, 2, dtype=torch.float64), torch.ones(1, 1, 3, 2, dtype=torch.float64)
    v = torch.tensor([[[[1.0], [2.0], [float("nan")]]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    v_np = v.numpy()
    mine = lab.scaled_dot_product_attention(q.numpy(), k.numpy(), v_np, attn_mask=mask.numpy())
    return (
        f"key 2 masked, its value NaN: torch SDPA out = {out[0, 0, :, 0].tolist()}, "
        f"this lab's = {mine[0, 0, :, 0].tolist()}"
    )


def worked_examples() -> str:
    parts = [
        ("scores and softmax", scores_example),
        ("scaled dot-product attention", sdpa_example),
        ("masks", mask_example),
        ("GQA", gqa_example),
        ("multi-head attention", mha_example),
        ("positions", positions_example),
        ("the sqrt(d) experiment", experiment_example),
        ("NaN in a masked slot", nan_example),
    ]
    return "\n\n".join(f"== {title} ==\n{fn()}" for title, fn in parts)


# ---- figures -----------------------------------------------------------------------------


def scale_variance_entropy(path: pathlib.Path) -> None:
    dims = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    stats = [lab.scale_experiment(d) for d in dims]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.loglog(dims, [s.variance_unscaled for s in stats], "o-", label="q·k (no scale)")
    ax1.loglog(dims, [s.variance_scaled for s in stats], "s-", label="q·k / √d")
    ax1.loglog(dims, dims, ":", color="grey", label="y = d")
    ax1.set_xlabel("head dim d")
    ax1.set_ylabel("variance of the scores")
    ax1.set_title("score variance grows like d; the scale keeps it at 1")
    ax1.legend()
    top = math.log(256)
    ax2.semilogx(dims, [s.entropy_unscaled for s in stats], "o-", label="softmax(q·k)")
    ax2.semilogx(dims, [s.entropy_scaled for s in stats], "s-", label="softmax(q·k / √d)")
    ax2.axhline(top, ls=":", color="grey", label="uniform: log 256")
    ax2.set_xlabel("head dim d")
    ax2.set_ylabel("row entropy (nats)")
    ax2.set_ylim(0, top + 0.4)
    ax2.set_title("without the scale the softmax collapses to one key")
    ax2.legend(loc="center left")
    fig.suptitle("scale_experiment(d): 256 queries x 256 keys, entries ~ N(0, 1), seed 0")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _grid(ax, visible, labels, title, color="tab:green"):
    """A boolean grid: ``visible`` cells coloured, each cell labelled with ``labels[i, j]``."""
    ax.imshow(visible, cmap=matplotlib.colors.ListedColormap(["whitesmoke", color]),
              vmin=0, vmax=1, alpha=0.6)  # fmt: skip
    for (i, j), text in np.ndenumerate(labels):
        ax.text(j, i, text, ha="center", va="center", fontsize=10)
    ax.set_title(title, fontsize=10)
    ax.set_xticks(range(visible.shape[1]))
    ax.set_yticks(range(visible.shape[0]))
    ax.set_xlabel("key j")


def _tf(mask):
    return np.where(mask, "T", "F")


def mask_conventions(path: pathlib.Path) -> None:
    n, length = 5, 3  # self-attention over 5 slots: 3 real tokens, then 2 of padding
    causal = lab.causal_mask(n, n)
    kpm = lab.key_padding_mask(np.array([length]), n)  # [1, Lk] True = padding
    attend = causal & lab.key_padding_to_attn_mask(kpm)[0, 0]  # [Lq, Lk] True = attend
    additive = lab.bool_to_additive(attend)
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.9))
    _grid(axes[0], causal, _tf(causal), "causal_mask(5, 5)\nbool, True = attend (top-left)")
    _grid(axes[1], kpm, _tf(kpm), "key_padding_mask([3], 5)\nnn.MultiheadAttention: True = IGNORE",
          color="tab:red")  # fmt: skip
    _grid(axes[2], attend, _tf(attend), "SDPA attn_mask = causal & ~padding\nbool, True = attend")
    _grid(axes[3], attend, np.where(np.isneginf(additive), "-inf", "0"),
          "bool_to_additive(attn_mask)\nfloat, ADDED to the scores")  # fmt: skip
    axes[0].set_ylabel("query i")
    fig.suptitle("one meaning, four conventions: may query i read key j? (3 tokens + 2 padding)",
                 y=1.02)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight", dpi=110, metadata={"Software": None})
    plt.close(fig)


def attention_heatmap(path: pathlib.Path) -> None:
    """Tokens whose queries and keys are their sinusoidal positions: with nothing else to
    go on, each token attends most to itself and its neighbours."""
    length, pad, dim = 12, 3, 16
    x = lab.sinusoidal_positions(length, dim) * 3.0  # [L, dim]
    kpm = lab.key_padding_mask(np.array([length - pad]), length)
    mask = lab.causal_mask(length, length) & lab.key_padding_to_attn_mask(kpm)[0, 0]
    p = lab.attention_weights(x, x, attn_mask=mask)
    fig, ax = plt.subplots(figsize=(6, 5))
    im = ax.imshow(p, cmap="viridis")
    ax.set_xlabel("key position j (last 3 are padding)")
    ax.set_ylabel("query position i")
    ax.set_title("attention_weights(x, x, causal & ~padding)\nx = 3 * sinusoidal_positions(12, 16)")
    fig.colorbar(im, ax=ax, label="weight (each row sums to 1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def rope_relative(path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    d, n = 16, 24
    q, k = rng.standard_normal(d), rng.standard_normal(d)
    pos = np.arange(n)
    qr = lab.apply_rope(np.tile(q, (n, 1)), pos)  # q placed at every position
    kr = lab.apply_rope(np.tile(k, (n, 1)), pos)
    s = qr @ kr.T  # s[m, n] = q_m · k_n
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    im = ax1.imshow(s, cmap="coolwarm")
    ax1.set_xlabel("key position n")
    ax1.set_ylabel("query position m")
    ax1.set_title("q_m · k_n after RoPE (same q, k at every position)")
    fig.colorbar(im, ax=ax1)
    m_idx, n_idx = np.meshgrid(pos, pos, indexing="ij")
    ax2.scatter((m_idx - n_idx).ravel(), s.ravel(), s=8)
    ax2.set_xlabel("m - n")
    ax2.set_ylabel("q_m · k_n")
    ax2.set_title(f"all {n * n} pairs fall on one curve of m - n")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    plt.rcParams.update({"svg.hashsalt": "lab08", "font.size": 10})
    scale_variance_entropy(OUT / "scale_variance_entropy.png")
    mask_conventions(OUT / "mask_conventions.png")
    attention_heatmap(OUT / "attention_heatmap.png")
    rope_relative(OUT / "rope_relative.png")
    print(worked_examples())


if __name__ == "__main__":
    main()
