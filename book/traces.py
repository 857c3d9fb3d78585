"""Write the visualisations' traces: the labs' own code run on the pages' small inputs.

    python -m book.traces                    # the reference (solution.py): book/viz/traces/
    python -m book.traces --impl starter --lab 00 --out build/traces
                                             # your starter.py, compared with the reference

A trace is a JavaScript file that sets ``window.BOOK_TRACES[<name>]`` to plain JSON data (a
script, not a ``fetch``, so the pages also work from ``file://``). The pages only play
traces back: every number they show was computed here by a lab's public functions, or is
plain arithmetic on such numbers (counters, differences), never by JavaScript re-doing
what a lab computes.

A starter trace carries ``first_diff``: the first step where the learner's run differs from
the reference trace (same inputs), or where their code raised.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.loader import load_impl, load_lab_module  # noqa: E402
from labs import manifest  # noqa: E402

# The labs with a trace and the labs `make trace` runs on a starter (labs/manifest.py).
LABS = {e.number: e.folder for e in manifest.traced("reference")}
TRACEABLE = tuple(sorted(e.number for e in manifest.traced("starter")))
REFERENCE_DIR = REPO / "book" / "viz" / "traces"
TOL = 1e-9
BYTES = 2  # fp16/bf16 elements, as on a GPU


def _r(x: Any, nd: int = 6) -> Any:
    """JSON-friendly rounding, recursively; -inf/inf/nan become strings the pages print."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, list | tuple):
        return [_r(v, nd) for v in x]
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return round(x, nd)


def _call(errors: list[str], fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args)``, or None with the error's last line kept (a starter's TODO)."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
        line = traceback.format_exception_only(type(e), e)[-1].strip()
        errors.append(f"{getattr(fn, '__name__', 'call')}: {line}")
        return None


# ---- lab 00: FlashAttention tiling ----------------------------------------------------------

FA = {"L": 16, "d": 4, "dv": 2, "tile": 4, "seed": 0}


