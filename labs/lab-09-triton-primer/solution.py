"""Lab 09 solution: nine Triton puzzles, one idea each, from a masked load to online softmax.

A Triton kernel is the code of ONE program; the launch ``kernel[grid](...)`` runs one
program per grid point. A program works on a *tile*: a block of elements whose offsets are
``tl.arange(0, BLOCK)`` (a power of two), shifted by ``tl.program_id(axis) * BLOCK``. Lanes
past the data are switched off with a mask on every load and store.

Every buffer here is bigger than its data (as in a serving engine, which allocates for its
largest batch): a launcher is told the sizes (``n``, or ``m, n, k``), takes its output
buffer ``out`` as an argument, and must touch nothing outside ``[:n]`` (or ``[:m, :n]``).
Matrices may have any strides (a padded row, a column-major view). The given code (input
checks, tile sizes, the memory recorder) is in ``provided.py``.
"""

from __future__ import annotations

import torch

from common.loader import load_lab_module
from common.triton_env import cdiv, dot_precision, dot_tile, tl, triton

provided = load_lab_module(__file__, "provided")

# Kernel arguments are grouped by meaning, one group per line, so the formatter is off here.
# fmt: off

# ---------------------------------------------------------------------------------------
# 1. Load and store with a mask: one program, one block
# ---------------------------------------------------------------------------------------


@triton.jit
def _add_constant_kernel(X, Out, n, c, BLOCK: tl.constexpr):
    """One program: ``Out[i] = X[i] + c`` for ``i < n``; ``BLOCK >= n`` lanes, the rest off."""
    offs = tl.arange(0, BLOCK)  # [BLOCK] lane numbers 0 .. BLOCK-1
    mask = offs < n  # lanes past the data neither load nor store
    x = tl.load(X + offs, mask=mask)
    tl.store(Out + offs, x + c, mask=mask)


def add_constant(x: torch.Tensor, out: torch.Tensor, n: int, c: float, *,
                 block: int | None = None) -> None:
    """``out[:n] = x[:n] + c`` in ONE program of ``block >= n`` lanes. Given code.

    Args:
        x, out: contiguous 1-D buffers of at least ``n`` elements (float32 or float16).
        n: elements to process; ``out[n:]`` is never written, ``x[n:]`` never read.
        block: lanes of the program (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    n = provided.check_vector("x", x, n)
    provided.check_vector("out", out, n)
    block = provided.whole_row_block("block", block, n)
    if n:
        _add_constant_kernel[(1,)](x, out, n, float(c), BLOCK=block)


# ---------------------------------------------------------------------------------------
# 2. program_id and a 1-D grid: many programs, one block each
# ---------------------------------------------------------------------------------------


@triton.jit
def _add_vectors_kernel(X, Y, Out, n, BLOCK: tl.constexpr):
    """Program ``pid`` adds elements ``pid*BLOCK .. pid*BLOCK + BLOCK - 1`` (those ``< n``)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] this program's elements
    mask = offs < n  # only the last program has lanes past n
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(Out + offs, x + y, mask=mask)


def add_vectors(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, n: int, *,
                block: int | None = None) -> None:
    """``out[:n] = x[:n] + y[:n]`` with ``cdiv(n, block)`` programs on a 1-D grid.

    Args:
        x, y, out: contiguous 1-D buffers of at least ``n`` elements.
        n: elements to add (any n, not a multiple of ``block``).
        block: elements per program (a power of two >= 16); None = the launcher's choice.
    """
    n = provided.check_vector("x", x, n)
    provided.check_vector("y", y, n)
    provided.check_vector("out", out, n)
    block = provided.block_size("block", block, provided.default_tile("block", x))
    if n:
        _add_vectors_kernel[(cdiv(n, block),)](x, y, out, n, BLOCK=block)


# ---------------------------------------------------------------------------------------
# 3. 2-D tiles and strides: a transpose
# ---------------------------------------------------------------------------------------


@triton.jit
def _transpose_kernel(
    X, Out, m, n,
    stride_xm, stride_xn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program ``(pid_m, pid_n)`` moves the ``[BLOCK_M, BLOCK_N]`` tile of X at rows
    ``pid_m*BLOCK_M …`` and columns ``pid_n*BLOCK_N …`` to Out, transposed."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of X
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] columns of X
    mask = (rows[:, None] < m) & (cols[None, :] < n)  # [BLOCK_M, BLOCK_N]
    tile = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    # element (i, j) of X goes to row j, column i of Out
    tl.store(Out + cols[None, :] * stride_om + rows[:, None] * stride_on, tile, mask=mask)


