"""Lab 02 (solution): the attention-backend dispatcher, as vLLM 0.33.0 runs it.

Three things to hold apart:

* **math**: softmax(QKᵀ/√d)V is one formula;
* **kernels** compute it (FlashAttention 2/3/4, FlashInfer, FlashMLA, Triton, ...), each
  for some dtypes, head sizes, KV-cache formats, block sizes and GPUs only;
* **the selector** picks one kernel backend per attention layer at start-up: it walks a
  priority list for the GPU's compute capability and takes the first backend whose
  ``validate_configuration`` returns no reasons. An override is checked alone: if it
  has reasons, start-up fails; it never falls back.

The backend facts (priority lists, dtypes, head sizes, ...) come from
``vllm_0_33_facts.json``, which ``extract_facts.py`` reads out of the vLLM 0.33.0 wheel;
the rules that depend on what the GPU can load (which FlashAttention version, for one)
are written out below, each with the vLLM file it mirrors.

The lab models a CUDA GPU of the given compute capability running the vLLM 0.33.0 wheel
with its pinned kernel packages (FlashAttention 2/3/4, FlashMLA, FlashInfer 0.7.2.post1,
tokenspeed-mla), FlashInfer's TRTLLM cubins available, default engine settings, and
decoder attention without a multimodal prefix. See the README for the exact list.

Run ``python labs/lab-02-backend-selection/solution.py --matrix`` for the selection
matrix of real GPUs x dtypes x models.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

VLLM_VERSION = "0.33.0"
FACTS_FILE = pathlib.Path(__file__).with_name("vllm_0_33_facts.json")

# Real GPUs and their compute capability (major, minor).
GPUS: dict[str, tuple[int, int]] = {
    "T4": (7, 5),
    "A100": (8, 0),
    "L4": (8, 9),
    "H100": (9, 0),
    "B200": (10, 0),
    "RTX PRO 6000": (12, 0),
}
DTYPES = ("float16", "bfloat16", "float32")

# Real models, as the attention layer describes them to the selector. For MLA the head
# size the selector sees is kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576. gpt-oss
# alternates sliding-window and full layers; its sliding-window layer (sinks + window)
# is the stricter of the two and is the one shown.
MODELS: dict[str, dict[str, Any]] = {
    "Llama-3.1-8B": {"head_size": 128, "num_heads": 32, "num_kv_heads": 8},
    "DeepSeek-V3": {
        "head_size": 576, "use_mla": True, "num_heads": 128, "num_kv_heads": 1,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    },
    "Mistral-7B-v0.1": {
        "head_size": 128, "num_heads": 32, "num_kv_heads": 8, "has_sliding_window": True,
    },
    "gpt-oss-20b": {
        "head_size": 64, "num_heads": 64, "num_kv_heads": 8, "has_sink": True,
        "has_sliding_window": True,
    },
}

# What the modelled machine has beyond the GPU (see the README, "What the lab models").
TRTLLM_CUBINS_AVAILABLE = True  # flashinfer-cubin installed or NVIDIA's artifactory reachable

CONFIG_DEFAULTS: dict[str, Any] = {
    "kv_cache_dtype": "auto",
    "block_size": None,  # None = no --block-size: vLLM picks one after the backend
    "use_mla": False,
    "has_sink": False,
    "has_sliding_window": False,
    "use_sparse": False,
}
# Optional facts about the model that some backends read from its HF config.
MODEL_KEYS = (
    "num_heads", "num_kv_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "index_topk",
)
DTYPE_ALIASES = {
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}


@functools.cache
def load_facts() -> dict[str, Any]:
    """vLLM 0.33.0's backend facts (``vllm_0_33_facts.json``, made by ``extract_facts.py``)."""
    return json.loads(FACTS_FILE.read_text())


@dataclasses.dataclass(frozen=True)
class Selection:
    """What the selector decided for one attention layer.

    ``backend``: the chosen enum name. ``rejected``: every backend of the priority list
    that was checked and refused, in priority order, with its reasons. ``valid``: the
    backends that passed, in priority order. ``warning``: vLLM's ``--block-size``
    warning when a user block size alone ruled out higher-priority backends.
    """

    backend: str
    rejected: dict[str, list[str]]
    valid: list[str] = dataclasses.field(default_factory=list)
    warning: str | None = None


# ---- inputs --------------------------------------------------------------------------


def parse_capability(capability: Any) -> tuple[int, int]:
    """``(major, minor)`` from a tuple such as ``(9, 0)`` or a name from ``GPUS``."""
    if isinstance(capability, str) and capability in GPUS:
        return GPUS[capability]
    try:
        major, minor = (int(x) for x in capability)
    except (TypeError, ValueError):
        raise ValueError(
            f"capability must be a (major, minor) tuple such as (9, 0), got {capability!r}"
        ) from None
    return major, minor


