"""Assertions and hypothesis strategies that turn "arrays differ" into a diagnosis.

``assert_close`` checks shape, then NaN, then values; on a mismatch it compares the
answer with *wrong answers* the test computed from the float64 reference (what a
classic mistake would produce) and names the misconception that matches.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import shlex
import signal
import subprocess
import sys
import tracemalloc
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

# One place for tolerances. float64 exercises must match the float64 reference to 1e-12.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (2e-5, 2e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (2e-2, 2e-2),
}

NAN_HINT = (
    "NaN reached the output. The tests poison every slot you must not read with NaN "
    "(slots past seq_len, unreferenced blocks, padding entries of the block table, future "
    "tokens), so this usually means a loop bound or mask is wrong; or exp(-inf - (-inf)) "
    "when a running max starts at -inf and nothing has been seen yet."
)


def tolerance(dtype: Any) -> tuple[float, float]:
    """``(atol, rtol)`` for a numpy or torch dtype, or a dtype name."""
    name = str(dtype).replace("torch.", "")
    if name not in TOLERANCES:
        name = np.dtype(dtype).name
    return TOLERANCES[name]


def _describe_diff(actual: np.ndarray, expected: np.ndarray) -> str:
    diff = np.abs(actual - expected)
    diff = np.where(np.isnan(diff), np.inf, diff)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    bad = int(np.count_nonzero(diff > 0))
    return (
        f"max |actual - expected| = {float(diff.max()) if diff.size else 0.0:.3g} at index "
        f"{tuple(int(i) for i in worst)} (actual {actual[worst]!r}, expected "
        f"{expected[worst]!r}); {bad} of {diff.size} entries differ"
    )


# A lab's basic value test, once failed, has named the likely cause; later tests of the same
# half (numpy or Triton) of the same lab then give no hint pointing elsewhere.
_FAILED_BASICS: dict[tuple[str, bool], str] = {}


def _current_test() -> tuple[tuple[str, bool], str] | None:
    """``((test file, is a Triton test), test name)`` of the running pytest test."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    if "::" not in current:
        return None
    path, name = current.split("::", 1)
    name = name.rsplit(" (", 1)[0]
    return (path, "triton" in name), name


def basic_value_test(test: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a lab's basic value test: if it fails, later value tests of the same half of the
    lab (numpy, or Triton: a test whose name says ``triton``) drop their generic hints and
    point back at it, instead of suggesting other causes for the same wrong numbers."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return test(*args, **kwargs)
        except AssertionError:
            current = _current_test()
            if current is not None:
                _FAILED_BASICS.setdefault(current[0], current[1].split("[", 1)[0])
            raise

    return run


def _hint_after_basics(hint: str) -> str:
    current = _current_test()
    failed = _FAILED_BASICS.get(current[0]) if current is not None else None
    if failed is None or current is None or current[1].startswith(failed):
        return hint
    return (f"{failed} failed as well: these numbers are most likely wrong for the reason its "
            "message gives; fix that first")


def assert_close(actual: Any, expected: Any, *, what: str = "output", atol: float = 1e-12,
                 rtol: float = 1e-12, hint: str = "", wrong_answers: dict[str, Any] | None = None,
                 nan_hint: str = NAN_HINT) -> None:
    """Assert ``actual ≈ expected``, explaining the failure in terms of a misconception.

    Args:
        actual: the implementation's answer (numpy array or torch tensor).
        expected: the float64 reference answer.
        what: the name of the quantity ("out", "lse", "running max after tile 2").
        hint: a sentence added to a plain mismatch (what usually causes it).
        wrong_answers: ``{misconception: answer that misconception would produce}``.
            The first one that ``actual`` matches is reported instead of the numbers.
    """
    __tracebackhide__ = True  # pytest shows the message, not this helper's frames
    if actual is None:
        raise AssertionError(f"{what} is None: the function returned nothing")
    if isinstance(actual, tuple | list) and not isinstance(expected, tuple | list):
        raise AssertionError(
            f"{what} is a {type(actual).__name__} of {len(actual)} items, expected one array"
        )
    from common.reference import to_float64  # here: the sandbox has no reference

    a = to_float64(actual)
    e = to_float64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{what} has shape {a.shape}, expected {e.shape}")
    if np.isnan(a).any() and not np.isnan(e).any():
        raise AssertionError(f"{what}: {nan_hint}")
    if np.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True):
        return
    for misconception, wrong in (wrong_answers or {}).items():
        w = to_float64(wrong)
        if w.shape == a.shape and np.allclose(a, w, atol=max(atol, 1e-9), rtol=max(rtol, 1e-9)):
            raise AssertionError(f"{what} is wrong: {misconception}")
    message = f"{what} differs from the float64 reference: {_describe_diff(a, e)}"
    hint = _hint_after_basics(hint)
    if hint:
        message += f". {hint}"
    raise AssertionError(message)


