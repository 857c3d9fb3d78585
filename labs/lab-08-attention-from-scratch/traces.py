"""The web book's traces of this lab: Scoring functions and multi-head self-attention (the
lab's trace), and Bahdanau's alignment. ``book/traces.py`` runs them (``python -m
book.traces``; ``make trace LAB=08`` on a starter): ``trace(impl)`` is this lab's trace, run
on the solution or a starter; ``diff(mine, ref)`` the first step where a starter's trace
differs from the reference's; every number a page shows is computed here by the lab's public
functions.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np

from common.loader import load_lab_module
from common.tracing import attempt, close, rounded

HERE = pathlib.Path(__file__).resolve().parent


SCORING = {"dims": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "num_keys": 8, "da": 8, "seed": 8}


SCORE_FNS = ("additive", "dot", "scaled_dot")


def trace(impl: Any) -> dict:
    """Per head dim d_k: lab 08's scale_experiment (variance and mean softmax entropy of
    256 x 256 random scores, raw and scaled), and one query against 8 keys scored by
    additive_scores, dot_scores and scaled_dot_scores, with softmax and softmax_entropy."""
    p = SCORING
    errors: list[str] = []
    steps = []
    for d in p["dims"]:
        stats = attempt(errors, impl.scale_experiment, d)
        rng = np.random.default_rng(p["seed"] + d)
        q = rng.standard_normal((1, d))
        k = rng.standard_normal((p["num_keys"], d))
        # additive weights at the usual 1/sqrt(fan-in) initialisation: tanh's inputs stay O(1)
        w_q = rng.standard_normal((d, p["da"])) / math.sqrt(d)
        w_k = rng.standard_normal((d, p["da"])) / math.sqrt(d)
        v_a = rng.standard_normal(p["da"]) / math.sqrt(p["da"])
        raw = {"additive": attempt(errors, impl.additive_scores, q, k, w_q, w_k, v_a),
               "dot": attempt(errors, impl.dot_scores, q, k),
               "scaled_dot": attempt(errors, impl.scaled_dot_scores, q, k)}
        fns = {}
        for name in SCORE_FNS:
            s = raw[name]
            row = np.asarray(s, dtype=float)[0] if s is not None else None
            w = attempt(errors, impl.softmax, row) if row is not None else None
            h = attempt(errors, impl.softmax_entropy, row) if row is not None else None
            fns[name] = {"scores": rounded(row) if row is not None else None,
                         "weights": rounded(w) if w is not None else None,
                         "entropy": rounded(h) if h is not None else None}
        steps.append({"d": d, "stats": None if stats is None else {
            "variance_unscaled": rounded(stats.variance_unscaled),
            "variance_scaled": rounded(stats.variance_scaled),
            "entropy_unscaled": rounded(stats.entropy_unscaled),
            "entropy_scaled": rounded(stats.entropy_scaled)}, "example": fns})
    return {"lab": "08", "inputs": p, "steps": steps, "max_entropy": rounded(math.log(256)),
            "max_entropy_example": rounded(math.log(p["num_keys"])),
            "multihead": trace_multihead(impl, errors), "errors": errors}


def diff(mine: dict, ref: dict) -> dict | None:
    """The first difference on the scoring page, else on the multi-head page."""
    return diff_scoring(mine, ref) or diff_multihead(mine, ref)


def diff_scoring(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["steps"], ref["steps"])):
        where = f"d_k = {b['d']}"
        if not close(a["stats"], b["stats"]):
            return {"step": n, "field": "scale_experiment", "yours": a["stats"],
                    "reference": b["stats"], "where": where}
        for name in SCORE_FNS:
            for field in ("scores", "weights", "entropy"):
                ya, yb = a["example"][name][field], b["example"][name][field]
                if not close(ya, yb):
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
    e = attempt(errors, impl.additive_scores, s, h, w_q, w_k, v_a)  # [target, source]
    steps = []
    for i in range(p["target"]):
        row = np.asarray(e, dtype=float)[i] if e is not None else None
        a = attempt(errors, impl.softmax, row) if row is not None else None
        ent = attempt(errors, impl.softmax_entropy, row) if row is not None else None
        context = np.asarray(a) @ h if a is not None else None
        steps.append({"i": i, "scores": rounded(row) if row is not None else None,
                      "weights": rounded(a) if a is not None else None,
                      "entropy": rounded(ent) if ent is not None else None,
                      "context": rounded(context) if context is not None else None})
    return {"lab": "08", "inputs": p, "encoder": rounded(h, 4), "decoder": rounded(s, 4),
            "steps": steps, "errors": errors}


MULTIHEAD = {"L": 6, "E": 8, "heads": 4, "length": 4, "seed": 13}


MH_RUNS = ("full-whole", "causal-whole", "full-padded", "causal-padded")


def trace_multihead(impl: Any, errors: list[str]) -> dict:
    """Self-attention on one 6-token sequence, 4 heads: lab 08's multi_head_attention (its
    head-averaged weights) and, per head, attention_weights on split_heads of the same
    projections with the same masks; for causal on/off and padding (4 real tokens) on/off
    (the runs of ``MH_RUNS``, in that order)."""
    p = MULTIHEAD
    lab = HERE
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
            kpm = attempt(errors, impl.key_padding_mask, np.array([p["length"]]), L) \
                if padding else None
            res = attempt(errors, impl.multi_head_attention, x, x, x, w, H,
                          key_padding_mask=kpm, is_causal=causal)
            qh, kh = (attempt(errors, impl.split_heads, provided.linear(n, x, wt, b, E), H)
                      for n, wt, b in (("w_q", w.w_q, w.b_q), ("w_k", w.w_k, w.b_k)))
            mask = None
            if kpm is not None:
                mask = attempt(errors, impl.key_padding_to_attn_mask, kpm)  # [1, 1, 1, L]
            if causal:
                cm = attempt(errors, impl.causal_mask, L, L)
                mask = cm if mask is None else (None if cm is None else mask & cm)
            heads = None
            if qh is not None and kh is not None:
                heads = attempt(errors, impl.attention_weights, qh, kh, mask)  # [1, H, L, L]
            avg = np.asarray(res[1])[0] if res is not None else None
            same = None
            if heads is not None and avg is not None:
                same = bool(np.allclose(np.asarray(heads)[0].mean(axis=0), avg))
            runs[f"{'causal' if causal else 'full'}-{'padded' if padding else 'whole'}"] = {
                "causal": causal, "padding": padding,
                "key_padding_mask": None if kpm is None else np.asarray(kpm)[0].tolist(),
                "heads": None if heads is None else rounded(np.asarray(heads)[0]),
                "average": None if avg is None else rounded(avg),
                "heads_average_to_mha": same}
    return {"inputs": p, "runs": runs}


def diff_multihead(mine: dict, ref: dict) -> dict | None:
    """The first mask setting (index in MH_RUNS) whose maps differ: a head's, else the average."""
    a, b = mine["multihead"]["runs"], ref["multihead"]["runs"]
    for n, run in enumerate(MH_RUNS):
        ha, hb = a[run]["heads"], b[run]["heads"]
        for h in range(len(hb)):
            if ha is None or not close(ha[h], hb[h]):
                return {"step": n, "page": "multihead", "run": run, "head": h, "field": "heads",
                        "yours": None if ha is None else ha[h], "reference": hb[h],
                        "where": f"multi-head page, {run}, head {h}"}
        if not close(a[run]["average"], b[run]["average"]):
            return {"step": n, "page": "multihead", "run": run, "head": "avg",
                    "field": "multi_head_attention", "yours": a[run]["average"],
                    "reference": b[run]["average"], "where": f"multi-head page, {run}, average"}
    return None


# Reference-only traces of other pages (book/pages/): name -> builder.
EXTRA = {"bahdanau": trace_bahdanau}
# The trace feeds several pages: each page shows its own first difference.
PAGE_DIFFS = {"scoring": diff_scoring, "multihead": diff_multihead}
