"""The web book's traces of this lab: Sparse patterns and LSH buckets (the lab's trace), and
cost and error against N. ``book/traces.py`` runs them (``python -m book.traces``; ``make
trace LAB=10`` on a starter): ``trace(impl)`` is this lab's trace, run on the solution or a
starter; ``diff(mine, ref)`` the first step where a starter's trace differs from the
reference's; every number a page shows is computed here by the lab's public functions.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from common.loader import load_lab_module
from common.tracing import attempt, close, rounded

HERE = pathlib.Path(__file__).resolve().parent


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
    exact = {False: attempt(errors, impl.chunked_attention, q, k, v),  # bidirectional
             True: attempt(errors, impl.sparse_attention, q, k, v, causal)}  # = dense causal
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
        mask = attempt(errors, make)
        res = attempt(errors, impl.sparse_attention, q, k, v, mask) if mask is not None else None
        m = None if mask is None else np.asarray(mask, dtype=bool)
        is_causal = m is not None and not np.triu(m, 1).any()
        ex, err = exact[is_causal], None
        if res is not None and ex is not None:  # against exact attention of the same causality
            err = float(np.linalg.norm(res[0] - ex[0]) / np.linalg.norm(ex[0]))
        out.append({"name": name, "call": call, "causal": is_causal,
                    "rows": None if m is None else ["".join("1" if x else "0" for x in r)
                                                    for r in m],
                    "pairs": None if m is None else int(m.sum()),
                    "relative_error": None if err is None else rounded(err)})
    return {"inputs": p, "patterns": out, "all_pairs": n * n}


LSH = {"n": 16, "n_buckets": 4, "rounds": 3, "seed": 3}


def trace_lsh(impl: Any, errors: list[str]) -> dict:
    """Reformer's angular LSH on 16 two-dimensional vectors (so the plane shows the
    buckets): lab 10's lsh_buckets with provided.random_rotations, per round; then, for 1, 2
    and 3 rounds, each query's lsh_mass_captured and lsh_attention's output against
    chunked_attention's (exact). A query attends the keys sharing its bucket in any round
    (here queries and keys are the same vectors, as in the Reformer's shared QK)."""
    p = LSH
    provided = load_lab_module(HERE, "provided")
    rng = np.random.default_rng(p["seed"])
    angles = np.sort(rng.uniform(0, 2 * np.pi, p["n"]))
    x = np.stack([np.cos(angles), np.sin(angles)], axis=1) * rng.uniform(0.8, 1.6, (p["n"], 1))
    x = x * 2.0  # sharper softmax: most of a query's mass is on its angular neighbours
    v = rng.standard_normal((p["n"], 2))
    rot = provided.random_rotations(2, p["n_buckets"], p["rounds"], seed=p["seed"])
    buckets = attempt(errors, impl.lsh_buckets, x, rot)  # [rounds, n]
    exact = attempt(errors, impl.chunked_attention, x, x, v)
    by_rounds = []
    for r in range(1, p["rounds"] + 1):
        mass = attempt(errors, impl.lsh_mass_captured, x, x, rot[:r])
        res = attempt(errors, impl.lsh_attention, x, x, v, rot[:r])
        err = None
        if res is not None and exact is not None:
            err = np.linalg.norm(res[0] - exact[0], axis=1) / np.linalg.norm(exact[0], axis=1)
        by_rounds.append({"rounds": r, "mass": None if mass is None else rounded(mass, 4),
                          "error": None if err is None else rounded(err, 4)})
    # the hash's regions in the plane: lab 10's lsh_buckets on unit vectors a degree apart,
    # as runs of one bucket (the page draws them as wedges and turns them round by round)
    deg = np.arange(360)
    circle = np.stack([np.cos(np.radians(deg)), np.sin(np.radians(deg))], axis=1)
    ring = attempt(errors, impl.lsh_buckets, circle, rot)  # [rounds, 360]
    regions = None
    if ring is not None:
        regions = []
        for row in np.asarray(ring):
            cuts = [a for a in range(360) if row[a] != row[a - 1]] or [0]
            regions.append([{"bucket": int(row[a]), "from": a,
                             "to": cuts[(i + 1) % len(cuts)] + (360 if i + 1 == len(cuts) else 0)}
                            for i, a in enumerate(cuts)])
    return {"inputs": p, "x": rounded(x, 4), "rotations": rounded(rot, 4),
            "buckets": None if buckets is None else np.asarray(buckets).tolist(),
            "by_rounds": by_rounds, "regions": regions}


def trace(impl: Any) -> dict:
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
        if not close(a["relative_error"], b["relative_error"]):
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
            if not close(x[field], y[field]):
                return {"step": r, "page": "lsh", "field": name, "yours": x[field],
                        "reference": y[field], "where": f"{r + 1} round{'s' if r else ''}"}
    return None


def diff(mine: dict, ref: dict) -> dict | None:
    return diff_zoo(mine, ref) or diff_lsh(mine, ref)


COMPLEXITY = {"sizes": [256, 512, 1024, 2048], "d": 16, "window": 64, "stride": 64, "block": 64,
              "summary": 8, "random": 8, "bucket_size": 32, "rounds": 2, "rank": 64,
              "features": 64,
              # beyond the measured sizes, costs only (modelled), to about a million tokens
              "model_sizes": [2 ** e for e in range(12, 21)],
              # real models' context lengths, marked on the N axis (from their papers/configs)
              "contexts": [["GPT-2", 1024, "GPT-2 config n_ctx"],
                           ["Llama 2", 4096, "Llama 2 paper (arXiv:2307.09288)"],
                           ["Llama 3.1", 131072, "Llama 3 paper (arXiv:2407.21783): 128K"],
                           ["Qwen2.5-1M", 1010000,
                            "Qwen2.5-1M report (arXiv:2501.15383): max_position_embeddings"]]}


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
    provided = load_lab_module(HERE, "provided")
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
        exact = attempt(errors, impl.chunked_attention, q, k, v)
        exact_out = None if exact is None else exact[0]
        s_bytes = attempt(errors, impl.score_matrix_bytes, n)
        put("exact", pairs=n * n, flops=4 * d * n * n, bytes=s_bytes, error=0.0, rms=0.0)
        put("chunked (exact)", pairs=n * n, flops=4 * d * n * n, bytes=2 * 64 * 64, error=0.0,
            rms=0.0)
        for name, (make, args, kw) in masks.items():
            mask = attempt(errors, make, *args, **kw)
            pairs = None if mask is None else int(np.asarray(mask).sum())
            res = (attempt(errors, impl.sparse_attention, q, k, v, mask)
                   if mask is not None else None)
            e, r = _retrieval_errors(None if res is None else res[0], exact_out)
            put(name, pairs=pairs, flops=None if pairs is None else 4 * d * pairs,
                bytes=None if pairs is None else 2 * pairs, error=e, rms=r)
        h = attempt(errors, impl.lsh_buckets, np.random.default_rng(0).standard_normal((n, d)), rot)
        pairs = None if h is None else int((h[:, :, None] == h[:, None, :]).any(axis=0).sum())
        res = attempt(errors, impl.lsh_attention, q, k, v, rot)
        e, r = _retrieval_errors(None if res is None else res[0], exact_out)
        put("LSH", pairs=pairs, flops=None if pairs is None else 4 * d * pairs,
            bytes=None if pairs is None else 2 * pairs, error=e, rms=r)
        out = attempt(errors, impl.linformer_attention, q, k, v, pool, pool)
        e, r = _retrieval_errors(out, exact_out)
        put("Linformer", pairs=n * c["rank"], flops=8 * n * c["rank"] * d,
            bytes=2 * n * c["rank"], error=e, rms=r)
        out = attempt(errors, impl.performer_attention, q, k, v, omega)
        e, r = _retrieval_errors(out, exact_out)
        put("Performer", pairs=0, flops=8 * n * d * c["features"], bytes=4 * n * c["features"],
            error=e, rms=r)
        out = attempt(errors, impl.linear_attention_parallel, q, k, v, causal=False)
        e, r = _retrieval_errors(out, exact_out)
        put("linear (elu + 1)", pairs=0, flops=8 * n * d * d, bytes=2 * (d * d + d), error=e,
            rms=r)
    methods = [{"name": name, **values} for name, values in rows.items()]  # in this order
    return {"lab": "10", "inputs": c, "methods": methods, "modelled": _modelled(impl, methods),
            "errors": errors}


def _modelled(impl: Any, methods: list[dict]) -> list[dict]:
    """Costs at ``model_sizes`` (no errors: nothing is run there). Exact and chunked as above
    (score_matrix_bytes for exact's matrix); the masks' and LSH's pairs grow linearly in N at
    these sizes (a window, a stride, buckets of a fixed size), so they are extended along the
    line through the last two measured sizes; Linformer, Performer and linear attention by
    their formulas above."""
    c = COMPLEXITY
    d, n0, n1 = c["d"], c["sizes"][-2], c["sizes"][-1]
    out = []
    for m in methods:
        row: dict[str, Any] = {"name": m["name"], "pairs": [], "flops": [], "bytes": []}
        for n in c["model_sizes"]:
            if m["name"] in ("exact", "chunked (exact)"):
                pairs, flops = n * n, 4 * d * n * n
                size = (attempt([], impl.score_matrix_bytes, n) if m["name"] == "exact"
                        else 2 * 64 * 64)
            elif m["name"] == "Linformer":
                pairs, flops, size = n * c["rank"], 8 * n * c["rank"] * d, 2 * n * c["rank"]
            elif m["name"] == "Performer":
                pairs, flops, size = 0, 8 * n * d * c["features"], 4 * n * c["features"]
            elif m["name"] == "linear (elu + 1)":
                pairs, flops, size = 0, 8 * n * d * d, 2 * (d * d + d)
            else:
                p0, p1 = m["pairs"][-2], m["pairs"][-1]
                if p0 is None or p1 is None:
                    pairs = flops = size = None
                else:
                    pairs = round(p1 + (p1 - p0) * (n - n1) / (n1 - n0))
                    flops, size = 4 * d * pairs, 2 * pairs
            row["pairs"].append(pairs)
            row["flops"].append(flops)
            row["bytes"].append(size)
        out.append(row)
    return out


# Reference-only traces of other pages (book/pages/): name -> builder.
EXTRA = {"complexity": trace_complexity}
# The trace feeds several pages: each page shows its own first difference.
PAGE_DIFFS = {"zoo": diff_zoo, "lsh": diff_lsh}
