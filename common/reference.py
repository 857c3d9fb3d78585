"""The float64 reference: dense attention, written to be obviously right, not fast.

Every test's expected values come from here (never from a lab's ``solution.py``).

Shapes: ``q [Lq, H, d]``, ``k [Lk, KVH, d]``, ``v [Lk, KVH, dv]`` (or 2-D ``[L, d]`` for a
single head). Query head ``h`` reads KV head ``h // (H // KVH)`` (MHA, GQA, MQA).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def to_float64(x: Any) -> np.ndarray:
    """A numpy float64 copy of a numpy array or torch tensor (any device, any dtype)."""
    if hasattr(x, "detach"):  # torch.Tensor without importing torch here
        x = x.detach().to("cpu").double().numpy()
    return np.array(x, dtype=np.float64, copy=True)


def kv_head_for(h: int | np.ndarray, num_heads: int, num_kv_heads: int) -> int | np.ndarray:
    """The KV head that query head ``h`` reads: ``h // (num_heads // num_kv_heads)``."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} must be a positive multiple of num_kv_heads={num_kv_heads}"
        )
    return h // (num_heads // num_kv_heads)


def prefix_mask(query_positions: Any, num_keys: int) -> np.ndarray:
    """``mask[i, j] = j <= query_positions[i]``: query i sees its causal prefix. ``[Lq, Lk]``."""
    pos = np.asarray(query_positions, dtype=np.int64).reshape(-1)
    return np.arange(num_keys)[None, :] <= pos[:, None]


