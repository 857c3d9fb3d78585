"""Lab 10's approximations on a trained model's own q and k: ``python -m book.approximation_trace``.

Lab 10 measures its approximations on synthetic vectors (``provided.retrieval_task``: one
key planted far back, random everything else). This trace measures them on the course's
trained model (``models/adder``, the 2-layer Llama of lab 11): its real post-RoPE queries,
keys and values, caught per layer and head while it answers fixed problems (a transformers
``AttentionInterface`` function that records them and then runs transformers' own eager
attention).

- **Spectrum**: lab 10's ``attention_singular_values`` on each head's ``q``, ``k`` over the
  whole sequence (no causal mask, as the lab's function defines it), beside random ``N(0, 1)``
  vectors and lab 10's retrieval task of the same size; summarised by how many singular
  values hold 90 % of ``Σσ²``.
- **Retrieval**: for each query that predicts an answer digit, the sequence up to and
  including that query (so the query is the last row and the model's causal attention is
  exactly the unmasked attention lab 10's functions compute), each method's relative error
  of that row against ``chunked_attention`` (exact); the same for the synthetic retrieval
  task at the same length and head dim. Settings are scaled to these short sequences and
  written in the trace (``SETTINGS``).

One torch thread, fixed problems: the same file on every run. Writes
``book/viz/traces/adder-approx-reference.js`` (committed; a test checks it is current).
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from common.loader import load_impl, load_lab_module

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "adder"
NAME = "adder-approx-reference"
LAB10 = REPO / "labs" / "lab-10-approximate-attention"
PROBLEMS = [(123, 456), (999, 1), (587, 645), (250, 307)]  # book/attention_trace.py's
DIGITS = 3
SETTINGS = {"window": 3, "global": [0], "stride": 3, "buckets": 4, "rounds": 2, "rank": 4,
            "features": 64, "seed": 0}
METHODS = ("window + global", "strided", "LSH", "Linformer", "Performer", "linear (elu + 1)",
           "chunked (exact)")


def capture() -> tuple[list[dict], dict]:
    """Per problem: tokens and, per layer, q ``[H, L, d]``, k and v ``[KVH, L, d]`` (post-RoPE,
    float64), with the model's own attention weights ``[H, L, L]``; and the model's config."""
    import torch
    from transformers import AttentionInterface, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    torch.set_num_threads(1)
    seen: list[dict] = []

    def recording(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  **kw: Any) -> Any:
        out, weights = eager_attention_forward(module, query, key, value, attention_mask, **kw)
        seen.append({"q": query[0].double().numpy(), "k": key[0].double().numpy(),
                     "v": value[0].double().numpy(), "w": weights[0].double().numpy()})
        return out, weights

    AttentionInterface.register("book_recording", recording)
    AttentionMaskInterface.register("book_recording", eager_mask)  # eager's causal mask
    tok = PreTrainedTokenizerFast.from_pretrained(MODEL)
    model = LlamaForCausalLM.from_pretrained(MODEL, attn_implementation="book_recording").eval()
    runs = []
    for a, b in PROBLEMS:
        text = "<bos>" + str(a).zfill(DIGITS)[::-1] + "+" + str(b).zfill(DIGITS)[::-1] + "="
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            full = model.generate(ids, max_new_tokens=DIGITS + 2, do_sample=False)
            seen.clear()
            model(full)
        tokens = tok.convert_ids_to_tokens(full[0].tolist())
        answer = "".join(t for t in tokens if t.isdigit())[2 * DIGITS:]
        assert answer == str(a + b).zfill(DIGITS + 1)[::-1], (a, b, tokens)
        runs.append({"tokens": tokens, "layers": list(seen)})
    return runs, model.config.to_dict()


def energy_rank(sv: np.ndarray, share: float = 0.9) -> int:
    """How many of the singular values ``sv`` (largest first) hold ``share`` of ``Σσ²``."""
    e = np.cumsum(sv ** 2) / np.sum(sv ** 2)
    return int(np.searchsorted(e, share - 1e-12) + 1)


def method_rows(lab: Any, prov: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray
                ) -> dict[str, float]:
    """Each method's relative error on the last row of ``(q, k, v)`` (``[n, d]`` each),
    against lab 10's exact ``chunked_attention``."""
    s = SETTINGS
    n, d = q.shape
    exact = lab.chunked_attention(q, k, v)[0][-1]

    def rel(out: np.ndarray) -> float:
        return float(np.linalg.norm(np.asarray(out)[-1] - exact) / np.linalg.norm(exact))
    pool = prov.mean_pooling_projection(s["rank"], n)
    return {
        "window + global": rel(lab.sparse_attention(
            q, k, v, lab.window_global_mask(n, s["window"], s["global"]))[0]),
        "strided": rel(lab.sparse_attention(
            q, k, v, lab.strided_mask(n, s["stride"], causal=False))[0]),
        "LSH": rel(lab.lsh_attention(
            q, k, v, prov.random_rotations(d, s["buckets"], s["rounds"], s["seed"]))[0]),
        "Linformer": rel(lab.linformer_attention(q, k, v, pool, pool)),
        "Performer": rel(lab.performer_attention(
            q, k, v, prov.performer_omega(d, s["features"], seed=s["seed"]))),
        "linear (elu + 1)": rel(lab.linear_attention_parallel(q, k, v, causal=False)),
        "chunked (exact)": rel(lab.chunked_attention(q, k, v, 4, 4)[0]),
    }


