"""Lab 09 spec: nine Triton puzzles, graded through the interpreter.

Run:  LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-09-triton-primer -q

Every buffer a test passes is bigger than its data. Inputs: the elements around the data
are NaN (a load without its mask, or with a wrong stride, reads NaN and the output shows it).
Outputs: the whole buffer starts as a sentinel; afterwards the data region must hold the
answer and every other element must still be the sentinel (a store without its mask is
caught). Sizes are odd (not multiples of the block), blocks vary, matrices come row-major
and column-major. Expected values: plain float64 (numpy/torch) on the same data.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import load_impl
from common.reference import to_float64
from common.testing import (
    ACC_IN_FP16,
    LSE_WITHOUT_MAX,
    P_NOT_CAST,
    assert_close,
    assert_loads_in_bounds,
    called_on_copies,
    cancelling,
    examples,
    host_syncs,
    kernel_memory,
    raised_as,
    sm90_compile_test,
    tolerance,
)
from common.triton_env import dot_tile

# every call gets copies of its arrays: expected values come from the test's own
# the outputs a launcher writes (by position and keyword) are passed as they are
WRITES = {
    "add_constant": (1, "out"), "add_vectors": (2, "out"), "transpose": (1, "out"),
    "row_sum_max": (1, 2, "sums", "maxes"), "softmax_rows": (1, "out"),
    "small_matmul": (2, "out"), "outer_accumulate": (2, "out"), "matmul": (2, "out"),
    "online_softmax": (2, 3, "out", "lse"),
}  # fmt: skip
impl = called_on_copies(load_impl(__file__), writes=WRITES)

pytestmark = [
    pytest.mark.triton,
    # rows past m in the last row block: exp(-inf - (-inf)) in lanes that are never stored
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

SENTINEL = -7777.0
# Margin around every buffer: wider than any tile of these tests sticks out past its data, so
# a missing mask reads NaN or writes into the margin (never past the allocation).
PAD = 32
ATOL, RTOL = tolerance("float32")

STORE_OUTSIDE = (
    "a store landed outside the output region: every tl.store needs the mask of the lanes "
    "that hold data (offs < n, rows < m and cols < n in 2-D)"
)
NAN_READ = (
    "NaN reached the output: the kernel read the NaN around the data. A load without its "
    "mask, a mask on the wrong axis, or a wrong stride: buffers here are padded, so the "
    "row stride is x.stride(0) (not n) and a column-major buffer has x.stride(0) == 1"
)
GRID_FLOOR = (
    "the elements of the last, partial block were never written: the grid must have "
    "cdiv(n, block) programs, not n // block"
)
NO_PID_OFFSET = (
    "only the first block was written: program pid must start at pid * BLOCK "
    "(offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK))"
)
UNWRITTEN = (
    "some elements of the output were never written: too few programs on an axis of the "
    "grid (cdiv(size, block)), or offsets that do not cover the tile"
)
MAX_OTHER_ZERO = (
    "the masked max padded its lanes with 0 (tl.load's other= or no tl.where): on a row of "
    "negative numbers 0 wins. Pad a max with -inf"
)
SOFTMAX_PAD_ZERO = (
    "the padded lanes were loaded as 0, not -inf: exp(0 - max) joined the denominator. "
    "Load the row with other=float('-inf')"
)
NO_MAX_SUBTRACTED = (
    "NaN or inf: exp overflowed (exp(89) is inf in float32). Subtract the row max before "
    "exponentiating"
)
DOT_TILE = (
    "tl.dot tile smaller than 16: the GPU needs K >= 16 (the course pads M, N and K to "
    "dot_tile(dim), 16 at least) and masked loads fill the pad with zeros"
)
DOT_PAD_NAN = (
    "NaN reached the output: the pad of a tl.dot tile must be zeros. Mask the loads of A "
    "and B on K too (rk < k) with other=0.0"
)
K_TAIL = (
    "the last, partial K tile was skipped: loop k0 over range(0, k, BLOCK_K) and mask "
    "k0 + rk < k"
)
ACC_OVERWRITTEN = (
    "only the last K step survived: acc = tl.dot(a, b) overwrites the accumulator; "
    "accumulate with acc = tl.dot(a, b, acc)"
)
FIRST_K_SKIPPED = "the k loop missed k = 0: range(0, k) visits every column of a"
NO_RESCALE_ACC = "the accumulator was not rescaled (acc * alpha) when the running max grew"
NO_RESCALE_L = "the denominator l was not rescaled (l * alpha) when the running max grew"
M_STARTS_AT_ZERO = (
    "NaN: every score is near -200 and exp of it underflows to 0 in float32. Start the "
    "running max at -inf (tl.full([BLOCK_M], float('-inf'), tl.float32)), not 0"
)


# ---- buffers: NaN around inputs, a sentinel around outputs ------------------------------------


def _buffer(rows: int, cols: int, fill: float, layout: str, pad=(PAD, PAD)):
    import torch

    from common.triton_env import DEVICE

    shape = (rows + pad[0], cols + pad[1])
    if layout == "col":  # column-major: stride(0) == 1
        return torch.full(shape[::-1], fill, dtype=torch.float32, device=DEVICE).T
    return torch.full(shape, fill, dtype=torch.float32, device=DEVICE)


def poisoned(data: np.ndarray, layout: str = "row"):
    """A float32 buffer holding ``data`` in its top-left corner and NaN everywhere else."""
    import torch

    if data.ndim == 1:
        buf = _buffer(1, data.shape[0], float("nan"), "row", pad=(0, 2 * PAD))[0].contiguous()
        buf[: data.shape[0]] = torch.from_numpy(data).float()
        return buf
    buf = _buffer(*data.shape, float("nan"), layout)
    buf[: data.shape[0], : data.shape[1]] = torch.from_numpy(data).float()
    return buf


def sentinel(rows: int, cols: int | None = None, layout: str = "row"):
    """An output buffer bigger than ``rows x cols`` (or ``rows``), all sentinel."""
    if cols is None:
        return _buffer(1, rows, SENTINEL, "row", pad=(0, 2 * PAD))[0].contiguous()
    return _buffer(rows, cols, SENTINEL, layout)


def check_region(buf, want, what: str, wrong_answers=None, nan_hint: str = NAN_READ,
                 unwritten_hint=None, atol=ATOL, rtol=RTOL):  # fmt: skip
    """The data region of ``buf`` equals ``want``; the rest of ``buf`` is still the sentinel."""
    __tracebackhide__ = True
    got = to_float64(buf)
    want = np.asarray(want, dtype=np.float64)
    region = tuple(slice(0, s) for s in want.shape)
    outside = got.copy()
    outside[region] = SENTINEL
    stray = np.argwhere(~(outside == SENTINEL))
    if stray.size:
        raise AssertionError(
            f"{what}: {len(stray)} elements outside the {want.shape} region changed (first "
            f"at index {tuple(int(i) for i in stray[0])} of the {got.shape} buffer): "
            f"{STORE_OUTSIDE}"
        )
    inside = got[region]
    never = np.argwhere((inside == SENTINEL) & (want != SENTINEL))
    if never.size:
        first = tuple(int(i) for i in never[0])
        hint = unwritten_hint(first) if unwritten_hint else UNWRITTEN
        raise AssertionError(
            f"{what}: {len(never)} of {inside.size} elements never written (first at "
            f"{first}): {hint}"
        )
    assert_close(inside, want, what=what, atol=atol, rtol=rtol, wrong_answers=wrong_answers,
                 nan_hint=nan_hint)  # fmt: skip


def rand(seed: int, *shape: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    """float32-representable random data (the kernels see exactly these values)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32).astype(np.float64)


