"""Compile one lab kernel for a GPU on a machine without one, and read what ptxas made of it.

Triton compiles to a cubin with no driver: ``triton.compile(ASTSource(fn, signature,
constexprs, attrs), target=GPUTarget("cuda", arch, 32))``. The wheel ships ``ptxas``,
``cuobjdump`` and ``nvdisasm``; from them come registers, spills, shared memory and the SASS.

Rules that keep this working next to the CPU suite (checked with triton 3.9.0 and 3.7.1):

* Compiling needs triton imported with the interpreter OFF: with ``TRITON_INTERPRET=1``,
  every ``@triton.jit`` (the lab's kernels, and Triton's own ``tl.sum``, ``tl.max``, ...) is
  an interpreter object the compiler rejects. The CPU suite and ``bench/__init__`` set it to
  1, so compiles run in worker processes started with ``TRITON_INTERPRET=0`` (``run_tasks``,
  spawn start method); the calling process never needs triton.
* ptxas must run, since its log is the only place that reports spill bytes, so Triton's own
  cache is bypassed (``TRITON_ALWAYS_COMPILE=1`` and a throw-away ``TRITON_CACHE_DIR``).
  Results are cached here instead (``build/gpu-report/<key>.json``, with the SASS beside it
  as ``<key>.sass``), keyed by the kernel's source hash (``JITFunction.cache_key``, which
  covers the functions it calls), the specialised signature, the options, the arch and the
  Triton version. A rerun with nothing changed compiles nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import pathlib
import re
import subprocess
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from bench.gpu_kernels import GPU_KERNELS, GpuKernel, Lab, Launch, Ptr
from common.loader import load_lab_module

SCHEMA = "attention-labs-gpu-report/1"
ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_CACHE = ROOT / "build" / "gpu-report"


class SkipEntry(Exception):
    """This tree has no such kernel (or another version of it): skip, with the reason."""


# ---- loading a lab's kernels as JITFunctions ------------------------------------------------


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a block, then restore them."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_lab(labs_root: pathlib.Path, lab: str, impl: str = "solution") -> Lab:
    """The lab's ``impl`` module and its ``provided.py`` (None if absent), with JIT kernels.

    Only in a process where triton was imported with the interpreter off (``run_tasks``
    starts such processes): with ``TRITON_INTERPRET=1``, ``@triton.jit`` (Triton's own
    ``tl.sum``, ``tl.max``... included) makes interpreter objects that cannot be compiled.
    """
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        raise RuntimeError("compile in a process started with TRITON_INTERPRET=0 (run_tasks)")
    lab_dir = labs_root / lab
    if not (lab_dir / f"{impl}.py").is_file():
        raise SkipEntry(f"labs/{lab}/{impl}.py does not exist in this tree")
    provided = load_lab_module(lab_dir, "provided") if (lab_dir / "provided.py").is_file() else None
    return Lab(load_lab_module(lab_dir, impl), provided)


def kernel_of(lab: Lab, lab_name: str, kernel: str) -> Any:
    """The ``@triton.jit`` function ``kernel``, or ``SkipEntry`` saying why there is none."""
    fn = getattr(lab.solution, kernel, None)
    if fn is None:
        raise SkipEntry(f"{lab_name} has no kernel {kernel} in this tree")
    if not hasattr(fn, "arg_names") or not hasattr(fn, "cache_key"):
        raise SkipEntry(f"{lab_name}.{kernel} is not a Triton JIT function here")
    return fn


# ---- specialising the arguments as Triton's runtime does ------------------------------------


@dataclass(frozen=True)
class Spec:
    """What ``ASTSource`` needs, plus the launch options: all plain, picklable values."""

    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict[int, list[list[Any]]]  # parameter index -> [["tt.divisibility", 16]]
    options: dict[str, int]


def _int_type(value: int) -> str:
    if -(2**31) <= value < 2**31:
        return "i32"
    return "i64" if -(2**63) <= value < 2**63 else "u64"


def specialize(fn: Any, launch: Launch) -> Spec:
    """Types and hints for each parameter, as ``JITFunction.run`` derives them from values.

    Pointers are 16-byte aligned (torch allocations are); an int equal to 1 becomes a
    constant; an int divisible by 16 is marked so (``tt.divisibility``), which lets the
    compiler vectorise loads; floats are fp32. Parameters declared ``do_not_specialize``
    get no hints. ``SkipEntry`` when the arguments do not match the kernel's parameters.
    """
    names = list(fn.arg_names)
    missing = [n for n in names if n not in launch.args]
    extra = [n for n in launch.args if n not in names]
    if missing or extra:
        raise SkipEntry(
            f"{fn.__name__}'s parameters differ from the entry's arguments (another version "
            f"of the kernel?): missing {missing or 'none'}, unexpected {extra or 'none'}"
        )
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[int, list[list[Any]]] = {}
    for index, (name, param) in enumerate(zip(names, fn.params)):
        value = launch.args[name]
        hints = not getattr(param, "do_not_specialize", False)
        if param.is_constexpr or (hints and type(value) is int and value == 1):
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, Ptr):
            signature[name] = f"*{value.dtype}"
            if hints:
                attrs[index] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "u1"
        elif isinstance(value, int):
            signature[name] = _int_type(value)
            if hints and value % 16 == 0:
                attrs[index] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}({name}={value!r}): no rule for a {type(value)}")
    return Spec(signature, constexprs, attrs, dict(launch.options))


# ---- the job: one kernel x config x dtype x head dim x arch ---------------------------------


@dataclass(frozen=True)
class Task:
    """What the report asks a worker for: entry ``entry`` of ``GPU_KERNELS`` at one config."""

    entry: int
    dtype: str
    head_dim: int
    arch: int
    impl: str = "solution"
    labs_root: str = str(ROOT / "labs")
    cache_dir: str | None = str(DEFAULT_CACHE)  # None: neither read nor write the cache
    refresh: bool = False  # compile even when the cache has the result

    @property
    def label(self) -> str:
        entry = GPU_KERNELS[self.entry]
        return f"{entry.name} {self.dtype} d{self.head_dim} sm_{self.arch}"


def triton_version() -> str:
    import triton

    return triton.__version__


def cache_key(fn: Any, spec: Spec, arch: int) -> str:
    """Changes when the kernel's source (or a function it calls), the specialisation, the
    options, the arch or Triton's version changes."""
    payload = {
        "schema": SCHEMA,
        "source": fn.cache_key,
        "signature": spec.signature,
        "constexprs": {k: repr(v) for k, v in spec.constexprs.items()},
        "attrs": {str(k): v for k, v in spec.attrs.items()},
        "options": spec.options,
        "arch": arch,
        "triton": triton_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def launch_spec(entry: GpuKernel, lab: Lab, fn: Any, dtype: str, head_dim: int,
                arch: int | None = None) -> Spec:  # fmt: skip
    """The entry's launch, specialised; a launch function that fails on this tree (a constant
    it reads is missing: another version of the lab) is ``SkipEntry`` with its error.
    ``arch``: the tiles the labs' ``gpu_tiles`` plan for that arch (``triton_env.PLAN_TARGET``,
    what ``plan_target()`` gives a launcher on such a GPU)."""
    from common import launch_plan, triton_env

    previous = triton_env.PLAN_TARGET
    triton_env.PLAN_TARGET = None if arch is None else launch_plan.target_for(arch)
    try:
        launch = entry.launch(lab, dtype, head_dim)
    except (AttributeError, KeyError, LookupError, TypeError) as exc:
        raise SkipEntry(f"the entry's launch arguments do not fit this tree's version of the lab "
                        f"({type(exc).__name__}: {exc})") from None  # fmt: skip
    finally:
        triton_env.PLAN_TARGET = previous
    return specialize(fn, launch)


# ---- reading ptxas' log, cuobjdump's resource usage and the SASS ----------------------------

_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_RESOURCE = re.compile(r"Function (\S+):\s*\n\s*(REG:.*)")
# "/*0a30*/  @!P0 LDG.E.128 R4, desc[UR6][R2.64] ;": the mnemonic after the optional predicate
_SASS_OP = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
)
LOAD_KINDS = ("LDG", "LDGSTS", "UTMALDG", "UBLKCP")  # plain, cp.async, TMA tile, bulk copy