def normalize_config(config: Any) -> dict[str, Any]:
    """A plain dict with every key filled in; ``ValueError`` names a bad key or value."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    unknown = set(config) - {"head_size", "dtype", *CONFIG_DEFAULTS, *MODEL_KEYS}
    if unknown:
        raise ValueError(f"config has unknown keys {sorted(unknown)} (head_size, dtype, ...)")
    for key in ("head_size", "dtype"):
        if config.get(key) is None:
            raise ValueError(f"config must give {key!r}")
    cfg = {**CONFIG_DEFAULTS, **{k: None for k in MODEL_KEYS}, **config}
    for key in CONFIG_DEFAULTS:  # "missing" and None both mean the default
        if cfg[key] is None:
            cfg[key] = CONFIG_DEFAULTS[key]
    dtype = str(cfg["dtype"]).removeprefix("torch.")
    if dtype not in DTYPE_ALIASES:
        raise ValueError(f"config['dtype']={cfg['dtype']!r}: use float16, bfloat16 or float32")
    cfg["dtype"] = DTYPE_ALIASES[dtype]
    if not isinstance(cfg["head_size"], int) or cfg["head_size"] <= 0:
        raise ValueError(f"config['head_size']={cfg['head_size']!r} must be a positive int")
    if cfg["kv_cache_dtype"] not in load_facts()["kv_cache_dtypes"]["values"]:
        raise ValueError(
            f"config['kv_cache_dtype']={cfg['kv_cache_dtype']!r} is not a vLLM 0.33.0 "
            f"cache dtype: {load_facts()['kv_cache_dtypes']['values']}"
        )
    block = cfg["block_size"]
    if block is not None and (not isinstance(block, int) or block <= 0):
        raise ValueError(f"config['block_size']={block!r} must be a positive int or None")
    for flag in ("use_mla", "has_sink", "has_sliding_window", "use_sparse"):
        if not isinstance(cfg[flag], bool):
            raise ValueError(f"config[{flag!r}]={cfg[flag]!r} must be True or False")
    return cfg


def _backend_facts(backend: str) -> dict[str, Any]:
    facts = load_facts()
    if backend not in facts["backends"]:
        if backend in facts["enum_names"]:
            raise ValueError(
                f"{backend} is a vLLM {VLLM_VERSION} backend this lab does not model; "
                f"modelled: {', '.join(facts['backends'])}"
            )
        raise ValueError(
            f"Unknown attention backend: {backend!r}. Valid options are: "
            f"{', '.join(facts['backends'])}"
        )
    return facts["backends"][backend]


# ---- what the GPU can load (vllm/v1/attention/backends/fa_utils.py and friends) -------


def _is_quantized(kv_cache_dtype: str) -> bool:
    """``is_quantized_kv_cache`` (vllm/v1/kv_cache_interface.py): anything but auto/fp16/bf16."""
    return kv_cache_dtype not in ("auto", "float16", "bfloat16")


def _fa_supported(version: int, capability: tuple[int, int]) -> bool:
    """``is_fa_version_supported`` (vllm/vllm_flash_attn/flash_attn_interface.py)."""
    major = capability[0]
    return {2: capability >= (8, 0), 3: major == 9, 4: major in (9, 10, 11)}[version]


def flash_attn_version(
    capability: tuple[int, int],
    head_size: int | None = None,
    head_size_v: int | None = None,
    has_sink: bool = False,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    hd256_kernel_ok: bool = False,
) -> int | None:
    """Which FlashAttention vLLM 0.33.0 runs on this GPU (``get_flash_attn_version``).

    FA3 on Hopper (9.x), FA4 on Blackwell 10.x, FA2 elsewhere from 8.0 up, None below
    8.0 (no FlashAttention at all). Then the documented fallbacks: Hopper moves to FA4
    above head size 256; FA4's head-256 kernel on 10.x/11.x falls back to FA2 with sinks,
    a quantized KV cache or a block size that is not a multiple of 128; FA4 on 10.x+
    falls back to FA2 for head sizes above 128 except 256 (and 192/128).
    """
    capability = parse_capability(capability)
    major = capability[0]
    if major == 9 and _fa_supported(3, capability):
        version = 3
    elif major == 10 and _fa_supported(4, capability):
        version = 4
    else:
        version = 2
    if version == 3 and major == 9 and _fa_supported(4, capability):
        if head_size is not None and head_size > 256:
            version = 4
        elif has_sink and None not in (head_size, head_size_v) and head_size != head_size_v:
            version = 4
    hd256 = head_size == 256 and head_size_v in (None, 256) and major in (10, 11)
    if version == 4 and hd256:
        fallback = (
            has_sink
            or _is_quantized(kv_cache_dtype)
            or (block_size is not None and block_size % 128 != 0)
        )
        if not hd256_kernel_ok or fallback:
            version = 2
    if version == 4 and major >= 10 and head_size is not None and head_size > 128:
        if not ((head_size == 256 and head_size_v in (None, 256))
                or (head_size == 192 and head_size_v == 128)):
            version = 2
    return version if _fa_supported(version, capability) else None


def _flash_attn_supports_kv_cache_dtype(capability, kv_cache_dtype, **version_args) -> bool:
    """``flash_attn_supports_kv_cache_dtype`` (fa_utils.py): FP8 needs FA3 on 9.x or FA4."""
    if kv_cache_dtype == "fp8_e5m2":
        return False
    version = flash_attn_version(capability, kv_cache_dtype=kv_cache_dtype, **version_args)
    head_size = version_args.get("head_size")
    sm90_ok = version == 3 or (version == 4 and head_size in (None, 512))
    return (sm90_ok and capability[0] == 9) or (version == 4 and capability[0] == 10)


def trtllm_available(capability: tuple[int, int], prefill: bool) -> bool:
    """``supports_trtllm_attention`` (vllm/utils/flashinfer.py): XQA decode on 9.0 and 12.x,
    prefill and decode on 10.x; only with the TRTLLM cubins at hand."""
    if not TRTLLM_CUBINS_AVAILABLE:
        return False
    if capability == (9, 0) or capability[0] == 12:
        return not prefill
    return capability[0] == 10


# ---- the per-backend questions of AttentionBackend.validate_configuration --------------


def _supports_head_size(backend: str, facts: dict, head_size: int, cap) -> bool:
    if backend == "FLASH_ATTN":  # flash_attn.py FlashAttentionBackend.supports_head_size
        if head_size % 8 != 0:
            return False
        return head_size <= 256 or (_fa_supported(4, cap) and head_size <= 512)
    if backend == "TRITON_ATTN":  # triton_attn.py: head_size >= 32
        return head_size >= 32
    if backend == "TURBOQUANT":  # turboquant_attn.py: any positive head size
        return head_size > 0
    sizes = facts["head_sizes"]
    return not sizes or head_size in sizes


def _supports_kv_cache_dtype(backend: str, facts: dict, cfg: dict, cap) -> bool:
    kv = cfg["kv_cache_dtype"]
    if backend == "TURBOQUANT":
        return kv.startswith("turboquant_")
    if backend == "FLASHINFER" and kv.startswith("nvfp4"):
        if cap[0] in (8, 9, 12):  # _nvfp4_kv_on_fa2: the fa2 path writes plain nvfp4 only
            return kv == "nvfp4"
        both = trtllm_available(cap, prefill=True) and trtllm_available(cap, prefill=False)
        return cap[0] == 10 and both
    if kv not in facts["kv_cache_dtypes"]:
        return False
    if backend == "FLASH_ATTN" and _is_quantized(kv):
        return _flash_attn_supports_kv_cache_dtype(cap, kv)
    return True


def _kernel_block_sizes(backend: str, facts: dict, cfg: dict, cap) -> list:
    """The kernel's block sizes (ints must divide the block, ``MultipleOf(n)`` too)."""
    if backend == "FLASH_ATTN":  # FlashAttentionBackend.get_supported_kernel_block_sizes
        head, kv = cfg["head_size"], cfg["kv_cache_dtype"]
        if cap[0] == 9 and kv in ("fp8", "fp8_e4m3") and head == 512:
            if flash_attn_version(cap, head_size=512) == 4:
                return [64]  # the SM90 FP8-KV FA4 kernel uses 64-token pages
        if head == 256 and cap[0] in (10, 11):
            version = flash_attn_version(cap, head_size=256, kv_cache_dtype=kv,
                                         hd256_kernel_ok=True)
            if version == 4:
                return [load_facts()["flash_attention"]["FA4_HD256_PAGE_SIZE"]]
    return facts["kernel_block_sizes"]


