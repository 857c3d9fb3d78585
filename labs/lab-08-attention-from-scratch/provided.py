"""Lab 08, given code: written once, imported by ``starter.py`` and the reference.

    provided = load_lab_module(__file__, "provided")

* the two small data types the lab passes around (``ScaleStats``, ``MultiHeadWeights``);
* input checks, so every function fails the same readable way (``ValueError`` naming the
  argument and its shape).

Nothing here is an exercise; read it, then write the functions of ``starter.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from common.checks import positive_int as positive_int  # given: ValueError naming the argument


class ScaleStats(NamedTuple):
    """What the √d experiment measured for one head dim ``d`` (see ``scale_experiment``).

    ``variance_*``: the variance of the scores ``q · k`` over every (query, key) pair, raw
    (``unscaled``) and multiplied by ``1/sqrt(d)`` (``scaled``).
    ``entropy_*``: the softmax entropy of a query's row of scores in nats, averaged over the
    queries (its largest possible value is ``log(num_keys)``, a uniform row).
    """

    d: int
    variance_unscaled: float
    variance_scaled: float
    entropy_unscaled: float
    entropy_scaled: float


class MultiHeadWeights(NamedTuple):
    """The four projections of multi-head attention, in ``torch.nn.Linear`` layout.

    Each weight is ``[out_features, in_features]`` and is applied as ``x @ w.T + b``
    (exactly what ``nn.MultiheadAttention`` stores, so its weights copy over unchanged):
    ``w_q [E, E]``, ``w_k [E, kdim]``, ``w_v [E, vdim]``, ``w_o [E, E]``; biases ``[E]`` or
    ``None`` (no bias). ``E`` is the model width, split into ``num_heads`` heads of
    ``E // num_heads``.
    """

    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    b_q: np.ndarray | None = None
    b_k: np.ndarray | None = None
    b_v: np.ndarray | None = None
    b_o: np.ndarray | None = None


# ---------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------


def as_float(name: str, x: Any, min_ndim: int = 1) -> np.ndarray:
    """``x`` as a float array (float64 stays float64) with at least ``min_ndim`` axes."""
    x = np.asarray(x)
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {x.dtype}")
    return x.astype(np.result_type(x.dtype, np.float32), copy=False)


def check_same_last_dim(a_name: str, a: np.ndarray, b_name: str, b: np.ndarray) -> None:
    """``b``'s last axis must have ``a``'s length (a dot product needs equal widths)."""
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"{b_name} has last dim {b.shape[-1]} but {a_name} has {a.shape[-1]}: "
            f"{a_name} {a.shape}, {b_name} {b.shape}"
        )


def check_weight(name: str, w: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``w`` as a float array of exactly ``shape``."""
    w = as_float(name, w, len(shape))
    if w.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {w.shape}")
    return w


def check_qkv(q: Any, k: Any, v: Any, enable_gqa: bool = False) -> tuple[np.ndarray, ...]:
    """q ``[..., H, Lq, d]``, k ``[..., Hkv, Lk, d]``, v ``[..., Hkv, Lk, dv]`` (SDPA's layout).

    Without ``enable_gqa`` the head axes must agree (or broadcast, as in numpy); with it,
    ``Hkv`` must divide ``H``. q, k and v must share one dtype (PyTorch SDPA raises
    otherwise). Returns the three as float arrays of one dtype (``as_float``).
    """
    dtypes = {name: np.asarray(x).dtype for name, x in (("q", q), ("k", k), ("v", v))}
    if len(set(dtypes.values())) > 1:
        raise ValueError(
            "q, k and v must have the same dtype (as in PyTorch SDPA), got "
            + ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        )
    q, k, v = as_float("q", q, 2), as_float("k", k, 2), as_float("v", v, 2)
    check_same_last_dim("q", q, "k", k)
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has {v.shape[-2]} keys but k has {k.shape[-2]}: v {v.shape}")
    if enable_gqa:
        if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
            raise ValueError(
                f"enable_gqa needs q, k, v of one rank with a head axis at -3: "
                f"q {q.shape}, k {k.shape}, v {v.shape}"
            )
        h, h_kv = q.shape[-3], k.shape[-3]
        if h_kv < 1 or h % h_kv != 0 or v.shape[-3] != h_kv:
            raise ValueError(
                f"k has {h_kv} heads, which must divide q's {h} heads (and equal v's "
                f"{v.shape[-3]}) when enable_gqa=True: q {q.shape}, k {k.shape}"
            )
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def check_mask(name: str, mask: Any, scores_shape: tuple[int, ...]) -> np.ndarray:
    """A boolean or float mask that broadcasts to ``scores_shape`` ``[..., Lq, Lk]``."""
    mask = np.asarray(mask)
    if mask.dtype != bool and not np.issubdtype(mask.dtype, np.floating):
        raise ValueError(
            f"{name} must be boolean (True = attend) or float (added to the scores), "
            f"got dtype {mask.dtype}"
        )
    try:
        np.broadcast_shapes(mask.shape, scores_shape)
    except ValueError:
        raise ValueError(
            f"{name} of shape {mask.shape} does not broadcast to the scores' shape "
            f"{tuple(scores_shape)} [..., Lq, Lk]"
        ) from None
    return mask


def check_lengths(lengths: Any, num_keys: int) -> np.ndarray:
    """``lengths [B]``: integers in ``0 … num_keys``."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths must be a 1-D integer array [B], got {lengths!r}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > num_keys):
        raise ValueError(f"lengths must lie in 0 … num_keys={num_keys}, got {lengths.tolist()}")
    return lengths


def check_even(name: str, value: int) -> int:
    """RoPE and sinusoidal encodings work on pairs of dimensions: the width must be even."""
    if value % 2 != 0 or value < 2:
        raise ValueError(f"{name} must be even and >= 2 (pairs of dimensions), got {value}")
    return value


def linear(name: str, x: np.ndarray, w: Any, b: Any, width: int) -> np.ndarray:
    """``x @ w.T + b`` with ``w [width, x's width]`` and ``b [width]`` or ``None``
    (``torch.nn.Linear``); ``name`` is the weight's name for the error message."""
    w = check_weight(name, w, (width, x.shape[-1]))
    y = x @ w.T
    if b is not None:
        y = y + check_weight("b" + name[1:], b, (width,))
    return y