def parse_ptxas_log(log: str) -> dict[str, int]:
    """``stack``, ``spill_stores``, ``spill_loads`` (bytes) and ``regs`` from ``ptxas -v``."""
    spills, regs = _SPILLS.search(log), _REGS.search(log)
    if spills is None or regs is None:
        raise ValueError(f"no register/spill line in the ptxas log:\n{log}")
    stack, stores, loads = (int(g) for g in spills.groups())
    return {"regs": int(regs.group(1)), "stack": stack, "spill_stores": stores,
            "spill_loads": loads}  # fmt: skip


def parse_resource_usage(text: str) -> dict[str, int]:
    """``REG``, ``SHARED`` (static), ``LOCAL``, ``STACK`` of the one kernel in a cubin, from
    ``cuobjdump --dump-resource-usage``."""
    match = _RESOURCE.search(text)
    if match is None:
        raise ValueError(f"no function in cuobjdump's resource usage:\n{text}")
    fields = dict(item.split(":", 1) for item in match.group(2).split())
    return {name: int(fields[name]) for name in ("REG", "SHARED", "LOCAL", "STACK")}


def count_sass(sass: str) -> dict[str, dict[str, int]]:
    """Tensor-core instructions (every opcode ending in MMA: HMMA, HGMMA, UTCHMMA, ...) by
    full mnemonic, and global loads by kind (``LOAD_KINDS``)."""
    mma: Counter[str] = Counter()
    loads: Counter[str] = Counter()
    for match in _SASS_OP.finditer(sass):
        mnemonic = match.group(1)
        base = mnemonic.split(".", 1)[0]
        if base.endswith("MMA"):
            mma[mnemonic] += 1
        elif base in LOAD_KINDS:
            loads[base] += 1
    return {"mma": dict(sorted(mma.items())), "loads": dict(sorted(loads.items()))}


