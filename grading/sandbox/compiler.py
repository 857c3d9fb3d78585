"""Inside the sandbox: a lab's kernels compiled for a GPU, as plain data.

    python -m grading.sandbox.compiler        # forked into a lab's sandbox ("program" op)

Started by the trusted side (:mod:`grading.plugin.compile_check`) through the lab's zygote,
which forks a child, puts it in the sandbox (the sandbox uid, its lab's own ``/tmp``, no
new privileges) and ``exec`` s a fresh interpreter with ``TRITON_INTERPRET=0``: compiling
needs Triton imported with the interpreter off, and the zygote imported it with it on.

The request is one JSON object on standard input: ``{"labs_root", "impl", "tasks": [{"entry",
"dtype", "head_dim", "arch"}, ...]}`` (entries of ``bench.gpu_kernels.GPU_KERNELS``). This
process imports the submitted file (``bench.gpu_compile.load_lab``), compiles each task with
Triton's bundled ptxas and writes one JSON object to the standard output it was started
with: ``{"outcomes": [...]}``, one per task, as ``bench.gpu_compile.run_task`` returns them
(``status``, ``reason`` or ``result``: registers, spills, shared memory, MMA kinds, ...).
Everything the graded code prints goes to the log (standard error), never into the reply.

The trusted side checks the reply's shape and sizes and judges it
(:mod:`grading.plugin.compile_check`); it never imports what this process imported. The
reply is only as honest as the code that ran here: graded code that forges it gains at most
the compile points, never anything outside the sandbox.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from typing import Any

# The primer (lab-09) has no bench workload: its launchers' sample calls, at tiny sizes.
PRIMER_CALLS = {
    "add_vectors": lambda t: (t(40), t(40), t(40), 40),
    "softmax_rows": lambda t: (t(8, 24), t(8, 24), 8, 24),
    "matmul": lambda t: (t(24, 20), t(20, 24), t(24, 24), 24, 24, 20),
    "online_softmax": lambda t: (t(20, 24), t(24, 16), t(20, 16), t(20, dtype="fp32"), 20, 24,
                                 16),
}
DTYPES = {"fp32": "float32", "fp16": "float16"}
TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "i32",
                 "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1",
                 "float64": "fp64"}


def _plain_arg(value: Any) -> Any:
    """A launch argument as the GPU report's ``Launch`` holds it (``Ptr`` for a tensor)."""
    from bench.gpu_kernels import Ptr

    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return Ptr(TRITON_DTYPES.get(str(value.dtype).removeprefix("torch."), "fp32"))
    if type(value).__name__ == "constexpr":
        return value.value
    return value


def sample_calls(lab: Any, lab_name: str, dtype: str) -> list[tuple[str, Any]]:
    """``(launcher, zero-argument call)`` pairs for ``lab``'s launchers at tiny sizes."""
    import torch

    torch_dtype = getattr(torch, DTYPES[dtype])
    calls: list[tuple[str, Any]] = []
    if lab_name == "lab-09-triton-primer":
        def tensor(*shape: int, dtype: str | None = None) -> Any:
            return torch.randn(*shape).to(getattr(torch, DTYPES[dtype]) if dtype
                                          else torch_dtype)

        for name, args in PRIMER_CALLS.items():
            fn = getattr(lab.solution, name, None)
            if fn is not None:
                calls.append((name, lambda fn=fn, args=args: fn(*args(tensor))))
        return calls
    from bench.kernels import KERNELS

    for spec in KERNELS:
        fn = getattr(lab.solution, spec.func, None) if spec.lab == lab_name else None
        if fn is not None and spec.tiny:
            def call(spec: Any = spec, fn: Any = fn) -> Any:
                work = spec.workload(spec.tiny[0], torch_dtype, "cpu")
                return work.call(fn, **spec.tiny_kwargs)

            calls.append((spec.func, call))
    return calls


