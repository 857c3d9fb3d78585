"""Draw lab 11's README figure from the lab's own engine (``make figures``) and print the
numbers the README quotes.

figures/engine_steps.png  one run of the engine step by step: the tokens each request got in
                          each step (prefill chunks and decode rows, one colour per
                          request) under the token budget, the blocks each request holds,
                          preemptions and prefix hits
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
import torch  # noqa: E402

from common.loader import load_impl, load_lab_module  # noqa: E402

OUT = HERE / "figures"
lab = load_impl(HERE, "solution")
provided = load_lab_module(HERE, "provided")

BUDGET, NUM_BLOCKS, BLOCK_SIZE = 8, 10, 4
SYSTEM = [3, 14, 15, 9, 2, 6, 5, 3]  # two full blocks every other request shares
PROMPTS = [SYSTEM + [1, 7], [8, 8, 1], SYSTEM + [4, 4, 4, 2, 1], [9, 9, 9, 9, 9, 9, 9, 9, 9]]
ARRIVE = [0, 0, 2, 3]  # the step each request arrives in
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]


def trace() -> list[dict]:
    """Run the engine on PROMPTS; per step: tokens scheduled per request (and whether they
    were decode rows), blocks held per request, preemptions."""
    torch.set_num_threads(1)
    llm = lab.LLM(provided.RandomModel(seed=0), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                  max_num_batched_tokens=BUDGET, max_num_seqs=4)
    params = provided.SamplingParams(max_tokens=6)
    steps, step = [], 0
    while step == 0 or llm.has_unfinished_requests() or step <= max(ARRIVE):
        for i, at in enumerate(ARRIVE):
            if at == step:
                llm.add_request(PROMPTS[i], params, request_id=f"r{i}")
        out = llm.scheduler.schedule()
        held, seen = {}, set()  # physical blocks, a shared prefix block counted once
        for rid in sorted(llm.kv.request_ids):
            table = set(llm.kv.block_table(rid))
            held[rid], seen = len(table - seen), seen | table
        steps.append({"scheduled": [(s.request_id, s.num_new_tokens, s.num_computed_tokens,
                                     s.is_new) for s in out.scheduled],
                      "preempted": list(out.preempted), "held": held})
        llm.scheduler.schedule = lambda out=out: out  # replay this decision inside step()
        llm.step()
        del llm.scheduler.schedule
        step += 1
    return steps


def draw(steps: list[dict], path: pathlib.Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for x, s in enumerate(steps):
        y = 0
        for rid, n, computed, is_new in s["scheduled"]:
            i = int(rid[1:])
            decode = n == 1 and computed >= len(PROMPTS[i])
            top.bar(x, n, bottom=y, color=COLORS[i], edgecolor="black", linewidth=0.6,
                    hatch="" if decode else "//")
            if is_new and computed:
                top.text(x, y + n / 2, f"hit {computed}", ha="center", va="center", fontsize=7)
            y += n
        for rid in s["preempted"]:
            top.annotate(f"preempt {rid}", (x, BUDGET + 0.2), ha="center", fontsize=7,
                         color=COLORS[int(rid[1:])])
        y = 0
        for rid, blocks in sorted(s["held"].items()):
            bottom.bar(x, blocks, bottom=y, color=COLORS[int(rid[1:])], edgecolor="black",
                       linewidth=0.6)
            y += blocks
    top.axhline(BUDGET, color="gray", ls="--", lw=1)
    top.set_ylabel("tokens in the step")
    top.set_ylim(0, BUDGET + 1.5)
    top.set_title(f"Each step's batch (budget {BUDGET} tokens; hatched: prefill chunk, "
                  "plain: decode row)", fontsize=10)
    bottom.axhline(NUM_BLOCKS, color="gray", ls="--", lw=1)
    bottom.set_ylabel(f"blocks held (pool {NUM_BLOCKS})", fontsize=9)
    bottom.set_xlabel("engine step (a block two requests share is counted for the first)")
    bottom.set_ylim(0, NUM_BLOCKS + 1)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS]
    top.legend(handles, [f"r{i} ({len(p)}-token prompt)" for i, p in enumerate(PROMPTS)],
               fontsize=7, loc="upper right", ncol=2)
    bottom.set_xticks(np.arange(len(steps)))
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    steps = trace()
    draw(steps, OUT / "engine_steps.png")
    for x, s in enumerate(steps):
        print(x, s["scheduled"], "preempted", s["preempted"], "held", s["held"])
