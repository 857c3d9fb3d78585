"""Lab 00, given code: written once, imported by ``starter.py`` and the reference.

    provided = load_lab_module(__file__, "provided")

* input checks (numpy and torch), so every function fails the same readable way;
* the softmax scale (from the real head dim);
* the Triton tile sizes (interpreter and GPU) and the launch grid.

Nothing here is an exercise; read it, then write the functions of ``starter.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common import launch_plan
from common.checks import positive_int as positive_int  # given: ValueError naming the argument
from common.triton_env import (
    DEVICE,
    HAVE_TRITON,
    cdiv,
    check_kernel_dtype,
    default_scale,
    plan_target,
    tl,
)

# ---------------------------------------------------------------------------------------
# numpy inputs
# ---------------------------------------------------------------------------------------




def non_negative_int(name: str, value: Any) -> int:
    """``value`` as an int ``>= 0``, else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def as_vector(x: Any) -> np.ndarray:
    """``x`` as a 1-D float array (float64 stays float64), else ``ValueError`` naming ``x``."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"x must be a 1-D vector, got shape {x.shape}")
    return x.astype(np.result_type(x.dtype, np.float32), copy=False)


def check_qkv(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q ``[Lq, d]``, k ``[Lk, d]``, v ``[Lk, dv]`` as float arrays of one dtype.

    float64 stays float64 (no copy); mismatched shapes raise ``ValueError`` naming the array.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D [length, dim], got shape {x.shape}")
    if q.shape[1] == 0:
        raise ValueError(f"q must have head_dim >= 1, got shape {q.shape}")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k has head_dim {k.shape[1]} but q has {q.shape[1]}: k {k.shape}")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"v has {v.shape[0]} rows but k has {k.shape[0]}: v {v.shape}")
    dtype = np.result_type(q.dtype, k.dtype, v.dtype, np.float32)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def scale_for(head_dim: int, scale: float | None) -> float:
    """The softmax scale: ``scale`` if given, else ``1/sqrt(head_dim)`` of the REAL head dim.

    A kernel pads head dims like 24 or 80 to a ``tl.dot`` tile (32, 128); the scale must
    still come from 24 or 80.
    """
    return default_scale(head_dim) if scale is None else float(scale)


# ---------------------------------------------------------------------------------------
# torch inputs of the Triton launcher
# ---------------------------------------------------------------------------------------


def check_bhld(q: Any, k: Any, v: Any) -> None:
    """q ``[B, H, Lq, d]``, k ``[B, H, Lk, d]``, v ``[B, H, Lk, dv]``: one dtype, on DEVICE.

    Any strides are accepted (a ``[B, L, H, d]`` tensor viewed with ``.transpose(1, 2)``
    too); ``dv`` may differ from ``d``; K/V have as many heads as Q (no GQA in this lab).
    bfloat16 is refused under the interpreter (its bf16 ``tl.dot`` is wrong). Every
    failure is a ``ValueError`` naming the argument.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "stride") or x.ndim != 4:
            raise ValueError(
                f"{name} must be a 4-D torch tensor [batch, heads, seq, head_dim], "
                f"got {getattr(x, 'shape', type(x))}"
            )
    B, H, _, d = q.shape
    if tuple(k.shape[:2]) != (B, H) or k.shape[3] != d:
        raise ValueError(
            f"k must be [{B}, {H}, Lk, {d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"v must be [{B}, {H}, {k.shape[2]}, dv] to match k, got {tuple(v.shape)}")
    if d == 0 or v.shape[3] == 0:
        raise ValueError(f"q and v need head dims >= 1, got q {tuple(q.shape)}, v {tuple(v.shape)}")
    check_kernel_dtype(q, "q")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {x.dtype} but q has {q.dtype}: use one dtype")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device.type != DEVICE:
            raise ValueError(f"{name} is on {x.device} but Triton runs on {DEVICE} here")


# ---------------------------------------------------------------------------------------
# Triton: constants, tile sizes, launch grid
# ---------------------------------------------------------------------------------------

# ln(2), to turn the kernel's base-2 log-sum-exp back into the natural log of the contract.
# A global read inside @triton.jit must be a tl.constexpr.
LN2 = tl.constexpr(math.log(2.0)) if HAVE_TRITON else math.log(2.0)

# Under the interpreter every program costs milliseconds per K/V tile: small tiles, small tests.
INTERPRETER_TILES: dict[str, int] = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}


def gpu_tiles(head_dim: int) -> dict[str, int]:
    """Tile sizes on a GPU for a head dim (within Triton tutorial 06's tuning space).

    ``block_m`` query rows and ``block_n`` keys per tile; ``num_warps`` warps share the
    ``block_m`` rows; ``num_stages`` K/V tiles are in flight (software pipelining). At
    d = 128, 8 warps hold the 128 x 128 float32 accumulator in 64 registers per thread
    (128 with 4 warps); at d = 256 the tiles shrink and 2 stages fit in shared memory. At
    d = 64, 8 warps and 2 stages: with 4 warps the causal kernel spills on sm_80 (255
    registers, 60 bytes), with 3 stages on sm_100 (8 bytes; ``make gpu-report`` with the
    pinned triton 3.7.1, compiled, not run).
    """
    return launch_plan.flash_forward(head_dim, plan_target()).config  # common/launch_plan.py


# CUDA's limits on a launch grid: x up to 2^31 - 1 programs, y and z up to 65,535.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65_535


def attention_grid(batch: int, heads: int, seqlen_q: int, block_m: int) -> tuple[int]:
    """The launch grid: one program per (query tile, batch·head), all on grid axis 0.

    Program ``pid`` handles query tile ``pid % cdiv(seqlen_q, block_m)`` of batch·head
    ``pid // cdiv(seqlen_q, block_m)``: the tiles of one head are neighbours, so they run
    at about the same time and share that head's K/V in L2. Axis 0 holds up to 2^31 - 1
    programs, where axes 1 and 2 stop at 65,535 (``B·H`` alone passes that at B = 512,
    H = 128). Raises ``ValueError`` when even axis 0 would overflow.
    """
    programs = cdiv(seqlen_q, block_m) * batch * heads
    if programs > MAX_GRID_X:
        raise ValueError(
            f"batch={batch} x heads={heads} x cdiv(seqlen_q={seqlen_q}, block_m={block_m}) = "
            f"{programs} programs: more than CUDA's {MAX_GRID_X} on grid axis 0"
        )
    return (programs,)
