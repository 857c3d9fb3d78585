"""Lab 02, the given code: what every implementation of the lab shares (not the exercise).

* the tables: real GPUs, dtypes and model configs (``GPUS``, ``DTYPES``, ``MODELS``);
* the facts: ``load_facts()`` reads ``vllm_0_33_facts.json``, read out of the vLLM 0.33.0
  wheel by ``tools/extract_vllm_facts.py``;
* the input checks: ``parse_capability``, ``normalize_config``, ``backend_facts``;
* what the GPU can load (facts about the machine, not the selector's logic):
  ``flash_attn_version``, ``fa_version_supported``, ``flash_attn_supports_kv_cache_dtype``,
  ``trtllm_available``, ``is_quantized_kv_cache``;
* the types and texts that cross the API: ``Selection``, ``config_repr`` (vLLM's
  ``AttentionSelectorConfig`` repr, for the "No valid attention backend" message),
  ``format_matrix``.

Run it to print the selection matrix computed by the implementation ``LAB_IMPL`` names
(``LAB_IMPL=starter``: your ``starter.py``)::

    LAB_IMPL=starter .venv/bin/python labs/lab-02-backend-selection/provided.py --matrix
    .venv/bin/python labs/lab-02-backend-selection/provided.py --explain A100 bfloat16 gpt-oss-20b
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

# Given: sdpa_bisect measures SDPA against the float64 reference. (Importing it here is what
# puts it in the grader's sandbox for this lab; other labs' graded code cannot import it.)
from common.reference import reference_attention as reference_attention  # noqa: F401

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

# What the modelled machine has beyond the GPU (README, "What the lab models").
TRTLLM_CUBINS_AVAILABLE = True  # flashinfer-cubin installed or NVIDIA's artifactory reachable

CONFIG_DEFAULTS: dict[str, Any] = {
    "kv_cache_dtype": "auto",
    "block_size": None,  # None = no --block-size: vLLM picks one after the backend
    "use_mla": False,
    "has_sink": False,
    "has_sliding_window": False,
    "use_sparse": False,
}
FLAGS = ("use_mla", "has_sink", "has_sliding_window", "use_sparse")
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
    """vLLM 0.33.0's backend facts (``vllm_0_33_facts.json``)."""
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
    """A plain dict with every key filled in; ``ValueError`` names a bad key or value.

    Missing keys and None take the defaults of ``CONFIG_DEFAULTS``; the optional model
    fields of ``MODEL_KEYS`` are None when not given; ``dtype`` becomes one of ``DTYPES``.
    """
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
    _check_values(cfg)
    cfg["dtype"] = DTYPE_ALIASES[str(cfg["dtype"]).removeprefix("torch.")]
    return cfg


def _check_values(cfg: dict[str, Any]) -> None:
    """``ValueError`` naming the first key of a filled-in config whose value is wrong."""
    if str(cfg["dtype"]).removeprefix("torch.") not in DTYPE_ALIASES:
        raise ValueError(f"config['dtype']={cfg['dtype']!r}: use float16, bfloat16 or float32")
    if not isinstance(cfg["head_size"], int) or cfg["head_size"] <= 0:
        raise ValueError(f"config['head_size']={cfg['head_size']!r} must be a positive int")
    cache_dtypes = load_facts()["kv_cache_dtypes"]["values"]
    if cfg["kv_cache_dtype"] not in cache_dtypes:
        raise ValueError(
            f"config['kv_cache_dtype']={cfg['kv_cache_dtype']!r} is not a vLLM "
            f"{VLLM_VERSION} cache dtype: {cache_dtypes}"
        )
    block = cfg["block_size"]
    if block is not None and (not isinstance(block, int) or block <= 0):
        raise ValueError(f"config['block_size']={block!r} must be a positive int or None")
    for flag in FLAGS:
        if not isinstance(cfg[flag], bool):
            raise ValueError(f"config[{flag!r}]={cfg[flag]!r} must be True or False")


def backend_facts(backend: str) -> dict[str, Any]:
    """The facts file's entry for one backend (vLLM's enum name, e.g. ``"FLASH_ATTN"``).

    ``ValueError`` for a name vLLM does not know (its own ``Unknown attention backend``
    message) or a vLLM backend that this lab does not model (ROCm, CPU, ...).
    """
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


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """``is_quantized_kv_cache`` (vllm/v1/kv_cache_interface.py): anything but auto/fp16/bf16."""
    return kv_cache_dtype not in ("auto", "float16", "bfloat16")