# ---- hypothesis strategies shared by the labs ------------------------------------------


# (num_heads, num_kv_heads) every lab with heads tries: MHA, MQA, GQA with group sizes 1, 2,
# 3, 4, 8, 16 and 32 (a group larger than 16), and ratios where swapping "group size" and
# "number of KV heads" in the head mapping gives a different answer ((8, 2), (6, 3), (32, 8)).
HEAD_RATIOS: tuple[tuple[int, int], ...] = (
    (1, 1), (4, 4), (4, 2), (8, 2), (8, 1), (6, 3), (6, 2), (32, 8), (32, 2), (32, 1),
)
# Head dims that are not powers of two: a kernel pads them to a tl.dot tile, and a scale
# computed from the padded size (or a mask that forgets the pad) is caught here.
ODD_HEAD_DIMS: tuple[int, ...] = (24, 40, 80, 96)


@st.composite
def head_counts(draw: st.DrawFn, max_heads: int = 8) -> tuple[int, int]:
    """``(num_heads, num_kv_heads)`` covering MHA, GQA and MQA."""
    num_kv_heads = draw(st.sampled_from([1, 2, 3, 4]))
    group = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    num_heads = min(num_kv_heads * group, max_heads)
    num_heads -= num_heads % num_kv_heads
    return max(num_heads, num_kv_heads), num_kv_heads


def qkv_sizes(max_len: int, max_dim: int, *,
              min_len: int = 1) -> dict[str, st.SearchStrategy[int]]:
    """``@given(**qkv_sizes(12, 6), ...)``: the sizes of one random attention problem, lengths
    ``lq``, ``lk`` in ``[min_len, max_len]``, head dims ``d``, ``dv`` in ``[1, max_dim]``,
    and a ``seed`` (for :func:`random_qkv`)."""
    lengths, dims = st.integers(min_len, max_len), st.integers(1, max_dim)
    return {"lq": lengths, "lk": lengths, "d": dims, "dv": dims, "seed": st.integers(0, 2**16)}


def random_qkv(seed: int, lq: int, lk: int, d: int, dv: int, *,
               spread: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal float64 ``q [lq, d]``, ``k [lk, d]`` (both times ``spread``: scores
    grow as ``spread²``) and ``v [lk, dv]``, drawn in that order from ``seed``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((lq, d)) * spread, rng.standard_normal((lk, d)) * spread,
            rng.standard_normal((lk, dv)))


ACC_IN_FP16 = (
    "the running sums cancel: an accumulator kept in float16 (acc rounded to the input dtype, "
    "or tl.dot's out_dtype) rounds a sum near 500 to steps of 0.25-0.5. Accumulate in float32 "
    "(tl.zeros(..., dtype=tl.float32)) and cast once, at the store"
)


