"""Train a tiny encoder-decoder with Bahdanau (additive) attention on date conversion.

    python -m models.bahdanau                # writes models/dates/ (seeded: same bytes each run)
    python -m models.bahdanau --steps 100    # a quick look (the accuracy will be poor)

The task is generated in code and its alignment is known: an ISO date ``2024-03-17`` is
rewritten day first, ``17.03.2024``. Output character ``i`` is a copy of one source character
(``EXPECTED_SOURCE``), in a new order: the day's two digits come from the end of the source,
the year's four from its start. That is the reordering of Bahdanau, Cho and Bengio's
alignment figure (arXiv 1409.0473), on a task where every cell of the right answer is known.

The model is the paper's, shrunk: a bidirectional GRU encoder gives one state ``h_j`` per
source character; at output step ``i`` the decoder state ``s_{i-1}`` scores every ``h_j`` with
``e[i, j] = v_a · tanh(s_{i-1} W_q + h_j W_k)`` (no bias: lab 08's ``additive_scores``), a
softmax over ``j`` gives ``α[i, ·]``, and the context ``c_i = Σ_j α[i, j] h_j`` feeds the GRU
decoder cell and the output layer. Held-out dates (every date whose day number is a multiple
of 7) are never drawn for training. One torch thread; the folder it writes holds
``config.json``, ``model.safetensors``, ``train_log.txt`` and ``accuracy.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
OUT = HERE / "dates"

SPECIALS = ["<pad>", "<bos>", "<eos>"]
CHARS = list("0123456789-.")
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
PAD, BOS, EOS = VOCAB["<pad>"], VOCAB["<bos>"], VOCAB["<eos>"]
SOURCE_LEN = 10  # YYYY-MM-DD
TARGET_LEN = 11  # DD.MM.YYYY <eos>
# Output character i copies source character EXPECTED_SOURCE[i] ("2024-03-17" -> "17.03.2024").
EXPECTED_SOURCE = (8, 9, 7, 5, 6, 4, 0, 1, 2, 3)
FIRST, LAST = datetime.date(1900, 1, 1).toordinal(), datetime.date(2099, 12, 31).toordinal()

CONFIG = dict(vocab=SPECIALS + CHARS, embed=16, encoder_hidden=32, decoder_hidden=64,
              attention=32, source_len=SOURCE_LEN, target_len=TARGET_LEN)


def source_text(day: datetime.date) -> str:
    """``2024-03-17``."""
    return day.isoformat()


def target_text(day: datetime.date) -> str:
    """``17.03.2024``: the answer (day, month, year)."""
    return day.strftime("%d.%m.%Y")


def held_out(day: datetime.date) -> bool:
    """Dates the training batches never draw: those whose day number is a multiple of 7."""
    return day.toordinal() % 7 == 0


def encode(text: str) -> list[int]:
    return [VOCAB[c] for c in text]


def draw(rng: np.random.Generator, n: int, held: bool) -> list[datetime.date]:
    """``n`` random dates in 1900-2099, all held out (``held``) or all not."""
    out: list[datetime.date] = []
    while len(out) < n:
        day = datetime.date.fromordinal(int(rng.integers(FIRST, LAST + 1)))
        if held_out(day) == held:
            out.append(day)
    return out


def tensors(days: list[datetime.date]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(source [n, 10], target [n, 11])`` token ids; the target ends in ``<eos>``."""
    src = torch.tensor([encode(source_text(d)) for d in days])
    tgt = torch.tensor([encode(target_text(d)) + [EOS] for d in days])
    return src, tgt