def transpose(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
              block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:n, :m] = x[:m, :n].T`` on a 2-D grid of ``[block_m, block_n]`` tiles.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides: padded rows, column-major).
        out: a 2-D buffer of at least ``n x m`` (any strides).
        block_m, block_n: tile rows / columns of x (powers of two >= 16); None = default.
    """
    m, n = provided.size("m", m), provided.size("n", n)
    provided.check_matrix("x", x, m, n)
    provided.check_matrix("out", out, n, m, "n", "m")
    block_m = provided.block_size("block_m", block_m, provided.default_tile("block_m", x))
    block_n = provided.block_size("block_n", block_n, provided.default_tile("block_n", x))
    if m and n:
        grid = (cdiv(m, block_m), cdiv(n, block_n))
        _transpose_kernel[grid](x, out, m, n, *x.stride(), *out.stride(),
                                BLOCK_M=block_m, BLOCK_N=block_n)


# ---------------------------------------------------------------------------------------
# 4. A row reduction: sum and max of each row
# ---------------------------------------------------------------------------------------


@triton.jit
def _row_sum_max_kernel(
    X, Sums, Maxes, n, stride_xm, stride_xn,
    BLOCK_N: tl.constexpr,
):
    """Program ``row`` reduces row ``row`` of X (``n <= BLOCK_N`` elements) to its sum and max."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n
    x = tl.load(X + row * stride_xm + cols * stride_xn, mask=mask, other=0.0)  # [BLOCK_N]
    tl.store(Sums + row, tl.sum(x, axis=0))  # the pad is 0: it adds nothing
    # for the max the pad must be -inf, not 0 (a row of negatives has a max below 0)
    tl.store(Maxes + row, tl.max(tl.where(mask, x, float("-inf")), axis=0))


def row_sum_max(x: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor, m: int, n: int, *,
                block_n: int | None = None) -> None:
    """``sums[:m] = x[:m, :n].sum(1)`` and ``maxes[:m] = x[:m, :n].max(1)``: one program
    per row, the whole row in one tile. A row of ``n = 0`` elements has sum 0, max -inf.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides).
        sums, maxes: contiguous 1-D buffers of at least ``m`` elements.
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    m, n = provided.size("m", m), provided.size("n", n)
    provided.check_matrix("x", x, m, n)
    provided.check_vector("sums", sums, m)
    provided.check_vector("maxes", maxes, m)
    block_n = provided.whole_row_block("block_n", block_n, n)
    if m:
        _row_sum_max_kernel[(m,)](x, sums, maxes, n, *x.stride(), BLOCK_N=block_n)


# ---------------------------------------------------------------------------------------
# 5. A fused row softmax: load once, reduce twice, store once
# ---------------------------------------------------------------------------------------


@triton.jit
def _softmax_rows_kernel(
    X, Out, n,
    stride_xm, stride_xn, stride_om, stride_on,
    BLOCK_N: tl.constexpr,
):
    """Program ``row`` writes ``softmax(X[row, :n])``; the row stays in registers throughout."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n
    x = tl.load(X + row * stride_xm + cols * stride_xn, mask=mask, other=float("-inf"))
    z = x - tl.max(x, axis=0)  # the max is 0: exp never overflows
    num = tl.exp(z)  # the pad: exp(-inf) = 0, outside the denominator
    den = tl.sum(num, axis=0)
    tl.store(Out + row * stride_om + cols * stride_on, num / den, mask=mask)


