"""The web book's traces of this lab: Split-KV partitions and their merge (the lab's trace),
and ring attention. ``book/traces.py`` runs them (``python -m book.traces``; ``make trace
LAB=04`` on a starter): ``trace(impl)`` is this lab's trace, run on the solution or a
starter; ``diff(mine, ref)`` the first step where a starter's trace differs from the
reference's; every number a page shows is computed here by the lab's public functions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common import launch_plan
from common.tracing import BYTES, attempt, close, rounded

SPLIT = {"n": 12, "partitions": 4, "d": 4, "dv": 2, "seed": 2}


def _state(s: Any) -> dict | None:
    if s is None:
        return None
    return {"m": rounded(np.asarray(s.m).reshape(-1)[0]),
            "l": rounded(np.asarray(s.l).reshape(-1)[0]),
            "acc": rounded(np.asarray(s.acc).reshape(-1, np.asarray(s.acc).shape[-1])[0])}


def trace(impl: Any) -> dict:
    """The partitions' states (partial_state), every merge of three merge orders (merge),
    and each order's result (finalize)."""
    p = SPLIT
    rng = np.random.default_rng(p["seed"])
    q = rng.normal(size=(1, p["d"]))
    k = rng.normal(size=(p["n"], 1, p["d"])) * 1.5
    v = rng.normal(size=(p["n"], 1, p["dv"]))
    errors: list[str] = []
    size = p["n"] // p["partitions"]
    bounds = [(i * size, (i + 1) * size) for i in range(p["partitions"])]
    parts = [attempt(errors, impl.partial_state, q, k[a:b], v[a:b]) for a, b in bounds]
    trees = {
        "sequential": [("P0", "P1"), ("P0+P1", "P2"), ("P0+P1+P2", "P3")],
        "reverse": [("P3", "P2"), ("P3+P2", "P1"), ("P3+P2+P1", "P0")],
        "tree": [("P0", "P1"), ("P2", "P3"), ("P0+P1", "P2+P3")],
    }
    orders = {}
    for name, plan in trees.items():
        known = {f"P{i}": s for i, s in enumerate(parts)}
        merges = []
        for a, b in plan:
            sa, sb = known.get(a), known.get(b)
            out = attempt(errors, impl.merge, sa, sb) if sa is not None and sb is not None else None
            label = f"({a})+({b})" if "+" in a or "+" in b else f"{a}+{b}"
            key = f"{a}+{b}"
            known[key] = out
            merges.append({"a": a, "b": b, "label": label, "state": _state(out)})
        final = attempt(errors, impl.finalize, known[f"{plan[-1][0]}+{plan[-1][1]}"]) \
            if known.get(f"{plan[-1][0]}+{plan[-1][1]}") is not None else None
        orders[name] = {"merges": merges,
                        "out": rounded(np.asarray(final[0]).reshape(-1)) if final else None,
                        "lse": rounded(np.asarray(final[1]).reshape(-1)[0]) if final else None}
    scores = (q[0] @ k[:, 0].T) / math.sqrt(p["d"])
    return {"lab": "04", "inputs": p, "bounds": bounds, "scores": rounded(scores, 3),
            "partitions": [_state(s) for s in parts], "orders": orders, "errors": errors}


def diff(mine: dict, ref: dict) -> dict | None:
    for i, (a, b) in enumerate(zip(mine["partitions"], ref["partitions"])):
        if not close(a, b):
            return {"step": i, "field": "partial_state", "yours": a, "reference": b,
                    "where": f"partition P{i}"}
    n = len(ref["partitions"])
    for name in ref["orders"]:
        for j, (a, b) in enumerate(zip(mine["orders"][name]["merges"],
                                       ref["orders"][name]["merges"])):
            if not close(a["state"], b["state"]):
                return {"step": n + j, "order": name, "field": "merge", "yours": a["state"],
                        "reference": b["state"], "where": f"{name} order, merge {b['label']}"}
    return None


RING = {"devices": 4, "shard": 3, "d": 4, "dv": 2, "seed": 3}