def _r(x: float) -> float:
    return float(f"{x:.3g}")


def build() -> dict:
    lab = load_impl(LAB10, "solution")
    prov = load_lab_module(LAB10, "provided")
    runs, cfg = capture()
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kvh = cfg["num_key_value_heads"]
    group = heads // kvh
    d = cfg["head_dim"]
    spectrum, retrieval, check = [], [], 0.0
    for layer in range(layers):
        for h in range(heads):
            sv_runs, err = [], {m: [] for m in METHODS}
            for run in runs:
                rec = run["layers"][layer]
                q, k, v = rec["q"][h], rec["k"][h // group], rec["v"][h // group]
                sv = lab.attention_singular_values(q, k)
                sv_runs.append(sv / sv[0])
                eq = run["tokens"].index("=")
                for i in range(eq, eq + DIGITS + 1):  # the queries that predict answer digits
                    qi, ki, vi = q[: i + 1], k[: i + 1], v[: i + 1]
                    exact = lab.chunked_attention(qi, ki, vi)[0][-1]
                    model_row = rec["w"][h][i, : i + 1] @ vi  # the model's own weights
                    check = max(check, float(np.abs(exact - model_row).max()))
                    for m, e in method_rows(lab, prov, qi, ki, vi).items():
                        err[m].append(e)
            sv_mean = np.mean(sv_runs, axis=0)
            spectrum.append({"layer": layer, "head": h, "sv": [_r(x) for x in sv_mean],
                             "rank90": energy_rank(sv_mean)})
            retrieval.append({"layer": layer, "head": h,
                              "error": {m: _r(float(np.mean(e))) for m, e in err.items()}})
    assert check < 1e-5, f"lab 10's exact attention differs from the model's by {check}"
    n = len(runs[0]["tokens"])
    rng = np.random.default_rng(SETTINGS["seed"])
    rand_q, rand_k = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    sv_rand = lab.attention_singular_values(rand_q, rand_k)
    tq, tk, tv, _ = prov.retrieval_task(n, d, seed=SETTINGS["seed"])
    sv_task = lab.attention_singular_values(tq, tk)
    synthetic = {}
    for length in range(runs[0]["tokens"].index("=") + 1, n):  # the same prefix lengths
        tq, tk, tv, _ = prov.retrieval_task(max(8, length), d, seed=SETTINGS["seed"])
        for m, e in method_rows(lab, prov, tq, tk, tv).items():
            synthetic.setdefault(m, []).append(e)
    return {
        "model": "models/adder", "problems": PROBLEMS, "layers": layers, "heads": heads,
        "kv_heads": kvh, "head_dim": d, "seq_len": n, "settings": SETTINGS,
        "methods": list(METHODS), "checked": float(f"{check:.1e}"),
        "spectrum": spectrum, "retrieval": retrieval,
        "synthetic": {
            "random_sv": [_r(x) for x in sv_rand / sv_rand[0]],
            "random_rank90": energy_rank(sv_rand / sv_rand[0]),
            "task_sv": [_r(x) for x in sv_task / sv_task[0]],
            "task_rank90": energy_rank(sv_task / sv_task[0]),
            "task_error": {m: _r(float(np.mean(e))) for m, e in synthetic.items()}},
    }


def main(argv: list[str] | None = None) -> int:
    from book.traces import model_trace_main

    return model_trace_main(NAME, build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
