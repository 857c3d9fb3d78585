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

Your work: every kernel (hints are comments in its body) and every launcher except
``add_constant`` (given, complete: read it first). The README walks through each puzzle
with a worked example. Then run

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
    # TODO:
    #   the lane numbers of the program: tl.arange(0, BLOCK)
    #   a mask that is True for the lanes that hold data (there are n of them)
    #   load X at those lanes, add c, store to Out: both with the mask
    tl.static_assert(False, "TODO: write _add_constant_kernel (hints above)")


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
    # TODO:
    #   which block is mine: tl.program_id(0)
    #   my offsets: the block's first element plus the lane numbers; the mask as in puzzle 1
    #   load x and y, store their sum (every access masked)
    tl.static_assert(False, "TODO: write _add_vectors_kernel (hints above)")


def add_vectors(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, n: int, *,
                block: int | None = None) -> None:
    """``out[:n] = x[:n] + y[:n]`` with ``cdiv(n, block)`` programs on a 1-D grid.

    Args:
        x, y, out: contiguous 1-D buffers of at least ``n`` elements.
        n: elements to add (any n, not a multiple of ``block``).
        block: elements per program (a power of two >= 16); None = the launcher's choice.
    """
    # TODO:
    #   check x, y and out (provided.check_vector) and pick the block
    #   (provided.block_size with provided.default_tile('block', x) as the default)
    #   launch _add_vectors_kernel on a 1-D grid with enough programs to cover n (n > 0)
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
    # TODO:
    #   rows of X from program axis 0, columns from axis 1 (as in puzzle 2, once per axis)
    #   a [BLOCK_M, BLOCK_N] tile of addresses and of masks: broadcast rows[:, None] against
    #   cols[None, :]; an address is a row times its stride plus a column times its stride
    #   (the strides are arguments: a padded buffer's row stride is not n)
    #   store the tile so that X's element (i, j) lands at row j, column i of Out
    tl.static_assert(False, "TODO: write _transpose_kernel (hints above)")


def transpose(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
              block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:n, :m] = x[:m, :n].T`` on a 2-D grid of ``[block_m, block_n]`` tiles.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides: padded rows, column-major).
        out: a 2-D buffer of at least ``n x m`` (any strides).
        block_m, block_n: tile rows / columns of x (powers of two >= 16); None = default.
    """
    # TODO:
    #   check the sizes (provided.size) and both buffers (provided.check_matrix:
    #   out holds n rows of m) and pick block_m and block_n as in add_vectors
    #   a 2-D grid: enough programs on axis 0 for the rows, on axis 1 for the columns;
    #   pass both tensors' strides (x.stride() gives them)
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
    # TODO:
    #   one program per row: the row from the program id, its columns from tl.arange
    #   load the row with a mask; what the masked lanes hold must not change the result
    #   tl.sum and tl.max reduce a tile (axis=0); a sum's neutral pad is 0, a max's is -inf
    #   (tl.where(mask, x, value) replaces the masked lanes)
    tl.static_assert(False, "TODO: write _row_sum_max_kernel (hints above)")


def row_sum_max(x: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor, m: int, n: int, *,
                block_n: int | None = None) -> None:
    """``sums[:m] = x[:m, :n].sum(1)`` and ``maxes[:m] = x[:m, :n].max(1)``: one program
    per row, the whole row in one tile. A row of ``n = 0`` elements has sum 0, max -inf.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides).
        sums, maxes: contiguous 1-D buffers of at least ``m`` elements.
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    # TODO:
    #   check x (m x n), sums and maxes (m elements each)
    #   block_n must hold a whole row: provided.whole_row_block('block_n', block_n, n)
    #   one program per row
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
    # TODO:
    #   one program per row, as in puzzle 4
    #   load the row once; pick other= so that the masked lanes add nothing to the sum of exp
    #   subtract the row max before tl.exp (exp of 100 overflows float32), sum, divide
    #   store the row with the mask
    tl.static_assert(False, "TODO: write _softmax_rows_kernel (hints above)")


