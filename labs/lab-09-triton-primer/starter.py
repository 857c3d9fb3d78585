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

Your work: every kernel and every launcher except ``add_constant`` (given, complete: read
it first). Each TODO says what must hold, not how; hints in levels (the idea, the API,
near-code) are in HINTS.md, one step per puzzle (``make hint LAB=09 STEP=1 LEVEL=1``), and
the calls, with runnable examples, are on triton-sheet.md. The README walks through each
puzzle with a worked example. Then run

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
    # TODO: the lanes past the n elements neither read nor write.
    #   Hints in levels: HINTS.md, step 1 (make hint LAB=09 STEP=1 LEVEL=1).
    tl.static_assert(False, "TODO: write _add_constant_kernel (HINTS.md, step 1)")


# Given: puzzle 1's launcher (you write only its kernel)
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
    # TODO: every element < n owned by exactly one program; none past n touched.
    #   Hints in levels: HINTS.md, step 2 (make hint LAB=09 STEP=2 LEVEL=1).
    tl.static_assert(False, "TODO: write _add_vectors_kernel (HINTS.md, step 2)")


def add_vectors(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, n: int, *,
                block: int | None = None) -> None:
    """``out[:n] = x[:n] + y[:n]`` with ``cdiv(n, block)`` programs on a 1-D grid.

    Args:
        x, y, out: contiguous 1-D buffers of at least ``n`` elements.
        n: elements to add (any n, not a multiple of ``block``).
        block: elements per program (a power of two >= 16); None = the launcher's choice.
    """
    # TODO: check the buffers, choose the block, launch enough programs to cover n.
    #   Hints in levels: HINTS.md, step 2 (make hint LAB=09 STEP=2 LEVEL=1).
    raise NotImplementedError("TODO: launch _add_vectors_kernel over the whole vector")


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
    # TODO: addresses from the strides, never from the shape; both axes masked.
    #   Hints in levels: HINTS.md, step 3 (make hint LAB=09 STEP=3 LEVEL=1).
    tl.static_assert(False, "TODO: write _transpose_kernel (HINTS.md, step 3)")


def transpose(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
              block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:n, :m] = x[:m, :n].T`` on a 2-D grid of ``[block_m, block_n]`` tiles.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides: padded rows, column-major).
        out: a 2-D buffer of at least ``n x m`` (any strides).
        block_m, block_n: tile rows / columns of x (powers of two >= 16); None = default.
    """
    # TODO: check both buffers (out is n x m), choose the tile, a 2-D grid, pass the strides.
    #   Hints in levels: HINTS.md, step 3 (make hint LAB=09 STEP=3 LEVEL=1).
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
    # TODO: a masked lane must not change a reduction: each has its own neutral value.
    #   Hints in levels: HINTS.md, step 4 (make hint LAB=09 STEP=4 LEVEL=1).
    tl.static_assert(False, "TODO: write _row_sum_max_kernel (HINTS.md, step 4)")


def row_sum_max(x: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor, m: int, n: int, *,
                block_n: int | None = None) -> None:
    """``sums[:m] = x[:m, :n].sum(1)`` and ``maxes[:m] = x[:m, :n].max(1)``: one program
    per row, the whole row in one tile. A row of ``n = 0`` elements has sum 0, max -inf.

    Args:
        x: a 2-D buffer of at least ``m x n`` (any strides).
        sums, maxes: contiguous 1-D buffers of at least ``m`` elements.
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    # TODO: check the buffers; a block that holds a whole row; one program per row.
    #   Hints in levels: HINTS.md, step 4 (make hint LAB=09 STEP=4 LEVEL=1).
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
    # TODO: one load, one store per element; the pad adds nothing; nothing overflows.
    #   Hints in levels: HINTS.md, step 5 (make hint LAB=09 STEP=5 LEVEL=1).
    tl.static_assert(False, "TODO: write _softmax_rows_kernel (HINTS.md, step 5)")


