"""Lab 08: attention from first principles (numpy; the tests compare with PyTorch).

The reference implementation. Shapes follow PyTorch's ``scaled_dot_product_attention``:
``q [..., H, Lq, d]``, ``k [..., Hkv, Lk, d]``, ``v [..., Hkv, Lk, dv]``; any leading batch
axes broadcast as in numpy. Vectors are rows: a projection of ``x`` is ``x @ w`` in the
scoring functions (the papers' notation, transposed) and ``x @ w.T + b`` in multi-head
attention (``torch.nn.Linear``'s layout, so PyTorch's weights copy over unchanged).
"""

from __future__ import annotations

import math

import numpy as np

from common.loader import load_lab_module

provided = load_lab_module(__file__, "provided")
ScaleStats = provided.ScaleStats
MultiHeadWeights = provided.MultiHeadWeights

# ---------------------------------------------------------------------------------------
# 1. Scores: how well does query i match key j?
# ---------------------------------------------------------------------------------------


def additive_scores(
    q: np.ndarray, k: np.ndarray, w_q: np.ndarray, w_k: np.ndarray, v_a: np.ndarray
) -> np.ndarray:
    """Bahdanau's additive score ``e[i, j] = v_a · tanh(q[i] @ w_q + k[j] @ w_k)``.

    Args:
        q: ``[..., Lq, dq]`` (decoder states); k: ``[..., Lk, dk]`` (encoder states).
        w_q: ``[dq, da]``; w_k: ``[dk, da]``; v_a: ``[da]``.

    Returns:
        ``[..., Lq, Lk]`` scores (no scale, no softmax).
    """
    q, k = provided.as_float("q", q, 2), provided.as_float("k", k, 2)
    w_q = provided.check_weight("w_q", w_q, (q.shape[-1], np.shape(w_q)[-1]))
    w_k = provided.check_weight("w_k", w_k, (k.shape[-1], w_q.shape[1]))
    v_a = provided.check_weight("v_a", v_a, (w_q.shape[1],))
    hidden = np.tanh((q @ w_q)[..., :, None, :] + (k @ w_k)[..., None, :, :])  # [.., Lq, Lk, da]
    return hidden @ v_a


def dot_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Luong's dot score ``e[i, j] = q[i] · k[j]``.

    Args:
        q: ``[..., Lq, d]``; k: ``[..., Lk, d]``.

    Returns:
        ``[..., Lq, Lk]``.
    """
    q, k = provided.as_float("q", q, 2), provided.as_float("k", k, 2)
    provided.check_same_last_dim("q", q, "k", k)
    return q @ np.swapaxes(k, -1, -2)


def general_scores(q: np.ndarray, k: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Luong's general (bilinear) score ``e[i, j] = q[i] @ w @ k[j]``.

    Args:
        q: ``[..., Lq, dq]``; k: ``[..., Lk, dk]``; w: ``[dq, dk]``.

    Returns:
        ``[..., Lq, Lk]``.
    """
    q, k = provided.as_float("q", q, 2), provided.as_float("k", k, 2)
    w = provided.check_weight("w", w, (q.shape[-1], k.shape[-1]))
    return q @ w @ np.swapaxes(k, -1, -2)


def scaled_dot_scores(q: np.ndarray, k: np.ndarray, scale: float | None = None) -> np.ndarray:
    """The Transformer's score ``e[i, j] = (q[i] · k[j]) * scale``, ``scale = 1/sqrt(d)``.

    Args:
        q: ``[..., Lq, d]``; k: ``[..., Lk, d]``; scale: defaults to ``1/sqrt(d)``.

    Returns:
        ``[..., Lq, Lk]``.
    """
    scale = 1.0 / math.sqrt(np.shape(q)[-1]) if scale is None else scale
    return dot_scores(q, k) * scale


