"""What crosses between the grader's trusted test process and the sandboxed worker.

Both sides import this module (the worker its copy in the scratch tree); the frames that
carry the pickles are :mod:`grading.sandbox.frames`.

- Values pickle cannot be trusted with: torch CPU tensors re-encoded as a numpy array of
  their storage with dtype, size and strides (so that no ``torch.load`` ever runs on the
  trusted side, and a strided view stays one); dtypes, devices and sizes by name; read-only
  numpy arrays marked as such. The rebuild functions validate what they are given: the
  worker is not trusted.
- The pickling rules. Arguments go to the worker as ordinary pickles (the worker trusts the
  test process). Results come back through :class:`SafeUnpickler`, which builds only an
  allow-list of types: plain Python data, numpy arrays and scalars, torch CPU tensors
  (re-encoded), and the data types (NamedTuples, dataclasses, enums, exceptions) of a lab's
  ``provided.py`` and of ``common``, resolved to the *trusted* process's own copies.
  Anything else the worker would return (an object of a class the student defined, a
  generator, a function) stays in the worker and comes back as a handle
  (``persistent_id``), whose use is forwarded.
- The arguments a call writes into: both sides walk a call's arguments in the same order
  (:func:`iter_leaves`: every numpy array and tensor, looking into lists, tuples and
  dicts); the worker reports the ones whose bytes or ``.grad`` changed, by path, and the
  trusted side copies them into the caller's objects.
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import enum
import fractions
import io
import pickle
import re
import sys
import threading
from typing import Any

# ---- wire values -------------------------------------------------------------------------


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
    numel = 1
    for n in size:
        numel *= n
    _charge(numel * target.itemsize)  # a view of one element may claim billions of them
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


# ---- wire --------------------------------------------------------------------------------


PROTOCOL = 5


def _global(module: str, qualname: str) -> Any:
    """A class of a lab's ``provided.py`` (allow-listed as :func:`resolve_global` says)."""
    return resolve_global(str(module), str(qualname))


def _given(module: str, qualname: str) -> Any:
    """Any class of a lab's ``provided.py`` (arguments: the worker trusts the test process)."""
    if not PROVIDED_MODULE.match(module):
        raise pickle.UnpicklingError(f"{module} is not a lab's provided module")
    return _walk(sys.modules[module], qualname)


def reduce_special(obj: Any, strict: bool = True) -> Any:
    """``reducer_override`` body: tensors, dtypes, devices and sizes by our encodings;
    read-only numpy arrays marked as such; classes of a lab's ``provided.py`` by name (it is
    loaded from its path, so pickle could not import it). ``strict``: results (the trusted
    side accepts only data classes), else arguments."""
    if isinstance(obj, type) and PROVIDED_MODULE.match(getattr(obj, "__module__", "") or ""):
        return (_global if strict else _given, (obj.__module__, obj.__qualname__))
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(obj) is numpy.ndarray and not obj.flags.writeable:
        return (_readonly, (numpy.array(obj),))
    torch = _torch()
    if torch is None:
        return NotImplemented
    if is_plain_tensor(obj):
        return encode_tensor(obj)
    if isinstance(obj, torch.dtype):
        return (_dtype, (str(obj).replace("torch.", ""),))
    if isinstance(obj, torch.device):
        return (_device, (str(obj),))
    if type(obj) is torch.Size:
        return (_size, (tuple(obj),))
    return NotImplemented


_BUILTIN_DATA = {
    "int", "float", "complex", "str", "bytes", "bytearray", "list", "tuple", "dict", "set",
    "frozenset", "slice", "range", "bool", "object", "Ellipsis", "NotImplemented",
}
_NUMPY_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
}
_STDLIB_GLOBALS = {
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "defaultdict"),
    ("collections", "Counter"), ("fractions", "Fraction"), ("decimal", "Decimal"),
}
_WIRE_GLOBALS = {  # the rebuild functions of our encodings
    *((__name__, n) for n in ("_tensor", "_dtype", "_device", "_size", "_readonly")),
    (__name__, "_global"),
}
PROVIDED_MODULE = re.compile(r"^lab_\w+\.provided$")


def is_data_class(cls: Any) -> bool:
    """A class whose instances are plain data: a NamedTuple, a dataclass, an enum, an
    exception. These may be rebuilt on the trusted side (from its own class)."""
    if not isinstance(cls, type):
        return False
    if issubclass(cls, BaseException) or issubclass(cls, enum.Enum):
        return True
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return True
    return dataclasses.is_dataclass(cls)


def given_module(module: str) -> bool:
    """A module of given (instructor) code: a lab's ``provided.py`` or ``common``."""
    return bool(PROVIDED_MODULE.match(module)) or module == "common" or module.startswith(
        "common.")


def _walk(module_obj: Any, qualname: str) -> Any:
    obj = module_obj
    for part in qualname.split("."):
        if part.startswith("__") or part == "<locals>":
            raise AttributeError(qualname)
        obj = getattr(obj, part)
    return obj


