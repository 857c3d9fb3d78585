"""The device's roofs, measured by ``make bench`` in the same run as the kernels, plus the
datasheet figures.

* Copy bandwidth: ``dst.copy_(src)`` on a tensor far larger than L2 (1 GiB by default),
  counted as 2x its bytes (one read, one write). Expected on an H100 SXM: about 3.0 TB/s
  against the 3.35 TB/s of the datasheet (a practical figure reported for H100 SXM hosts,
  not yet measured by this project: no GPU output is captured in ``captured_outputs/``).
* GEMM throughput: ``torch.matmul`` of two bf16 8192x8192 matrices (cuBLAS), counted as
  ``2*n^3`` FLOPs. Expected: about 800 TFLOP/s on an H100 SXM against the 989 dense bf16
  of the datasheet (same caveat).

"% meas" in the table is relative to these two numbers; "% nom" to the datasheet figures
below, where the GPU is one we know (never guessed for an unknown name).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.timing import Timer

# name fragment (lower case, checked in order) -> (HBM TB/s, dense bf16 TFLOP/s, label).
# Figures from NVIDIA's H100, H200, A100 and L40S datasheets (dense, i.e. without sparsity).
NOMINAL: tuple[tuple[str, float, float, str], ...] = (
    ("h100 pcie", 2.0, 756.0, "H100 PCIe"),
    ("h100 nvl", 3.9, 835.0, "H100 NVL"),
    ("h100", 3.35, 989.0, "H100 SXM5"),
    ("h200", 4.8, 989.0, "H200 SXM"),
    ("a100-sxm4-80gb", 2.039, 312.0, "A100 SXM4 80GB"),
    ("a100 80gb pcie", 1.935, 312.0, "A100 PCIe 80GB"),
    ("a100", 1.555, 312.0, "A100 40GB"),
    ("l40s", 0.864, 362.0, "L40S"),
)


@dataclass(frozen=True)
class Roofs:
    copy_GBps: float
    gemm_TFLOPs: float
    copy_bytes: int  # bytes moved per copy (2x the tensor)
    gemm_n: int
    gemm_dtype: str
    nominal_GBps: float | None
    nominal_TFLOPs: float | None
    nominal_label: str | None
    real: bool  # False under the interpreter: CPU numbers, not a GPU roof

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def nominal_for(gpu_name: str) -> tuple[float, float, str] | tuple[None, None, None]:
    """Datasheet (GB/s, TFLOP/s, label) for a GPU name, or Nones for one we do not know."""
    name = gpu_name.lower()
    if "gh200" in name:  # 96 GB HBM3 (4.0 TB/s) and 144 GB HBM3e (4.9 TB/s) share the name
        return None, None, None
    for fragment, tbps, tflops, label in NOMINAL:
        if fragment in name:
            return tbps * 1000.0, tflops, label
    return None, None, None


def measure(device: str, timer: Timer, quick: bool = False) -> Roofs:
    """Measure copy bandwidth and GEMM throughput on ``device`` with ``timer``."""
    import torch

    cuda = device.startswith("cuda")
    copy_elems = (2**29 if not quick else 2**27) if cuda else 2**23  # bf16 1 GiB / fp32 32 MiB
    dtype = torch.bfloat16 if cuda else torch.float32
    src = torch.randn(copy_elems, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    copy_bytes = 2 * src.numel() * src.element_size()
    copy_ms = timer(lambda: dst.copy_(src)).ms
    src = dst = None  # free before the GEMM

    n = (8192 if not quick else 4096) if cuda else 256
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    c = torch.empty(n, n, dtype=dtype, device=device)
    gemm_ms = timer(lambda: torch.matmul(a, b, out=c)).ms
    a = b = c = None
    if cuda:
        torch.cuda.empty_cache()
        nom_bw, nom_flops, label = nominal_for(torch.cuda.get_device_name(0))
    else:
        nom_bw, nom_flops, label = None, None, None
    return Roofs(
        copy_GBps=copy_bytes / copy_ms / 1e6,
        gemm_TFLOPs=2 * n**3 / gemm_ms / 1e9,
        copy_bytes=copy_bytes,
        gemm_n=n,
        gemm_dtype=str(dtype).removeprefix("torch."),
        nominal_GBps=nom_bw,
        nominal_TFLOPs=nom_flops,
        nominal_label=label,
        real=timer.real,
    )
