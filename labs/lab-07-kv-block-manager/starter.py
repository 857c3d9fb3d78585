"""Lab 07 starter: the KV block manager behind a block table.

Your work goes in the methods and functions that raise ``NotImplementedError``; each hint
says the idea, and the README has a worked example to check yourself against. Run the spec:

    LAB_IMPL=starter pytest labs/lab-07-kv-block-manager -q

Suggested order: ``BlockPool`` (allocate, free, touch, the hash maps), ``hash_block``,
``KVCacheManager`` (get_computed_blocks, allocate_slots, free, block_table, num_tokens,
slot_mapping, then fork and take_copies), ``simulate``, ``simulate_contiguous``.

    Request(request_id, token_ids, extra_keys=())   every token known so far
    block_table(request)[i]                         physical block of logical block i
    slot of position p                              block_table[p // block_size] * block_size
                                                    + p % block_size

The types, the input checks, the workload generator and the step loop of the simulations
are given in ``provided.py``: call the check each hint names first.
"""

from __future__ import annotations

import hashlib  # noqa: F401  (hash_block)
import pickle  # noqa: F401  (hash_block)
from collections import Counter, OrderedDict, deque  # noqa: F401
from typing import Any

import numpy as np  # noqa: F401  (slot_mapping)

from common.loader import load_lab_module

provided = load_lab_module(__file__, "provided")
BlockCopy = provided.BlockCopy
NoFreeBlocks = provided.NoFreeBlocks
Request = provided.Request
SimRequest = provided.SimRequest
Stats = provided.Stats


