"""The web book's traces of this lab: Bytes of KV cache per token (the lab's trace), and a
sliding window's receptive field. ``book/traces.py`` runs them (``python -m book.traces``;
``make trace LAB=06`` on a starter): ``trace(impl)`` is this lab's trace, run on the
solution or a starter; every number a page shows is computed here by the lab's public
functions.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from common.loader import load_lab_module
from common.tracing import attempt

HERE = pathlib.Path(__file__).resolve().parent


def trace(impl: Any) -> dict:
    """kv_bytes_per_token for each of the lab's model presets, and for each attention kind
    on that preset's own shape (its layers, heads and head dim; GQA with its K/V heads, or
    8; MLA with its latent and rope dims, or DeepSeek-V3's 512 + 64); pages multiply by the
    context length (bytes per request)."""
    provided = load_lab_module(HERE, "provided")
    errors: list[str] = []
    presets = []
    for mdl in provided.MODELS:
        b = attempt(errors, impl.kv_bytes_per_token, mdl.kind, mdl.num_layers, mdl.head_dim,
                    mdl.num_heads, num_kv_heads=mdl.num_kv_heads, kv_lora_rank=mdl.kv_lora_rank,
                    rope_dim=mdl.rope_dim)
        shape = {"kv_heads": mdl.num_kv_heads or 8, "kv_lora_rank": mdl.kv_lora_rank or 512,
                 "rope_dim": mdl.rope_dim or 64}
        kinds = []
        for kind in ("mha", "gqa", "mqa", "mla"):
            kb = attempt(errors, impl.kv_bytes_per_token, kind, mdl.num_layers, mdl.head_dim,
                         mdl.num_heads, num_kv_heads=shape["kv_heads"] if kind == "gqa" else None,
                         kv_lora_rank=shape["kv_lora_rank"] if kind == "mla" else None,
                         rope_dim=shape["rope_dim"] if kind == "mla" else None)
            kinds.append({"kind": kind, "bytes_per_token": kb})
        presets.append({"name": mdl.name, "kind": mdl.kind, "layers": mdl.num_layers,
                        "head_dim": mdl.head_dim, "heads": mdl.num_heads,
                        "kv_heads": mdl.num_kv_heads, "kv_lora_rank": mdl.kv_lora_rank,
                        "rope_dim": mdl.rope_dim, "window": mdl.window, "source": mdl.source,
                        "bytes_per_token": b, "shape": shape, "kinds": kinds})
    return {"lab": "06", "presets": presets, "errors": errors}


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
            res = attempt(errors, impl.window_decode_attention, q, k_cache, v_cache, table,
                          t + 1, w)
            weights = np.asarray(res[0][0]) if res is not None else np.zeros(n)
            one_layer.append([j for j in range(n) if weights[j] > 0])
        layers = [sorted(set(one_layer[n - 1]))]
        for _ in range(p["layers"] - 1):
            layers.append(sorted({j for i in layers[-1] for j in one_layer[i]}))
        out[str(w)] = {"one_layer": one_layer, "receptive_field": layers}
    return {"lab": "06", "inputs": p, "windows": out, "errors": errors}


# Reference-only traces of other pages (book/pages/): name -> builder.
EXTRA = {"window": trace_window}