def cancelling(x: np.ndarray, magnitude: float = 30.0, axis: int = 0) -> np.ndarray:
    """``x`` + ``magnitude`` on the first half of ``axis``, - on the second, in float16: its
    running sum over ``axis`` (a key loop) climbs to hundreds, then cancels (``ACC_IN_FP16``)."""
    n = x.shape[axis]
    sign = np.where(np.arange(n) < n // 2, magnitude, -magnitude)
    shape = [1] * x.ndim
    shape[axis] = n
    return (x + sign.reshape(shape)).astype(np.float16).astype(np.float64)


# ---- tile shapes: where BLOCK_M and BLOCK_N must not be mixed up ---------------------------

# One square tile and both oblong ones: a loop bound that uses BLOCK_N where BLOCK_M belongs
# (or the other way) gives the right answer on square tiles only.
TILE_SHAPES: tuple[tuple[int, int], ...] = ((16, 16), (16, 32), (32, 16))


def tile_shapes(*shapes: tuple[int, int], name: str = "tiles") -> Any:
    """``@tile_shapes()``: parametrize a test over ``(block_m, block_n)`` pairs (default
    :data:`TILE_SHAPES`), with ids like ``16x32`` (``default``: the launcher's own tiles)."""
    import pytest

    return pytest.mark.parametrize(name, shapes or TILE_SHAPES,
                                   ids=lambda t: "default" if None in t else f"{t[0]}x{t[1]}")


# ---- layouts: the same values in memory a kernel may not assume ----------------------------

LAYOUTS: tuple[str, ...] = ("transposed", "sliced")


def strided_view(t: Any, layout: str) -> Any:
    """A torch tensor with ``t``'s values in a layout no kernel may assume.

    ``"transposed"``: dims -3 and -2 swapped in memory (``[B, L, H, d]`` viewed as
    ``[B, H, L, d]``, how models hold activations). ``"sliced"``: a slice of a bigger
    storage: a storage offset, every other row of the last-but-one dim and a padded last
    dim; the unused elements around a float view are NaN (integer views: 0), so a kernel
    that steps with the wrong stride reads NaN. Tensors with fewer than 2 (transposed: 3)
    dims come back as is.
    """
    import torch

    if layout == "transposed":
        if t.dim() < 3:
            return t
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if layout != "sliced":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if t.dim() < 2:
        return t
    *lead, rows, cols = t.shape
    base = torch.empty((*lead, 2 * rows + 3, cols + 5), dtype=t.dtype, device=t.device)
    base.fill_(float("nan") if t.dtype.is_floating_point else 0)
    view = base[..., 3 : 3 + 2 * rows : 2, 2 : 2 + cols]
    view.copy_(t)
    return view


# ---- calls on copies: nothing the graded code touched is trusted ------------------------------
#
# Under the grader, what a call writes into its array arguments is copied back into the test's
# arrays (lab-01's write_kv fills caches in place). A test that computed its expected value from
# an argument after the call would then trust numbers the graded code chose. So every lab's
# ``impl`` is wrapped by :func:`called_on_copies`: each call gets copies of its arrays and tensors,
# and the test's own arrays, from which it computes expected values, are never handed over.


def _copy_leaf(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return np.array(obj, copy=True, order="K")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.requires_grad:  # its .grad is how an autograd answer comes back: passed as is
            return obj
        with torch.no_grad():  # the whole storage: strides, offset and poisoned margins kept
            return torch.empty(0, dtype=obj.dtype, device=obj.device).set_(
                obj.untyped_storage().clone(), obj.storage_offset(), obj.size(), obj.stride())
    return None


def copied(obj: Any, keep: frozenset[int] = frozenset(), memo: dict[int, Any] | None = None,
           depth: int = 0) -> Any:
    """``obj`` with every numpy array and torch tensor in it copied (looking into lists,
    tuples, NamedTuples and dicts; an array named twice is copied once, so aliasing stays).
    Objects whose ``id`` is in ``keep`` are passed as they are."""
    memo = {} if memo is None else memo
    if id(obj) in keep:
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    leaf = _copy_leaf(obj)
    if leaf is not None:
        memo[id(obj)] = leaf
        return leaf
    if depth >= 4:
        return obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)._make(copied(x, keep, memo, depth + 1) for x in obj)
    if type(obj) in (list, tuple):
        return type(obj)(copied(x, keep, memo, depth + 1) for x in obj)
    if type(obj) is dict:
        return {k: copied(v, keep, memo, depth + 1) for k, v in obj.items()}
    return obj


class CopiesModule(types.ModuleType):
    """A lab's module whose public functions are called on copies of their arguments
    (classes, constants and private names are the module's own)."""

    def __init__(self, module: types.ModuleType,
                 writes: dict[str, tuple[int | str, ...]]) -> None:
        super().__init__(module.__name__, module.__doc__)
        self.__dict__["_module"] = module
        self.__dict__["_writes"] = writes
        self.__dict__["_wrapped"] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__dict__["_module"], name)
        if name.startswith("_") or not _is_function(value):
            return value
        wrapped = self.__dict__["_wrapped"]
        if name not in wrapped:
            wrapped[name] = _on_copies(value, self.__dict__["_writes"].get(name, ()))
        return wrapped[name]

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_module"])


def _is_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) or type(value).__name__ == "RemoteFunction"