def fa_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Small q, k, v where the running max grows after the first tile for many rows."""
    rng = np.random.default_rng(FA["seed"])
    q = rng.normal(size=(FA["L"], FA["d"]))
    k = rng.normal(size=(FA["L"], FA["d"])) * np.linspace(0.6, 1.6, FA["L"])[:, None]
    v = rng.normal(size=(FA["L"], FA["dv"]))
    return q, k, v


def trace_lab00(impl: Any) -> dict:
    """Per (Q tile, K/V tile) step: each row's m, l (online_softmax_steps on the row's
    scores) and acc, out, lse (flash_attention_forward on the K/V prefix so far)."""
    q, k, v = fa_inputs()
    L, d, dv, t = FA["L"], FA["d"], FA["dv"], FA["tile"]
    scale = 1.0 / math.sqrt(d)
    scores = (q @ k.T) * scale  # [L, L]: the inputs of online_softmax_steps, shown on the grid
    errors: list[str] = []
    row_steps = [_call(errors, impl.online_softmax_steps, scores[i], t) for i in range(L)]
    n_tiles = L // t
    steps, hbm, flops = [], 0, 0
    for qt in range(n_tiles):
        q0, q1 = qt * t, (qt + 1) * t
        hbm += t * d * BYTES  # load the Q tile once
        for kt in range(n_tiles):
            k1 = (kt + 1) * t
            res = _call(errors, impl.flash_attention_forward, q[q0:q1], k[:k1], v[:k1],
                        block_q=t, block_k=t)
            hbm += t * (d + dv) * BYTES  # load one K tile and one V tile into SRAM
            flops += 2 * t * t * d + 2 * t * t * dv  # S = Q Kᵀ and P V for the tile pair
            rows = []
            for r in range(t):
                i = q0 + r
                ms = row_steps[i]
                m, l = (ms[kt] if ms is not None and len(ms) > kt else (None, None))
                m_old = ms[kt - 1][0] if ms is not None and kt > 0 and len(ms) >= kt else None
                out = lse = acc = None
                if res is not None:
                    o, ls = np.asarray(res[0], dtype=float), np.asarray(res[1], dtype=float)
                    out, lse = o[r], ls[r]
                    if m is not None:
                        acc = out * math.exp(lse - m)  # unnormalised, relative to the running max
                row = {"i": i, "m": _r(m) if m is not None else None,
                       "l": _r(l) if l is not None else None,
                       "m_old": _r(m_old) if m_old is not None else "-inf",
                       "alpha": _r(math.exp(m_old - m)) if (m_old is not None and m is not None)
                       else 0.0,
                       "acc": _r(acc) if acc is not None else None,
                       "out": _r(out) if out is not None else None,
                       "lse": _r(lse) if lse is not None else None}
                rows.append(row)
            last = kt == n_tiles - 1
            if last:
                hbm += t * dv * BYTES + t * 4  # write the O tile and its lse (fp32)
            steps.append({"qt": qt, "kt": kt, "rows": rows, "hbm": hbm, "flops": flops,
                          "write_o": last})
    s_bytes = _call(errors, impl.score_matrix_bytes, L, bytes_per_element=BYTES)
    qkv = (2 * L * d + L * dv) * BYTES
    standard = [  # the three kernels of unfused attention, each a round trip through HBM
        {"name": "S = Q Kᵀ · scale", "hbm": 2 * L * d * BYTES + (s_bytes or 0),
         "flops": 2 * L * L * d, "writes": "S"},
        {"name": "P = softmax(S)", "hbm": 2 * (s_bytes or 0), "flops": 5 * L * L, "writes": "P"},
        {"name": "O = P V", "hbm": (s_bytes or 0) + L * dv * BYTES * 2, "flops": 2 * L * L * dv,
         "writes": "O"},
    ]
    acc_hbm = 0
    for s in standard:
        acc_hbm += s["hbm"]
        s["hbm_total"] = acc_hbm
    return {"lab": "00", "inputs": {**FA, "scale": _r(scale)}, "scores": _r(scores, 3),
            "steps": steps, "standard": standard, "score_matrix_bytes": s_bytes,
            "qkv_bytes": qkv, "errors": errors}


def diff_lab00(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["steps"], ref["steps"])):
        for ra, rb in zip(a["rows"], b["rows"]):
            for field in ("m", "l", "acc", "lse"):
                if not _close(ra[field], rb[field]):
                    return {"step": n, "row": ra["i"], "field": field, "yours": ra[field],
                            "reference": rb[field],
                            "where": f"Q tile {a['qt']}, K/V tile {a['kt']}, row {ra['i']}"}
    return None


# ---- lab 01: a block table -------------------------------------------------------------------

PAGED = {"block_size": 4, "num_blocks": 8, "seq_len": 11, "block_table": [5, 1, 6, 3],
         "heads": 1, "d": 2, "seed": 1}


def trace_lab01(impl: Any) -> dict:
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
    slots = _call(errors, impl.slot_mapping, table, np.arange(n), bs)
    shape = (p["num_blocks"], bs, p["heads"], p["d"])
    k_cache, v_cache = np.full(shape, np.nan), np.full(shape, np.nan)
    if slots is not None:
        _call(errors, impl.write_kv, k_cache, v_cache, k, v, np.asarray(slots))
    gathered = _call(errors, impl.gather_kv, k_cache, table, n)
    res = _call(errors, impl.paged_decode_attention, q, k_cache, v_cache, table, n)
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
            "out": _r(res[0][0]) if res is not None else None,
            "lse": _r(res[1][0]) if res is not None else None, "errors": errors}


def diff_lab01(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["steps"], ref["steps"])):
        if a["slot"] != b["slot"] or a["written"] != b["written"]:
            return {"step": n, "field": "slot", "yours": a["slot"], "reference": b["slot"],
                    "where": f"token {n}"}
    for field in ("out", "lse"):
        if not _close(mine[field], ref[field]):
            return {"step": len(ref["steps"]) - 1, "field": field, "yours": mine[field],
                    "reference": ref[field], "where": "paged_decode_attention"}
    return None


# ---- lab 04: split-KV partitions and their merge ---------------------------------------------

SPLIT = {"n": 12, "partitions": 4, "d": 4, "dv": 2, "seed": 2}


def _state(s: Any) -> dict | None:
    if s is None:
        return None
    return {"m": _r(np.asarray(s.m).reshape(-1)[0]), "l": _r(np.asarray(s.l).reshape(-1)[0]),
            "acc": _r(np.asarray(s.acc).reshape(-1, np.asarray(s.acc).shape[-1])[0])}


def trace_lab04(impl: Any) -> dict:
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
    parts = [_call(errors, impl.partial_state, q, k[a:b], v[a:b]) for a, b in bounds]
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
            out = _call(errors, impl.merge, sa, sb) if sa is not None and sb is not None else None
            label = f"({a})+({b})" if "+" in a or "+" in b else f"{a}+{b}"
            key = f"{a}+{b}"
            known[key] = out
            merges.append({"a": a, "b": b, "label": label, "state": _state(out)})
        final = _call(errors, impl.finalize, known[f"{plan[-1][0]}+{plan[-1][1]}"]) \
            if known.get(f"{plan[-1][0]}+{plan[-1][1]}") is not None else None
        orders[name] = {"merges": merges,
                        "out": _r(np.asarray(final[0]).reshape(-1)) if final else None,
                        "lse": _r(np.asarray(final[1]).reshape(-1)[0]) if final else None}
    scores = (q[0] @ k[:, 0].T) / math.sqrt(p["d"])
    return {"lab": "04", "inputs": p, "bounds": bounds, "scores": _r(scores, 3),
            "partitions": [_state(s) for s in parts], "orders": orders, "errors": errors}


def diff_lab04(mine: dict, ref: dict) -> dict | None:
    for i, (a, b) in enumerate(zip(mine["partitions"], ref["partitions"])):
        if not _close(a, b):
            return {"step": i, "field": "partial_state", "yours": a, "reference": b,
                    "where": f"partition P{i}"}
    n = len(ref["partitions"])
    for name in ref["orders"]:
        for j, (a, b) in enumerate(zip(mine["orders"][name]["merges"],
                                       ref["orders"][name]["merges"])):
            if not _close(a["state"], b["state"]):
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
                states[dev] = _call(errors, impl.ring_step, states[dev], q[dev], k[src], v[src],
                                    dev * n, src * n, causal)
                masked = causal and src > dev  # every key of the shard is after every query
                st = states[dev]
                devices.append({"device": dev, "holds": src, "masked": masked,
                                "m": _r(np.asarray(st.m)[:, 0]) if st is not None else None,
                                "l": _r(np.asarray(st.l)[:, 0]) if st is not None else None})
            steps.append({"step": t, "devices": devices})
        finals = [_call(errors, impl.finalize, s) if s is not None else None for s in states]
        ring = _call(errors, impl.ring_attention, q, k, v, causal=causal)
        same = None
        if ring is not None and all(f is not None for f in finals):
            same = bool(all(np.allclose(f[0], o) for f, o in zip(finals, ring[0])))
        runs["causal" if causal else "full"] = {
            "steps": steps, "same_as_ring_attention": same,
            "out": [_r(np.asarray(f[0])[:, 0, 0]) if f is not None else None for f in finals]}
    per_step = {"flops": 2 * n * n * (p["d"] + p["dv"]), "bytes": n * (p["d"] + p["dv"]) * BYTES}
    return {"lab": "04", "inputs": p, "runs": runs, "per_step": per_step, "errors": errors}


# ---- lab 06: bytes of KV cache per token -----------------------------------------------------


def trace_lab06(impl: Any) -> dict:
    """kv_bytes_per_token for each of the lab's model presets and for each attention kind
    on one shape; pages multiply by the context length (bytes per request)."""
    provided = load_lab_module(REPO / "labs" / LABS["06"], "provided")
    errors: list[str] = []
    presets = []
    for mdl in provided.MODELS:
        b = _call(errors, impl.kv_bytes_per_token, mdl.kind, mdl.num_layers, mdl.head_dim,
                  mdl.num_heads, num_kv_heads=mdl.num_kv_heads, kv_lora_rank=mdl.kv_lora_rank,
                  rope_dim=mdl.rope_dim)
        presets.append({"name": mdl.name, "kind": mdl.kind, "layers": mdl.num_layers,
                        "head_dim": mdl.head_dim, "heads": mdl.num_heads,
                        "kv_heads": mdl.num_kv_heads, "kv_lora_rank": mdl.kv_lora_rank,
                        "rope_dim": mdl.rope_dim, "window": mdl.window, "source": mdl.source,
                        "bytes_per_token": b})
    shape = {"layers": 61, "head_dim": 128, "heads": 128, "kv_heads": 8, "kv_lora_rank": 512,
             "rope_dim": 64}
    kinds = []
    for kind in ("mha", "gqa", "mqa", "mla"):
        b = _call(errors, impl.kv_bytes_per_token, kind, shape["layers"], shape["head_dim"],
                  shape["heads"], num_kv_heads=shape["kv_heads"] if kind == "gqa" else None,
                  kv_lora_rank=shape["kv_lora_rank"] if kind == "mla" else None,
                  rope_dim=shape["rope_dim"] if kind == "mla" else None)
        kinds.append({"kind": kind, "bytes_per_token": b})
    return {"lab": "06", "presets": presets, "shape": shape, "kinds": kinds, "errors": errors}


WINDOW = {"seq_len": 24, "windows": [2, 3, 4, 6, 8], "layers": 4, "seed": 4}


def trace_window(impl: Any) -> dict:
    """Which positions a token attends with a sliding window: lab 06's
    window_decode_attention with one-hot values (out = the attention weights), for every
    position of a 24-token sequence; stacking layers composes those sets."""
    p = WINDOW
    n = p["seq_len"]
    rng = np.random.default_rng(p["seed"])
    bs = 4
    k = rng.normal(size=(n, 1, n))
    v = np.eye(n)[:, None, :]  # value of token j = e_j: the output is the weight vector
    shape = (n // bs, bs, 1, n)
    k_cache, v_cache = k.reshape(shape), v.reshape(shape)
    table = np.arange(n // bs)
    errors: list[str] = []
    out = {}
    for w in p["windows"]:
        one_layer = []
        for t in range(n):
            q = rng.normal(size=(1, n))
            res = _call(errors, impl.window_decode_attention, q, k_cache, v_cache, table, t + 1, w)
            weights = np.asarray(res[0][0]) if res is not None else np.zeros(n)
            one_layer.append([j for j in range(n) if weights[j] > 0])
        layers = [sorted(set(one_layer[n - 1]))]
        for _ in range(p["layers"] - 1):
            layers.append(sorted({j for i in layers[-1] for j in one_layer[i]}))
        out[str(w)] = {"one_layer": one_layer, "receptive_field": layers}
    return {"lab": "06", "inputs": p, "windows": out, "errors": errors}


# ---- hardware figures (cited) and lab 00's score matrix ----------------------------------

GPUS = {  # per-SM limits: bench/gpu_report.py (CUDA Programming Guide); HBM: bench/roofs.py
    "A100 SXM4 80GB": {"arch": 80, "sms": 108, "l2_mb": 40, "hbm_gb": 80,
                       "nominal": "a100-sxm4-80gb",
                       "host": "PCIe Gen4 x16: 64 GB/s (both directions)", "nvlink_gbps": 600,
                       "source": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, "
                                 "40 MB L2) and A100 datasheet (80 GB HBM2e, 2,039 GB/s, "
                                 "NVLink 600 GB/s, PCIe Gen4 64 GB/s)"},
    "H100 SXM5 80GB": {"arch": 90, "sms": 132, "l2_mb": 50, "hbm_gb": 80, "nominal": "h100",
                       "host": "PCIe Gen5 x16: 128 GB/s (both directions)", "nvlink_gbps": 900,
                       "source": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs "
                                 "on SXM5, 50 MB L2) and H100 datasheet (80 GB HBM3, "
                                 "3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s)"},
}


def trace_memory(impl: Any) -> dict:
    """Capacities of each tier for A100 and H100 (cited) and lab 00's score_matrix_bytes
    for sequence lengths 512 .. 131072: the N x N matrix standard attention writes to HBM."""
    sys.path.insert(0, str(REPO))
    from bench.gpu_report import LIMIT_SOURCES, LIMITS
    from bench.roofs import NOMINAL

    nominal = {frag: (tbps, tflops, label) for frag, tbps, tflops, label in NOMINAL}
    gpus = {}
    for name, g in GPUS.items():
        lim = LIMITS[g["arch"]]
        tbps, tflops, _ = nominal[g["nominal"]]
        gpus[name] = {
            "sms": g["sms"], "regs_per_sm_bytes": lim.regs_per_sm * 4,
            "smem_per_sm_bytes": lim.smem_per_sm, "l2_bytes": g["l2_mb"] * 2**20,
            "hbm_bytes": g["hbm_gb"] * 10**9, "hbm_tbps": tbps, "dense_bf16_tflops": tflops,
            "nvlink_gbps": g["nvlink_gbps"], "host": g["host"], "source": g["source"]}
    errors: list[str] = []
    seqs = [2**i for i in range(9, 18)]
    s_bytes = [_call(errors, impl.score_matrix_bytes, n, bytes_per_element=BYTES) for n in seqs]
    return {"lab": "00", "gpus": gpus, "limit_sources": list(LIMIT_SOURCES), "seq_lens": seqs,
            "score_matrix_bytes": s_bytes, "errors": errors}

# ---- lab 00 again: who owns which tile, FlashAttention-1 vs FlashAttention-2 -----------------

FAGRID = {"batch": 1, "heads": 2, "L": 16, "d": 4, "dv": 2, "tile": 4, "seed": 5}


def trace_fagrid(impl: Any) -> dict:
    """The programs of each schedule and the (Q tile, K/V tile) each works on at each time.

    FlashAttention-2: lab 00's launch grid (``provided.attention_grid``), one program per
    (Q tile, batch·head); program ``pid`` takes Q tile ``pid % n_q`` of batch·head
    ``pid // n_q`` (the kernel's first lines) and walks the K/V tiles. FlashAttention-1
    (arXiv 2205.14135, Algorithm 1; its grid: arXiv 2307.08691, section 3.2): one program
    per batch·head, K/V tiles in the outer loop and Q tiles in the inner one, so each inner
    step reads and writes that Q tile's ``O, l, m`` in HBM. The schedules (which tile when)
    and the HBM bytes are modelled here; the rows' ``(m, l)`` after each K/V tile are lab
    00's ``online_softmax_steps`` and the outputs its ``flash_attention_forward``: both
    orders fold the same tiles into the same state, only who and when differ."""
    p = FAGRID
    provided = load_lab_module(REPO / "labs" / LABS["00"], "provided")
    rng = np.random.default_rng(p["seed"])
    B, H, L, d, dv, t = p["batch"], p["heads"], p["L"], p["d"], p["dv"], p["tile"]
    q = rng.normal(size=(B * H, L, d))
    k = rng.normal(size=(B * H, L, d)) * 1.4
    v = rng.normal(size=(B * H, L, dv))
    errors: list[str] = []
    n_q = n_k = L // t
    states = []  # [bh][row][kt] = (m, l) after K/V tiles 0..kt
    outs = []
    for bh in range(B * H):
        scores = q[bh] @ k[bh].T / math.sqrt(d)
        states.append([_call(errors, impl.online_softmax_steps, scores[i], t) for i in range(L)])
        res = _call(errors, impl.flash_attention_forward, q[bh], k[bh], v[bh], block_q=t,
                    block_k=t)
        outs.append(_r(res[0]) if res is not None else None)
    grid2 = provided.attention_grid(B, H, L, t)  # lab 00's FlashAttention-2 launch grid
    fa2 = [[{"program": pid, "bh": pid // n_q, "qt": pid % n_q, "kt": time}
            for pid in range(grid2[0])] for time in range(n_k)]
    fa1 = [[{"program": bh, "bh": bh, "qt": time % n_q, "kt": time // n_q}
            for bh in range(B * H)] for time in range(n_q * n_k)]
    kv_tile, q_tile, o_tile, ml_tile = t * (d + dv) * BYTES, t * d * BYTES, t * dv * BYTES, t * 8

    def step_bytes(name: str, w: dict) -> int:
        if name == "fa1":  # K/V once per outer step; Q, O, l, m in and O, l, m out every step
            return (kv_tile if w["qt"] == 0 else 0) + q_tile + 2 * (o_tile + ml_tile)
        first, last = w["kt"] == 0, w["kt"] == n_k - 1  # Q once, O and lse once at the end
        return kv_tile + (q_tile if first else 0) + (o_tile + t * 4 if last else 0)

    schedules = {}
    for name, sched, grid in (("fa1", fa1, (B * H,)), ("fa2", fa2, tuple(grid2))):
        hbm, steps = 0, []
        for work in sched:
            rows = []
            for w in work:
                hbm += step_bytes(name, w)
                st = [states[w["bh"]][w["qt"] * t + r] for r in range(t)]
                rows.append({**w, "m": [_r(s[w["kt"]][0]) if s else None for s in st],
                             "l": [_r(s[w["kt"]][1]) if s else None for s in st]})
            steps.append({"work": rows, "hbm": hbm})
        schedules[name] = {"grid": list(grid), "steps": steps}
    return {"lab": "00", "inputs": p, "n_q": n_q, "n_k": n_k, "schedules": schedules,
            "out": outs, "sms": {g: GPUS[g]["sms"] for g in GPUS}, "errors": errors}


# ---- lab 08: scoring functions, Bahdanau's alignment, multi-head self-attention --------------

SCORING = {"dims": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "num_keys": 8, "da": 8, "seed": 8}
SCORE_FNS = ("additive", "dot", "scaled_dot")


def trace_lab08(impl: Any) -> dict:
    """Per head dim d_k: lab 08's scale_experiment (variance and mean softmax entropy of
    256 x 256 random scores, raw and scaled), and one query against 8 keys scored by
    additive_scores, dot_scores and scaled_dot_scores, with softmax and softmax_entropy."""
    p = SCORING
    errors: list[str] = []
    steps = []
    for d in p["dims"]:
        stats = _call(errors, impl.scale_experiment, d)
        rng = np.random.default_rng(p["seed"] + d)
        q = rng.standard_normal((1, d))
        k = rng.standard_normal((p["num_keys"], d))
        # additive weights at the usual 1/sqrt(fan-in) initialisation: tanh's inputs stay O(1)
        w_q = rng.standard_normal((d, p["da"])) / math.sqrt(d)
        w_k = rng.standard_normal((d, p["da"])) / math.sqrt(d)
        v_a = rng.standard_normal(p["da"]) / math.sqrt(p["da"])
        raw = {"additive": _call(errors, impl.additive_scores, q, k, w_q, w_k, v_a),
               "dot": _call(errors, impl.dot_scores, q, k),
               "scaled_dot": _call(errors, impl.scaled_dot_scores, q, k)}
        fns = {}
        for name in SCORE_FNS:
            s = raw[name]
            row = np.asarray(s, dtype=float)[0] if s is not None else None
            w = _call(errors, impl.softmax, row) if row is not None else None
            h = _call(errors, impl.softmax_entropy, row) if row is not None else None
            fns[name] = {"scores": _r(row) if row is not None else None,
                         "weights": _r(w) if w is not None else None,
                         "entropy": _r(h) if h is not None else None}
        steps.append({"d": d, "stats": None if stats is None else {
            "variance_unscaled": _r(stats.variance_unscaled),
            "variance_scaled": _r(stats.variance_scaled),
            "entropy_unscaled": _r(stats.entropy_unscaled),
            "entropy_scaled": _r(stats.entropy_scaled)}, "example": fns})
    return {"lab": "08", "inputs": p, "steps": steps, "max_entropy": _r(math.log(256)),
            "max_entropy_example": _r(math.log(p["num_keys"])),
            "multihead": trace_multihead(impl, errors), "errors": errors}


def diff_lab08(mine: dict, ref: dict) -> dict | None:
    """The first difference on the scoring page, else on the multi-head page."""
    return diff_scoring(mine, ref) or diff_multihead(mine, ref)


def diff_scoring(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["steps"], ref["steps"])):
        where = f"d_k = {b['d']}"
        if not _close(a["stats"], b["stats"]):
            return {"step": n, "field": "scale_experiment", "yours": a["stats"],
                    "reference": b["stats"], "where": where}
        for name in SCORE_FNS:
            for field in ("scores", "weights", "entropy"):
                ya, yb = a["example"][name][field], b["example"][name][field]
                if not _close(ya, yb):
                    return {"step": n, "field": f"{name} {field}", "yours": ya, "reference": yb,
                            "where": where}
    return None


BAHDANAU = {"source": 6, "target": 5, "d_enc": 4, "d_dec": 4, "da": 6, "seed": 21}


def trace_bahdanau(impl: Any) -> dict:
    """Bahdanau's alignment on a small example: lab 08's additive_scores of 5 decoder states
    against 6 encoder states, softmax per decoder step, and the context vector (the weights
    times the encoder states). Random, untrained weights: the mechanism, not a learned map."""
    p = BAHDANAU
    rng = np.random.default_rng(p["seed"])
    h = rng.standard_normal((p["source"], p["d_enc"]))  # encoder states
    s = rng.standard_normal((p["target"], p["d_dec"]))  # decoder states
    w_q = rng.standard_normal((p["d_dec"], p["da"])) / math.sqrt(p["d_dec"]) * 2
    w_k = rng.standard_normal((p["d_enc"], p["da"])) / math.sqrt(p["d_enc"]) * 2
    v_a = rng.standard_normal(p["da"])
    errors: list[str] = []
    e = _call(errors, impl.additive_scores, s, h, w_q, w_k, v_a)  # [target, source]
    steps = []
    for i in range(p["target"]):
        row = np.asarray(e, dtype=float)[i] if e is not None else None
        a = _call(errors, impl.softmax, row) if row is not None else None
        ent = _call(errors, impl.softmax_entropy, row) if row is not None else None
        context = np.asarray(a) @ h if a is not None else None
        steps.append({"i": i, "scores": _r(row) if row is not None else None,
                      "weights": _r(a) if a is not None else None,
                      "entropy": _r(ent) if ent is not None else None,
                      "context": _r(context) if context is not None else None})
    return {"lab": "08", "inputs": p, "encoder": _r(h, 4), "decoder": _r(s, 4),
            "steps": steps, "errors": errors}


MULTIHEAD = {"L": 6, "E": 8, "heads": 4, "length": 4, "seed": 13}


MH_RUNS = ("full-whole", "causal-whole", "full-padded", "causal-padded")


def trace_multihead(impl: Any, errors: list[str]) -> dict:
    """Self-attention on one 6-token sequence, 4 heads: lab 08's multi_head_attention (its
    head-averaged weights) and, per head, attention_weights on split_heads of the same
    projections with the same masks; for causal on/off and padding (4 real tokens) on/off
    (the runs of ``MH_RUNS``, in that order)."""
    p = MULTIHEAD
    lab = REPO / "labs" / LABS["08"]
    provided = load_lab_module(lab, "provided")
    rng = np.random.default_rng(p["seed"])
    L, E, H = p["L"], p["E"], p["heads"]
    x = rng.standard_normal((1, L, E))

    def mat() -> np.ndarray:
        return rng.standard_normal((E, E)) / math.sqrt(E)
    w = provided.MultiHeadWeights(mat(), mat(), mat(), mat(), *(rng.standard_normal((4, E)) * 0.1))
    runs = {}
    for padding in (False, True):
        for causal in (False, True):
            kpm = _call(errors, impl.key_padding_mask, np.array([p["length"]]), L) \
                if padding else None
            res = _call(errors, impl.multi_head_attention, x, x, x, w, H,
                        key_padding_mask=kpm, is_causal=causal)
            qh, kh = (_call(errors, impl.split_heads, provided.linear(n, x, wt, b, E), H)
                      for n, wt, b in (("w_q", w.w_q, w.b_q), ("w_k", w.w_k, w.b_k)))
            mask = None
            if kpm is not None:
                mask = _call(errors, impl.key_padding_to_attn_mask, kpm)  # [1, 1, 1, L]
            if causal:
                cm = _call(errors, impl.causal_mask, L, L)
                mask = cm if mask is None else (None if cm is None else mask & cm)
            heads = None
            if qh is not None and kh is not None:
                heads = _call(errors, impl.attention_weights, qh, kh, mask)  # [1, H, L, L]
            avg = np.asarray(res[1])[0] if res is not None else None
            same = None
            if heads is not None and avg is not None:
                same = bool(np.allclose(np.asarray(heads)[0].mean(axis=0), avg))
            runs[f"{'causal' if causal else 'full'}-{'padded' if padding else 'whole'}"] = {
                "causal": causal, "padding": padding,
                "key_padding_mask": None if kpm is None else np.asarray(kpm)[0].tolist(),
                "heads": None if heads is None else _r(np.asarray(heads)[0]),
                "average": None if avg is None else _r(avg),
                "heads_average_to_mha": same}
    return {"inputs": p, "runs": runs}


def diff_multihead(mine: dict, ref: dict) -> dict | None:
    """The first mask setting (index in MH_RUNS) whose maps differ: a head's, else the average."""
    a, b = mine["multihead"]["runs"], ref["multihead"]["runs"]
    for n, run in enumerate(MH_RUNS):
        ha, hb = a[run]["heads"], b[run]["heads"]
        for h in range(len(hb)):
            if ha is None or not _close(ha[h], hb[h]):
                return {"step": n, "page": "multihead", "run": run, "head": h, "field": "heads",
                        "yours": None if ha is None else ha[h], "reference": hb[h],
                        "where": f"multi-head page, {run}, head {h}"}
        if not _close(a[run]["average"], b[run]["average"]):
            return {"step": n, "page": "multihead", "run": run, "head": "avg",
                    "field": "multi_head_attention", "yours": a[run]["average"],
                    "reference": b[run]["average"], "where": f"multi-head page, {run}, average"}
    return None