def run_or_name(what: str, fn, *args, **kwargs) -> None:
    """Call ``fn``; an exception about tl.dot's shape is reported as the misconception."""
    __tracebackhide__ = True
    try:
        fn(*args, **kwargs)
    except Exception as e:
        if "K >= 16" in str(e) or "should have M >=" in str(e):
            raise AssertionError(f"{what}: {DOT_TILE} (triton said: {e})") from None
        raise


# ---- 1. load and store with a mask (the launcher is given) ------------------------------------


@pytest.mark.points(0.5)
@pytest.mark.parametrize("n, block", [(1, None), (13, None), (16, None), (37, None), (37, 64),
                                      (5, 32)])  # fmt: skip
def test_1_add_constant_touches_exactly_the_first_n_elements(n, block):
    x = rand(n, n)
    out = sentinel(n)
    impl.add_constant(poisoned(x), out, n, 2.5, block=block)
    check_region(out, x + 2.5, f"add_constant n={n} block={block}")


@pytest.mark.points(0)  # given code
def test_1_add_constant_refuses_a_block_smaller_than_n():
    x = poisoned(rand(0, 40))
    with pytest.raises(ValueError, match=r"\bblock\b"):
        impl.add_constant(x, sentinel(40), 40, 1.0, block=16)


# ---- 2. program_id and a 1-D grid --------------------------------------------------------------


