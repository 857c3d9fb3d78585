"""Lab 02 (solution): the attention-backend dispatcher, as vLLM 0.33.0 runs it.

Three things to hold apart:

* **math**: softmax(QKᵀ/√d)V is one formula;
* **kernels** compute it (FlashAttention 2/3/4, FlashInfer, FlashMLA, Triton, ...), each
  for some dtypes, head sizes, KV-cache formats, block sizes and GPUs only;
* **the selector** picks one kernel backend per attention layer at start-up: it walks a
  priority list for the GPU's compute capability and takes the first backend whose
  ``validate_configuration`` returns no reasons. An override is checked alone: if it
  has reasons, start-up fails; it never falls back.

The backends are a table, as in vLLM: one class per backend answers the selector's
questions (``supports_head_size``, ``supports_dtype``, ``supports_kv_cache_dtype``, ...).
The base class ``_Backend`` answers every question from the backend's entry in the facts
file (``load_facts()["backends"][name]``); a backend whose vLLM class overrides a question
(because the answer depends on the GPU or on the model) gets a small subclass that
overrides the same method, citing the vLLM file. A backend without such rules needs no
class at all: adding one is adding its entry to the facts file.

The given code (tables, facts, input checks, what the GPU can load, ``Selection``) is in
``provided.py``. ``python labs/lab-02-backend-selection/provided.py --matrix`` prints the
selection matrix of real GPUs x dtypes x models.
"""

from __future__ import annotations

from typing import Any

from common.loader import load_lab_module

provided = load_lab_module(__file__, "provided")
# The given names, re-exported so that ``impl.GPUS``, ``impl.Selection``, ... work.
VLLM_VERSION = provided.VLLM_VERSION
GPUS = provided.GPUS
DTYPES = provided.DTYPES
MODELS = provided.MODELS
Selection = provided.Selection
load_facts = provided.load_facts
normalize_config = provided.normalize_config
parse_capability = provided.parse_capability
flash_attn_version = provided.flash_attn_version
trtllm_available = provided.trtllm_available
format_matrix = provided.format_matrix

backend_facts = provided.backend_facts
is_quantized_kv_cache = provided.is_quantized_kv_cache
fa_version_supported = provided.fa_version_supported
flash_attn_supports_kv_cache_dtype = provided.flash_attn_supports_kv_cache_dtype


# ---- the table of backends (vllm/v1/attention/backend.py AttentionBackend) ---------------

_RULES: dict[str, type[_Backend]] = {}  # enum name -> the class with that backend's own rules


class _Backend:
    """One vLLM backend class: answers the selector's questions from its facts-file entry.

    ``cfg`` is a ``normalize_config`` dict, ``cap`` a ``(major, minor)`` tuple. A subclass
    sets ``name`` to the vLLM enum name it answers for and overrides only the questions
    whose answer in vLLM is code rather than a list.
    """

    name = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RULES[cls.name] = cls

    def __init__(self, name: str) -> None:
        self.name = name
        self.facts = backend_facts(name)

    def supports_head_size(self, head_size: int, cap: tuple[int, int]) -> bool:
        sizes = self.facts["head_sizes"]  # empty: any head size (backend.py:105)
        return not sizes or head_size in sizes

    def supports_dtype(self, dtype: str) -> bool:
        return dtype in self.facts["dtypes"]

    def supports_kv_cache_dtype(self, kv_cache_dtype: str, cap: tuple[int, int]) -> bool:
        return kv_cache_dtype in self.facts["kv_cache_dtypes"]

    def kernel_block_sizes(self, cfg: dict, cap: tuple[int, int]) -> list[int]:
        """The kernel's page sizes (``get_supported_kernel_block_sizes``); ``MultipleOf(n)``
        is read as ``n``: either way a multiple of it will do."""
        return [int(s.removeprefix("MultipleOf(").removesuffix(")")) if isinstance(s, str)
                else s for s in self.facts["kernel_block_sizes"]]

    def supports_block_size(self, cfg: dict, cap: tuple[int, int]) -> bool:
        block = cfg["block_size"]
        if block is None:  # no --block-size: every backend can pick its own
            return True  # "hybrid blocks": a multiple of a kernel page is accepted
        return any(block % page == 0 for page in self.kernel_block_sizes(cfg, cap))

    def is_mla(self) -> bool:
        return self.facts["is_mla"]

    def supports_sink(self, cap: tuple[int, int]) -> bool:
        return self.facts["supports_sink"] is True

    def is_sparse(self) -> bool:
        return self.facts["is_sparse"]

    def supports_compute_capability(self, cap: tuple[int, int]) -> bool:
        rule = self.facts["compute_capability"]  # bounds inclusive; {} accepts every GPU
        if "min" in rule and cap < tuple(rule["min"]):
            return False
        if "max" in rule and cap > tuple(rule["max"]):
            return False
        return "majors" not in rule or cap[0] in rule["majors"]

    def supports_sliding_window(self) -> bool:
        return self.facts["supports_sliding_window"]

    def supports_combination(self, cfg: dict, cap: tuple[int, int]) -> str | None:
        """The backend's own cross-cutting check: the first reason that holds, or None."""
        return None