def _supports_block_size(backend: str, facts: dict, cfg: dict, cap) -> bool:
    block = cfg["block_size"]
    if block is None:  # no --block-size: every backend can pick its own
        return True
    if backend in ("TRITON_ATTN", "TRITON_MLA"):  # they override: block % 16 == 0
        return block % 16 == 0
    for size in _kernel_block_sizes(backend, facts, cfg, cap):
        base = int(size[len("MultipleOf("):-1]) if isinstance(size, str) else size
        if block % base == 0:  # "hybrid blocks": a multiple of the kernel's size will do
            return True
    return False


def _supports_sink(backend: str, facts: dict, cap) -> bool:
    if backend == "FLASH_ATTN":  # flash_attn_supports_sinks: FA3 or FA4 only
        return flash_attn_version(cap) in (3, 4)
    if backend == "FLASHINFER":  # FlashInferBackend.supports_sink: TRTLLM kernels only
        if cap == (9, 0) or cap[0] == 12:
            return trtllm_available(cap, prefill=False)
        both = trtllm_available(cap, prefill=False) and trtllm_available(cap, prefill=True)
        return cap[0] == 10 and both
    return facts["supports_sink"] is True


def _supports_capability(facts: dict, cap) -> bool:
    rule = facts["compute_capability"]
    if "min" in rule and cap < tuple(rule["min"]):
        return False
    if "max" in rule and cap > tuple(rule["max"]):
        return False
    return "majors" not in rule or cap[0] in rule["majors"]


