"""A 5-second sanity check of Triton on this machine (the interpreter without CUDA).

Known traps: some torch/triton/numpy mixes make the interpreter return all zeros or
garbage. If this fails, every Triton lab test would fail for reasons that are not yours:
reinstall the pinned versions with `make clean test`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.reference import reference_softmax
from common.triton_env import DEVICE, tl, triton

pytestmark = pytest.mark.triton


@triton.jit
def _dot_softmax_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    rows = tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * N + rows[None, :])
    b = tl.load(b_ptr + rows[:, None] * N + rows[None, :])
    s = tl.dot(a, b)  # fp32 accumulation
    s = s - tl.max(s, axis=1)[:, None]
    p = tl.exp(s)
    p = p / tl.sum(p, axis=1)[:, None]
    tl.store(out_ptr + rows[:, None] * N + rows[None, :], p)


def test_triton_computes_a_dot_and_a_softmax_correctly_on_this_machine():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen).to(DEVICE)
    b = torch.randn(16, 16, generator=gen).to(DEVICE)
    out = torch.zeros(16, 16, device=DEVICE)
    _dot_softmax_kernel[(1,)](a, b, out, N=16)
    got = out.cpu().double().numpy()
    assert np.abs(got).sum() > 0, (
        "Triton returned all zeros: this torch/triton/numpy mix is broken on this machine "
        f"(torch {torch.__version__}, triton {triton.__version__}, numpy {np.__version__}). "
        "Reinstall the pinned versions: make clean test"
    )
    s = (a.cpu().double() @ b.cpu().double()).numpy()
    want = np.stack([reference_softmax(row) for row in s])
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg="Triton returned garbage")