def _on_copies(fn: Callable[..., Any], writes: tuple[int | str, ...]) -> Callable[..., Any]:
    def arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        keep = frozenset(id(args[w]) if isinstance(w, int) else id(kwargs[w]) for w in writes
                         if (w in kwargs if isinstance(w, str) else w < len(args)))
        memo: dict[int, Any] = {}
        return copied(args, keep, memo), copied(kwargs, keep, memo)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        args, kwargs = arguments(args, kwargs)
        return fn(*args, **kwargs)

    def instrumented(instrument: str, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        args, kwargs = arguments(args, kwargs)  # copied outside the measurement
        remote = getattr(fn, "__instrumented_call__", None)
        if remote is not None:
            return remote(instrument, args, kwargs)
        return INSTRUMENTS[instrument](fn, *args, **kwargs)

    call.__instrumented_call__ = instrumented  # type: ignore[attr-defined]
    batch = getattr(fn, "__batch_entry__", None)
    if batch is not None:  # a sandboxed worker's function: call_all sends it copies too
        call.__batch_entry__ = batch  # type: ignore[attr-defined]
        call.__batch_arguments__ = lambda args: arguments(args, {})[0]  # type: ignore[attr-defined]
    return call


def called_on_copies(module: types.ModuleType,
                     writes: dict[str, tuple[int | str, ...]] | None = None,
                     ) -> types.ModuleType:
    """``module`` (a lab's ``load_impl(__file__)``) whose public functions get copies of every
    array and tensor argument, so nothing the graded code writes reaches the test's arrays.

    ``writes`` names the arguments a function is specified to write into, by position and
    keyword (``{"write_kv": (0, 1, "k_cache", "v_cache")}``; never from the graded code's own
    signature, which it could word as it likes): those are passed as they are, and the test
    reads the answer from them. Tensors with ``requires_grad`` are passed as they are too."""
    return CopiesModule(module, dict(writes or {}))


# ---- instrumented calls: what a test measures about the code under test ---------------------
#
# Tests measure the student's code only through these two functions. Under the grader, the
# function under test lives in another process; it then carries ``__instrumented_call__`` and
# the measurement is taken where the code runs.


def peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``(fn(*args, **kwargs), peak bytes the call added)``.

    In a plain pytest run: the bytes Python and numpy allocated at the peak (``tracemalloc``).
    Under the grader, where the code runs in a sandboxed worker: the call runs in a fresh
    worker of its own, and the growth of its resident-memory high-water mark from before it
    imports the submission to the end of the call (its forks' memory included) is read by the
    grader from ``/proc``, so a submission can neither replace the measurement nor reuse an
    arena it touched earlier; it counts pages the import and the call touched (the inputs'
    copies included), a little more than ``tracemalloc``."""
    remote = getattr(fn, "__instrumented_call__", None)
    if remote is not None:
        return remote("peak_memory", args, kwargs)
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        result = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, max(int(peak), 0)


def assert_peak_below(fn: Callable[..., Any], *args: Any, limit: int, message: str,
                      **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` under :func:`peak_memory`; fail with ``message`` (the
    likely misconception) when it added ``limit`` bytes or more. Returns ``fn``'s result, for
    the test to check its values."""
    __tracebackhide__ = True
    result, peak = peak_memory(fn, *args, **kwargs)
    mib = f"{peak / 2**20:.2f} MiB (limit {limit / 2**20:g} MiB)"
    assert peak < limit, f"peak memory {mib}: {message}"
    return result


REPO_ROOT = Path(__file__).resolve().parent.parent
# What copies a device tensor to the host. (``.numpy()`` and ``np.asarray`` refuse a CUDA
# tensor, so they only ever follow one of these and are not counted again.)
_SYNC_METHODS = ("cpu", "item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def _recording_host_syncs(folder: Path) -> Iterator[list[str]]:
    import torch

    seen: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in _SYNC_METHODS}

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *a: Any, **k: Any) -> Any:
            caller = Path(sys._getframe(1).f_code.co_filename).resolve()
            if caller.is_relative_to(folder):
                seen.append(f"Tensor.{name}() in {caller.relative_to(folder)}")
            return original(self, *a, **k)

        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(name, original))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def host_syncs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """``(fn(...), the host synchronisations its lab's own code made)``.

    Counts ``.cpu()``, ``.item()``, ``.tolist()`` and conversions to Python numbers or
    booleans of torch tensors, called from the course's own files (the lab's code,
    its provided code, ``common``), not from Triton's or torch's launch machinery. On a GPU
    each is a device-to-host copy that stalls the stream.

    Measured where the code runs: under the grader, inside the sandboxed worker, by patching
    ``torch.Tensor``'s methods there. Without a GPU a host sync leaves no trace outside the
    process, so a submission that undoes the patching escapes the count: a teaching check,
    not a defended one.
    """
    remote = getattr(fn, "__instrumented_call__", None)
    if remote is not None:
        return remote("host_syncs", args, kwargs)
    with _recording_host_syncs(REPO_ROOT) as seen:
        result = fn(*args, **kwargs)
    return result, list(seen)


