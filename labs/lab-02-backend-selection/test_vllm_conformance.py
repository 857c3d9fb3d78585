"""Conformance: the lab's selector against the real vLLM 0.33.0 package (``make vllm-check``).

These tests import vLLM's own backend classes and ``_get_backend_priorities`` and ask
them the same questions as the lab, on a matrix of configurations and GPUs. They skip
where vllm is not importable (``make test`` never installs it); ``make vllm-check``
builds ``.venv-vllm`` with vllm==0.33.0 (CPU torch, ``--no-deps``) and runs them.

vLLM's checks ask the *running* GPU some questions (which FlashAttention version loads,
whether the FlashMLA extension loads). There is no GPU here, so the harness below makes
vLLM believe it runs on a CUDA GPU of a chosen compute capability with the wheel's
kernels present, which is exactly the machine the lab models:

* ``current_platform`` is a ``CudaPlatformBase`` whose ``get_device_capability`` returns
  the capability under test (no driver is touched);
* ``vllm._C_stable_libtorch`` (imported by cuda.py, needs libcuda) is an empty module;
* the compiled FlashAttention 2/3 and FlashMLA extensions count as loaded, the FA4
  cute-DSL entry point and the ``tokenspeed_mla`` package as importable;
* ``VLLM_HAS_FLASHINFER_CUBIN=1``: FlashInfer's TRTLLM cubins are present;
* a current vLLM config with the model's head size, KV-cache dtype and HF MLA fields.

Everything vLLM decides from there on is vLLM's own code. Nothing of vLLM is copied here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import itertools
import json
import os
import pathlib
import sys
import types

import pytest

from common import load_impl

pytest.importorskip("vllm", reason="vllm is not installed: run `make vllm-check`")
pytestmark = pytest.mark.vllm

impl = load_impl(__file__)
HERE = pathlib.Path(__file__).resolve().parent
MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_topk")
CAPABILITIES = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)]


# ---- the emulated GPU ----------------------------------------------------------------------


@functools.cache
def vllm_env() -> types.SimpleNamespace:
    """Import vLLM behind an emulated CUDA platform (once per session)."""
    os.environ["VLLM_HAS_FLASHINFER_CUBIN"] = "1"
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    import torch
    import vllm
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    class EmulatedCudaPlatform(CudaPlatformBase):
        capability = DeviceCapability(9, 0)

        @classmethod
        def get_device_capability(cls, device_id=0):
            return cls.capability

        @classmethod
        def get_device_name(cls, device_id=0):
            return f"emulated sm_{cls.capability.major}{cls.capability.minor}"

        @classmethod
        def import_kernels(cls):
            pass

        @classmethod
        def num_compute_units(cls, device_id=0):
            return 132

    platforms._current_platform = EmulatedCudaPlatform()

    # The FlashAttention package: its __init__ refuses to import without the CUDA .so files,
    # so stand in for the package and load its real flash_attn_interface.py underneath.
    fa_dir = pathlib.Path(vllm.__file__).parent / "vllm_flash_attn"
    package = types.ModuleType("vllm.vllm_flash_attn")
    package.__path__ = [str(fa_dir)]

    def _no_kernel(*args, **kwargs):
        raise RuntimeError("emulated GPU: no kernel runs here")

    for name in (
        "flash_attn_varlen_func",
        "get_scheduler_metadata",
        "compile_flash_attn_varlen_func_from_specs",
        "flash_attn_with_kvcache",
    ):
        setattr(package, name, _no_kernel)
    sys.modules["vllm.vllm_flash_attn"] = package
    cute = types.ModuleType("vllm.vllm_flash_attn.cute")
    cute.__path__ = []
    cute_interface = types.ModuleType("vllm.vllm_flash_attn.cute.interface")
    cute_interface._flash_attn_fwd = _no_kernel
    sys.modules["vllm.vllm_flash_attn.cute"] = cute
    sys.modules["vllm.vllm_flash_attn.cute.interface"] = cute_interface
    fai = importlib.import_module("vllm.vllm_flash_attn.flash_attn_interface")
    fai.FA2_AVAILABLE = fai.FA3_AVAILABLE = True  # the wheel ships both .so files
    sys.modules.setdefault("tokenspeed_mla", types.ModuleType("tokenspeed_mla"))

    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    real_empty = torch.empty

    def empty_on_meta(*args, **kwargs):  # cutlass_mla.py allocates a CUDA workspace at import
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return real_empty(*args, **kwargs)

    classes = {}
    torch.empty = empty_on_meta
    try:
        for name in impl.load_facts()["backends"]:
            classes[name] = AttentionBackendEnum[name].get_class()
    finally:
        torch.empty = real_empty
    flashmla_ops = importlib.import_module("vllm.v1.attention.ops.flashmla")
    flashmla_ops._flashmla_C_AVAILABLE = flashmla_ops._flashmla_extension_C_AVAILABLE = True

    from vllm.config.attention import AttentionConfig
    from vllm.platforms import cuda
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return types.SimpleNamespace(
        vllm=vllm,
        torch=torch,
        platform=EmulatedCudaPlatform,
        cuda=cuda,
        classes=classes,
        DeviceCapability=DeviceCapability,
        AttentionBackendEnum=AttentionBackendEnum,
        AttentionConfig=AttentionConfig,
        AttentionType=AttentionType,
        AttentionSelectorConfig=AttentionSelectorConfig,
    )


def _clear_platform_caches() -> None:
    for module_name in ("vllm.utils.flashinfer", "vllm.v1.attention.backends.fa_utils"):
        module = sys.modules.get(module_name)
        for value in vars(module).values() if module else ():
            if hasattr(value, "cache_clear") and getattr(value, "__module__", "") == module_name:
                value.cache_clear()


def _full(config: dict) -> dict:
    return {
        "kv_cache_dtype": "auto",
        "block_size": None,
        "use_mla": False,
        "has_sink": False,
        "has_sliding_window": False,
        "use_sparse": False,
        **config,
    }


@functools.cache
def _default_attention_config():
    return vllm_env().AttentionConfig()


@contextlib.contextmanager
def on_gpu(capability: tuple[int, int], config: dict):
    """vLLM sees a GPU of ``capability`` and a current config for this model."""
    env = vllm_env()
    cfg = _full(config)
    env.platform.capability = env.DeviceCapability(*capability)
    _clear_platform_caches()
    hf = types.SimpleNamespace(**{k: cfg[k] for k in MLA_FIELDS if cfg.get(k) is not None})
    num_heads = cfg.get("num_heads") or 32
    model = types.SimpleNamespace(
        hf_text_config=hf,
        is_diffusion=False,
        is_mm_prefix_lm=False,
        rswa_window=None,
        get_head_size=lambda: cfg["head_size"],
        get_num_attention_heads=lambda parallel: num_heads,
        get_num_kv_heads=lambda parallel: cfg.get("num_kv_heads") or num_heads,
    )
    fake = types.SimpleNamespace(
        model_config=model,
        cache_config=types.SimpleNamespace(
            cache_dtype=cfg["kv_cache_dtype"],
            block_size=cfg["block_size"] or 16,
            user_specified_block_size=cfg["block_size"] is not None,
        ),
        parallel_config=types.SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        attention_config=_default_attention_config(),
        speculative_config=None,
        kv_transfer_config=None,
    )
    vllm_config_module = sys.modules["vllm.config.vllm"]
    previous = vllm_config_module._current_vllm_config
    vllm_config_module._current_vllm_config = fake
    try:
        yield env
    finally:
        vllm_config_module._current_vllm_config = previous


def vllm_reasons(backends: list[str], capability, config: dict) -> dict[str, list[str] | str]:
    """``validate_configuration`` of each backend's own class (or the exception it raised)."""
    cfg = _full(config)
    out = {}
    with on_gpu(capability, cfg) as env:
        for backend in backends:
            try:
                out[backend] = env.classes[backend].validate_configuration(
                    **selector_fields(env, cfg),
                    use_mm_prefix=False,
                    use_per_head_quant_scales=False,
                    device_capability=env.DeviceCapability(*capability),
                    attn_type=env.AttentionType.DECODER,
                )
            except AttributeError as e:  # vLLM reads an HF field this model does not have
                out[backend] = f"AttributeError: {e}"
    return out