def count_dots(ttir: str) -> int:
    """``tt.dot`` operations in the Triton IR: each ``tl.dot`` the kernel executes."""
    return len(re.findall(r"\btt\.dot\b", ttir))


_DOT = re.compile(r"= tt\.dot .*?: tensor<[^>]*xf32> \* ")
_ADDPTR = re.compile(
    r"(%[\w.]+) = tt\.addptr (%[\w.]+), %[\w.]+ : [^,]+, (?:tensor<[^>]*?x)?(i32|i64)"
)
_SPLAT = re.compile(r"(%[\w.]+) = tt\.(?:splat|broadcast|expand_dims) (%[\w.]+)")
_ARG = re.compile(r"%(\w+): !tt\.ptr<")


def tf32_dots_on_f32(ttir: str) -> int:
    """``tt.dot`` ops on float32 operands that round them to TF32 (``inputPrecision = tf32``
    in the Triton IR; the IR prints nothing for the default, ``ieee``)."""
    return sum(1 for line in ttir.splitlines()
               if _DOT.search(line) and "inputPrecision = tf32" in line)  # fmt: skip


def first_offsets(ttir: str) -> dict[str, list[str]]:
    """Per pointer argument of the kernel, the integer widths of every offset added on its
    way to an address (``tt.addptr`` chains from the argument, through splats and
    broadcasts). Only ``["i32"]``: every ``index * stride`` term was computed in 32 bits, and
    the address wraps once the offset passes 2^31 elements; an ``i64`` on the chain means
    the large term was widened first (``.to(tl.int64)``)."""
    args = set(_ARG.findall(ttir.split("\n", 2)[1] if "\n" in ttir else ttir))
    args |= {m for line in ttir.splitlines() if "tt.func" in line for m in _ARG.findall(line)}
    origin = {f"%{a}": a for a in args}
    widths: dict[str, set[str]] = {}
    for line in ttir.splitlines():
        if (m := _SPLAT.search(line)) and m.group(2) in origin:
            origin[m.group(1)] = origin[m.group(2)]
        elif (m := _ADDPTR.search(line)) and m.group(2) in origin:
            origin[m.group(1)] = origin[m.group(2)]
            widths.setdefault(origin[m.group(2)], set()).add(m.group(3))
    return {name: sorted(w) for name, w in sorted(widths.items())}



