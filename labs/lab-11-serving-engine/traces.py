"""The web book's trace of this lab: a serving engine, step by step. ``book/traces.py`` runs
it (``python -m book.traces``; ``make trace LAB=11`` on a starter): ``trace(impl)`` is this
lab's trace, run on the solution or a starter; ``diff(mine, ref)`` the first step where a
starter's trace differs from the reference's. Every number the page shows is computed here
by the lab's own ``LLM``: its scheduler's decision, its runner's batch and what it sampled.
"""

from __future__ import annotations

import pathlib
from typing import Any

from common.loader import load_lab_module
from common.tracing import attempt

HERE = pathlib.Path(__file__).resolve().parent

# A pool small enough that the fourth request preempts the newest one; a token budget that
# cuts the first prompt into chunks; B and D share A's first two blocks (a system prompt).
ENGINE = {"num_blocks": 9, "block_size": 4, "max_num_batched_tokens": 8, "max_num_seqs": 4}
SYSTEM = (3, 14, 15, 9, 26, 5, 30, 28)  # 8 tokens = 2 full blocks
REQUESTS = (  # (request id, arrives before step, prompt, max_tokens)
    ("A", 0, SYSTEM + (1, 2, 7), 9),
    ("B", 2, SYSTEM + (11, 4), 5),
    ("C", 2, (20, 21, 22, 23, 24, 25, 27), 7),
    ("D", 4, SYSTEM + (6, 8, 10), 6),
)
MAX_STEPS = 60


def trace(impl: Any) -> dict:
    """Four requests through ``impl.LLM`` on a random-weight model: each step's scheduled
    rows (request, first position, tokens, prefill / decode / recompute), the preempted
    requests, the batch's positions and slots, every block table after the step, the free
    blocks and the tokens sampled."""
    provided = load_lab_module(HERE, "provided")
    errors: list[str] = []
    llm = attempt(errors, impl.LLM, provided.RandomModel(seed=3), **ENGINE)
    steps: list[dict] = []
    prompts = {rid: prompt for rid, _, prompt, _ in REQUESTS}
    if llm is not None:
        decided: list[Any] = []
        batches: list[Any] = []
        schedule, prepare = llm.scheduler.schedule, llm.runner.prepare_inputs

        def record_schedule() -> Any:
            out = schedule()
            decided.append(out)
            return out

        def record_batch(out: Any, seqs: Any) -> Any:
            batch = prepare(out, seqs)
            batches.append(batch)
            return batch

        llm.scheduler.schedule, llm.runner.prepare_inputs = record_schedule, record_batch
        output: dict[str, list[int]] = {rid: [] for rid in prompts}
        preempted_once: set[str] = set()
        for n in range(MAX_STEPS):
            arrivals = [rid for rid, at, _, _ in REQUESTS if at == n]
            for rid, _, prompt, max_tokens in REQUESTS:
                if rid in arrivals:
                    attempt(errors, llm.add_request, list(prompt),
                            provided.SamplingParams(max_tokens=max_tokens), rid)
            if errors or not (attempt(errors, llm.has_unfinished_requests)
                              or any(at > n for _, at, _, _ in REQUESTS)):
                break
            decided.clear()
            batches.clear()
            outs = attempt(errors, llm.step)
            if outs is None or not decided:
                break
            out = decided[-1]
            preempted_once.update(out.preempted)
            rows = []
            for s in out.scheduled:
                start, count = int(s.num_computed_tokens), int(s.num_new_tokens)
                kind = ("decode" if start >= len(prompts[s.request_id]) + len(
                    output[s.request_id]) - 1 else "recompute" if s.request_id
                    in preempted_once else "prefill")
                rows.append({"request": s.request_id, "start": start, "tokens": count,
                             "kind": kind, "new": bool(s.is_new),
                             "cached": start if s.is_new else 0})
            sampled = {o.request_id: int(o.token_ids[-1]) for o in outs if o.token_ids}
            finished = sorted(o.request_id for o in outs if o.finished)
            for o in outs:
                output[o.request_id] = [int(t) for t in o.token_ids]
            batch = batches[-1] if batches else None
            tables = {rid: attempt(errors, llm.kv.block_table, rid)
                      for rid in sorted(llm.kv.request_ids)}
            steps.append({
                "arrivals": arrivals, "rows": rows, "preempted": list(out.preempted),
                "positions": [] if batch is None else [int(x) for x in batch.positions],
                "slots": [] if batch is None else [int(x) for x in batch.slot_mapping],
                "tables": tables, "free_blocks": int(llm.kv.num_free_blocks),
                "sampled": sampled, "finished": finished,
                "waiting": [q.request_id for q in llm.scheduler.waiting],
            })
        hits, lookups = llm.kv.num_hit_tokens, llm.kv.num_lookup_tokens
    else:
        output, hits, lookups = {}, 0, 0
    return {"lab": "11", "engine": ENGINE,
            "requests": [{"request": rid, "arrives": at, "prompt": list(prompt),
                          "max_tokens": mt} for rid, at, prompt, mt in REQUESTS],
            "steps": steps, "outputs": output, "hit_tokens": hits, "lookup_tokens": lookups,
            "errors": errors}


FIELDS = ("rows", "preempted", "positions", "slots", "tables", "free_blocks", "sampled")


def diff(mine: dict, ref: dict) -> dict | None:
    """The first step (and field) where ``mine`` differs from ``ref``, or where ``mine``
    stopped early; None when every step agrees."""
    for n, b in enumerate(ref["steps"]):
        a = mine["steps"][n] if n < len(mine["steps"]) else None
        if a is None:
            return {"step": n, "field": "step", "yours": None, "reference": b["rows"],
                    "where": "the engine stopped (or raised) before this step"}
        for field in FIELDS:
            if a.get(field) != b.get(field):
                return {"step": n, "field": field, "yours": a.get(field),
                        "reference": b.get(field), "where": _where(b)}
    if len(mine["steps"]) > len(ref["steps"]):
        return {"step": len(ref["steps"]) - 1, "field": "step", "yours": "more steps",
                "reference": None, "where": "the engine kept going after every request finished"}
    return None


def _where(step: dict) -> str:
    rows = ", ".join(f"{r['request']} {r['kind']}" for r in step["rows"])
    return f"batch {rows}" + (f"; preempted {', '.join(step['preempted'])}"
                              if step["preempted"] else "")
