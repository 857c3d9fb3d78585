"""Lab 09, given code: written once, imported by ``starter.py`` and the reference.

    provided = load_lab_module(__file__, "provided")

* input checks: every launcher fails the same readable way (``ValueError`` naming the
  argument), and a size that does not fit its buffer is refused before a kernel can read
  past it;
* tile sizes: the interpreter's (small, cheap) and a GPU's, and the check of a ``block``
  argument;
* the interpreter made as strict as a GPU about ``tl.dot`` shapes (see below);
* :func:`record_memory`, a recorder of every ``tl.load`` and ``tl.store`` the interpreter
  runs: which program touched which element. The figures of the README are drawn from it;
  use it to look at your own kernel (example at the end of this file's docstring).

Nothing here is an exercise. Every buffer in this lab is bigger than its data, the way a
serving engine allocates for its largest batch: a launcher is told the sizes (``n``, or
``m, n, k``) and the buffer's strides; the elements around the data belong to somebody
else (the tests fill them with NaN, and fill the rest of an output with a sentinel).

    with provided.record_memory() as trace:
        add_vectors(x, y, out, n=37, block=16)
    trace.touched(out, "store")   # {program id: element indices of out it stored}
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.triton_env import DEVICE, HAVE_TRITON, MIN_DOT_TILE, dot_tile, on_interpreter

# ---------------------------------------------------------------------------------------
# Tile sizes
# ---------------------------------------------------------------------------------------

# Under the interpreter every program costs about a millisecond per tile: small tiles.
INTERPRETER_TILES: dict[str, int] = {"block": 16, "block_m": 16, "block_n": 16, "block_k": 16}
# On a GPU (the sizes make gpu-report compiles): a 1-D block of 1024 elements is 4 warps x
# 32 threads x 8 elements; a matmul tile of 64 x 64 x 32 keeps a 64 x 64 fp32 accumulator
# in 32 registers per thread at 4 warps.
GPU_TILES: dict[str, int] = {"block": 1024, "block_m": 64, "block_n": 64, "block_k": 32}
GPU_LAUNCH: dict[str, int] = {"num_warps": 4, "num_stages": 2}


def block_size(name: str, value: Any, default: int, minimum: int = MIN_DOT_TILE) -> int:
    """A tile size: ``value`` (a power of two ``>= minimum``) or ``default`` when None.

    ``ValueError`` names the argument. Triton's ``tl.arange(0, BLOCK)`` needs a power of
    two; 16 is the smallest tile ``tl.dot`` takes, and the course uses it everywhere.
    """
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum or (
        value & (value - 1)
    ):
        raise ValueError(f"{name}={value!r}: must be a power of two >= {minimum}")
    return int(value)


def default_tile(name: str, t: Any = None) -> int:
    """The launcher's choice for a tile size: the interpreter's or the GPU's."""
    return (INTERPRETER_TILES if on_interpreter(t) else GPU_TILES)[name]


def whole_row_block(name: str, value: Any, n: int) -> int:
    """A block that holds a whole row of ``n`` elements: ``dot_tile(n)`` by default; a
    given ``value`` smaller than ``n`` is a ``ValueError`` naming ``name``."""
    block = block_size(name, value, dot_tile(max(n, 1)))
    if block < n:
        raise ValueError(f"{name}={block} is smaller than the row ({n} elements): one tile "
                         "must hold the whole row here")
    return block


# ---------------------------------------------------------------------------------------
# Input checks: buffers and the sizes of the data inside them
# ---------------------------------------------------------------------------------------


