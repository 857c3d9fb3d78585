"""What crosses to and from a worker: the arguments a call writes into.

Both sides walk a call's arguments in the same order (:func:`iter_leaves`: every numpy array
and tensor, looking into lists, tuples and dicts); the worker reports the ones whose bytes
or ``.grad`` changed, by path, and the trusted side copies them into the caller's objects.
"""

from __future__ import annotations

import sys
from typing import Any

from common.grading.wire_values import encode_tensor, is_plain_tensor


def _is_leaf(obj: Any) -> bool:
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(obj) is numpy.ndarray:
        return obj.dtype != object
    return is_plain_tensor(obj)


def _walk_leaves(obj: Any, path: tuple, depth: int, max_depth: int):
    if _is_leaf(obj):
        yield path, obj
    elif depth >= max_depth:
        return
    elif type(obj) in (list, tuple) or (isinstance(obj, tuple) and hasattr(obj, "_fields")):
        for i, item in enumerate(obj):
            yield from _walk_leaves(item, (*path, i), depth + 1, max_depth)
    elif type(obj) is dict:
        for key, item in obj.items():
            if isinstance(key, str | int):
                yield from _walk_leaves(item, (*path, key), depth + 1, max_depth)


def iter_leaves(args: tuple, kwargs: dict, max_depth: int = 3):
    """``(path, array)`` for every numpy array and tensor among the arguments, looking into
    lists, tuples (NamedTuples too) and dicts; both sides walk in the same order."""
    for i, arg in enumerate(args):
        if type(arg) not in _SCALARS:
            yield from _walk_leaves(arg, ("a", i), 0, max_depth)
    for key, arg in kwargs.items():
        if type(arg) not in _SCALARS:
            yield from _walk_leaves(arg, ("k", key), 0, max_depth)


_SCALARS = frozenset((type(None), bool, int, float, complex, str, bytes))


def find_leaf(args: tuple, kwargs: dict, path: tuple) -> Any:
    obj: Any = args if path[0] == "a" else kwargs
    for step in path[1:]:
        obj = obj[step]
    return obj


def leaf_bytes(leaf: Any) -> bytes:
    if is_plain_tensor(leaf):
        return encode_tensor(leaf)[1][0].tobytes()
    return leaf.tobytes()


def leaf_grad(leaf: Any) -> Any:
    return leaf.grad if is_plain_tensor(leaf) else None