def softmax_rows(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
                 block_n: int | None = None) -> None:
    """``out[:m, :n] = softmax(x[:m, :n], dim=1)``, one program per row (``n >= 1``).

    Args:
        x, out: 2-D buffers of at least ``m x n`` (any strides).
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    # TODO:
    #   check x and out (m x n); block_n from provided.whole_row_block
    #   one program per row (nothing to do if m or n is 0)
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
    # TODO:
    #   one program holds all of A, B and Out: tiles [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N]
    #   load both with masks on BOTH of their axes and other=0.0: the pad must be zeros
    #   tl.dot(a, b, input_precision=DOT_PRECISION), then store the [BLOCK_M, BLOCK_N] result
    #   where it holds data
    tl.static_assert(False, "TODO: write _small_matmul_kernel (hints above)")


def small_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                 k: int) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` in ONE program; every dim ``<= 64``.

    Each dim is padded to ``dot_tile(dim)`` (a power of two >= 16): ``tl.dot`` needs K >= 16
    on a GPU (and the course pads M and N to 16 too); masked loads fill the pad with zeros.
    """
    # TODO:
    #   check the sizes (each at most MAX_SMALL, else ValueError naming it) and a,
    #   b, out; ONE program whose tiles are dot_tile(dim) for each dim (at least 16)
    #   DOT_PRECISION=dot_precision(a.dtype): float32 products in 'ieee' precision
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
    # TODO:
    #   the output tile from the two program ids (as in puzzle 3)
    #   a float32 accumulator of zeros, [BLOCK_M, BLOCK_N]
    #   for every kk < k: load column kk of A for my rows and row kk of B for my columns
    #   (masked), add their outer product a_col[:, None] * b_row[None, :] to the accumulator
    #   store the accumulator once, at the end
    tl.static_assert(False, "TODO: write _outer_accumulate_kernel (hints above)")


def outer_accumulate(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                     k: int, *, block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` as ``k`` outer products per output tile.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n: output tile (powers of two >= 16); None = the launcher's choice.
    """
    # TODO:
    #   check the sizes and a (m x k), b (k x n), out (m x n); pick the tile
    #   a 2-D grid over the output tiles
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
    # TODO:
    #   puzzle 7's structure, with K walked BLOCK_K at a time instead of 1
    #   each step loads an A tile [BLOCK_M, BLOCK_K] and a B tile [BLOCK_K, BLOCK_N]; the last
    #   step sticks out past k, so mask on K too, with other=0.0
    #   tl.dot takes the accumulator as its third argument: acc = tl.dot(a, b, acc, ...)
    #   store the accumulator (cast to Out's element type) where the output holds data
    tl.static_assert(False, "TODO: write _matmul_kernel (hints above)")


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int, k: int, *,
           block_m: int | None = None, block_n: int | None = None,
           block_k: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]``: a 2-D grid of output tiles, a K loop each.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n, block_k: the tile (powers of two >= 16); None = the launcher's
            choice (``provided.INTERPRETER_TILES`` or ``provided.GPU_TILES``).
    """
    # TODO:
    #   as outer_accumulate, with block_k too and DOT_PRECISION=dot_precision(a.dtype)
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
    # TODO:
    #   my rows from the program id; per row a running max m_i (-inf), denominator l_i (0)
    #   and unnormalised output acc ([BLOCK_M, DV_PAD]), all float32
    #   walk the columns BLOCK_N at a time: load the s tile (pad: -inf) and the matching
    #   rows of V (pad: 0)
    #   new max = max(old max, the tile's row max); alpha = exp(old max - new max) re-bases
    #   l_i and acc; p = exp(s - new max); l_i += rowsum(p); acc += p @ v with tl.dot
    #   after the loop: out = acc / l_i, lse = m_i + log(l_i); store both where they hold data
    tl.static_assert(False, "TODO: write _online_softmax_kernel (hints above)")


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
    # TODO:
    #   n == 0 is a ValueError naming n; check s (m x n), v (n x dv), out (m x dv)
    #   and lse (m); pick block_m and block_n; one program per block_m rows;
    #   DV_PAD=dot_tile(dv), DOT_PRECISION=dot_precision(s.dtype)
    raise NotImplementedError("TODO: one program per block of block_m rows")


# fmt: on