def _combination_reasons(backend: str, cfg: dict, cap) -> list[str]:
    """What ``supports_combination`` adds (the backend's own cross-cutting checks)."""
    kv, head, sink = cfg["kv_cache_dtype"], cfg["head_size"], cfg["has_sink"]
    major = cap[0]
    hf = {k: cfg[k] for k in MODEL_KEYS if cfg[k] is not None}  # the model's HF config
    if backend == "FLASH_ATTN":
        if sink and cap < (9, 0):
            return ["sink not supported on compute capability < 9.0"]
        if _is_quantized(kv) and not _flash_attn_supports_kv_cache_dtype(
            cap, kv, head_size=head, head_size_v=head, has_sink=sink,
            block_size=cfg["block_size"], hd256_kernel_ok=True,
        ):
            return ["FP8 KV cache requires FA3 on SM90, FA4 with head_size=512 on SM90, "
                    "or FA4 on SM100"]
    elif backend == "FLASHINFER":
        if kv.startswith("nvfp4") and major in (8, 9, 12):
            if head == 64:
                return ["fa2 prefill misreads an NVFP4 KV cache at head_size 64"]
            if sink:
                return ["the sink prefill wrapper cannot read an NVFP4 KV cache"]
    elif backend == "FLASHMLA":  # vllm/v1/attention/ops/flashmla.py
        if cfg["use_sparse"]:
            if major not in (9, 10):
                return ["FlashMLA Sparse is only supported on Hopper and Blackwell DC devices."]
        elif major != 9:
            return ["FlashMLA Dense is only supported on Hopper devices."]
    elif backend == "FLASHINFER_MLA":
        nope = hf.get("qk_nope_head_dim", 1)
        if nope not in (64, 128, 192):
            return ["FlashInfer MLA kernel requires qk_nope_head_dim in [64, 128, 192], "
                    f"but got {nope}"]
    elif backend == "TOKENSPEED_MLA":
        dims = tuple(hf.get(k, 0) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                            "v_head_dim"))
        if dims != (128, 64, 128):
            return ["tokenspeed_mla requires DeepSeek R1 MLA dimensions (qk_nope_head_dim=128, "
                    f"qk_rope_head_dim=64, v_head_dim=128), got ({dims[0]}, {dims[1]}, "
                    f"{dims[2]})"]
    elif backend == "FLASH_ATTN_MLA":
        if major != 9:  # flash_attn_supports_mla: FA3 on Hopper
            return ["FlashAttention MLA not supported on this device"]
    elif backend == "FLASHMLA_SPARSE":
        return _flashmla_sparse_reasons(kv, head, cap, hf)
    elif backend == "FLASH_ATTN_MLA_SPARSE":
        if kv not in ("auto", "float16", "bfloat16"):
            return ["FlashAttention MLA Sparse currently supports only FP16/BF16 KV cache"]
        if major != 9:
            return ["FlashAttention MLA not supported on this device"]
        if "index_topk" not in hf:
            return ["FlashAttention MLA Sparse requires model with index_topk"]
    elif backend == "FLASH_ATTN_MLA_SPARSE_FA4":
        if not _fa_supported(4, cap):
            return ["FA4 unavailable: "
                    + load_facts()["flash_attention"]["_is_fa4_supported"]["unsupported_reason"]]
        topk = hf.get("index_topk")
        if topk is None or topk % 128 != 0:
            return [f"FA4 sparse MLA requires index_topk % 128 == 0, got {topk}"]
        dims = (hf.get("kv_lora_rank"), hf.get("qk_rope_head_dim"))
        if dims != (512, 64):
            return [f"FA4 sparse MLA requires (kv_lora_rank, qk_rope_head_dim) == (512, 64), "
                    f"got {dims}"]
        heads = (8, 16, 32, 64, 128)
        if "num_heads" in hf and hf["num_heads"] not in heads:
            return [f"FA4 sparse MLA requires {heads} gathered query heads, "
                    f"got num_heads={hf['num_heads']} * dcp_size=1"]
        return _flashinfer_mla_sparse_reasons("FLASH_ATTN_MLA_SPARSE_FA4", kv, hf)
    elif backend == "FLASHINFER_MLA_SPARSE":
        return _flashinfer_mla_sparse_reasons("FLASHINFER_MLA_SPARSE", kv, hf)
    elif backend == "FLASHINFER_MLA_SPARSE_SM90":
        if not cfg["use_sparse"]:
            return ["FLASHINFER_MLA_SPARSE_SM90 requires sparse MLA"]
        if hf.get("kv_lora_rank", 512) != 512:
            return ["FLASHINFER_MLA_SPARSE_SM90 requires kv_lora_rank=512"]
        if hf.get("qk_rope_head_dim", 64) not in (0, 64):
            return ["FLASHINFER_MLA_SPARSE_SM90 requires qk_rope_head_dim in (0, 64)"]
    elif backend == "FLASHINFER_MLA_SPARSE_SM120":
        if cfg["dtype"] != "bfloat16":
            return ["dtype not supported"]
        if kv not in ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla"):
            return ["kv_cache_dtype not supported"]
        if "index_topk" not in hf:
            return ["FLASHINFER_MLA_SPARSE_SM120 requires a model with index_topk config"]
        if int(hf["index_topk"]) != 2048:
            return [f"FLASHINFER_MLA_SPARSE_SM120 requires index_topk=2048; "
                    f"got {hf['index_topk']}"]
    return []


def _flashmla_sparse_reasons(kv: str, head: int, cap, hf: dict) -> list[str]:
    if head == 512:
        if kv in ("auto", "bfloat16", "float16", "fp8_ds_mla") and cap[0] == 9:
            if hf.get("qk_rope_head_dim", 64) != 0:
                return ["FLASHMLA_SPARSE supports head_size 512 only for rope-free (NoPE) "
                        "models"]
        else:
            return ["FLASHMLA_SPARSE supports head_size 512 only with bf16 or fp8_ds_mla "
                    f"kv-cache on SM90 (NoPE), got kv_cache_dtype={kv}, "
                    f"capability=DeviceCapability(major={cap[0]}, minor={cap[1]})"]
    if kv == "nvfp4_ds_mla" and cap[0] != 10:
        return [f"FLASHMLA_SPARSE only supports the {kv} kv-cache dtype on SM100 (Blackwell)"]
    return []


