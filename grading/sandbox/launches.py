"""Inside the sandbox: which Triton kernels a call launched, and which of its output tensors
hold what their stores wrote (the interpreter's launch, load, store and atomics, recorded in
the worker).

The worker installs :func:`install` once, before it imports the graded module. Around each
call of a Triton test (the only calls whose record the trusted side reads; the others are not
recorded), :func:`recording` collects the kernels the interpreter ran (name, and whether it is a
kernel of the graded file) and, per address written, the bytes last written there and by
whom (a kernel of the graded file, one of the lab's given kernels, another). After the call,
:func:`report` says, for each tensor the call returned or wrote into, the share of its
elements whose bytes are what the graded file's kernels wrote there, or what the lab's given
merge kernel wrote from their partials (lab-06's ``provided.merge_splits``): plain data the
trusted side checks (a Triton test's launcher must launch its lab's kernel, and that
kernel's stores must make the output; a kernel that stores into a scratch buffer while torch
computes the answer, or whose output torch overwrites, made nothing).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator
from typing import Any

_STATE: dict[str, Any] = {"file": None, "active": None, "installed": False}


class _Record:
    def __init__(self) -> None:
        self.kernels: list[tuple[str, bool]] = []
        # address -> (bytes written there last, as an unsigned int; who wrote it: OWN, a
        # given kernel's launch number, or OTHER)
        self.last: dict[int, tuple[int, int]] = {}
        self.merges: list[list[int]] = []  # per given launch: [elements loaded, own-made]
        self.writer = OTHER  # the running launch
        self.stored = 0  # elements the file's own kernels stored
        self.unknown = False  # Triton was imported during the call: launches went unseen
        # what the graded file's kernels may load as the call's own inputs: the arguments'
        # values when the call began (``originals``: tensor, its copy then), indexed by
        # address at the first launch (``inputs``: sorted addresses, their bits, width), and
        # the buffers an own launch was given that are an elementwise conversion of one
        # (``prepared``: byte ranges)
        self.originals: list[tuple[Any, Any]] = []
        self.inputs: list[tuple[Any, Any, int]] | None = None
        self.prepared: list[tuple[int, int]] = []
        # values the graded file's kernels loaded from anywhere else (a buffer the call
        # made: torch's answer?), by dtype: {(numpy dtype, Triton dtype): [unique values]}
        self.foreign: dict[tuple[str, str], list[Any]] = {}
        self.foreign_count = 0


OWN, OTHER = -1, -2  # writers: a kernel of the graded file; any kernel but the lab's given ones


def _bits(values: Any) -> Any:
    """Loaded or stored values as unsigned ints of their width (NaN bytes compare equal)."""
    import numpy as np

    values = np.ascontiguousarray(values)
    return values.view(f"u{values.dtype.itemsize}").astype(np.uint64)


def _writer_of(fn: Any) -> int:
    """OWN for a kernel of the graded file, a new given-launch number for a kernel of the
    lab's given files (``provided.py``, or the course's ``common/`` that labs share, such as
    ``common/splits.py``'s merge: a merge the lab's contract makes), else OTHER."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return OTHER
    path = os.path.realpath(code.co_filename)
    if path == _STATE["file"]:
        return OWN
    if os.path.dirname(path) == os.path.dirname(_STATE["file"]) or _shared(fn, path):
        record = _STATE["active"]
        record.merges.append([0, 0])
        return len(record.merges) - 1
    return OTHER


def _shared(fn: Any, path: str) -> bool:
    """A kernel of the course's ``common`` package, which labs share (wherever the sandbox
    imported it from): the module it names is loaded from the file its code comes from."""
    import sys

    module = sys.modules.get(str(getattr(fn, "__module__", "")))
    origin = getattr(module, "__file__", None)
    return (module is not None and module.__name__.split(".")[0] == "common"
            and origin is not None and os.path.realpath(origin) == path)


