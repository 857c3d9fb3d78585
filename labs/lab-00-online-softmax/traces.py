"""The web book's traces of this lab: FlashAttention's tiling (the lab's trace), the memory
hierarchy's capacities, and FlashAttention-1 vs -2: who owns which tile. ``book/traces.py``
runs them (``python -m book.traces``; ``make trace LAB=00`` on a starter): ``trace(impl)`` is
this lab's trace, run on the solution or a starter; ``diff(mine, ref)`` the first step where
a starter's trace differs from the reference's; every number a page shows is computed here
by the lab's public functions (the hardware figures are cited: common/gpus.py,
common/launch_plan.py).
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np

from common import launch_plan
from common.gpus import LIMIT_SOURCES, LIMITS
from common.loader import load_lab_module
from common.tracing import BYTES, attempt, close, rounded

HERE = pathlib.Path(__file__).resolve().parent


FA = {"L": 16, "d": 4, "dv": 2, "tile": 4, "seed": 0}


def fa_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Small q, k, v where the running max grows after the first tile for many rows."""
    rng = np.random.default_rng(FA["seed"])
    q = rng.normal(size=(FA["L"], FA["d"]))
    k = rng.normal(size=(FA["L"], FA["d"])) * np.linspace(0.6, 1.6, FA["L"])[:, None]
    v = rng.normal(size=(FA["L"], FA["dv"]))
    return q, k, v


def trace(impl: Any) -> dict:
    """Per (Q tile, K/V tile) step: each row's m, l (online_softmax_steps on the row's
    scores), out and lse (flash_attention_forward on the K/V prefix so far) and
    ``acc = out · l``, the unnormalised output: from the returned ``out`` and the running
    ``l``, never from ``lse``, so a wrong ``lse`` shows as ``lse`` alone."""
    q, k, v = fa_inputs()
    L, d, dv, t = FA["L"], FA["d"], FA["dv"], FA["tile"]
    scale = 1.0 / math.sqrt(d)
    scores = (q @ k.T) * scale  # [L, L]: the inputs of online_softmax_steps, shown on the grid
    errors: list[str] = []
    row_steps = [attempt(errors, impl.online_softmax_steps, scores[i], t) for i in range(L)]
    n_tiles = L // t
    steps, hbm, flops = [], 0, 0
    for qt in range(n_tiles):
        q0, q1 = qt * t, (qt + 1) * t
        hbm += t * d * BYTES  # load the Q tile once
        for kt in range(n_tiles):
            k1 = (kt + 1) * t
            res = attempt(errors, impl.flash_attention_forward, q[q0:q1], k[:k1], v[:k1],
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
                    if l is not None:
                        acc = out * l  # unnormalised, relative to the running max (not via lse)
                row = {"i": i, "m": rounded(m) if m is not None else None,
                       "l": rounded(l) if l is not None else None,
                       "m_old": rounded(m_old) if m_old is not None else "-inf",
                       "alpha": rounded(math.exp(m_old - m))
                       if (m_old is not None and m is not None) else 0.0,
                       "acc": rounded(acc) if acc is not None else None,
                       "out": rounded(out) if out is not None else None,
                       "lse": rounded(lse) if lse is not None else None}
                rows.append(row)
            last = kt == n_tiles - 1
            if last:
                hbm += t * dv * BYTES + t * 4  # write the O tile and its lse (fp32)
            steps.append({"qt": qt, "kt": kt, "rows": rows, "hbm": hbm, "flops": flops,
                          "write_o": last})
    s_bytes = attempt(errors, impl.score_matrix_bytes, L, bytes_per_element=BYTES)
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
    return {"lab": "00", "inputs": {**FA, "scale": rounded(scale)}, "scores": rounded(scores, 3),
            "steps": steps, "standard": standard, "score_matrix_bytes": s_bytes,
            "qkv_bytes": qkv, "errors": errors}


def diff(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["steps"], ref["steps"])):
        for ra, rb in zip(a["rows"], b["rows"]):
            for field in ("m", "l", "acc", "lse"):
                if not close(ra[field], rb[field]):
                    return {"step": n, "row": ra["i"], "field": field, "yours": ra[field],
                            "reference": rb[field],
                            "where": f"Q tile {a['qt']}, K/V tile {a['kt']}, row {ra['i']}"}
    return None


