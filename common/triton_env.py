"""Import Triton through here so the interpreter is switched on first when there is no GPU.

    from common.triton_env import DEVICE, tl, triton

``DEVICE`` is the torch device the kernels' tensors must live on (``"cpu"`` under the
interpreter, ``"cuda"`` otherwise).
"""

from __future__ import annotations

from common.device import configure_triton, triton_device

INTERPRET = configure_triton()

import triton  # noqa: E402  (must follow configure_triton)
import triton.language as tl  # noqa: E402

DEVICE = triton_device()

__all__ = ["DEVICE", "INTERPRET", "tl", "triton"]