# Integer ops an offset passes through on its way to a tt.addptr (values, not masks or loads).
_INT_OPS = frozenset({
    "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape", "tt.trans", "arith.extsi",
    "arith.extui", "arith.trunci", "arith.addi", "arith.subi", "arith.muli", "arith.divsi",
    "arith.divui", "arith.remsi", "arith.remui", "arith.maxsi", "arith.minsi", "arith.select",
})
_PTR_OPS = frozenset({"tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape", "tt.trans",
                      "tt.addptr", "iter_arg"})  # fmt: skip
_DEF_LINE = re.compile(r"^\s*(%[\w.]+)(?::\d+)? = ([\w.]+) (.*?)(?: loc\((#\w+)\))?\s*\{?$")
_VALUE = re.compile(r"%[\w.]+(?:#\d+)?")
_ITER_ARG = re.compile(r"(%[\w.]+) = (%[\w.]+(?:#\d+)?)")
_LOC_LINE = re.compile(r'^(#\w+) = loc\((?:"[^"]*"\((#\w+)\)|"([^"]+)":(\d+):\d+)')
_FUNC_ARG = re.compile(r"%(\w+): ([^ ,)]+)")


class _IntFlow:
    """What the offset checks need of one kernel's Triton IR: each value's defining op and
    operands, the kernel's arguments, and source lines (``loc``)."""

    def __init__(self, ttir: str) -> None:
        lines = ttir.splitlines()
        self.locs: dict[str, str] = {}
        for line in lines:
            if m := _LOC_LINE.match(line):
                self.locs[m.group(1)] = (m.group(2)
                                         or f"{pathlib.Path(m.group(3)).name}:{m.group(4)}")
        func = next((line for line in lines if "tt.func" in line), "")
        self.args = dict(_FUNC_ARG.findall(func))
        self.defs: dict[str, tuple[str, list[str], str, str | None]] = {}
        for line in lines:
            if m := _DEF_LINE.match(line):
                self._define(*m.groups())
        self._strides: dict[str, frozenset[str]] = {}
        self._tile: dict[str, bool] = {}

    def _define(self, res: str, op: str, rest: str, loc: str | None) -> None:
        if op == "scf.for":  # a loop-carried value starts as its init value
            for arg, init in _ITER_ARG.findall(rest.split("iter_args", 1)[-1]):
                self.defs[arg] = ("iter_arg", [init], "", loc)
            return
        body, _, typ = rest.rpartition(" : ")
        self.defs[res] = (op, _VALUE.findall(body), typ.strip(), loc)

    def where(self, loc: str | None) -> str:
        for _ in range(64):
            if loc is None or not loc.startswith("#"):
                break
            loc = self.locs.get(loc)
        return loc or "?"

    def stride_args(self, v: str) -> frozenset[str]:
        """The ``stride*`` arguments ``v`` is computed from."""
        if v not in self._strides:
            self._strides[v] = frozenset()
            d = self.defs.get(v)
            if "stride" in v and self.args.get(v[1:], "").startswith("i"):
                self._strides[v] = frozenset({v[1:]})
            elif d is not None and d[0] in _INT_OPS:
                self._strides[v] = frozenset().union(*(self.stride_args(o) for o in d[1]))
        return self._strides[v]

    def tile_constant(self, v: str) -> bool:
        """Whether ``v`` is built from constants and ``tl.arange`` only (``x % BLOCK`` too)."""
        if v not in self._tile:
            self._tile[v] = False
            d = self.defs.get(v)
            if d is not None and d[0] in ("arith.constant", "tt.make_range"):
                self._tile[v] = True
            elif d is not None and d[0] in ("arith.remsi", "arith.remui"):
                self._tile[v] = self.tile_constant(d[1][-1])
            elif d is not None and d[0] in _INT_OPS:
                self._tile[v] = all(self.tile_constant(o) for o in d[1])
        return self._tile[v]

    def constant(self, v: str) -> bool:
        """Whether ``v`` is a constant (a constexpr such as HEAD_DIM), splatted or not."""
        d = self.defs.get(v)
        if d is None:
            return False
        if d[0] == "arith.constant":
            return True
        return d[0] in ("tt.splat", "tt.broadcast", "tt.expand_dims") and self.constant(d[1][0])

    def origin(self, v: str) -> str | None:
        """The pointer argument a pointer value was derived from, if any."""
        for _ in range(256):
            if self.args.get(v[1:], "").startswith("!tt.ptr"):
                return v[1:]
            d = self.defs.get(v)
            if d is None or d[0] not in _PTR_OPS or not d[1]:
                return None
            v = d[1][0]
        return None

    def narrow(self, v: str, found: list[list[str]], seen: set[str]) -> None:
        """Add to ``found`` every 32-bit ``index * stride`` product ``v`` is computed from."""
        d = self.defs.get(v)
        if v in seen or d is None or d[0] not in _INT_OPS | {"iter_arg"}:
            return
        seen.add(v)
        op, operands, typ, loc = d
        strides = [self.stride_args(o) for o in operands]
        if (op == "arith.muli" and re.search(r"(^|x)i32>?$", typ) and any(strides)
                and not all(self.tile_constant(o) for o, s in zip(operands, strides) if not s)):
            entry = [" * ".join(sorted(frozenset().union(*strides))), self.where(loc)]
            if entry not in found:
                found.append(entry)
        for o in operands:
            self.narrow(o, found, seen)

    def terms(self, v: str, found: list[list[str]], seen: set[str]) -> None:
        """Add to ``found`` every 32-bit product that is a term of the offset ``v`` (reached
        through sums and casts, not through another product) of two runtime values, or of a
        tile of runtime rows and a constant: ``rows * HEAD_DIM`` (rows = pid * BLOCK_M +
        tl.arange) is one; the scalar ``start_m * BLOCK_M`` (an index) is not."""
        d = self.defs.get(v)
        if v in seen or d is None or d[0] not in _INT_OPS | {"iter_arg"}:
            return
        seen.add(v)
        op, operands, typ, loc = d
        if op == "arith.muli":
            runtime = [o for o in operands if not self.tile_constant(o)]
            rows_times_constant = (typ.startswith("tensor<") and runtime
                                   and any(self.constant(o) for o in operands))
            if re.search(r"(^|x)i32>?$", typ) and (len(runtime) == 2 or rows_times_constant):
                strides = frozenset().union(*(self.stride_args(o) for o in operands))
                what = " * ".join(sorted(strides)) or "a value that is not a tile constant"
                if [what, self.where(loc)] not in found:
                    found.append([what, self.where(loc)])
            return
        for o in operands:
            self.terms(o, found, seen)