# ---- the memory-hierarchy page: hardware figures (cited) and lab 00's score matrix ------

GPUS = {  # per-SM limits: common/gpus.py (CUDA Programming Guide); SMs, HBM and
        # tensor throughput: common/launch_plan.py's targets
    "A100 SXM4 80GB": {"arch": 80, "l2_mb": 40, "hbm_gb": 80,
                       "host": "PCIe Gen4 x16: 64 GB/s (both directions)", "nvlink_gbps": 600,
                       "source": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, "
                                 "40 MB L2) and A100 datasheet (80 GB HBM2e, 2,039 GB/s, "
                                 "NVLink 600 GB/s, PCIe Gen4 64 GB/s)"},
    "H100 SXM5 80GB": {"arch": 90, "l2_mb": 50, "hbm_gb": 80,
                       "host": "PCIe Gen5 x16: 128 GB/s (both directions)", "nvlink_gbps": 900,
                       "source": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs "
                                 "on SXM5, 50 MB L2) and H100 datasheet (80 GB HBM3, "
                                 "3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s)"},
}


def trace_memory(impl: Any) -> dict:
    """Capacities of each tier for A100 and H100 (cited) and lab 00's score_matrix_bytes
    for sequence lengths 512 .. 131072: the N x N matrix standard attention writes to HBM."""
    gpus = {}
    for name, g in GPUS.items():
        lim, target = LIMITS[g["arch"]], launch_plan.TARGETS[g["arch"]]
        gpus[name] = {
            "sms": target.sms, "regs_per_sm_bytes": lim.regs_per_sm * 4,
            "smem_per_sm_bytes": lim.smem_per_sm, "l2_bytes": g["l2_mb"] * 2**20,
            "hbm_bytes": g["hbm_gb"] * 10**9, "hbm_tbps": target.hbm_tbps,
            "dense_bf16_tflops": target.tensor_tflops,
            "nvlink_gbps": g["nvlink_gbps"], "host": g["host"], "source": g["source"]}
    errors: list[str] = []
    seqs = [2**i for i in range(9, 18)]
    s_bytes = [attempt(errors, impl.score_matrix_bytes, n, bytes_per_element=BYTES) for n in seqs]
    return {"lab": "00", "gpus": gpus, "limit_sources": list(LIMIT_SOURCES), "seq_lens": seqs,
            "score_matrix_bytes": s_bytes, "errors": errors}


# ---- FlashAttention-1 vs -2: who owns which tile -------------------------------------------

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
    provided = load_lab_module(HERE, "provided")
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
        states.append([attempt(errors, impl.online_softmax_steps, scores[i], t) for i in range(L)])
        res = attempt(errors, impl.flash_attention_forward, q[bh], k[bh], v[bh], block_q=t,
                      block_k=t)
        outs.append(rounded(res[0]) if res is not None else None)
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
                rows.append({**w, "m": [rounded(s[w["kt"]][0]) if s else None for s in st],
                             "l": [rounded(s[w["kt"]][1]) if s else None for s in st]})
            steps.append({"work": rows, "hbm": hbm})
        schedules[name] = {"grid": list(grid), "steps": steps}
    occupancy = {g: [sm_occupancy(b, provided, launch_plan.TARGETS[GPUS[g]["arch"]].sms)
                     for b in OCCUPANCY["batches"]] for g in GPUS}
    return {"lab": "00", "inputs": p, "n_q": n_q, "n_k": n_k, "schedules": schedules,
            "out": outs, "sms": {g: launch_plan.TARGETS[GPUS[g]["arch"]].sms for g in GPUS},
            "occupancy": occupancy, "occupancy_inputs": OCCUPANCY, "errors": errors}


# FA1 vs FA2 at a real size: Llama-2-7B-like prefill (32 heads, 8,192 tokens, tiles of 128).
OCCUPANCY = {"heads": 32, "seq": 8192, "tile": 128, "batches": [1, 2, 4, 8, 16, 32, 64]}