def _hf(cfg: dict) -> dict:
    """The model's HF config fields the config gives (a missing one is a missing attribute)."""
    return {k: cfg[k] for k in provided.MODEL_KEYS if cfg[k] is not None}


def _backend(name: str) -> _Backend:
    """The backend called ``name``: its own class if it has rules, else the base class."""
    return _RULES.get(name, _Backend)(name)


# ---- the standard-attention backends (vllm/v1/attention/backends/) ----------------------


class _FlashAttn(_Backend):
    """FlashAttentionBackend (flash_attn.py): one backend over FA2, FA3 and FA4."""

    name = "FLASH_ATTN"

    def supports_head_size(self, head_size, cap):  # flash_attn.py:425
        if head_size % 8 != 0:
            return False
        return head_size <= 256 or (fa_version_supported(4, cap) and head_size <= 512)

    def supports_kv_cache_dtype(self, kv_cache_dtype, cap):  # flash_attn.py:438
        if not super().supports_kv_cache_dtype(kv_cache_dtype, cap):
            return False  # FP8 needs FA3/FA4, asked here *without* a head size
        return (not is_quantized_kv_cache(kv_cache_dtype)
                or flash_attn_supports_kv_cache_dtype(cap, kv_cache_dtype))

    def kernel_block_sizes(self, cfg, cap):  # flash_attn.py:300-367
        head, kv = cfg["head_size"], cfg["kv_cache_dtype"]
        if cap[0] == 9 and kv in ("fp8", "fp8_e4m3") and head == 512:
            if flash_attn_version(cap, head_size=512) == 4:
                return [64]  # the SM90 FP8-KV FA4 kernel uses 64-token pages
        if head == 256 and cap[0] in (10, 11):
            version = flash_attn_version(cap, head_size=256, kv_cache_dtype=kv,
                                         hd256_kernel_ok=True)
            if version == 4:
                return [load_facts()["flash_attention"]["FA4_HD256_PAGE_SIZE"]]
        return super().kernel_block_sizes(cfg, cap)

    def supports_sink(self, cap):  # flash_attn_supports_sinks: FA3 or FA4 only
        return flash_attn_version(cap) in (3, 4)

    def supports_combination(self, cfg, cap):  # flash_attn.py:462
        kv, head, sink = cfg["kv_cache_dtype"], cfg["head_size"], cfg["has_sink"]
        if sink and cap < (9, 0):
            return "sink not supported on compute capability < 9.0"
        if is_quantized_kv_cache(kv) and not flash_attn_supports_kv_cache_dtype(
            cap, kv, head_size=head, head_size_v=head, has_sink=sink,
            block_size=cfg["block_size"], hd256_kernel_ok=True,
        ):  # this time *with* the head size: the FA version for this layer decides
            return ("FP8 KV cache requires FA3 on SM90, FA4 with head_size=512 on SM90, "
                    "or FA4 on SM100")
        return None


