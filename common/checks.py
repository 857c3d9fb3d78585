"""Input checks every paged lab shares: bad input is a ``ValueError`` naming the argument.

They read shapes only (numpy arrays and torch tensors alike), except where a value must be
read: :func:`check_block_table` for one numpy table, and :func:`host_max_seq_len`, the one
place a Triton launcher may copy ``seq_lens`` to the host, and only when the caller did not
pass ``max_seq_len`` (as vLLM's and FlashInfer's launchers take it from host metadata).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.paged import blocks_needed


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum`` (bools refused), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_seq_len(seq_len: Any, name: str = "seq_len") -> int:
    """A non-negative integer, or ``ValueError`` naming ``name``."""
    if isinstance(seq_len, bool) or int(seq_len) != seq_len or seq_len < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seq_len!r}")
    return int(seq_len)


def check_paged_cache(k_cache: Any, v_cache: Any) -> None:
    """``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads, head_dim]`` and
    agree on the first three dims (V's head dim may differ from K's)."""
    if k_cache.ndim != 4:
        raise ValueError(
            "k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(k_cache.shape)}"
        )
    if v_cache.ndim != 4 or tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        raise ValueError(
            f"v_cache shape {tuple(v_cache.shape)} does not match k_cache shape "
            f"{tuple(k_cache.shape)} in [num_blocks, block_size, num_kv_heads]"
        )


def check_heads(num_heads: int, head_dim: int, k_cache_shape: tuple[int, ...]) -> int:
    """q's heads and head dim against the cache's; returns the group size."""
    num_kv_heads, cache_head_dim = int(k_cache_shape[2]), int(k_cache_shape[3])
    if head_dim != cache_head_dim:
        raise ValueError(
            f"head_dim of q ({head_dim}) does not match the head_dim of k_cache "
            f"({cache_head_dim}, shape {tuple(k_cache_shape)})"
        )
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads={num_heads} (from q) is not a multiple of num_kv_heads={num_kv_heads} "
            "(from k_cache)"
        )
    return num_heads // num_kv_heads


def check_block_table(
    block_table: np.ndarray, seq_len: int, block_size: int, num_blocks: int,
    name: str = "block_table", first: int = 0,
) -> None:
    """Entries ``first .. ceil(seq_len / block_size) - 1`` must name real physical blocks.

    ``first > 0``: the blocks before it fell out of a sliding window and may be anything
    (``-1``, a freed block), as vLLM's sliding-window manager frees them.
    """
    block_table = np.asarray(block_table)
    if block_table.ndim != 1:
        raise ValueError(f"{name} must be 1-D [max_blocks], got shape {block_table.shape}")
    needed = blocks_needed(seq_len, block_size)
    if len(block_table) < needed:
        raise ValueError(
            f"{name} has {len(block_table)} entries but seq_len={seq_len} needs {needed} "
            f"blocks of {block_size} tokens"
        )
    used = block_table[first:needed]
    bad = np.flatnonzero((used < 0) | (used >= num_blocks))
    if bad.size:
        i = first + int(bad[0])
        why = ("but the window reads it" if first else
               "only entries past the last needed block may be padding")
        raise ValueError(
            f"{name}[{i}] = {int(block_table[i])} is not a physical block (the cache has "
            f"{num_blocks} blocks); {why}"
        )


def check_decode_inputs(
    q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_len: Any,
    window: int | None = None,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(q, block_table, seq_len, group)`` for one sequence's decode step: ``q`` is
    ``[num_heads, head_dim]``, ``group = num_heads // num_kv_heads``. With a ``window``, only
    the blocks from the one holding position ``seq_len - window`` on must be real."""
    q = np.asarray(q)
    if q.ndim != 2:
        raise ValueError(f"q must be [num_heads, head_dim], got shape {q.shape}")
    check_paged_cache(k_cache, v_cache)
    group = check_heads(q.shape[0], q.shape[1], k_cache.shape)
    seq_len = check_seq_len(seq_len)
    block_table = np.asarray(block_table)
    num_blocks, block_size = k_cache.shape[:2]
    first = 0 if window is None else max(seq_len - window, 0) // block_size
    check_block_table(block_table, seq_len, block_size, num_blocks, first=first)
    return q, block_table, seq_len, group


def check_paged_batch(
    q: Any, k_cache: Any, v_cache: Any, block_tables: Any, seq_lens: Any
) -> int:
    """Shapes of a batched paged-decode call (q ``[B, H, d]``); returns the group size.

    Reads no values, so it costs no host synchronisation.
    """
    if q.ndim != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {tuple(q.shape)}")
    check_paged_cache(k_cache, v_cache)
    batch, num_heads, head_dim = (int(s) for s in q.shape)
    group = check_heads(num_heads, head_dim, tuple(k_cache.shape))
    if block_tables.ndim != 2 or int(block_tables.shape[0]) != batch:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be [batch={batch}], got shape {tuple(seq_lens.shape)}")
    return group


def host_max_seq_len(
    seq_lens: Any, block_tables: Any, block_size: int, max_seq_len: int | None = None
) -> int:
    """The longest sequence, from the caller (no sync) or from one copy of ``seq_lens``.

    With ``max_seq_len`` given, only host-known facts are checked (it is a non-negative int
    that fits the table's width). Without it, ``seq_lens`` is copied to the host once, which
    also lets the lengths themselves be validated: the debug path.
    """
    if max_seq_len is None:
        lens = np.asarray(seq_lens.detach().cpu() if hasattr(seq_lens, "detach") else seq_lens)
        if lens.size and int(lens.min()) < 0:
            raise ValueError(f"seq_lens must be >= 0, got {lens.tolist()}")
        max_seq_len = int(lens.max()) if lens.size else 0
    else:
        max_seq_len = check_seq_len(max_seq_len, "max_seq_len")
    needed = blocks_needed(max_seq_len, block_size)
    if needed > int(block_tables.shape[1]):
        raise ValueError(
            f"block_tables has {int(block_tables.shape[1])} columns but a sequence of "
            f"{max_seq_len} tokens needs {needed} blocks of {block_size}"
        )
    return max_seq_len
