"""Lab 05, given code: written once, imported by ``starter.py`` and the reference.

    provided = load_lab_module(__file__, "provided")

* input checks (numpy and torch), so every function fails the same readable way;
* the softmax scale (from the real head dim);
* the Triton tile sizes (interpreter and GPU) and the launch grid;
* the forward pass of ``flash_attention`` in plain torch (this lab differentiates it; the
  forward kernel is lab 00's subject, and no other lab's solution ships here);
* ``autograd_gradients``, the end-to-end check: gradients of ``flash_attention`` through
  ``torch.autograd`` (``loss.backward()``), as plain tensors the tests can compare.

Nothing here is an exercise; read it, then write the functions of ``starter.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from common import launch_plan
from common.checks import positive_int as positive_int  # given: ValueError naming the argument
from common.triton_env import (
    DEVICE,
    HAVE_TRITON,
    LOG2E,
    cdiv,
    check_kernel_dtype,
    default_scale,
    plan_target,
    tl,
)

# ---------------------------------------------------------------------------------------
# numpy inputs
# ---------------------------------------------------------------------------------------




def _matrix(name: str, x: Any, rows: int | None = None, cols: int | None = None) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [length, dim], got shape {x.shape}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name} has {x.shape[0]} rows, expected {rows}: {name} {x.shape}")
    if cols is not None and x.shape[1] != cols:
        raise ValueError(f"{name} has dim {x.shape[1]}, expected {cols}: {name} {x.shape}")
    return x


def _floats(*arrays: np.ndarray) -> list[np.ndarray]:
    """One float dtype for all (float64 stays float64, no copy)."""
    dtype = np.result_type(*(a.dtype for a in arrays), np.float32)
    return [a.astype(dtype, copy=False) for a in arrays]


def check_qkv_do(
    q: Any, k: Any, v: Any, do: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q ``[Lq, d]``, k ``[Lk, d]``, v ``[Lk, dv]``, do ``[Lq, dv]`` as float arrays of one
    dtype; mismatched shapes raise ``ValueError`` naming the array."""
    q = _matrix("q", q)
    if q.shape[1] == 0:
        raise ValueError(f"q must have head_dim >= 1, got shape {q.shape}")
    k = _matrix("k", k, cols=q.shape[1])
    v = _matrix("v", v, rows=k.shape[0])
    do = _matrix("do", do, rows=q.shape[0], cols=v.shape[1])
    q, k, v, do = _floats(q, k, v, do)
    return q, k, v, do


def check_o_do(o: Any, do: Any) -> tuple[np.ndarray, np.ndarray]:
    """o and do: the same ``[Lq, dv]`` shape, float arrays of one dtype."""
    o = _matrix("o", o)
    do = _matrix("do", do, rows=o.shape[0], cols=o.shape[1])
    o, do = _floats(o, do)
    return o, do


def check_backward_inputs(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any
) -> tuple[np.ndarray, ...]:
    """``(q, k, v, o, lse, do)`` of the tiled backward: ``o`` like ``do`` (``[Lq, dv]``) and
    ``lse [Lq]``, as float arrays of one dtype."""
    q, k, v, do = check_qkv_do(q, k, v, do)
    o = _matrix("o", o, rows=q.shape[0], cols=v.shape[1])
    lse = np.asarray(lse)
    if lse.shape != (q.shape[0],):
        raise ValueError(f"lse must be [Lq] = [{q.shape[0]}], got shape {lse.shape}")
    q, k, v, o, lse, do = _floats(q, k, v, o, lse, do)
    return q, k, v, o, lse, do


def scale_for(head_dim: int, scale: float | None) -> float:
    """The softmax scale: ``scale`` if given, else ``1/sqrt(head_dim)`` of the REAL head dim."""
    return default_scale(head_dim) if scale is None else float(scale)


# ---------------------------------------------------------------------------------------
# torch inputs of the Triton backward
# ---------------------------------------------------------------------------------------


def _check_4d(name: str, x: Any) -> None:
    if not hasattr(x, "stride") or x.ndim != 4:
        raise ValueError(
            f"{name} must be a 4-D torch tensor [batch, heads, seq, head_dim], "
            f"got {getattr(x, 'shape', type(x))}"
        )