def _flashinfer_mla_sparse_reasons(name: str, kv: str, hf: dict) -> list[str]:
    """``FlashInferMLASparseTRTLLMBackend.supports_combination`` (flashinfer_mla_sparse.py).

    vLLM reads qk_nope_head_dim, qk_rope_head_dim and kv_lora_rank without a default; a
    config that does not give them skips those two checks here.
    """
    if kv == "fp8_ds_mla":
        return [f"{name} SM10 does not support fp8_ds_mla kv-cache dtype"]
    nope, rope, rank = (hf.get(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                             "kv_lora_rank"))
    if rope == 0:
        if nope != 256 or rank != 512:
            return ["FlashInfer native no-rope MLA requires qk_nope_head_dim=256 and "
                    f"kv_lora_rank=512, but got qk_nope_head_dim={nope}, kv_lora_rank={rank}"]
    elif nope is not None and nope not in (128, 192):
        return ["FlashInfer MLA Sparse kernel requires qk_nope_head_dim in [128, 192], "
                f"but got {nope}"]
    if "index_topk" not in hf:
        return ["FlashInfer MLA Sparse requires model with index_topk config"]
    return []


def validate_configuration(backend: str, config: Any, capability: Any) -> list[str]:
    """Why ``backend`` cannot serve ``config`` on a GPU of ``capability``; [] = it can.

    Mirrors ``AttentionBackend.validate_configuration`` (vllm/v1/attention/backend.py:279):
    the same reasons, worded as vLLM 0.33.0 words them, in the order it appends them:
    every generic check that fails (head size, dtype, KV-cache dtype, block size, MLA,
    sinks, sparse, compute capability, sliding window), then at most one reason from the
    backend's ``supports_combination`` (the first of its own checks that fails). Every
    check and its condition in plain words: README, "Reference: every rule the selector
    applies"; the data and vLLM's wording: ``load_facts()``.

    Args:
        backend: vLLM's enum name, e.g. ``"FLASH_ATTN"`` or ``"TRITON_MLA"``.
        config: ``{"head_size": 128, "dtype": "bfloat16", ...}``; missing keys take
            their defaults (kv_cache_dtype "auto", block_size None, flags False).
        capability: ``(major, minor)``, e.g. ``(9, 0)`` for an H100.

    Raises:
        ValueError: a bad config, capability or backend name, naming it (the given
            ``normalize_config``, ``parse_capability`` and ``_backend_facts`` do this).
    """
    cfg, cap = normalize_config(config), parse_capability(capability)
    facts = _backend_facts(backend)
    reasons = []
    if not _supports_head_size(backend, facts, cfg["head_size"], cap):
        reasons.append("head_size not supported")
    if cfg["dtype"] not in facts["dtypes"]:
        reasons.append("dtype not supported")
    if not _supports_kv_cache_dtype(backend, facts, cfg, cap):
        reasons.append("kv_cache_dtype not supported")
    if not _supports_block_size(backend, facts, cfg, cap):
        reasons.append("block_size not supported")
    if cfg["use_mla"] != facts["is_mla"]:
        reasons.append("MLA not supported" if cfg["use_mla"] else "non-MLA not supported")
    if cfg["has_sink"] and not _supports_sink(backend, facts, cap):
        reasons.append("attention sinks not supported")
    if cfg["use_sparse"] != facts["is_sparse"]:
        reasons.append("sparse not supported" if cfg["use_sparse"] else "non-sparse not supported")
    if not _supports_capability(facts, cap):
        reasons.append("compute capability not supported")
    if cfg["has_sliding_window"] and not facts["supports_sliding_window"]:
        reasons.append("sliding window not supported")
    reasons += _combination_reasons(backend, cfg, cap)
    return reasons


# ---- the selector (vllm/platforms/cuda.py) ---------------------------------------------


def backend_priorities(capability: Any, use_mla: bool, config: Any = None) -> list[str]:
    """``_get_backend_priorities`` (vllm/platforms/cuda.py:84): the backends to try, best first.

    Depends on the major version only, and for MLA on three config values that choose the
    sparse-MLA part of the list: whether the KV cache is quantized, whether ``num_heads``
    is at most 16 and whether ``head_size`` is 512 (README, Reference R4). ``config`` is
    optional; without it those are unknown: not quantized, not few heads, not 512.
    """
    cap = parse_capability(capability)
    cfg = normalize_config(config) if config is not None else {}
    lists = load_facts()["priorities"]["lists"]

    def names(label: str) -> list[str]:  # drops the use_mm_prefix-only entries
        return [b for b in lists[label]["backends"] if isinstance(b, str)]

    if use_mla:
        if cap[0] == 10:
            kv, heads = cfg.get("kv_cache_dtype"), cfg.get("num_heads")
            if kv is not None and _is_quantized(kv):
                sparse = names("mla_sm10_sparse_quantized_kv")
            elif heads is not None and heads <= 16:
                sparse = names("mla_sm10_sparse_bf16_few_heads")
            else:
                sparse = names("mla_sm10_sparse_bf16")
            return names("mla_major_10") + sparse
        if cap[0] == 12:
            return names("mla_major_12")
        tail = names("mla_other_sparse_tail")
        if cfg.get("head_size") == 512:
            tail = ["FLASHINFER_MLA_SPARSE_SM90", *tail]
        else:
            tail = [*tail, "FLASHINFER_MLA_SPARSE_SM90"]
        return names("mla_other") + tail
    if cap[0] == 10:  # causal decoder attention; non-causal would prefer FLASH_ATTN here
        return names("non_mla_major_10_causal")
    return names("non_mla_other")


