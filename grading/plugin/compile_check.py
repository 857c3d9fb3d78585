"""The graded compile check: a lab's kernels (``LAB_IMPL``) compiled for sm_90 on the CPU.

The interpreter runs a kernel as Python: it accepts code no GPU compiler does (a plain
Python global read inside ``@triton.jit``), ignores ``input_precision`` and never wraps a
32-bit offset. So each kernel of the lab (the entries of ``bench/gpu_kernels.py``) is compiled
with Triton's bundled ptxas for sm_90 at the lab's GPU tiles, once per lab before its tests
(:func:`precompile`, outside every per-test clock), and the compiled code is checked
(:func:`problems`, the rules in :data:`COMPILE_RULES` and :data:`SMEM_LIMITS`):

* it compiles (else the compiler's message; an untouched starter's ``tl.static_assert``
  TODO is "not written yet: nothing to compile") and reads global memory (an empty ``pass``
  body compiles too: it earns nothing);
* bf16 at the bench head dim: no spills, a tensor-core MMA for the ``tl.dot`` s, shared
  memory within the architecture's limit;
* float32 inputs: no ``tl.dot`` rounds them to TF32;
* 64-bit offsets: every ``tt.addptr`` chain from a pointer that can address more than 2^31
  elements in production (:data:`COMPILE_RULES`' ``big``) adds at least one ``i64`` offset,
  and each ``index * stride`` product on it is computed in ``i64``
  (``bench.gpu_compile.narrow_products``): one widened term does not save ``row *
  stride_qm`` computed in 32 bits. Exempt: a tile's reach (``tl.arange(0, BLOCK) * stride``)
  and the head stride of a KV cache or a varlen ``[T, H, d]`` tensor (a head times ``d``).

Where the code is compiled: under the grader (the proxy plugin active), inside the lab's
sandbox (:mod:`grading.sandbox.compiler`, a fresh interpreter forked into it by the lab's
zygote): nothing of the submission runs in this process or as the grader's user. Its reply
is plain JSON of at most ``PROGRAM_REPLY_LIMIT`` bytes, checked here field by field
(:func:`plain_outcome`) and cached by the hash of what it was compiled from
(:func:`source_key`: the graded file, the lab's given code, ``common/``, the compiler, the
Triton version). In a plain pytest run (a student's own machine, their own code) the GPU
report's compiler runs it in worker processes (``bench.gpu_compile.run_tasks``).

    python -m grading.plugin.compile_check --lab 05 [--impl solution]   # the check alone
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import json
import pathlib
import re
import sys
import time
from typing import Any

from grading.sandbox.lab_sandbox import PROGRAM_REPLY_LIMIT

ROOT = pathlib.Path(__file__).resolve().parents[2]
LABS = ROOT / "labs"
ARCH = 90
# A cold compile of the largest lab on a 2-core machine at load 20 takes a few minutes; the
# step runs before the lab's tests and never counts against a test's limit.
COMPILE_LIMIT = 1200.0
CACHE_DIR = ROOT / "build" / "grade-compile"

# ---- the rules: one table (a lab manifest can re-point it) ---------------------------------

# Shared memory one block may use, bytes: sm_90 (H100) 228 KB per SM, sm_80 (A100) 164 KB,
# sm_86 / sm_89 (consumer Ampere / Ada) 99 KB per block (CUDA C Programming Guide, compute
# capabilities table); sm_100 as sm_90.
SMEM_LIMITS = {80: 164 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 228 * 1024, 100: 228 * 1024}

# Pointers that address more than 2^31 elements at production sizes: KV caches, dense
# [B, H, L, d] tensors (labs 00, 05); a lab adds its own (lab 03's varlen [T, H, d] queries
# and outputs) or is exempt (the primer's puzzles index tensors of at most 2^24 elements) in
# its lab.toml's [compile] (labs/manifest.py): the per-lab rules live there, read here.
DEFAULT_BIG = r"cache|^(Q|K|V|O|DO|DQ|DK|DV|Out)$"
# In a KV cache [blocks, block_size, kv_heads, d] and a varlen [T, H, d] tensor the head
# stride is d: head * stride stays below 2^16 elements, so that one product may stay 32-bit.
# A dense [B, H, L, d] tensor's head stride is L * d: there it may not.
HEAD_STRIDE = re.compile(r"^stride_[a-z]*?_?h(ead)?$")
DENSE = re.compile(r"^(Q|K|V|O|DO|DQ|DK|DV|Out)$")
COMPILE_RULES: dict[str, dict[str, Any]] = {
    "default": {"big": DEFAULT_BIG, "wide_offsets": True},
}


def rules_of(lab: str) -> dict[str, Any]:
    """The compile rules of ``lab``: the defaults, with its manifest entry's on top."""
    rules = dict(COMPILE_RULES["default"]) | COMPILE_RULES.get(lab, {})
    try:
        from labs import manifest
    except ImportError:  # a copy of the course without the manifest: the defaults
        return rules
    entry = next((e for e in manifest.labs() if e.folder == lab), None)
    if entry is not None and entry.big_pointers:
        rules["big"] = f"{rules['big']}|{entry.big_pointers}"
    if entry is not None and entry.small_tensors:
        rules["wide_offsets"] = False
    return rules


