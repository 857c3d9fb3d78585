"""Inside the sandbox: which Triton kernels a call launched, and which of its output tensors
their stores wrote (the interpreter's launch and store, recorded in the worker).

The worker installs :func:`install` once, before it imports the graded module. Around each
call, :func:`recording` collects the kernels the interpreter ran (name, and whether it is a
kernel of the graded file) and the addresses the graded file's own kernels stored to. After
the call, :func:`report` says, for each tensor the call returned or wrote into, the share of
its elements those stores wrote: plain data the trusted side checks (a Triton test's
launcher must launch its lab's kernel, and that kernel's stores must make the output).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

_STATE: dict[str, Any] = {"file": None, "active": None, "installed": False}


class _Record:
    def __init__(self) -> None:
        self.kernels: list[tuple[str, bool]] = []
        self.stored: list[Any] = []  # numpy arrays of addresses stored by the file's kernels
        self.own = False
        self.unknown = False  # Triton was imported during the call: launches went unseen


def install(lab_file: str) -> bool:
    """Wrap the interpreter's launch and masked store (once per worker, once Triton is
    imported: never importing it here, which costs seconds); False where there is no Triton
    interpreter yet."""
    _STATE["file"] = os.path.realpath(lab_file)
    if _STATE["installed"]:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or "triton" not in sys.modules:
        return False
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    original_call, original_store = executor.__call__, builder.create_masked_store

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        record = _STATE["active"]
        if record is None:
            return original_call(self, *args, **kwargs)
        code = getattr(self.fn, "__code__", None)
        own = code is not None and os.path.realpath(code.co_filename) == _STATE["file"]
        record.kernels.append((str(getattr(self.fn, "__name__", "?")), own))
        outer, record.own = record.own, own
        try:
            return original_call(self, *args, **kwargs)
        finally:
            record.own = outer

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        record = _STATE["active"]
        if record is not None and record.own:
            data = np.asarray(ptrs.data, dtype=np.uint64)
            active = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
            record.stored.append(data[active].ravel())
        return original_store(self, ptrs, value, mask, *rest)

    executor.__call__, builder.create_masked_store = call, store
    _STATE["installed"] = True
    return True


@contextlib.contextmanager
def recording() -> Iterator[_Record | None]:
    """Record the launches of the block (None where nothing can be recorded: no
    interpreter, or Triton first imported during the block)."""
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


def report(record: _Record | None, result: Any, before: dict[int, tuple[Any, Any]],
           args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """``{"kernels": [[name, own], ...], "written": [["ret" | "arg", share, elements], ...],
    "stored": elements the file's kernels stored, "empty": any empty tensor argument}``: per
    tensor the call returned, the share of its elements the graded file's kernels stored;
    per tensor argument it changed, the share of the changed elements they stored. None when
    nothing was recorded."""
    if record is None or record.unknown:
        return None
    inputs = _leaves((args, kwargs))
    outputs = _leaves(result)
    if not inputs and not outputs:
        return {"kernels": [list(k) for k in record.kernels[:64]], "written": [],
                "empty": False}
    import numpy as np

    stored = np.unique(np.concatenate(record.stored)) if record.stored else np.zeros(0, np.uint64)
    written: list[list[Any]] = []
    try:
        for t in outputs[:16]:
            if any(t is i for i in inputs) or t.numel() == 0 or t.numel() > LARGEST:
                continue
            share = float(np.isin(_addresses(t), stored).mean())
            written.append(["ret", round(share, 4), int(t.numel())])
        for leaf, old in before.values():
            mask = _changed_mask(leaf, old)
            if mask.any():
                hit = np.isin(_addresses(leaf)[mask], stored).mean()
                written.append(["arg", round(float(hit), 4), int(mask.sum())])
    except Exception:  # noqa: BLE001 - a tensor it cannot describe counts as unwritten
        written.append(["arg", 0.0, 0])
    return {"kernels": [list(k) for k in record.kernels[:64]], "written": written[:32],
            "stored": int(stored.size), "empty": any(i.numel() == 0 for i in inputs)}