# ---- lab 10: sparse patterns and LSH buckets -------------------------------------------------

ZOO = {"n": 16, "d": 4, "seed": 10}


def trace_zoo(impl: Any, errors: list[str]) -> dict:
    """Lab 10's sparse masks on 16 tokens (strided_mask, fixed_mask, window_global_mask,
    bigbird_mask), the pairs each scores, and sparse_attention on each pattern against the
    exact answer on random q, k, v (chunked_attention; sparse_attention on the full causal
    mask for a causal pattern): the error of skipping pairs."""
    p = ZOO
    n = p["n"]
    rng = np.random.default_rng(p["seed"])
    q, k, v = (rng.standard_normal((n, p["d"])) for _ in range(3))
    causal = np.tril(np.ones((n, n), bool))
    exact = {False: _call(errors, impl.chunked_attention, q, k, v),  # bidirectional
             True: _call(errors, impl.sparse_attention, q, k, v, causal)}  # = dense causal
    patterns = [
        ("dense causal", "every key up to the query", lambda: causal),
        ("strided", "strided_mask(16, stride=4)", lambda: impl.strided_mask(n, 4)),
        ("fixed", "fixed_mask(16, block=4, num_summary=1)", lambda: impl.fixed_mask(n, 4, 1)),
        ("window", "window_global_mask(16, window=3, causal=True)",
         lambda: impl.window_global_mask(n, 3, causal=True)),
        ("window + global", "window_global_mask(16, window=3, global_tokens=[0])",
         lambda: impl.window_global_mask(n, 3, [0])),
        ("bigbird", "bigbird_mask(16, window=3, global_tokens=[0], num_random=2)",
         lambda: impl.bigbird_mask(n, 3, [0], 2)),
    ]
    out = []
    for name, call, make in patterns:
        mask = _call(errors, make)
        res = _call(errors, impl.sparse_attention, q, k, v, mask) if mask is not None else None
        m = None if mask is None else np.asarray(mask, dtype=bool)
        is_causal = m is not None and not np.triu(m, 1).any()
        ex, err = exact[is_causal], None
        if res is not None and ex is not None:  # against exact attention of the same causality
            err = float(np.linalg.norm(res[0] - ex[0]) / np.linalg.norm(ex[0]))
        out.append({"name": name, "call": call, "causal": is_causal,
                    "rows": None if m is None else ["".join("1" if x else "0" for x in r)
                                                    for r in m],
                    "pairs": None if m is None else int(m.sum()),
                    "relative_error": None if err is None else _r(err)})
    return {"inputs": p, "patterns": out, "all_pairs": n * n}