# ---- 1. the block pool ----------------------------------------------------------------------


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` slots, with reference counts, a free queue in
    eviction order and a map from block hash to cached block (vLLM: ``BlockPool`` in
    vllm/v1/core/block_pool.py).

    The free queue starts as ``[0, 1, ..., num_blocks - 1]``. ``allocate`` takes blocks from
    its head. A block whose count drops to 0 rejoins it: at the head if it has no hash
    (nothing to keep, reuse it first), at the tail if it has one (cached: least recently
    used is evicted first). A free cached block stays findable by its hash until
    ``allocate`` hands it out again, which drops the hash.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    @property
    def num_blocks(self) -> int:
        """How many blocks the pool has."""
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    @property
    def block_size(self) -> int:
        """How many token slots a block has."""
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    @property
    def num_free_blocks(self) -> int:
        """Blocks with reference count 0 (cached ones included: they can be evicted)."""
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    def free_block_ids(self) -> list[int]:
        """The free queue, the next block ``allocate`` hands out first."""
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold ``block_id``."""
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue (count 1 each; a cached block
        loses its hash: it is evicted). ``NoFreeBlocks`` if fewer than ``n`` are free."""
        raise NotImplementedError(
            "TODO: a block is free exactly when its reference count is 0 (HINTS.md step 1: make "
            "hint LAB=07 STEP=1 LEVEL=1)"
        )

    def touch(self, block_ids: list[int]) -> None:
        """One more reference to each block; a free (cached) block leaves the free queue."""
        raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=07 STEP=1 LEVEL=1)")

    def free(self, block_ids: list[int]) -> None:
        """One reference fewer to each block, in the order given. A block reaching 0 joins
        the free queue: at the head without a hash, at the tail with one (in that order)."""
        raise NotImplementedError(
            "TODO: a block returns to the free queue only when its last reference goes (HINTS.md "
            "step 1: make hint LAB=07 STEP=1 LEVEL=1)"
        )

    def cache_block(self, block_id: int, block_hash: bytes) -> bool:
        """Make a full, owned block findable by ``block_hash``. False (and nothing changes)
        if another block already holds that hash: the first one stays the cached copy."""
        raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=07 STEP=2 LEVEL=1)")

    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The block cached under ``block_hash`` (owned or free), or None."""
        raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=07 STEP=2 LEVEL=1)")

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash ``block_id`` is cached under, or None."""
        raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=07 STEP=2 LEVEL=1)")


# ---- 2. chained block hashes ----------------------------------------------------------------


def hash_block(parent_hash: bytes | None, token_ids: Any, extra_keys: tuple = ()) -> bytes:
    """The identity of a full block: SHA-256 over (parent hash, its tokens, extra keys).

    ``parent_hash`` is the previous block's hash (None for the first block, which then uses
    ``NONE_HASH``), so a block's hash covers every token before it as well as its own.
    """
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=07 STEP=2 LEVEL=1)")


# ---- 3. the cache manager -------------------------------------------------------------------


class KVCacheManager:
    """Who owns which block: one block table per request over a shared ``BlockPool``
    (vLLM: ``KVCacheManager`` in vllm/v1/core/kv_cache_manager.py).

    A request's tokens ``[0, num_tokens(request))`` have slots. Its full blocks are cached
    under their chained hashes (only with ``enable_prefix_caching``), so a later request
    with the same prefix reuses them instead of recomputing their K/V.
    """

    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True) -> None:
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    @property
    def request_ids(self) -> list[str]:
        """The requests that hold blocks, in the order they were admitted."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest cached prefix of full blocks: ``(block_ids, num_computed_tokens)``.

        At most ``num_tokens - 1`` tokens: the last prompt token is always recomputed (its
        forward pass gives the logits of the next token), so a full hit still computes one
        token, and with whole blocks, recomputes the whole last block.
        """
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Slots for the next ``num_new_tokens`` tokens of ``request``; the new block ids
        (a copy-on-write copy first), or None, changing nothing, if the pool cannot serve.

        A request not yet held starts from its longest cached prefix (as
        ``get_computed_blocks`` reports it) and ``num_new_tokens`` counts the tokens after it.
        """
        raise NotImplementedError(
            "TODO: all or nothing: when it returns None, nothing changed (HINTS.md step 3: make "
            "hint LAB=07 STEP=3 LEVEL=1)"
        )

    def take_copies(self) -> list[BlockCopy]:
        """The copy-on-writes ``allocate_slots`` decided since the last call (then cleared).
        Perform them (copy every slot of src into dst) before writing the new tokens."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def free(self, request: Request | str) -> None:
        """Release every block of ``request``, tail first, so that its tail blocks are
        evicted before the head blocks other requests are more likely to share."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def fork(self, request: Request, new_id: str) -> Request:
        """A new request ``new_id`` sharing every block of ``request`` (reference counts + 1);
        the first write into a shared partial block copies it (see ``allocate_slots``)."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def block_table(self, request: Request | str) -> list[int]:
        """The physical block of each logical block of ``request``."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def num_tokens(self, request: Request | str) -> int:
        """How many tokens of ``request`` have slots."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")

    def slot_mapping(self, request: Request | str, positions: Any) -> np.ndarray:
        """``block_table[p // block_size] * block_size + p % block_size`` per position."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=07 STEP=3 LEVEL=1)")


# ---- 4. the scheduler simulation ------------------------------------------------------------


def simulate(
    requests: list, num_blocks: int, block_size: int, max_num_seqs: int,
    *, enable_prefix_caching: bool = True,
) -> Stats:
    """Continuous batching over a paged KV cache with recompute preemption.

    ``requests``: ``(arrival, prompt_tokens, output_len)`` items. Each step: arrivals join the
    waiting queue; every running request gets a slot for its next token, preempting the
    newest running request while the pool cannot serve (its blocks are freed, it goes back
    to the head of the waiting queue and will recompute); if nobody was preempted, waiting
    requests are admitted in order (whole prompt minus the cached prefix) while they fit
    and fewer than ``max_num_seqs`` run; the step is recorded; each running request then
    samples one token and finishes after ``output_len`` of them.
    """
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=07 STEP=4 LEVEL=1)")


def simulate_contiguous(
    requests: list, num_blocks: int, block_size: int, max_num_seqs: int, max_model_len: int,
) -> Stats:
    """The pre-paging baseline: each admitted request reserves ``max_model_len`` contiguous
    slots of the ``num_blocks * block_size`` and keeps them until it finishes, so at most
    ``total_slots // max_model_len`` requests run at once. Same steps as ``simulate``;
    waiting requests are admitted in order while a reservation fits; nothing is ever
    preempted (a reservation covers the longest possible request); no prefix cache."""
    raise NotImplementedError("TODO: HINTS.md step 4 (make hint LAB=07 STEP=4 LEVEL=1)")