def _wrote(ptrs: Any, mask: Any) -> None:
    """Read back what a store or atomic just wrote at its active addresses, and keep it."""
    record = _STATE["active"]
    if record is None:
        return
    import numpy as np
    from triton.runtime import interpreter

    addresses = np.asarray(ptrs.data, dtype=np.uint64)
    active = np.broadcast_to(np.asarray(True if mask is None else mask.data, dtype=bool),
                             addresses.shape)
    dtype = interpreter._get_np_dtype(ptrs.get_element_ty())
    now = interpreter._interpreter.load(addresses, np.ascontiguousarray(active),
                                        np.zeros(addresses.shape, dtype=dtype), dtype)
    addresses, now = addresses[active].ravel(), _bits(now[active].ravel())
    record.last.update(zip(addresses.tolist(),
                           zip(now.tolist(), itertools.repeat(record.writer))))
    if record.writer == OWN:
        record.stored += int(addresses.size)


def _loaded(ptrs: Any, mask: Any, out: Any) -> None:
    """A given kernel's load: count how much of it reads what the graded file's kernels
    wrote there (a merge of their partials reads only that). A graded kernel's load: keep
    the values it read from anything but the call's inputs (:func:`_foreign`)."""
    record = _STATE["active"]
    if record is None or record.writer == OTHER:
        return
    if record.writer == OWN:
        _foreign(record, ptrs, mask, out)
        return
    import numpy as np

    addresses = np.asarray(ptrs.data, dtype=np.uint64)
    active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
    values = _bits(np.asarray(out.data)[active].ravel()).tolist()
    last = record.last
    made = sum(last.get(a) == (v, OWN) for a, v in zip(addresses[active].ravel().tolist(), values))
    counts = record.merges[record.writer]
    counts[0] += len(values)
    counts[1] += made


FOREIGN_LARGEST = 1 << 22  # foreign values kept per call (interpreter tests are tiny)


def _foreign(record: _Record, ptrs: Any, mask: Any, out: Any) -> None:
    """Keep what a graded kernel loaded from memory that is none of the call's own inputs:
    neither an argument's value when the call began (at its address, or anywhere in a buffer
    that is an argument converted elementwise: ``.contiguous()``, ``.float()``,
    ``.to(torch.int32)``), nor what a kernel of the graded file or the lab's given files
    wrote there in this call. A result made of such values was computed elsewhere (torch)
    and only copied by the kernel."""
    import numpy as np

    addresses = np.asarray(ptrs.data, dtype=np.uint64)
    active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
    addresses = addresses[active].ravel()
    values = np.asarray(out.data)[active].ravel()
    if not addresses.size:
        return
    bits = _bits(values)
    ok = np.zeros(addresses.shape, dtype=bool)
    for lo, hi in record.prepared:
        ok |= (addresses >= lo) & (addresses < hi)
    for where, was, width in _inputs(record):
        if width != values.dtype.itemsize:  # read through another width: in its bytes
            ok |= (addresses >= where[0]) & (addresses <= where[-1] + width - 1)
            continue
        pos = np.minimum(np.searchsorted(where, addresses), where.size - 1)
        ok |= (where[pos] == addresses) & (was[pos] == bits)
    if ok.all():
        return
    last = record.last
    rest = np.flatnonzero(~ok)
    made = [i for i, a, v in zip(rest.tolist(), addresses[rest].tolist(), bits[rest].tolist())
            if (entry := last.get(a)) is not None and entry[0] == v and entry[1] != OTHER]
    ok[made] = True
    if ok.all() or record.foreign_count >= FOREIGN_LARGEST:
        return
    found = np.unique(values[~ok])
    record.foreign_count += int(found.size)
    key = (str(values.dtype), str(ptrs.get_element_ty()))
    record.foreign.setdefault(key, []).append(found)


def _inputs(record: _Record) -> list[tuple[Any, Any, int]]:
    """The call's inputs indexed by address (once per call): their elements' addresses,
    sorted, with their bits when the call began."""
    import numpy as np

    if record.inputs is None:
        record.inputs = []
        for leaf, was in record.originals:
            try:
                where, bits = _addresses(leaf), _now(was)
            except Exception:  # noqa: BLE001 - an argument it cannot describe is no input
                continue
            if where.size:
                order = np.argsort(where, kind="stable")
                record.inputs.append((where[order], bits[order], int(leaf.element_size())))
    return record.inputs