def _entries() -> tuple[Any, ...]:
    from bench.gpu_kernels import GPU_KERNELS

    return GPU_KERNELS


def kernels_of(lab: str) -> list[str]:
    """The ``@triton.jit`` kernels of ``lab`` that the check compiles, in table order."""
    return list(dict.fromkeys(e.kernel for e in _entries() if e.lab == lab))


def lab_tasks(lab: str) -> list[dict[str, Any]]:
    """Per kernel of ``lab`` (its first entry): a bf16 compile at the bench head dim
    (``check="bf16"``, fp16 where the kernel has no bf16 entry) and a float32 one at the
    smallest (``"fp32"``)."""
    seen: set[str] = set()
    out = []
    for index, entry in enumerate(_entries()):
        if entry.lab != lab or entry.kernel in seen:
            continue
        seen.add(entry.kernel)
        dtype = "bf16" if "bf16" in entry.dtypes else entry.dtypes[0]
        out.append({"entry": index, "kernel": entry.kernel, "dtype": dtype,
                    "head_dim": entry.summary_dims, "arch": ARCH, "check": "bf16"})
        out.append({"entry": index, "kernel": entry.kernel, "dtype": "fp32",
                    "head_dim": min(entry.head_dims), "arch": ARCH, "check": "fp32"})
    return out


# ---- judging one compile -------------------------------------------------------------------

NOT_WRITTEN = "not written yet: nothing to compile (the starter's TODO)"


def problems(task: dict[str, Any], outcome: dict[str, Any], lab: str) -> list[str]:
    """What is wrong with one compile of ``lab``, in words (empty: nothing)."""
    name, arch = task["kernel"], task["arch"]
    if task.get("launched"):  # the launcher's own launch, recorded at a tiny size
        name = f"{name} (as {task['launcher']} launched it, {task['dtype']})"
    if outcome["status"] == "skip":
        return [f"{name}: not compiled: {outcome['reason']}"]
    if outcome["status"] != "ok":
        reason = outcome["reason"]
        if "static_assert" in reason and "TODO" in reason:
            return [f"{name}: {NOT_WRITTEN}"]
        where = "" if task.get("launched") else f" ({task['dtype']}, d={task['head_dim']})"
        return [f"{name}{where} does not compile for sm_{arch}: {reason[-1500:]}"]
    r, found = outcome["result"], []
    if not any(r["loads"].values()):
        return [f"{name}: the compiled kernel reads no global memory: it is not written yet"]
    if task["check"] == "fp32" and r["tf32_dots_on_f32"]:
        found.append(f"{name}: {r['tf32_dots_on_f32']} tl.dot on float32 inputs round them to "
                     "TF32 on a GPU (the interpreter computes in full float32): pass "
                     "input_precision=DOT_PRECISION (\"ieee\" for float32)")  # fmt: skip
    if task["check"] == "bf16":
        spilled = r["spill_stores"] + r["spill_loads"]
        if spilled:
            found.append(f"{name}: spills {spilled} B at the lab's GPU tiles "
                         f"({r['regs']} registers per thread)")  # fmt: skip
        if r["dots"] and not r["mma"]:
            found.append(f"{name}: {r['dots']} tl.dot but no tensor-core MMA in the SASS")
    smem, limit = r["smem_static"] + r["smem_dynamic"], SMEM_LIMITS.get(arch)
    if limit is not None and smem > limit:
        found.append(f"{name}: {smem // 1024} KB of "
                     f"shared memory per block, over sm_{arch}'s {limit // 1024} KB: smaller "
                     "tiles or fewer pipeline stages (num_stages)")  # fmt: skip
    return found + _offset_problems(name, r, rules_of(lab))