def _override_name(override: str) -> str | None:
    """``AttentionConfig.validate_backend_before``: "auto" means none; any case works."""
    if not isinstance(override, str):
        raise ValueError(f"override must be a backend name, got {override!r}")
    return None if override.lower() == "auto" else override.upper()


def select_backend(config: Any, capability: Any, override: str | None = None) -> Selection:
    """Pick the attention backend as ``CudaPlatformBase.get_attn_backend_cls`` does
    (vllm/platforms/cuda.py:420-518 in vLLM 0.33.0).

    Without ``override``: validate every backend of ``backend_priorities(capability,
    use_mla, config)``, in that order. ``Selection.backend`` is the first one with no
    reasons; ``rejected`` maps each refused backend to its reasons and ``valid`` lists
    the accepted ones, both in priority order. ``warning`` is set only when the config
    gives a ``block_size`` and backends *above* the chosen one were refused with exactly
    ``["block_size not supported"]`` (cuda.py:489-507); it is this text, on one line,
    with those backends joined by ", " in priority order:

        --block-size 16 precluded higher-priority backend(s) FLASHINFER_MLA, CUTLASS_MLA.
        Using TRITON_MLA instead, which may result in reduced performance. Consider
        removing --block-size to auto-select the optimal block size.

    If no backend is valid, raise ``ValueError`` with vLLM's message (cuda.py:458-475),
    one line:

        No valid attention backend found for cuda with {config}. Reasons:
        {FLASH_ATTN_MLA: [dtype not supported], FLASHMLA: [dtype not supported], ...}.

    Each refused backend appears as ``NAME: [reason, reason]``: its reasons joined by
    ", " inside square brackets *without quotes* (vLLM joins the strings, it does not
    print a list), the backends joined by ", " inside braces, then a final ".".
    ``{config}`` is vLLM's ``AttentionSelectorConfig(head_size=..., ...)`` repr
    (vllm/v1/attention/selector.py:45); the tests read only the text around it.

    With ``override`` (``--attention-backend NAME``): ``"auto"`` means no override and
    any case is accepted (``"flash_attn"``); an unknown name raises ``ValueError``
    starting ``Unknown attention backend: 'NAME'`` (the given ``_backend_facts`` does
    that). Otherwise only that backend is validated. No reasons: it is chosen
    (``rejected`` empty, ``valid == [NAME]``). Any reason: ``ValueError`` (cuda.py:442-446),
    never a fallback, with the reasons as a Python list (``str(list)``, quoted), one line:

        Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this
        configuration. Reason: ['attention sinks not supported', 'sink not supported
        on compute capability < 9.0']
    """
    cfg, cap = normalize_config(config), parse_capability(capability)
    name = _override_name(override) if override is not None else None
    if name is not None:
        reasons = validate_configuration(name, cfg, cap)
        if reasons:
            raise ValueError(
                f"Selected backend AttentionBackendEnum.{name} is not valid for this "
                f"configuration. Reason: {reasons}"
            )
        return Selection(backend=name, rejected={}, valid=[name])

    order = backend_priorities(cap, cfg["use_mla"], cfg)
    rejected: dict[str, list[str]] = {}
    valid: list[str] = []
    for backend in order:
        reasons = validate_configuration(backend, cfg, cap)
        if reasons:
            rejected[backend] = reasons
        else:
            valid.append(backend)
    if not valid:
        raise ValueError(
            f"No valid attention backend found for cuda with {_config_str(cfg)}. "
            f"Reasons: {_reasons_str(rejected)}."
        )
    chosen = valid[0]
    warning = None
    if cfg["block_size"] is not None:  # did the user's --block-size alone cost us?
        precluded = [b for b, r in rejected.items()
                     if order.index(b) < order.index(chosen) and r == ["block_size not supported"]]
        if precluded:
            warning = (
                f"--block-size {cfg['block_size']} precluded higher-priority backend(s) "
                f"{', '.join(precluded)}. Using {chosen} instead, which may result in reduced "
                "performance. Consider removing --block-size to auto-select the optimal "
                "block size."
            )
    return Selection(backend=chosen, rejected=rejected, valid=valid, warning=warning)


def _config_str(cfg: dict) -> str:
    """``AttentionSelectorConfig.__repr__`` (vllm/v1/attention/selector.py:45).

    The fields after ``use_sparse`` are the ones this lab fixes (decoder attention, no
    multimodal prefix, no DCP/PCP, ...), except ``has_sliding_window``.
    """
    return (
        f"AttentionSelectorConfig(head_size={cfg['head_size']}, dtype=torch.{cfg['dtype']}, "
        f"kv_cache_dtype={cfg['kv_cache_dtype']}, block_size={cfg['block_size']}, "
        f"use_mla={cfg['use_mla']}, has_sink={cfg['has_sink']}, "
        f"use_sparse={cfg['use_sparse']}, use_mm_prefix=False, "
        "use_per_head_quant_scales=False, attn_type=AttentionType.DECODER, "
        f"has_sliding_window={cfg['has_sliding_window']}, use_non_causal=False, "
        "use_batch_invariant=False, use_kv_connector=False, "
        "use_adaptive_verification=False, use_pcp=False, use_dcp=False, use_rswa=False)"
    )