def narrow_products(ttir: str) -> dict[str, list[list[str]]]:
    """Per pointer argument, the ``index * stride`` products computed in 32 bits on the way to
    its addresses: ``{"Q": [["stride_qm", "solution.py:293"]], ...}``.

    A product counts when one factor comes from a ``stride*`` argument and the other is not a
    tile constant (it involves a program id, a loop counter, a loaded block number, a size):
    such a product reaches ``L * stride`` and wraps past 2^31 on a production-size tensor
    even when another term of the same address was widened. ``(pid * BLOCK + tl.arange) *
    stride`` in ``i32`` is one; ``tl.arange(0, BLOCK) * stride`` and ``BLOCK * stride`` (a
    tile's reach, a loop step) are not; ``rows.to(tl.int64) * stride`` is ``i64``: fine. A
    term of the offset that multiplies two runtime values in ``i32`` (``rows * HEAD_DIM`` of
    a contiguous kernel) counts too (``what``: "a value that is not a tile constant")."""
    flow = _IntFlow(ttir)
    out: dict[str, list[list[str]]] = {}
    for op, operands, _, _ in list(flow.defs.values()):
        if op == "tt.addptr" and len(operands) == 2 and (name := flow.origin(operands[0])):
            flow.narrow(operands[1], out.setdefault(name, []), set())
            flow.terms(operands[1], out[name], set())
    return {name: found for name, found in sorted(out.items()) if found}