def _prepare(record: _Record, args: tuple, kwargs: dict) -> None:
    """Before a graded kernel runs: each tensor it is given that is not one of the call's
    arguments but holds an argument's first values converted elementwise (the launcher's
    ``.contiguous()``, ``.float()``, ``.to(torch.int32)``) counts as that input."""
    import torch

    inputs = [was for _, was in record.originals]
    spans = []
    for leaf, _ in record.originals:
        storage = leaf.untyped_storage()
        spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    for t in [*args, *kwargs.values()]:
        if type(t) is not torch.Tensor or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        if any(a <= lo < b for a, b in spans) or (lo, hi) in record.prepared:
            continue
        for was in inputs:
            if was.numel() == t.numel() and _converted(t, was):
                record.prepared.append((lo, hi))
                break


def _converted(t: Any, was: Any) -> bool:
    """``t`` holds ``was`` converted to its dtype, element by element, bit for bit (compared
    in numpy: no tensor is read as a Python value, which a host-sync test would count)."""
    import numpy as np
    import torch

    try:
        kind = getattr(torch, _INT_VIEW[t.element_size()])
        with torch.no_grad():
            now = t.detach().reshape(-1).view(kind).numpy()
            then = was.reshape(-1).to(t.dtype).view(kind).numpy()
        return bool(np.array_equal(now, then))
    except Exception:  # noqa: BLE001 - a type it cannot compare is no conversion
        return False


def _writes(original: Any, ptr_arg: int, mask_arg: int | None) -> Any:
    def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        _wrote(args[ptr_arg], args[mask_arg] if mask_arg is not None else None)
        return out
    return op


def _loads(original: Any) -> Any:
    def op(self: Any, ptrs: Any, mask: Any, *rest: Any, **kwargs: Any) -> Any:
        out = original(self, ptrs, mask, *rest, **kwargs)
        _loaded(ptrs, mask, out)
        return out
    return op


def _launches(original: Any) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        record = _STATE["active"]
        if record is None:
            return original(self, *args, **kwargs)
        writer = _writer_of(self.fn)
        record.kernels.append((str(getattr(self.fn, "__name__", "?")), writer == OWN))
        if writer == OWN and record.originals:
            _prepare(record, args, kwargs)
        outer, record.writer = record.writer, writer
        try:
            return original(self, *args, **kwargs)
        finally:
            record.writer = outer
    return call


def install(lab_file: str) -> bool:
    """Wrap the interpreter's launch, load, store and atomics (once per worker, once Triton
    is imported: never importing it here, which costs seconds); False where there is no
    Triton interpreter yet. Every write a kernel makes is read back from memory and kept
    (address, bytes, writer); a given kernel's loads are compared with what the graded
    file's kernels wrote there."""
    _STATE["file"] = os.path.realpath(lab_file)
    if _STATE["installed"]:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or "triton" not in sys.modules:
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = interpreter.InterpreterBuilder
    builder.create_masked_store = _writes(builder.create_masked_store, 0, 2)
    builder.create_atomic_rmw = _writes(builder.create_atomic_rmw, 1, 3)
    builder.create_atomic_cas = _writes(builder.create_atomic_cas, 0, None)
    builder.create_masked_load = _loads(builder.create_masked_load)
    interpreter.GridExecutor.__call__ = _launches(interpreter.GridExecutor.__call__)
    _STATE["installed"] = True
    return True


@contextlib.contextmanager
def recording(before: dict[int, tuple[Any, Any]] | None = None, args: tuple = (),
              kwargs: dict | None = None) -> Iterator[_Record | None]:
    """Record the launches of the block (None where nothing can be recorded: no
    interpreter, or Triton first imported during the block). ``before``
    (:func:`tensors_before`), with the call's ``args`` and ``kwargs`` (for its numpy arrays):
    the inputs as the call got them, which the graded kernels may load."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if not _STATE["installed"] and _STATE["file"] is not None:
        install(_STATE["file"])
    if not _STATE["installed"]:
        if not interpreted:
            yield None
            return
        record = _Record()  # no Triton imported: no kernel can run, unless it is imported now
        yield record
        if "triton" in sys.modules:
            record.unknown = True
        return
    record, outer = _Record(), _STATE["active"]
    record.originals = list((before or {}).values()) + _numpy_inputs((args, kwargs or {}))
    _STATE["active"] = record
    try:
        yield record
    finally:
        _STATE["active"] = outer


def _addresses(tensor: Any) -> Any:
    import numpy as np

    index = np.zeros((), dtype=np.int64)
    for size, stride in zip(tensor.shape, tensor.stride()):
        index = np.add.outer(index, np.arange(size, dtype=np.int64) * stride)
    return (tensor.data_ptr() + index.ravel() * tensor.element_size()).astype(np.uint64)


_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _changed_mask(after: Any, before: Any) -> Any:
    """Which elements' bytes changed (NaN stays NaN: unchanged)."""
    import torch

    kind = getattr(torch, _INT_VIEW[after.element_size()])
    return (after.detach().view(kind) != before.view(kind)).reshape(-1).numpy()