def _reasons_str(rejected: dict[str, list[str]]) -> str:
    return "{" + ", ".join(f"{b}: [{', '.join(r)}]" for b, r in rejected.items()) + "}"


def selection_matrix(gpus: Any = None, dtypes: Any = None, models: Any = None) -> dict:
    """``{(gpu, dtype, model): backend or None}`` over real GPUs, dtypes and models.

    ``gpus``: names from ``GPUS`` or a ``{name: (major, minor)}`` dict; ``models``: names
    from ``MODELS`` or a ``{name: config}`` dict (config without ``dtype``). ``None``
    means all of ``GPUS`` / ``DTYPES`` / ``MODELS``. A cell is None when no backend is
    valid (vLLM would refuse to start).
    """
    gpus = _named(gpus, GPUS, "gpus")
    models = _named(models, MODELS, "models")
    dtypes = list(DTYPES if dtypes is None else dtypes)
    matrix = {}
    for gpu, cap in gpus.items():
        for dtype in dtypes:
            for model, model_config in models.items():
                try:
                    chosen = select_backend({**model_config, "dtype": dtype}, cap).backend
                except ValueError as e:
                    if not str(e).startswith("No valid attention backend"):
                        raise
                    chosen = None
                matrix[(gpu, dtype, model)] = chosen
    return matrix


def _named(value: Any, table: dict, what: str) -> dict:
    if value is None:
        return dict(table)
    if isinstance(value, Mapping):
        return dict(value)
    missing = [v for v in value if v not in table]
    if missing:
        raise ValueError(f"{what}: unknown {missing}; known: {list(table)}")
    return {v: table[v] for v in value}


def format_matrix(matrix: dict) -> str:
    """The matrix as a text table: one row per (GPU, dtype), one column per model."""
    rows = list(dict.fromkeys((g, d) for g, d, _ in matrix))
    models = list(dict.fromkeys(m for _, _, m in matrix))
    header = ["GPU (cc)", "dtype", *models]
    lines = []
    for gpu, dtype in rows:
        cap = GPUS.get(gpu)
        label = f"{gpu} ({cap[0]}.{cap[1]})" if cap else gpu
        note = " *" if dtype == "bfloat16" and cap and cap < (8, 0) else ""
        cells = [matrix[(gpu, dtype, m)] or "(none)" for m in models]
        lines.append([label, dtype + note, *cells])
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out = [line.rstrip() for line in out + [fmt.format(*r) for r in lines]]
    if any(r[1].endswith("*") for r in lines):
        out.append("* vLLM refuses bfloat16 below compute capability 8.0 before it selects "
                   "a backend (CudaPlatformBase.check_if_supports_dtype).")
    return "\n".join(out)


# ---- PyTorch SDPA on this machine -------------------------------------------------------


def _sdpa_inputs(q, k, v):
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):
            shape = tuple(t.shape) if hasattr(t, "shape") else type(t).__name__
            raise ValueError(f"{name} must be a torch tensor [batch, heads, seq, dim] or "
                             f"[heads, seq, dim], got {shape}")
    return torch


def sdpa_backends_that_run(q: Any, k: Any, v: Any, attn_mask: Any = None,
                           is_causal: bool = False) -> list[str]:
    """The ``torch.nn.attention.SDPBackend`` names that accept these inputs here.

    Each backend is tried alone under ``sdpa_kernel``: SDPA is an API, and which kernel
    runs depends on the device, dtype, shapes and mask. On a CPU that is MATH and the
    CPU FLASH_ATTENTION kernel; on an H100 typically FLASH, EFFICIENT, CUDNN and MATH.
    """
    _sdpa_inputs(q, k, v)
    return list(_run_each_backend(q, k, v, attn_mask=attn_mask, is_causal=is_causal))