@pytest.mark.points(0.5)
@pytest.mark.parametrize("n, block", [(1, 16), (16, 16), (37, 16), (100, 32), (70, None),
                                      (33, 64)])  # fmt: skip
def test_2_add_vectors_over_a_grid_of_cdiv_n_block_programs(n, block):
    x, y = rand(1, n), rand(2, n)
    out = sentinel(n)
    impl.add_vectors(poisoned(x), poisoned(y), out, n, block=block)
    b = block or 16

    def why(first):
        if first[0] == (n // b) * b and n % b:
            return GRID_FLOOR
        return NO_PID_OFFSET if first[0] == b else UNWRITTEN

    check_region(out, x + y, f"add_vectors n={n} block={block}", unwritten_hint=why)


@pytest.mark.points(1)
@examples(15)
@given(n=st.integers(1, 130), block=st.sampled_from([16, 32, 64]), seed=st.integers(0, 99))
def test_2_add_vectors_for_any_n_and_block(n, block, seed):
    x, y = rand(seed, n), rand(seed + 1, n)
    out = sentinel(n)
    impl.add_vectors(poisoned(x), poisoned(y), out, n, block=block)
    check_region(out, x + y, f"add_vectors n={n} block={block}")


# ---- 3. 2-D tiles and strides: transpose -------------------------------------------------------

TRANSPOSE_CASES = [  # m, n, block_m, block_n, layout of x, layout of out
    (21, 35, 16, 16, "row", "row"),
    (21, 35, 16, 32, "col", "row"),
    (37, 5, 32, 16, "row", "col"),
    (16, 16, None, None, "col", "col"),
]


@pytest.mark.points(1)
@pytest.mark.parametrize("m, n, block_m, block_n, x_layout, out_layout", TRANSPOSE_CASES)
def test_3_transpose_moves_2d_tiles_through_any_strides(m, n, block_m, block_n, x_layout,
                                                        out_layout):  # fmt: skip
    x = rand(3, m, n)
    out = sentinel(n, m, out_layout)
    impl.transpose(poisoned(x, x_layout), out, m, n, block_m=block_m, block_n=block_n)
    check_region(out, x.T, f"transpose m={m} n={n} tiles {block_m}x{block_n} x {x_layout}-major "
                 f"out {out_layout}-major")  # fmt: skip


@pytest.mark.points(1)
@examples(8)
@given(m=st.integers(1, 40), n=st.integers(1, 40), block_m=st.sampled_from([16, 32]),
       block_n=st.sampled_from([16, 32]), x_layout=st.sampled_from(["row", "col"]),
       out_layout=st.sampled_from(["row", "col"]))  # fmt: skip
def test_3_transpose_for_any_shape_tile_and_layout(m, n, block_m, block_n, x_layout,
                                                   out_layout):  # fmt: skip
    x = rand(m * n, m, n)
    out = sentinel(n, m, out_layout)
    impl.transpose(poisoned(x, x_layout), out, m, n, block_m=block_m, block_n=block_n)
    check_region(out, x.T, f"transpose m={m} n={n} tiles {block_m}x{block_n} x {x_layout}-major "
                 f"out {out_layout}-major")  # fmt: skip


# ---- 4. a row reduction ------------------------------------------------------------------------

ROW_CASES = [  # m, n, block_n, layout, shift (negative rows: the max is below 0)
    (5, 13, None, "row", -10.0),
    (7, 37, 64, "col", -10.0),
    (3, 16, None, "row", 0.0),
    (4, 0, None, "row", 0.0),
]


@pytest.mark.points(1)
@pytest.mark.parametrize("m, n, block_n, layout, shift", ROW_CASES)
def test_4_row_sum_and_max_pad_with_the_identity_of_each_reduction(m, n, block_n, layout,
                                                                   shift):  # fmt: skip
    x = rand(4, m, n, shift=shift)
    sums, maxes = sentinel(m), sentinel(m)
    impl.row_sum_max(poisoned(x, layout), sums, maxes, m, n, block_n=block_n)
    what = f"m={m} n={n} block_n={block_n} {layout}-major"
    check_region(sums, x.sum(axis=1), f"sums ({what})")
    want_max = x.max(axis=1, initial=-np.inf)
    padded = n < (block_n or dot_tile(max(n, 1)))
    wrong = {MAX_OTHER_ZERO: np.maximum(want_max, 0.0)} if padded else {}
    check_region(maxes, want_max, f"maxes ({what})", wrong_answers=wrong)


# ---- 5. a fused row softmax --------------------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


SOFTMAX_CASES = [(6, 13, None, "row"), (5, 37, 64, "col"), (3, 16, None, "row"),
                 (4, 1, 32, "row")]  # fmt: skip


@pytest.mark.points(1)
@pytest.mark.parametrize("m, n, block_n, layout", SOFTMAX_CASES)
def test_5_softmax_rows_pads_with_minus_inf(m, n, block_n, layout):
    x = rand(5, m, n, scale=2.0)
    out = sentinel(m, n, layout)
    impl.softmax_rows(poisoned(x, layout), out, m, n, block_n=block_n)
    block = block_n or dot_tile(n)
    padded = np.concatenate([x, np.zeros((m, block - n))], axis=1)
    check_region(out, softmax(x), f"softmax_rows m={m} n={n} block_n={block_n} {layout}-major",
                 wrong_answers={SOFTMAX_PAD_ZERO: softmax(padded)[:, :n]})  # fmt: skip


@pytest.mark.points(1)
def test_5_softmax_rows_does_not_overflow_on_large_scores():
    x = rand(6, 4, 21, scale=30.0, shift=200.0)  # exp(200) is inf in float32
    out = sentinel(4, 21)
    impl.softmax_rows(poisoned(x), out, 4, 21)
    check_region(out, softmax(x), "softmax_rows of scores near 200", nan_hint=NO_MAX_SUBTRACTED)


# ---- 6. tl.dot with padding to 16 ------------------------------------------------------------

SMALL_CASES = [(5, 3, 7, "row"), (16, 16, 16, "col"), (17, 9, 33, "row"), (1, 1, 1, "col")]


@pytest.mark.points(1)
@pytest.mark.parametrize("m, n, k, layout", SMALL_CASES)
def test_6_small_matmul_pads_every_dim_to_a_dot_tile(m, n, k, layout):
    a, b = rand(7, m, k), rand(8, k, n)
    out = sentinel(m, n, layout)
    what = f"small_matmul m={m} n={n} k={k} {layout}-major"
    run_or_name(what, impl.small_matmul, poisoned(a, layout), poisoned(b, layout), out, m, n, k)
    check_region(out, a @ b, what, nan_hint=DOT_PAD_NAN)


# ---- 7. outer-product accumulate ---------------------------------------------------------------

OUTER_CASES = [(37, 29, 23, 16, 32, "row"), (20, 20, 7, 16, 16, "col"), (5, 40, 1, 32, 16, "row")]


@pytest.mark.points(1)
@pytest.mark.parametrize("m, n, k, block_m, block_n, layout", OUTER_CASES)
def test_7_outer_accumulate_adds_k_rank_one_updates(m, n, k, block_m, block_n, layout):
    a, b = rand(9, m, k), rand(10, k, n)
    out = sentinel(m, n, layout)
    impl.outer_accumulate(poisoned(a, layout), poisoned(b), out, m, n, k, block_m=block_m,
                          block_n=block_n)  # fmt: skip
    check_region(out, a @ b, f"outer_accumulate m={m} n={n} k={k} tiles {block_m}x{block_n}",
                 wrong_answers={FIRST_K_SKIPPED: a[:, 1:] @ b[1:]})  # fmt: skip


# ---- 8. tiled matmul ---------------------------------------------------------------------------

MATMUL_CASES = [  # m, n, k, block_m, block_n, block_k, layout
    (37, 29, 45, 16, 16, 16, "row"),
    (20, 33, 50, 32, 16, 32, "col"),
    (40, 24, 17, 16, 32, 16, "row"),
    (16, 16, 16, None, None, None, "col"),
]


@pytest.mark.points(1.5)
@pytest.mark.parametrize("m, n, k, block_m, block_n, block_k, layout", MATMUL_CASES)
def test_8_matmul_walks_k_in_tiles_into_one_accumulator(m, n, k, block_m, block_n, block_k,
                                                        layout):  # fmt: skip
    a, b = rand(11, m, k), rand(12, k, n)
    out = sentinel(m, n, layout)
    what = f"matmul m={m} n={n} k={k} tiles {block_m}x{block_n}x{block_k} {layout}-major"
    run_or_name(what, impl.matmul, poisoned(a, layout), poisoned(b), out, m, n, k,
                block_m=block_m, block_n=block_n, block_k=block_k)
    bk = block_k or 16
    full = (k // bk) * bk
    last = full if full < k else k - bk
    wrong = {ACC_OVERWRITTEN: a[:, last:] @ b[last:]}
    if full < k:
        wrong[K_TAIL] = a[:, :full] @ b[:full]
    check_region(out, a @ b, what, wrong_answers=wrong, nan_hint=DOT_PAD_NAN,
                 atol=1e-4, rtol=1e-4)  # fmt: skip


# ---- 9. online softmax over one row block ------------------------------------------------------


def online_wrong(s: np.ndarray, v: np.ndarray, block_n: int) -> tuple[dict, dict]:
    """(wrong outs, wrong lses) of the classic mistakes of the online loop."""
    m = s.shape[0]

    def run(rescale_acc: bool, rescale_l: bool):
        mx, l, acc = np.full(m, -np.inf), np.zeros(m), np.zeros((m, v.shape[1]))
        for c0 in range(0, s.shape[1], block_n):
            t = s[:, c0 : c0 + block_n]
            m_new = np.maximum(mx, t.max(axis=1))
            alpha = np.exp(mx - m_new)
            p = np.exp(t - m_new[:, None])
            l = (alpha if rescale_l else 1.0) * l + p.sum(axis=1)
            acc = (alpha[:, None] if rescale_acc else 1.0) * acc + p @ v[c0 : c0 + block_n]
            mx = m_new
        return acc / l[:, None], mx + np.log(l)

    lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    no_acc, _ = run(False, True)
    no_l, no_l_lse = run(True, False)
    outs = {NO_RESCALE_ACC: no_acc, NO_RESCALE_L: no_l}
    lses = {LSE_WITHOUT_MAX: lse - s.max(1), NO_RESCALE_L: no_l_lse}
    return outs, lses


ONLINE_CASES = [  # m, n, dv, block_m, block_n, layout
    (20, 37, 12, 16, 16, "row"),
    (33, 50, 16, 32, 16, "col"),
    (16, 16, 16, None, None, "row"),
    (5, 70, 20, 16, 32, "col"),
]


def check_online(s, v, block_m, block_n, layout, what, nan_hint=NAN_READ):
    __tracebackhide__ = True
    m, n = s.shape
    dv = v.shape[1]
    out, lse = sentinel(m, dv, layout), sentinel(m)
    impl.online_softmax(poisoned(s, layout), poisoned(v, layout), out, lse, m, n, dv,
                        block_m=block_m, block_n=block_n)  # fmt: skip
    outs, lses = online_wrong(s, v, block_n or 16)
    want_lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    check_region(out, softmax(s) @ v, f"out ({what})", wrong_answers=outs, nan_hint=nan_hint,
                 atol=1e-4, rtol=1e-4)  # fmt: skip
    check_region(lse, want_lse, f"lse ({what})", wrong_answers=lses, nan_hint=nan_hint,
                 atol=1e-4, rtol=1e-4)  # fmt: skip


@pytest.mark.points(1.5)
@pytest.mark.parametrize("m, n, dv, block_m, block_n, layout", ONLINE_CASES)
def test_9_online_softmax_streams_the_columns_once(m, n, dv, block_m, block_n, layout):
    # columns get larger from tile to tile, so the running max grows at every step
    s = rand(13, m, n, scale=2.0) + np.linspace(0.0, 6.0, n)[None, :]
    v = rand(14, n, dv)
    check_online(s, v, block_m, block_n, layout,
                 f"m={m} n={n} dv={dv} tiles {block_m}x{block_n} {layout}-major")  # fmt: skip


@pytest.mark.points(1)
def test_9_online_softmax_with_every_score_far_below_zero():
    s = rand(15, 18, 40, scale=3.0, shift=-200.0)  # exp(-200) underflows to 0 in float32
    check_online(s, rand(16, 40, 16), 16, 16, "row", "scores near -200", M_STARTS_AT_ZERO)




# ---- degenerate sizes: nothing to do is not an error; an empty sum is 0 -----------------------


def degenerate_cases() -> dict:
    """``{case: (launcher, inputs, outputs as (buffer, expected region), sizes)}``."""
    x, a = poisoned(rand(60, 8)), poisoned(rand(61, 8, 8))
    # (no add_constant n=0: its launcher is given, so an empty call grades nothing of yours)
    return {
        "add_vectors n=0": ("add_vectors", (x, x), [(sentinel(8), np.zeros(0))], (0,)),
        "transpose m=0": ("transpose", (a,), [(sentinel(8, 8), np.zeros((5, 0)))], (0, 5)),
        "row_sum_max m=0": ("row_sum_max", (a,), [(sentinel(8), np.zeros(0)),
                                                  (sentinel(8), np.zeros(0))], (0, 5)),
        "softmax_rows n=0": ("softmax_rows", (a,), [(sentinel(8, 8), np.zeros((3, 0)))],
                             (3, 0)),
        "small_matmul k=0": ("small_matmul", (a, a), [(sentinel(8, 8), np.zeros((3, 5)))],
                             (3, 5, 0)),
        "outer_accumulate k=0": ("outer_accumulate", (a, a),
                                 [(sentinel(8, 8), np.zeros((3, 5)))], (3, 5, 0)),
        "matmul k=0": ("matmul", (a, a), [(sentinel(8, 8), np.zeros((3, 5)))], (3, 5, 0)),
        "matmul m=0": ("matmul", (a, a), [(sentinel(8, 8), np.zeros((0, 5)))], (0, 5, 3)),
        "online_softmax m=0": ("online_softmax", (a, a), [(sentinel(8, 8), np.zeros((0, 4))),
                                                          (sentinel(8), np.zeros(0))],
                               (0, 3, 4)),
    }


@pytest.mark.points(0.5)
@pytest.mark.parametrize("case", list(degenerate_cases()))
def test_degenerate_sizes_do_nothing_or_give_the_empty_sum(case):
    """A zero size is a valid call: no element outside the (empty) region changes, no
    error; a product over k = 0 is the empty sum, zeros (the accumulator is stored)."""
    name, inputs, outputs, sizes = degenerate_cases()[case]
    getattr(impl, name)(*inputs, *(buf for buf, _ in outputs), *sizes)
    for i, (buf, want) in enumerate(outputs):
        check_region(buf, want, f"{case}: output {i}", unwritten_hint=lambda _: (
            "k = 0: a @ b over no columns is the empty sum, 0 (the launcher must still run "
            "the kernel when m and n are non-zero: the accumulator starts at 0 and is stored)"))

# ---- every load inside the data: what is loaded and never stored counts too --------------------


def data_view(data: np.ndarray, layout: str = "row", dtype=None):
    """``poisoned(data, layout)`` cut to exactly the data (``[:m, :n]`` or ``[:n]``): the view
    a launcher gets is the region its contract names, so a load outside it is a stray load."""
    import torch

    buf = poisoned(data, layout)
    if dtype is not None:
        buf = buf.to(dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype))
    return buf[: data.shape[0]] if data.ndim == 1 else buf[: data.shape[0], : data.shape[1]]


def out_view(rows: int, cols: int | None = None, layout: str = "row", dtype=None):
    """An output buffer (``sentinel``) cut to exactly ``rows x cols`` (or ``rows``)."""
    import torch

    buf = sentinel(rows, cols, layout)
    if dtype is not None:
        buf = buf.to(getattr(torch, dtype))
    return buf[:rows] if cols is None else buf[:rows, :cols]


def load_cases() -> dict:
    """``{puzzle: (launcher, args, kwargs)}`` on exact-size views, sizes past a tile."""
    x13, x37 = rand(40, 13), rand(41, 37)
    a, b = rand(42, 20, 37), rand(43, 37, 18)
    return {
        "1-add_constant": ("add_constant", (data_view(x13), out_view(13), 13, 2.0), {}),
        "2-add_vectors": ("add_vectors", (data_view(x37), data_view(x37), out_view(37), 37),
                          {"block": 16}),
        "3-transpose": ("transpose", (data_view(rand(44, 20, 13), "col"), out_view(13, 20),
                                      20, 13), {"block_m": 16, "block_n": 16}),
        "4-row_sum_max": ("row_sum_max", (data_view(rand(45, 20, 13)), out_view(20),
                                          out_view(20), 20, 13), {"block_n": 16}),
        "5-softmax_rows": ("softmax_rows", (data_view(rand(46, 20, 13)), out_view(20, 13),
                                            20, 13), {"block_n": 16}),
        "6-small_matmul": ("small_matmul", (data_view(rand(47, 5, 7)), data_view(rand(48, 7, 9)),
                                            out_view(5, 9), 5, 9, 7), {}),
        "7-outer_accumulate": ("outer_accumulate", (data_view(a[:, :5]), data_view(b[:5]),
                                                    out_view(20, 18), 20, 18, 5),
                               {"block_m": 16, "block_n": 16}),
        "8-matmul": ("matmul", (data_view(a, "col"), data_view(b), out_view(20, 18), 20, 18, 37),
                     {"block_m": 16, "block_n": 16, "block_k": 16}),
        "9-online_softmax": ("online_softmax", (data_view(a), data_view(b[:, :12], "col"),
                                                out_view(20, 12), out_view(20), 20, 37, 12),
                             {"block_m": 16, "block_n": 16}),
    }


@pytest.mark.points(0.5)
@pytest.mark.parametrize("puzzle", list(load_cases()))
def test_every_puzzle_loads_only_the_data_region(puzzle):
    """Each launcher gets views of exactly its data: a load of a padded row or column (past
    m, n or k) is named, even when the kernel never stores what it computed from it."""
    from common.triton_env import on_interpreter

    if not on_interpreter():
        pytest.skip("counts what the kernel loads through Triton's interpreter (CPU only)")
    name, args, kwargs = load_cases()[puzzle]
    _, reports = kernel_memory(getattr(impl, name), *args, **kwargs)
    assert reports, f"{name} launched no kernel"
    assert_loads_in_bounds(reports, f"puzzle {puzzle}")


# ---- float16: the launchers accept it; accumulate in float32 -----------------------------------

F16_ATOL, F16_RTOL = tolerance("float16")


@pytest.mark.points(0.5)
def test_2_add_vectors_in_float16():
    x, y = (rand(s, 37).astype(np.float16).astype(np.float64) for s in (50, 51))
    out = out_view(37, dtype="float16")
    impl.add_vectors(data_view(x, dtype="float16"), data_view(y, dtype="float16"), out, 37,
                     block=16)
    assert_close(out, x + y, what="float16 x + y", atol=F16_ATOL, rtol=F16_RTOL)


@pytest.mark.points(1)
def test_8_matmul_in_float16_accumulates_in_float32():
    a = np.ones((16, 64)) + rand(52, 16, 64, scale=0.01).astype(np.float16)
    a = a.astype(np.float16).astype(np.float64)
    b = cancelling(rand(53, 64, 16, scale=0.1))  # K rows 0..31 at +30, 32..63 at -30
    out = out_view(16, 16, dtype="float16")
    impl.matmul(data_view(a, dtype="float16"), data_view(b, dtype="float16"), out, 16, 16, 64,
                block_m=16, block_n=16, block_k=16)
    assert_close(out, a @ b, what="float16 a @ b", atol=F16_ATOL, rtol=F16_RTOL,
                 hint=ACC_IN_FP16)


@pytest.mark.points(1)
def test_9_online_softmax_in_float16_accumulates_in_float32():
    s = (rand(54, 16, 64, scale=0.5)).astype(np.float16).astype(np.float64)
    v = cancelling(rand(55, 64, 16, scale=0.1))
    out, lse = out_view(16, 16, dtype="float16"), out_view(16)
    with raised_as(P_NOT_CAST, when="must be same dtype"):
        impl.online_softmax(data_view(s, dtype="float16"), data_view(v, dtype="float16"), out,
                            lse, 16, 64, 16, block_m=16, block_n=16)
    want_lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    assert_close(out, softmax(s) @ v, what="float16 out", atol=F16_ATOL, rtol=F16_RTOL,
                 hint=ACC_IN_FP16)
    assert_close(lse, want_lse, what="float16 lse", atol=F16_ATOL, rtol=F16_RTOL)

# ---- launchers: input checks and no host synchronisation ---------------------------------------


@pytest.mark.points(1)
def test_launchers_reject_bad_input_naming_the_argument():
    a = poisoned(rand(0, 20, 20))
    with pytest.raises(ValueError, match=r"\bout\b"):
        impl.matmul(a, a, sentinel(8, 8), 45, 45, 45)  # a is 52 x 52, out 40 x 40
    with pytest.raises(ValueError, match=r"\bblock_m\b"):
        impl.matmul(a, a, sentinel(20, 20), 20, 20, 20, block_m=24)
    with pytest.raises(ValueError, match=r"\bblock_k\b"):
        impl.matmul(a, a, sentinel(20, 20), 20, 20, 20, block_k=8)
    with pytest.raises(ValueError, match=r"\bx\b"):
        impl.transpose(a, sentinel(60, 60), 60, 20)  # x has 52 rows
    with pytest.raises(ValueError, match=r"\bblock_n\b"):
        impl.softmax_rows(a, sentinel(20, 20), 20, 20, block_n=16)  # 20 columns > 16 lanes
    with pytest.raises(ValueError, match=r"\bn\b"):
        impl.online_softmax(a, a, sentinel(20, 20), sentinel(20), 20, 0, 20)  # no column


@pytest.mark.points(0.5)
def test_launchers_make_no_host_synchronisation():
    """Measured by common.testing.host_syncs inside the process that runs the code (under
    the grader, the sandboxed worker): a teaching check, since a submission that undoes
    its patching of torch.Tensor is not caught (README: not defended)."""
    a = poisoned(rand(1, 20, 20))
    out, lse = sentinel(20, 20), sentinel(20)
    for name, fn, args in (("matmul", impl.matmul, (a, a, out, 20, 20, 20)),
                           ("online_softmax", impl.online_softmax,
                            (a, a, out, lse, 20, 20, 20))):  # fmt: skip
        _, syncs = host_syncs(fn, *args)
        assert not syncs, (
            f"{name} copied device values to the host: {syncs}. Sizes and strides are known "
            "on the host without reading a tensor."
        )


# ---- compiled for an H100 on the CPU: what the interpreter cannot see (grading's compile_check)
test_kernel_compiles_for_sm_90_with_ieee_dots_and_no_spills = sm90_compile_test(
    __file__)  # None where the compile check is absent: nothing to collect