def softmax_rows(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
                 block_n: int | None = None) -> None:
    """``out[:m, :n] = softmax(x[:m, :n], dim=1)``, one program per row (``n >= 1``).

    Args:
        x, out: 2-D buffers of at least ``m x n`` (any strides).
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    m, n = provided.size("m", m), provided.size("n", n)
    provided.check_matrix("x", x, m, n)
    provided.check_matrix("out", out, m, n)
    block_n = provided.whole_row_block("block_n", block_n, n)
    if m and n:
        _softmax_rows_kernel[(m,)](x, out, n, *x.stride(), *out.stride(), BLOCK_N=block_n)


# ---------------------------------------------------------------------------------------
# 6. tl.dot with padding to 16: a small matrix product in one program
# ---------------------------------------------------------------------------------------

MAX_SMALL = 64  # small_matmul holds all of a, b and out in one program's tiles


@triton.jit
def _small_matmul_kernel(
    A, B, Out, m, n, k,
    stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: ``Out = A @ B`` with every dim padded to its BLOCK (>= 16) by zeros."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = tl.load(A + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                mask=(rm[:, None] < m) & (rk[None, :] < k), other=0.0)  # [BLOCK_M, BLOCK_K]
    b = tl.load(B + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                mask=(rk[:, None] < k) & (rn[None, :] < n), other=0.0)  # [BLOCK_K, BLOCK_N]
    c = tl.dot(a, b, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]; the zero pad adds 0
    tl.store(Out + rm[:, None] * stride_om + rn[None, :] * stride_on, c,
             mask=(rm[:, None] < m) & (rn[None, :] < n))


def small_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                 k: int) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` in ONE program; every dim ``<= 64``.

    Each dim is padded to ``dot_tile(dim)`` (a power of two >= 16): ``tl.dot`` needs K >= 16
    on a GPU (and the course pads M and N to 16 too); masked loads fill the pad with zeros.
    """
    m, n, k = provided.size("m", m), provided.size("n", n), provided.size("k", k)
    for name, dim in (("m", m), ("n", n), ("k", k)):
        if dim > MAX_SMALL:
            raise ValueError(f"{name}={dim}: small_matmul holds dims up to {MAX_SMALL} "
                             "(use matmul)")  # fmt: skip
    provided.check_matrix("a", a, m, k, "m", "k")
    provided.check_matrix("b", b, k, n, "k", "n")
    provided.check_matrix("out", out, m, n)
    if m and n:
        _small_matmul_kernel[(1,)](
            a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride(),
            BLOCK_M=dot_tile(m), BLOCK_N=dot_tile(n), BLOCK_K=dot_tile(max(k, 1)),
            DOT_PRECISION=dot_precision(a.dtype),
        )


# ---------------------------------------------------------------------------------------
# 7. An outer-product accumulate: a matmul as k rank-1 updates of one output tile
# ---------------------------------------------------------------------------------------