def softmax_rows(x: torch.Tensor, out: torch.Tensor, m: int, n: int, *,
                 block_n: int | None = None) -> None:
    """``out[:m, :n] = softmax(x[:m, :n], dim=1)``, one program per row (``n >= 1``).

    Args:
        x, out: 2-D buffers of at least ``m x n`` (any strides).
        block_n: lanes per row (a power of two >= 16 and >= n); None = ``dot_tile(n)``.
    """
    # TODO: check the buffers; a block that holds a whole row; one program per row.
    #   Hints in levels: HINTS.md, step 5 (make hint LAB=09 STEP=5 LEVEL=1).
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
    # TODO: every dim a dot tile (>= 16); the pad contributes nothing to the product.
    #   Hints in levels: HINTS.md, step 6 (make hint LAB=09 STEP=6 LEVEL=1).
    tl.static_assert(False, "TODO: write _small_matmul_kernel (HINTS.md, step 6)")


def small_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                 k: int) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` in ONE program; every dim ``<= 64``.

    Each dim is padded to ``dot_tile(dim)`` (a power of two >= 16): ``tl.dot`` needs K >= 16
    on a GPU (and the course pads M and N to 16 too); masked loads fill the pad with zeros.
    """
    # TODO: check the sizes (<= MAX_SMALL) and buffers; ONE program, every dim a dot tile.
    #   Hints in levels: HINTS.md, step 6 (make hint LAB=09 STEP=6 LEVEL=1).
    raise NotImplementedError("TODO: one program, every dim padded to a dot tile")


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
    # TODO: an output tile is a sum over every slice of K, stored once.
    #   Hints in levels: HINTS.md, step 7 (make hint LAB=09 STEP=7 LEVEL=1).
    tl.static_assert(False, "TODO: write _outer_accumulate_kernel (HINTS.md, step 7)")


def outer_accumulate(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int,
                     k: int, *, block_m: int | None = None, block_n: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]`` as ``k`` outer products per output tile.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n: output tile (powers of two >= 16); None = the launcher's choice.
    """
    # TODO: check the sizes and buffers, choose the tile, a 2-D grid of output tiles.
    #   Hints in levels: HINTS.md, step 7 (make hint LAB=09 STEP=7 LEVEL=1).
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
    # TODO: puzzle 7 a K tile at a time with tl.dot; the last K tile sticks out.
    #   Hints in levels: HINTS.md, step 8 (make hint LAB=09 STEP=8 LEVEL=1).
    tl.static_assert(False, "TODO: write _matmul_kernel (HINTS.md, step 8)")


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m: int, n: int, k: int, *,
           block_m: int | None = None, block_n: int | None = None,
           block_k: int | None = None) -> None:
    """``out[:m, :n] = a[:m, :k] @ b[:k, :n]``: a 2-D grid of output tiles, a K loop each.

    Args:
        a, b, out: 2-D buffers (any strides) of at least ``m x k``, ``k x n``, ``m x n``.
        block_m, block_n, block_k: the tile (powers of two >= 16); None = the launcher's
            choice (``provided.INTERPRETER_TILES`` or ``provided.GPU_TILES``).
    """
    # TODO: as outer_accumulate, with a K tile and the dot precision.
    #   Hints in levels: HINTS.md, step 8 (make hint LAB=09 STEP=8 LEVEL=1).
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
    # TODO: per row, a summary of the columns seen that finishes softmax(s) @ v.
    #   Hints in levels: HINTS.md, step 9 (make hint LAB=09 STEP=9 LEVEL=1).
    tl.static_assert(False, "TODO: write _online_softmax_kernel (HINTS.md, step 9)")


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
    # TODO: n == 0 is a ValueError; check the buffers; one program per block of rows.
    #   Hints in levels: HINTS.md, step 9 (make hint LAB=09 STEP=9 LEVEL=1).
    raise NotImplementedError("TODO: one program per block of block_m rows")


# fmt: on
