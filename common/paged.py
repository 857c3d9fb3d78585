"""Paged KV-cache builders shared by every paged lab (01, 03, 04) and instructors' tests.

Layout (FlashAttention/FlashInfer "NHD"): ``k_cache, v_cache [num_blocks, block_size,
num_kv_heads, head_dim]``; token ``t`` of sequence ``b`` lives at
``cache[block_tables[b, t // block_size], t % block_size]``.

The builders are hostile on purpose, so a wrong loop bound shows up as NaN:
physical blocks are shuffled (never ``0, 1, 2, ...``), every slot past a sequence's
length, every block no table references and (optionally) the padding entries of a table
point at NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class PagedKV:
    """A paged cache holding a batch of sequences.

    Attributes:
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[batch, max_blocks_per_seq]`` int32; padding entries hold
            ``-1`` or the number of a poisoned block.
        seq_lens: ``[batch]`` int64.
        block_size: tokens per block.
        unused_blocks: physical blocks no table references (all NaN).
    """

    k_cache: np.ndarray
    v_cache: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    block_size: int
    unused_blocks: np.ndarray

    @property
    def num_blocks(self) -> int:
        return int(self.k_cache.shape[0])

    def to_torch(self, dtype: Any = None, device: Any = "cpu") -> dict[str, Any]:
        """The same cache as torch tensors (caches in ``dtype``, tables int32, lens int32)."""
        import torch

        dtype = dtype or torch.float32
        return {
            "k_cache": torch.tensor(self.k_cache, dtype=dtype, device=device),
            "v_cache": torch.tensor(self.v_cache, dtype=dtype, device=device),
            "block_tables": torch.tensor(self.block_tables, dtype=torch.int32, device=device),
            "seq_lens": torch.tensor(self.seq_lens, dtype=torch.int32, device=device),
        }


def blocks_needed(seq_len: int, block_size: int) -> int:
    """``ceil(seq_len / block_size)``: the blocks a sequence of ``seq_len`` tokens occupies."""
    return -(-int(seq_len) // int(block_size))


def build_paged_kv(ks: list[np.ndarray], vs: list[np.ndarray], block_size: int, *,
                   rng: np.random.Generator | int | None = 0, extra_blocks: int = 2,
                   extra_table_entries: int = 1, padding: str = "minus_one", shuffle: bool = True,
                   share_blocks: bool = False) -> PagedKV:
    """Scatter dense per-sequence K/V into a shuffled, NaN-poisoned paged cache.

    Args:
        ks, vs: one ``[seq_len_b, num_kv_heads, head_dim]`` array per sequence (lengths
            may differ, including 0; K and V head dims may differ).
        block_size: tokens per block (>= 1).
        rng: seed or generator for the physical-block shuffle.
        extra_blocks: NaN blocks that no table references.
        extra_table_entries: padding columns beyond the longest sequence's blocks.
        padding: ``"minus_one"`` (padding entries are -1) or ``"poisoned"`` (they name an
            unreferenced, all-NaN block; needs ``extra_blocks >= 1``).
        shuffle: False keeps physical == logical order (only for pictures).
        share_blocks: a full block whose K and V equal those of a full block already placed
            at the same logical index (a shared prompt prefix, see
            :func:`random_kv_shared_prefix`) reuses that physical block, as prefix caching
            does: several tables then name the same physical block.
    """
    _check_build_args(ks, vs, block_size, padding, extra_blocks)
    rng = np.random.default_rng(rng)
    ks = [np.asarray(k) for k in ks]
    vs = [np.asarray(v) for v in vs]
    kvh, dk = ks[0].shape[1:]
    dv = vs[0].shape[2]
    dtype = np.result_type(*ks, *vs, np.float32)

    seq_lens = np.array([k.shape[0] for k in ks], dtype=np.int64)
    per_seq = [blocks_needed(n, block_size) for n in seq_lens]
    owner = _shared_blocks(ks, vs, block_size) if share_blocks else {}
    used = int(sum(per_seq)) - len(owner)
    num_blocks = used + extra_blocks
    physical = rng.permutation(num_blocks) if shuffle else np.arange(num_blocks)
    unused = np.sort(physical[used:])

    k_cache = np.full((num_blocks, block_size, kvh, dk), np.nan, dtype=dtype)
    v_cache = np.full((num_blocks, block_size, kvh, dv), np.nan, dtype=dtype)
    max_blocks = max(per_seq, default=0) + extra_table_entries
    pad = -1 if padding == "minus_one" else int(unused[0])
    block_tables = np.full((len(ks), max(max_blocks, 1)), pad, dtype=np.int32)

    cache = PagedKV(k_cache, v_cache, block_tables, seq_lens, block_size, unused)
    _scatter(cache, ks, vs, physical, owner)
    return cache


def _check_build_args(
    ks: list[np.ndarray], vs: list[np.ndarray], block_size: int, padding: str, extra_blocks: int
) -> None:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if len(ks) != len(vs):
        raise ValueError(f"ks and vs must have the same length, got {len(ks)} and {len(vs)}")
    if padding not in ("minus_one", "poisoned"):
        raise ValueError(f"padding must be 'minus_one' or 'poisoned', got {padding!r}")
    if padding == "poisoned" and extra_blocks < 1:
        raise ValueError("padding='poisoned' needs extra_blocks >= 1")


def _scatter(cache: PagedKV, ks: list[np.ndarray], vs: list[np.ndarray], physical: np.ndarray,
             owner: dict[tuple[int, int], tuple[int, int]]) -> None:
    """Fill ``cache``'s tables and blocks: logical blocks take ``physical`` blocks in order,
    except shared ones (``owner``), which reuse the earlier sequence's physical block."""
    block_size, block_tables = cache.block_size, cache.block_tables
    cursor = 0
    for b, (k, v) in enumerate(zip(ks, vs)):
        for logical in range(blocks_needed(len(k), block_size)):
            if (b, logical) in owner:  # the same full block as an earlier sequence's
                block_tables[b, logical] = block_tables[owner[b, logical]]
                continue
            block = int(physical[cursor])
            cursor += 1
            block_tables[b, logical] = block
            lo = logical * block_size
            hi = min(lo + block_size, len(k))
            cache.k_cache[block, : hi - lo] = k[lo:hi]
            cache.v_cache[block, : hi - lo] = v[lo:hi]