def _builtin_global(module: str, qualname: str, modules: dict[str, Any]) -> Any:
    if module != "builtins":
        return None
    candidate = _builtin(qualname)
    if qualname in _BUILTIN_DATA:
        return candidate
    if isinstance(candidate, type) and issubclass(candidate, BaseException):
        return candidate
    return None


def _library_global(module: str, qualname: str, modules: dict[str, Any]) -> Any:
    if (module, qualname) in _NUMPY_GLOBALS and module in modules:
        return _walk(modules[module], qualname)
    if (module, qualname) in _STDLIB_GLOBALS:
        return _walk(__import__(module), qualname)
    if (module, qualname) in _WIRE_GLOBALS:
        return getattr(sys.modules[module], qualname)
    if module.startswith("numpy.dtypes") and module in modules and "numpy" in modules:
        candidate = _walk(modules[module], qualname)
        if isinstance(candidate, type) and issubclass(candidate, modules["numpy"].dtype):
            return candidate
    return None


def _given_global(module: str, qualname: str, modules: dict[str, Any]) -> Any:
    if not given_module(module) or module not in modules:
        return None
    try:
        candidate = _walk(modules[module], qualname)
    except AttributeError:
        return None
    return candidate if is_data_class(candidate) else None


def resolve_global(module: str, qualname: str, modules: dict[str, Any] | None = None) -> Any:
    """The trusted object that ``module.qualname`` names, if it is on the allow-list;
    ``pickle.UnpicklingError`` otherwise. Never imports a module that is not loaded (except
    a few standard-library ones)."""
    modules = sys.modules if modules is None else modules
    for rule in (_builtin_global, _library_global, _given_global):
        found = rule(module, qualname, modules)
        if found is not None:
            return found
    raise pickle.UnpicklingError(f"{module}.{qualname} is not allowed in a result")


def _builtin(name: str) -> Any:
    import builtins

    return getattr(builtins, name, None)


def allowed_by_name(obj: Any) -> bool:
    """Would :func:`resolve_global` accept the class or function ``obj`` (by its name)?"""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return False
    try:
        return resolve_global(module, qualname) is obj
    except (pickle.UnpicklingError, AttributeError, ImportError):
        return False


_PLAIN = frozenset((
    type(None), pickle.PickleBuffer, bool, int, float, complex, str, bytes, bytearray, list,
    tuple, dict, set, frozenset, slice, range, type(Ellipsis), type(NotImplemented),
    collections.OrderedDict, collections.deque, collections.defaultdict, collections.Counter,
    fractions.Fraction, decimal.Decimal,
))


def by_value(obj: Any) -> bool:
    """Whether the worker sends ``obj`` itself (pickled) rather than a handle to it."""
    cls = type(obj)
    if cls in _PLAIN:
        return True
    if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__"):
        return allowed_by_name(obj)  # classes and pickling helpers, by name
    if cls.__module__ == "builtins" and issubclass(cls, BaseException):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if cls is numpy.ndarray or isinstance(obj, numpy.dtype):
            return True
        if isinstance(obj, numpy.generic) and cls.__module__ == "numpy":
            return True
    if is_plain_tensor(obj):
        return True
    torch = _torch()
    if torch is not None and (isinstance(obj, torch.dtype | torch.device) or cls is torch.Size):
        return True
    return is_data_class(cls) and allowed_by_name(cls)


class SafeUnpickler(pickle.Unpickler):
    """Unpickles what the worker sent: allow-listed globals only; handles via ``on_handle``."""

    def __init__(self, data: bytes, on_handle: Any) -> None:
        super().__init__(io.BytesIO(data))
        self._on_handle = on_handle

    def find_class(self, module: str, name: str) -> Any:
        return resolve_global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        return self._on_handle(pid)


MAX_DECODED = 256 << 20  # bytes a reply may hold once decoded (a tensor's logical size)
_decoding = threading.local()


class DecodedTooLarge(ValueError):
    """A reply that would decode to more than :data:`MAX_DECODED` bytes."""


def _charge(nbytes: int) -> None:
    """Count ``nbytes`` against the reply being decoded; raise before building past it."""
    left = getattr(_decoding, "left", None)
    if left is None:
        return
    if nbytes > left:
        raise DecodedTooLarge(f"the reply decodes to more than {MAX_DECODED >> 20} MiB (the "
                              "grader's limit for a result)")
    _decoding.left = left - nbytes


def loads_untrusted(data: bytes, on_handle: Any, max_decoded: int = MAX_DECODED) -> Any:
    """What the worker sent, decoded by :class:`SafeUnpickler` within ``max_decoded`` bytes
    (its frame's bytes, plus what its tensors claim beyond them)."""
    _decoding.left = max(0, max_decoded - len(data))
    try:
        return SafeUnpickler(data, on_handle).load()
    finally:
        _decoding.left = None


# ---- leaves ------------------------------------------------------------------------------


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