def record_launches(labs_root: str, lab_name: str, impl: str) -> list[dict[str, Any]]:
    """What the lab's launchers launch, in float32 and float16 (where they accept it): each
    ``kernel[grid](...)`` is recorded (the kernel, its file, every argument, the options) and
    not run (no GPU here), so the compile sees the student's own constexprs and precision."""
    import pathlib

    from triton.runtime.jit import JITFunction

    from bench.gpu_compile import load_lab

    lab = load_lab(pathlib.Path(labs_root), lab_name, impl)
    lab_file = str((pathlib.Path(labs_root) / lab_name / f"{impl}.py").resolve())
    found: list[dict[str, Any]] = []
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        names = list(self.arg_names)
        bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
        for p in self.params[len(args):]:
            if p.name not in bound and p.default is not inspect.Parameter.empty:
                bound[p.name] = p.default
        options = {k: int(kwargs[k]) for k in ("num_warps", "num_stages") if k in kwargs}
        file = str(pathlib.Path(self.fn.__code__.co_filename).resolve())
        found.append({"kernel": self.__name__, "file": file, "own": file == lab_file,
                      "launcher": current[0], "dtype": current[1], "options": options,
                      "args": {n: _plain_arg(v) for n, v in bound.items()}, "fn": self})

    current = ["", ""]
    JITFunction.run = run
    try:
        for dtype in DTYPES:
            for name, call in sample_calls(lab, lab_name, dtype):
                current[:] = [name, dtype]
                try:
                    call()
                    error = None  # it returned: a record with no kernel says so
                except Exception as exc:  # noqa: BLE001 - a launcher that refuses a dtype
                    error = f"{type(exc).__name__}: {exc}"[:1000]
                found.append({"launcher": name, "dtype": dtype, "kernel": None, "error": error})
    finally:
        JITFunction.run = original
    return found


def compile_launch(launch: dict[str, Any], arch: int) -> dict[str, Any]:
    """One recorded launch compiled for ``sm_<arch>``: an outcome as ``run_task`` gives."""
    from bench.gpu_compile import compile_kernel, specialize, summarize
    from bench.gpu_kernels import Launch

    fn = launch["fn"]
    try:
        spec = specialize(fn, Launch(launch["args"], launch["options"]))
        kernel, log = compile_kernel(fn, spec, arch)
        result, _ = summarize(kernel, log, arch)
    except Exception as exc:  # noqa: BLE001 - a compile error is the outcome
        return {"status": "error", "reason": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
    return {"status": "ok", "result": result}


def main() -> int:
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the graded code's prints go to the log, not into the reply
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.read(1 << 20) or "{}")
    os.environ["TRITON_INTERPRET"] = "0"
    from bench.gpu_compile import Task, run_task

    outcomes = []
    for t in request.get("tasks", []):
        task = Task(int(t["entry"]), str(t["dtype"]), int(t["head_dim"]), int(t["arch"]),
                    str(request["impl"]), str(request["labs_root"]), cache_dir=None)
        try:
            outcomes.append(run_task(task))
        except BaseException as exc:  # noqa: BLE001 - one task's failure is its outcome
            outcomes.append({"status": "error", "reason": f"{type(exc).__name__}: {exc}"[-2000:]})
    launches = []
    if request.get("lab"):
        try:
            recorded = record_launches(str(request["labs_root"]), str(request["lab"]),
                                       str(request["impl"]))
        except Exception as exc:  # noqa: BLE001 - no launch recorded: the trusted side says so
            recorded = [{"launcher": None, "kernel": None, "dtype": None,
                         "error": f"{type(exc).__name__}: {exc}"[:1000]}]
        seen: set[tuple[str, str]] = set()
        for launch in recorded:
            entry = {k: launch.get(k) for k in ("launcher", "kernel", "dtype", "own", "error")}
            key = (launch.get("kernel"), launch.get("dtype"))
            if launch.get("fn") is not None and launch.get("own") and key not in seen:
                seen.add(key)  # a kernel launched twice in one dtype is compiled once
                entry["outcome"] = compile_launch(launch, int(request.get("arch", 90)))
            launches.append(entry)
    reply.write(json.dumps({"outcomes": outcomes, "launches": launches}, default=str))
    reply.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