def size(name: str, value: Any) -> int:
    """A size ``>= 0`` (bools refused), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _tensor(name: str, t: Any, ndim: int) -> None:
    if not hasattr(t, "stride") or t.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D torch tensor, got "
                         f"{getattr(t, 'shape', type(t))}")  # fmt: skip
    if str(t.dtype) not in ("torch.float32", "torch.float16"):
        raise ValueError(f"{name} has dtype {t.dtype}: use float32 (or float16)")
    if t.device.type != DEVICE:
        raise ValueError(f"{name} is on {t.device} but Triton runs on {DEVICE} here")


def check_vector(name: str, t: Any, n: int) -> int:
    """``t`` is a contiguous 1-D buffer of at least ``n`` elements; returns ``n``."""
    _tensor(name, t, 1)
    n = size("n", n)
    if t.shape[0] < n:
        raise ValueError(f"n={n} but {name} holds only {t.shape[0]} elements")
    if t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {t.stride(0)}")
    return n


def check_matrix(name: str, t: Any, rows: int, cols: int, rows_name: str = "m",
                 cols_name: str = "n") -> None:  # fmt: skip
    """``t`` is a 2-D buffer (any strides) holding at least ``rows x cols`` elements; the
    error names the buffer and the size that does not fit."""
    _tensor(name, t, 2)
    if t.shape[0] < rows or t.shape[1] < cols:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}: too small for {rows_name}={rows} rows and "
            f"{cols_name}={cols} columns"
        )


# ---------------------------------------------------------------------------------------
# The interpreter, as strict as a GPU about tl.dot
# ---------------------------------------------------------------------------------------


def require_gpu_dot_shapes() -> None:
    """Make the interpreter refuse this lab's ``tl.dot`` when its inner dimension K is < 16.

    The interpreter multiplies any shapes; the NVIDIA backend of the pinned triton (3.7.1)
    refuses ``K < 16`` for 16- and 32-bit inputs at compile time ("Input shapes should have
    M >= 1, N >= 1 and K >= 16") and pads small M and N itself. Installing the GPU's rule
    here makes a too-small tile fail on your laptop as it would on the GPU. The course pads
    M, N and K alike to ``dot_tile(n)`` (16 at least: the tensor core's MMA is 16 deep).
    Only kernels defined in this lab's folder get the rule (the interpreter runs a kernel
    as Python code, so its file is on the call stack); every other kernel keeps the
    interpreter's own.
    """
    if not HAVE_TRITON:
        return
    from triton.runtime import interpreter

    fns = interpreter.interpreter_builder.codegen_fns
    previous = fns.get("min_dot_size")
    previous = getattr(previous, "previous", previous)  # installed once, however often imported

    def min_dot_size(lhs_type: Any, rhs_type: Any) -> tuple[int, int, int]:
        if not _in_this_lab(sys._getframe(1)):
            return previous(lhs_type, rhs_type)
        return (1, 1, 32) if lhs_type.scalar.primitive_bitwidth == 8 else (1, 1, MIN_DOT_TILE)

    min_dot_size.previous = previous  # type: ignore[attr-defined]
    fns["min_dot_size"] = min_dot_size


LAB_DIR = os.path.dirname(os.path.realpath(__file__))


def _in_this_lab(frame: Any, depth: int = 12) -> bool:
    """Whether one of the ``depth`` innermost frames runs code of a file in this folder."""
    while frame is not None and depth:
        if os.path.dirname(os.path.realpath(frame.f_code.co_filename)) == LAB_DIR:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


require_gpu_dot_shapes()


# ---------------------------------------------------------------------------------------
# The recorder: which program loaded or stored which element
# ---------------------------------------------------------------------------------------


@dataclass
class Access:
    """One ``tl.load`` or ``tl.store`` of one program: byte addresses and the mask."""

    program: tuple[int, int, int]
    kind: str  # "load" or "store"
    addresses: np.ndarray  # uint64 byte addresses, the tile's shape
    mask: np.ndarray  # bool, same shape: False = the lane did not touch memory


@dataclass
class Trace:
    """Every access of the kernels launched inside :func:`record_memory`."""

    accesses: list[Access] = field(default_factory=list)

    def elements(self, t: Any, kind: str) -> list[tuple[tuple[int, int, int], np.ndarray]]:
        """``[(program id, flat element indices of t)]``, one entry per ``tl.load`` (``kind=
        "load"``) or ``tl.store`` that touched ``t``, in the order they ran; only lanes
        whose mask was True count.

        Indices count elements from ``t.data_ptr()``: in a 2-D buffer, element ``(i, j)``
        is ``i * t.stride(0) + j * t.stride(1)``.
        """
        item = t.element_size()
        base = t.data_ptr()
        end = base + (t.untyped_storage().nbytes() - t.storage_offset() * item)
        out = []
        for a in self.accesses:
            if a.kind != kind:
                continue
            addr = a.addresses[a.mask].astype(np.int64)
            addr = addr[(addr >= base) & (addr < end)]
            if addr.size:
                out.append((a.program, np.unique((addr - base) // item)))
        return out

    def touched(self, t: Any, kind: str) -> dict[tuple[int, int, int], np.ndarray]:
        """``{program id: sorted flat element indices of t}`` that each program loaded
        (``kind="load"``) or stored, over all its accesses (see :meth:`elements`)."""
        out: dict[tuple[int, int, int], set[int]] = {}
        for program, ix in self.elements(t, kind):
            out.setdefault(program, set()).update(ix.tolist())
        return {p: np.array(sorted(ix), dtype=np.int64) for p, ix in sorted(out.items())}


@contextlib.contextmanager
def record_memory() -> Iterator[Trace]:
    """Record every ``tl.load`` / ``tl.store`` the Triton interpreter runs in this block.

    Interpreter only (``TRITON_INTERPRET=1``, a CPU laptop): the interpreter runs each
    program of the grid in turn, and every load and store passes through its builder's
    ``create_masked_load`` / ``create_masked_store``; the recorder wraps those two and
    notes the program id, the addresses and the mask.
    """
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    trace = Trace()
    cls = type(builder)
    load, store = cls.create_masked_load, cls.create_masked_store

    def masked_load(self: Any, ptrs: Any, mask: Any, *args: Any) -> Any:
        trace.accesses.append(Access(tuple(self.grid_idx), "load", ptrs.data.copy(),
                                     np.broadcast_to(mask.data, ptrs.data.shape).copy()))
        return load(self, ptrs, mask, *args)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, *args: Any) -> Any:
        trace.accesses.append(Access(tuple(self.grid_idx), "store", ptrs.data.copy(),
                                     np.broadcast_to(mask.data, ptrs.data.shape).copy()))
        return store(self, ptrs, value, mask, *args)

    cls.create_masked_load, cls.create_masked_store = masked_load, masked_store
    try:
        yield trace
    finally:
        cls.create_masked_load, cls.create_masked_store = load, store
