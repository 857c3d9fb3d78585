"""The trained model's real attention, for the book: ``python -m book.attention_trace``.

Runs the course's model (``models/adder/``: a 2-layer Llama, 4 query heads over 2 KV heads,
trained by ``make model`` on 3-digit addition) on a few fixed problems, lets it write its own
answer (greedy), then reads every layer's and head's attention weights over the whole
sequence (transformers' eager attention, ``output_attentions=True``). It then *measures*
each head instead of naming one by eye:

- previous-token mass: the mean weight a query puts on the token just before it;
- aligned-digit mass: for each query that predicts answer digit ``k`` (the ``=`` or the
  previous answer digit), the weight on the two operand digits of place ``k`` (``a_k`` and
  ``b_k``, the digits that answer digit adds), averaged over places 0-2;
- carry mass: the same for the digits of place ``k - 1`` (what decides a carry into ``k``).

The heads with the largest scores are the page's named heads. One torch thread, the model
in eval mode and fixed problems: the same trace on every run. It writes
``book/viz/traces/adder-reference.js`` (committed, like the labs' reference traces; a test
fails when it is stale where torch and transformers are installed).
"""

from __future__ import annotations

import pathlib

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "adder"
NAME = "adder-reference"
# (a, b): no carry, carries in every place, a carry into the fourth digit, zeros
PROBLEMS = [(123, 456), (999, 1), (587, 645), (250, 307)]
DIGITS = 3  # models/train.py: 3-digit operands, written least-significant digit first


def prompt(a: int, b: int) -> str:
    """``<bos>321+654=`` for 123 + 456 (models/train.py's format: digits reversed)."""
    return "<bos>" + str(a).zfill(DIGITS)[::-1] + "+" + str(b).zfill(DIGITS)[::-1] + "="


def build() -> dict:
    """The trace: tokens, weights [layer][head][query][key] per problem, head scores."""
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = PreTrainedTokenizerFast.from_pretrained(MODEL)
    model = LlamaForCausalLM.from_pretrained(MODEL, attn_implementation="eager").eval()
    cfg = model.config
    runs = []
    scores = np.zeros((3, cfg.num_hidden_layers, cfg.num_attention_heads))
    for a, b in PROBLEMS:
        ids = torch.tensor([tok.encode(prompt(a, b))])
        with torch.no_grad():
            full = model.generate(ids, max_new_tokens=DIGITS + 2, do_sample=False)
            att = model(full, output_attentions=True).attentions  # layers x [1, H, L, L]
        w = np.stack([x[0].double().numpy() for x in att])  # [layers, heads, L, L]
        tokens = tok.convert_ids_to_tokens(full[0].tolist())
        n = len(tokens)
        eq = tokens.index("=")
        prev = np.mean([w[:, :, i, i - 1] for i in range(1, n)], axis=0)
        aligned = np.mean([w[:, :, eq + k, 1 + k] + w[:, :, eq + k, eq - DIGITS + k]
                           for k in range(DIGITS)], axis=0)
        carry = np.mean([w[:, :, eq + k, k] + w[:, :, eq + k, eq - DIGITS + k - 1]
                         for k in range(1, DIGITS)], axis=0)
        scores += np.stack([prev, aligned, carry]) / len(PROBLEMS)
        answer = "".join(t for t in tokens[eq + 1:] if t.isdigit())
        runs.append({"a": a, "b": b, "tokens": tokens, "answer_lsb_first": answer,
                     "correct": answer == str(a + b).zfill(DIGITS + 1)[::-1],
                     "weights": np.round(w, 3).tolist()})
    names = ["previous token", "aligned digits", "carry digits"]
    found = {}
    for s, name in enumerate(names):
        layer, head = np.unravel_index(int(np.argmax(scores[s])), scores[s].shape)
        found[name] = {"layer": int(layer), "head": int(head),
                       "score": round(float(scores[s][layer, head]), 4)}
    return {"model": "models/adder", "layers": cfg.num_hidden_layers,
            "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "problems": PROBLEMS, "runs": runs,
            "score_names": names, "scores": np.round(scores, 4).tolist(), "found": found}


def main(argv: list[str] | None = None) -> int:
    from book.traces import model_trace_main

    return model_trace_main(NAME, build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
