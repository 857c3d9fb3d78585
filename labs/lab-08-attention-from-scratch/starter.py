"""Lab 08: attention from first principles (numpy; the tests compare with PyTorch).

Your work. Fill in every function that raises ``NotImplementedError``, in order, then run

    LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-08-attention-from-scratch -q
    make grade LAB=08                                 (the same, with a score table)

Shapes follow PyTorch's ``scaled_dot_product_attention``: ``q [..., H, Lq, d]``,
``k [..., Hkv, Lk, d]``, ``v [..., Hkv, Lk, dv]``; any leading batch axes broadcast as in
numpy. Vectors are rows: a projection of ``x`` is ``x @ w`` in the scoring functions (the
papers' notation, transposed) and ``x @ w.T + b`` in multi-head attention
(``torch.nn.Linear``'s layout, so PyTorch's weights copy over unchanged).

The given code (input checks that raise ``ValueError`` naming the argument, the two data
types, ``linear``) is in ``provided.py``; read it first.
"""

from __future__ import annotations

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
    raise NotImplementedError(
        "TODO: a small network scores each (query, key) pair; nothing is a dot product of q "
        "and k (HINTS.md, step 1)"
    )


def dot_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Luong's dot score ``e[i, j] = q[i] · k[j]``.

    Args:
        q: ``[..., Lq, d]``; k: ``[..., Lk, d]``.

    Returns:
        ``[..., Lq, Lk]``.
    """
    raise NotImplementedError(
        "TODO: every query dotted with every key, on any leading batch axes (HINTS.md, step "
        "2)"
    )


def general_scores(q: np.ndarray, k: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Luong's general (bilinear) score ``e[i, j] = q[i] @ w @ k[j]``.

    Args:
        q: ``[..., Lq, dq]``; k: ``[..., Lk, dk]``; w: ``[dq, dk]``.

    Returns:
        ``[..., Lq, Lk]``.
    """
    raise NotImplementedError(
        "TODO: Luong's general score: a learned matrix between the query and the key "
        "(HINTS.md, step 3)"
    )


def scaled_dot_scores(q: np.ndarray, k: np.ndarray, scale: float | None = None) -> np.ndarray:
    """The Transformer's score ``e[i, j] = (q[i] · k[j]) * scale``, ``scale = 1/sqrt(d)``.

    Args:
        q: ``[..., Lq, d]``; k: ``[..., Lk, d]``; scale: defaults to ``1/sqrt(d)``.

    Returns:
        ``[..., Lq, Lk]``.
    """
    raise NotImplementedError(
        "TODO: the dot scores, scaled so their variance does not grow with d (HINTS.md, step "
        "4)"
    )


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
    raise NotImplementedError(
        "TODO: weights that sum to 1 over the keys; no overflow; a row with nothing visible "
        "gives zeros (HINTS.md, step 5)"
    )


def softmax_entropy(scores: np.ndarray) -> np.ndarray:
    """Entropy in nats of the softmax weights ``p`` of each row: ``-sum(p log p)``, last axis.

    ``log(Lk)`` for a uniform row, 0 for a one-hot row (and for a row of nothing but
    ``-inf``). Computed from log-probabilities so that large scores do not overflow.

    Args:
        scores: ``[..., Lk]``.

    Returns:
        ``[...]``.
    """
    raise NotImplementedError(
        "TODO: the entropy of each row's softmax, in nats; 0 · log 0 counts as 0 (HINTS.md, "
        "step 6)"
    )


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
    raise NotImplementedError(
        "TODO: measure, on random q and k, what the 1/sqrt(d) scale does to variance and "
        "entropy (HINTS.md, step 7)"
    )


# ---------------------------------------------------------------------------------------
# 3. Masks: which keys may a query see? (four conventions, one meaning)
# ---------------------------------------------------------------------------------------


def causal_mask(num_queries: int, num_keys: int) -> np.ndarray:
    """Top-left causal mask, SDPA convention: ``mask[i, j] = j <= i`` (True = attend).

    Query ``i`` sees keys ``0 … i``, itself included, whatever ``num_keys`` is (PyTorch
    SDPA's ``is_causal``). ``[num_queries, num_keys]`` bool.
    """
    raise NotImplementedError(
        "TODO: query i sees keys 0 … i (itself included), as a boolean [Lq, Lk] (HINTS.md, "
        "step 8)"
    )