class AdditiveAttention(nn.Module):
    """``e[i, j] = v_a · tanh(s W_q + h_j W_k)``, softmax over ``j``, context ``Σ α h``."""

    def __init__(self, d_dec: int, d_enc: int, d_att: int) -> None:
        super().__init__()
        self.w_q = nn.Linear(d_dec, d_att, bias=False)
        self.w_k = nn.Linear(d_enc, d_att, bias=False)
        self.v_a = nn.Linear(d_att, 1, bias=False)

    def forward(self, s: torch.Tensor, h: torch.Tensor, hk: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """s ``[B, d_dec]``, h ``[B, S, d_enc]``, hk = h W_k ``[B, S, d_att]`` ->
        (context ``[B, d_enc]``, alpha ``[B, S]``)."""
        e = self.v_a(torch.tanh(self.w_q(s)[:, None, :] + hk)).squeeze(-1)  # [B, S]
        alpha = torch.softmax(e, dim=-1)
        return torch.einsum("bs,bsd->bd", alpha, h), alpha


class DateModel(nn.Module):
    """Bidirectional GRU encoder, additive attention, GRU decoder cell (Bahdanau et al.)."""

    def __init__(self, vocab: list[str], embed: int, encoder_hidden: int, decoder_hidden: int,
                 attention: int, **_: int) -> None:
        super().__init__()
        d_enc = 2 * encoder_hidden
        self.embed = nn.Embedding(len(vocab), embed)
        self.encoder = nn.GRU(embed, encoder_hidden, batch_first=True, bidirectional=True)
        self.init = nn.Linear(encoder_hidden, decoder_hidden)  # s_0 from the backward state
        self.attention = AdditiveAttention(decoder_hidden, d_enc, attention)
        self.decoder = nn.GRUCell(embed + d_enc, decoder_hidden)
        self.out = nn.Linear(decoder_hidden + d_enc + embed, len(vocab))
        self.encoder_hidden = encoder_hidden

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src ``[B, S]`` -> (encoder states h ``[B, S, 2·enc]``, s_0 ``[B, dec]``)."""
        h, _ = self.encoder(self.embed(src))
        backward_first = h[:, 0, self.encoder_hidden:]
        return h, torch.tanh(self.init(backward_first))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor | None = None, steps: int = TARGET_LEN
                ) -> dict[str, torch.Tensor]:
        """Teacher-forced when ``tgt`` is given, greedy otherwise. Returns ``logits
        [B, T, V]``, ``alpha [B, T, S]``, the queries ``s_prev [B, T, dec]`` (the state each
        step's attention scored with), ``h [B, S, 2·enc]`` and the tokens ``[B, T]``."""
        h, s = self.encode(src)
        hk = self.attention.w_k(h)
        prev = torch.full((src.shape[0],), BOS, dtype=torch.long)
        logits, alphas, queries, tokens = [], [], [], []
        for i in range(tgt.shape[1] if tgt is not None else steps):
            queries.append(s)
            c, alpha = self.attention(s, h, hk)
            y = self.embed(prev)
            s = self.decoder(torch.cat([y, c], dim=-1), s)
            logit = self.out(torch.cat([s, c, y], dim=-1))
            logits.append(logit)
            alphas.append(alpha)
            tokens.append(logit.argmax(-1))
            prev = tgt[:, i] if tgt is not None else tokens[-1]
        return {"logits": torch.stack(logits, 1), "alpha": torch.stack(alphas, 1),
                "s_prev": torch.stack(queries, 1), "h": h, "tokens": torch.stack(tokens, 1)}


def decode(ids: list[int]) -> str:
    """Token ids up to the first ``<eos>`` as text."""
    chars = SPECIALS + CHARS
    out = []
    for i in ids:
        if i == EOS:
            break
        out.append(chars[i])
    return "".join(out)


@torch.no_grad()
def accuracy(model: DateModel, days: list[datetime.date]) -> tuple[float, float]:
    """(share of exact greedy answers, share of output digits whose largest attention
    weight is on the source character they copy)."""
    src, tgt = tensors(days)
    run = model(src)
    exact = float((run["tokens"] == tgt).all(dim=1).float().mean())
    want = torch.tensor(EXPECTED_SOURCE)
    digits = [i for i, j in enumerate(EXPECTED_SOURCE) if source_text(days[0])[j].isdigit()]
    argmax = run["alpha"][:, : len(EXPECTED_SOURCE)].argmax(-1)  # [B, 10]
    aligned = float((argmax[:, digits] == want[digits]).float().mean())
    return exact, aligned


def load(folder: Path = OUT) -> DateModel:
    """The trained model from ``folder`` (config.json + model.safetensors), in eval mode."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    model = DateModel(**config)
    model.load_state_dict(load_file(folder / "model.safetensors"))
    return model.eval()


def train(steps: int, seed: int, batch_size: int, lr: float, out: Path) -> None:
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng([seed, 0])
    model = DateModel(**CONFIG)
    optim = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=lr, total_steps=steps,
                                                pct_start=0.1)
    test = draw(np.random.default_rng([seed, 1]), 2000, held=True)
    n_params = sum(p.numel() for p in model.parameters())
    log = [f"# models/bahdanau.py --steps {steps} --seed {seed} --batch-size {batch_size} "
           f"--lr {lr}", f"# torch {torch.__version__}, 1 thread, {platform.machine()}",
           f"# {n_params} parameters", "step loss lr"]
    start = time.process_time()
    for step in range(1, steps + 1):
        src, tgt = tensors(draw(rng, batch_size, held=False))
        logits = model(src, tgt)["logits"]
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        if step % 50 == 0 or step == steps:
            log.append(f"{step} {loss.item():.4f} {sched.get_last_lr()[0]:.2e}")
            print(log[-1], flush=True)
    model.eval()
    exact, aligned = accuracy(model, test)
    cpu = time.process_time() - start
    log.append(f"# held-out exact answers: {exact:.4f} of {len(test)}; argmax attention on the "
               f"copied source digit: {aligned:.4f}; {cpu:.0f} s CPU")
    print(log[-1])
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")
    (out / "train_log.txt").write_text("\n".join(log) + "\n")
    (out / "accuracy.txt").write_text(
        "# captured by `make model-dates` (python -m models.bahdanau) on this repository's CPU "
        f"stack:\n# torch {torch.__version__}, one thread; seed {seed}; {steps} steps; "
        f"{cpu:.0f} s CPU time (machine-dependent)\n"
        + json.dumps({"held_out_dates": len(test), "exact": round(exact, 4),
                      "argmax_on_copied_digit": round(aligned, 4),
                      "task": "YYYY-MM-DD -> DD.MM.YYYY; held out: ordinal % 7 == 0"}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    train(args.steps, args.seed, args.batch_size, args.lr, args.out)


if __name__ == "__main__":
    main()