def _run_each_backend(q, k, v, **kw) -> dict[str, Any]:
    """``{backend name: output}`` for every SDPA backend that accepts the call alone."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outputs = {}
    for name, backend in SDPBackend.__members__.items():
        if name == "ERROR":
            continue
        with warnings.catch_warnings():  # a refusing backend warns why; we report it
            warnings.simplefilter("ignore")
            try:
                with sdpa_kernel([backend]):
                    outputs[name] = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, **kw)
            except RuntimeError:
                continue
    return outputs


def sdpa_bisect(q: Any, k: Any, v: Any, **kw: Any) -> dict[str, float]:
    """``{backend: max |out - reference|}`` for every SDPA backend that runs the inputs.

    The reference is ``common.reference_attention`` in float64. ``kw`` are SDPA's own
    arguments: ``attn_mask`` (boolean, True = may attend), ``is_causal`` (top-left),
    ``scale``, ``enable_gqa``. Backends differ from each other in the last bits because
    they add in different orders, not because any of them approximates.
    """
    torch = _sdpa_inputs(q, k, v)
    from common.reference import reference_attention

    attn_mask, is_causal = kw.get("attn_mask"), kw.get("is_causal", False)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise ValueError(
            f"attn_mask must be boolean here (True = may attend), got {attn_mask.dtype}")
    if attn_mask is not None and is_causal:
        raise ValueError("give attn_mask or is_causal, not both (SDPA refuses both)")
    batched = q.dim() == 4
    qb, kb, vb = (t if batched else t[None] for t in (q, k, v))
    B, H, L, _ = qb.shape
    S = kb.shape[2]
    mask = None
    if is_causal:
        mask = torch.ones(L, S, dtype=torch.bool).tril()  # SDPA's is_causal is top-left
    elif attn_mask is not None:
        mask = attn_mask.cpu()
    expected = []
    for b in range(B):  # reference wants [L, heads, dim]
        m = None if mask is None else torch.broadcast_to(
            mask if mask.dim() <= 3 else mask[b % mask.shape[0]], (H, L, S)).numpy()
        out, _ = reference_attention(qb[b].transpose(0, 1), kb[b].transpose(0, 1),
                                     vb[b].transpose(0, 1), scale=kw.get("scale"), mask=m)
        expected.append(torch.from_numpy(out).transpose(0, 1))  # [H, L, dv]
    expected = torch.stack(expected) if batched else expected[0]

    deviations = {}
    for name, out in _run_each_backend(q, k, v, **kw).items():
        deviations[name] = float((out.detach().double().cpu() - expected).abs().max())
    return deviations


# ---- vocabulary ---------------------------------------------------------------------------

# math: what is computed. api: how you ask for it. kernel: code that computes it on a
# device. runtime: the serving system around the kernels (KV-cache memory, scheduling).
TERMS: dict[str, str] = {
    "softmax(qkᵀ/√d)v": "math", "softmax(qk^t/sqrt(d))v": "math",
    "scaled dot-product attention": "math", "attention": "math",
    "online softmax": "math", "multi-head attention": "math", "mha": "math",
    "grouped-query attention": "math", "gqa": "math", "multi-query attention": "math",
    "mqa": "math", "multi-head latent attention": "math", "mla": "math",
    "causal mask": "math", "sliding window attention": "math", "sliding window": "math",
    "attention sinks": "math", "log-sum-exp": "math", "lse": "math",
    "sdpa": "api", "f.scaled_dot_product_attention": "api",
    "torch.nn.functional.scaled_dot_product_attention": "api", "sdpa_kernel": "api",
    "flexattention": "api", "flex attention": "api", "flash_attn_varlen_func": "api",
    "--attention-backend": "api", "attention_config.backend": "api",
    "attentionbackendenum": "api", "vllm_attention_backend": "api",
    "flashattention": "kernel", "flashattention-2": "kernel", "fa2": "kernel",
    "flashattention-3": "kernel", "fa3": "kernel", "flashattention-4": "kernel",
    "fa4": "kernel", "flashinfer": "kernel", "flashmla": "kernel", "cutlass mla": "kernel",
    "cudnn attention": "kernel", "memory-efficient attention": "kernel",
    "xformers": "kernel", "paged_attention_v1": "kernel", "paged_attention_v2": "kernel",
    "flash-decoding": "kernel", "triton unified attention": "kernel",
    "flash_attn": "kernel", "triton_attn": "kernel", "triton_mla": "kernel",
    "pagedattention": "runtime", "paged attention": "runtime", "kv cache": "runtime",
    "block table": "runtime", "continuous batching": "runtime", "prefix caching": "runtime",
    "chunked prefill": "runtime", "scheduler": "runtime", "vllm": "runtime",
    "cuda graphs": "runtime", "block size": "runtime",
}


def classify(term: str) -> str:
    """``"math" | "api" | "kernel" | "runtime"`` for a term of the field.

    SDPA is an API (it dispatches to a kernel); FlashAttention is a kernel that computes
    the exact math; PagedAttention is runtime memory management of the KV cache (its
    kernels are ``paged_attention_v1/v2``); softmax(QKᵀ/√d)V is the math.
    """
    if not isinstance(term, str):
        raise ValueError(f"term must be a string, got {term!r}")
    key = " ".join(term.strip().lower().split())
    if key not in TERMS:
        raise ValueError(f"unknown term {term!r}; known terms: {sorted(TERMS)}")
    return TERMS[key]


def _main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="vLLM 0.33.0's attention-backend selection")
    parser.add_argument("--matrix", action="store_true", help="print the selection matrix")
    parser.add_argument("--explain", nargs=3, metavar=("GPU", "DTYPE", "MODEL"),
                        help='why, e.g. --explain H100 bfloat16 "gpt-oss-20b"')
    args = parser.parse_args()
    if args.explain:
        gpu, dtype, model = args.explain
        sel = select_backend({**MODELS[model], "dtype": dtype}, GPUS[gpu])
        print(f"{model} {dtype} on {gpu} {GPUS[gpu]}: {sel.backend}")
        for backend, reasons in sel.rejected.items():
            print(f"  rejected {backend}: {reasons}")
        print(f"  valid, in priority order: {sel.valid}")
    else:
        print(f"vLLM {VLLM_VERSION} attention backend per (GPU, dtype, model)")
        print(format_matrix(selection_matrix()))


if __name__ == "__main__":
    _main()
