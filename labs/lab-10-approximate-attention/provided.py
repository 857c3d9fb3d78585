"""Lab 10, given code: written once, imported by ``starter.py`` and the reference.

    provided = load_lab_module(__file__, "provided")

* input checks, so every function fails the same readable way (``ValueError`` naming the
  argument);
* the random matrices each method draws (LSH rotations, Linformer projections, Performer
  features), pinned to a seed so a run is reproducible;
* the feature map of linear attention (``elu(x) + 1``);
* the synthetic retrieval task the README measures every method on.

Nothing here is an exercise; read it, then write the functions of ``starter.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from common.checks import positive_int as positive_int  # given: ValueError naming the argument


def non_negative_int(name: str, value: Any) -> int:
    """``value`` as an int ``>= 0``, else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def matrix(name: str, x: Any, cols: int | None = None) -> np.ndarray:
    """``x`` as a 2-D float64 array (``[rows, cols]``), else ``ValueError`` naming ``name``."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, dim], got shape {x.shape}")
    if cols is not None and x.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {x.shape}")
    return x


def check_qkv(q: Any, k: Any, v: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q ``[Lq, d]``, k ``[Lk, d]``, v ``[Lk, dv]`` as float64, or ``ValueError``."""
    q = matrix("q", q)
    k = matrix("k", k, q.shape[1])
    v = matrix("v", v)
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"v must have one row per key ({k.shape[0]}), got shape {v.shape}")
    return q, k, v


def check_mask(mask: Any, num_queries: int, num_keys: int) -> np.ndarray:
    """A boolean ``[num_queries, num_keys]`` mask (True = may attend), or ``ValueError``."""
    mask = np.asarray(mask)
    if mask.shape != (num_queries, num_keys) or mask.dtype != np.bool_:
        raise ValueError(
            f"mask must be a bool array of shape ({num_queries}, {num_keys}), got "
            f"{mask.dtype} {mask.shape}"
        )
    return mask


def check_rotations(rotations: Any, head_dim: int) -> np.ndarray:
    """``[n_rounds, head_dim, n_buckets // 2]`` float64, or ``ValueError``."""
    r = np.asarray(rotations, dtype=np.float64)
    if r.ndim != 3 or r.shape[1] != head_dim or r.shape[0] < 1 or r.shape[2] < 1:
        raise ValueError(
            f"rotations must be [n_rounds, head_dim={head_dim}, n_buckets // 2], got {r.shape}"
        )
    return r


def token_set(name: str, tokens: Iterable[int], n: int) -> np.ndarray:
    """Distinct token positions in ``[0, n)`` as a sorted int array, or ``ValueError``."""
    t = np.unique(np.asarray(list(tokens), dtype=np.int64))
    if t.size and (t[0] < 0 or t[-1] >= n):
        raise ValueError(f"{name} must lie in [0, {n}), got {t.tolist()}")
    return t


def scale_for(head_dim: int, scale: float | None) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` unless one is given."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


# ---------------------------------------------------------------------------------------
# The random matrices each method draws (seeded: the same seed gives the same matrix)
# ---------------------------------------------------------------------------------------


def random_rotations(head_dim: int, n_buckets: int, n_rounds: int = 1, seed: int = 0) -> np.ndarray:
    """Reformer's random rotations, one per hashing round: ``[n_rounds, head_dim, n_buckets // 2]``.

    A vector ``x`` falls in bucket ``argmax([x R, -x R])`` of a round (``n_buckets`` even).
    Gaussian entries: the direction of ``x R`` is a random projection of ``x``'s direction.
    """
    if n_buckets < 2 or n_buckets % 2:
        raise ValueError(f"n_buckets must be an even integer >= 2, got {n_buckets!r}")
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n_rounds, head_dim, n_buckets // 2))


def linformer_projection(rank: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """A random ``[rank, seq_len]`` projection along the sequence, entries ``N(0, 1/rank)``.

    Linformer learns E and F; a Gaussian matrix is the Johnson-Lindenstrauss choice its
    analysis uses, and what this lab measures.
    """
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rank, seq_len)) / math.sqrt(rank)


def mean_pooling_projection(rank: int, seq_len: int) -> np.ndarray:
    """A ``[rank, seq_len]`` projection whose row ``r`` averages the ``r``-th of ``rank``
    (nearly) equal segments of the sequence: ``E K`` is ``rank`` segment-mean keys. One of
    the fixed projections the Linformer paper compares with learned ones; with
    ``rank == seq_len`` it is the identity (nothing lost)."""
    edges = np.linspace(0, seq_len, rank + 1).round().astype(int)
    e = np.zeros((rank, seq_len))
    for r in range(rank):
        e[r, edges[r] : edges[r + 1]] = 1.0 / max(edges[r + 1] - edges[r], 1)
    return e


def performer_omega(head_dim: int, num_features: int, seed: int = 0) -> np.ndarray:
    """``[head_dim, num_features]`` i.i.d. ``N(0, 1)`` feature directions (FAVOR+ also offers
    orthogonal ones, which lower the variance further; this lab keeps i.i.d.)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((head_dim, num_features))


def elu_feature_map(x: np.ndarray) -> np.ndarray:
    """Linear attention's feature map ``elu(x) + 1`` (Katharopoulos et al.): positive, so
    every weight ``phi(q) . phi(k)`` is positive. Same shape as ``x``."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


# ---------------------------------------------------------------------------------------
# The synthetic retrieval task
# ---------------------------------------------------------------------------------------


def retrieval_task(
    seq_len: int, head_dim: int = 16, seed: int = 0, strength: float = 4.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A copy task: the last query must find one key planted at the start of the sequence.

    Every token gets random q, k, v (``N(0, 1)`` entries). Then the key at position
    ``target = seq_len // 8`` is set to ``2 sqrt(d) u`` and the last query to
    ``strength sqrt(d) u`` (``u`` a unit vector): their scaled score is ``2 strength sqrt(d)``
    (32 at d = 16), far above every other key's (about ``strength * N(0, 1)``), so the exact
    answer of the last row is (almost exactly) ``v[target]``: a far-back lookup, what
    retrieval-heavy tasks ask of attention. Returns ``(q [N, d], k [N, d], v [N, d], target)``.
    """
    positive_int("seq_len", seq_len, minimum=8)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((seq_len, head_dim)) for _ in range(3))
    target = seq_len // 8
    u = k[target] / np.linalg.norm(k[target])
    k[target] = 2.0 * math.sqrt(head_dim) * u
    q[-1] = strength * math.sqrt(head_dim) * u
    return q, k, v, target
