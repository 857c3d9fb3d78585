"""Lab 10 solution: the approximate-attention era (2019-2021), measured against exact attention.

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

import math
from collections.abc import Iterable, Sequence

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
    n = provided.non_negative_int("seq_len", seq_len)
    heads = provided.positive_int("num_heads", num_heads)
    layers = provided.positive_int("num_layers", num_layers)
    size = provided.positive_int("bytes_per_element", bytes_per_element)
    return n * n * heads * layers * size


# ---------------------------------------------------------------------------------------
# 2. Fixed sparse patterns: which (query, key) pairs are scored
# ---------------------------------------------------------------------------------------


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Query index ``i`` as a column and key index ``j`` as a row, broadcastable to [n, n]."""
    return np.arange(n)[:, None], np.arange(n)[None, :]


def strided_mask(n: int, stride: int, causal: bool = True) -> np.ndarray:
    """Sparse Transformer's strided pattern: ``[n, n]`` bool, True = query i may attend key j.

    Query ``i`` sees its ``stride`` nearest keys (``|i - j| < stride``) and every key a
    multiple of ``stride`` away (``(i - j) % stride == 0``). Causal: only keys ``j <= i``.
    """
    n = provided.non_negative_int("n", n)
    stride = provided.positive_int("stride", stride)
    i, j = _grid(n)
    mask = (np.abs(i - j) < stride) | ((i - j) % stride == 0)
    return mask & (j <= i) if causal else mask