def sm_occupancy(batch: int, provided: Any, sms: int) -> dict:
    """Both schedules on ``sms`` SMs at batch ``batch`` (a model: one program per SM at a
    time, every tile pair takes one time unit). FlashAttention-2's programs are lab 00's
    ``attention_grid`` (each walks ``n_k`` tile pairs); FlashAttention-1 has one program per
    batch·head (each walks ``n_q * n_k``). Per schedule: programs, waves (``ceil(programs
    / sms)``; every wave but the last fills every SM), the last wave's busy SMs, time (tile
    pairs) and the share of SM time used."""
    p = OCCUPANCY
    n = math.ceil(p["seq"] / p["tile"])
    out = {"batch": batch}
    for name, programs, work in (("fa1", batch * p["heads"], n * n),
                                 ("fa2", provided.attention_grid(batch, p["heads"], p["seq"],
                                                                 p["tile"])[0], n)):
        waves = math.ceil(programs / sms)
        out[name] = {"programs": programs, "work": work, "waves": waves,
                     "last_wave_busy": programs - (waves - 1) * sms,
                     "time": waves * work, "utilisation": round(programs / (waves * sms), 4)}
    out["speedup"] = round(out["fa1"]["time"] / out["fa2"]["time"], 3)
    return out


# ---- FlashAttention-3: warp specialisation on one H100 SM (a model) ---------------------

# One CTA of the FlashAttention-3 forward (arXiv 2407.08608, sections 3.1-3.2): a Q tile of
# 128 rows split over two consumer warpgroups of 64 rows, K/V tiles of 128 keys, head dim
# 128, bf16, and a producer warpgroup that issues the TMA copies into a two-stage buffer.
FA3 = {"rows_per_warpgroup": 64, "warpgroups": 2, "block_k": 128, "d": 128, "kv_tiles": 6,
       "stages": 2, "arch": 90,
       # The exponential's throughput on an H100 SXM: 3.9 TFLOP/s of special functions
       # against 989 of dense bf16 matmul (the FlashAttention-3 paper, section 3).
       "exp_tflops": 3.9,
       # Assumption (not a datasheet figure): every Q tile of a head reads the same K/V
       # tiles, most of them from L2, so an SM's copies run at 3x its share of HBM.
       "l2_reuse": 3.0}
FA3_SOURCES = (
    "Shah et al., 'FlashAttention-3: Fast and Accurate Attention with Asynchrony and "
    "Low-precision', arXiv 2407.08608, 2024: producer/consumer warp specialisation with TMA "
    "(section 3.1), ping-pong scheduling of softmax against the other warpgroup's GEMMs "
    "(section 3.1, Figure 1), 3.9 TFLOP/s of exponentials vs 989 TFLOP/s of matmul (H100 SXM5).",
    "H100 SXM's 132 SMs, 3.35 TB/s and 989 TFLOP/s dense bf16: common/launch_plan.py.",
)


