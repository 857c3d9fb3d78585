"""A lab's graded kernels (``LAB_IMPL``: starter or solution) compiled for sm_90 on the CPU.

    python -m bench.student_compile --lab 05            # LAB_IMPL's file (default starter)
    python -m bench.student_compile --lab 05 --impl solution
    python -m bench.student_compile --grade [--lab 05]  # make grade: the grader, then this

The interpreter runs a kernel as Python: it accepts code no GPU compiler does (a plain
Python global read inside ``@triton.jit``), ignores ``input_precision`` and never wraps a
32-bit offset. So each kernel of the lab's ``bench/gpu_kernels.py`` entries is compiled with
Triton's bundled ptxas for sm_90 (cached in ``build/gpu-report/``: seconds when nothing
changed) at the lab's GPU tiles, and the compiled code is checked:

* it compiles (else the compiler's message) and reads global memory (an empty ``pass``
  body compiles too: it earns nothing);
* bf16 at the bench head dim: no spills, a tensor-core MMA for the ``tl.dot`` s;
* float32 inputs: no ``tl.dot`` rounds them to TF32 (the Triton IR of the float32 compile
  has no ``inputPrecision = tf32`` on a dot of f32 tensors);
* 64-bit offsets: in the Triton IR, every ``tt.addptr`` chain that starts at a pointer
  argument which can address more than 2^31 elements in production (a KV cache, a dense
  ``[B, H, L, d]`` tensor, lab 03's varlen ``[T, H, d]`` tensors: ``BIG``) adds at least one
  ``i64`` offset, and each ``index * stride`` product on it is computed in ``i64``
  (``bench.gpu_compile.narrow_products``): one widened term does not save ``row *
  stride_qm`` computed in 32 bits, which wraps past 2^31 (a 1M-token cache at 8 KV heads x
  128 dims already holds 2^30). Exempt: a tile's reach (``tl.arange(0, BLOCK) * stride``)
  and the head stride of a KV cache or a varlen ``[T, H, d]`` tensor (a head times ``d``).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

from bench.gpu_compile import Task, run_tasks
from bench.gpu_kernels import GPU_KERNELS
from common.loader import lab_impl

ARCH = 90
LABS = pathlib.Path(__file__).resolve().parent.parent / "labs"
# Pointers that address more than 2^31 elements at production sizes: KV caches, dense
# [B, H, L, d] tensors (labs 00, 05), lab 03's varlen [T, H, d] queries and outputs (a
# 1M-token batch x 32 heads x 128 dims); a decode step's [B, H, d] q / out stay far below.
BIG = re.compile(r"cache|^(Q|K|V|O|DO|DQ|DK|DV|Out)$")
BIG_IN_LAB = {"lab-03-causal-prefill-attention": re.compile(r"^(q_ptr|out_ptr)$")}
# In a KV cache [blocks, block_size, kv_heads, d] and a varlen [T, H, d] tensor the head
# stride is d: head * stride stays below 2^16 elements, so that one product may stay 32-bit.
# A dense [B, H, L, d] tensor's head stride is L * d: there it may not.
HEAD_STRIDE = re.compile(r"^stride_[a-z]*?_?h(ead)?$")
DENSE = re.compile(r"^(Q|K|V|O|DO|DQ|DK|DV|Out)$")
# The primer's puzzles index tensors of at most 2^24 elements (bench/gpu_kernels.py):
# 32-bit offsets are right there, so its kernels are not held to the 64-bit rule.
SMALL_TENSOR_LABS = {"lab-09-triton-primer"}


def lab_tasks(
    lab: str, impl: str, kernel: str | None = None, labs_root: str = str(LABS)
) -> list[tuple[Task, str]]:
    """``(task, check)`` pairs: per kernel of ``lab`` (its first entry), a bf16 compile at the
    bench head dim (``check="bf16"``) and a float32 one at the smallest (``"fp32"``)."""
    seen: set[str] = set()
    out = []
    for index, entry in enumerate(GPU_KERNELS):
        if entry.lab != lab or entry.kernel in seen or (kernel and entry.kernel != kernel):
            continue
        seen.add(entry.kernel)
        dtype = "bf16" if "bf16" in entry.dtypes else entry.dtypes[0]
        out.append((Task(index, dtype, entry.summary_dims, ARCH, impl, labs_root), "bf16"))
        out.append((Task(index, "fp32", min(entry.head_dims), ARCH, impl, labs_root), "fp32"))
    return out


def kernels_of(lab: str) -> list[str]:
    """The ``@triton.jit`` kernels of ``lab`` that the report compiles, in table order."""
    return list(dict.fromkeys(e.kernel for e in GPU_KERNELS if e.lab == lab))


def problems(task: Task, check: str, outcome: dict) -> list[str]:
    """What is wrong with one compile, in words (empty: nothing)."""
    name = GPU_KERNELS[task.entry].kernel
    if outcome["status"] != "ok":
        return [f"{name} ({task.dtype}, d={task.head_dim}) does not compile for sm_{ARCH}: "
                f"{outcome['reason'][-1500:]}"]  # fmt: skip
    r, found = outcome["result"], []
    if not any((r.get("loads") or {}).values()):
        return [f"{name}: the compiled kernel reads no global memory: it is not written yet"]
    if check == "fp32" and r.get("tf32_dots_on_f32"):
        found.append(f"{name}: {r['tf32_dots_on_f32']} tl.dot on float32 inputs round them to "
                     "TF32 on a GPU (the interpreter computes in full float32): pass "
                     "input_precision=DOT_PRECISION (\"ieee\" for float32)")  # fmt: skip
    if check == "bf16":
        spilled = r["spill_stores"] + r["spill_loads"]
        if spilled:
            found.append(f"{name}: spills {spilled} B at the lab's GPU tiles "
                         f"({r['regs']} registers per thread)")  # fmt: skip
        if r["dots"] and not r["mma"]:
            found.append(f"{name}: {r['dots']} tl.dot but no tensor-core MMA in the SASS")
    lab = GPU_KERNELS[task.entry].lab
    lab_big = BIG_IN_LAB.get(lab)
    offsets = {} if lab in SMALL_TENSOR_LABS else (r.get("first_offsets") or {})
    narrow = [arg for arg, widths in offsets.items()
              if (BIG.search(arg) or (lab_big and lab_big.search(arg)))
              and widths == ["i32"]]  # fmt: skip
    if narrow:
        found.append(f"{name}: 32-bit offsets into {', '.join(narrow)}: index * stride wraps "
                     "past 2^31 elements on a production-size tensor; widen the large index "
                     "with .to(tl.int64) before multiplying by its stride")  # fmt: skip
    products = {} if lab in SMALL_TENSOR_LABS else (r.get("narrow_products") or {})
    for arg, terms in products.items():
        if arg in narrow or not (BIG.search(arg) or (lab_big and lab_big.search(arg))):
            continue
        terms = [t for t in terms if DENSE.match(arg) or not HEAD_STRIDE.match(t[0])]
        if terms:
            said = ", ".join(f"index * {stride} ({where})" for stride, where in terms)
            found.append(f"{name}: {said} into {arg} computed in 32 bits: another 64-bit term "
                         "of the address does not help, this product itself wraps past 2^31 "
                         "elements on a production-size tensor; widen the index with "
                         ".to(tl.int64) before multiplying by the stride")  # fmt: skip
    return found


def check_kernels(lab: str, impl: str, labs_root: str = str(LABS)) -> dict[str, list[str]]:
    """Every kernel of ``lab`` compiled in ONE pool of workers (a spawned worker costs seconds
    of imports, so a test per kernel asks this once per lab); the problems per kernel name."""
    pairs = lab_tasks(lab, impl, None, labs_root)
    outcomes = run_tasks([t for t, _ in pairs], workers=2)
    found: dict[str, list[str]] = {}
    for (task, check), outcome in zip(pairs, outcomes):
        name = GPU_KERNELS[task.entry].kernel
        if outcome["status"] != "ok" and any("compile" in f for f in found.get(name, [])):
            continue  # a kernel that does not compile is reported once
        found.setdefault(name, []).extend(problems(task, check, outcome))
    return {name: list(dict.fromkeys(f)) for name, f in found.items()}


def check_lab(
    lab: str, impl: str, kernel: str | None = None, labs_root: str = str(LABS)
) -> list[str]:
    """Compile ``lab``'s kernels (all, or ``kernel``) under ``labs_root`` (a scratch copy's
    folder too) for sm_90; the problems found."""
    pairs = lab_tasks(lab, impl, kernel, labs_root)
    outcomes = run_tasks([t for t, _ in pairs], workers=2)
    failed: set[int] = set()  # a kernel that does not compile is reported once
    found = []
    for (task, check), outcome in zip(pairs, outcomes):
        if task.entry in failed:
            continue
        if outcome["status"] != "ok":
            failed.add(task.entry)
        found += problems(task, check, outcome)
    return list(dict.fromkeys(found))  # the bf16 and float32 compiles may say the same


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.student_compile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--lab", help="lab number, e.g. 05 (default: every lab with a kernel)")
    p.add_argument("--impl", choices=("starter", "solution"), default=None,
                   help="default: LAB_IMPL (starter)")  # fmt: skip
    p.add_argument("--grade", action="store_true",
                   help="run the grader (python -m grading) first: make grade")
    args = p.parse_args(argv)
    status = 0
    if args.grade:
        cmd = [sys.executable, "-m", "grading", *(["--lab", args.lab] if args.lab else [])]
        status = subprocess.run(cmd, check=False).returncode
    impl = args.impl or lab_impl()
    labs = sorted({e.lab for e in GPU_KERNELS
                   if args.lab is None or e.lab.split("-")[1] == args.lab.zfill(2)})  # fmt: skip
    for lab in labs:
        print(f">> {lab} ({impl}.py): its kernels compiled for sm_{ARCH} on the CPU "
              "(cached in build/gpu-report/)", file=sys.stderr)  # fmt: skip
        found = check_lab(lab, impl)
        print(f"   {'ok' if not found else f'{len(found)} problem(s)'}", file=sys.stderr)
        for text in found:
            print(f"   {text}", file=sys.stderr)
        status = status or (1 if found else 0)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