class _Launch:
    """What one interpreted kernel launch touched: per tensor argument, the elements each
    program loaded (mask true) and which program stored each element first."""

    def __init__(self, kernel: str, named: dict[str, Any]) -> None:
        self.kernel = kernel
        tensors = [(n, t) for n, t in named.items() if hasattr(t, "data_ptr") and t.numel()]
        self.names = [n for n, _ in tensors]
        self.bases = np.array([t.untyped_storage().data_ptr() for _, t in tensors], np.uint64)
        self.ends = self.bases + np.array([t.untyped_storage().nbytes() for _, t in tensors],
                                          np.uint64)
        self.views = {n: (t.data_ptr(), t.element_size(), tuple(t.shape), tuple(t.stride()))
                      for n, t in tensors}
        self.loaded: dict[str, int] = {}
        self.seen: dict[tuple[int, ...], dict[str, set[int]]] = {}
        self.owner: dict[int, tuple[int, ...]] = {}
        self.races: list[tuple[str, str, tuple[int, ...], tuple[int, ...]]] = []
        self.stray: list[tuple[str, str, str, tuple[int, ...], int]] = []

    def _split(self, addresses: np.ndarray) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for i, name in enumerate(self.names):
            hit = (addresses >= self.bases[i]) & (addresses < self.ends[i])
            if hit.any():
                out[name] = addresses[hit]
        return out

    def element(self, name: str, address: int) -> str:
        """``name[i, j, ...]`` of the element at ``address`` along ``name``'s strides, even
        out of range (row 21 of a 21-row view), or its element offset."""
        start, size, shape, stride = self.views[name]
        offset = rest = (address - start) // size
        coords = {}
        for dim in sorted((d for d in range(len(shape)) if stride[d]), key=lambda d: -stride[d]):
            coords[dim], rest = divmod(rest, stride[dim])
        if rest or offset < 0 or (address - start) % size:
            return f"{name} (element {offset} from its start)"
        return f"{name}[{', '.join(str(coords.get(d, 0)) for d in range(len(shape)))}]"

    def _in_view(self, name: str, addresses: np.ndarray) -> np.ndarray:
        """Which ``addresses`` are elements of ``name``'s view, not merely of its storage."""
        start, size, shape, stride = self.views[name]
        rest = addresses.astype(np.int64) - start
        inside = (rest >= 0) & (rest % size == 0)
        rest = rest // size
        for dim in sorted((d for d in range(len(shape)) if stride[d]), key=lambda d: -stride[d]):
            index, rest = np.divmod(rest, stride[dim])
            inside &= index < shape[dim]
        return inside & (rest == 0)

    def _describe(self, address: int) -> str:
        """Where a stray address lies: in an argument's memory, or nearest to one's."""
        if not self.names:
            return f"address {address:#x} (the kernel has no tensor argument)"
        gaps = [0 if b <= address < e else min(abs(address - int(b)), abs(address - int(e)))
                for b, e in zip(self.bases, self.ends)]  # fmt: skip
        i = int(np.argmin(gaps))
        where = ("outside the view it was given" if gaps[i] == 0 else "before the start of "
                 "its memory" if address < self.bases[i] else "past the end of its memory")
        return f"{self.element(self.names[i], address)}, {where}"

    def load(self, pid: tuple[int, ...], addresses: np.ndarray,
             site: Callable[[], str] = lambda: "") -> None:
        program = self.seen.setdefault(pid, {})
        viewed = np.zeros(addresses.shape, dtype=bool)
        for name, hit in self._split(addresses).items():
            program.setdefault(name, set()).update(int(a) for a in hit)
            viewed |= self._in_view(name, addresses)
        if not viewed.all() and len(self.stray) < 8:
            outside = addresses[~viewed]
            self.stray.append((self.kernel, site(), self._describe(int(outside[0])), pid,
                               int(np.unique(outside).size)))

    def store(self, pid: tuple[int, ...], addresses: np.ndarray) -> None:
        for name, hit in self._split(addresses).items():
            for a in map(int, np.unique(hit)):
                first = self.owner.setdefault(a, pid)
                if first != pid and len(self.races) < 8:
                    self.races.append((self.kernel, self.element(name, a), first, pid))

    def report(self) -> dict[str, Any]:
        loads: dict[str, int] = {}
        for program in self.seen.values():
            for name, addresses in program.items():
                loads[name] = loads.get(name, 0) + len(addresses)
        return {"kernel": self.kernel, "loads": loads, "races": list(self.races),
                "stray_loads": list(self.stray)}


def _load_site() -> str:
    """``file:line: source`` of the running ``tl.load`` (innermost frame outside Triton)."""
    import linecache

    frame = sys._getframe(1)
    while frame and (f"{os.sep}triton{os.sep}" in frame.f_code.co_filename
                     or frame.f_code.co_filename == __file__):  # fmt: skip
        frame = frame.f_back
    if frame is None:
        return "(unknown line)"
    file, line = frame.f_code.co_filename, frame.f_lineno
    return f"{Path(file).name}:{line}: {linecache.getline(file, line).strip()}"