def fa3_schedule(mode: str, p: dict | None = None) -> dict:
    """A modelled timeline of one CTA on one H100 SM, in ns: ``mode="fa3"`` (a producer
    warpgroup copies K/V tiles ahead into ``stages`` buffers while two consumer warpgroups
    ping-pong: one's softmax runs under the other's wgmma) or ``"fa2"`` (no specialisation:
    every warp waits for its tile's copy, and both warpgroups do each phase together).

    Rates are the SM's share of the H100's: HBM bandwidth (times ``l2_reuse``), dense bf16
    tensor throughput, and the exponential's throughput. Returns ``{"bars": [{lane, kind,
    tile, start, end}], "total_ns", "tensor_busy", "tflops"}`` (``tflops``: the whole GPU's,
    at that CTA's rate on every SM). A model: no register pressure, no O rescale, no
    prologue tricks; it shows why the overlap pays, not what a kernel measures."""
    p = {**FA3, **(p or {})}
    if mode not in ("fa2", "fa3"):
        raise ValueError(f"mode must be 'fa2' or 'fa3', got {mode!r}")
    target = launch_plan.TARGETS[p["arch"]]
    rows, n, d, wgs = p["rows_per_warpgroup"], p["block_k"], p["d"], p["warpgroups"]
    copy_bytes_per_ns = target.hbm_tbps * 1e3 / target.sms * p["l2_reuse"]  # TB/s -> B/ns
    flop_per_ns = target.tensor_tflops * 1e3 / target.sms
    exp_per_ns = p["exp_tflops"] * 1e3 / target.sms
    t_load = 2 * n * d * BYTES / copy_bytes_per_ns  # K and V tiles
    t_gemm = 2 * rows * n * d / flop_per_ns  # S = Q K^T, or O += P V, for one warpgroup
    t_exp = rows * n / exp_per_ns  # one exponential per score
    bars: list[dict] = []
    free = {"tma": 0.0, "tensor": 0.0, "sfu": 0.0}

    def run(lane: str, kind: str, tile: int, res: str, ready: float, length: float) -> float:
        start = max(ready, free[res])
        free[res] = start + length
        bars.append({"lane": lane, "kind": kind, "tile": tile, "start": round(start, 1),
                     "end": round(start + length, 1)})
        return start + length

    done = [0.0] * p["kv_tiles"]  # when both warpgroups finished with tile j's buffer
    loaded = [0.0] * p["kv_tiles"]
    pv_end = [0.0] * wgs
    for j in range(p["kv_tiles"]):
        if mode == "fa3":  # the producer copies ahead, as far as the free buffers allow
            slot_free = done[j - p["stages"]] if j >= p["stages"] else 0.0
            loaded[j] = run("producer", "tma", j, "tma", slot_free, t_load)
            s_end = []
            for w in range(wgs):  # ping-pong: warpgroup w's softmax under the other's wgmma
                lane = f"consumer {w + 1}"
                s = run(lane, "wgmma", j, "tensor", max(loaded[j], pv_end[w]), t_gemm)
                s_end.append(run(lane, "softmax", j, "sfu", s, t_exp))
            for w in range(wgs):
                pv_end[w] = run(f"consumer {w + 1}", "wgmma", j, "tensor", s_end[w], t_gemm)
            done[j] = max(pv_end)
        else:  # every warp copies, waits, then all do each phase before the next one
            start = done[j - 1] if j else 0.0
            loaded[j] = run("all warps", "tma", j, "tma", start, t_load)
            s_end = [run(f"consumer {w + 1}", "wgmma", j, "tensor", loaded[j], t_gemm)
                     for w in range(wgs)]
            soft = max(s_end)
            soft_end = [run(f"consumer {w + 1}", "softmax", j, "sfu", soft, t_exp)
                        for w in range(wgs)]
            barrier = max(soft_end)
            pv_end = [run(f"consumer {w + 1}", "wgmma", j, "tensor", barrier, t_gemm)
                      for w in range(wgs)]
            done[j] = max(pv_end)
    total = max(b["end"] for b in bars)
    tensor = sum(b["end"] - b["start"] for b in bars if b["kind"] == "wgmma")
    flops = 4 * wgs * rows * n * d * p["kv_tiles"]
    return {"bars": bars, "total_ns": round(total, 1), "tensor_busy": round(tensor / total, 4),
            "tflops": round(flops / total * target.sms / 1e3, 1),
            "op_ns": {"tma": round(t_load, 1), "wgmma": round(t_gemm, 1),
                      "softmax": round(t_exp, 1)}}


def trace_fa3(impl: Any) -> dict:
    """The FA3 page's timelines: ``fa3_schedule`` for FlashAttention-2's synchronous
    schedule and FlashAttention-3's warp-specialised one, on the same work (a model: no lab
    runs warpgroups; ``impl`` is unused)."""
    runs = {mode: fa3_schedule(mode) for mode in ("fa2", "fa3")}
    return {"lab": "00", "modelled": True, "inputs": FA3, "gpu": launch_plan.H100.name,
            "peak_tflops": launch_plan.H100.tensor_tflops, "runs": runs,
            "speedup": round(runs["fa2"]["total_ns"] / runs["fa3"]["total_ns"], 3),
            "sources": list(FA3_SOURCES), "errors": []}


# Reference-only traces of other pages (book/pages/): name -> builder.
EXTRA = {"memory": trace_memory, "fagrid": trace_fagrid, "fa3": trace_fa3}
