"""Inside each lab's test process: a call's arguments, there and back.

Pickled for the worker (the rules of :mod:`common.grading.wire`; remote objects and
functions as their handles), and what the call wrote into arrays and tensors (``.grad``
included) copied back into the caller's own objects.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from common.grading import leaves, wire, wire_values
from common.grading.remote import RemoteFunction, RemoteMethod, RemoteObject


class _ArgsPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        return wire.reduce_special(obj, strict=False)

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _ATOMIC:
            return None
        if isinstance(obj, RemoteMethod):
            return ("meth", obj._owner._ref, obj._name)
        if isinstance(obj, RemoteObject | RemoteFunction):
            return obj._ref
        return None


_ATOMIC = frozenset((type(None), bool, int, float, str, bytes, tuple, list, dict))


def dumps_args(message: tuple) -> bytes:
    buf = io.BytesIO()
    _ArgsPickler(buf, protocol=wire.PROTOCOL).dump(message)
    return buf.getvalue()


def apply_changes(args: tuple, kwargs: dict, changes: list) -> None:
    """Copy what the worker wrote into its copies of the arguments into the caller's."""
    for path, value, grad in changes or []:
        try:
            dst = leaves.find_leaf(args, kwargs, tuple(path))
        except (LookupError, TypeError):
            continue
        if value is not None:
            _copy_into(dst, value)
        if grad is not None and wire_values.is_plain_tensor(dst):
            dst.grad = grad


def _copy_into(dst: Any, src: Any) -> None:
    if wire_values.is_plain_tensor(dst):
        import torch

        if wire_values.is_plain_tensor(src) and src.shape == dst.shape:
            with torch.no_grad():
                dst.copy_(src)
        return
    import numpy as np

    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray) and src.shape == dst.shape:
        if dst.flags.writeable:
            np.copyto(dst, src, casting="unsafe")