@contextlib.contextmanager
def _recording_interpreter() -> Iterator[list[_Launch]]:
    from triton.runtime import interpreter

    launches: list[_Launch] = []
    builder_cls, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
    original_load = builder_cls.create_masked_load
    original_store = builder_cls.create_masked_store
    original_init = executor._init_args_hst

    def addresses(ptrs: Any, mask: Any) -> np.ndarray:
        data = np.asarray(ptrs.data, dtype=np.uint64)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
        return data[active].ravel()

    def load(self: Any, ptrs: Any, mask: Any, *rest: Any) -> Any:
        if launches:
            launches[-1].load(tuple(self.grid_idx), addresses(ptrs, mask), _load_site)
        return original_load(self, ptrs, mask, *rest)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        if launches:
            launches[-1].store(tuple(self.grid_idx), addresses(ptrs, mask))
        return original_store(self, ptrs, value, mask, *rest)

    def init_args(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = original_init(self, args_dev, kwargs)
        names = inspect.getfullargspec(self.fn).args
        named = dict(zip(names, args_hst)) | {k: v for k, v in kwargs_hst.items() if k in names}
        launches.append(_Launch(self.fn.__name__, named))
        return args_hst, kwargs_hst

    builder_cls.create_masked_load, builder_cls.create_masked_store = load, store
    executor._init_args_hst = init_args
    try:
        yield launches
    finally:
        builder_cls.create_masked_load, builder_cls.create_masked_store = (
            original_load, original_store)
        executor._init_args_hst = original_init


def kernel_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[dict]]:
    """``(fn(...), one report per Triton kernel launch it made)`` on the interpreter.

    A report is ``{"kernel": name, "loads": {argument: elements loaded, summed over the
    programs (an element two programs load counts twice, one program loading it twice
    counts once)}, "races": [(kernel, "out[3, 1, 0]", first program id, second program
    id), ...]}``: ``races`` lists elements that two different programs of the same launch
    stored to. The interpreter runs programs one after another, so such a race gives right
    numbers here and wrong ones on a GPU, where the programs run at once. ``"stray_loads"``
    lists loads (mask true) of elements in no tensor argument's view: ``(kernel, "file:line:
    source", "Q[0, 1, 21, 0], outside the view it was given", program id, count)``.
    """
    remote = getattr(fn, "__instrumented_call__", None)
    if remote is not None:
        return remote("kernel_memory", args, kwargs)
    with _recording_interpreter() as launches:
        result = fn(*args, **kwargs)
    return result, [launch.report() for launch in launches]


def assert_no_races(reports: list[dict], what: str = "the kernel") -> None:
    """Fail, naming the element and both program ids, if two programs of one launch stored
    to the same element (see ``kernel_memory``)."""
    __tracebackhide__ = True
    races = [race for report in reports for race in report["races"]]
    if races:
        kernel, element, first, second = races[0]
        raise AssertionError(
            f"{what}: programs {tuple(first)} and {tuple(second)} of one launch of {kernel} "
            f"both store {element} ({len(races)} such element(s) seen). On a GPU the "
            "programs run at the same time and one overwrites the other; the interpreter, "
            "which runs them in order, hides it. Mask the store to the rows this program "
            "owns (padding rows of a tile belong to nobody)."
        )


def assert_loads_in_bounds(reports: list[dict], what: str = "the kernel") -> None:
    """Fail, naming the kernel, the ``tl.load`` line, the element and the program id, if a
    program loaded (mask true) an element outside every tensor argument's view (see
    ``kernel_memory``): loads are held to the same bounds as stores."""
    __tracebackhide__ = True
    stray = [s for report in reports for s in report.get("stray_loads", [])]
    if stray:
        kernel, site, element, pid, count = stray[0]
        raise AssertionError(
            f"{what}: program {tuple(pid)} of {kernel} loads {element} ({count} element(s) "
            f"outside the data in that load; {len(stray)} such load(s) seen) at {site}. A "
            "load must be masked to the elements the contract names (rows < the length, "
            "columns < the head dim): a GPU reads whatever lies there (or faults), and what "
            "is never stored still costs bandwidth and can be NaN or Inf in a tl.dot"
        )


def _batch_step(fn: Callable[..., Any], args: tuple) -> tuple | None:
    """``(client, op, target, name, what, args)`` of one step of ``call_all`` under the grader
    (``(getattr, (obj, name))`` reads an attribute), or None: not the sandbox's."""
    if fn is getattr and len(args) == 2 and isinstance(args[1], str):
        read = getattr(type(args[0]), "__batch_attribute__", None)
        return (*read(args[0], args[1]), ()) if read is not None else None
    entry = getattr(fn, "__batch_entry__", None)
    if entry is None:
        return None
    return (*entry(), tuple(getattr(fn, "__batch_arguments__", tuple)(args)))


class Earlier(NamedTuple):
    """A whole positional argument of :func:`call_all` that stands for what call ``index``
    of the same list returned: ``[(impl.BlockPool, (8, 4)), (impl.KVCacheManager,
    (Earlier(0),))]``."""

    index: int


def call_all(calls: Iterable[tuple[Callable[..., Any], tuple]],
             stop_if_none: int | None = None) -> list[Any]:
    """``[fn(*args) for fn, args in calls]``; ``(getattr, (obj, "name"))`` reads an attribute;
    the list ends at call ``stop_if_none`` if it returns None. Under the grader, the steps of
    one sandboxed worker go there in one round trip (each result checked as one call's, the
    first error raised)."""
    calls = list(calls)
    for i, (_, args) in enumerate(calls):
        if any(type(a) is Earlier and not 0 <= a.index < i for a in args):
            raise ValueError(f"calls[{i}]: an Earlier argument must name an earlier call")
    if stop_if_none is not None and not 0 <= stop_if_none < len(calls):
        raise ValueError(f"stop_if_none must index one of the calls, got {stop_if_none}")
    steps = [_batch_step(fn, args) for fn, args in calls]
    if calls and None not in steps and len({id(s[0]) for s in steps}) == 1:  # type: ignore
        return steps[0][0].request_batch(  # type: ignore[index]
            [(op, target, name, args, {}, what) for _, op, target, name, what, args in steps],
            stop_if_none)
    got: list[Any] = []
    for fn, args in calls:
        got.append(fn(*(got[a.index] if type(a) is Earlier else a for a in args)))
        if len(got) - 1 == stop_if_none and got[-1] is None:
            break
    return got


