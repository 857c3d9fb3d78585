"""A 5-second sanity check of Triton on this machine (the interpreter without CUDA).

Known traps: some torch/triton/numpy mixes make the interpreter return all zeros or
garbage. If this fails, every Triton lab test would fail for reasons that are not yours:
reinstall the pinned versions with `make clean test`.
"""

from __future__ import annotations

import math

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


# ---- the interpreter instruments of common.testing (kernel_memory, assert_no_races) ------


@triton.jit
def _rows_kernel(x_ptr, out_ptr, n_rows, ROWS: tl.constexpr, STORE_PADDING: tl.constexpr):
    """Program p copies rows [p * (ROWS - 1), p * (ROWS - 1) + ROWS - 1) of a [n_rows, 16]
    tensor: its tile has one padding row, which belongs to the next program."""
    start = tl.program_id(0) * (ROWS - 1)
    r = tl.arange(0, ROWS)
    rows = start + r
    cols = tl.arange(0, 16)
    own = (r < ROWS - 1) & (rows < n_rows)
    x = tl.load(x_ptr + rows[:, None] * 16 + cols[None, :], mask=own[:, None], other=0.0)
    keep = (rows < n_rows) if STORE_PADDING else own
    tl.store(out_ptr + rows[:, None] * 16 + cols[None, :], x, mask=keep[:, None])


def _copy_rows(x: torch.Tensor, store_padding: bool) -> torch.Tensor:
    out = torch.zeros_like(x)
    _rows_kernel[(triton.cdiv(x.shape[0], 15),)](x, out, x.shape[0], ROWS=16,
                                                  STORE_PADDING=store_padding)
    return out


def test_kernel_memory_counts_loads_and_the_race_check_names_both_programs():
    from common.testing import assert_no_races, kernel_memory
    from common.triton_env import on_interpreter

    if not on_interpreter():
        pytest.skip("the instruments watch Triton's interpreter")
    x = torch.randn(40, 16)
    out, reports = kernel_memory(_copy_rows, x, False)
    assert torch.equal(out, x)
    assert [r["kernel"] for r in reports] == ["_rows_kernel"]
    assert reports[0]["loads"] == {"x_ptr": 40 * 16}, reports[0]["loads"]
    assert_no_races(reports)
    out, reports = kernel_memory(_copy_rows, x, True)
    assert torch.equal(out, x), "the interpreter runs programs in order: right numbers"
    both = r"programs \(0, 0, 0\) and \(1, 0, 0\) .* both store out_ptr\[15, 0\]"
    with pytest.raises(AssertionError, match=both):
        assert_no_races(reports)


@triton.jit
def _load_rows_kernel(x_ptr, out_ptr, n_rows, stride, ROWS: tl.constexpr, MASKED: tl.constexpr):
    """One program copies rows [0, n_rows) of a [n_rows, 16] view through a ROWS-row tile;
    ``MASKED=False`` loads the padding rows past n_rows too (and stores only the real ones)."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, 16)
    ptrs = x_ptr + rows[:, None] * stride + cols[None, :]
    if MASKED:
        x = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    else:
        x = tl.load(ptrs)
    tl.store(out_ptr + rows[:, None] * 16 + cols[None, :], x, mask=(rows < n_rows)[:, None])


def test_kernel_memory_names_a_load_outside_the_view_even_when_it_is_never_stored():
    from common.testing import assert_loads_in_bounds, kernel_memory, strided_view
    from common.triton_env import on_interpreter

    if not on_interpreter():
        pytest.skip("the instruments watch Triton's interpreter")

    def copy(x: torch.Tensor, masked: bool) -> torch.Tensor:
        out = torch.zeros(x.shape[0], 16)
        _load_rows_kernel[(1,)](x, out, x.shape[0], x.stride(0), ROWS=16, MASKED=masked)
        return out

    x = strided_view(torch.randn(10, 16), "sliced")  # NaN between and around the rows
    base = torch.randn(40, 16)
    for data in (x, base[:10]):  # inside the storage (NaN margin) and past a view's rows
        out, reports = kernel_memory(copy, data, True)
        assert torch.equal(out, data)
        assert_loads_in_bounds(reports)
        out, reports = kernel_memory(copy, data, False)
        assert torch.equal(out, data), "the padding rows are never stored: right numbers"
        with pytest.raises(AssertionError, match=r"program \(0, 0, 0\) of _load_rows_kernel "
                           r"loads x_ptr\[10, 0\].*test_triton_interpreter.py:\d+: "
                           r"x = tl.load\(ptrs\)"):
            assert_loads_in_bounds(reports)
    tiny = torch.randn(10, 16)  # rows past the end of the tensor's own memory
    _, reports = kernel_memory(copy, tiny, False)
    with pytest.raises(AssertionError, match=r"loads x_ptr\[10, 0\], (past the end of its "
                       r"memory|outside the view it was given)"):  # what lies past it varies
        assert_loads_in_bounds(reports)


def test_the_shared_tile_and_exp2_helpers():
    from common.triton_env import LOG2E, dot_tile, log2e_scale

    assert [dot_tile(n) for n in (1, 8, 16, 24, 80, 128)] == [16, 16, 16, 32, 128, 128], (
        "dot_tile pads to a power of two AND to at least 16: a tl.dot operand needs every "
        "dimension >= 16 on a GPU")
    s = 0.125
    assert math.isclose(log2e_scale(s), s * LOG2E) and math.isclose(
        2.0 ** (3.0 * log2e_scale(s)), math.exp(3.0 * s)), (
        "log2e_scale must fold log2(e) into the softmax scale: exp2(x * scale * log2 e) = "
        "exp(x * scale)")