LSH = {"n": 16, "n_buckets": 4, "rounds": 3, "seed": 3}


def trace_lsh(impl: Any, errors: list[str]) -> dict:
    """Reformer's angular LSH on 16 two-dimensional vectors (so the plane shows the
    buckets): lab 10's lsh_buckets with provided.random_rotations, per round; then, for 1, 2
    and 3 rounds, each query's lsh_mass_captured and lsh_attention's output against
    chunked_attention's (exact). A query attends the keys sharing its bucket in any round
    (here queries and keys are the same vectors, as in the Reformer's shared QK)."""
    p = LSH
    provided = load_lab_module(REPO / "labs" / LABS["10"], "provided")
    rng = np.random.default_rng(p["seed"])
    angles = np.sort(rng.uniform(0, 2 * np.pi, p["n"]))
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1) * rng.uniform(0.8, 1.6, (p["n"], 1))
    x = x * 2.0  # sharper softmax: most of a query's mass is on its angular neighbours
    v = rng.standard_normal((p["n"], 2))
    rot = provided.random_rotations(2, p["n_buckets"], p["rounds"], seed=p["seed"])
    buckets = _call(errors, impl.lsh_buckets, x, rot)  # [rounds, n]
    exact = _call(errors, impl.chunked_attention, x, x, v)
    by_rounds = []
    for r in range(1, p["rounds"] + 1):
        mass = _call(errors, impl.lsh_mass_captured, x, x, rot[:r])
        res = _call(errors, impl.lsh_attention, x, x, v, rot[:r])
        err = None
        if res is not None and exact is not None:
            err = np.linalg.norm(res[0] - exact[0], axis=1) / np.linalg.norm(exact[0], axis=1)
        by_rounds.append({"rounds": r, "mass": None if mass is None else _r(mass, 4),
                          "error": None if err is None else _r(err, 4)})
    return {"inputs": p, "x": _r(x, 4), "rotations": _r(rot, 4),
            "buckets": None if buckets is None else np.asarray(buckets).tolist(),
            "by_rounds": by_rounds}