class _FlashInfer(_Backend):
    """FlashInferBackend (flashinfer.py): sinks and NVFP4 caches through TRTLLM kernels."""

    name = "FLASHINFER"

    def supports_kv_cache_dtype(self, kv_cache_dtype, cap):  # flashinfer.py:654
        if not kv_cache_dtype.startswith("nvfp4"):
            return super().supports_kv_cache_dtype(kv_cache_dtype, cap)
        if cap[0] in (8, 9, 12):  # _nvfp4_kv_on_fa2: the fa2 path writes plain nvfp4 only
            return kv_cache_dtype == "nvfp4"
        both = trtllm_available(cap, prefill=True) and trtllm_available(cap, prefill=False)
        return cap[0] == 10 and both

    def supports_sink(self, cap):  # flashinfer.py:707: the TRTLLM kernels only
        if cap == (9, 0) or cap[0] == 12:
            return trtllm_available(cap, prefill=False)
        both = trtllm_available(cap, prefill=False) and trtllm_available(cap, prefill=True)
        return cap[0] == 10 and both

    def supports_combination(self, cfg, cap):  # flashinfer.py:667
        if cfg["kv_cache_dtype"].startswith("nvfp4") and cap[0] in (8, 9, 12):
            if cfg["head_size"] == 64:
                return "fa2 prefill misreads an NVFP4 KV cache at head_size 64"
            if cfg["has_sink"]:
                return "the sink prefill wrapper cannot read an NVFP4 KV cache"
        return None


class _TritonAttn(_Backend):
    """TritonAttentionBackend (triton_attn.py): any head size from 32 up, any GPU."""

    name = "TRITON_ATTN"

    def supports_head_size(self, head_size, cap):  # triton_attn.py:379
        return head_size >= 32


class _TurboQuant(_Backend):
    """TurboQuantAttentionBackend (turboquant_attn.py): its own KV-cache formats only."""

    name = "TURBOQUANT"

    def supports_head_size(self, head_size, cap):  # turboquant_attn.py:190
        return head_size > 0

    def supports_kv_cache_dtype(self, kv_cache_dtype, cap):  # turboquant_attn.py:184
        return kv_cache_dtype.startswith("turboquant_")


# ---- the MLA backends (vllm/v1/attention/backends/mla/) ---------------------------------


class _FlashInferMLA(_Backend):
    """FlashInferMLABackend (mla/flashinfer_mla.py:228)."""

    name = "FLASHINFER_MLA"

    def supports_combination(self, cfg, cap):
        nope = _hf(cfg).get("qk_nope_head_dim", 1)
        if nope not in (64, 128, 192):
            return ("FlashInfer MLA kernel requires qk_nope_head_dim in [64, 128, 192], "
                    f"but got {nope}")
        return None


class _TokenspeedMLA(_Backend):
    """TokenspeedMLABackend (mla/tokenspeed_mla.py:133): DeepSeek-R1 dimensions only."""

    name = "TOKENSPEED_MLA"

    def supports_combination(self, cfg, cap):
        hf = _hf(cfg)
        dims = tuple(hf.get(k, 0) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                            "v_head_dim"))
        if dims != (128, 64, 128):
            return ("tokenspeed_mla requires DeepSeek R1 MLA dimensions (qk_nope_head_dim=128, "
                    f"qk_rope_head_dim=64, v_head_dim=128), got ({dims[0]}, {dims[1]}, "
                    f"{dims[2]})")
        return None


class _FlashAttnMLA(_Backend):
    """FlashAttnMLABackend (mla/flashattn_mla.py:73): FA3's MLA path, Hopper only."""

    name = "FLASH_ATTN_MLA"

    def supports_combination(self, cfg, cap):
        if cap[0] != 9:  # flash_attn_supports_mla
            return "FlashAttention MLA not supported on this device"
        return None


class _FlashMLA(_Backend):
    """FlashMLABackend (mla/flashmla.py:77; the texts are in v1/attention/ops/flashmla.py)."""

    name = "FLASHMLA"

    def supports_combination(self, cfg, cap):
        if cfg["use_sparse"]:
            if cap[0] not in (9, 10):
                return "FlashMLA Sparse is only supported on Hopper and Blackwell DC devices."
        elif cap[0] != 9:
            return "FlashMLA Dense is only supported on Hopper devices."
        return None