def _shared_blocks(
    ks: list[np.ndarray], vs: list[np.ndarray], block_size: int
) -> dict[tuple[int, int], tuple[int, int]]:
    """``(b, logical) -> (earlier b, logical)`` for full blocks equal to an earlier one."""
    first: dict[tuple[int, bytes, bytes], int] = {}
    owner: dict[tuple[int, int], tuple[int, int]] = {}
    for b, (k, v) in enumerate(zip(ks, vs)):
        for logical in range(len(k) // block_size):
            hi = (logical + 1) * block_size
            key = (logical, k[:hi].tobytes(), v[:hi].tobytes())  # the block and its prefix
            if key in first:
                owner[b, logical] = (first[key], logical)
            else:
                first[key] = b
    return owner


def random_kv_shared_prefix(rng: np.random.Generator, seq_lens: list[int], prefix_len: int,
                            num_kv_heads: int, head_dim: int
                            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Like :func:`random_kv`, but every sequence starts with the same ``prefix_len`` tokens
    (a shared system prompt); build with ``share_blocks=True`` to share their full blocks."""
    ks, vs = random_kv(rng, seq_lens, num_kv_heads, head_dim)
    longest = max(seq_lens, default=0)
    pk, pv = random_kv(rng, [min(prefix_len, longest)], num_kv_heads, head_dim)
    for k, v in zip(ks, vs):
        n = min(prefix_len, len(k))
        k[:n], v[:n] = pk[0][:n], pv[0][:n]
    return ks, vs


def random_kv(rng: np.random.Generator, seq_lens: list[int], num_kv_heads: int, head_dim: int,
              head_dim_v: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Standard-normal dense K/V per sequence: ``[seq_len_b, num_kv_heads, head_dim]``."""
    dv = head_dim if head_dim_v is None else head_dim_v
    ks = [rng.standard_normal((n, num_kv_heads, head_dim)) for n in seq_lens]
    vs = [rng.standard_normal((n, num_kv_heads, dv)) for n in seq_lens]
    return ks, vs


def random_paged_decode(rng: np.random.Generator, seq_lens: list[int], num_heads: int,
                        num_kv_heads: int, head_dim: int, block_size: int, *,
                        padding: str = "poisoned", shared_prefix: int = 0
                        ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], PagedKV]:
    """A random decode step over a paged cache: ``(q [B, H, d], ks, vs, paged)``.

    ``ks, vs``: dense ``[seq_len_b, num_kv_heads, head_dim]`` per sequence (the reference's
    input); ``paged``: the same K/V in shuffled, poisoned blocks. With ``shared_prefix``
    tokens every sequence starts with the same prompt and shares its full blocks physically.
    """
    if shared_prefix:
        ks, vs = random_kv_shared_prefix(rng, seq_lens, shared_prefix, num_kv_heads, head_dim)
    else:
        ks, vs = random_kv(rng, seq_lens, num_kv_heads, head_dim)
    paged = build_paged_kv(ks, vs, block_size, rng=rng, padding=padding,
                           share_blocks=bool(shared_prefix))
    q = rng.standard_normal((len(seq_lens), num_heads, head_dim))  # [B, H, d]
    return q, ks, vs, paged


def zero_paged_decode_torch(device: Any, num_heads: int = 2, head_dim: int = 16,
                            lens: tuple[int, ...] = (5,), max_blocks: int = 2, dtype: Any = None
                            ) -> tuple[Any, Any, Any, Any, Any]:
    """Tiny all-zero torch decode inputs for bad-input tests: ``(q [B, H, d], k_cache,
    v_cache [4, 4, 2, 16], block_tables [B, max_blocks], seq_lens [B])``; q and the caches
    in ``dtype`` (None: torch's default).

    ``block_tables`` is a view into a wider table: a launcher that forgets to check its
    width reads zeros (a real block) past ``max_blocks`` instead of memory outside the tensor.
    """
    import torch

    k_cache = torch.zeros(4, 4, 2, 16, device=device, dtype=dtype)
    q = torch.zeros(len(lens), num_heads, head_dim, device=device, dtype=dtype)
    tables = torch.zeros(len(lens), max_blocks + 8, dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k_cache, k_cache.clone(), tables[:, :max_blocks], seq_lens