def _offset_problems(name: str, r: dict[str, Any], rules: dict[str, Any]) -> list[str]:
    """The 64-bit rules: a big pointer's chain has an i64 offset, and each of its
    ``index * stride`` products is computed in i64."""
    found: list[str] = []
    big = re.compile(rules["big"])
    offsets = r["first_offsets"] if rules["wide_offsets"] else {}
    narrow = [arg for arg, widths in offsets.items() if big.search(arg) and widths == ["i32"]]
    if narrow:
        found.append(f"{name}: 32-bit offsets into {', '.join(narrow)}: index * stride wraps "
                     "past 2^31 elements on a production-size tensor; widen the large index "
                     "with .to(tl.int64) before multiplying by its stride")  # fmt: skip
    products = r.get("narrow_products", {}) if rules["wide_offsets"] else {}
    for arg, terms in products.items():
        if arg in narrow or not big.search(arg):
            continue
        terms = [t for t in terms if DENSE.match(arg) or not HEAD_STRIDE.match(t[0])]
        if terms:
            said = ", ".join(f"index * {stride} ({where})" for stride, where in terms)
            found.append(f"{name}: {said} into {arg} computed in 32 bits: another 64-bit term "
                         "of the address does not help, this product itself wraps past 2^31 "
                         "elements on a production-size tensor; widen the index with "
                         ".to(tl.int64) before multiplying by the stride")  # fmt: skip
    return found


_INT_FIELDS = ("regs", "spill_stores", "spill_loads", "smem_static", "smem_dynamic", "dots",
               "tf32_dots_on_f32")


def _count(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 2**40:
        raise ValueError(f"not a count: {value!r}"[:200])
    return value


def _counts(value: Any) -> dict[str, int]:
    if type(value) is not dict or len(value) > 256:
        raise ValueError("not a table of counts")
    return {str(k)[:100]: _count(v) for k, v in value.items()}


def plain_outcome(value: Any) -> dict[str, Any]:
    """One compile's outcome from the sandbox, as checked plain data: ``status`` ok with the
    numbers the rules read, or skip / error with a ``reason`` (at most 4000 characters);
    ``ValueError`` for anything else."""
    if type(value) is not dict or value.get("status") not in ("ok", "skip", "error"):
        raise ValueError("not a compile outcome")
    if value["status"] != "ok":
        return {"status": value["status"], "reason": str(value.get("reason", ""))[-4000:]}
    r = value.get("result")
    if type(r) is not dict:
        raise ValueError("an ok outcome without a result")
    result: dict[str, Any] = {name: _count(r.get(name)) for name in _INT_FIELDS}
    result["loads"], result["mma"] = _counts(r.get("loads")), _counts(r.get("mma"))
    offsets = r.get("first_offsets")
    if type(offsets) is not dict or len(offsets) > 256:
        raise ValueError("first_offsets is not a table")
    result["first_offsets"] = {}
    for arg, widths in offsets.items():
        if type(widths) is not list or not all(w in ("i32", "i64") for w in widths):
            raise ValueError("first_offsets holds something other than i32 / i64")
        result["first_offsets"][str(arg)[:100]] = sorted(set(widths))
    products = r.get("narrow_products", {})
    if type(products) is not dict or len(products) > 256:
        raise ValueError("narrow_products is not a table")
    result["narrow_products"] = {}
    for arg, terms in products.items():
        if type(terms) is not list or len(terms) > 256 or not all(
                type(t) in (list, tuple) and len(t) == 2 for t in terms):
            raise ValueError("narrow_products holds something other than (stride, where) pairs")
        result["narrow_products"][str(arg)[:100]] = [[str(a)[:100], str(b)[:200]]
                                                     for a, b in terms]
    return {"status": "ok", "result": result}


def _text(value: Any, size: int = 1000) -> str | None:
    return None if value is None else str(value)[:size]


def plain_launch(value: Any) -> dict[str, Any]:
    """One launch the sandbox recorded (which launcher, which kernel, in which dtype, whether
    the kernel is the lab's own, the compile of it), as checked plain data."""
    if type(value) is not dict:
        raise ValueError("not a recorded launch")
    dtype = value.get("dtype")
    if dtype not in ("fp32", "fp16", None):
        raise ValueError("a launch in an unknown dtype")
    out = {"launcher": _text(value.get("launcher"), 100),
           "kernel": _text(value.get("kernel"), 100), "dtype": dtype,
           "own": value.get("own") is True, "error": _text(value.get("error"))}
    if value.get("outcome") is not None:
        out["outcome"] = plain_outcome(value["outcome"])
    return out


def launch_problems(lab: str, launches: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per kernel of ``lab``: what is wrong with the compiles of what its launchers launched
    (float32: TF32 dots, offsets, shared memory; float16: it compiles, offsets), and a kernel
    that no launcher launched although every launcher returned (it computed without it)."""
    found: dict[str, list[str]] = {}
    returned = {x["launcher"] for x in launches if x["kernel"] is None and x["error"] is None}
    failed = any(x["error"] for x in launches)
    for name in kernels_of(lab):
        mine = [x for x in launches if x["kernel"] == name and x["own"]]
        for x in mine:
            if "outcome" in x:
                task = {"kernel": name, "dtype": x["dtype"], "head_dim": 0, "arch": ARCH,
                        "check": x["dtype"], "launched": True, "launcher": x["launcher"]}
                found.setdefault(name, []).extend(problems(task, x["outcome"], lab))
        if returned and not mine and not failed:
            found.setdefault(name, []).append(
                f"{name}: never launched by the lab's launchers ({', '.join(sorted(returned))}), "
                "which returned: their results were computed without this kernel")
    return found


# ---- compiling: in the lab's sandbox under the grader ---------------------------------------


def source_key(lab_dir: pathlib.Path, impl: str, tasks: list[dict[str, Any]]) -> str:
    """The hash of everything a lab's compile depends on: the graded file, the lab's other
    given files, ``common/``, the compiler, Triton's version, the tasks."""
    h = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode())
    files = [lab_dir / f"{impl}.py", *sorted(lab_dir.glob("provided*.py")),
             *sorted((ROOT / "common").glob("*.py")),
             *(ROOT / "bench" / n for n in ("gpu_compile.py", "gpu_kernels.py")),
             pathlib.Path(__file__)]
    for path in files:
        h.update(path.name.encode())
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"-")
    try:
        h.update(importlib.metadata.version("triton").encode())
    except importlib.metadata.PackageNotFoundError:
        h.update(b"no triton")
    return h.hexdigest()[:32]