class _FlashMLASparse(_Backend):
    """FlashMLASparseBackend (mla/flashmla_sparse.py:207)."""

    name = "FLASHMLA_SPARSE"

    def supports_combination(self, cfg, cap):
        kv = cfg["kv_cache_dtype"]
        if cfg["head_size"] == 512:
            if kv in ("auto", "bfloat16", "float16", "fp8_ds_mla") and cap[0] == 9:
                if _hf(cfg).get("qk_rope_head_dim", 64) != 0:
                    return ("FLASHMLA_SPARSE supports head_size 512 only for rope-free (NoPE) "
                            "models")
            else:
                return ("FLASHMLA_SPARSE supports head_size 512 only with bf16 or fp8_ds_mla "
                        f"kv-cache on SM90 (NoPE), got kv_cache_dtype={kv}, "
                        f"capability=DeviceCapability(major={cap[0]}, minor={cap[1]})")
        if kv == "nvfp4_ds_mla" and cap[0] != 10:
            return f"FLASHMLA_SPARSE only supports the {kv} kv-cache dtype on SM100 (Blackwell)"
        return None


class _FlashAttnMLASparse(_Backend):
    """FlashAttnMLASparseBackend (mla/flashattn_mla_sparse.py:86)."""

    name = "FLASH_ATTN_MLA_SPARSE"

    def supports_combination(self, cfg, cap):
        if is_quantized_kv_cache(cfg["kv_cache_dtype"]):
            return "FlashAttention MLA Sparse currently supports only FP16/BF16 KV cache"
        if cap[0] != 9:
            return "FlashAttention MLA not supported on this device"
        if "index_topk" not in _hf(cfg):
            return "FlashAttention MLA Sparse requires model with index_topk"
        return None


class _FlashInferMLASparse(_Backend):
    """FlashInferMLASparseTRTLLMBackend (mla/flashinfer_mla_sparse.py:109).

    vLLM reads qk_nope_head_dim, qk_rope_head_dim and kv_lora_rank without a default; a
    config that does not give them skips those two checks here.
    """

    name = "FLASHINFER_MLA_SPARSE"

    def supports_combination(self, cfg, cap):
        if cfg["kv_cache_dtype"] == "fp8_ds_mla":
            return f"{self.name} SM10 does not support fp8_ds_mla kv-cache dtype"
        hf = _hf(cfg)
        nope, rope, rank = (hf.get(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                 "kv_lora_rank"))
        if rope == 0:
            if nope != 256 or rank != 512:
                return ("FlashInfer native no-rope MLA requires qk_nope_head_dim=256 and "
                        f"kv_lora_rank=512, but got qk_nope_head_dim={nope}, "
                        f"kv_lora_rank={rank}")
        elif nope is not None and nope not in (128, 192):
            return ("FlashInfer MLA Sparse kernel requires qk_nope_head_dim in [128, 192], "
                    f"but got {nope}")
        if "index_topk" not in hf:
            return "FlashInfer MLA Sparse requires model with index_topk config"
        return None


class _FlashAttnMLASparseFA4(_FlashInferMLASparse):
    """FlashAttnMLASparseFA4Backend (mla/flashattn_mla_sparse.py:304): its own checks,
    then those of the class it inherits from in vLLM, FlashInferMLASparseTRTLLMBackend."""

    name = "FLASH_ATTN_MLA_SPARSE_FA4"

    def supports_combination(self, cfg, cap):
        hf = _hf(cfg)
        if not fa_version_supported(4, cap):
            reason = load_facts()["flash_attention"]["_is_fa4_supported"]["unsupported_reason"]
            return f"FA4 unavailable: {reason}"
        topk = hf.get("index_topk")
        if topk is None or topk % 128 != 0:
            return f"FA4 sparse MLA requires index_topk % 128 == 0, got {topk}"
        dims = (hf.get("kv_lora_rank"), hf.get("qk_rope_head_dim"))
        if dims != (512, 64):
            return ("FA4 sparse MLA requires (kv_lora_rank, qk_rope_head_dim) == (512, 64), "
                    f"got {dims}")
        heads = (8, 16, 32, 64, 128)
        if "num_heads" in hf and hf["num_heads"] not in heads:
            return (f"FA4 sparse MLA requires {heads} gathered query heads, "
                    f"got num_heads={hf['num_heads']} * dcp_size=1")
        return super().supports_combination(cfg, cap)