def trace_ring(impl: Any) -> dict:
    """Ring attention on 4 simulated devices: at step t device p holds K/V shard
    (p - t) mod P and folds it in with ring_step; per step, each device's (m, l) per query
    row, and whether the visiting shard was all masked (causal). Ends with finalize, checked
    against ring_attention."""
    p = RING
    rng = np.random.default_rng(p["seed"])
    P, n = p["devices"], p["shard"]
    q = [rng.normal(size=(n, 1, p["d"])) for _ in range(P)]
    k = [rng.normal(size=(n, 1, p["d"])) for _ in range(P)]
    v = [rng.normal(size=(n, 1, p["dv"])) for _ in range(P)]
    errors: list[str] = []
    runs = {}
    for causal in (False, True):
        states = [impl.empty_state((n, 1), p["dv"]) for _ in range(P)]
        steps = []
        for t in range(P):
            devices = []
            for dev in range(P):
                src = (dev - t) % P
                states[dev] = attempt(errors, impl.ring_step, states[dev], q[dev], k[src], v[src],
                                      dev * n, src * n, causal)
                masked = causal and src > dev  # every key of the shard is after every query
                st = states[dev]
                devices.append({"device": dev, "holds": src, "masked": masked,
                                "m": rounded(np.asarray(st.m)[:, 0]) if st is not None else None,
                                "l": rounded(np.asarray(st.l)[:, 0]) if st is not None else None})
            steps.append({"step": t, "devices": devices})
        finals = [attempt(errors, impl.finalize, s) if s is not None else None for s in states]
        ring = attempt(errors, impl.ring_attention, q, k, v, causal=causal)
        same = None
        if ring is not None and all(f is not None for f in finals):
            same = bool(all(np.allclose(f[0], o) for f, o in zip(finals, ring[0])))
        runs["causal" if causal else "full"] = {
            "steps": steps, "same_as_ring_attention": same,
            "out": [rounded(np.asarray(f[0])[:, 0, 0]) if f is not None else None for f in finals]}
    per_step = {"flops": 2 * n * n * (p["d"] + p["dv"]), "bytes": n * (p["d"] + p["dv"]) * BYTES}
    timing = {str(s): ring_timeline(s) for s in RING_TIMING["shards"]}
    return {"lab": "04", "inputs": p, "runs": runs, "per_step": per_step, "timing": timing,
            "timing_inputs": RING_TIMING, "errors": errors}


# The wall time of one ring pass at a real size (a model): Llama-3-8B-like attention (32
# query heads, 8 KV heads, head dim 128, bf16) on 4 H100s, each holding `shard` tokens.
RING_TIMING = {"devices": 4, "heads": 32, "kv_heads": 8, "d": 128,
               "shards": [256, 1024, 4096, 16384],
               # NVLink 4 on an H100 SXM: 900 GB/s in total, 450 GB/s each way (datasheet);
               # a ring sends one way, to the next device.
               "link_gbps": 450.0,
               "source": "H100 SXM datasheet: 989 TFLOP/s dense bf16 (common/launch_plan.py), "
                         "NVLink 900 GB/s bidirectional"}


def ring_timeline(shard: int, p: dict | None = None) -> dict:
    """Per ring step, a device's compute time (Q shard against the visiting K/V shard, at
    the H100's dense bf16 peak) and send time (the K/V shard to the next device over
    NVLink), in µs; and the wall time of the ring with the send overlapped under the compute
    (each step takes the longer of the two), without overlap (the sum), and of gathering
    every shard first and then computing (all-gather: P - 1 sends, then P computes), with
    each device's K/V memory. A model at peak rates: real kernels reach less."""
    p = {**RING_TIMING, **(p or {})}
    if shard <= 0:
        raise ValueError(f"shard must be a positive number of tokens, got {shard}")
    P = p["devices"]
    flops = 4 * shard * shard * p["d"] * p["heads"]  # Q K^T and P V over one shard pair
    kv_bytes = 2 * shard * p["kv_heads"] * p["d"] * BYTES
    compute = flops / (launch_plan.H100.tensor_tflops * 1e6)  # FLOP / (FLOP per µs)
    send = kv_bytes / (p["link_gbps"] * 1e3)  # bytes / (bytes per µs)
    steps = [{"step": t, "compute_us": round(compute, 3), "send_us": round(send, 3) if t < P - 1
              else 0.0} for t in range(P)]
    overlapped = sum(max(s["compute_us"], s["send_us"]) for s in steps)
    sequential = sum(s["compute_us"] + s["send_us"] for s in steps)
    return {"shard": shard, "steps": steps, "flops_per_step": flops, "kv_bytes": kv_bytes,
            "wall_us": {"ring overlapped": round(overlapped, 3),
                        "ring, no overlap": round(sequential, 3),
                        "all-gather, then compute": round((P - 1) * send + P * compute, 3)},
            "kv_memory": {"ring overlapped": 2 * kv_bytes, "ring, no overlap": 2 * kv_bytes,
                          "all-gather, then compute": P * kv_bytes},
            "hidden": compute >= send}


# Reference-only traces of other pages (book/pages/): name -> builder.
EXTRA = {"ring": trace_ring}