def tensors_before(args: tuple, kwargs: dict) -> dict[int, tuple[Any, Any]]:
    """A copy of each tensor argument before the call (to see which elements it changed)."""
    if not _STATE["installed"] and _STATE["file"] is not None:
        install(_STATE["file"])
    if not _STATE["installed"]:
        return {}
    out = {}
    for leaf in _leaves((args, kwargs)):
        if leaf.numel() <= LARGEST and leaf.element_size() in _INT_VIEW:
            out[id(leaf)] = (leaf, leaf.detach().clone())
    return out


LARGEST = 1 << 22  # elements: larger outputs are not checked (interpreter tests are tiny)


def _numpy_inputs(value: Any, depth: int = 0) -> list[tuple[Any, Any]]:
    """The numpy arrays among the arguments, as tensors over their memory with a copy of
    their values now (a launcher may hand them to its kernel through ``torch.from_numpy``)."""
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if np is None or torch is None or depth >= 4:
        return []
    if type(value) is np.ndarray:
        if not 0 < value.size <= LARGEST or value.dtype.kind not in "biuf":
            return []
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a read-only array: only read here
                return [(torch.from_numpy(value), torch.from_numpy(value.copy()))]
        except (TypeError, ValueError, RuntimeError):
            return []
    if isinstance(value, tuple | list):
        return [t for v in value[:64] for t in _numpy_inputs(v, depth + 1)]
    if type(value) is dict:
        return [t for v in list(value.values())[:64] for t in _numpy_inputs(v, depth + 1)]
    return []


def _leaves(value: Any, depth: int = 0) -> list[Any]:
    torch = sys.modules.get("torch")  # never imported here: no torch, no tensor
    if torch is None:
        return []
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return [value]
    if depth >= 4:
        return []
    if isinstance(value, tuple | list):
        return [t for v in value[:64] for t in _leaves(v, depth + 1)]
    if type(value) is dict:
        return [t for v in list(value.values())[:64] for t in _leaves(v, depth + 1)]
    return []


MERGE_LOADS = 0.99  # a given kernel is a merge of partials when this share of its loads
# read what the graded file's kernels wrote there


def _made(record: _Record, addresses: Any, bits: Any) -> tuple[float, float, Any]:
    """``(own, merged, mine)``: the shares of these elements (their addresses, their bytes
    now) that hold what a kernel of the graded file wrote there last, or what a given kernel
    wrote there last from partials the graded file's kernels wrote (a merge); ``mine``
    marks the first kind."""
    import numpy as np

    mine = np.zeros(addresses.shape, dtype=bool)
    if not addresses.size:
        return 1.0, 0.0, mine
    merges = [m[0] > 0 and m[1] >= MERGE_LOADS * m[0] for m in record.merges]
    last, own, merged = record.last, 0, 0
    for i, (address, value) in enumerate(zip(addresses.tolist(), bits.tolist())):
        entry = last.get(address)
        if entry is None or entry[0] != value:
            continue  # never written by a kernel, or changed since (torch, numpy)
        if entry[1] == OWN:
            own += 1
            mine[i] = True
        elif entry[1] >= 0 and merges[entry[1]]:
            merged += 1
    return own / addresses.size, merged / addresses.size, mine


_NP_FLOATS = {"torch.float16": "float16", "torch.float32": "float32",
              "torch.float64": "float64"}