def key_padding_mask(lengths: np.ndarray, num_keys: int) -> np.ndarray:
    """``nn.MultiheadAttention``'s ``key_padding_mask``: True = padding, IGNORE this key.

    Sequence ``b`` of a padded batch has ``lengths[b]`` real keys, then padding.

    Args:
        lengths: ``[B]`` ints in ``0 … num_keys``.
        num_keys: the padded length ``Lk``.

    Returns:
        ``[B, Lk]`` bool, ``mask[b, j] = j >= lengths[b]``.
    """
    raise NotImplementedError(
        "TODO: nn.MultiheadAttention's convention: True marks PADDING (HINTS.md, step 9)"
    )


def bool_to_additive(attn_mask: np.ndarray) -> np.ndarray:
    """Boolean mask (True = attend) to the float mask that is ADDED to the scores.

    True becomes ``0.0`` (the score is unchanged), False becomes ``-inf`` (weight
    ``exp(-inf) = 0``). Same shape, float64.
    """
    raise NotImplementedError(
        "TODO: an additive mask: ADDED to the scores (HINTS.md, step 10)"
    )


def additive_to_bool(attn_mask: np.ndarray) -> np.ndarray:
    """Float additive mask to boolean (True = attend): a key is visible unless its entry
    is ``-inf``. (A finite bias such as ALiBi's keeps the key visible; only the bias is
    lost in the conversion.) Same shape, bool."""
    raise NotImplementedError(
        "TODO: which entries of an additive mask hide a key? (HINTS.md, step 11)"
    )


def key_padding_to_attn_mask(key_padding_mask: np.ndarray) -> np.ndarray:
    """``key_padding_mask [B, Lk]`` (True = ignore) to an SDPA ``attn_mask`` (True = attend).

    Returns:
        ``[B, 1, 1, Lk]`` bool: it broadcasts over the heads and the queries of
        ``[B, H, Lq, Lk]`` scores.
    """
    raise NotImplementedError(
        "TODO: from True = ignore to SDPA's True = attend, broadcastable over heads and "
        "queries (HINTS.md, step 12)"
    )


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
    raise NotImplementedError(
        "TODO: softmax of the scaled scores with SDPA's mask conventions (HINTS.md, step 13)"
    )


def repeat_kv(x: np.ndarray, num_repeats: int) -> np.ndarray:
    """GQA: repeat each KV head ``num_repeats`` times along the head axis (-3).

    ``[..., Hkv, L, d] -> [..., Hkv * num_repeats, L, d]``; query head ``h`` then meets KV
    head ``h // num_repeats`` (``torch.repeat_interleave``, what SDPA's ``enable_gqa``
    does), NOT ``h % Hkv`` (``np.tile``).
    """
    raise NotImplementedError(
        "TODO: each KV head repeated for its group of query heads, in place (HINTS.md, step "
        "14)"
    )


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
    raise NotImplementedError(
        "TODO: PyTorch SDPA's contract in numpy, GQA included (HINTS.md, step 15)"
    )


# ---------------------------------------------------------------------------------------
# 5. Multi-head attention: project, split into heads, attend, merge, project
# ---------------------------------------------------------------------------------------


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``[B, L, E] -> [B, num_heads, L, E // num_heads]``: head ``h`` owns the columns
    ``h*Dh … (h+1)*Dh - 1`` of every token, in the tokens' order."""
    raise NotImplementedError(
        "TODO: head h owns its own Dh columns of every token (HINTS.md, step 16)"
    )


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``[B, H, L, Dh] -> [B, L, H * Dh]``, the inverse of ``split_heads``."""
    raise NotImplementedError("TODO: the inverse of split_heads (HINTS.md, step 17)")


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
    raise NotImplementedError(
        "TODO: nn.MultiheadAttention's forward pass, built from the functions above "
        "(HINTS.md, step 18)"
    )


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
    raise NotImplementedError(
        "TODO: the Transformer's fixed encodings, sine and cosine interleaved (HINTS.md, step "
        "19)"
    )


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
    raise NotImplementedError(
        "TODO: rotate each pair of dims by position times its frequency (HINTS.md, step 20)"
    )
