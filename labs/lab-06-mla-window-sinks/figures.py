"""Draw lab 06's README figures from the lab's own code (``make figures``).

figures/bytes_per_token.png   KV bytes per token of real model shapes, MHA -> MQA -> GQA -> MLA
                              (kv_bytes_per_token), and one sequence's cache against its length
figures/window_loop_bound.png the window as a loop bound over a block table: which cache slots
                              window_decode_attention reads, found by poisoning each slot in
                              turn with NaN and watching the output

Prints the numbers the README quotes.
"""

from __future__ import annotations

import pathlib
import sys

import matplotlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the repository root, for `common`
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No "Software: matplotlib x.y" text chunk in the PNG: a rerun writes the same bytes.
PNG_METADATA = {"Software": None}
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from common.loader import load_impl  # noqa: E402
from common.paged import build_paged_kv  # noqa: E402

OUT = HERE / "figures"
lab = load_impl(HERE, "solution")
KIND_COLORS = {"mha": "#C44E52", "gqa": "#4C72B0", "mqa": "#8172B2", "mla": "#55A868"}
LINE_COLORS = ["#C44E52", "#4C72B0", "#8172B2", "#DD8452", "#937860", "#55A868"]


def bytes_per_token(model) -> int:
    return lab.kv_bytes_per_token(model.kind, model.num_layers, model.head_dim,
                                  model.num_heads, num_kv_heads=model.num_kv_heads,
                                  kv_lora_rank=model.kv_lora_rank, rope_dim=model.rope_dim)


def cache_bytes(model, context: np.ndarray) -> np.ndarray:
    """One sequence's KV cache at each context length. gpt-oss windows half its layers;
    Mistral-7B-v0.1 windows all of them (a cache capped at the window, as its rolling buffer
    and vLLM's sliding-window manager keep it; vLLM keeps window - 1 past tokens plus the
    tokens in flight, rounded up to blocks)."""
    per_token = bytes_per_token(model)
    if model.window is None:
        return per_token * context
    windowed = np.minimum(context, model.window)
    if model.name.startswith("gpt-oss"):
        return per_token / 2 * (context + windowed)
    return per_token * windowed


def draw_bytes_per_token() -> pathlib.Path:
    models = lab.MODELS
    sizes = [bytes_per_token(m) for m in models]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2),
                                      gridspec_kw={"width_ratios": [1.15, 1]})
    y = np.arange(len(models))[::-1]
    left.barh(y, np.array(sizes) / 1024, color=[KIND_COLORS[m.kind] for m in models])
    left.set_xscale("log")
    for yi, size in zip(y, sizes):
        left.text(size / 1024 * 1.08, yi, f"{size:,} B = {size / 1024:,.1f} KiB",
                  va="center", fontsize=8.5)
    left.set_yticks(y, [m.name for m in models], fontsize=8.5)
    left.set_xlim(10, 30_000)
    left.set_xlabel("KV cache per token, all layers, bf16 (KiB, log scale)")
    left.set_title("One token's KV cache: MHA -> MQA -> GQA -> MLA")

    context = np.arange(0, 131_073, 512)
    for m, color in zip(models, LINE_COLORS):
        if m.kind == "mha":
            continue
        right.plot(context / 1024, cache_bytes(m, context) / 2**30, color=color,
                   ls="--" if m.window else "-", label=m.name.split(" (")[0]
                   + (f" (window {m.window})" if m.window else f" ({m.kind.upper()})"))
    right.set_xlabel("context length (k tokens)")
    right.set_ylabel("KV cache of one sequence (GiB)")
    right.set_title("One sequence's cache as its context grows")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.tight_layout()
    path = OUT / "bytes_per_token.png"
    fig.savefig(path, dpi=130, metadata=PNG_METADATA)
    plt.close(fig)
    return path


# ---- the window as a loop bound ------------------------------------------------------------

SEQ_LEN, WINDOW, BLOCK_SIZE = 22, 9, 4


def slots_read(paged, q: np.ndarray) -> np.ndarray:
    """``read[block, slot]``: poisoning that one slot with NaN changes the output to NaN."""
    read = np.zeros(paged.k_cache.shape[:2], dtype=bool)
    for block in range(paged.num_blocks):
        for slot in range(BLOCK_SIZE):
            k = paged.k_cache.copy()
            k[block, slot] = np.nan
            out, _ = lab.window_decode_attention(q, k, paged.v_cache, paged.block_tables[0],
                                                 SEQ_LEN, WINDOW)
            read[block, slot] = np.isnan(out).any()
    return read