def selector_fields(env, cfg: dict) -> dict:
    """The fields vLLM's ``AttentionSelectorConfig`` and ``validate_configuration`` share."""
    fields = ("head_size", "kv_cache_dtype", "block_size", "use_mla", "has_sink", "use_sparse",
              "has_sliding_window")
    return {name: cfg[name] for name in fields} | {"dtype": getattr(env.torch, cfg["dtype"])}


def selector_config(env, cfg: dict):
    return env.AttentionSelectorConfig(**selector_fields(env, cfg))


def vllm_select(capability, config: dict, override: str | None = None) -> str:
    """``CudaPlatformBase.get_attn_backend_cls``: the chosen enum name, or raises."""
    cfg = _full(config)
    with on_gpu(capability, cfg) as env:
        selected = env.AttentionBackendEnum[override] if override else None
        path = env.platform.get_attn_backend_cls(
            selected, attn_selector_config=selector_config(env, cfg), num_heads=cfg.get("num_heads")
        )
    by_path = {m.value: m.name for m in env.AttentionBackendEnum}
    return by_path[path]


# ---- the matrix of configurations -----------------------------------------------------------

DEEPSEEK_V3 = {
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_heads": 128,
}
MLA_MODELS = {
    "deepseek-v3": DEEPSEEK_V3,
    "deepseek-v3.2 (index_topk)": {**DEEPSEEK_V3, "index_topk": 2048},
    "few heads, topk 1024": {**DEEPSEEK_V3, "index_topk": 1024, "num_heads": 16},
    "nope 96": {**DEEPSEEK_V3, "qk_nope_head_dim": 96, "index_topk": 2048},
    "no HF MLA fields": {"num_heads": 128},
    "rope-free 512": {
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 256,
        "qk_rope_head_dim": 0,
        "v_head_dim": 256,
        "num_heads": 64,
        "index_topk": 512,
    },
}


