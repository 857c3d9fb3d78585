"""Lab 10: the approximate-attention era (2019-2021), measured against exact attention.

Exact attention scores every (query, key) pair: an N x N matrix per head. The methods of
this lab each skip most of that matrix, in one of four ways:

    sparse masks   score only the pairs a fixed pattern allows (Sparse Transformer,
                   Longformer, BigBird): exact on the pattern, blind off it
    hashing        score only pairs whose vectors hash to the same bucket (Reformer)
    low rank       squeeze the N keys into k mixtures of keys (Linformer)
    kernels        replace exp(q . k) by phi(q) . phi(k) and reorder the products so the
                   N x N matrix never exists (Performer; linear attention)

and one does not approximate at all: exact attention in query and key chunks with a running
max, denominator and accumulator (Rabe & Staats), the idea FlashAttention made fast.

Every function works on one head: ``q [Lq, d]``, ``k [Lk, d]``, ``v [Lk, dv]``, float64.
The given code (input checks, the seeded random matrices, the feature map of linear
attention, the retrieval task) is in ``provided.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from common.loader import load_lab_module

provided = load_lab_module(__file__, "provided")

# ---------------------------------------------------------------------------------------
# 1. The N^2 wall
# ---------------------------------------------------------------------------------------


def score_matrix_bytes(
    seq_len: int, num_heads: int = 1, num_layers: int = 1, bytes_per_element: int = 2
) -> int:
    """Bytes of the ``seq_len x seq_len`` score matrices of ``num_heads`` heads in each of
    ``num_layers`` layers (FP16 by default): ``N * N * heads * layers * bytes``."""
    raise NotImplementedError(
        "TODO: N * N scores per head, times heads, layers and bytes per element"
    )


# ---------------------------------------------------------------------------------------
# 2. Fixed sparse patterns: which (query, key) pairs are scored
# ---------------------------------------------------------------------------------------


def strided_mask(n: int, stride: int, causal: bool = True) -> np.ndarray:
    """Sparse Transformer's strided pattern: ``[n, n]`` bool, True = query i may attend key j.

    Query ``i`` sees its ``stride`` nearest keys (``|i - j| < stride``) and every key a
    multiple of ``stride`` away (``(i - j) % stride == 0``). Causal: only keys ``j <= i``.
    """
    raise NotImplementedError(
        "TODO: i = arange(n)[:, None], j = arange(n)[None, :]; (|i - j| < stride) | ((i - j) % "
        "stride == 0); & (j <= i) when causal"
    )


def fixed_mask(n: int, block: int, num_summary: int = 1, causal: bool = True) -> np.ndarray:
    """Sparse Transformer's fixed pattern: ``[n, n]`` bool.

    Query ``i`` sees every key of its own block (``i // block == j // block``) and the
    last ``num_summary`` keys of every block (``j % block >= block - num_summary``), the
    "summary" columns through which blocks talk. Causal: only keys ``j <= i``.
    """
    raise NotImplementedError(
        "TODO: same block (i // block == j // block) | summary column (j % block >= block - "
        "num_summary); & (j <= i) when causal"
    )


def window_global_mask(
    n: int, window: int, global_tokens: Iterable[int] = (), causal: bool = False
) -> np.ndarray:
    """Longformer's sliding window plus global tokens: ``[n, n]`` bool.

    Window: query ``i`` sees key ``j`` when ``|i - j| < window`` (FlashAttention's
    ``window_size=(window - 1, window - 1)``); causal: ``i - window < j <= i``
    (``window_size=(window - 1, 0)``: the ``window`` most recent tokens, itself included).
    A global token attends every key and every query attends it (its row and its column);
    causal masks still apply on top.
    """
    raise NotImplementedError(
        "TODO: window: -window < i - j < window (causal: 0 <= i - j < window); OR the global "
        "tokens' rows AND columns"
    )


def bigbird_mask(
    n: int, window: int, global_tokens: Iterable[int], num_random: int, seed: int = 0
) -> np.ndarray:
    """BigBird's pattern: ``window_global_mask(n, window, global_tokens)`` plus, in every
    row, ``num_random`` keys drawn uniformly without replacement from the keys the row does
    not see yet (all of them when fewer remain). Bidirectional. ``[n, n]`` bool; the same
    ``seed`` gives the same mask.
    """
    raise NotImplementedError(
        "TODO: start from window_global_mask; rng = np.random.default_rng(seed); per row, "
        "rng.choice(the unseen keys, size=min(num_random, how many), replace=False)"
    )


def receptive_field(num_layers: int, window: int, causal: bool = True) -> int:
    """How many positions can reach a token (far from the ends) through ``num_layers``
    stacked sliding-window layers of ``window`` (the mask of :func:`window_global_mask`).

    Each causal layer reaches ``window - 1`` tokens further back: ``L * (window - 1) + 1``;
    a bidirectional layer reaches that far on both sides: ``2 * L * (window - 1) + 1``.
    """
    raise NotImplementedError(
        "TODO: one causal layer reaches window - 1 tokens back; L layers reach L * (window - "
        "1), plus the token itself"
    )


# ---------------------------------------------------------------------------------------
# 3. Attention restricted to a set of keys per query: gather, never read the rest
# ---------------------------------------------------------------------------------------


def sparse_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Attention restricted to ``mask`` (``[Lq, Lk]`` bool), computed by gathering each row's
    allowed keys: keys a row may not attend are never read (they may hold NaN).

    Equal to dense softmax attention with the disallowed scores set to ``-inf``.
    Returns ``(out [Lq, dv], lse [Lq])``; a row that may attend nothing gets 0 and ``-inf``.
    """
    raise NotImplementedError(
        "TODO: for each row, keys = np.flatnonzero(mask[i]); softmax over k[keys] @ q[i] * "
        "scale only (never touch the other keys); empty row: out 0, lse -inf"
    )


# ---------------------------------------------------------------------------------------
# 4. LSH attention (Reformer): hash, sort, attend within the bucket
# ---------------------------------------------------------------------------------------


def lsh_buckets(x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Reformer's angular LSH: ``[n_rounds, N]`` bucket ids in ``[0, n_buckets)``.

    In round ``r`` a vector ``x`` goes to ``argmax([x R_r, -x R_r])``, where
    ``rotations [n_rounds, d, n_buckets // 2]`` (``provided.random_rotations``): vectors
    at a small angle tend to share a bucket. Scaling ``x`` by a positive number never
    changes its bucket.
    """
    raise NotImplementedError(
        "TODO: proj = x @ R_r for each round; bucket = argmax(concatenate([proj, -proj]))"
    )


def lsh_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    rotations: np.ndarray,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Query ``i`` attends the keys that share its bucket in at least one round.

    Queries and keys are hashed with the SAME rotations (``lsh_buckets``); a key found in
    several rounds counts once. Keys outside a query's buckets are never read.
    Returns ``(out [Lq, dv], lse [Lq])`` (a query whose buckets hold no key: 0 and -inf).
    """
    raise NotImplementedError(
        "TODO: hash q AND k with the same rotations; sort keys by bucket (np.argsort), take "
        "each query's bucket in each round, union them (np.unique), attend those keys only"
    )


def reformer_attention(
    qk: np.ndarray,
    v: np.ndarray,
    rotations: np.ndarray,
    chunk_size: int,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Reformer's shared-QK LSH attention with sorting and chunking.

    Keys are the queries scaled to unit length (``k_j = qk_j / |qk_j|``), so query ``j`` and
    key ``j`` always share a bucket. In each round, positions are sorted by (bucket,
    position); the sorted list is cut into chunks of ``chunk_size``; query ``i`` attends
    key ``j`` if they share the round's bucket and ``j``'s chunk is ``i``'s chunk or the one
    before it (chunk 0 has none before it). The union over rounds is attended, each key
    once (the paper's rounds merged by their log-sum-exps, duplicates counted once); no
    other key is read. As in the paper, a query never attends its own key unless that is
    its only key (its own key is almost always its best match).
    ``qk [N, d]``, ``v [N, dv]`` → ``(out [N, dv], lse [N])``.
    """
    raise NotImplementedError(
        "TODO: keys = qk / |qk|; per round: order = argsort(bucket, stable), chunk of a "
        "position = its rank // chunk_size; query i attends same-bucket keys in its chunk and "
        "the previous one, then drop its own key unless it is the only one"
    )


def lsh_mass_captured(
    q: np.ndarray, k: np.ndarray, rotations: np.ndarray, scale: float | None = None
) -> np.ndarray:
    """For each query, the fraction of its exact softmax mass that lies on the keys
    :func:`lsh_attention` attends: ``sum over those keys of softmax(q k^T scale)``.
    ``[Lq]`` in ``[0, 1]``; 1 means the buckets lost nothing.

    The two log-sum-exps say it: mass = ``exp(lse_buckets - lse_all)``.
    """
    raise NotImplementedError(
        "TODO: the mass inside the buckets is exp(lse_of_lsh_attention - "
        "lse_of_exact_attention)"
    )


def linformer_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    e: np.ndarray,
    f: np.ndarray,
    scale: float | None = None,
) -> np.ndarray:
    """Linformer: project K and V along the sequence, ``K' = E K``, ``V' = F V``
    (``e, f [rank, Lk]``), then exact attention over the ``rank`` mixed keys:
    ``softmax(q K'^T scale) V'``. ``out [Lq, dv]``; scores are ``[Lq, rank]``, never
    ``[Lq, Lk]``.
    """
    raise NotImplementedError(
        "TODO: k_proj = e @ k, v_proj = f @ v (along the sequence); then softmax(q k_proj^T * "
        "scale) v_proj"
    )


def attention_singular_values(
    q: np.ndarray, k: np.ndarray, scale: float | None = None
) -> np.ndarray:
    """The singular values of the softmax matrix ``P = softmax(q k^T scale)``
    (``[Lq, Lk]``), largest first: ``[min(Lq, Lk)]``. A fast decay is what Linformer bets on.
    """
    raise NotImplementedError(
        "TODO: P = softmax(q k^T * scale) row by row; np.linalg.svd(P, compute_uv=False)"
    )


# ---------------------------------------------------------------------------------------
# 6. Random features (Performer, FAVOR+)
# ---------------------------------------------------------------------------------------


def positive_random_features(x: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """FAVOR+'s positive random features: ``phi(x)_i = exp(w_i . x - |x|^2 / 2) / sqrt(m)``.

    ``x [N, d]``, ``omega [d, m]`` (columns ``w_i ~ N(0, I)``) → ``[N, m]``, every entry > 0.
    For ``w ~ N(0, I)``, ``E[phi(q) . phi(k)] = exp(q . k)``: an unbiased estimate of the
    softmax kernel whose weights can never be negative.
    """
    raise NotImplementedError(
        "TODO: np.exp(x @ omega - |x|^2 / 2) / sqrt(m), |x|^2 per row"
    )


def performer_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    omega: np.ndarray,
    scale: float | None = None,
) -> np.ndarray:
    """Performer attention, bidirectional: ``exp(q . k scale)`` replaced by
    ``phi(q') . phi(k')`` with ``q' = q sqrt(scale)``, ``k' = k sqrt(scale)``, computed in
    the reordered form ``phi(Q') (phi(K')^T V) / (phi(Q') (phi(K')^T 1))``:
    ``O(N m d)`` work, no ``[Lq, Lk]`` array. ``out [Lq, dv]``.
    """
    raise NotImplementedError(
        "TODO: phi_q = phi(q * sqrt(scale)), phi_k likewise; kv = phi_k.T @ v and z = "
        "phi_k.sum(0) first; out = phi_q @ kv / (phi_q @ z)"
    )


# ---------------------------------------------------------------------------------------
# 7. Linear attention as a recurrence (Katharopoulos et al.)
# ---------------------------------------------------------------------------------------


def linear_attention_parallel(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True
) -> np.ndarray:
    """Linear attention with ``phi = elu + 1`` (``provided.elu_feature_map``), the parallel
    (training) form: weight ``w_ij = phi(q_i) . phi(k_j)``, ``out_i = sum_j w_ij v_j /
    sum_j w_ij`` over ``j <= i`` when causal (then ``Lq == Lk``), over all ``j`` otherwise.
    ``out [Lq, dv]``.
    """
    raise NotImplementedError(
        "TODO: phi = provided.elu_feature_map; w = phi(q) @ phi(k).T, lower triangle (diagonal "
        "included) when causal; out = w @ v / w.sum(1); non-causal: reorder like Performer"
    )


def linear_attention_recurrent(
    q: np.ndarray, k: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Causal linear attention as an RNN: a running state
    ``S = sum_j phi(k_j) v_j^T [m, dv]`` and ``z = sum_j phi(k_j) [m]``, updated with token
    ``i`` BEFORE token ``i`` reads it (causal includes the token itself):
    ``out_i = phi(q_i) S / (phi(q_i) . z)``. Equal to ``linear_attention_parallel``.

    Returns ``(out [N, dv], S [m, dv], z [m])`` with the state after the last token
    (``m = d``, the width of ``elu + 1``).
    """
    raise NotImplementedError(
        "TODO: S [d, dv] and z [d] start at 0; for each token: S += outer(phi(k_i), v_i), z += "
        "phi(k_i) FIRST, then out_i = phi(q_i) @ S / (phi(q_i) @ z)"
    )


# ---------------------------------------------------------------------------------------
# 8. Exact, with less memory (Rabe & Staats): chunks and a running (m, l, acc)
# ---------------------------------------------------------------------------------------


def chunked_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    query_chunk: int = 64,
    key_chunk: int = 64,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention, ``query_chunk`` queries against ``key_chunk`` keys at a time, with
    the running max ``m``, denominator ``l`` and accumulator ``acc`` of each query row: the
    only score array alive is one ``[query_chunk, key_chunk]`` block, so memory is O(N).

    Returns ``(out [Lq, dv], lse [Lq])``; with no keys, 0 and ``-inf``.
    """
    raise NotImplementedError(
        "TODO: for each query chunk: m = -inf, l = 0, acc = 0; for each key chunk: scores "
        "block, m_new, alpha = exp(m - m_new), rescale l and acc, add the block; out = acc / l,"
        " lse = m + log(l)"
    )
