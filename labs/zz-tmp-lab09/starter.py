"""Lab 09: nine Triton puzzles, one idea each, from a masked load to online softmax.

A Triton kernel is the code of ONE program; the launch ``kernel[grid](...)`` runs one
program per grid point. A program works on a *tile*: a block of elements whose offsets are
``tl.arange(0, BLOCK)`` (a power of two), shifted by ``tl.program_id(axis) * BLOCK``. Lanes
past the data are switched off with a mask on every load and store.

Every buffer here is bigger than its data (as in a serving engine, which allocates for its
largest batch): a launcher is told the sizes (``n``, or ``m, n, k``), takes its output
buffer ``out`` as an argument, and must touch nothing outside ``[:n]`` (or ``[:m, :n]``).
Matrices may have any strides (a padded row, a column-major view). The given code (input
checks, tile sizes, the memory recorder) is in ``provided.py``.

Your work: every kernel (its steps are comments in its body) and every launcher except
``add_constant`` (given, complete: read it first). Then run

    LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-09-triton-primer -q
    make grade LAB=09                                 (the same, with a score table)
"""

from __future__ import annotations

import torch

from common.loader import load_lab_module
from common.triton_env import cdiv, dot_precision, dot_tile, tl, triton  # noqa: F401 (the TODOs)

provided = load_lab_module(__file__, "provided")

# Kernel arguments are grouped by meaning, one group per line, so the formatter is off here.
# fmt: off

# ---------------------------------------------------------------------------------------
# 1. Load and store with a mask: one program, one block
# ---------------------------------------------------------------------------------------


@triton.jit
def _add_constant_kernel(X, Out, n, c, BLOCK: tl.constexpr):
    """One program: ``Out[i] = X[i] + c`` for ``i < n``; ``BLOCK >= n`` lanes, the rest off."""
    # TODO, step by step:
    #   1. offs = tl.arange(0, BLOCK): the lane numbers 0 .. BLOCK-1
    #   2. mask = offs < n: lanes past the data must neither load nor store
    #   3. x = tl.load(X + offs, mask=mask); tl.store(Out + offs, x + c, mask=mask)
    tl.static_assert(False, "TODO: write _add_constant_kernel (steps above)")


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
    # TODO, step by step:
    #   1. pid = tl.program_id(0): which block this program owns
    #   2. offs = pid * BLOCK + tl.arange(0, BLOCK); mask = offs < n
    #   3. load x and y with the mask, store x + y with the mask
    tl.static_assert(False, "TODO: write _add_vectors_kernel (steps above)")


def add_vectors(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, n: int, *,
                block: int | None = None) -> None:
    """``out[:n] = x[:n] + y[:n]`` with ``cdiv(n, block)`` programs on a 1-D grid.

    Args:
        x, y, out: contiguous 1-D buffers of at least ``n`` elements.
        n: elements to add (any n, not a multiple of ``block``).
        block: elements per program (a power of two >= 16); None = the launcher's choice.
    """
    # TODO, step by step:
    #   1. n = provided.check_vector('x', x, n); check y and out the same way
    #   2. block = provided.block_size('block', block, provided.default_tile('block', x))
    #   3. if n: launch _add_vectors_kernel on a grid of cdiv(n, block) programs (a 1-tuple)
    raise NotImplementedError("TODO: launch cdiv(n, block) programs of _add_vectors_kernel")


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
    # TODO, step by step:
    #   1. rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M); cols likewise on axis 1
    #   2. mask = (rows[:, None] < m) & (cols[None, :] < n): a [BLOCK_M, BLOCK_N] tile of booleans
    #   3. element (i, j) of X is at X + i * stride_xm + j * stride_xn (never assume stride_xm == n)
    #   4. store the tile at Out + j * stride_om + i * stride_on, with the same mask
    tl.static_assert(False, "TODO: write _transpose_kernel (steps above)")


