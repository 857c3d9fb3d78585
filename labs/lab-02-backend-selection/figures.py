"""Draw lab 02's README figures from the lab's own code (``make figures``).

* ``figures/selection_matrix.png``: which backend vLLM 0.33.0 picks per GPU, dtype, model;
* ``figures/why_rejected.png``: for gpt-oss-20b (sinks + sliding window), each backend's
  verdict on each GPU, with vLLM's reasons;
* ``figures/sdpa_deviation.png``: PyTorch SDPA backends on this machine, max deviation
  from the float64 reference per dtype (measured when the script runs).
"""

from __future__ import annotations

import pathlib
import platform
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No "Software: matplotlib x.y" text chunk in the PNG: a rerun writes the same bytes.
PNG_METADATA = {"Software": None}
from matplotlib.colors import to_rgba  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root
from common import load_impl  # noqa: E402

lab = load_impl(__file__, "solution")
OUT = pathlib.Path(__file__).resolve().parent / "figures"

COLORS = {
    "FLASH_ATTN": "#4C72B0", "FLASHINFER": "#55A868", "TRITON_ATTN": "#DD8452",
    "FLEX_ATTENTION": "#8172B3", "FLASH_ATTN_MLA": "#64B5CD", "FLASHINFER_MLA": "#8DD3A0",
    "TRITON_MLA": "#F2B880", "CUTLASS_MLA": "#C44E52", None: "#DDDDDD",
}


def _save_grid(fig, ax, name: str) -> pathlib.Path:
    """A table-like figure: no ticks, no frame; saved under figures/ and closed."""
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.tight_layout()
    path = OUT / name
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return path


def selection_matrix_figure() -> pathlib.Path:
    matrix = lab.selection_matrix()
    rows = list(dict.fromkeys((g, d) for g, d, _ in matrix))
    models = list(dict.fromkeys(m for _, _, m in matrix))
    fig, ax = plt.subplots(figsize=(11, 8.5))
    for i, (gpu, dtype) in enumerate(rows):
        for j, model in enumerate(models):
            backend = matrix[(gpu, dtype, model)]
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=COLORS.get(backend, "#999999"),
                                       ec="white", lw=2))
            label = backend or "none valid:\nvLLM will not start"
            if dtype == "bfloat16" and lab.GPUS[gpu] < (8, 0):
                label += "\n(bf16 refused before selection)"
            ax.text(j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(models))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(models))], models)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(rows))],
                  [f"{g} ({lab.GPUS[g][0]}.{lab.GPUS[g][1]})  {d}" for g, d in rows])
    for i in range(3, len(rows), 3):
        ax.axhline(i, color="black", lw=1.5)
    ax.set_title(f"vLLM {lab.VLLM_VERSION}: the attention backend chosen at start-up "
                 "(computed by solution.select_backend)", pad=28)
    return _save_grid(fig, ax, "selection_matrix.png")


def why_rejected_figure() -> pathlib.Path:
    config = {**lab.MODELS["gpt-oss-20b"], "dtype": "bfloat16"}
    gpus = list(lab.GPUS)
    backends = lab.backend_priorities((9, 0), False)
    fig, ax = plt.subplots(figsize=(14, 5.8))
    for j, gpu in enumerate(gpus):
        cap = lab.GPUS[gpu]
        chosen = lab.select_backend(config, cap).backend
        order = lab.backend_priorities(cap, False)
        for i, backend in enumerate(backends):
            reasons = lab.validate_configuration(backend, config, cap)
            if backend == chosen:
                color, text = "#2E8B57", "CHOSEN"
            elif not reasons:
                color, text = "#B7E4C7", "valid"
            else:
                color = "#F4A6A6"
                text = "\n".join(textwrap.fill(r, 24) for r in reasons)
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=to_rgba(color), ec="white", lw=2))
            rank = order.index(backend) + 1
            ax.text(j + 0.04, i + 0.1, f"#{rank}", fontsize=7, va="top", color="#333333")
            ax.text(j + 0.5, i + 0.55, text, ha="center", va="center", fontsize=7,
                    color="white" if text == "CHOSEN" else "black",
                    fontweight="bold" if text == "CHOSEN" else "normal")
    ax.set_xlim(0, len(gpus))
    ax.set_ylim(len(backends), 0)
    ax.set_xticks([j + 0.5 for j in range(len(gpus))],
                  [f"{g}\n({lab.GPUS[g][0]}.{lab.GPUS[g][1]})" for g in gpus])
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(backends))], backends)
    ax.set_title("gpt-oss-20b (head 64, attention sinks, sliding window), bf16: each backend's "
                 "verdict in vLLM 0.33.0's words. #n = its place in that GPU's priority list",
                 pad=34, fontsize=10)
    return _save_grid(fig, ax, "why_rejected.png")


def sdpa_deviation_figure() -> pathlib.Path:
    import torch

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 128, 64, generator=g, dtype=torch.float64) for _ in range(3))
    dtypes = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
    results = {str(dt).replace("torch.", ""): lab.sdpa_bisect(
        q.to(dt), k.to(dt), v.to(dt), is_causal=True) for dt in dtypes}
    names = sorted({n for r in results.values() for n in r})
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(len(names), 1)
    for b, name in enumerate(names):
        xs = [i + b * width for i in range(len(results))]
        ys = [max(r.get(name, float("nan")), 1e-18) for r in results.values()]
        bars = ax.bar(xs, ys, width, label=name)
        for x, y in zip(xs, ys):
            ax.text(x, y * 1.4, f"{y:.1e}", ha="center", fontsize=7)
        bars.set_label(name)
    ax.set_yscale("log")
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(results))],
                  list(results))
    ax.set_ylabel("max |SDPA - float64 reference|")
    ax.set_title(f"PyTorch {torch.__version__} SDPA backends that run on this machine "
                 f"({platform.machine()} CPU), causal, [2, 8, 128, 64]", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = OUT / "sdpa_deviation.png"
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    print_backend_agreement(q, k, v)
    return path


def print_backend_agreement(q, k, v) -> None:
    """README section 7's table: MATH and FLASH_ATTENTION against each other, per dtype."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print("dtype     max |MATH - FLASH_ATTENTION|  outputs that differ  (causal, [2, 8, 128, 64])")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        outs = []
        for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
            with sdpa_kernel([backend]):
                outs.append(torch.nn.functional.scaled_dot_product_attention(
                    q.to(dt), k.to(dt), v.to(dt), is_causal=True).double())
        diff = (outs[0] - outs[1]).abs()
        name = str(dt).replace("torch.", "")
        print(f"{name:9s} {diff.max().item():.1e}{'':21s} {(diff > 0).double().mean().item():.0%}")


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for draw in (selection_matrix_figure, why_rejected_figure, sdpa_deviation_figure):
        print(f"wrote {draw()}")
