"""Lab 02 (starter): the attention-backend dispatcher, as vLLM 0.33.0 runs it.

Your job: the seven functions below that raise NotImplementedError. The given code is in
``provided.py`` (the facts file loader, the input checks, the GPU and model tables, and
the answers the GPU gives: which FlashAttention version loads, whether FlashInfer's
TRTLLM kernels exist); the names you need are imported below.

Read the README first (its "Reference" section lists every rule); run the tests with
    LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-02-backend-selection -q
and print your selection matrix with
    LAB_IMPL=starter .venv/bin/python labs/lab-02-backend-selection/provided.py --matrix
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
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=02 STEP=1 LEVEL=1)")


def backend_priorities(capability: Any, use_mla: bool, config: Any = None) -> list[str]:
    """``_get_backend_priorities`` (vllm/platforms/cuda.py:84): the backends to try, best first.

    Depends on the major version only, and for MLA on three config values that choose the
    sparse-MLA part of the list: whether the KV cache is quantized, whether ``num_heads``
    is at most 16 and whether ``head_size`` is 512 (README, Reference R4). ``config`` is
    optional; without it those are unknown: not quantized, not few heads, not 512.
    """
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=02 STEP=2 LEVEL=1)")


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
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=02 STEP=2 LEVEL=1)")


def selection_matrix(gpus: Any = None, dtypes: Any = None, models: Any = None) -> dict:
    """``{(gpu, dtype, model): backend or None}`` over real GPUs, dtypes and models.

    ``gpus``: names from ``GPUS`` or a ``{name: (major, minor)}`` dict; ``models``: names
    from ``MODELS`` or a ``{name: config}`` dict (config without ``dtype``). ``None``
    means all of ``GPUS`` / ``DTYPES`` / ``MODELS``. A cell is None when no backend is
    valid (vLLM would refuse to start). The given ``format_matrix`` prints the answer.
    """
    raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=02 STEP=3 LEVEL=1)")


def sdpa_backends_that_run(q: Any, k: Any, v: Any, attn_mask: Any = None,
                           is_causal: bool = False) -> list[str]:
    """The ``torch.nn.attention.SDPBackend`` names that accept these inputs here.

    Each backend is tried alone under ``sdpa_kernel``: SDPA is an API, and which kernel
    runs depends on the device, dtype, shapes and mask. On a CPU that is MATH and the
    CPU FLASH_ATTENTION kernel; on an H100 typically FLASH, EFFICIENT, CUDNN and MATH.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=02 STEP=4 LEVEL=1)")


def sdpa_bisect(q: Any, k: Any, v: Any, **kw: Any) -> dict[str, float]:
    """``{backend: max |out - reference|}`` for every SDPA backend that runs the inputs.

    The reference is ``common.reference_attention`` in float64. ``kw`` are SDPA's own
    arguments: ``attn_mask`` (boolean, True = may attend), ``is_causal`` (top-left),
    ``scale``, ``enable_gqa``. Backends differ from each other in the last bits because
    they add in different orders, not because any of them approximates.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=02 STEP=4 LEVEL=1)")


def classify(term: str) -> str:
    """``"math" | "api" | "kernel" | "runtime"`` for a term of the field.

    SDPA is an API (it dispatches to a kernel); FlashAttention is a kernel that computes
    the exact math; PagedAttention is runtime memory management of the KV cache (its
    kernels are ``paged_attention_v1/v2``); softmax(QKᵀ/√d)V is the math.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=02 STEP=4 LEVEL=1)")
