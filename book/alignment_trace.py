"""A trained Bahdanau model's alignment, for the book: ``python -m book.alignment_trace``.

Runs the course's date-conversion model (``models/dates/``, trained by ``make model-dates``:
a bidirectional GRU encoder, additive attention, a GRU decoder; ``models/bahdanau.py``) on
fixed dates it never saw in training, greedy. For every output step it keeps the decoder
state that queried the encoder (``s_{i-1}``) and the encoder states ``h``, then computes the
step's scores and weights with **lab 08's** ``additive_scores`` and ``softmax`` on the
model's own weights (``W_q``, ``W_k``, ``v_a``), and checks they equal what the model used.
Beside each learned map it puts the expected one (output character ``i`` copies source
character ``EXPECTED_SOURCE[i]``), and it measures the whole held-out set: the mean weight on
the copied character and how often it is the largest weight, per output position.

One torch thread, eval mode, fixed dates: the same file on every run (the largest difference
from the model's weights is stored as the power of ten above it: its digits vary with the
CPU). It writes ``book/viz/traces/dates-reference.js`` (committed; a test fails when it is
stale where torch is installed).
"""

from __future__ import annotations

import datetime
import math
import pathlib

import numpy as np

from common.loader import load_impl
from common.tracing import rounded


def decade_above(x: float) -> float:
    """The smallest power of ten that is at least ``x`` (``3.4e-07`` -> ``1e-06``)."""
    return float(f"1e{math.ceil(math.log10(x)) if x > 0 else -16}")

REPO = pathlib.Path(__file__).resolve().parent.parent
NAME = "dates-reference"
LAB08 = REPO / "labs" / "lab-08-attention-from-scratch"
# Dates the model never trained on (their day number is a multiple of 7, models/bahdanau.py).
DATES = ("2024-03-17", "1969-07-20", "1999-12-26", "2000-02-27")


def build() -> dict:
    """Per date: source, the model's answer, weights and scores [output][source] (lab 08's
    functions on the model's states), the expected source per output; and the held-out
    set's alignment, measured."""
    import torch

    from models import bahdanau as mb

    torch.set_num_threads(1)
    lab = load_impl(LAB08, "solution")
    model = mb.load()
    w_q = model.attention.w_q.weight.detach().double().numpy().T  # [dec, att]
    w_k = model.attention.w_k.weight.detach().double().numpy().T  # [enc, att]
    v_a = model.attention.v_a.weight.detach().double().numpy()[0]  # [att]
    days = [datetime.date.fromisoformat(d) for d in DATES]
    assert all(mb.held_out(d) for d in days), "the page's dates must be held out"
    src, tgt = mb.tensors(days)
    with torch.no_grad():
        run = model(src)
    runs, worst = [], 0.0
    for b, day in enumerate(days):
        s_prev = run["s_prev"][b].double().numpy()  # [T, dec]
        h = run["h"][b].double().numpy()  # [S, enc]
        e = lab.additive_scores(s_prev, h, w_q, w_k, v_a)  # [T, S]
        alpha = lab.softmax(e)
        worst = max(worst, float(np.abs(alpha - run["alpha"][b].double().numpy()).max()))
        answer = mb.decode(run["tokens"][b].tolist())
        runs.append({"source": mb.source_text(day), "answer": answer,
                     "correct": answer == mb.target_text(day), "held_out": mb.held_out(day),
                     "weights": rounded(alpha, 3), "scores": rounded(e, 3)})
    assert worst < 1e-5, f"lab 08's additive_scores differ from the model's weights by {worst}"
    test = mb.draw(np.random.default_rng([0, 1]), 2000, held=True)
    src, tgt = mb.tensors(test)
    with torch.no_grad():
        held = model(src)
    alpha = held["alpha"][:, : len(mb.EXPECTED_SOURCE)].double().numpy()  # [n, 10, S]
    idx = np.array(mb.EXPECTED_SOURCE)
    on_copied = alpha[:, np.arange(len(idx)), idx]  # [n, 10]
    is_max = alpha.argmax(-1) == idx
    digit = [i for i, j in enumerate(idx) if mb.source_text(test[0])[j].isdigit()]
    exact = float((held["tokens"] == tgt).all(dim=1).float().mean())
    return {"model": "models/dates", "task": "YYYY-MM-DD -> DD.MM.YYYY",
            "config": {k: v for k, v in mb.CONFIG.items() if k != "vocab"},
            "expected_source": list(mb.EXPECTED_SOURCE), "runs": runs,
            "checked_with": "lab 08 additive_scores + softmax",
            # a bound, not the difference itself: its last digits depend on the CPU's SIMD
            "max_abs_diff_below": decade_above(worst),
            "held_out": {"dates": len(test), "exact": round(exact, 4),
                         "mass_on_copied": rounded(on_copied.mean(0), 3),
                         "argmax_is_copied": rounded(is_max.mean(0), 3),
                         "digits_mass": round(float(on_copied[:, digit].mean()), 3),
                         "digits_argmax": round(float(is_max[:, digit].mean()), 4)}}


def main(argv: list[str] | None = None) -> int:
    from book.traces import model_trace_main

    return model_trace_main(NAME, build, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