# ---------------------------------------------------------------------------------------
# 2. Softmax over the keys, and what the √d scale does to it
# ---------------------------------------------------------------------------------------


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the LAST axis (the keys): every row of weights sums to 1.

    Subtracts the row max first (``exp(1000)`` overflows). ``-inf`` scores get weight 0;
    a row that is ``-inf`` everywhere (nothing to attend) gets all-zero weights, not NaN.

    Args:
        scores: ``[..., Lk]``.

    Returns:
        weights, same shape.
    """
    scores = provided.as_float("scores", scores, 1)
    m = scores.max(axis=-1, keepdims=True, initial=-np.inf)  # [..., 1] row max
    m = np.where(np.isneginf(m), 0.0, m)  # an empty row: exp(-inf - 0) = 0, no NaN
    e = np.exp(scores - m)
    l = e.sum(axis=-1, keepdims=True)  # [..., 1] the denominator
    return e / np.where(l == 0.0, 1.0, l)


def softmax_entropy(scores: np.ndarray) -> np.ndarray:
    """Entropy in nats of the softmax weights ``p`` of each row: ``-sum(p log p)``, last axis.

    ``log(Lk)`` for a uniform row, 0 for a one-hot row (and for a row of nothing but
    ``-inf``). Computed from log-probabilities so that large scores do not overflow.

    Args:
        scores: ``[..., Lk]``.

    Returns:
        ``[...]``.
    """
    scores = provided.as_float("scores", scores, 1)
    p = softmax(scores)
    m = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        log_l = np.log(np.exp(scores - m).sum(axis=-1, keepdims=True))
    log_p = scores - m - log_l  # log softmax
    return -np.where(p > 0, p * log_p, 0.0).sum(axis=-1)


def scale_experiment(
    d: int, num_queries: int = 256, num_keys: int = 256, seed: int = 0
) -> ScaleStats:
    """Why ``1/sqrt(d)``: random unit-variance queries and keys, scored with and without it.

    Draws ``q [num_queries, d]`` and ``k [num_keys, d]`` with independent standard normal
    entries (numpy's ``default_rng`` seeded with ``seed``), then measures the variance of all
    ``num_queries * num_keys`` scores (``np.var``) and the mean softmax entropy of a query's
    row, for the raw scores ``q @ k.T`` and for ``q @ k.T / sqrt(d)``.

    Returns:
        ``ScaleStats(d, variance_unscaled, variance_scaled, entropy_unscaled,
        entropy_scaled)`` with Python floats. Expect ``variance_unscaled ≈ d``,
        ``variance_scaled ≈ 1``, and an unscaled entropy that collapses towards 0 as ``d``
        grows while the scaled one stays near ``log(num_keys)``.
    """
    d = provided.positive_int("d", d)
    num_queries = provided.positive_int("num_queries", num_queries)
    num_keys = provided.positive_int("num_keys", num_keys)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((num_queries, d))
    k = rng.standard_normal((num_keys, d))
    raw = dot_scores(q, k)  # [num_queries, num_keys]
    scaled = raw / math.sqrt(d)
    return ScaleStats(
        d,
        float(np.var(raw)),
        float(np.var(scaled)),
        float(softmax_entropy(raw).mean()),
        float(softmax_entropy(scaled).mean()),
    )


# ---------------------------------------------------------------------------------------
# 3. Masks: which keys may a query see? (four conventions, one meaning)
# ---------------------------------------------------------------------------------------


def causal_mask(num_queries: int, num_keys: int) -> np.ndarray:
    """Top-left causal mask, SDPA convention: ``mask[i, j] = j <= i`` (True = attend).

    Query ``i`` sees keys ``0 … i``, itself included, whatever ``num_keys`` is (PyTorch
    SDPA's ``is_causal``). ``[num_queries, num_keys]`` bool.
    """
    num_queries = provided.positive_int("num_queries", num_queries, minimum=0)
    num_keys = provided.positive_int("num_keys", num_keys, minimum=0)
    return np.arange(num_keys)[None, :] <= np.arange(num_queries)[:, None]


def key_padding_mask(lengths: np.ndarray, num_keys: int) -> np.ndarray:
    """``nn.MultiheadAttention``'s ``key_padding_mask``: True = padding, IGNORE this key.

    Sequence ``b`` of a padded batch has ``lengths[b]`` real keys, then padding.

    Args:
        lengths: ``[B]`` ints in ``0 … num_keys``.
        num_keys: the padded length ``Lk``.

    Returns:
        ``[B, Lk]`` bool, ``mask[b, j] = j >= lengths[b]``.
    """
    num_keys = provided.positive_int("num_keys", num_keys, minimum=0)
    lengths = provided.check_lengths(lengths, num_keys)
    return np.arange(num_keys)[None, :] >= lengths[:, None]


def bool_to_additive(attn_mask: np.ndarray) -> np.ndarray:
    """Boolean mask (True = attend) to the float mask that is ADDED to the scores.

    True becomes ``0.0`` (the score is unchanged), False becomes ``-inf`` (weight
    ``exp(-inf) = 0``). Same shape, float64.
    """
    attn_mask = np.asarray(attn_mask)
    if attn_mask.dtype != bool:
        raise ValueError(f"attn_mask must be boolean (True = attend), got dtype {attn_mask.dtype}")
    return np.where(attn_mask, 0.0, -np.inf)


def additive_to_bool(attn_mask: np.ndarray) -> np.ndarray:
    """Float additive mask to boolean (True = attend): a key is visible unless its entry
    is ``-inf``. (A finite bias such as ALiBi's keeps the key visible; only the bias is
    lost in the conversion.) Same shape, bool."""
    attn_mask = provided.as_float("attn_mask", attn_mask, 0)
    return attn_mask > -np.inf


def key_padding_to_attn_mask(key_padding_mask: np.ndarray) -> np.ndarray:
    """``key_padding_mask [B, Lk]`` (True = ignore) to an SDPA ``attn_mask`` (True = attend).

    Returns:
        ``[B, 1, 1, Lk]`` bool: it broadcasts over the heads and the queries of
        ``[B, H, Lq, Lk]`` scores.
    """
    key_padding_mask = np.asarray(key_padding_mask)
    if key_padding_mask.dtype != bool or key_padding_mask.ndim != 2:
        raise ValueError(
            "key_padding_mask must be a boolean [B, Lk] array (True = padding), got "
            f"dtype {key_padding_mask.dtype}, shape {key_padding_mask.shape}"
        )
    return ~key_padding_mask[:, None, None, :]


# ---------------------------------------------------------------------------------------
# 4. Scaled dot-product attention: the readable reference later labs make fast
# ---------------------------------------------------------------------------------------


def attention_weights(
    q: np.ndarray,
    k: np.ndarray,
    attn_mask: np.ndarray | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """``softmax(q kᵀ · scale + mask)``: how much each query reads each key.

    Args:
        q: ``[..., Lq, d]``; k: ``[..., Lk, d]`` (leading axes broadcast).
        attn_mask: SDPA's convention, broadcastable to ``[..., Lq, Lk]``: boolean
            (True = attend) or float (added to the scores: 0 keeps, ``-inf`` hides).
        is_causal: top-left causal (query ``i`` sees keys ``0 … i``); not with ``attn_mask``.
        scale: defaults to ``1/sqrt(d)``.

    Returns:
        ``[..., Lq, Lk]``; each row sums to 1, or is all 0 when it may attend nothing.
    """
    if is_causal and attn_mask is not None:
        raise ValueError("pass attn_mask or is_causal, not both (as in PyTorch SDPA)")
    s = scaled_dot_scores(q, k, scale)  # [..., Lq, Lk]
    if is_causal:
        attn_mask = causal_mask(s.shape[-2], s.shape[-1])
    if attn_mask is not None:
        mask = provided.check_mask("attn_mask", attn_mask, s.shape)
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    return softmax(s)


def repeat_kv(x: np.ndarray, num_repeats: int) -> np.ndarray:
    """GQA: repeat each KV head ``num_repeats`` times along the head axis (-3).

    ``[..., Hkv, L, d] -> [..., Hkv * num_repeats, L, d]``; query head ``h`` then meets KV
    head ``h // num_repeats`` (``torch.repeat_interleave``, what SDPA's ``enable_gqa``
    does), NOT ``h % Hkv`` (``np.tile``).
    """
    x = provided.as_float("x", x, 3)
    num_repeats = provided.positive_int("num_repeats", num_repeats)
    return np.repeat(x, num_repeats, axis=-3)


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> np.ndarray:
    """``softmax(q kᵀ · scale + mask) v``, PyTorch SDPA's contract in numpy.

    Args:
        q: ``[..., H, Lq, d]``; k: ``[..., Hkv, Lk, d]``; v: ``[..., Hkv, Lk, dv]``.
        attn_mask, is_causal, scale: as in ``attention_weights``.
        enable_gqa: allow ``Hkv`` to divide ``H`` (grouped-query attention): K/V heads are
            repeated with ``repeat_kv``. Without it the head axes must agree.

    Returns:
        ``[..., H, Lq, dv]``; a query that may attend nothing gets zeros. A key whose weight
        is 0 contributes exactly 0, as long as its value is finite (0 · NaN is NaN).
    """
    q, k, v = provided.check_qkv(q, k, v, enable_gqa)
    if enable_gqa:
        group = q.shape[-3] // k.shape[-3]
        k, v = repeat_kv(k, group), repeat_kv(v, group)
    p = attention_weights(q, k, attn_mask, is_causal, scale)  # [..., H, Lq, Lk]
    return p @ v


# ---------------------------------------------------------------------------------------
# 5. Multi-head attention: project, split into heads, attend, merge, project
# ---------------------------------------------------------------------------------------


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``[B, L, E] -> [B, num_heads, L, E // num_heads]``: head ``h`` owns the columns
    ``h*Dh … (h+1)*Dh - 1`` of every token, in the tokens' order."""
    x = provided.as_float("x", x, 3)
    num_heads = provided.positive_int("num_heads", num_heads)
    B, L, E = x.shape
    if E % num_heads != 0:
        raise ValueError(f"num_heads={num_heads} must divide the width E={E} of x {x.shape}")
    return x.reshape(B, L, num_heads, E // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``[B, H, L, Dh] -> [B, L, H * Dh]``, the inverse of ``split_heads``."""
    x = provided.as_float("x", x, 4)
    B, H, L, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * Dh)


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    weights: MultiHeadWeights,
    num_heads: int,
    key_padding_mask: np.ndarray | None = None,
    is_causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``nn.MultiheadAttention(batch_first=True)``'s forward pass, in numpy.

    Self-attention is ``query is key is value``; cross-attention reads another sequence
    (``Lk`` may differ from ``Lq``, and its width ``kdim``/``vdim`` from ``E``).

    Args:
        query: ``[B, Lq, E]``; key: ``[B, Lk, kdim]``; value: ``[B, Lk, vdim]``.
        weights: ``MultiHeadWeights`` in ``nn.Linear`` layout (``x @ w.T + b``).
        num_heads: ``H``; must divide ``E``. Each head has width ``Dh = E // H`` and its
            scores are scaled by ``1/sqrt(Dh)``.
        key_padding_mask: ``[B, Lk]`` bool, ``nn.MultiheadAttention``'s convention:
            True = padding, ignore this key.
        is_causal: top-left causal mask (query ``i`` sees keys ``0 … i``).

    Returns:
        ``(out [B, Lq, E], weights [B, Lq, Lk])``: the attention weights averaged over the
        heads (``average_attn_weights=True``).
    """
    query = provided.as_float("query", query, 3)
    key, value = provided.as_float("key", key, 3), provided.as_float("value", value, 3)
    E = query.shape[-1]
    w = weights
    q = provided.linear("w_q", query, w.w_q, w.b_q, E)  # [B, Lq, E]
    k = provided.linear("w_k", key, w.w_k, w.b_k, E)  # [B, Lk, E]
    v = provided.linear("w_v", value, w.w_v, w.b_v, E)
    q, k, v = (split_heads(x, num_heads) for x in (q, k, v))  # [B, H, L, Dh]
    mask = None
    if key_padding_mask is not None:
        mask = key_padding_to_attn_mask(key_padding_mask)  # [B, 1, 1, Lk]
    if is_causal:
        causal = causal_mask(q.shape[-2], k.shape[-2])
        mask = causal if mask is None else mask & causal
    p = attention_weights(q, k, mask)  # [B, H, Lq, Lk]
    out = merge_heads(p @ v)  # [B, Lq, E]
    return provided.linear("w_o", out, w.w_o, w.b_o, E), p.mean(axis=1)


# ---------------------------------------------------------------------------------------
# 6. Positions: attention alone cannot tell "dog bites man" from "man bites dog"
# ---------------------------------------------------------------------------------------


def sinusoidal_positions(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The Transformer's fixed encodings, added to the token embeddings.

    ``pe[p, 2i] = sin(p / base**(2i/dim))`` and ``pe[p, 2i+1] = cos(p / base**(2i/dim))``
    (sine and cosine interleaved, as in the paper).

    Returns:
        ``[num_positions, dim]``; ``dim`` must be even.
    """
    num_positions = provided.positive_int("num_positions", num_positions, minimum=0)
    dim = provided.check_even("dim", provided.positive_int("dim", dim))
    freq = base ** (-np.arange(0, dim, 2) / dim)  # [dim/2] one frequency per pair
    angle = np.arange(num_positions)[:, None] * freq[None, :]  # [L, dim/2]
    pe = np.empty((num_positions, dim))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def apply_rope(
    x: np.ndarray, positions: np.ndarray, base: float = 10000.0, interleaved: bool = True
) -> np.ndarray:
    """Rotary position embedding: rotate each pair of dims of ``x`` by ``position * theta_i``.

    ``theta_i = base ** (-2i / d)`` for pair ``i = 0 … d/2 - 1``. Pairs are
    ``(2i, 2i+1)`` when ``interleaved`` (the RoFormer paper, GPT-J) and ``(i, i + d/2)``
    otherwise (GPT-NeoX, Llama in Hugging Face: "rotate half"). A pair ``(a, b)`` becomes
    ``(a cos - b sin, a sin + b cos)``. Apply it to queries and keys, never to values.

    Args:
        x: ``[..., L, d]``, ``d`` even; positions: ``[L]`` integer positions of the rows.

    Returns:
        the rotated ``x``, same shape (norms unchanged).
    """
    x = provided.as_float("x", x, 2)
    d = provided.check_even("x's last dim", x.shape[-1])
    positions = np.asarray(positions)
    if positions.shape != x.shape[-2:-1]:
        raise ValueError(f"positions must have shape [L] = [{x.shape[-2]}], got {positions.shape}")
    theta = base ** (-np.arange(0, d, 2) / d)  # [d/2]
    angle = positions[:, None] * theta[None, :]  # [L, d/2]
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., : d // 2], x[..., d // 2 :])
    ra, rb = a * cos - b * sin, a * sin + b * cos  # each pair rotated by its angle
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : d // 2], out[..., d // 2 :] = ra, rb
    return out