class _FlashInferMLASparseSM90(_Backend):
    """FlashInferMLASparseSM90Backend (mla/flashinfer_mla_sparse_sm90.py:193)."""

    name = "FLASHINFER_MLA_SPARSE_SM90"

    def supports_combination(self, cfg, cap):
        hf = _hf(cfg)
        if not cfg["use_sparse"]:
            return "FLASHINFER_MLA_SPARSE_SM90 requires sparse MLA"
        if hf.get("kv_lora_rank", 512) != 512:
            return "FLASHINFER_MLA_SPARSE_SM90 requires kv_lora_rank=512"
        if hf.get("qk_rope_head_dim", 64) not in (0, 64):
            return "FLASHINFER_MLA_SPARSE_SM90 requires qk_rope_head_dim in (0, 64)"
        return None


class _FlashInferMLASparseSM120(_Backend):
    """FlashInferMLASparseSM120Backend (mla/flashinfer_mla_sparse.py:196)."""

    name = "FLASHINFER_MLA_SPARSE_SM120"

    def supports_combination(self, cfg, cap):
        hf = _hf(cfg)
        if cfg["dtype"] != "bfloat16":
            return "dtype not supported"
        if cfg["kv_cache_dtype"] not in ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla"):
            return "kv_cache_dtype not supported"
        if "index_topk" not in hf:
            return "FLASHINFER_MLA_SPARSE_SM120 requires a model with index_topk config"
        if int(hf["index_topk"]) != 2048:
            return f"FLASHINFER_MLA_SPARSE_SM120 requires index_topk=2048; got {hf['index_topk']}"
        return None


# ---- validation (AttentionBackend.validate_configuration) ---------------------------------


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
            ``normalize_config``, ``parse_capability`` and ``backend_facts`` do this).
    """
    cfg, cap = normalize_config(config), parse_capability(capability)
    b = _backend(backend)
    mla, sink, sparse = cfg["use_mla"], cfg["has_sink"], cfg["use_sparse"]
    checks = [  # (reason, does it apply?) in the order of backend.py:303-352
        ("head_size not supported", not b.supports_head_size(cfg["head_size"], cap)),
        ("dtype not supported", not b.supports_dtype(cfg["dtype"])),
        ("kv_cache_dtype not supported",
         not b.supports_kv_cache_dtype(cfg["kv_cache_dtype"], cap)),
        ("block_size not supported", not b.supports_block_size(cfg, cap)),
        ("MLA not supported", mla and not b.is_mla()),
        ("non-MLA not supported", not mla and b.is_mla()),
        ("attention sinks not supported", sink and not b.supports_sink(cap)),
        ("sparse not supported", sparse and not b.is_sparse()),
        ("non-sparse not supported", not sparse and b.is_sparse()),
        ("compute capability not supported", not b.supports_compute_capability(cap)),
        ("sliding window not supported",
         cfg["has_sliding_window"] and not b.supports_sliding_window()),
    ]
    reasons = [reason for reason, applies in checks if applies]
    combination = b.supports_combination(cfg, cap)  # backend.py:356-368: at most one, last
    return reasons if combination is None else [*reasons, combination]


# ---- the selector (vllm/platforms/cuda.py) ---------------------------------------------


def _priority_list(label: str) -> list[str]:
    """A list of the facts' ``priorities.lists`` without its use_mm_prefix-only entries."""
    return [b for b in load_facts()["priorities"]["lists"][label]["backends"]
            if isinstance(b, str)]


