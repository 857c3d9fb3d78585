"""Where kernels run: a CUDA device if there is one, else the Triton interpreter on the CPU.

The one rule that matters: ``TRITON_INTERPRET=1`` must be in the environment *before*
``triton`` is first imported, so :func:`configure_triton` runs at ``conftest.py`` import
time and at ``common.triton_env`` import time.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def has_cuda() -> bool:
    """True when torch sees a CUDA device (False when torch itself is missing)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def configure_triton() -> bool:
    """Select the Triton interpreter when there is no CUDA device. Returns interpreter mode.

    A user's explicit ``TRITON_INTERPRET`` (``0`` or ``1``) is respected.
    """
    if "TRITON_INTERPRET" not in os.environ and not has_cuda():
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreter_mode()


def interpreter_mode() -> bool:
    """True when Triton kernels run through the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_device() -> str:
    """The torch device Triton kernels expect: ``"cpu"`` in interpreter mode, else ``"cuda"``."""
    return "cpu" if interpreter_mode() or not has_cuda() else "cuda"


def describe() -> str:
    """One line for test headers and benchmark records."""
    if interpreter_mode():
        return "Triton: interpreter on the CPU (TRITON_INTERPRET=1): correct results, not timings"
    if has_cuda():
        import torch

        return f"Triton: CUDA on {torch.cuda.get_device_name()}"
    return "Triton: no CUDA device and the interpreter is off: Triton tests will fail"
