"""The one place the course imports Triton, and the few helpers every kernel launcher uses.

    from common.triton_env import tl, triton            # in a lab's starter.py / solution.py
    from common.triton_env import DEVICE, HAVE_TRITON   # in tests

* The interpreter is switched on (``TRITON_INTERPRET=1``) before triton is imported when
  torch sees no CUDA device, so kernels run on CPU tensors.
* Where triton is not installed (macOS, Windows: triton ships Linux wheels only), ``triton``
  and ``tl`` are stand-ins: ``@triton.jit`` still decorates, so a lab's module imports and
  its numpy half runs; launching a kernel raises :class:`TritonUnavailable`, which says how
  to get triton. Tests marked ``triton`` are skipped there by ``conftest.py``.

Kernels use ``exp2`` with ``log2(e)`` folded into the softmax scale (``LOG2E``), as
FlashAttention's and FlashInfer's CUDA kernels and Triton's fused attention tutorial do:
``exp2`` is the GPU's special-function instruction (vLLM 0.33.0's Triton kernels call
``tl.exp``).
"""

from __future__ import annotations

import math
from typing import Any

from common.device import configure_triton, has_cuda, triton_device

INTERPRET = configure_triton()

TRITON_MISSING = (
    "the triton package is not installed here (triton publishes Linux wheels only): run the "
    "Triton half on Linux, in WSL2 on Windows, or in the repository's dev container "
    "(.devcontainer/); the numpy half of every lab runs without it"
)


class TritonUnavailable(RuntimeError):
    """Raised when a kernel is launched on a machine where triton is not installed."""


class _MissingKernel:
    """What ``@triton.jit`` returns without triton: importable, not launchable."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid: Any) -> Any:
        raise TritonUnavailable(f"cannot launch {self.__name__}: {TRITON_MISSING}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TritonUnavailable(f"cannot call {self.__name__}: {TRITON_MISSING}")


class _MissingTriton:
    """Stand-in for the ``triton`` module: decorators work, everything else raises."""

    def jit(self, fn: Any = None, **kwargs: Any) -> Any:
        return _MissingKernel(fn) if fn is not None else _MissingKernel

    def __getattr__(self, name: str) -> Any:
        raise TritonUnavailable(f"triton.{name}: {TRITON_MISSING}")


class _MissingLanguage:
    """Stand-in for ``triton.language``: ``tl.constexpr`` exists for annotations."""

    constexpr = Any

    def __getattr__(self, name: str) -> Any:
        raise TritonUnavailable(f"triton.language.{name}: {TRITON_MISSING}")


try:
    import triton  # noqa: E402  (must follow configure_triton)
    import triton.language as tl  # noqa: E402

    HAVE_TRITON = True
except ImportError:  # macOS, Windows, or a machine without the package
    triton = _MissingTriton()  # type: ignore[assignment]
    tl = _MissingLanguage()  # type: ignore[assignment]
    HAVE_TRITON = False

DEVICE = triton_device()
LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)

# The smallest tile a tl.dot accepts on every backend (rows, columns and the inner dim).
MIN_DOT_TILE = 16


def on_interpreter(t: Any = None) -> bool:
    """True when kernels run through the CPU interpreter (for tensor ``t``, if given).

    The one answer every launcher uses: interpreter mode is on, or the tensor is not on a
    CUDA device (a CPU tensor can only be run by the interpreter).
    """
    if INTERPRET or not has_cuda():
        return True
    return t is not None and getattr(getattr(t, "device", None), "type", "cuda") != "cuda"


def launch_target(t: Any = None) -> Any:
    """The ``common.launch_plan.Target`` a launch on ``t`` runs on: the interpreter's, or the
    CUDA device's (compute capability and SM count read from torch)."""
    from common import launch_plan

    if on_interpreter(t):
        return launch_plan.INTERPRETER
    import torch

    props = torch.cuda.get_device_properties(getattr(t, "device", None) or 0)
    return launch_plan.target_for(props.major * 10 + props.minor, props.multi_processor_count)


PLAN_TARGET: Any = None  # set by bench.gpu_compile to compile another arch's plan