def backend_priorities(capability: Any, use_mla: bool, config: Any = None) -> list[str]:
    """``_get_backend_priorities`` (vllm/platforms/cuda.py:84): the backends to try, best first.

    Depends on the major version only, and for MLA on three config values that choose the
    sparse-MLA part of the list: whether the KV cache is quantized, whether ``num_heads``
    is at most 16 and whether ``head_size`` is 512 (README, Reference R4). ``config`` is
    optional; without it those are unknown: not quantized, not few heads, not 512.
    """
    cap = parse_capability(capability)
    cfg = normalize_config(config) if config is not None else {}
    if not use_mla:  # causal decoder attention; non-causal would prefer FLASH_ATTN on 10.x
        return _priority_list("non_mla_major_10_causal" if cap[0] == 10 else "non_mla_other")
    if cap[0] == 10:
        return _priority_list("mla_major_10") + _sm10_sparse_backends(cfg)
    if cap[0] == 12:
        return _priority_list("mla_major_12")
    tail = _priority_list("mla_other_sparse_tail")
    sm90 = ["FLASHINFER_MLA_SPARSE_SM90"]
    tail = sm90 + tail if cfg.get("head_size") == 512 else tail + sm90
    return _priority_list("mla_other") + tail


def _sm10_sparse_backends(cfg: dict) -> list[str]:
    """The ``sparse_backends`` splice of the 10.x MLA list (cuda.py:99-119)."""
    kv, heads = cfg.get("kv_cache_dtype"), cfg.get("num_heads")
    if kv is not None and is_quantized_kv_cache(kv):
        return _priority_list("mla_sm10_sparse_quantized_kv")
    if heads is not None and heads <= 16:
        return _priority_list("mla_sm10_sparse_bf16_few_heads")
    return _priority_list("mla_sm10_sparse_bf16")


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
    ``{config}`` is vLLM's ``AttentionSelectorConfig(head_size=..., ...)`` repr, which
    the given ``config_repr`` writes (the tests read only the text around it).

    With ``override`` (``--attention-backend NAME``): ``"auto"`` means no override and
    any case is accepted (``"flash_attn"``); an unknown name raises ``ValueError``
    starting ``Unknown attention backend: 'NAME'`` (the given ``backend_facts`` does
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
        return _select_override(name, cfg, cap)

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
        raise _no_valid_backend(cfg, rejected)
    chosen = valid[0]
    return Selection(backend=chosen, rejected=rejected, valid=valid,
                     warning=_block_size_warning(cfg, order, rejected, chosen))


def _select_override(name: str, cfg: dict, cap: tuple[int, int]) -> Selection:
    """cuda.py:442-446: the user's backend is chosen if valid; never a fallback."""
    reasons = validate_configuration(name, cfg, cap)
    if reasons:
        raise ValueError(
            f"Selected backend AttentionBackendEnum.{name} is not valid for this "
            f"configuration. Reason: {reasons}"
        )
    return Selection(backend=name, rejected={}, valid=[name])


def _no_valid_backend(cfg: dict, rejected: dict[str, list[str]]) -> ValueError:
    """cuda.py:458-475: every reason of every backend, joined as vLLM joins them."""
    reasons_str = ", ".join(f"{b}: [{', '.join(r)}]" for b, r in rejected.items())
    return ValueError(
        f"No valid attention backend found for cuda with {provided.config_repr(cfg)}. "
        f"Reasons: {{{reasons_str}}}."
    )


def _block_size_warning(cfg: dict, order: list[str], rejected: dict[str, list[str]],
                        chosen: str) -> str | None:
    """cuda.py:489-507: did the user's --block-size alone cost higher-priority backends?"""
    if cfg["block_size"] is None:
        return None
    above = order[:order.index(chosen)]
    precluded = [b for b in above if rejected.get(b) == ["block_size not supported"]]
    if not precluded:
        return None
    return (
        f"--block-size {cfg['block_size']} precluded higher-priority backend(s) "
        f"{', '.join(precluded)}. Using {chosen} instead, which may result in reduced "
        "performance. Consider removing --block-size to auto-select the optimal block size."
    )


def selection_matrix(gpus: Any = None, dtypes: Any = None, models: Any = None) -> dict:
    """``{(gpu, dtype, model): backend or None}`` over real GPUs, dtypes and models.

    ``gpus``: names from ``GPUS`` or a ``{name: (major, minor)}`` dict; ``models``: names
    from ``MODELS`` or a ``{name: config}`` dict (config without ``dtype``). ``None``
    means all of ``GPUS`` / ``DTYPES`` / ``MODELS``. A cell is None when no backend is
    valid (vLLM would refuse to start). The given ``format_matrix`` prints the answer.
    """
    gpus = provided.named(gpus, GPUS, "gpus")
    models = provided.named(models, MODELS, "models")
    dtypes = list(DTYPES if dtypes is None else dtypes)
    matrix = {}
    for gpu, cap in gpus.items():
        for dtype in dtypes:
            for model, model_config in models.items():
                matrix[(gpu, dtype, model)] = _backend_or_none({**model_config, "dtype": dtype},
                                                               cap)
    return matrix


def _backend_or_none(config: dict, capability: Any) -> str | None:
    try:
        return select_backend(config, capability).backend
    except ValueError as error:
        if not str(error).startswith("No valid attention backend"):
            raise  # a bad config is an error, not an empty cell
        return None


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
    import warnings

    import torch
    from torch.nn import attention

    outputs = {}
    for name, backend in attention.SDPBackend.__members__.items():
        if name == "ERROR":
            continue
        with warnings.catch_warnings():  # a refusing backend warns why; we report it
            warnings.filterwarnings("ignore")
            try:
                with attention.sdpa_kernel([backend]):
                    outputs[name] = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, **kw)
            except RuntimeError:  # this backend refuses these inputs
                continue
    return outputs


