"""Benchmark harness for the labs' Triton attention kernels (``make bench``).

``python -m bench`` times each lab kernel with ``triton.testing.do_bench`` next to PyTorch
SDPA (every backend that runs) and plain torch, against the device's measured copy and
GEMM roofs, and writes a JSON record and a roofline plot. Without CUDA it runs the same
code on tiny shapes through the Triton interpreter and says the numbers are not timings.
Kernels are listed in ``bench/kernels.py`` (one entry each).
"""

import os

from common.device import configure_triton

# The environment this process was given, before configure_triton() decides for it: the
# commands bench.grade_time times run in it, as from the user's shell (where a test run
# without TRITON_INTERPRET imports torch to look for a GPU).
GIVEN_ENV = dict(os.environ)
configure_triton()  # TRITON_INTERPRET=1 before anything imports triton, where there is no GPU

SCHEMA = "attention-labs-bench/1"

__all__ = ["SCHEMA"]