def dense_configs():
    for head, dtype, kv, block, sink, window in itertools.product(
        (64, 80, 96, 128, 192, 256, 512),
        ("float16", "bfloat16", "float32"),
        ("auto", "bfloat16", "fp8", "fp8_e5m2", "nvfp4", "turboquant_k8v4"),
        (None, 16, 64, 128, 8),
        (False, True),
        (False, True),
    ):
        yield {
            "head_size": head,
            "dtype": dtype,
            "kv_cache_dtype": kv,
            "block_size": block,
            "has_sink": sink,
            "has_sliding_window": window,
            "num_heads": 32,
            "num_kv_heads": 8,
        }


def mla_configs():
    for head, dtype, kv, block, sparse, model in itertools.product(
        (512, 576),
        ("float16", "bfloat16"),
        ("auto", "fp8", "fp8_ds_mla", "nvfp4_ds_mla"),
        (None, 16, 32, 64, 128),
        (False, True),
        MLA_MODELS,
    ):
        yield {
            "head_size": head,
            "dtype": dtype,
            "kv_cache_dtype": kv,
            "block_size": block,
            "use_mla": True,
            "use_sparse": sparse,
            **MLA_MODELS[model],
        }


def _summary(line: str) -> None:
    path = os.environ.get("LAB02_CONFORMANCE_SUMMARY")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    print(line)


# ---- the tests ---------------------------------------------------------------------------------


@pytest.mark.points(1)
def test_the_installed_vllm_is_0_33_0_and_has_no_VLLM_ATTENTION_BACKEND_variable():
    env = vllm_env()
    import vllm.envs as envs

    assert env.vllm.__version__ == "0.33.0", f"vllm {env.vllm.__version__}: the lab pins 0.33.0"
    assert "VLLM_ATTENTION_BACKEND" not in envs.environment_variables, (
        "VLLM_ATTENTION_BACKEND is back in vllm.envs: the README's override section is stale"
    )


@pytest.mark.points(1)
def test_the_committed_facts_file_is_what_extract_facts_reads_from_the_installed_wheel():
    env = vllm_env()
    script = HERE.parent.parent / "tools" / "extract_vllm_facts.py"
    spec = importlib.util.spec_from_file_location("lab02_extract_facts", script)
    extractor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extractor)
    fresh = extractor.extract(pathlib.Path(env.vllm.__file__).parent.parent)
    committed = json.loads((HERE / "vllm_0_33_facts.json").read_text())
    assert fresh == committed, "vllm_0_33_facts.json is stale: rerun tools/extract_vllm_facts.py"