def transpose(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
              block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:n, :m] = x[:m, :n].T`` on a 2-D grid of ``[block_m, block_n]`` tiles.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides: padded rows, column-major).
        out: a 2-D buffer of at least ``n x m`` (any strides).
        block_m, block_n: tile rows / columns of x (powers of two >= 16); None = default.
    """
    # TODO, step by step:
    #   1. m, n = provided.size('m', m), provided.size('n', n)
    #   2. provided.check_matrix('x', x, m, n); provided.check_matrix('out', out, n, m, 'n', 'm')
    #   3. block_m / block_n: provided.block_size(name, value, provided.default_tile(name, x))
    #   4. if m and n: grid = (cdiv(m, block_m), cdiv(n, block_n)); pass *x.stride(), *out.stride()
    raise NotImplementedError("TODO: a 2-D grid of tiles; pass both tensors' strides")


# ---------------------------------------------------------------------------------------
# 4. A row reduction: sum and max of each row
# ---------------------------------------------------------------------------------------


@triton.jit
def _row_sum_max_kernel(
    X, Sums, Maxes, n, stride_xm, stride_xn,
    BLOCK_N: tl.constexpr,
):
    """Program ``row`` reduces row ``row`` of X (``n <= BLOCK_N`` elements) to its sum and max."""
    # TODO, step by step:
    #   1. row = tl.program_id(0); cols = tl.arange(0, BLOCK_N); mask = cols < n
    #   2. load the row (X + row * stride_xm + cols * stride_xn) with other=0.0
    #      (0 is the pad of a sum)
    #   3. store tl.sum(x, axis=0) at Sums + row
    #   4. for the max the pad must be -inf: tl.max(tl.where(mask, x, float('-inf')), axis=0)
    tl.static_assert(False, "TODO: write _row_sum_max_kernel (steps above)")


def row_sum_max(x: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor, m: int, n: int, *,
                block_n: int | None = None) -> None:
    """``sums[:m] = x[:m, :n].sum(1)`` and ``maxes[:m] = x[:m, :n].max(1)``: one program
    per row, the whole row in one tile. A row of ``n = 0`` elements has sum 0, max -inf.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides).
        sums, maxes: contiguous 1-D buffers of at least ``m`` elements.
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    # TODO, step by step:
    #   1. check m, n, x (check_matrix), sums and maxes (check_vector, m elements)
    #   2. block_n = provided.whole_row_block('block_n', block_n, n)
    #   3. if m: one program per row: grid (m,); pass *x.stride()
    raise NotImplementedError("TODO: one program per row, the whole row in one block")


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
    # TODO, step by step:
    #   1. row = tl.program_id(0); cols = tl.arange(0, BLOCK_N); mask = cols < n
    #   2. load the row with other=float('-inf'): exp(-inf) = 0 keeps the pad out of the sum
    #   3. z = x - tl.max(x, axis=0); num = tl.exp(z); den = tl.sum(num, axis=0)
    #   4. store num / den with the mask (Out + row * stride_om + cols * stride_on)
    tl.static_assert(False, "TODO: write _softmax_rows_kernel (steps above)")


def softmax_rows(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
                 block_n: int | None = None) -> None:
    """``out[:m, :n] = softmax(x[:m, :n], dim=1)``, one program per row (``n >= 1``).

    Args:
        x, out: 2-D buffers of at least ``m x n`` (any strides).
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    # TODO, step by step:
    #   1. check m, n, x and out (check_matrix); block_n = provided.whole_row_block(...)
    #   2. if m and n: grid (m,); pass *x.stride(), *out.stride()
    raise NotImplementedError("TODO: one program per row, the whole row in one block")


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
    # TODO, step by step:
    #   1. rm, rn, rk = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
    #   2. load a [BLOCK_M, BLOCK_K] masked by rm < m and rk < k with other=0.0 (the pad must be 0)
    #   3. load b [BLOCK_K, BLOCK_N] masked by rk < k and rn < n with other=0.0
    #   4. c = tl.dot(a, b, input_precision=DOT_PRECISION); store it masked by rm < m and rn < n
    tl.static_assert(False, "TODO: write _small_matmul_kernel (steps above)")


def small_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                 k: int) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` in ONE program; every dim ``<= 64``.

    Each dim is padded to ``dot_tile(dim)`` (a power of two >= 16): ``tl.dot`` needs K >= 16
    on a GPU (and the course pads M and N to 16 too); masked loads fill the pad with zeros.
    """
    # TODO, step by step:
    #   1. check the sizes (each <= MAX_SMALL, else ValueError naming it) and a, b, out
    #   2. if m and n: ONE program; BLOCK_M=dot_tile(m), BLOCK_N=dot_tile(n),
    #      BLOCK_K=dot_tile(max(k, 1))
    #   3. DOT_PRECISION=dot_precision(a.dtype)  (float32: 'ieee', exact products)
    raise NotImplementedError("TODO: one program, every dim padded to dot_tile(dim)")


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
    # TODO, step by step:
    #   1. rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M); rn likewise on axis 1
    #   2. acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    #   3. for kk in range(0, k): load column kk of A ([BLOCK_M], mask rm < m, other=0.0) and row
    #   4. kk of B ([BLOCK_N], mask rn < n, other=0.0); acc += a_col[:, None] * b_row[None, :]
    #   5. store acc masked by rm < m and rn < n
    tl.static_assert(False, "TODO: write _outer_accumulate_kernel (steps above)")


