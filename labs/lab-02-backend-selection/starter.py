"""Lab 02 (starter): the attention-backend dispatcher, as vLLM 0.33.0 runs it.

Your job: the seven functions at the bottom that raise NotImplementedError. Everything
above them is given: the facts file loader, the input checks, and the answers the GPU
gives (which FlashAttention version loads, whether FlashInfer's TRTLLM kernels exist),
which are facts about the machine, not the selector's logic.

Read the README first; run the tests with
    LAB_IMPL=starter pytest labs/lab-02-backend-selection -q
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from collections.abc import Mapping
from typing import Any

VLLM_VERSION = "0.33.0"

FACTS_FILE = pathlib.Path(__file__).with_name("vllm_0_33_facts.json")

GPUS: dict[str, tuple[int, int]] = {
    "T4": (7, 5),
    "A100": (8, 0),
    "L4": (8, 9),
    "H100": (9, 0),
    "B200": (10, 0),
    "RTX PRO 6000": (12, 0),
}

DTYPES = ("float16", "bfloat16", "float32")

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

TRTLLM_CUBINS_AVAILABLE = True  # flashinfer-cubin installed or NVIDIA's artifactory reachable

CONFIG_DEFAULTS: dict[str, Any] = {
    "kv_cache_dtype": "auto",
    "block_size": None,  # None = no --block-size: vLLM picks one after the backend
    "use_mla": False,
    "has_sink": False,
    "has_sliding_window": False,
    "use_sparse": False,
}

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
    raise NotImplementedError(
        "TODO: ask the backend the questions of AttentionBackend.validate_configuration in "
        "vLLM's order (head size, dtype, KV-cache dtype, block size, MLA, sinks, sparse, "
        "compute capability, sliding window, then the backend's supports_combination) and "
        "collect a reason string for each 'no'. load_facts()['base_reasons'] has the wording, "
        "load_facts()['backends'][name] the facts, the README's Reference section the rules"
    )


def backend_priorities(capability: Any, use_mla: bool, config: Any = None) -> list[str]:
    """``_get_backend_priorities`` (vllm/platforms/cuda.py:84): the backends to try, best first.

    Depends on the major version only, and for MLA on three config values that choose the
    sparse-MLA part of the list: whether the KV cache is quantized, whether ``num_heads``
    is at most 16 and whether ``head_size`` is 512 (README, Reference R4). ``config`` is
    optional; without it those are unknown: not quantized, not few heads, not 512.
    """
    raise NotImplementedError(
        "TODO: pick the list of load_facts()['priorities']['lists'] that "
        "_get_backend_priorities returns for this major version and use_mla, splicing in the "
        "sparse-MLA tail it names (README, Reference R4)"
    )


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
    raise NotImplementedError(
        "TODO: with an override, validate only that backend and raise if it has reasons (no "
        "fallback); otherwise validate every backend of backend_priorities in order, keep the "
        "reasons of the refused ones, and return the first valid one (raise if there is none)"
    )


def selection_matrix(gpus: Any = None, dtypes: Any = None, models: Any = None) -> dict:
    """``{(gpu, dtype, model): backend or None}`` over real GPUs, dtypes and models.

    ``gpus``: names from ``GPUS`` or a ``{name: (major, minor)}`` dict; ``models``: names
    from ``MODELS`` or a ``{name: config}`` dict (config without ``dtype``). ``None``
    means all of ``GPUS`` / ``DTYPES`` / ``MODELS``. A cell is None when no backend is
    valid (vLLM would refuse to start).
    """
    raise NotImplementedError(
        "TODO: run select_backend for every (GPU, dtype, model) and record the chosen backend, "
        "or None when no backend is valid"
    )


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


def sdpa_backends_that_run(q: Any, k: Any, v: Any, attn_mask: Any = None,
                           is_causal: bool = False) -> list[str]:
    """The ``torch.nn.attention.SDPBackend`` names that accept these inputs here.

    Each backend is tried alone under ``sdpa_kernel``: SDPA is an API, and which kernel
    runs depends on the device, dtype, shapes and mask. On a CPU that is MATH and the
    CPU FLASH_ATTENTION kernel; on an H100 typically FLASH, EFFICIENT, CUDNN and MATH.
    """
    raise NotImplementedError(
        "TODO: for each torch.nn.attention.SDPBackend (except ERROR), call "
        "F.scaled_dot_product_attention inside sdpa_kernel([backend]) and keep the ones that do"
        " not raise RuntimeError"
    )


def sdpa_bisect(q: Any, k: Any, v: Any, **kw: Any) -> dict[str, float]:
    """``{backend: max |out - reference|}`` for every SDPA backend that runs the inputs.

    The reference is ``common.reference_attention`` in float64. ``kw`` are SDPA's own
    arguments: ``attn_mask`` (boolean, True = may attend), ``is_causal`` (top-left),
    ``scale``, ``enable_gqa``. Backends differ from each other in the last bits because
    they add in different orders, not because any of them approximates.
    """
    raise NotImplementedError(
        "TODO: compute the float64 reference with common.reference_attention (it wants [seq, "
        "heads, dim] per batch element and a boolean mask), run SDPA under each backend that "
        "runs, and report max |out - reference| per backend"
    )


def classify(term: str) -> str:
    """``"math" | "api" | "kernel" | "runtime"`` for a term of the field.

    SDPA is an API (it dispatches to a kernel); FlashAttention is a kernel that computes
    the exact math; PagedAttention is runtime memory management of the KV cache (its
    kernels are ``paged_attention_v1/v2``); softmax(QKᵀ/√d)V is the math.
    """
    raise NotImplementedError(
        "TODO: decide for each term whether it names the math, an API, a kernel, or the serving"
        " runtime around the kernels; raise ValueError for a term you do not know"
    )


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