def draw_window_loop_bound() -> pathlib.Path:
    rng = np.random.default_rng(3)
    k = rng.standard_normal((SEQ_LEN, 1, 2))
    paged = build_paged_kv([k], [k], BLOCK_SIZE, rng=5, extra_blocks=1)
    paged.k_cache = np.nan_to_num(paged.k_cache)  # finite everywhere: only the probe is NaN
    paged.v_cache = np.nan_to_num(paged.v_cache)
    read = slots_read(paged, rng.standard_normal((1, 2)))
    table = paged.block_tables[0]
    first = SEQ_LEN - WINDOW
    print(f"window {WINDOW} over seq_len {SEQ_LEN}, block size {BLOCK_SIZE}: positions "
          f"{first}..{SEQ_LEN - 1}; the loop starts at logical block {first // BLOCK_SIZE}")
    print("block table:", table.tolist(), "; slots read per physical block:",
          {int(b): np.flatnonzero(read[b]).tolist() for b in range(paged.num_blocks)
           if read[b].any()})

    num_logical = -(-SEQ_LEN // BLOCK_SIZE)
    fig, ax = plt.subplots(figsize=(12, 4.4))
    ax.set_xlim(-2.6, num_logical * (BLOCK_SIZE + 0.6) + 0.5)
    ax.set_ylim(-2.3, 3.2)
    ax.axis("off")
    colors = {"read": "#4C72B0", "skipped": "#B8C7E0", "before": "#D9D9D9", "empty": "white"}
    for logical in range(num_logical):
        x0 = logical * (BLOCK_SIZE + 0.6)
        physical = int(table[logical])
        for slot in range(BLOCK_SIZE):
            pos = logical * BLOCK_SIZE + slot
            if pos >= SEQ_LEN:
                kind, label = "empty", ""
            elif read[physical, slot]:
                kind, label = "read", str(pos)
            elif logical >= first // BLOCK_SIZE:
                kind, label = "skipped", str(pos)
            else:
                kind, label = "before", str(pos)
            ax.add_patch(Rectangle((x0 + slot, 1), 0.92, 0.9, facecolor=colors[kind],
                                   edgecolor="#7F7F7F"))
            ax.text(x0 + slot + 0.46, 1.45, label, ha="center", va="center", fontsize=8,
                    color="white" if kind == "read" else "#404040")
        never = logical < first // BLOCK_SIZE
        ax.text(x0 + BLOCK_SIZE / 2, 0.55, f"logical {logical}", ha="center", fontsize=8)
        ax.text(x0 + BLOCK_SIZE / 2, 0.15, f"-> physical {physical}", ha="center", fontsize=8,
                color="#7F7F7F" if never else "black")
        if never:
            ax.text(x0 + BLOCK_SIZE / 2, -0.3, "never read\n(NaN in the tests;\nvLLM frees it)",
                    ha="center", va="top", fontsize=7.5, color="#7F7F7F")
    x_start = (first // BLOCK_SIZE) * (BLOCK_SIZE + 0.6) + first % BLOCK_SIZE
    x_end = (num_logical - 1) * (BLOCK_SIZE + 0.6) + (SEQ_LEN - 1) % BLOCK_SIZE + 0.92
    ax.add_patch(FancyArrowPatch((x_start, 2.35), (x_end, 2.35), arrowstyle="-|>",
                                 mutation_scale=14, color="#C44E52", lw=2))
    ax.text((x_start + x_end) / 2, 2.55, f"the loop: positions seq_len - window = {first} ... "
            f"{SEQ_LEN - 1} (window = {WINDOW}, itself included)", ha="center", fontsize=9,
            color="#C44E52")
    ax.text(-2.5, 1.45, "block table\nof one sequence", fontsize=9, va="center")
    ax.text(-2.5, -1.9, f"first block read: logical block {first} // {BLOCK_SIZE} = "
            f"{first // BLOCK_SIZE}, entered at slot {first} % {BLOCK_SIZE} = "
            f"{first % BLOCK_SIZE}", fontsize=8.5)
    handles = [Rectangle((0, 0), 1, 1, facecolor=colors[k], edgecolor="#7F7F7F")
               for k in ("read", "skipped", "before")]
    ax.legend(handles, ["read (poisoning it turns the output to NaN)",
                        "in a block the loop visits, before the window: not read",
                        "in a block wholly before the window: never visited"],
              loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    path = OUT / "window_loop_bound.png"
    fig.savefig(path, dpi=130, metadata=PNG_METADATA)
    plt.close(fig)
    return path


def print_numbers() -> None:
    for m in lab.MODELS:
        size = bytes_per_token(m)
        line = f"{m.name}: {size:,} B/token = {size / 1024:,.2f} KiB"
        for n in (8192, 32768, 131072):
            line += f"; {n // 1024}k: {cache_bytes(m, np.array([n]))[0] / 2**30:,.2f} GiB"
        print(line)


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    print_numbers()
    for drawn in (draw_bytes_per_token(), draw_window_loop_bound()):
        print("wrote", drawn.relative_to(HERE.parent.parent))