@triton.jit
def _outer_accumulate_kernel(
    A, B, Out, m, n, k,
    stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program ``(pid_m, pid_n)`` owns one output tile; it adds ``A[:, kk] ⊗ B[kk, :]`` for
    every ``kk < k`` into a float32 accumulator that never leaves the program."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kk in range(0, k):
        a_col = tl.load(A + rm * stride_am + kk * stride_ak, mask=rm < m, other=0.0)  # [BLOCK_M]
        b_row = tl.load(B + kk * stride_bk + rn * stride_bn, mask=rn < n, other=0.0)  # [BLOCK_N]
        acc += a_col[:, None] * b_row[None, :]  # [BLOCK_M, BLOCK_N]: the outer product
    tl.store(Out + rm[:, None] * stride_om + rn[None, :] * stride_on, acc,
             mask=(rm[:, None] < m) & (rn[None, :] < n))


def outer_accumulate(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                     k: int, *, block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` as ``k`` outer products per output tile.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n: output tile (powers of two >= 16); None = the launcher's choice.
    """
    m, n, k = provided.size("m", m), provided.size("n", n), provided.size("k", k)
    provided.check_matrix("a", a, m, k, "m", "k")
    provided.check_matrix("b", b, k, n, "k", "n")
    provided.check_matrix("out", out, m, n)
    block_m = provided.block_size("block_m", block_m, provided.default_tile("block_m", a))
    block_n = provided.block_size("block_n", block_n, provided.default_tile("block_n", a))
    if m and n:
        grid = (cdiv(m, block_m), cdiv(n, block_n))
        _outer_accumulate_kernel[grid](a, b, out, m, n, k, *a.stride(), *b.stride(),
                                       *out.stride(), BLOCK_M=block_m, BLOCK_N=block_n)


# ---------------------------------------------------------------------------------------
# 8. A tiled matmul: the K loop with tl.dot
# ---------------------------------------------------------------------------------------


@triton.jit
def _matmul_kernel(
    A, B, Out, m, n, k,
    stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``(pid_m, pid_n)`` owns one output tile and walks K in BLOCK_K steps: each
    step loads an A tile ``[BLOCK_M, BLOCK_K]`` and a B tile ``[BLOCK_K, BLOCK_N]`` and
    adds their product into the float32 accumulator (tl.dot's third argument)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        ks = k0 + rk  # [BLOCK_K] this step's slice of K; the last one may stick out
        a = tl.load(A + rm[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rm[:, None] < m) & (ks[None, :] < k), other=0.0)
        b = tl.load(B + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(ks[:, None] < k) & (rn[None, :] < n), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    tl.store(Out + rm[:, None] * stride_om + rn[None, :] * stride_on,
             acc.to(Out.dtype.element_ty), mask=(rm[:, None] < m) & (rn[None, :] < n))


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int, k: int, *,
           block_m: int | None = None, block_n: int | None = None,
           block_k: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]``: a 2-D grid of output tiles, a K loop each.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n, block_k: the tile (powers of two >= 16); None = the launcher's
            choice (``provided.INTERPRETER_TILES`` or ``provided.GPU_TILES``).
    """
    m, n, k = provided.size("m", m), provided.size("n", n), provided.size("k", k)
    provided.check_matrix("a", a, m, k, "m", "k")
    provided.check_matrix("b", b, k, n, "k", "n")
    provided.check_matrix("out", out, m, n)
    block_m = provided.block_size("block_m", block_m, provided.default_tile("block_m", a))
    block_n = provided.block_size("block_n", block_n, provided.default_tile("block_n", a))
    block_k = provided.block_size("block_k", block_k, provided.default_tile("block_k", a))
    if m and n:
        grid = (cdiv(m, block_m), cdiv(n, block_n))
        _matmul_kernel[grid](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride(),
                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                             DOT_PRECISION=dot_precision(a.dtype))


# ---------------------------------------------------------------------------------------
# 9. Online softmax over one row block: softmax(S) @ V in one pass over S's columns
# ---------------------------------------------------------------------------------------


@triton.jit
def _online_softmax_kernel(
    S, V, Out, Lse, m, n, dv,
    stride_sm, stride_sn, stride_vn, stride_vd, stride_om, stride_od,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DV_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``pid`` owns rows ``pid*BLOCK_M …`` of S and walks their columns BLOCK_N at a
    time, keeping per row the running max ``m_i``, denominator ``l_i`` and unnormalised
    output ``acc``: lab 00's FlashAttention loop with the scores given."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < m
    offs_d = tl.arange(0, DV_PAD)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running denominator
    acc = tl.zeros([BLOCK_M, DV_PAD], dtype=tl.float32)  # running sum of p @ v
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s = tl.load(S + rows[:, None] * stride_sm + cols[None, :] * stride_sn,
                    mask=row_ok[:, None] & (cols[None, :] < n),
                    other=float("-inf"))  # [BLOCK_M, BLOCK_N]; the pad weighs exp(-inf) = 0
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)  # re-bases l_i and acc on the new max; 0 on the first tile
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=(cols[:, None] < n) & (offs_d[None, :] < dv),
                    other=0.0)  # [BLOCK_N, DV_PAD]
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]  # one division per row, at the end
    tl.store(Out + rows[:, None] * stride_om + offs_d[None, :] * stride_od, out,
             mask=row_ok[:, None] & (offs_d[None, :] < dv))
    tl.store(Lse + rows, m_i + tl.log(l_i), mask=row_ok)


def online_softmax(s: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   m: int, n: int, dv: int, *, block_m: int | None = None,
                   block_n: int | None = None) -> None:
    """``out[:m, :dv] = softmax(s[:m, :n], dim=1) @ v[:n, :dv]`` and ``lse[:m] =
    logsumexp(s[:m, :n], dim=1)`` in one pass over the columns of s (``n >= 1``).

    Args:
        s: scores, a 2-D buffer of at least ``m x n``; v: at least ``n x dv``; out: at least
            ``m x dv`` (any strides); lse: a contiguous float32 buffer of at least ``m``.
        block_m, block_n: rows per program / columns per step (powers of two >= 16);
            None = the launcher's choice. ``dv`` is padded to ``dot_tile(dv)``.
    """
    m, n, dv = provided.size("m", m), provided.size("n", n), provided.size("dv", dv)
    if n == 0:
        raise ValueError("n=0: a softmax needs at least one column")
    provided.check_matrix("s", s, m, n)
    provided.check_matrix("v", v, n, dv, "n", "dv")
    provided.check_matrix("out", out, m, dv, "m", "dv")
    provided.check_vector("lse", lse, m)
    block_m = provided.block_size("block_m", block_m, provided.default_tile("block_m", s))
    block_n = provided.block_size("block_n", block_n, provided.default_tile("block_n", s))
    if m and dv:
        _online_softmax_kernel[(cdiv(m, block_m),)](
            s, v, out, lse, m, n, dv, *s.stride(), *v.stride(), *out.stride(),
            BLOCK_M=block_m, BLOCK_N=block_n, DV_PAD=dot_tile(dv),
            DOT_PRECISION=dot_precision(s.dtype),
        )


# fmt: on