def trace_lab10(impl: Any) -> dict:
    """The pattern zoo's and the LSH page's traces (one learner's run feeds both pages)."""
    errors: list[str] = []
    return {"lab": "10", "zoo": trace_zoo(impl, errors), "lsh": trace_lsh(impl, errors),
            "errors": errors}


def diff_zoo(mine: dict, ref: dict) -> dict | None:
    """The first pattern (its index) whose mask, then whose sparse_attention, differs."""
    for n, (a, b) in enumerate(zip(mine["zoo"]["patterns"], ref["zoo"]["patterns"])):
        if a["rows"] != b["rows"]:
            row = next((i for i, r in enumerate(b["rows"])
                        if a["rows"] is None or a["rows"][i] != r), 0)
            return {"step": n, "page": "zoo", "field": "mask", "row": row,
                    "yours": None if a["rows"] is None else a["rows"][row],
                    "reference": b["rows"][row], "where": f"{b['call']}, query {row}"}
        if not _close(a["relative_error"], b["relative_error"]):
            return {"step": n, "page": "zoo", "field": "sparse_attention",
                    "yours": a["relative_error"], "reference": b["relative_error"],
                    "where": f"sparse_attention on {b['name']}"}
    return None


def diff_lsh(mine: dict, ref: dict) -> dict | None:
    """The first round (index) whose buckets differ, else the first number of rounds whose
    mass captured or lsh_attention differs."""
    a, b = mine["lsh"], ref["lsh"]
    for r in range(len(b["buckets"])):
        if a["buckets"] is None or a["buckets"][r] != b["buckets"][r]:
            return {"step": r, "page": "lsh", "field": "lsh_buckets",
                    "yours": None if a["buckets"] is None else a["buckets"][r],
                    "reference": b["buckets"][r], "where": f"round {r + 1}"}
    for r, (x, y) in enumerate(zip(a["by_rounds"], b["by_rounds"])):
        for field, name in (("mass", "lsh_mass_captured"), ("error", "lsh_attention")):
            if not _close(x[field], y[field]):
                return {"step": r, "page": "lsh", "field": name, "yours": x[field],
                        "reference": y[field], "where": f"{r + 1} round{'s' if r else ''}"}
    return None


