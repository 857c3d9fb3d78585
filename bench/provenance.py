"""Where a number came from: commit, date, GPU, driver, CUDA, torch, triton.

Used by the JSON record of ``python -m bench`` and by ``tools/capture.sh``, which puts
the same facts as a header on top of every file in ``captured_outputs/``::

    python -m bench.provenance --header --command "make bench"   # '# key: value' lines
    python -m bench.provenance --require-cuda                     # exit 3 without a GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The header keys, in order. tools/capture.sh and captured_outputs/README.md name the same.
HEADER_KEYS = ("command", "date", "gpu", "driver", "cuda", "torch", "triton", "commit")


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str:
    """``HEAD``'s hash, with ``+dirty`` when the work tree has uncommitted changes."""
    head = _run(["git", "rev-parse", "HEAD"])
    if head is None:
        return "unknown (not a git checkout)"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + ("+dirty" if dirty else "")


def nvidia_smi(field: str) -> str | None:
    """One ``nvidia-smi --query-gpu`` field of GPU 0 (None where nvidia-smi is missing)."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def collect(command: str | None = None) -> dict[str, Any]:
    """Everything a reader needs to trust (or distrust) a measurement."""
    info: dict[str, Any] = {
        "command": command if command is not None else " ".join([sys.executable, *sys.argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda or "none (CPU build of torch)"
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = torch.cuda.get_device_name(0)
            info["compute_capability"] = f"{props.major}.{props.minor}"
            info["sm_count"] = props.multi_processor_count
            info["gpu_memory_GiB"] = round(props.total_memory / 2**30, 1)
            info["cudnn"] = torch.backends.cudnn.version()
        else:
            info["gpu"] = "none (CPU only)"
    except ImportError:
        info["torch"] = info["cuda"] = "not installed"
        info["gpu"] = "unknown"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    info["driver"] = nvidia_smi("driver_version") or "none (no nvidia-smi)"
    clocks = nvidia_smi("clocks.sm,clocks.mem,power.limit")
    if clocks:
        info["clocks_sm_mem_power"] = clocks
    return info


def header(info: dict[str, Any]) -> str:
    """The provenance header: one ``# key: value`` line per ``HEADER_KEYS`` entry."""
    return "\n".join(f"# {key}: {info.get(key, 'unknown')}" for key in HEADER_KEYS) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.provenance", description=__doc__)
    parser.add_argument("--command", help="the command the header describes")
    parser.add_argument("--header", action="store_true", help="print '# key: value' lines")
    parser.add_argument(
        "--require-cuda", action="store_true", help="exit 3 unless torch sees a CUDA device"
    )
    args = parser.parse_args(argv)
    info = collect(args.command)
    if args.require_cuda and info.get("gpu", "").startswith(("none", "unknown")):
        print(f"no CUDA device: gpu = {info.get('gpu')}", file=sys.stderr)
        return 3
    print(header(info) if args.header else json.dumps(info, indent=2), end="")
    if not args.header:
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