@pytest.mark.points(2)
def test_backend_priorities_equal_vllms_get_backend_priorities_on_every_capability():
    env = vllm_env()
    compared = 0
    cases = [{"head_size": 128, "dtype": "bfloat16"}]
    cases += [
        {"head_size": h, "dtype": "bfloat16", "use_mla": True, "kv_cache_dtype": kv, "num_heads": n}
        for h in (512, 576)
        for kv in ("auto", "fp8")
        for n in (16, 128)
    ]
    for capability, case in itertools.product(CAPABILITIES, cases):
        cfg = _full(case)
        with on_gpu(capability, cfg):
            theirs = [
                b.name
                for b in env.cuda._get_backend_priorities(
                    use_mla=cfg["use_mla"],
                    device_capability=env.DeviceCapability(*capability),
                    num_heads=cfg.get("num_heads"),
                    kv_cache_dtype=cfg["kv_cache_dtype"],
                    head_size=cfg["head_size"],
                )
            ]
        ours = impl.backend_priorities(capability, cfg["use_mla"], cfg)
        assert ours == theirs, f"{capability} {case}: lab {ours} != vLLM {theirs}"
        compared += 1
    _summary(f"backend_priorities: {compared} (capability, config) cases equal to vLLM")


@pytest.mark.points(4)
@pytest.mark.timeout(900)
def test_validate_configuration_gives_vllms_reasons_in_vllms_order_on_a_matrix():
    facts = impl.load_facts()
    compared, disagreements, vllm_crashes = 0, [], 0
    configs = list(dense_configs()) + list(mla_configs())
    for config in configs:
        backends = [
            b for b, f in facts["backends"].items() if f["is_mla"] == config.get("use_mla", False)
        ] + (["FLASH_ATTN", "TRITON_ATTN"] if config.get("use_mla") else ["TRITON_MLA", "FLASHMLA"])
        for capability in CAPABILITIES:
            for backend, theirs in vllm_reasons(backends, capability, config).items():
                if isinstance(theirs, str):
                    vllm_crashes += 1
                    continue
                ours = impl.validate_configuration(backend, config, capability)
                compared += 1
                if ours != theirs:
                    disagreements.append((backend, capability, config, ours, theirs))
    _summary(
        f"validate_configuration: {compared} (backend, capability, config) cases "
        f"compared over {len(configs)} configs x {len(CAPABILITIES)} capabilities; "
        f"{len(disagreements)} disagreements; {vllm_crashes} cases where vLLM itself "
        "raised AttributeError (skipped)"
    )
    shown = "\n".join(
        f"  {b} {c} {cfg}: lab {o} vs vLLM {t}" for b, c, cfg, o, t in disagreements[:15]
    )
    assert not disagreements, f"{len(disagreements)} disagreements with vLLM:\n{shown}"


@pytest.mark.points(2)
def test_select_backend_picks_what_vllms_get_attn_backend_cls_picks_for_real_models():
    compared = refusals = 0
    for (gpu, capability), dtype, (model, model_config), block in itertools.product(
        impl.GPUS.items(),
        impl.DTYPES,
        impl.MODELS.items(),
        (None, 16, 64),
    ):
        config = {**model_config, "dtype": dtype, "block_size": block}
        try:
            theirs = vllm_select(capability, config)
        except ValueError as e:
            theirs = f"ValueError: {e}"
        try:
            ours = impl.select_backend(config, capability).backend
        except ValueError as e:
            ours = f"ValueError: {e}"
        assert ours == theirs, f"{model} {dtype} block {block} on {gpu}: lab {ours}, vLLM {theirs}"
        compared += 1
        refusals += ours.startswith("ValueError")
    _summary(
        f"select_backend: {compared} (GPU, dtype, model, block size) selections equal "
        f"to vLLM's get_attn_backend_cls ({refusals} of them 'No valid attention backend' "
        "errors, word for word)"
    )


@pytest.mark.points(2)
def test_an_invalid_override_fails_with_vllms_own_message():
    cases = [
        ("FLASHINFER", (9, 0), {"head_size": 96, "dtype": "bfloat16"}),
        ("FLASH_ATTN", (7, 5), {"head_size": 128, "dtype": "float32"}),
        ("FLASH_ATTN", (8, 0), {**impl.MODELS["gpt-oss-20b"], "dtype": "bfloat16"}),
        ("CUTLASS_MLA", (9, 0), {**impl.MODELS["DeepSeek-V3"], "dtype": "bfloat16"}),
        ("TRITON_MLA", (9, 0), {"head_size": 128, "dtype": "float16"}),
    ]
    for backend, capability, config in cases:
        with pytest.raises(ValueError) as theirs:
            vllm_select(capability, config, override=backend)
        with pytest.raises(ValueError) as ours:
            impl.select_backend(config, capability, override=backend)
        assert str(ours.value) == str(theirs.value)
    _summary(f"override errors: {len(cases)} messages identical to vLLM's")