def _nvidia_tool(name: str) -> str:
    from triton import knobs

    return getattr(knobs.nvidia, name).path


def tool_version(name: str) -> str:
    from triton import knobs

    return str(getattr(knobs.nvidia, name).version)


def ptxas_version(arch: int) -> str:
    """The version of the ptxas Triton uses for ``arch`` (sm_90+ may use ptxas-blackwell)."""
    from triton.backends.nvidia.compiler import get_ptxas

    tool = get_ptxas(arch)
    return f"{pathlib.Path(tool.path).name} {tool.version}"


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_nvidia_tool("cuobjdump"), *flags, f.name], capture_output=True,
                             text=True, check=True)  # fmt: skip
    return out.stdout


# ---- compiling ------------------------------------------------------------------------------


def compile_kernel(fn: Any, spec: Spec, arch: int) -> tuple[Any, str]:
    """``(compiled kernel, ptxas log)`` for ``sm_<arch>``; no GPU, no driver, no cache."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    log = io.StringIO()
    attrs = {(i,): v for i, v in spec.attrs.items()}
    with tempfile.TemporaryDirectory(prefix="gpu-report-triton-") as scratch, environment(
        TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1", TRITON_CACHE_DIR=scratch
    ), warnings.catch_warnings(), contextlib.redirect_stdout(log):  # fmt: skip
        warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
        source = ASTSource(fn, spec.signature, spec.constexprs, attrs)
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=spec.options)
    return kernel, log.getvalue()


def summarize(kernel: Any, ptxas_log: str, arch: int) -> tuple[dict, str]:
    """``(the numbers the report shows, the SASS)`` of a compiled kernel."""
    cubin = kernel.asm["cubin"]
    usage = parse_resource_usage(_cuobjdump(cubin, "--dump-resource-usage"))
    ptxas = parse_ptxas_log(ptxas_log)
    sass = _cuobjdump(cubin, "-sass")
    meta = kernel.metadata
    result = {
        "num_warps": int(meta.num_warps),
        "num_stages": int(meta.num_stages),
        "regs": usage["REG"],
        "stack": usage["STACK"],
        "local": usage["LOCAL"],
        "spill_stores": ptxas["spill_stores"],
        "spill_loads": ptxas["spill_loads"],
        "smem_static": usage["SHARED"],
        "smem_dynamic": int(meta.shared),
        "tmem": int(getattr(meta, "tmem_size", 0) or 0),
        "dots": count_dots(kernel.asm["ttir"]),
        "tf32_dots_on_f32": tf32_dots_on_f32(kernel.asm["ttir"]),
        "first_offsets": first_offsets(kernel.asm["ttir"]),
        "narrow_products": narrow_products(kernel.asm["ttir"]),
        **count_sass(sass),
        "tools": {"triton": triton_version(), "ptxas": ptxas_version(arch),
                  "cuobjdump": tool_version("cuobjdump")},  # fmt: skip
    }
    return result, sass


def store(cache_dir: pathlib.Path, key: str, result: dict, sass: str) -> None:
    """Write ``<key>.json`` and ``<key>.sass`` atomically (two processes share the folder)."""
    try:  # a read-only checkout (the grader's sandbox) compiles without caching
        cache_dir.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".json", json.dumps(result, indent=1, sort_keys=True)),
                             (".sass", sass)):  # fmt: skip
            tmp = cache_dir / f".{key}{suffix}.{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, cache_dir / f"{key}{suffix}")
    except OSError:
        pass


def cached(cache_dir: pathlib.Path | None, key: str) -> dict | None:
    """The stored result for ``key``, or None."""
    if cache_dir is None:
        return None
    try:
        return json.loads((cache_dir / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


_LABS: dict[tuple[str, str, str], Lab | SkipEntry] = {}  # per worker process


def _lab(labs_root: str, lab: str, impl: str) -> Lab:
    key = (labs_root, lab, impl)
    if key not in _LABS:
        try:
            _LABS[key] = load_lab(pathlib.Path(labs_root), lab, impl)
        except SkipEntry as exc:
            _LABS[key] = exc
    found = _LABS[key]
    if isinstance(found, SkipEntry):
        raise found
    return found


def task_key(task: Task) -> dict:
    """The cache key ``task`` would compile under (nothing is compiled): ``{"status": "ok",
    "key": ...}``, or ``skip`` with the reason. The key names exactly what the report's row
    was compiled from: the kernel's source, the specialisation, the options, arch, Triton."""
    entry = GPU_KERNELS[task.entry]
    try:
        lab = _lab(task.labs_root, entry.lab, task.impl)
        fn = kernel_of(lab, entry.lab, entry.kernel)
        spec = launch_spec(entry, lab, fn, task.dtype, task.head_dim, task.arch)
    except SkipEntry as exc:
        return {"status": "skip", "reason": str(exc)}
    return {"status": "ok", "key": cache_key(fn, spec, task.arch)}