def outer_accumulate(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                     k: int, *, block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` as ``k`` outer products per output tile.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n: output tile (powers of two >= 16); None = the launcher's choice.
    """
    # TODO, step by step:
    #   1. check m, n, k and a (m x k), b (k x n), out (m x n)
    #   2. block_m, block_n as in transpose; if m and n: grid (cdiv(m, block_m), cdiv(n, block_n))
    raise NotImplementedError("TODO: a 2-D grid of output tiles")


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
    # TODO, step by step:
    #   1. rm, rn from the two program ids (as in puzzle 7); rk = tl.arange(0, BLOCK_K)
    #   2. acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    #   3. for k0 in range(0, k, BLOCK_K): ks = k0 + rk; load the A tile [BLOCK_M, BLOCK_K] and the
    #   4. B tile [BLOCK_K, BLOCK_N], masked on rows/cols AND on ks < k, other=0.0
    #   5. acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)  (acc as the third argument)
    #   6. store acc.to(Out.dtype.element_ty) masked by rm < m and rn < n
    tl.static_assert(False, "TODO: write _matmul_kernel (steps above)")


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int, k: int, *,
           block_m: int | None = None, block_n: int | None = None,
           block_k: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]``: a 2-D grid of output tiles, a K loop each.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n, block_k: the tile (powers of two >= 16); None = the launcher's
            choice (``provided.INTERPRETER_TILES`` or ``provided.GPU_TILES``).
    """
    # TODO, step by step:
    #   1. as outer_accumulate, plus block_k; DOT_PRECISION=dot_precision(a.dtype)
    raise NotImplementedError("TODO: a 2-D grid of output tiles, each walks K")


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
    # TODO, step by step:
    #   1. rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M); row_ok = rows < m
    #   2. m_i = -inf, l_i = 0 ([BLOCK_M]) and acc = 0 ([BLOCK_M, DV_PAD]), all tl.float32
    #   3. for start in range(0, n, BLOCK_N): cols = start + tl.arange(0, BLOCK_N); load the s tile
    #   4. [BLOCK_M, BLOCK_N] masked by row_ok and cols < n with other=float('-inf')
    #   5. m_new = max(m_i, rowmax(s)); alpha = exp(m_i - m_new); p = exp(s - m_new[:, None])
    #   6. l_i = l_i * alpha + rowsum(p); load the v tile [BLOCK_N, DV_PAD]
    #      (masked by cols < n and d < dv, other=0.0)
    #   7. acc = acc * alpha[:, None];
    #      acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    #   8. m_i = m_new. After the loop: store acc / l_i[:, None] and lse = m_i + tl.log(l_i), masked
    tl.static_assert(False, "TODO: write _online_softmax_kernel (steps above)")


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
    # TODO, step by step:
    #   1. n == 0 is a ValueError naming n; check s (m x n), v (n x dv), out (m x dv), lse (m)
    #   2. block_m, block_n as in matmul; if m and dv: grid (cdiv(m, block_m),)
    #   3. DV_PAD=dot_tile(dv), DOT_PRECISION=dot_precision(s.dtype)
    raise NotImplementedError("TODO: one program per block of block_m rows")


# fmt: on
