"""Benchmark harness for the labs' Triton attention kernels (``make bench``).

``python -m bench`` times each lab kernel with ``triton.testing.do_bench`` next to PyTorch
SDPA (every backend that runs) and plain torch, against the device's measured copy and
GEMM roofs, and writes a JSON record and a roofline plot. Without CUDA it runs the same
code on tiny shapes through the Triton interpreter and says the numbers are not timings.
Kernels are listed in ``bench/kernels.py`` (one entry each).
"""

from common.device import configure_triton

configure_triton()  # TRITON_INTERPRET=1 before anything imports triton, where there is no GPU

SCHEMA = "attention-labs-bench/1"

__all__ = ["SCHEMA"]