def fa_version_supported(version: int, capability: tuple[int, int]) -> bool:
    """``is_fa_version_supported`` (vllm/vllm_flash_attn/flash_attn_interface.py): whether
    FlashAttention ``version`` can load on this GPU (which one *runs*: ``flash_attn_version``)."""
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
    version = {9: 3, 10: 4}.get(capability[0], 2)
    if version == 3:
        version = _hopper_version(head_size, head_size_v, has_sink)
    if version == 4 and capability[0] >= 10:
        version = _blackwell_version(capability, head_size, head_size_v, has_sink, block_size,
                                     kv_cache_dtype, hd256_kernel_ok)
    return version if fa_version_supported(version, capability) else None


def _hopper_version(head_size, head_size_v, has_sink) -> int:
    """9.x: FA3, moving to FA4 above head size 256 or for sinks with ``dv != d``."""
    if head_size is not None and head_size > 256:
        return 4
    if has_sink and None not in (head_size, head_size_v) and head_size != head_size_v:
        return 4
    return 3


def _blackwell_version(capability, head_size, head_size_v, has_sink, block_size,
                       kv_cache_dtype, hd256_kernel_ok) -> int:
    """10.x: FA4, falling back to FA2 where FA4 has no kernel (fa_utils.py:74-160)."""
    if head_size == 256 and head_size_v in (None, 256):
        fallback = (has_sink or is_quantized_kv_cache(kv_cache_dtype)
                    or (block_size is not None and block_size % 128 != 0))
        return 2 if not hd256_kernel_ok or fallback else 4
    if head_size is not None and head_size > 128:
        return 4 if (head_size, head_size_v) == (192, 128) else 2
    return 4


def flash_attn_supports_kv_cache_dtype(capability: tuple[int, int], kv_cache_dtype: str,
                                       **version_args: Any) -> bool:
    """``flash_attn_supports_kv_cache_dtype`` (fa_utils.py): FP8 needs FA3 on 9.x or FA4.

    ``version_args`` are ``flash_attn_version``'s keyword arguments (head size, ...):
    which of them are given decides whether the head size matters.
    """
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


# ---- texts: vLLM's config repr, the matrix as a table ----------------------------------


def config_repr(cfg: dict[str, Any]) -> str:
    """``AttentionSelectorConfig.__repr__`` (vllm/v1/attention/selector.py:45) of a
    normalized config, as vLLM prints it in "No valid attention backend found ... with {}".

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


def named(value: Any, table: dict[str, Any], what: str) -> dict[str, Any]:
    """``selection_matrix``'s ``gpus``/``models`` argument as a ``{name: value}`` dict:
    None = all of ``table``, a dict as given, a list of names looked up in ``table``."""
    if value is None:
        return dict(table)
    if isinstance(value, Mapping):
        return dict(value)
    missing = [v for v in value if v not in table]
    if missing:
        raise ValueError(f"{what}: unknown {missing}; known: {list(table)}")
    return {v: table[v] for v in value}


def format_matrix(matrix: dict[tuple[str, str, str], str | None]) -> str:
    """``selection_matrix``'s answer as a text table: one row per (GPU, dtype), one column
    per model, ``(none)`` where no backend is valid. A GPU of ``GPUS`` is shown with its
    compute capability, e.g. ``H100 (9.0)``."""
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


def explain(lab: Any, gpu: str, dtype: str, model: str) -> str:
    """Why ``lab.select_backend`` picks what it picks for one cell of the matrix."""
    sel = lab.select_backend({**MODELS[model], "dtype": dtype}, GPUS[gpu])
    lines = [f"{model} {dtype} on {gpu} {GPUS[gpu]}: {sel.backend}"]
    lines += [f"  rejected {backend}: {reasons}" for backend, reasons in sel.rejected.items()]
    lines.append(f"  valid, in priority order: {sel.valid}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``provided.py --matrix`` / ``--explain GPU DTYPE MODEL`` with ``LAB_IMPL``'s code."""
    import argparse

    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))  # run as a script: make `common` importable
    from common.loader import lab_impl, load_impl

    parser = argparse.ArgumentParser(description=f"vLLM {VLLM_VERSION}'s attention-backend "
                                     "selection, computed by LAB_IMPL's selector")
    parser.add_argument("--matrix", action="store_true", help="print the selection matrix")
    parser.add_argument("--explain", nargs=3, metavar=("GPU", "DTYPE", "MODEL"),
                        help='why, e.g. --explain H100 bfloat16 "gpt-oss-20b"')
    args = parser.parse_args(argv)
    lab = load_impl(__file__)
    if args.explain:
        print(explain(lab, *args.explain))
    else:
        print(f"vLLM {VLLM_VERSION} attention backend per (GPU, dtype, model) "
              f"({lab_impl()}.py)")
        print(format_matrix(lab.selection_matrix()))


if __name__ == "__main__":
    main()
