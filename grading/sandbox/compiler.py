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

import json
import os
import sys


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
    reply.write(json.dumps({"outcomes": outcomes}, default=str))
    reply.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