def task_keys(tasks: Sequence[Task]) -> list[dict]:
    """``task_key`` of every task, in one fresh process started with ``TRITON_INTERPRET=0``
    (a kernel's cache key exists only outside the interpreter); seconds, no compile."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        with environment(TRITON_INTERPRET="0"):
            return list(pool.map(task_key, tasks))


def run_task(task: Task) -> dict:
    """One config in a worker: ``{"status": "ok" | "skip" | "error", ...}``. ``ok`` carries
    ``result`` (cached or fresh), ``cached`` and ``seconds`` (the compile's wall time)."""
    entry = GPU_KERNELS[task.entry]
    cache_dir = None if task.cache_dir is None else pathlib.Path(task.cache_dir)
    try:
        lab = _lab(task.labs_root, entry.lab, task.impl)
        fn = kernel_of(lab, entry.lab, entry.kernel)
        spec = launch_spec(entry, lab, fn, task.dtype, task.head_dim, task.arch)
    except SkipEntry as exc:
        return {"status": "skip", "reason": str(exc)}
    key = cache_key(fn, spec, task.arch)
    hit = None if task.refresh else cached(cache_dir, key)
    if hit is not None and "narrow_products" in hit:  # (a result cached before that check)
        return {"status": "ok", "result": hit, "cached": True, "seconds": 0.0}
    start = time.perf_counter()
    try:
        kernel, log = compile_kernel(fn, spec, task.arch)
        result, sass = summarize(kernel, log, task.arch)
    except Exception as exc:  # a compile error is reported, not raised: the others go on
        return {"status": "error", "reason": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
    result = {"key": key, "options": spec.options, "constexprs": spec.constexprs, **result}
    if cache_dir is not None:
        store(cache_dir, key, result, sass)
    return {"status": "ok", "result": result, "cached": False,
            "seconds": round(time.perf_counter() - start, 2)}  # fmt: skip


def run_tasks(
    tasks: Sequence[Task],
    workers: int = 2,
    progress: Callable[[Task, dict], None] | None = None,
) -> list[dict]:
    """Run ``tasks`` on up to ``workers`` fresh processes, spawned with
    ``TRITON_INTERPRET=0`` so that their triton compiles; results in the order of ``tasks``.
    A worker that dies turns its tasks into errors (never a hang)."""
    results: list[dict] = [{} for _ in tasks]
    if not tasks:
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max(1, min(workers, len(tasks))), mp_context=context) as pool:
        with environment(TRITON_INTERPRET="0"):  # workers start at submit and inherit it
            futures = {pool.submit(run_task, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            index = futures[future]
            try:
                results[index] = future.result()
            except Exception as exc:  # BrokenProcessPool: a worker died
                results[index] = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
            if progress is not None:
                progress(tasks[index], results[index])
    return results