INSTRUMENTS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "peak_memory": peak_memory,
    "host_syncs": host_syncs,
    "kernel_memory": kernel_memory,
}


# ---- scripts of a lab that run the code under test in other processes -----------------------


class LabScript:
    """Run ``python <lab>/<script> *args`` in its own session (e.g. lab-04's torch.distributed
    ring, whose ranks import the code under test); ``result()`` waits, ``stop()`` kills every
    process it started. Under the grader, ``COURSE_SCRIPT_PREFIX`` (a shell-split command, set
    by the grader) is put in front, so the script runs sandboxed like the rest of the code.
    """

    def __init__(self, lab_file: str | Path, script: str, *args: str,
                 env: dict[str, str] | None = None) -> None:
        lab_dir = Path(lab_file).resolve()
        lab_dir = lab_dir.parent if lab_dir.is_file() else lab_dir
        full_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **(env or {}))
        prefix = shlex.split(os.environ.get("COURSE_SCRIPT_PREFIX", ""))
        cmd = [*prefix, sys.executable, str(lab_dir / script), *args]
        self.proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.script = script
        self.output: str | None = None

    def result(self, timeout: float = 60) -> tuple[int | None, str]:
        """``(returncode, output)``; a script still running after ``timeout`` s is killed."""
        if self.output is None:
            try:
                self.output, _ = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.output = f"{self.script} did not finish in {timeout:.0f} s"
            finally:
                self.stop()
        return self.proc.returncode, self.output

    def stop(self) -> None:
        """Kill the script's session (it and every process it forked), if any is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # everyone already exited
        self.proc.wait()


# ---- compiled for a GPU: what the interpreter hides --------------------------------------
#
# The compile check lives in the grader (``grading/plugin/compile_check.py``). The course's
# ``conftest.py`` registers it here, so ``common/`` imports nothing above it; where nothing is
# registered (a copy of the course without ``bench/``), no compile test is collected.
COMPILE_CHECKS: dict[str, Callable[..., Any]] = {}


def register_compile_checks(kernels_of: Callable[[str], list[str]],
                            check_kernels: Callable[[str, str, str], dict[str, list[str]]]
                            ) -> None:
    """Register ``kernels_of(lab)`` (the kernels to compile) and ``check_kernels(lab, impl,
    labs_root)`` (every kernel's problems, by name) for ``sm90_compile_test``."""
    COMPILE_CHECKS.update(kernels_of=kernels_of, check_kernels=functools.cache(check_kernels))


def assert_compiles_for_sm_90(test_file: str, kernel: str) -> None:
    """Compile ``kernel`` of the lab beside ``test_file`` (``LAB_IMPL``'s file) for sm_90 with
    Triton's bundled ptxas, on the CPU (all of a lab's kernels at once, asked once per test
    process); fail with the compiler's message, or with what the compiled code shows that the
    interpreter hides (TF32 dots on float32 inputs, spills, 32-bit offsets)."""
    import pytest

    from common.loader import lab_impl

    lab = Path(test_file).resolve().parent
    problems = COMPILE_CHECKS["check_kernels"](lab.name, lab_impl(), str(lab.parent))
    if problems.get(kernel):
        pytest.fail("compiled for an H100 (sm_90) on the CPU:\n" + "\n".join(problems[kernel]),
                    pytrace=False)  # fmt: skip


# ---- bad input: a ValueError that names the argument ---------------------------------------

# A bad-input table: ``{case id: (argument, call)}``. ``argument`` is the name the message
# must contain as a whole word (or, if it is not a plain name, a regular expression);
# ``call`` takes no arguments and makes the bad call.
BadInputs = dict[str, tuple[str, Callable[[], Any]]]


def assert_value_error_names(call: Callable[[], Any], argument: str, case: str = "") -> None:
    """Assert ``call()`` raises a ``ValueError`` whose message names ``argument``.

    A plain name (``"block_n"``) must appear as a whole word; anything else is a regular
    expression searched in the message. Any other exception propagates (a starter's
    ``NotImplementedError`` fails the test)."""
    __tracebackhide__ = True

    pattern = rf"\b{argument}\b" if re.fullmatch(r"\w+", argument) else argument
    where = f"{case}: " if case else ""
    try:
        call()
    except ValueError as e:
        if not re.search(pattern, str(e)):
            raise AssertionError(
                f"{where}the ValueError should name {argument!r} (the argument that is wrong "
                f"and what is wrong with it), got: {e}") from None
        return
    raise AssertionError(
        f"{where}expected a ValueError naming {argument!r}, none was raised: check the "
        "argument before computing with it")


def bad_input_test(cases: BadInputs, *, points: float, marks: tuple[Any, ...] = ()
                   ) -> Callable[[str], None]:
    """A graded test, parametrized over ``cases`` (a bad-input table, see ``BadInputs``), that
    each bad call raises a ``ValueError`` naming its argument; ``points`` per case. Bind it to
    a ``test_...`` name in the lab's test module."""
    import pytest

    def test(case: str) -> None:
        __tracebackhide__ = True
        argument, call = cases[case]
        assert_value_error_names(call, argument, case)

    test = pytest.mark.parametrize("case", list(cases))(test)
    for mark in (pytest.mark.points(points), *marks):
        test = mark(test)
    return test


# ---- hypothesis: how many examples a property test runs ------------------------------------

# The course profile (conftest.py) runs 25 examples a property test.
COURSE_EXAMPLES = 25


def examples(n: int) -> Any:
    """``@examples(n)``: the one way a lab's property test sets its own hypothesis settings.

    Runs ``n`` examples under the course profile (a slow test asks for fewer than its 25);
    under another profile (``HYPOTHESIS_PROFILE=thorough`` or ``explore``) ``n`` scales with
    that profile's number, so a thorough run is thorough for every test."""
    from hypothesis import settings

    return settings(max_examples=max(1, round(n * settings.default.max_examples
                                              / COURSE_EXAMPLES)))


def sm90_compile_test(test_file: str) -> Callable[[str], None] | None:
    """The graded test that every kernel of the lab beside ``test_file`` compiles for sm_90
    (``assert_compiles_for_sm_90``), one point a kernel; None (nothing to collect) where no
    compile check is registered."""
    import pytest

    if not COMPILE_CHECKS:
        return None
    kernels = COMPILE_CHECKS["kernels_of"](Path(test_file).resolve().parent.name)

    @pytest.mark.points(1)
    @pytest.mark.triton
    @pytest.mark.gpu_compile
    @pytest.mark.parametrize("kernel", kernels)
    def test(kernel: str) -> None:
        """The kernel compiles for sm_90 with the bundled ptxas (a plain Python global read
        in a kernel runs on the interpreter and does not compile for a GPU), float32 inputs
        keep ieee dots, the lab's GPU tiles do not spill, large tensors get 64-bit offsets."""
        assert_compiles_for_sm_90(test_file, kernel)

    return test if kernels else None


# Misconceptions named alike in several labs (one wording each).
NO_SCALE = "forgot the 1/sqrt(d) scale"
LSE_WITHOUT_MAX = "lse must include the max: lse = m + log(l)"
BOTTOM_RIGHT = ("causal here is top-left (query i sees keys 0..i, like SDPA is_causal); the mask "
                "was aligned bottom-right")
# The scale keyword's two misconceptions, worded once for every lab (0 is a scale).
SCALE_ZERO_AS_DEFAULT = (
    "scale=0 was not used, 1/sqrt(d) was: either the keyword is not passed on, or 0 was taken "
    "for 'use the default' (`scale or 1/sqrt(d)`). 0 is a scale (every score 0, uniform "
    "weights); only None means the default (`if scale is None`)"
)
SCALE_IGNORED = "scale= was not used: 1/sqrt(d) was (pass the keyword on to every call)"
PADDED_SCALE = (
    "the default scale came from the padded head dim (the tl.dot tile: 24 -> 32, 40 -> 64), "
    "not the real one: it is 1/sqrt(d) of the tensors' d"
)


def scale_wrong(scale: float, default: Any) -> dict[str, Any]:
    """``{misconception: answer}`` for a call given ``scale=``: ``default`` (the 1/sqrt(d)
    answer) named by the misconception that gives it (``scale=0`` taken for None, or ignored)."""
    return {SCALE_ZERO_AS_DEFAULT if scale == 0 else SCALE_IGNORED: default}


def interpreter_only() -> None:
    """Skip the calling test unless Triton runs through its interpreter (CPU): for tests that
    count what a kernel touches, which only the interpreter records."""
    import pytest

    from common.triton_env import on_interpreter

    if not on_interpreter():
        pytest.skip("counts what the kernel touches through Triton's interpreter (CPU only)")


P_NOT_CAST = ("tl.dot was given two dtypes (p in float32, V in float16): cast p to V's dtype "
              "(p.to(v.dtype)) before the dot; the accumulator stays float32")


@contextlib.contextmanager
def raised_as(hint: str, when: str = "") -> Iterator[None]:
    """Fail naming ``hint`` when the code under test raises (an exception whose text holds
    ``when``, if given) instead of answering: the raw error names no misconception."""
    try:
        yield
    except Exception as e:
        if when not in str(e) or (isinstance(e, AssertionError) and not when):
            raise
        raise AssertionError(f"{hint} (the call raised {type(e).__name__}: {e})") from e