def plan_target() -> Any:
    """The target of a launcher's GPU tiles: this machine's CUDA device (so an sm_86 / sm_89
    part gets a plan that fits its 99 KB of shared memory a block), or the H100, the
    reference ``make gpu-report`` and ``make bench`` plan for, where there is none
    (``PLAN_TARGET``, when set, wins: the report compiles each arch's own plan)."""
    from common import launch_plan

    if PLAN_TARGET is not None:
        return PLAN_TARGET
    if INTERPRET or not has_cuda():
        return launch_plan.H100
    return launch_target()


def dot_precision(dtype: Any) -> str:
    """``input_precision`` for ``tl.dot`` on inputs of ``dtype``.

    float32 inputs use ``"ieee"`` (exact float32 products: on a GPU the default is TF32,
    10 mantissa bits, which would miss float32 tolerances); float16/bfloat16 inputs are
    multiplied exactly by the tensor cores anyway, so their value is ``"tf32"`` (ignored).
    """
    return "ieee" if "float32" in str(dtype) else "tf32"


def dot_tile(n: int, minimum: int = MIN_DOT_TILE) -> int:
    """The smallest power of two ``>= n`` and ``>= minimum``: a ``tl.dot``-legal size.

    Head dims like 24, 40, 80 or 96 are padded up (masked loads fill the pad with zeros);
    the softmax scale must still come from the real head dim, never the padded one.
    """
    if n < 1:
        raise ValueError(f"n={n}: a tile dimension must be >= 1")
    return max(minimum, 1 << (int(n) - 1).bit_length())


def tile_config(t: Any = None, *, gpu: dict[str, int], interpreter: dict[str, int],
                **overrides: int | None) -> dict[str, int]:
    """Pick a launcher's tile sizes: the GPU config or the interpreter's, then overrides.

    ``overrides`` are the launcher's keyword-only tile arguments (``block_m=None`` means
    "the launcher's choice"). An override must be a power of two ``>= 16`` (``tl.dot``'s
    minimum) or ``ValueError`` names it. Example::

        cfg = tile_config(q, gpu={"block_m": 128, "block_n": 64},
                          interpreter={"block_m": 16, "block_n": 16},
                          block_m=block_m, block_n=block_n)
    """
    config = dict(interpreter if on_interpreter(t) else gpu)
    for name, value in overrides.items():
        if value is None:
            continue
        if name not in config:
            raise ValueError(f"{name}={value}: not a tile size of this kernel ({sorted(config)})")
        if isinstance(value, bool) or not isinstance(value, int) or value < MIN_DOT_TILE or (
            value & (value - 1)
        ):
            raise ValueError(f"{name}={value!r}: must be a power of two >= {MIN_DOT_TILE}")
        config[name] = value
    return config


def check_kernel_dtype(t: Any, name: str) -> None:
    """The one bf16 rule: the interpreter's bfloat16 ``tl.dot`` is wrong, so refuse it there.

    ``ValueError`` names the argument. float16 and float32 run correctly on the CPU; bf16
    runs on a GPU only.
    """
    import torch

    if t.dtype == torch.bfloat16 and on_interpreter(t):
        raise ValueError(
            f"{name} is bfloat16 but kernels run through the Triton interpreter here, whose "
            "bfloat16 tl.dot returns wrong values: use float16 or float32 on the CPU "
            "(bfloat16 runs on a GPU)"
        )
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"{name} has dtype {t.dtype}: use float16, bfloat16 or float32")


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints (host-side grid arithmetic)."""
    return -(-a // b)


def log2e_scale(scale: float) -> float:
    """The softmax scale with ``log2(e)`` folded in, for kernels that use ``exp2``."""
    return float(scale) * LOG2E


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(head_dim)`` from the real (unpadded) head dim."""
    return 1.0 / math.sqrt(head_dim)


__all__ = [
    "DEVICE", "HAVE_TRITON", "INTERPRET", "LOG2E", "MIN_DOT_TILE", "TRITON_MISSING",
    "TritonUnavailable", "cdiv", "check_kernel_dtype", "default_scale", "dot_precision",
    "dot_tile", "log2e_scale", "on_interpreter", "tile_config", "tl",
    "triton",
]