def _reference_output(q, k, v, mask, scale):
    """``common.reference_attention`` in float64 on SDPA's layout: [B, H, L, d] or [H, L, d]."""
    import torch

    from common.reference import reference_attention

    batched = q.dim() == 4
    qb, kb, vb = (t if batched else t[None] for t in (q, k, v))
    B, H, L, _ = qb.shape
    S = kb.shape[2]
    expected = []
    for b in range(B):  # the reference wants [L, heads, dim]
        m = None if mask is None else torch.broadcast_to(
            mask if mask.dim() <= 3 else mask[b % mask.shape[0]], (H, L, S)).numpy()
        out, _ = reference_attention(qb[b].transpose(0, 1), kb[b].transpose(0, 1),
                                     vb[b].transpose(0, 1), scale=scale, mask=m)
        expected.append(torch.from_numpy(out).transpose(0, 1))  # [H, L, dv]
    return torch.stack(expected) if batched else expected[0]


def sdpa_bisect(q: Any, k: Any, v: Any, **kw: Any) -> dict[str, float]:
    """``{backend: max |out - reference|}`` for every SDPA backend that runs the inputs.

    The reference is ``common.reference_attention`` in float64. ``kw`` are SDPA's own
    arguments: ``attn_mask`` (boolean, True = may attend), ``is_causal`` (top-left),
    ``scale``, ``enable_gqa``. Backends differ from each other in the last bits because
    they add in different orders, not because any of them approximates.
    """
    torch = _sdpa_inputs(q, k, v)
    attn_mask, is_causal = kw.get("attn_mask"), kw.get("is_causal", False)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise ValueError(
            f"attn_mask must be boolean here (True = may attend), got {attn_mask.dtype}")
    if attn_mask is not None and is_causal:
        raise ValueError("give attn_mask or is_causal, not both (SDPA refuses both)")
    mask = None if attn_mask is None else attn_mask.cpu()
    if is_causal:  # SDPA's is_causal is top-left: query i sees keys 0..i
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    expected = _reference_output(q, k, v, mask, kw.get("scale"))
    return {name: float((out.detach().double().cpu() - expected).abs().max())
            for name, out in _run_each_backend(q, k, v, **kw).items()}


# ---- vocabulary ---------------------------------------------------------------------------

# math: what is computed. api: how you ask for it. kernel: code that computes it on a
# device. runtime: the serving system around the kernels (KV-cache memory, scheduling).
_TERMS: dict[str, str] = {
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
    if key not in _TERMS:
        raise ValueError(f"unknown term {term!r}; known terms: {sorted(_TERMS)}")
    return _TERMS[key]
