"""What crosses to and from a worker: the values pickle cannot be trusted with.

Torch CPU tensors re-encoded as a numpy array of their storage with dtype, size and strides
(so that no ``torch.load`` ever runs on the trusted side, and a strided view stays one);
dtypes, devices and sizes by name; read-only numpy arrays marked as such. The rebuild
functions validate what they are given: the worker is not trusted.
"""

from __future__ import annotations

import sys
from typing import Any

_TORCH_VIEW_AS = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8",
                  "float8_e4m3fnuz": "uint8", "float8_e5m2fnuz": "uint8"}


def _torch() -> Any:
    return sys.modules.get("torch")


def is_plain_tensor(obj: Any) -> bool:
    torch = _torch()
    if torch is None:
        return False
    return type(obj) in (torch.Tensor, torch.nn.Parameter)


def encode_tensor(t: Any) -> tuple:
    """``(rebuild, args)`` for a CPU tensor, keeping its strides (a strided view stays one)."""
    torch = _torch()
    requires_grad = bool(t.requires_grad) and t.is_leaf  # a leaf the receiver differentiates
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    name = str(t.dtype).replace("torch.", "")
    size, stride = tuple(t.shape), tuple(t.stride())
    span = 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(size, stride))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
    if name in _TORCH_VIEW_AS:
        flat = flat.view(getattr(torch, _TORCH_VIEW_AS[name]))
    data = flat.numpy().copy()
    return (_tensor, (data, name, size, stride, requires_grad))


def _tensor(data: Any, dtype: str, size: tuple, stride: tuple, requires_grad: bool) -> Any:
    """Rebuild a tensor from :func:`encode_tensor` (validated: the worker is not trusted)."""
    import numpy as np
    import torch

    target = getattr(torch, str(dtype), None)
    if not isinstance(target, torch.dtype) or type(data) is not np.ndarray or data.ndim != 1:
        raise ValueError(f"not a tensor encoding: dtype {dtype!r}")
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    if len(size) != len(stride) or min((*size, *stride, 0)) < 0:
        raise ValueError("bad tensor size/stride")
    span = 0 if 0 in size else 1 + sum((n - 1) * s for n, s in zip(size, stride))
    if span > data.shape[0]:
        raise ValueError("tensor strides reach past its data")
    flat = torch.from_numpy(np.ascontiguousarray(data))
    if str(dtype) in _TORCH_VIEW_AS:
        flat = flat.view(target)
    elif flat.dtype != target:
        raise ValueError(f"tensor data of dtype {flat.dtype} declared as {dtype}")
    out = torch.as_strided(flat, size, stride, 0)
    if requires_grad and out.is_floating_point():
        out.requires_grad_(True)
    return out


def _dtype(name: str) -> Any:
    import torch

    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return value


def _device(name: str) -> Any:
    import torch

    return torch.device(str(name))


def _size(dims: tuple) -> Any:
    import torch

    return torch.Size(int(d) for d in dims)


def _readonly(array: Any) -> Any:
    """A read-only numpy array stays read-only on the other side (a test may pass one to
    catch a function that writes into its input)."""
    import numpy as np

    if type(array) is not np.ndarray:
        raise ValueError("not an array")
    array.flags.writeable = False
    return array
