"""The web book's traces of this lab: A block table: each token's slot, the cache, the gather
and the decode. ``book/traces.py`` runs them (``python -m book.traces``; ``make trace
LAB=01`` on a starter): ``trace(impl)`` is this lab's trace, run on the solution or a
starter; ``diff(mine, ref)`` the first step where a starter's trace differs from the
reference's; every number a page shows is computed here by the lab's public functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.tracing import attempt, close, rounded

PAGED = {"block_size": 4, "num_blocks": 8, "seq_len": 11, "block_table": [5, 1, 6, 3],
         "heads": 1, "d": 2, "seed": 1}


def trace(impl: Any) -> dict:
    """Each token's slot (slot_mapping), the cache after write_kv, gather_kv's order, and the
    decode output of paged_decode_attention."""
    p = PAGED
    rng = np.random.default_rng(p["seed"])
    n, bs = p["seq_len"], p["block_size"]
    table = np.array(p["block_table"])
    k = rng.normal(size=(n, p["heads"], p["d"]))
    v = rng.normal(size=(n, p["heads"], p["d"]))
    q = rng.normal(size=(p["heads"], p["d"]))
    errors: list[str] = []
    slots = attempt(errors, impl.slot_mapping, table, np.arange(n), bs)
    shape = (p["num_blocks"], bs, p["heads"], p["d"])
    k_cache, v_cache = np.full(shape, np.nan), np.full(shape, np.nan)
    if slots is not None:
        attempt(errors, impl.write_kv, k_cache, v_cache, k, v, np.asarray(slots))
    gathered = attempt(errors, impl.gather_kv, k_cache, table, n)
    res = attempt(errors, impl.paged_decode_attention, q, k_cache, v_cache, table, n)
    steps = []
    for t in range(n):
        slot = int(slots[t]) if slots is not None else None
        written = None
        if slot is not None and 0 <= slot < p["num_blocks"] * bs:
            written = bool(np.allclose(k_cache.reshape(-1, p["heads"], p["d"])[slot], k[t]))
        steps.append({"token": t, "logical_block": t // bs, "offset": t % bs, "slot": slot,
                      "block": slot // bs if slot is not None else None, "written": written})
    ok = None if gathered is None else bool(np.allclose(np.asarray(gathered), k))
    return {"lab": "01", "inputs": p, "steps": steps, "gather_in_order": ok,
            "out": rounded(res[0][0]) if res is not None else None,
            "lse": rounded(res[1][0]) if res is not None else None, "errors": errors}


def diff(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["steps"], ref["steps"])):
        if a["slot"] != b["slot"] or a["written"] != b["written"]:
            return {"step": n, "field": "slot", "yours": a["slot"], "reference": b["slot"],
                    "where": f"token {n}"}
    for field in ("out", "lse"):
        if not close(mine[field], ref[field]):
            return {"step": len(ref["steps"]) - 1, "field": field, "yours": mine[field],
                    "reference": ref[field], "where": "paged_decode_attention"}
    return None