def check_qkv_tensors(q: Any, k: Any, v: Any) -> int:
    """q ``[B, H, Lq, d]``, k and v ``[B, KVH, Lk, d]`` (one head dim, ``H % KVH == 0``), one
    dtype (float32 or float16 on the interpreter, bfloat16 too on a GPU), on the device
    Triton runs on. Returns the group size ``H // KVH``; ``ValueError`` naming the argument.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_4d(name, x)
    B, H, _, d = q.shape
    KVH = k.shape[1]
    if k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"k must be [{B}, KVH, Lk, {d}] to match q {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    if KVH == 0 or H % KVH != 0:
        raise ValueError(f"num_heads={H} must be a multiple of num_kv_heads={KVH} (k's dim 1)")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must be {tuple(k.shape)} like k (this kernel needs dv = d), "
                         f"got {tuple(v.shape)}")
    if d == 0:
        raise ValueError(f"q needs a head dim >= 1, got {tuple(q.shape)}")
    check_kernel_dtype(q, "q")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {x.dtype} but q has {q.dtype}: use one dtype")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device.type != DEVICE:
            raise ValueError(f"{name} is on {x.device} but Triton runs on {DEVICE} here")
    return H // KVH


def check_triton_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any) -> int:
    """Shapes, dtypes and device of ``flash_attention_backward_triton``; returns the group
    size ``H // KVH`` (query heads per KV head).

    q, k, v as in :func:`check_qkv_tensors`; o and do like q (``[B, H, Lq, d]``, q's dtype);
    lse ``[B, H, Lq]`` float32. Every failure is a ``ValueError`` naming the argument.
    """
    group = check_qkv_tensors(q, k, v)
    for name, x in (("o", o), ("do", do)):
        _check_4d(name, x)
        if tuple(x.shape) != tuple(q.shape):
            raise ValueError(f"{name} must be {tuple(q.shape)} like q, got {tuple(x.shape)}")
        if x.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {x.dtype} but q has {q.dtype}: use one dtype")
    if not hasattr(lse, "stride") or tuple(lse.shape) != tuple(q.shape[:3]):
        raise ValueError(f"lse must be a torch tensor {tuple(q.shape[:3])} = [B, H, Lq], "
                         f"got {getattr(lse, 'shape', type(lse))}")
    if str(lse.dtype) != "torch.float32":
        raise ValueError(f"lse must be float32 (the forward's log-sum-exp), got {lse.dtype}")
    for name, x in (("o", o), ("lse", lse), ("do", do)):
        if x.device.type != DEVICE:
            raise ValueError(f"{name} is on {x.device} but Triton runs on {DEVICE} here")
    return group


# ---------------------------------------------------------------------------------------
# Triton: constants, tile sizes, launch grid
# ---------------------------------------------------------------------------------------

# log2(e), to turn the natural-log lse of the contract into the kernel's base 2. A global
# read inside @triton.jit must be a tl.constexpr.
LOG2E_CONST = tl.constexpr(LOG2E) if HAVE_TRITON else LOG2E

# Under the interpreter every program costs milliseconds per tile: small tiles, small tests.
INTERPRETER_TILES: dict[str, int] = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}


def gpu_tiles(head_dim: int) -> dict[str, int]:
    """Tile sizes of the backward on a GPU for a head dim.

    ``block_m`` query rows and ``block_n`` keys per tile, shared by the three kernels: the
    dK/dV kernel keeps a ``[block_n, d]`` K/V tile and two float32 ``[block_n, d]``
    accumulators on chip and streams ``[block_m, d]`` tiles of Q and dO; the dQ kernel the
    other way round. The backward holds more live tiles than the forward (K, V, dK, dV, plus
    Q, dO and a score tile), hence smaller tiles than lab 00's forward at the same head
    dim. A starting point within the range of Triton tutorial 06's backward (its dK/dV pass
    uses 32 x 128 tiles, its dQ pass 128 x 32, 4 warps), not a measured optimum. 8 warps
    and, at d = 128, 3 stages: with 4 warps at d = 64 the dK/dV kernel spills on sm_80, and
    with 2 stages at d = 128 the dQ kernel does (``make gpu-report``, compiled, not run).
    """
    return launch_plan.flash_backward(head_dim, plan_target()).config  # common/launch_plan.py


# CUDA's limit on grid axis 0 (axes 1 and 2 stop at 65,535, which B x H can pass).
MAX_GRID_X = 2**31 - 1


def tile_grid(batch: int, heads: int, length: int, block: int) -> tuple[int]:
    """One program per (tile of ``block`` rows of ``length``, batch x head), all on axis 0.

    Program ``pid`` handles tile ``pid % cdiv(length, block)`` of batch·head
    ``pid // cdiv(length, block)``. The dK/dV kernel uses it with ``(B, KVH, Lk, block_n)``
    (one program per K/V tile and KV head), the preprocess and dQ kernels with
    ``(B, H, Lq, block_m)``. ``ValueError`` when the grid would overflow axis 0.
    """
    programs = cdiv(length, block) * batch * heads
    if programs > MAX_GRID_X:
        raise ValueError(
            f"batch={batch} x heads={heads} x cdiv(length={length}, block={block}) = "
            f"{programs} programs: more than CUDA's {MAX_GRID_X} on grid axis 0"
        )
    return (programs,)


# ---------------------------------------------------------------------------------------
# The forward pass of flash_attention (plain torch: what this lab differentiates)
# ---------------------------------------------------------------------------------------


def attention_forward(q: Any, k: Any, v: Any, causal: bool = False, *,
                      scale: float | None = None) -> tuple[Any, Any]:
    """``(o [B, H, Lq, d]`` in q's dtype, ``lse [B, H, Lq]`` float32``)``, plain torch.

    The forward of ``flash_attention``: the same ``(o, lse)`` that lab 00's kernel returns,
    computed here with torch ops in float32 (it builds the ``Lq x Lk`` scores; it is the
    backward that this lab tiles). GQA: query head ``h`` reads KV head ``h // (H // KVH)``.
    Causal is top-left: query ``i`` attends keys ``0 … i``. No keys: ``o = 0``,
    ``lse = -inf``.
    """
    import torch

    with torch.no_grad():
        check_qkv_tensors(q, k, v)
        B, H, Lq, d = q.shape
        Lk = k.shape[2]
        group = H // k.shape[1]
        if Lk == 0:
            return torch.zeros_like(q), torch.full((B, H, Lq), -math.inf, device=q.device)
        k_rep = k.float().repeat_interleave(group, dim=1)  # [B, H, Lk, d]
        v_rep = v.float().repeat_interleave(group, dim=1)
        s = (q.float() @ k_rep.transpose(-1, -2)) * scale_for(d, scale)  # [B, H, Lq, Lk]
        if causal:
            rows = torch.arange(Lq, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(Lk, device=q.device)[None, :] > rows, -math.inf)
        lse = torch.logsumexp(s, dim=-1)  # [B, H, Lq]
        o = torch.exp(s - lse[..., None]) @ v_rep
        return o.to(q.dtype), lse


def autograd_gradients(
    attention: Callable[..., Any],
) -> Callable[..., tuple[Any, Any, Any]]:
    """Make ``gradients_through_autograd(q, k, v, do, causal=False, *, scale=None)`` for a
    differentiable ``attention(q, k, v, causal, *, scale)``.

    ``starter.py`` and the reference both define
    ``gradients_through_autograd = provided.autograd_gradients(flash_attention)``: the tests
    call it to check ``loss.backward()`` end to end, because a test cannot send a tensor
    that requires grad to code running in another process.
    """

    def gradients_through_autograd(q: Any, k: Any, v: Any, do: Any, causal: bool = False, *,
                                   scale: float | None = None) -> tuple[Any, Any, Any]:
        """``(q.grad, k.grad, v.grad)`` after ``(flash_attention(q, k, v) * do).sum()
        .backward()``: the gradients autograd gets from this module's ``flash_attention``.

        q ``[B, H, L, d]``, k, v ``[B, KVH, L, d]``, do like q. Returns detached tensors.
        """
        q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        out = attention(q, k, v, causal=causal, scale=scale)
        if not hasattr(out, "grad_fn") or out.grad_fn is None:
            raise TypeError(
                "flash_attention must return one tensor attached to the autograd graph "
                f"(a torch.autograd.Function's output), got {type(out).__name__}"
            )
        loss = (out * do).sum()  # d loss / d out = do
        loss.backward()
        return tuple(
            x.grad.detach() if x.grad is not None else None for x in (q, k, v)
        )  # type: ignore[return-value]

    return gradients_through_autograd