def _copied(record: _Record, tensor: Any, bits: Any, mine: Any) -> float:
    """The share of ``tensor``'s elements (``bits`` now) that a graded kernel stored
    (``mine``) as a value it loaded from outside the call's inputs (:func:`_foreign`): its
    bytes, or for floats of another width its value rounded to this dtype. Zeros, infinities
    and NaN (fills, masks) are left out."""
    import numpy as np

    if not record.foreign or not mine.any():
        return 0.0
    width = tensor.element_size()
    floats = _NP_FLOATS.get(str(tensor.dtype))
    seen = []
    for found in record.foreign.values():
        values = np.concatenate(found)
        if values.dtype.itemsize == width:
            seen.append(_bits(values))
        elif floats is not None and values.dtype.kind == "f":
            seen.append(_bits(values.astype(floats)))
    if not seen:
        return 0.0
    candidates = bits[mine]
    if floats is not None:
        real = candidates.astype(f"u{width}").view(floats)
        candidates = candidates[np.isfinite(real) & (real != 0)]
    elif tensor.dtype.is_floating_point:  # bfloat16, float8: by their bits only
        real = _torch_float(tensor, candidates)
        candidates = candidates[np.isfinite(real) & (real != 0)]
    else:
        candidates = candidates[candidates != 0]
    copied = np.isin(candidates, np.unique(np.concatenate(seen)))
    return float(copied.sum()) / max(int(bits.size), 1)


def _torch_float(tensor: Any, bits: Any) -> Any:
    """Bits of ``tensor``'s dtype (a float numpy has not) as float64 values."""
    import numpy as np
    import torch

    kind = getattr(torch, _INT_VIEW[tensor.element_size()])
    raw = torch.from_numpy(bits.astype(f"u{tensor.element_size()}").view(
        f"i{tensor.element_size()}").copy()).view(kind)
    return raw.view(tensor.dtype).to(torch.float64).numpy() if raw.numel() else np.zeros(0)


def _now(tensor: Any) -> Any:
    """A tensor's elements as unsigned ints of their width, in the order of :func:`_addresses`."""
    import torch

    kind = getattr(torch, _INT_VIEW[tensor.element_size()])
    return _bits(tensor.detach().contiguous().view(kind).reshape(-1).numpy())


def report(record: _Record | None, result: Any, before: dict[int, tuple[Any, Any]],
           args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """``{"kernels": [[name, own], ...], "written": [["ret" | "arg", made, elements, own,
    copied], ...], "stored": elements the file's kernels wrote, "empty": any empty tensor
    argument}``:
    per tensor the call returned (and per tensor argument it changed, over the changed
    elements), the share of its elements whose bytes are what a kernel of the graded file
    wrote there last (``own``), or that plus what the lab's given merge kernel wrote there
    from the graded kernels' partials (``made``). A kernel that stored elsewhere (a
    scratch buffer) and a value torch computed or overwrote count as not made. ``copied``:
    the share the file's kernels stored as a value they loaded from outside the call's
    inputs (:func:`_copied`: an answer computed elsewhere, only copied). None when nothing
    was recorded."""
    if record is None or record.unknown:
        return None
    inputs = _leaves((args, kwargs))
    outputs = _leaves(result)
    if not inputs and not outputs:
        return {"kernels": [list(k) for k in record.kernels[:64]], "written": [],
                "empty": False}
    written: list[list[Any]] = []
    try:
        for t in outputs[:16]:
            if (any(t is i for i in inputs) or t.numel() == 0 or t.numel() > LARGEST
                    or t.element_size() not in _INT_VIEW):
                continue
            bits = _now(t)
            own, merged, mine = _made(record, _addresses(t), bits)
            written.append(["ret", round(own + merged, 4), int(t.numel()), round(own, 4),
                            round(_copied(record, t, bits, mine), 4)])
        for leaf, old in before.values():
            mask = _changed_mask(leaf, old)
            if mask.any():
                bits = _now(leaf)[mask]
                own, merged, mine = _made(record, _addresses(leaf)[mask], bits)
                written.append(["arg", round(own + merged, 4), int(mask.sum()), round(own, 4),
                                round(_copied(record, leaf, bits, mine), 4)])
    except Exception:  # noqa: BLE001 - a tensor it cannot describe counts as unwritten
        written.append(["arg", 0.0, 0, 0.0, 0.0])
    return {"kernels": [list(k) for k in record.kernels[:64]], "written": written[:32],
            "stored": record.stored, "empty": any(i.numel() == 0 for i in inputs)}