def _cached(key: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    try:
        data = json.loads((CACHE_DIR / f"{key}.json").read_text(encoding="utf-8"))
        return ([plain_outcome(o) for o in data["outcomes"]],
                [plain_launch(x) for x in data["launches"]])
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None


def _store(key: str, compiled: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = CACHE_DIR / f".{key}.json.tmp"
        tmp.write_text(json.dumps({"outcomes": compiled[0], "launches": compiled[1]}),
                       encoding="utf-8")
        tmp.replace(CACHE_DIR / f"{key}.json")
    except OSError:
        pass  # a read-only checkout compiles again next time


_NOT_THE_CODE = ("the compile step", "the sandbox")


def _failed(tasks: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    return [{"status": "error", "reason": reason} for _ in tasks]


Compiled = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (outcomes, launches)


def _request(lab_dir: pathlib.Path, labs_root: pathlib.Path, impl: str,
             tasks: list[dict[str, Any]]) -> bytes:
    return json.dumps({"labs_root": str(labs_root), "lab": lab_dir.name, "impl": impl,
                       "arch": ARCH,
                       "tasks": [{k: t[k] for k in ("entry", "dtype", "head_dim", "arch")}
                                 for t in tasks]}).encode()  # fmt: skip


def parse_reply(out: bytes, code: int | None, log: str, tasks: list[dict[str, Any]]
                ) -> Compiled:
    """The compiler's reply (at most ``PROGRAM_REPLY_LIMIT`` bytes of JSON) as checked plain
    data; every task an error saying why when it is not a valid reply."""
    try:
        reply = json.loads(out)
        outcomes = [plain_outcome(o) for o in reply["outcomes"]]
        launches = [plain_launch(x) for x in reply["launches"][:256]]
        if len(outcomes) != len(tasks):
            raise ValueError("one outcome per task expected")
    except (ValueError, TypeError, KeyError, RecursionError):
        what = (f"did not finish within {COMPILE_LIMIT:g} s" if code is None
                else f"exited with code {code} without a valid reply")
        return _failed(tasks, f"the compile step {what}: {log[-1500:]}"), []
    return outcomes, launches


def sandboxed_outcomes(lab_dir: pathlib.Path, impl: str, tasks: list[dict[str, Any]]
                       ) -> Compiled:
    """``tasks`` compiled in ``lab_dir``'s sandbox (:mod:`grading.sandbox.compiler`)."""
    from grading.plugin.sandboxes import sandbox_for
    from grading.sandbox.host import SandboxError

    try:
        box = sandbox_for(lab_dir, impl)
    except (SandboxError, OSError) as exc:
        return _failed(tasks, f"the sandbox did not start: {exc}"), []
    code, out, log = box.run_program(["-m", "grading.sandbox.compiler"],
                                     _request(lab_dir, box.scratch / "labs", impl, tasks),
                                     time.monotonic() + COMPILE_LIMIT,
                                     env={"TRITON_INTERPRET": "0"})
    return parse_reply(out, code, log, tasks)


def local_outcomes(lab_dir: pathlib.Path, impl: str, tasks: list[dict[str, Any]]
                   ) -> Compiled:
    """``tasks`` compiled by the same program as this machine's user (a plain pytest run)."""
    import os
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run([sys.executable, "-m", "grading.sandbox.compiler"], cwd=ROOT,
                              input=_request(lab_dir, lab_dir.parent, impl, tasks),
                              capture_output=True, env=env, timeout=COMPILE_LIMIT, check=False)
    except subprocess.TimeoutExpired:
        return parse_reply(b"", None, "", tasks)
    log = proc.stderr.decode("utf-8", "replace")
    return parse_reply(proc.stdout[:PROGRAM_REPLY_LIMIT], proc.returncode, log, tasks)


def sandboxed() -> bool:
    from grading.plugin.sandboxes import active

    return active()


@functools.cache
def outcomes_of(lab_dir: pathlib.Path, impl: str
                ) -> tuple[list[dict], list[dict], list[dict], float]:
    """``(tasks, outcomes, launches, seconds)`` of ``lab_dir``'s compile: cached by
    :func:`source_key` (on disk) and per process."""
    tasks = lab_tasks(lab_dir.name)
    if not tasks:
        return tasks, [], [], 0.0
    key = source_key(lab_dir, impl, tasks)
    hit = _cached(key)
    if hit is not None and len(hit[0]) == len(tasks):
        return tasks, hit[0], hit[1], 0.0
    start = time.monotonic()
    run = sandboxed_outcomes if sandboxed() else local_outcomes
    outcomes, launches = run(lab_dir, impl, tasks)
    if not any(o["status"] == "error" and o["reason"].startswith(_NOT_THE_CODE)
               for o in outcomes):  # the step itself failed: try again next time
        _store(key, (outcomes, launches))
    return tasks, outcomes, launches, time.monotonic() - start


def check_kernels(lab: str, impl: str, labs_root: str = str(LABS)) -> dict[str, list[str]]:
    """Every kernel of ``lab`` compiled at once; the problems per kernel name."""
    tasks, outcomes, launches, _ = outcomes_of(pathlib.Path(labs_root).resolve() / lab, impl)
    found: dict[str, list[str]] = {}
    for task, outcome in zip(tasks, outcomes):
        name = task["kernel"]
        if outcome["status"] != "ok" and found.get(name):
            continue  # a kernel that does not compile is reported once
        found.setdefault(name, []).extend(problems(task, outcome, lab))
    for name, texts in launch_problems(lab, launches).items():
        if not any(NOT_WRITTEN in t for t in found.get(name, [])):
            found.setdefault(name, []).extend(texts)
    return {name: list(dict.fromkeys(f)) for name, f in found.items()}


def precompile(items: list[Any], impl: str) -> None:
    """Compile the lab of every collected ``gpu_compile`` test now, before the first test
    runs (outside every per-test clock). The points plugin's log gets ``compile_start`` (a
    ``time.monotonic()``) and ``compile`` (its seconds): the runner adds that time to the
    lab's limit, up to :data:`COMPILE_LIMIT`."""
    from grading.plugin.points import emit_event

    labs = sorted({item.path.parent.resolve() for item in items
                   if item.get_closest_marker("gpu_compile") is not None})
    for lab_dir in labs:
        if not lab_tasks(lab_dir.name):
            continue
        emit_event("compile_start", lab=lab_dir.name, at=time.monotonic())
        seconds = outcomes_of(lab_dir, impl)[-1]
        emit_event("compile", lab=lab_dir.name, seconds=round(seconds, 2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grading.plugin.compile_check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lab", help="lab number, e.g. 05 (default: every lab with a kernel)")
    p.add_argument("--impl", choices=("starter", "solution"), default=None,
                   help="default: LAB_IMPL (starter)")  # fmt: skip
    args = p.parse_args(argv)
    from common.loader import lab_impl

    impl = args.impl or lab_impl()
    labs = sorted({e.lab for e in _entries()
                   if args.lab is None or e.lab.split("-")[1] == args.lab.zfill(2)})
    status = 0
    for lab in labs:
        print(f">> {lab} ({impl}.py): its kernels compiled for sm_{ARCH} on the CPU",
              file=sys.stderr)
        found = [t for texts in check_kernels(lab, impl).values() for t in texts]
        print(f"   {'ok' if not found else f'{len(found)} problem(s)'}", file=sys.stderr)
        for text in found:
            print(f"   {text}", file=sys.stderr)
        status = status or (1 if found else 0)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