def reference_attention(q: Any, k: Any, v: Any, scale: float | None = None, mask: Any = None,
                        window: int | None = None, sinks: Any = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Dense softmax(q kᵀ · scale) v in float64, with its log-sum-exp.

    Args:
        q: ``[Lq, H, d]`` (or ``[Lq, d]``).
        k: ``[Lk, KVH, d]`` (or ``[Lk, d]``).
        v: ``[Lk, KVH, dv]`` (or ``[Lk, dv]``).
        scale: defaults to ``1/sqrt(d)``.
        mask: ``None`` (attend everything) or a boolean array broadcastable to
            ``[H, Lq, Lk]`` (``[Lq, Lk]`` is the usual case); True means "may attend".
        window: ``None`` (no window) or an int ``>= 1``: query ``i`` sits at position
            ``p = Lk - Lq + i`` (the queries are the last ``Lq`` of the ``Lk`` tokens, as in
            decode and chunked prefill) and sees only its ``window`` most recent keys,
            itself included: ``p - window < j <= p`` (FlashAttention's
            ``window_size=(window - 1, 0)``; Hugging Face's and vLLM's ``sliding_window``).
            Combined with ``mask`` by AND.
        sinks: ``None`` or ``[H]`` per-head logits (gpt-oss's attention sinks), in the units
            of the scaled scores: each joins its head's softmax denominator as
            ``exp(sink)`` and contributes no value. Not affected by ``mask`` or ``window``.

    Returns:
        ``(out [Lq, H, dv], lse [Lq, H])`` (2-D inputs give ``[Lq, dv]`` and ``[Lq]``).
        ``lse = m + log(l)`` in natural log; a row that may attend nothing has
        ``lse = -inf`` and output 0. With sinks, ``l`` includes ``exp(sink)`` (a row that
        attends nothing then has output 0 and ``lse = sink``).
    """
    (q, k, v), single_head = _with_head_axis("q, k, v", q, k, v)
    _check_qkv(q, k, v)
    (Lq, H, d), (Lk, KVH, _) = q.shape, k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)

    heads = kv_head_for(np.arange(H), H, KVH)
    k_per_q, v_per_q = k[:, heads, :], v[:, heads, :]  # [Lk, H, d], [Lk, H, dv]
    scores = np.einsum("qhd,khd->hqk", q, k_per_q) * scale  # [H, Lq, Lk]
    allowed = _allowed(mask, scores.shape)
    if window is not None:
        allowed = allowed & window_mask(Lq, Lk, window)
    scores = np.where(allowed, scores, -np.inf)
    sink = _sink_logits(sinks, H)  # [H] (-inf: no sink)

    m = np.maximum(scores.max(axis=-1, initial=-np.inf), sink[:, None])  # [H, Lq]
    empty = np.isneginf(m)  # nothing to attend and no sink
    m_safe = np.where(empty, 0.0, m)
    p = np.where(allowed, np.exp(scores - m_safe[..., None]), 0.0)  # [H, Lq, Lk]
    l = p.sum(axis=-1) + np.exp(sink[:, None] - m_safe)  # the sink: a weight, no value
    l_safe = np.where(empty, 1.0, l)
    out = np.einsum("hqk,khd->qhd", p / l_safe[..., None], v_per_q)  # [Lq, H, dv]
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m_safe + np.log(l_safe)).T  # [Lq, H]
    if single_head:
        return out[:, 0, :], lse[:, 0]
    return out, lse


def _with_head_axis(names: str, *arrays: Any) -> tuple[list[np.ndarray], bool]:
    """The arrays in float64 as ``[L, heads, dim]`` (2-D inputs gain a one-head axis), and
    whether they were 2-D."""
    arrays = [to_float64(a) for a in arrays]
    single_head = arrays[0].ndim == 2
    if single_head:
        arrays = [a[:, None, :] for a in arrays]
    if any(a.ndim != 3 for a in arrays):
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise ValueError(f"{names} must be [L, heads, dim]; got {shapes}")
    return arrays, single_head


def _check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """q ``[Lq, H, d]``, k ``[Lk, KVH, d]``, v ``[Lk, KVH, dv]`` with ``KVH`` dividing ``H``."""
    if k.shape[2] != q.shape[2] or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"shapes do not agree: q {q.shape}, k {k.shape}, v {v.shape}")
    kv_head_for(0, q.shape[1], k.shape[1])  # validates the head counts


def _allowed(mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``mask`` broadcast to ``shape`` (all True when ``None``): True means "may attend"."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    return np.broadcast_to(np.asarray(mask, dtype=bool), shape)


def window_mask(num_queries: int, num_keys: int, window: int) -> np.ndarray:
    """``mask[i, j]``: query ``i`` (at position ``num_keys - num_queries + i``) may attend key
    ``j``, i.e. ``j`` is among its ``window`` most recent tokens, itself included.
    ``[num_queries, num_keys]``."""
    if isinstance(window, bool) or int(window) != window or window < 1:
        raise ValueError(f"window must be an integer >= 1 (or None), got {window!r}")
    pos = np.arange(num_queries)[:, None] + (num_keys - num_queries)
    keys = np.arange(num_keys)[None, :]
    return (keys <= pos) & (keys > pos - int(window))


def _sink_logits(sinks: Any, num_heads: int) -> np.ndarray:
    """``sinks`` as ``[num_heads]`` float64 (``-inf`` everywhere when ``None``)."""
    if sinks is None:
        return np.full(num_heads, -np.inf)
    sink = to_float64(sinks).reshape(-1)
    if sink.shape != (num_heads,):
        raise ValueError(f"sinks must have shape [{num_heads}] (one per query head), "
                         f"got {np.shape(sinks)}")
    return sink


def reference_softmax(x: Any) -> np.ndarray:
    """Softmax of a 1-D vector in float64 (max-subtracted, so huge values do not overflow)."""
    x = to_float64(x)
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_decode(q: Any, k: Any, v: Any, *, scale: float | None = None,
                     window: int | None = None, sinks: Any = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """One decode step (the last of ``L`` tokens) in float64: ``q [H, d]``, ``k [L, KVH, d]``,
    ``v [L, KVH, dv]`` -> ``(out [H, dv], lse [H])``; ``window`` and ``sinks`` as in
    :func:`reference_attention`."""
    out, lse = reference_attention(q[None], k, v, scale=scale, window=window, sinks=sinks)
    return out[0], lse[0]


def reference_attention_backward(q: Any, k: Any, v: Any, do: Any, scale: float | None = None,
                                 mask: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gradients of :func:`reference_attention`'s ``out`` in float64, textbook formulas.

    With ``P = softmax(q kᵀ · scale)`` (masked entries 0) and ``dO`` the gradient of ``out``:
    ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP − rowsum(P ∘ dP))``,
    ``dQ = scale · dS K``, ``dK = scale · dSᵀ Q``, each per query head; a KV head's ``dK``
    and ``dV`` are the sums over the query heads that read it (GQA, MQA).

    Args:
        q, k, v, scale, mask: as in :func:`reference_attention` (3-D or 2-D).
        do: ``[Lq, H, dv]`` (or ``[Lq, dv]``), the gradient of ``out``.

    Returns:
        ``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v``. A row that may attend nothing
        contributes nothing.
    """
    (q, k, v, do), single_head = _with_head_axis("q, k, v, do", q, k, v, do)
    Lq, H, d = q.shape
    Lk, KVH, _ = k.shape
    if do.shape != (Lq, H, v.shape[2]):
        raise ValueError(f"do has shape {do.shape}, expected {(Lq, H, v.shape[2])}")
    _check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)

    heads = kv_head_for(np.arange(H), H, KVH)
    k_per_q, v_per_q = k[:, heads, :], v[:, heads, :]  # [Lk, H, d], [Lk, H, dv]
    scores = np.einsum("qhd,khd->hqk", q, k_per_q) * scale  # [H, Lq, Lk]
    allowed = _allowed(mask, scores.shape)
    scores = np.where(allowed, scores, -np.inf)
    m = np.where(allowed.any(axis=-1), scores.max(axis=-1, initial=-np.inf), 0.0)
    e = np.where(allowed, np.exp(scores - m[..., None]), 0.0)
    l = e.sum(axis=-1)
    p = e / np.where(l > 0, l, 1.0)[..., None]  # [H, Lq, Lk], rows of nothing are 0

    dv_per_q = np.einsum("hqk,qhd->khd", p, do)  # [Lk, H, dv]  dV = Pᵀ dO
    dp = np.einsum("qhd,khd->hqk", do, v_per_q)  # [H, Lq, Lk]  dP = dO Vᵀ
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # the softmax Jacobian
    dq = np.einsum("hqk,khd->qhd", ds, k_per_q) * scale  # [Lq, H, d]
    dk_per_q = np.einsum("hqk,qhd->khd", ds, q) * scale  # [Lk, H, d]

    group = H // KVH  # query heads h*group ... h*group+group-1 read KV head h
    dk = dk_per_q.reshape(Lk, KVH, group, d).sum(axis=2)
    dv = dv_per_q.reshape(Lk, KVH, group, v.shape[2]).sum(axis=2)
    if single_head:
        return dq[:, 0, :], dk[:, 0, :], dv[:, 0, :]
    return dq, dk, dv