def fixed_mask(n: int, block: int, num_summary: int = 1, causal: bool = True) -> np.ndarray:
    """Sparse Transformer's fixed pattern: ``[n, n]`` bool.

    Query ``i`` sees every key of its own block (``i // block == j // block``) and the
    last ``num_summary`` keys of every block (``j % block >= block - num_summary``), the
    "summary" columns through which blocks talk. Causal: only keys ``j <= i``.
    """
    n = provided.non_negative_int("n", n)
    block = provided.positive_int("block", block)
    num_summary = provided.non_negative_int("num_summary", num_summary)
    if num_summary > block:
        raise ValueError(f"num_summary must be at most block={block}, got {num_summary}")
    i, j = _grid(n)
    mask = (i // block == j // block) | (j % block >= block - num_summary)
    return mask & (j <= i) if causal else mask


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
    n = provided.non_negative_int("n", n)
    window = provided.positive_int("window", window)
    glob = provided.token_set("global_tokens", global_tokens, n)
    i, j = _grid(n)
    mask = (i - j < window) & (j - i < window)
    is_global = np.zeros(n, dtype=bool)
    is_global[glob] = True
    mask = mask | is_global[:, None] | is_global[None, :]  # global rows AND global columns
    return mask & (j <= i) if causal else mask


def bigbird_mask(
    n: int, window: int, global_tokens: Iterable[int], num_random: int, seed: int = 0
) -> np.ndarray:
    """BigBird's pattern: ``window_global_mask(n, window, global_tokens)`` plus, in every
    row, ``num_random`` keys drawn uniformly without replacement from the keys the row does
    not see yet (all of them when fewer remain). Bidirectional. ``[n, n]`` bool; the same
    ``seed`` gives the same mask.
    """
    num_random = provided.non_negative_int("num_random", num_random)
    mask = window_global_mask(n, window, global_tokens)
    rng = np.random.default_rng(seed)
    for i in range(len(mask)):
        unseen = np.flatnonzero(~mask[i])
        mask[i, rng.choice(unseen, size=min(num_random, unseen.size), replace=False)] = True
    return mask


def receptive_field(num_layers: int, window: int, causal: bool = True) -> int:
    """How many positions can reach a token (far from the ends) through ``num_layers``
    stacked sliding-window layers of ``window`` (the mask of :func:`window_global_mask`).

    Each causal layer reaches ``window - 1`` tokens further back: ``L * (window - 1) + 1``;
    a bidirectional layer reaches that far on both sides: ``2 * L * (window - 1) + 1``.
    """
    layers = provided.non_negative_int("num_layers", num_layers)
    window = provided.positive_int("window", window)
    reach = layers * (window - 1)  # one layer: window - 1 tokens beyond the token itself
    return reach + 1 if causal else 2 * reach + 1


# ---------------------------------------------------------------------------------------
# 3. Attention restricted to a set of keys per query: gather, never read the rest
# ---------------------------------------------------------------------------------------


def _attend_gathered(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, keys_of: Sequence[np.ndarray], scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Row ``i`` attends exactly the keys ``keys_of[i]`` (gathered: no other row of k or v
    is read). ``(out [Lq, dv], lse [Lq])``; a row with no keys gives 0 and ``-inf``."""
    out = np.zeros((len(q), v.shape[1]))
    lse = np.full(len(q), -np.inf)
    for i, keys in enumerate(keys_of):
        if keys.size == 0:
            continue
        s = (k[keys] @ q[i]) * scale  # [n_i]: only the allowed keys
        m = s.max()
        p = np.exp(s - m)
        l = p.sum()
        out[i] = (p @ v[keys]) / l
        lse[i] = m + math.log(l)
    return out, lse


def sparse_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Attention restricted to ``mask`` (``[Lq, Lk]`` bool), computed by gathering each row's
    allowed keys: keys a row may not attend are never read (they may hold NaN).

    Equal to dense softmax attention with the disallowed scores set to ``-inf``.
    Returns ``(out [Lq, dv], lse [Lq])``; a row that may attend nothing gets 0 and ``-inf``.
    """
    q, k, v = provided.check_qkv(q, k, v)
    mask = provided.check_mask(mask, len(q), len(k))
    keys_of = [np.flatnonzero(row) for row in mask]
    return _attend_gathered(q, k, v, keys_of, provided.scale_for(q.shape[1], scale))


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
    x = provided.matrix("x", x)
    rotations = provided.check_rotations(rotations, x.shape[1])
    projected = np.einsum("nd,rdb->rnb", x, rotations)  # [R, N, n_buckets // 2]
    return np.argmax(np.concatenate([projected, -projected], axis=-1), axis=-1)


def _bucket_members(buckets: np.ndarray, n_buckets: int) -> list[np.ndarray]:
    """The positions of each bucket, found by one stable sort (a bucket = a contiguous run)."""
    order = np.argsort(buckets, kind="stable")
    edges = np.searchsorted(buckets[order], np.arange(n_buckets + 1))
    return [order[edges[b] : edges[b + 1]] for b in range(n_buckets)]


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
    q, k, v = provided.check_qkv(q, k, v)
    rotations = provided.check_rotations(rotations, q.shape[1])
    n_buckets = 2 * rotations.shape[2]
    hq, hk = lsh_buckets(q, rotations), lsh_buckets(k, rotations)  # [R, Lq], [R, Lk]
    found: list[list[np.ndarray]] = [[] for _ in range(len(q))]
    for r in range(len(rotations)):
        members = _bucket_members(hk[r], n_buckets)  # keys sorted into their buckets
        for i in range(len(q)):
            found[i].append(members[hq[r, i]])
    keys_of = [np.unique(np.concatenate(lists)) for lists in found]
    return _attend_gathered(q, k, v, keys_of, provided.scale_for(q.shape[1], scale))


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
    qk, _, v = provided.check_qkv(qk, qk, v)
    chunk_size = provided.positive_int("chunk_size", chunk_size)
    rotations = provided.check_rotations(rotations, qk.shape[1])
    norms = np.linalg.norm(qk, axis=1, keepdims=True)
    keys = qk / np.where(norms > 0, norms, 1.0)  # shared QK: the key is the unit query
    buckets = lsh_buckets(qk, rotations)  # [R, N]: the same for the query and its key
    found: list[list[np.ndarray]] = [[] for _ in range(len(qk))]
    for h in buckets:
        order = np.argsort(h, kind="stable")  # sorted by (bucket, position)
        chunk = np.empty(len(qk), dtype=np.int64)
        chunk[order] = np.arange(len(qk)) // chunk_size  # chunk of each position
        for i in range(len(qk)):
            lo = max(chunk[i] - 1, 0) * chunk_size  # this chunk and the one before it
            near = order[lo : (chunk[i] + 1) * chunk_size]
            found[i].append(near[h[near] == h[i]])
    keys_of = []
    for i, lists in enumerate(found):
        union = np.unique(np.concatenate(lists))  # every round's keys, each once
        others = union[union != i]
        keys_of.append(others if others.size else union)  # itself only when alone
    return _attend_gathered(qk, keys, v, keys_of, provided.scale_for(qk.shape[1], scale))


def lsh_mass_captured(
    q: np.ndarray, k: np.ndarray, rotations: np.ndarray, scale: float | None = None
) -> np.ndarray:
    """For each query, the fraction of its exact softmax mass that lies on the keys
    :func:`lsh_attention` attends: ``sum over those keys of softmax(q k^T scale)``.
    ``[Lq]`` in ``[0, 1]``; 1 means the buckets lost nothing.

    The two log-sum-exps say it: mass = ``exp(lse_buckets - lse_all)``.
    """
    q, k, _ = provided.check_qkv(q, k, np.zeros((len(k), 1)))
    zeros = np.zeros((len(k), 1))
    _, lse_buckets = lsh_attention(q, k, zeros, rotations, scale)
    _, lse_all = chunked_attention(q, k, zeros, scale=scale)
    return np.exp(lse_buckets - lse_all)


# ---------------------------------------------------------------------------------------
# 5. Low rank (Linformer)
# ---------------------------------------------------------------------------------------


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


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
    q, k, v = provided.check_qkv(q, k, v)
    e = provided.matrix("e", e, len(k))
    f = provided.matrix("f", f, len(k))
    if len(f) != len(e):
        raise ValueError(f"e and f must have the same rank: e {e.shape}, f {f.shape}")
    k_proj, v_proj = e @ k, f @ v  # [rank, d], [rank, dv]
    scores = (q @ k_proj.T) * provided.scale_for(q.shape[1], scale)  # [Lq, rank]
    return _softmax_rows(scores) @ v_proj


def attention_singular_values(
    q: np.ndarray, k: np.ndarray, scale: float | None = None
) -> np.ndarray:
    """The singular values of the softmax matrix ``P = softmax(q k^T scale)``
    (``[Lq, Lk]``), largest first: ``[min(Lq, Lk)]``. A fast decay is what Linformer bets on.
    """
    q, k, _ = provided.check_qkv(q, k, np.zeros((len(k), 1)))
    p = _softmax_rows((q @ k.T) * provided.scale_for(q.shape[1], scale))  # [Lq, Lk]
    return np.linalg.svd(p, compute_uv=False)


# ---------------------------------------------------------------------------------------
# 6. Random features (Performer, FAVOR+)
# ---------------------------------------------------------------------------------------


def positive_random_features(x: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """FAVOR+'s positive random features: ``phi(x)_i = exp(w_i . x - |x|^2 / 2) / sqrt(m)``.

    ``x [N, d]``, ``omega [d, m]`` (columns ``w_i ~ N(0, I)``) → ``[N, m]``, every entry > 0.
    For ``w ~ N(0, I)``, ``E[phi(q) . phi(k)] = exp(q . k)``: an unbiased estimate of the
    softmax kernel whose weights can never be negative.
    """
    x = provided.matrix("x", x)
    omega = provided.matrix("omega", omega)
    if omega.shape[0] != x.shape[1]:
        raise ValueError(f"omega must be [d={x.shape[1]}, m], got {omega.shape}")
    half_sq_norm = 0.5 * (x * x).sum(axis=1, keepdims=True)  # [N, 1]
    return np.exp(x @ omega - half_sq_norm) / math.sqrt(omega.shape[1])


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
    q, k, v = provided.check_qkv(q, k, v)
    root = math.sqrt(provided.scale_for(q.shape[1], scale))
    phi_q = positive_random_features(q * root, omega)  # [Lq, m]
    phi_k = positive_random_features(k * root, omega)  # [Lk, m]
    kv = phi_k.T @ v  # [m, dv]: keys and values summarised once
    z = phi_k.sum(axis=0)  # [m]: the same for the denominator
    return (phi_q @ kv) / (phi_q @ z)[:, None]


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
    q, k, v = provided.check_qkv(q, k, v)
    phi_q, phi_k = provided.elu_feature_map(q), provided.elu_feature_map(k)
    if not causal:  # reorder: phi(Q) (phi(K)^T V), no [Lq, Lk] array
        return (phi_q @ (phi_k.T @ v)) / (phi_q @ phi_k.sum(axis=0))[:, None]
    _check_square(q, k)
    w = np.tril(phi_q @ phi_k.T)  # [N, N], the causal mask applied to the weights
    return (w @ v) / w.sum(axis=1, keepdims=True)


def _check_square(q: np.ndarray, k: np.ndarray) -> None:
    if len(q) != len(k):
        raise ValueError(f"causal linear attention needs Lq == Lk: q {q.shape}, k {k.shape}")


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
    q, k, v = provided.check_qkv(q, k, v)
    _check_square(q, k)
    phi_q, phi_k = provided.elu_feature_map(q), provided.elu_feature_map(k)
    s = np.zeros((q.shape[1], v.shape[1]))  # [m, dv]
    z = np.zeros(q.shape[1])  # [m]
    out = np.zeros((len(q), v.shape[1]))
    for i in range(len(q)):
        s += np.outer(phi_k[i], v[i])  # write token i first ...
        z += phi_k[i]
        out[i] = (phi_q[i] @ s) / (phi_q[i] @ z)  # ... then read: it sees itself
    return out, s, z


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
    q, k, v = provided.check_qkv(q, k, v)
    query_chunk = provided.positive_int("query_chunk", query_chunk)
    key_chunk = provided.positive_int("key_chunk", key_chunk)
    scale = provided.scale_for(q.shape[1], scale)
    out = np.zeros((len(q), v.shape[1]))
    lse = np.full(len(q), -np.inf)
    for q0 in range(0, len(q), query_chunk):
        rows = slice(q0, q0 + query_chunk)
        n_rows = len(q[rows])
        m = np.full(n_rows, -np.inf)
        l = np.zeros(n_rows)
        acc = np.zeros((n_rows, v.shape[1]))
        for k0 in range(0, len(k), key_chunk):
            cols = slice(k0, k0 + key_chunk)
            s = (q[rows] @ k[cols].T) * scale  # [query_chunk, key_chunk]
            m_new = np.maximum(m, s.max(axis=1))
            alpha = np.exp(m - m_new)  # rescale what was summed against the old max
            p = np.exp(s - m_new[:, None])
            l = alpha * l + p.sum(axis=1)
            acc = alpha[:, None] * acc + p @ v[cols]
            m = m_new
        if len(k):
            out[rows] = acc / l[:, None]
            lse[rows] = m + np.log(l)
    return out, lse