def diff_lab10(mine: dict, ref: dict) -> dict | None:
    return diff_zoo(mine, ref) or diff_lsh(mine, ref)


COMPLEXITY = {"sizes": [256, 512, 1024, 2048], "d": 16, "window": 64, "stride": 64, "block": 64,
              "summary": 8, "random": 8, "bucket_size": 32, "rounds": 2, "rank": 64,
              "features": 64}


def _retrieval_errors(out: Any, exact: Any) -> tuple[Any, Any]:
    """(relative error of the last row, RMS error over all rows) to 3 significant digits."""
    if out is None or exact is None:
        return None, None
    out = np.asarray(out)
    rel = np.linalg.norm(out[-1] - exact[-1]) / np.linalg.norm(exact[-1])
    rms = np.sqrt(np.mean((out - exact) ** 2))
    return float(f"{rel:.3g}"), float(f"{rms:.3g}")


def trace_complexity(impl: Any) -> dict:
    """Cost and error against N for each method of lab 10, with the settings of its README's
    tables. Pairs scored: the masks' True cells (strided_mask, fixed_mask,
    window_global_mask, bigbird_mask), the pairs sharing a bucket in some round
    (lsh_buckets), N·k for Linformer. FLOPs and the largest intermediate (FP16) are
    modelled here: 4·d FLOPs and 2 bytes per scored pair, plus Linformer's projections,
    Performer's and linear attention's feature maps; exact attention's N x N matrix is
    score_matrix_bytes. Errors: on provided.retrieval_task, against chunked_attention (exact),
    for the retrieval row (relative) and over all rows (RMS)."""
    c = COMPLEXITY
    provided = load_lab_module(REPO / "labs" / LABS["10"], "provided")
    d, errors = c["d"], []
    rows: dict[str, dict[str, list]] = {}

    def put(name: str, **values: Any) -> None:
        for key, value in values.items():
            rows.setdefault(name, {}).setdefault(key, []).append(value)
    for n in c["sizes"]:
        q, k, v, _ = provided.retrieval_task(n, d, seed=0)
        n_buckets = max(2, 2 * (n // (2 * c["bucket_size"])))  # about bucket_size keys each
        rot = provided.random_rotations(d, n_buckets, c["rounds"], 0)
        pool = provided.mean_pooling_projection(c["rank"], n)
        omega = provided.performer_omega(d, c["features"], seed=0)
        masks = {"window + global": (impl.window_global_mask, (n, c["window"], [0]), {}),
                 "BigBird": (impl.bigbird_mask, (n, c["window"], [0], c["random"]), {"seed": 0}),
                 "strided": (impl.strided_mask, (n, c["stride"]), {"causal": False}),
                 "fixed": (impl.fixed_mask, (n, c["block"], c["summary"]), {"causal": False})}
        exact = _call(errors, impl.chunked_attention, q, k, v)
        exact_out = None if exact is None else exact[0]
        s_bytes = _call(errors, impl.score_matrix_bytes, n)
        put("exact", pairs=n * n, flops=4 * d * n * n, bytes=s_bytes, error=0.0, rms=0.0)
        put("chunked (exact)", pairs=n * n, flops=4 * d * n * n, bytes=2 * 64 * 64, error=0.0,
            rms=0.0)
        for name, (make, args, kw) in masks.items():
            mask = _call(errors, make, *args, **kw)
            pairs = None if mask is None else int(np.asarray(mask).sum())
            res = _call(errors, impl.sparse_attention, q, k, v, mask) if mask is not None else None
            e, r = _retrieval_errors(None if res is None else res[0], exact_out)
            put(name, pairs=pairs, flops=None if pairs is None else 4 * d * pairs,
                bytes=None if pairs is None else 2 * pairs, error=e, rms=r)
        h = _call(errors, impl.lsh_buckets, np.random.default_rng(0).standard_normal((n, d)), rot)
        pairs = None if h is None else int((h[:, :, None] == h[:, None, :]).any(axis=0).sum())
        res = _call(errors, impl.lsh_attention, q, k, v, rot)
        e, r = _retrieval_errors(None if res is None else res[0], exact_out)
        put("LSH", pairs=pairs, flops=None if pairs is None else 4 * d * pairs,
            bytes=None if pairs is None else 2 * pairs, error=e, rms=r)
        out = _call(errors, impl.linformer_attention, q, k, v, pool, pool)
        e, r = _retrieval_errors(out, exact_out)
        put("Linformer", pairs=n * c["rank"], flops=8 * n * c["rank"] * d,
            bytes=2 * n * c["rank"], error=e, rms=r)
        out = _call(errors, impl.performer_attention, q, k, v, omega)
        e, r = _retrieval_errors(out, exact_out)
        put("Performer", pairs=0, flops=8 * n * d * c["features"], bytes=4 * n * c["features"],
            error=e, rms=r)
        out = _call(errors, impl.linear_attention_parallel, q, k, v, causal=False)
        e, r = _retrieval_errors(out, exact_out)
        put("linear (elu + 1)", pairs=0, flops=8 * n * d * d, bytes=2 * (d * d + d), error=e,
            rms=r)
    methods = [{"name": name, **values} for name, values in rows.items()]  # in this order
    return {"lab": "10", "inputs": c, "methods": methods, "errors": errors}


# ---- lab 07: a block pool for a request stream -----------------------------------------------

POOL = {"num_blocks": 10, "block_size": 4}
STREAM = {"num_blocks": 24, "block_size": 4, "max_num_seqs": 6, "max_model_len": 32}


def trace_lab07(impl: Any) -> dict:
    """A scripted stream through KVCacheManager (prefix hit, fork, copy-on-write, a request
    arriving mid-stream, a finish), then simulate vs simulate_contiguous on one workload."""
    provided = load_lab_module(REPO / "labs" / LABS["07"], "provided")
    Request = provided.Request
    errors: list[str] = []
    pool = _call(errors, impl.BlockPool, POOL["num_blocks"], POOL["block_size"])
    mgr = _call(errors, impl.KVCacheManager, pool) if pool is not None else None
    prefix = tuple(range(100, 108))  # two full blocks every request shares (a system prompt)
    reqs = {"A": Request("A", prefix + (1, 2, 3)), "B": Request("B", prefix + (7, 8, 9, 10, 11))}
    events: list[dict] = []

    def snap(what: str, **extra: Any) -> None:
        tables, refs, free = {}, None, None
        if mgr is not None:
            for rid in _call(errors, lambda: mgr.request_ids) or []:
                tables[rid] = _call(errors, mgr.block_table, rid)
            refs = [_call(errors, pool.ref_count, b) for b in range(POOL["num_blocks"])]
            free = _call(errors, lambda: pool.num_free_blocks)
        events.append({"event": what, "tables": tables, "ref_counts": refs,
                       "free_blocks": free, **extra})

    def act(fn: Callable[[], Any]) -> Any:
        return _call(errors, fn) if mgr is not None else None

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
    paged = _call(errors, impl.simulate, work, s["num_blocks"], s["block_size"], s["max_num_seqs"])
    contig = _call(errors, impl.simulate_contiguous, work, s["num_blocks"], s["block_size"],
                   s["max_num_seqs"], s["max_model_len"])

    def stats(st: Any) -> dict | None:
        if st is None:
            return None
        return {"total_slots": st.total_slots, "used": list(st.used_slots),
                "reserved": list(st.reserved_slots), "running": list(st.num_running),
                "preemptions": st.preemptions, "prompt_tokens": st.prompt_tokens,
                "cached_prompt_tokens": st.cached_prompt_tokens, "steps": st.steps,
                "mean_utilisation": _r(st.mean_utilisation, 4)}
    return {"lab": "07", "pool": POOL, "events": events, "stream": s,
            "workload": [[w.arrival, len(w.prompt_tokens), w.output_len] for w in work],
            "paged": stats(paged), "contiguous": stats(contig), "errors": errors}


def diff_lab07(mine: dict, ref: dict) -> dict | None:
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


# ---- shared ----------------------------------------------------------------------------------

BUILDERS = {"00": trace_lab00, "01": trace_lab01, "04": trace_lab04, "06": trace_lab06,
            "07": trace_lab07, "08": trace_lab08, "10": trace_lab10}
# Reference-only traces of other pages: name -> (lab, builder).
EXTRA = {"ring": ("04", trace_ring), "window": ("06", trace_window),
         "memory": ("00", trace_memory), "fagrid": ("00", trace_fagrid),
         "bahdanau": ("08", trace_bahdanau), "complexity": ("10", trace_complexity)}
DIFFS = {"00": diff_lab00, "01": diff_lab01, "04": diff_lab04, "07": diff_lab07,
         "08": diff_lab08, "10": diff_lab10}
# Labs whose trace feeds several pages: each page shows its own first difference.
PAGE_DIFFS = {"08": {"scoring": diff_scoring, "multihead": diff_multihead},
              "10": {"zoo": diff_zoo, "lsh": diff_lsh}}


def _close(a: Any, b: Any) -> bool:
    """Equal up to TOL, recursively; None (not computed) equals only None."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(float(a) - float(b)) <= TOL * (1 + abs(float(b)))


def as_script(name: str, data: dict) -> str:
    body = json.dumps(data, separators=(",", ":"), sort_keys=True)
    return ("window.BOOK_TRACES = window.BOOK_TRACES || {};\n"
            f"window.BOOK_TRACES[{json.dumps(name)}] = {body};\n")


def read_script(path: pathlib.Path) -> dict | None:
    text = path.read_text()
    return json.loads(text.split("] = ", 1)[1].rstrip().rstrip(";"))


def fresh_run(folder: pathlib.Path, impl_name: str, builder: Callable[[Any], dict]) -> dict:
    """``builder`` on ``folder``'s ``impl_name`` module, imported afresh: the lab's modules
    are cached by the folder's name, and a copy of the folder (a test's) has the same name.
    The modules cached before are put back afterwards."""
    prefix = folder.name.replace("-", "_") + "."
    saved = {n: m for n, m in sys.modules.items() if n.startswith(prefix)}
    for name in saved:
        del sys.modules[name]
    try:
        return builder(load_impl(folder, impl_name))
    finally:
        for name in [n for n in sys.modules if n.startswith(prefix)]:
            del sys.modules[name]
        sys.modules.update(saved)


def build(lab: str, impl_name: str, lab_dir: pathlib.Path | None = None) -> dict:
    """The trace of ``lab`` run with ``impl_name`` (``solution`` or ``starter``) from
    ``lab_dir`` (default: the repository's lab folder)."""
    folder = lab_dir or REPO / "labs" / LABS[lab]
    try:
        data = fresh_run(folder, impl_name, BUILDERS[lab])
    except Exception as e:  # noqa: BLE001 - a starter that does not even import
        return {"lab": lab, "impl": impl_name, "import_error": str(e),
                "first_diff": {"step": 0, "field": "import", "where": "import", "yours": str(e),
                               "reference": None}}
    data["impl"] = impl_name
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", default="solution", choices=("solution", "starter"))
    ap.add_argument("--lab", action="append",
                    help=f"{', '.join(sorted(LABS))} (default: all)")
    ap.add_argument("--lab-dir", type=pathlib.Path, help="the lab folder to load (tests)")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    labs = args.lab or (list(BUILDERS) if args.impl == "solution" else list(TRACEABLE))
    out = args.out or (REFERENCE_DIR if args.impl == "solution" else REPO / "build" / "traces")
    out.mkdir(parents=True, exist_ok=True)
    if args.impl == "solution" and not args.lab:
        for name, (lab, builder) in EXTRA.items():
            data = fresh_run(REPO / "labs" / LABS[lab], "solution", builder)
            path = out / f"{name}-reference.js"
            path.write_text(as_script(f"{name}-reference", data))
            print(f"   wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    for lab in labs:
        lab = lab.removeprefix("lab-")[:2]
        if lab not in BUILDERS or (args.impl == "starter" and lab not in TRACEABLE):
            print(f"!! no trace for lab {lab}: make trace works for labs {', '.join(TRACEABLE)}")
            return 2
        data = build(lab, args.impl, args.lab_dir)
        name = f"lab{lab}-{'reference' if args.impl == 'solution' else 'starter'}"
        if args.impl == "starter":
            ref = read_script(REFERENCE_DIR / f"lab{lab}-reference.js")
            if "first_diff" not in data:
                data["first_diff"] = DIFFS[lab](data, ref)
                data["page_diffs"] = {page: fn(data, ref)
                                      for page, fn in PAGE_DIFFS.get(lab, {}).items()}
            diff = data["first_diff"]
            print(f">> lab {lab}: " + ("your trace matches the reference at every step"
                  if diff is None else f"first difference at step {diff['step']} "
                  f"({diff['where']}): {diff['field']}"))
        path = out / f"{name}.js"
        path.write_text(as_script(name, data))
        print(f"   wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        if args.impl == "starter" and args.out is None:
            _show_in_book(path, lab)
    return 0


def _show_in_book(path: pathlib.Path, lab: str) -> None:
    """Put the learner's trace into the built book, if there is one, and say which pages."""
    pages = manifest.lab(lab).trace_pages
    book = REPO / "build" / "book" / "viz"
    names = " and ".join(f"build/book/viz/{page}.html" for page in pages)
    if (book / "traces").is_dir():
        shutil.copyfile(path, book / "traces" / path.name)
        print(f">> reload {names}: {'they show' if len(pages) > 1 else 'it shows'} your run "
              "beside the reference")
    else:
        print(f">> run `make book`, then open {names}")


if __name__ == "__main__":
    raise SystemExit(main())
