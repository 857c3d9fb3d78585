"""The web book's traces of this lab: A block pool for a request stream. ``book/traces.py``
runs them (``python -m book.traces``; ``make trace LAB=07`` on a starter): ``trace(impl)``
is this lab's trace, run on the solution or a starter; ``diff(mine, ref)`` the first step
where a starter's trace differs from the reference's; every number a page shows is computed
here by the lab's public functions.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np

from common.loader import load_lab_module
from common.tracing import attempt, rounded

HERE = pathlib.Path(__file__).resolve().parent


POOL = {"num_blocks": 10, "block_size": 4}


STREAM = {"num_blocks": 24, "block_size": 4, "max_num_seqs": 6, "max_model_len": 32}


def trace(impl: Any) -> dict:
    """A scripted stream through KVCacheManager (prefix hit, fork, copy-on-write, a request
    arriving mid-stream, a finish), then simulate vs simulate_contiguous on one workload."""
    provided = load_lab_module(HERE, "provided")
    Request = provided.Request
    errors: list[str] = []
    pool = attempt(errors, impl.BlockPool, POOL["num_blocks"], POOL["block_size"])
    mgr = attempt(errors, impl.KVCacheManager, pool) if pool is not None else None
    prefix = tuple(range(100, 108))  # two full blocks every request shares (a system prompt)
    reqs = {"A": Request("A", prefix + (1, 2, 3)), "B": Request("B", prefix + (7, 8, 9, 10, 11))}
    events: list[dict] = []

    def snap(what: str, **extra: Any) -> None:
        tables, refs, free = {}, None, None
        if mgr is not None:
            for rid in attempt(errors, lambda: mgr.request_ids) or []:
                tables[rid] = attempt(errors, mgr.block_table, rid)
            refs = [attempt(errors, pool.ref_count, b) for b in range(POOL["num_blocks"])]
            free = attempt(errors, lambda: pool.num_free_blocks)
        events.append({"event": what, "tables": tables, "ref_counts": refs,
                       "free_blocks": free, **extra})

    def act(fn: Callable[[], Any]) -> Any:
        return attempt(errors, fn) if mgr is not None else None

    act(lambda: mgr.allocate_slots(reqs["A"], reqs["A"].num_tokens))
    snap("A arrives: 11 prompt tokens -> 3 blocks")
    hit = act(lambda: mgr.get_computed_blocks(reqs["B"]))
    cached = hit[1] if hit else 0
    act(lambda: mgr.allocate_slots(reqs["B"], reqs["B"].num_tokens - cached))
    snap("B arrives mid-stream: its first 2 blocks are a prefix-cache hit", cached_tokens=cached)
    reqs["C"] = act(lambda: mgr.fork(reqs["A"], "C"))
    snap("C = fork of A (parallel sampling): every block shared, ref counts + 1")
    if reqs.get("C") is not None:
        reqs["C"] = reqs["C"].appended(42)
        act(lambda: mgr.allocate_slots(reqs["C"], 1))
    copies = act(lambda: mgr.take_copies()) or []
    snap("C writes its next token into the shared last block: copy-on-write",
         copies=[[int(c[0]), int(c[1])] for c in copies])
    reqs["A"] = reqs["A"].appended(43)
    act(lambda: mgr.allocate_slots(reqs["A"], 1))
    snap("A writes its next token: its last block is its own again")
    act(lambda: mgr.free(reqs["B"]))
    snap("B finishes: its blocks are freed (its cached full blocks stay findable)")

    rng = np.random.default_rng(7)
    system = tuple(range(500, 512))
    work = []
    for i in range(10):
        tail = tuple(int(x) for x in rng.integers(0, 400, size=int(rng.integers(2, 8))))
        work.append(provided.SimRequest(i // 2, system + tail, int(rng.integers(3, 10))))
    s = STREAM
    paged = attempt(errors, impl.simulate, work, s["num_blocks"], s["block_size"],
                    s["max_num_seqs"])
    contig = attempt(errors, impl.simulate_contiguous, work, s["num_blocks"], s["block_size"],
                     s["max_num_seqs"], s["max_model_len"])

    def stats(st: Any) -> dict | None:
        if st is None:
            return None
        return {"total_slots": st.total_slots, "used": list(st.used_slots),
                "reserved": list(st.reserved_slots), "running": list(st.num_running),
                "preemptions": st.preemptions, "prompt_tokens": st.prompt_tokens,
                "cached_prompt_tokens": st.cached_prompt_tokens, "steps": st.steps,
                "mean_utilisation": rounded(st.mean_utilisation, 4),
                "waste": rounded(st.waste, 4)}
    return {"lab": "07", "pool": POOL, "events": events, "stream": s,
            "workload": [[w.arrival, len(w.prompt_tokens), w.output_len] for w in work],
            "paged": stats(paged), "contiguous": stats(contig), "errors": errors}


def diff(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["events"], ref["events"])):
        for field in ("tables", "ref_counts", "free_blocks", "copies"):
            if a.get(field) != b.get(field):
                return {"step": n, "field": field, "yours": a.get(field),
                        "reference": b.get(field), "where": b["event"]}
    for name in ("paged", "contiguous"):
        if mine[name] != ref[name]:
            return {"step": len(ref["events"]), "field": name, "yours": None, "reference": None,
                    "where": f"simulate{'' if name == 'paged' else '_contiguous'}"}
    return None
