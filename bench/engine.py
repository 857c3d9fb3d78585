"""``python -m bench.engine`` (``make bench-engine``): lab-11's engine on a CPU beside
transformers' ``generate()`` on the same workload, in the same run, one torch thread.

    python -m bench.engine [--impl solution|starter] [--requests 64]

Rows: output tokens per second, mean time to first token (TTFT) and time per output token
(TPOT) with every request queued at t = 0; how many requests ran at once in the fixed KV
pool, against a contiguous ``max_model_len`` reservation of the same pool; the prefix-cache
hit rate of a shared-prompt workload. Times are wall clock on whatever machine runs it: a
CPU engine in numpy is not a GPU engine, and only the ratios in one run mean anything.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from common.loader import REPO_ROOT, load_impl, load_lab_module

LAB = REPO_ROOT / "labs" / "lab-11-serving-engine"
NUM_BLOCKS, BLOCK_SIZE = 64, 4


def addition_prompts(tokenizer, n: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [tokenizer(f"<bos>{str(a).zfill(3)[::-1]}+{str(b).zfill(3)[::-1]}=").input_ids
            for a, b in rng.integers(0, 1000, (n, 2))]


def run_engine(lab, provided, model, prompts, max_tokens: int) -> dict[str, float]:
    llm = lab.LLM(model, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                  max_num_batched_tokens=128, max_num_seqs=64)
    params = provided.SamplingParams(max_tokens=max_tokens)
    start = time.perf_counter()
    ids = [llm.add_request(p, params) for p in prompts]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    most_running = 0
    while llm.has_unfinished_requests():
        outs = llm.step()
        now = time.perf_counter() - start
        most_running = max(most_running, len(llm.kv.request_ids))
        for o in outs:
            first.setdefault(o.request_id, now)
            last[o.request_id], count[o.request_id] = now, len(o.token_ids)
    total = time.perf_counter() - start
    tokens = sum(count.values())
    tpot = [(last[i] - first[i]) / (count[i] - 1) for i in ids if count[i] > 1]
    return {"seconds": total, "tokens": tokens, "tok_s": tokens / total,
            "ttft": float(np.mean([first[i] for i in ids])),
            "tpot": float(np.mean(tpot)) if tpot else float("nan"),
            "most_running": most_running, "hit_rate": llm.kv.num_hit_tokens
            / max(llm.kv.num_lookup_tokens, 1)}


def run_transformers(provided, model, prompts, max_tokens: int, batched: bool
                     ) -> dict[str, float]:
    net, _ = provided.load_model(model)
    net.set_attn_implementation("sdpa")
    eos = net.generation_config.eos_token_id
    start, tokens = time.perf_counter(), 0
    ttft, tpot = [], []
    groups = [prompts] if batched else [[p] for p in prompts]
    for group in groups:  # a batch of equal-length prompts needs no padding
        ids = torch.tensor(group)
        clock = _Clock()
        out = net.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=max_tokens, pad_token_id=0,
                           streamer=clock)[:, ids.shape[1]:]
        times = [t - start for t in clock.times[1:]]  # [0] is the prompt, then each token
        for row in out.tolist():
            n = row.index(eos) + 1 if eos is not None and eos in row else len(row)
            tokens += n
            ttft.append(times[0])
            if n > 1:
                tpot.append((times[n - 1] - times[0]) / (n - 1))
    total = time.perf_counter() - start
    return {"seconds": total, "tokens": tokens, "tok_s": tokens / total,
            "ttft": float(np.mean(ttft)), "tpot": float(np.mean(tpot)) if tpot else float("nan")}


class _Clock:
    """A ``generate(streamer=...)`` that only notes when each step's tokens came out."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def section(impl: str = "solution", requests: int = 64, lab_dir=LAB) -> dict | None:
    """Print the engine's rows (``make bench`` and ``make bench-engine``) and return them as
    a JSON-friendly record; None (with the reason printed) when the lab or transformers is
    missing."""
    if not (lab_dir / f"{impl}.py").is_file():
        print(f"engine rows: SKIPPED: {lab_dir.name}/{impl}.py does not exist yet")
        return None
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("engine rows: SKIPPED: transformers is not installed (requirements-cpu.txt)")
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _section(impl, requests, lab_dir)
    finally:
        torch.set_num_threads(threads)


def _section(impl: str, requests: int, lab_dir) -> dict:
    lab = load_impl(lab_dir, impl)
    provided = load_lab_module(lab_dir, "provided")
    tokenizer = provided.load_model(provided.MODEL_DIR)[1]
    prompts = addition_prompts(tokenizer, requests)
    print(f"workload: {len(prompts)} addition prompts of {len(prompts[0])} tokens "
          f"(models/adder), greedy, up to 8 output tokens (the answer is 5 with <eos>); "
          f"pool {NUM_BLOCKS} blocks x {BLOCK_SIZE} slots; torch {torch.__version__}, 1 thread")
    run_engine(lab, provided, provided.MODEL_DIR, prompts[:2], 8)  # warm-up
    eng = run_engine(lab, provided, provided.MODEL_DIR, prompts, 8)
    one = run_transformers(provided, provided.MODEL_DIR, prompts, 8, batched=False)
    batch = run_transformers(provided, provided.MODEL_DIR, prompts, 8, batched=True)
    print(f"{'':34s}{'seconds':>9s}{'tokens':>8s}{'tok/s':>9s}{'vs engine':>11s}"
          f"{'TTFT ms':>9s}{'TPOT ms':>9s}")
    rows = [("lab-11 engine (numpy attention)", eng),
            ("transformers generate, one by one", one),
            ("transformers generate, one batch", batch)]
    for name, r in rows:
        print(f"{name:34s}{r['seconds']:9.2f}{r['tokens']:8d}{r['tok_s']:9.1f}"
              f"{r['tok_s'] / eng['tok_s']:10.2f}x{r['ttft'] * 1e3:9.0f}{r['tpot'] * 1e3:9.1f}")
    print("(TTFT, TPOT: means over the requests, every request queued at t = 0; vs engine: "
          "throughput ratio, > 1 is faster than the engine)")
    max_len = int(provided.RandomModel().max_position_embeddings)
    contiguous = NUM_BLOCKS * BLOCK_SIZE // max_len
    print(f"requests holding KV at once: paged {eng['most_running']}; a contiguous "
          f"max_model_len ({max_len}) reservation of the same {NUM_BLOCKS * BLOCK_SIZE} slots "
          f"fits {contiguous} ({eng['most_running'] / contiguous:.1f}x)")
    rng = np.random.default_rng(1)
    system = rng.integers(0, 32, 16).tolist()
    shared = [system + rng.integers(0, 32, 4).tolist() for _ in range(16)]
    hits = run_engine(lab, provided, provided.RandomModel(), shared, 4)
    print(f"prefix cache: 16 prompts with one 16-token system prompt (random model): "
          f"{hits['hit_rate']:.0%} of prompt tokens served from the cache")
    return {"workload": {"requests": len(prompts), "prompt_tokens": len(prompts[0]),
                         "max_tokens": 8, "num_blocks": NUM_BLOCKS, "block_size": BLOCK_SIZE},
            "rows": {name: r for name, r in rows},
            "paged_running": eng["most_running"], "contiguous_running": contiguous,
            "prefix_hit_rate": hits["hit_rate"], "timings_are_real": "CPU wall clock"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__)
    p.add_argument("--impl", choices=("solution", "starter"), default="solution")
    p.add_argument("--requests", type=int, default=64)
    args = p.parse_args(argv)
    section(args.impl, args.requests)

if __name__ == "__main__":
    main()
