"""Lab 07 spec: the KV block manager behind a block table.

The tests touch your code only through ``impl.BlockPool(...)``, ``impl.KVCacheManager(...)``,
``impl.hash_block``, ``impl.simulate`` and ``impl.simulate_contiguous`` and the public methods
of the objects they return; requests are ``provided.Request`` values. Every attention value
comes from the dense float64 reference in ``common.reference``; the paged caches start as NaN,
so a block table that points at a slot nobody wrote shows up as NaN.

Run:  LAB_IMPL=starter pytest labs/lab-07-kv-block-manager -q   (grades starter.py)
"""

from __future__ import annotations

import functools
import math
import zlib
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from common.loader import load_impl, load_lab_module
from common.reference import reference_attention
from common.testing import (
    BadInputs,
    Earlier,
    assert_close,
    bad_input_test,
    call_all,
    called_on_copies,
    raised_as,
)

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))
provided = load_lab_module(__file__, "provided")
Request = provided.Request
BlockCopy = provided.BlockCopy

# ---- the misconceptions, as the failure messages name them ---------------------------------

PREFIX_HASH = (
    "hashing a block without its prefix: a block's identity is its tokens AND everything "
    "before them (the parent hash). The same tokens after a different prefix have different "
    "K/V, because every token attends to all the tokens before it"
)
PARTIAL_CACHED = (
    "caching a partial block: only full blocks get a hash. A partial block is still being "
    "filled; a request that hit it would write its next token into a block someone else owns"
)
EVICT_IN_USE = (
    "evicting a block still in use: a block with a reference count > 0 must not sit in the "
    "free queue. A prefix hit on a free cached block takes it out of the queue (touch) before "
    "anything is allocated"
)
LAST_TOKEN = (
    "reusing the last prompt token's block without recompute: a hit covers at most "
    "num_tokens - 1 tokens in whole blocks, so the last prompt token is always computed (its "
    "forward pass gives the logits of the next token); a full hit recomputes the last block"
)
SHARED_WRITE = (
    "writing into a shared block: a block with reference count > 1 is read-only. The first "
    "write into a shared partial block copies it (copy-on-write, a BlockCopy in "
    "take_copies()) and writes into the copy"
)
NONE_CHANGED = (
    "allocate_slots returned None but changed the pool or the manager: check that the pool "
    "can serve the request first; only then touch the hits and allocate"
)
IDS_ARE_THE_RUNNING = (
    "request_ids must be the requests admitted and not yet freed: a request that allocate_slots "
    "refused (it returned None) is not one, and free(request_id) removes it"
)
EVICTION_ORDER = (
    "the free queue is in eviction order: a freed request's blocks are released tail first; "
    "those without a hash go to the head (nothing to keep: reused first), those with a hash to "
    "the tail (least recently used is evicted first)"
)


# ---- helpers ---------------------------------------------------------------------------------


def free_queue_message(pool, partial_blocks, expected=None) -> str:
    """Why the free queue is not in eviction order: a partial block that got a hash is freed
    to the tail like a cached one (caching a partial block), or else the order itself."""
    got = pool.free_block_ids()
    want = "" if expected is None else f", expected {expected}"
    cached = [b for b in partial_blocks if pool.block_hash(b) is not None]
    if cached:
        return (f"free queue {got}{want}: the partial block(s) {cached} have a hash, so they "
                f"were freed to the tail like cached blocks: {PARTIAL_CACHED}")
    return f"free queue {got}{want}: {EVICTION_ORDER}"


def snapshot_calls(pool, manager, n: int, ids) -> list:
    """The calls that read everything observable about the pool of ``n`` blocks (and the
    manager's requests ``ids``), for one ``call_all``; :func:`snapshot_of` reads the answers."""
    calls = [(pool.free_block_ids, ()), *((pool.ref_count, (b,)) for b in range(n)),
             *((pool.block_hash, (b,)) for b in range(n))]
    if manager is not None:
        calls += [*((manager.block_table, (r,)) for r in ids),
                  *((manager.num_tokens, (r,)) for r in ids)]
    return calls


def snapshot_of(got: list, n: int, ids) -> tuple:
    """``(free queue, ref counts, hashes[, ids, block tables, token counts])`` from the
    answers of :func:`snapshot_calls`."""
    state = (got[0], got[1:n + 1], got[n + 1:2 * n + 1])
    if ids is not None:
        r = len(ids)
        state += (ids, got[2 * n + 1:2 * n + 1 + r], got[2 * n + 1 + r:2 * n + 1 + 2 * r])
    return state


def snapshot(pool, manager=None, num_blocks=None) -> tuple:
    """Everything observable about the pool (and manager): to check that nothing changed.
    ``num_blocks``: the pool's size, when the caller knows it (one attribute read less)."""
    n = pool.num_blocks if num_blocks is None else num_blocks
    ids = manager.request_ids if manager is not None else None
    return snapshot_of(call_all(snapshot_calls(pool, manager, n, ids)), n, ids)


def admit(manager, request):
    """``(hit_blocks, num_hit_tokens, new_blocks)``: a new request through the manager."""
    hit_blocks, num_hit = manager.get_computed_blocks(request)
    new_blocks = manager.allocate_slots(request, request.num_tokens - num_hit)
    return hit_blocks, num_hit, new_blocks


def pool_and_manager(num_blocks: int, block_size: int) -> tuple:
    """``(BlockPool(num_blocks, block_size), KVCacheManager(that pool))``, in one batch."""
    return tuple(call_all([(impl.BlockPool, (num_blocks, block_size)),
                           (impl.KVCacheManager, (Earlier(0),))]))


def manager_with(*requests, **manager_kwargs):
    """``(pool, manager)``: a pool of 8 blocks of 4 tokens, a manager on it (``manager_kwargs``)
    and ``requests`` admitted in order."""
    pool = impl.BlockPool(8, 4)
    manager = impl.KVCacheManager(pool, **manager_kwargs)
    for request in requests:
        admit(manager, request)
    return pool, manager


def chain(tokens, block_size, extra_keys=(), memo=None):
    """The chained hashes of the full blocks of ``tokens`` (with your ``hash_block``).
    ``memo`` (a dict): the hashes already asked for, by ``(parent, block tokens)``, so that a
    machine that checks the same requests after every step asks for each block once."""
    plan = HashPlan([tokens], block_size, extra_keys, memo)  # the new hashes in one batch
    return plan.hashes(call_all(plan.calls))[0]


class HashPlan:
    """The ``hash_block`` calls that :func:`chain` needs for each of ``token_lists``, to go
    at position ``offset`` of a batch: a block's parent hash is the answer of the call before
    it (``Earlier``); ``refs[n][i]``, the hash of block ``i`` of list ``n``, is a value the
    memo knew or ``Earlier`` (a batch step's argument); :meth:`hashes` fills them in."""

    def __init__(self, token_lists, block_size, extra_keys=(), memo=None, offset=0):
        self.memo, self.keys, self.offset = memo, extra_keys, offset
        self.calls, self.asked, self.refs = [], [], []  # asked: (list, i, parent, tokens)
        for tokens in token_lists:
            refs, parent = [], None  # parent: a hash, or the Earlier call that answers it
            for i in range(len(tokens) // block_size):
                block = tokens[i * block_size:(i + 1) * block_size]
                known = _MISSING if type(parent) is Earlier else _memo_get(
                    memo, (parent, tuple(block), tuple(extra_keys)))
                if known is _MISSING:
                    self.calls.append((impl.hash_block, (parent, block, extra_keys)))
                    self.asked.append((len(self.refs), i, parent, block))
                    known = Earlier(offset + len(self.calls) - 1)
                refs.append(known)
                parent = known
            self.refs.append(refs)

    def hashes(self, got):
        """The hashes of every list, from the answers ``got`` of :attr:`calls` (the memo
        learns them)."""
        out = [list(refs) for refs in self.refs]
        for value, (n, i, parent, block) in zip(got, self.asked):
            out[n][i] = value
            if type(parent) is Earlier:
                parent = got[parent.index - self.offset]
            _memo_put(self.memo, (parent, tuple(block), tuple(self.keys)), value)
        return out


_MISSING = object()


def _memo_get(memo, key):
    """``memo[key]``, or ``_MISSING`` (no memo, an unhashable hash)."""
    try:
        return memo.get(key, _MISSING) if memo is not None else _MISSING
    except TypeError:
        return _MISSING


def _memo_put(memo, key, value):
    try:
        if memo is not None:
            memo[key] = value
    except TypeError:  # an unhashable hash: asked for every time
        pass


def hash_of(parent, block, extra_keys=(), memo=None):
    """Your ``hash_block(parent, block, extra_keys)``, asked once per ``memo`` (a dict)."""
    key = (parent, tuple(block), tuple(extra_keys))
    value = _memo_get(memo, key)
    if value is _MISSING:
        value = impl.hash_block(parent, block, extra_keys)
        _memo_put(memo, key, value)
    return value


def kv_of(tokens, num_kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V ``[len, KVH, d]`` as a model would make them: position p depends on every
    token up to p, so equal prefixes (and only those) give equal K/V."""
    k = np.empty((len(tokens), num_kv_heads, head_dim))
    v = np.empty_like(k)
    for p in range(len(tokens)):
        seed = zlib.crc32(np.asarray(tokens[:p + 1], dtype=np.int64).tobytes())
        rng = np.random.default_rng(seed)
        k[p] = rng.standard_normal((num_kv_heads, head_dim))
        v[p] = rng.standard_normal((num_kv_heads, head_dim))
    return k, v


class PagedCache:
    """A numpy paged KV cache in lab 01's layout ``[num_blocks, block_size, KVH, d]``, NaN
    wherever nothing was written, filled only through the manager's slot mapping."""

    def __init__(self, pool, manager, num_blocks: int, block_size: int,
                 num_kv_heads: int = 2, head_dim: int = 8):
        self.pool, self.manager = pool, manager
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k = np.full(shape, np.nan)
        self.v = np.full(shape, np.nan)

    def admit(self, request) -> tuple:
        """``(hit_blocks, num_hit_tokens, new_blocks)``: :func:`admit`, then the writes of
        the positions the hit does not cover (if the manager served the request)."""
        hit_blocks, num_hit = self.manager.get_computed_blocks(request)
        new = self.write(request, num_hit, request.num_tokens,
                         allocate=request.num_tokens - num_hit)
        return hit_blocks, num_hit, new

    def write(self, request, start: int, stop: int, allocate: int | None = None):
        """Perform the pending copies, then write positions [start, stop) of ``request``.
        ``allocate``: first ``allocate_slots(request, allocate)``, whose answer is returned
        (None: nothing is written). One batch."""
        first = [] if allocate is None else [(self.manager.allocate_slots, (request, allocate))]
        got = call_all([
            *first, (self.manager.take_copies, ()),
            (self.manager.slot_mapping, (request, np.arange(start, stop))),
            *((self.pool.ref_count, (b,)) for b in range(self.k.shape[0]))],
            stop_if_none=0 if first else None)
        new = got.pop(0) if first else None
        if first and new is None:
            return None
        copies, slots, *refs = got
        for copy in copies:
            self.k[copy.dst_block_id] = self.k[copy.src_block_id]
            self.v[copy.dst_block_id] = self.v[copy.src_block_id]
        slots = np.asarray(slots)
        for block in sorted(set((slots // self.k.shape[1]).tolist())):  # k: [blocks, bs, ...]
            assert refs[block] == 1, f"a new token of {request.request_id!r} goes to block " \
                f"{block} with reference count {refs[block]}: {SHARED_WRITE}"
        k, v = kv_of(request.token_ids, self.k.shape[2], self.k.shape[3])
        flat = (-1, *self.k.shape[2:])
        self.k.reshape(flat)[slots] = k[start:stop]
        self.v.reshape(flat)[slots] = v[start:stop]
        return new

    def decode(self, requests, qs: list[np.ndarray]) -> list[np.ndarray]:
        """One decode step of each of ``requests`` over its block table (gather, then
        attention); the tables are read in one batch."""
        got = call_all([*((self.manager.block_table, (r,)) for r in requests),
                        *((self.manager.num_tokens, (r,)) for r in requests)])
        out, bs = [], self.k.shape[1]
        for q, table, num_tokens in zip(qs, got, got[len(requests):]):
            table, t = np.asarray(table), np.arange(num_tokens)
            k, v = self.k[table[t // bs], t % bs], self.v[table[t // bs], t % bs]
            out.append(reference_attention(q[None], k, v)[0][0])
        return out


def dense_decode(request, q: np.ndarray, num_kv_heads: int = 2, head_dim: int = 8):
    k, v = kv_of(request.token_ids, num_kv_heads, head_dim)
    return reference_attention(q[None], k, v)[0][0]


def check_decode(cache: PagedCache, requests, rng, what: str) -> None:
    qs = [rng.standard_normal((4, cache.k.shape[3])) for _ in requests]
    for request, q, got in zip(requests, qs, cache.decode(requests, qs)):
        assert_close(
            got, dense_decode(request, q, *cache.k.shape[2:]),
            what=f"decode of {request.request_id!r} over its block table ({what})",
            hint="its block table points at blocks that hold other tokens' K/V: a stale or "
            "wrong prefix hit, or a write into a block another request reads",
        )


# ---- 1. the block pool ------------------------------------------------------------------------


@pytest.mark.points(1)
def test_a_new_pool_has_every_block_free_in_id_order():
    pool = impl.BlockPool(6, 4)
    assert (pool.num_blocks, pool.block_size, pool.num_free_blocks) == (6, 4, 6)
    assert pool.free_block_ids() == [0, 1, 2, 3, 4, 5]
    assert [pool.ref_count(b) for b in range(6)] == [0] * 6
    assert [pool.block_hash(b) for b in range(6)] == [None] * 6


@pytest.mark.points(1)
def test_allocate_takes_blocks_from_the_head_of_the_free_queue_with_one_reference():
    pool = impl.BlockPool(6, 4)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(0) == []
    assert pool.free_block_ids() == [2, 3, 4, 5] and pool.num_free_blocks == 4
    assert [pool.ref_count(b) for b in range(6)] == [1, 1, 0, 0, 0, 0]


@pytest.mark.points(1)
def test_allocating_more_blocks_than_are_free_raises_NoFreeBlocks_and_changes_nothing():
    assert issubclass(impl.NoFreeBlocks, RuntimeError), "NoFreeBlocks must be a RuntimeError"
    pool = impl.BlockPool(4, 2)
    pool.allocate(3)
    before = snapshot(pool)
    with pytest.raises(impl.NoFreeBlocks):
        pool.allocate(2)
    assert snapshot(pool) == before, "a failed allocate must not take any block"


@pytest.mark.points(1)
def test_a_block_returns_to_the_free_queue_only_when_its_last_reference_goes():
    pool = impl.BlockPool(4, 2)
    a, b = pool.allocate(2)
    pool.touch([a])  # a second block table holds a
    assert pool.ref_count(a) == 2
    pool.free([a])
    assert pool.ref_count(a) == 1 and a not in pool.free_block_ids(), EVICT_IN_USE
    pool.free([a, b])
    assert pool.ref_count(a) == 0 and pool.free_block_ids() == [a, b, 2, 3], (
        f"free queue {pool.free_block_ids()}: {EVICTION_ORDER}"
    )


@pytest.mark.points(2)
def test_freed_blocks_without_a_hash_are_reused_first_and_cached_ones_last_in_lru_order():
    pool = impl.BlockPool(6, 4)
    pool.allocate(4)  # blocks 0..3
    h1, h2 = impl.hash_block(None, [1, 2, 3, 4]), impl.hash_block(None, [5, 6, 7, 8])
    assert pool.cache_block(1, h1) and pool.cache_block(2, h2)
    pool.free([0, 1, 2, 3])
    assert pool.free_block_ids() == [0, 3, 4, 5, 1, 2], (
        f"free queue {pool.free_block_ids()}, expected [0, 3, 4, 5, 1, 2]: {EVICTION_ORDER}"
    )
    assert pool.allocate(4) == [0, 3, 4, 5]
    assert (pool.get_cached_block(h1), pool.get_cached_block(h2)) == (1, 2), (
        "a freed cached block keeps its hash until it is reused"
    )
    assert pool.allocate(1) == [1]
    assert pool.get_cached_block(h1) is None and pool.block_hash(1) is None, (
        "a reused (evicted) block must lose its hash: its slots are about to be overwritten"
    )
    assert pool.get_cached_block(h2) == 2 and pool.block_hash(2) == h2


@pytest.mark.points(2)
def test_touching_a_free_cached_block_takes_it_out_of_the_free_queue():
    pool = impl.BlockPool(6, 2)
    a, _ = pool.allocate(2)
    h = impl.hash_block(None, [1, 2])
    pool.cache_block(a, h)
    pool.free([1, a])
    assert pool.free_block_ids() == [1, 2, 3, 4, 5, a], EVICTION_ORDER
    pool.touch([a])  # a prefix hit on the free cached block
    assert a not in pool.free_block_ids() and pool.num_free_blocks == 5, EVICT_IN_USE
    assert pool.allocate(5) == [1, 2, 3, 4, 5]
    with pytest.raises(impl.NoFreeBlocks):
        pool.allocate(1)
    assert pool.get_cached_block(h) == a and pool.ref_count(a) == 1, EVICT_IN_USE


@pytest.mark.points(1)
def test_a_hash_held_by_one_block_is_not_taken_by_a_second_block():
    pool = impl.BlockPool(4, 2)
    a, b = pool.allocate(2)
    h = impl.hash_block(None, [1, 2])
    assert pool.cache_block(a, h) is True
    assert pool.cache_block(b, h) is False, "the first block cached under a hash stays its copy"
    assert pool.get_cached_block(h) == a and pool.block_hash(b) is None


def _pool_calls():
    return {
        "num_blocks": lambda: impl.BlockPool(0, 4),
        "block_size": lambda: impl.BlockPool(4, -1),
        "n": lambda: impl.BlockPool(4, 2).allocate(-1),
        "block_ids (freeing a block twice)": lambda: impl.BlockPool(4, 2).free([0]),
        "block_ids (unknown block)": lambda: impl.BlockPool(4, 2).free([4]),
        "block_ids (touch)": lambda: impl.BlockPool(4, 2).touch([-1]),
        "block_id": lambda: impl.BlockPool(4, 2).ref_count(9),
    }


def named_by_first_word(calls: dict[str, Callable[[], object]]) -> BadInputs:
    """A bad-input table from ``{"argument (what is wrong)": call}``."""
    return {case: (case.split(" ")[0], call) for case, call in calls.items()}


test_bad_pool_input_raises_ValueError_naming_the_argument = bad_input_test(
    named_by_first_word(_pool_calls()), points=0.5)


@pytest.mark.points(1)
def test_freeing_a_block_more_times_than_it_is_held_changes_nothing():
    pool = impl.BlockPool(4, 2)
    a, b = pool.allocate(2)
    before = snapshot(pool)
    with pytest.raises(ValueError, match="block_ids"):
        pool.free([b, a, a])
    assert snapshot(pool) == before, "a rejected free must not release any block"


# ---- 2. chained block hashes --------------------------------------------------------------


@pytest.mark.points(1)
def test_hash_block_is_deterministic_bytes_of_the_tokens():
    h = impl.hash_block(None, [1, 2, 3, 4])
    assert isinstance(h, bytes) and len(h) >= 16, "hash_block returns bytes (e.g. a SHA-256)"
    assert impl.hash_block(None, (1, 2, 3, 4)) == h, "a list and a tuple of tokens hash alike"
    assert impl.hash_block(None, np.array([1, 2, 3, 4])) == h, "numpy token ids hash alike"
    assert impl.hash_block(None, [1, 2, 4, 3]) != h, "token order is part of the identity"
    assert impl.hash_block(None, [1, 2, 3]) != h


@pytest.mark.points(2)
def test_the_same_tokens_after_a_different_prefix_hash_differently():
    block = [5, 6, 7, 8]
    after_a = impl.hash_block(impl.hash_block(None, [1, 2, 3, 4]), block)
    after_b = impl.hash_block(impl.hash_block(None, [9, 9, 9, 9]), block)
    first = impl.hash_block(None, block)
    assert impl.hash_block(None, block) == first, "the same block hashes the same every time"
    assert len({after_a, after_b, first}) == 3, PREFIX_HASH


@pytest.mark.points(1)
def test_extra_keys_are_part_of_the_identity():
    tokens = [1, 2, 3, 4]
    hashes = {impl.hash_block(None, tokens, keys) for keys in [(), ("lora-a",), ("lora-b",)]}
    assert len(hashes) == 3, "extra keys (a LoRA name, an image id) must change the hash: the " \
        "same tokens under another adapter have other K/V"
    assert impl.hash_block(None, tokens, ("lora-a",)) == impl.hash_block(None, tokens, ("lora-a",))


test_bad_hash_input_raises_ValueError_naming_the_argument = bad_input_test(named_by_first_word({
    "parent_hash": lambda: impl.hash_block("abc", [1, 2]),
    "token_ids": lambda: impl.hash_block(None, [1, -2]),
    "extra_keys": lambda: impl.hash_block(None, [1, 2], "lora"),
}), points=0.5)


# ---- 3. the cache manager: the README's worked example, step by step ---------------------


T = list(range(100, 110))  # request A's prompt: ten tokens
U = [200, 201, 202]


@pytest.mark.points(2)
def test_worked_example_a_prompt_gets_ceil_blocks_and_only_its_full_blocks_are_cached():
    pool, manager = manager_with()
    a = Request("A", T)
    assert manager.get_computed_blocks(a) == ([], 0)
    with raised_as("allocate_slots for a fresh 10-token prompt: it needs ceil(10 / 4) = 3 "
                   "blocks, and copy-on-write applies only to a SHARED partial last block"):
        got = manager.allocate_slots(a, 10)
    assert got == [0, 1, 2], f"got {got}: 10 tokens need ceil(10 / 4) = 3 blocks"
    assert manager.block_table(a) == [0, 1, 2] and manager.num_tokens(a) == 10
    h0, h1 = chain(T, 4)
    assert (pool.block_hash(0), pool.block_hash(1)) == (h0, h1), (
        "after allocate_slots, every full block is cached under its chained hash"
    )
    assert pool.block_hash(2) is None, f"block 2 holds 2 of 4 tokens: {PARTIAL_CACHED}"
    assert pool.free_block_ids() == [3, 4, 5, 6, 7]
    assert manager.request_ids == ["A"]


@pytest.mark.points(2)
def test_worked_example_a_second_request_hits_the_cached_prefix_and_shares_its_blocks():
    pool, manager = manager_with(Request("A", T))
    b = Request("B", T[:8] + U)
    assert manager.get_computed_blocks(b) == ([0, 1], 8)
    assert manager.allocate_slots(b, 3) == [3]
    assert manager.block_table(b) == [0, 1, 3]
    assert [pool.ref_count(x) for x in range(5)] == [2, 2, 1, 1, 0]
    assert manager.slot_mapping(b, [8, 9, 10]).tolist() == [12, 13, 14], (
        "slot = block_table[p // block_size] * block_size + p % block_size: logical block 2 of "
        "B is physical block 3 (a slot mapping without the table reads another request's K/V)")
    assert manager.slot_mapping("A", [0, 5, 9]).tolist() == [0, 5, 9]


@pytest.mark.points(2)
def test_worked_example_a_full_hit_still_recomputes_the_last_block():
    pool, manager = manager_with(Request("A", T))
    c = Request("C", T[:8])  # both of its blocks are cached
    hit = manager.get_computed_blocks(c)
    assert hit == ([0], 4), f"got {hit}, expected ([0], 4): {LAST_TOKEN}"
    got = manager.allocate_slots(c, 4)
    assert got == [3], (f"got {got}: 4 recomputed tokens need ceil(4 / 4) = 1 new block, not "
                        "4 // 4 + 1 (blocks needed = ceil(tokens / block_size))")
    assert manager.block_table(c) == [0, 3]
    assert pool.get_cached_block(chain(T, 4)[1]) == 1, "block 1 stays the cached copy of T[4:8]"
    assert manager.get_computed_blocks(Request("D", T[:9])) == ([0, 1], 8)


@pytest.mark.points(2)
def test_a_partial_block_is_never_cached_and_is_cached_once_it_fills():
    a = Request("A", T)
    pool, manager = manager_with(a)
    longer = Request("D", T + [7, 7, 7])
    assert manager.get_computed_blocks(longer) == ([0, 1], 8), PARTIAL_CACHED
    a = a.appended(110, 111)
    assert manager.allocate_slots(a, 2) == []
    assert pool.block_hash(2) == chain(a.token_ids, 4)[2], (
        "a block that becomes full through allocate_slots is cached under its chained hash"
        + ("; block 2 has another hash, given while it was partial: " + PARTIAL_CACHED
           if pool.block_hash(2) is not None else "")
    )
    assert manager.get_computed_blocks(Request("E", list(a.token_ids) + [9])) == ([0, 1, 2], 12)


@pytest.mark.points(2)
def test_worked_example_fork_shares_every_block_and_the_first_write_copies_the_shared_block():
    pool, manager = manager_with(Request("A", T))
    b = Request("B", T[:8] + U)
    admit(manager, b)
    manager.free("A")
    assert pool.free_block_ids() == [2, 4, 5, 6, 7], free_queue_message(pool, [2])
    child = manager.fork(b, "B2")
    assert isinstance(child, Request) and child.request_id == "B2"
    assert child.token_ids == b.token_ids
    assert manager.block_table(child) == [0, 1, 3]
    assert [pool.ref_count(x) for x in (0, 1, 3)] == [2, 2, 2], (
        "a fork takes a reference on every block it shares: freeing the parent must not free "
        "blocks the child still reads")
    b = b.appended(300)
    assert manager.allocate_slots(b, 1) == [2], SHARED_WRITE
    assert manager.take_copies() == [BlockCopy(3, 2)], SHARED_WRITE
    assert manager.block_table(b) == [0, 1, 2], SHARED_WRITE
    assert pool.ref_count(3) == 1 and pool.ref_count(2) == 1, (
        "after the copy the writer owns its copy only: its reference on the shared source "
        f"block is dropped (ref counts: block 3 {pool.ref_count(3)}, block 2 {pool.ref_count(2)})")
    assert manager.allocate_slots(child.appended(400), 1) == []
    assert manager.take_copies() == [], (
        "B2 is now the only owner of block 3: it writes in place, without a copy"
    )
    assert manager.block_table(child) == [0, 1, 3]


@pytest.mark.points(1)
def test_fork_of_a_request_ending_on_a_full_block_needs_no_copy():
    parent = Request("P", T[:8])
    pool, manager = manager_with(parent)
    child = manager.fork(parent, "C")
    assert manager.allocate_slots(parent.appended(1), 1) == [2]
    assert manager.allocate_slots(child.appended(2), 1) == [3]
    assert manager.take_copies() == [], "a full block is never written again: nothing to copy"
    assert manager.block_table(parent) == [0, 1, 2] and manager.block_table(child) == [0, 1, 3]


@pytest.mark.points(2)
def test_free_releases_tail_first_and_freed_blocks_stay_findable_until_reused():
    # blocks 0, 1, 2 full; 3 partial
    pool, manager = manager_with(Request("A", list(range(12)) + [99]))
    manager.free("A")
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0], free_queue_message(pool, [3])
    again = Request("A2", list(range(12)) + [5])
    assert manager.get_computed_blocks(again) == ([0, 1, 2], 12), (
        "a freed block keeps its hash and stays findable until it is reused"
    )
    pool_user = Request("X", list(range(500, 521)))  # 21 tokens: 6 blocks
    admit(manager, pool_user)
    assert manager.block_table(pool_user) == [3, 4, 5, 6, 7, 2], (
        "new blocks come from the head of the free queue: the tail block 2 is evicted first"
    )
    assert manager.get_computed_blocks(again) == ([0, 1], 8), (
        "block 2 was reused: its hash must be gone, and the hit stops before it"
    )


@pytest.mark.points(2)
def test_allocate_slots_returns_None_and_changes_nothing_when_the_pool_cannot_serve():
    pool, manager = pool_and_manager(4, 2)
    admit(manager, Request("A", [1, 2, 3, 4, 5]))  # blocks 0, 1 cached, 2 partial
    manager.free("A")
    assert pool.free_block_ids() == [2, 3, 1, 0], free_queue_message(pool, [2])
    too_long = Request("B", [1, 2, 3, 4, 9, 9, 9, 9, 9])  # hits 2 blocks, needs 3 more
    assert manager.get_computed_blocks(too_long) == ([0, 1], 4)
    before = snapshot(pool, manager)
    with raised_as("allocate_slots must return None when the pool cannot serve (count the "
                   "free hit blocks as used, not as free for the new blocks too)"):
        got = manager.allocate_slots(too_long, 5)
    assert got is None, (
        "2 cached hit blocks sit in the free queue, and taking them leaves 2 free blocks for "
        "the 3 new ones: allocate_slots must return None (count free hit blocks as used)"
    )
    assert snapshot(pool, manager) == before, "allocate_slots returned None but changed the pool"
    fits = Request("C", [1, 2, 3, 4, 9, 9, 9])  # hits 2 blocks, needs 2 more
    assert admit(manager, fits) == ([0, 1], 4, [2, 3])
    assert manager.allocate_slots(fits.appended(8, 8), 2) is None, "a full pool serves no more"
    assert manager.block_table(fits) == [0, 1, 2, 3] and manager.num_tokens(fits) == 7


@pytest.mark.points(2)
def test_a_hit_block_near_the_head_of_the_free_queue_is_touched_before_anything_is_allocated():
    pool, manager = pool_and_manager(4, 2)
    admit(manager, Request("A", [1, 2, 3]))  # block 0 cached, block 1 partial
    manager.free("A")
    admit(manager, Request("B", [5, 6, 7]))  # blocks 1 (cached) and 2
    manager.free("B")
    assert pool.free_block_ids() == [2, 3, 0, 1], free_queue_message(pool, [2])
    c = Request("C", [1, 2, 9, 9, 9, 9, 9])  # hits block 0, needs 3 new blocks
    hit_blocks, num_hit, new = admit(manager, c)
    assert (hit_blocks, num_hit) == ([0], 2)
    assert new == [2, 3, 1] and manager.block_table(c) == [0, 2, 3, 1], (
        f"new blocks {new}, block table {manager.block_table(c)}: {EVICT_IN_USE}"
    )


@pytest.mark.points(1)
def test_slot_mapping_follows_the_block_table():
    pool, manager = pool_and_manager(10, 3)
    admit(manager, Request("X", list(range(7))))
    b = Request("B", list(range(50, 61)))
    admit(manager, b)
    manager.free("X")
    b = b.appended(1, 2, 3, 4, 5)
    manager.allocate_slots(b, 5)
    table = manager.block_table(b)
    positions = np.arange(16)
    expected = np.asarray(table)[positions // 3] * 3 + positions % 3
    got = np.asarray(manager.slot_mapping(b, positions))
    assert got.tolist() == expected.tolist(), (
        f"slot_mapping = {got.tolist()}, expected block_table[p // block_size] * block_size "
        f"+ p % block_size = {expected.tolist()} (block table {table})"
    )


@pytest.mark.points(1)
def test_without_prefix_caching_nothing_is_hashed_or_hit():
    pool, manager = manager_with(Request("A", T), enable_prefix_caching=False)
    assert manager.get_computed_blocks(Request("B", T + [1])) == ([], 0)
    assert [pool.block_hash(b) for b in range(8)] == [None] * 8
    manager.free("A")
    assert pool.free_block_ids() == [2, 1, 0, 3, 4, 5, 6, 7], (
        "blocks without a hash are reused first, tail first: " + EVICTION_ORDER
    )


@pytest.mark.points(1)
def test_requests_with_different_extra_keys_share_nothing():
    pool, manager = manager_with(Request("A", T, extra_keys=("lora-1",)))
    assert manager.get_computed_blocks(Request("B", T, extra_keys=("lora-2",))) == ([], 0)
    assert manager.get_computed_blocks(Request("C", T, extra_keys=())) == ([], 0)
    assert manager.get_computed_blocks(Request("D", T, extra_keys=("lora-1",))) == ([0, 1], 8)


def _manager_calls():
    def setup():
        a = Request("A", T)
        return manager_with(a)[1], a

    return {
        "num_new_tokens (negative)": lambda m, a: m.allocate_slots(a, -1),
        "num_new_tokens (more than the request has)": lambda m, a: m.allocate_slots(a, 1),
        "num_new_tokens (zero for a new request)": lambda m, a: m.allocate_slots(
            Request("N", [1, 2]), 0),
        "request (free unknown)": lambda m, a: m.free("nobody"),
        "request (free twice)": lambda m, a: (m.free(a), m.free(a)),
        "request (block_table)": lambda m, a: m.block_table("nobody"),
        "request (num_tokens)": lambda m, a: m.num_tokens("nobody"),
        "request (slot_mapping)": lambda m, a: m.slot_mapping("nobody", [0]),
        "request (fork unknown)": lambda m, a: m.fork(Request("nobody", [1]), "x"),
        "request (lookup of a held request)": lambda m, a: m.get_computed_blocks(a),
        "new_id": lambda m, a: m.fork(a, "A"),
        "positions": lambda m, a: m.slot_mapping(a, [10]),
    }, setup


def _bad_manager_call(case: str) -> None:
    calls, setup = _manager_calls()
    calls[case](*setup())


test_bad_manager_input_raises_ValueError_naming_the_argument = bad_input_test(named_by_first_word(
    {case: functools.partial(_bad_manager_call, case) for case in _manager_calls()[0]}),
    points=0.5)


# ---- 4. random sequences of operations, invariants after every step ----------------------

SYSTEM_PROMPTS = (
    (7, 7, 1, 2, 3, 4, 5, 6, 8, 9),
    (7, 7, 1, 2, 30, 31, 32, 33, 34, 35),
    (40, 41, 42, 43, 44, 45, 46, 47, 48, 49),
)


class KVCacheMachine(RuleBasedStateMachine):
    """Admit / append / fork / finish / preempt / resume requests at random.

    The machine keeps its own model: each running request's tokens, and ``store``, the token
    written into every slot (through your slot mapping). After every step it checks that
    the pool and the manager agree with it."""

    @initialize(block_size=st.sampled_from([1, 2, 3, 4]), num_blocks=st.integers(4, 12))
    def start(self, block_size, num_blocks):
        self.bs, self.nb = block_size, num_blocks
        self.pool, self.manager = pool_and_manager(num_blocks, block_size)
        self.tokens: dict[str, list[int]] = {}
        self.store = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self.paused: list[list[int]] = []
        self.count = 0
        self.hashes: dict = {}  # chain's memo: hash_block is deterministic (tested above)
        self.seen = None  # the invariants' reads of this step (_view)

    # -- helpers --
    #
    # Under the grader each call of your code is a round trip to its sandbox: a step reads
    # what it needs before its operation, then runs the operation and reads everything the
    # step and the invariants check, in one batch (call_all: the calls run in order, as one
    # by one), and the invariants share what that batch read (_view).

    def _refs_calls(self):
        return [(self.pool.ref_count, (b,)) for b in range(self.nb)]

    def _snapshot_calls(self):
        """The reads of :func:`snapshot`, for the requests this machine runs (the invariants
        hold the manager's request ids to them after every step)."""
        return snapshot_calls(self.pool, self.manager, self.nb, list(self.tokens))

    def _snapshot(self, got):
        return snapshot_of(got, self.nb, list(self.tokens))

    def _view_calls(self, tokens, offset=0):
        """``(calls, plan)``: what the invariants read about the pool and the running requests
        ``tokens`` (id -> tokens), to go at position ``offset`` of a batch, after the hashes
        of their blocks the memo lacks (``plan``); :meth:`_view_of` reads the answers."""
        nb, pool, manager = self.nb, self.pool, self.manager
        plan = HashPlan(list(tokens.values()), self.bs, memo=self.hashes, offset=offset)
        return [
            *plan.calls, (getattr, (manager, "request_ids")), (pool.free_block_ids, ()),
            *self._refs_calls(), *((pool.block_hash, (b,)) for b in range(nb)),
            *((manager.block_table, (r,)) for r in tokens),
            *((manager.num_tokens, (r,)) for r in tokens),
            *((manager.slot_mapping, (r, np.arange(len(t)))) for r, t in tokens.items()),
            *((pool.get_cached_block, (h,)) for refs in plan.refs for h in refs),
            (getattr, (pool, "num_free_blocks"))], plan

    def _view_of(self, got, tokens, plan) -> dict:
        plan.hashes(got[:len(plan.calls)])
        got = got[len(plan.calls):]
        ids, got, nb, r = got[0], got[1:], self.nb, len(tokens)
        assert sorted(ids) == sorted(tokens), IDS_ARE_THE_RUNNING
        ends = np.cumsum([1, nb, nb, r, r, r]).tolist()
        refs, hashes, tables, num_tokens, mappings = (
            got[a:b] for a, b in zip(ends[:-1], ends[1:]))
        found = iter(got[ends[-1]:-1])
        cached = [[next(found) for _ in range(len(t) // self.bs)] for t in tokens.values()]
        return {"order": list(tokens), "free": got[0], "refs": refs, "hashes": hashes,
                "tables": tables, "num_tokens": num_tokens, "mappings": mappings,
                "cached": cached, "num_free": got[-1]}

    def _step(self, tokens, *first, gate=False):
        """``first`` (a step's operation and the reads that go with it), then the view of
        the requests ``tokens`` the step leaves running, in one batch: ``(answers of first,
        view)``, or ``(answers, None)`` when ``gate`` and the operation returned None (the
        batch stops there). When a call raises, the manager's request ids are checked before
        its error is shown (a read about a request the manager lost raises)."""
        view, plan = self._view_calls(tokens, len(first))
        calls = [*first, *view]
        try:
            got = call_all(calls, stop_if_none=0 if gate and first else None)
        except Exception:  # noqa: BLE001 - say what went wrong before the call that raised
            ids = sorted(self.manager.request_ids)
            assert ids in (sorted(self.tokens), sorted(tokens)), IDS_ARE_THE_RUNNING
            raise
        if len(got) < len(calls):
            return got, None
        return got[:len(first)], self._view_of(got[len(first):], tokens, plan)

    def _state(self, view):
        """A view as :func:`snapshot` has it."""
        return (view["free"], view["refs"], view["hashes"], list(self.tokens),
                view["tables"], view["num_tokens"])

    def _unchanged(self, before):
        """allocate_slots returned None: nothing observable changed."""
        self.seen = None
        assert self._state(self._view()) == before, NONE_CHANGED

    def _before(self):
        """The state before this step's operation: what the invariants read after the last
        step (nothing has run since), as :func:`snapshot` has it; the step will change it."""
        view, self.seen = self._view(), None
        return view, self._state(view)

    def _slots(self, view, rid, start):
        """The slots of ``rid``'s positions from ``start`` on, as the view read them."""
        return np.asarray(view["mappings"][view["order"].index(rid)])[start:]

    def _table(self, view, rid):
        return view["tables"][view["order"].index(rid)]

    def _write(self, rid, tokens, start, slots, refs):
        blocks = sorted(set((slots // self.bs).tolist()))
        for block in blocks:
            assert refs[block] == 1, (
                f"{rid!r} writes into block {block} (reference count {refs[block]}): "
                f"{SHARED_WRITE}"
            )
        self.store[slots] = tokens[start:]

    def _check_hit(self, tokens, hit_blocks, num_hit, cached_blocks):
        bs = self.bs
        assert num_hit == len(hit_blocks) * bs, "num_computed_tokens = len(block_ids) * block_size"
        assert num_hit <= len(tokens) - 1, f"hit of {num_hit} of {len(tokens)} tokens: {LAST_TOKEN}"
        for i, block in enumerate(hit_blocks):
            held = self.store[block * bs:(block + 1) * bs].tolist()
            assert held == tokens[i * bs:(i + 1) * bs], (
                f"a prefix hit returned block {block} holding tokens {held} for logical block "
                f"{i}, which needs {tokens[i * bs:(i + 1) * bs]}"
            )
        cached = 0
        for block in cached_blocks:
            if block is None:
                break
            cached += 1
        assert len(hit_blocks) == cached, (
            f"the pool caches {cached} leading blocks of this prompt (of the full blocks before "
            f"its last token) but the hit has {len(hit_blocks)}: the hit is the LONGEST cached "
            "prefix, stopping at the first block that is not cached"
        )

    def _admit(self, tokens) -> bool:
        rid = f"r{self.count}"
        self.count += 1
        request = Request(rid, tokens)
        full = tokens[:(len(tokens) - 1) // self.bs * self.bs]
        plan = HashPlan([full], self.bs, memo=self.hashes, offset=1)
        got = call_all([(self.manager.get_computed_blocks, (request,)), *plan.calls,
                        *((self.pool.get_cached_block, (h,)) for h in plan.refs[0]),
                        *self._snapshot_calls()])
        k, n = 1 + len(plan.calls), len(plan.refs[0])
        (hit_blocks, num_hit), _ = got[0], plan.hashes(got[1:k])
        self._check_hit(tokens, hit_blocks, num_hit, got[k:k + n])
        before = self._snapshot(got[k + n:])
        free_before = before[0]
        (new, *copies), view = self._step(
            {**self.tokens, rid: tokens},
            (self.manager.allocate_slots, (request, len(tokens) - num_hit)),
            (self.manager.take_copies, ()), gate=True)
        if view is None:  # it returned None
            self._unchanged(before)
            return False
        queue = [b for b in free_before if b not in hit_blocks]
        assert new == queue[:len(new)], (
            f"new blocks {new}: they come from the head of the free queue {queue} (after the "
            "hit blocks left it)"
        )
        assert view["free"] == queue[len(new):], EVICT_IN_USE
        assert self._table(view, rid) == hit_blocks + new
        assert copies == [[]], "a new request copies nothing"
        self._write(rid, tokens, num_hit, self._slots(view, rid, num_hit), view["refs"])
        self.tokens[rid], self.seen = tokens, view
        return True

    def _pick(self, data):
        return data.draw(st.sampled_from(sorted(self.tokens)), label="request")

    # -- rules --

    @rule(system=st.integers(0, 2), cut=st.integers(0, 10),
          suffix=st.lists(st.integers(0, 9), max_size=4))
    def admit_a_request(self, system, cut, suffix):
        self.seen = None
        self._admit(list(SYSTEM_PROMPTS[system][:cut]) + suffix or [0])

    @precondition(lambda self: self.paused)
    @rule(data=st.data())
    def resume_a_preempted_request(self, data):
        self.seen = None
        i = data.draw(st.integers(0, len(self.paused) - 1), label="paused")
        if self._admit(self.paused[i]):
            self.paused.pop(i)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=st.lists(st.integers(0, 9), min_size=1, max_size=3))
    def append_tokens(self, data, new):
        rid = self._pick(data)
        old = self.tokens[rid]
        tokens, n0 = old + new, len(old)
        view, before = self._before()
        free0, refs0, table0 = view["free"], view["refs"], self._table(view, rid)
        (result, *copies), view = self._step(
            {**self.tokens, rid: tokens},
            (self.manager.allocate_slots, (Request(rid, tokens), len(new))),
            (self.manager.take_copies, ()), gate=True)
        if view is None:  # it returned None
            self._unchanged(before)
            return
        copies, table = copies[0], self._table(view, rid)
        must_copy = n0 % self.bs != 0 and refs0[table0[-1]] > 1
        if must_copy:
            assert copies and result, (
                f"{rid!r} writes into its partial last block {table0[-1]}, which "
                f"{refs0[table0[-1]]} tables hold, without a copy: {SHARED_WRITE}"
            )
            assert copies == [BlockCopy(table0[-1], result[0])], (
                f"{rid!r} writes into its partial last block {table0[-1]}, which "
                f"{refs0[table0[-1]]} tables hold; expected the copy "
                f"{BlockCopy(table0[-1], result[0])}, got {copies}: {SHARED_WRITE}"
            )
        else:
            assert copies == [], f"copies {copies}, but nothing shared is written: copy only " \
                "a partial last block with reference count > 1"
        assert result == free0[:len(result)], "new blocks come from the head of the free queue"
        assert table[:len(table0) - 1] == table0[:-1], "appending never moves the earlier blocks"
        for copy in copies:
            src, dst = copy.src_block_id * self.bs, copy.dst_block_id * self.bs
            self.store[dst:dst + self.bs] = self.store[src:src + self.bs]
        self._write(rid, tokens, n0, self._slots(view, rid, n0), view["refs"])
        self.tokens[rid], self.seen = tokens, view

    @precondition(lambda self: self.tokens and len(self.tokens) < 6)
    @rule(data=st.data())
    def fork_a_request(self, data):
        rid = self._pick(data)
        child_id = f"r{self.count}"
        self.count += 1
        view, _ = self._before()
        free0, refs0 = view["free"], view["refs"]
        (child,), view = self._step(
            {**self.tokens, child_id: self.tokens[rid]},
            (self.manager.fork, (Request(rid, self.tokens[rid]), child_id)))
        assert child.request_id == child_id and list(child.token_ids) == self.tokens[rid]
        table = self._table(view, rid)
        assert self._table(view, child_id) == table, "a fork shares every block"
        for block in table:
            assert view["refs"][block] == refs0[block] + 1, "fork adds one reference"
        assert view["free"] == free0
        self.tokens[child_id], self.seen = list(self.tokens[rid]), view

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), preempt=st.booleans())
    def finish_or_preempt_a_request(self, data, preempt):
        rid = self._pick(data)
        view, _ = self._before()
        table = self._table(view, rid)
        free0, refs0, hashes0 = view["free"], view["refs"], view["hashes"]
        _, view = self._step({r: t for r, t in self.tokens.items() if r != rid},
                             (self.manager.free, (rid,)))
        released = [b for b in reversed(table) if refs0[b] == 1]
        expected = ([b for b in released if hashes0[b] is None] + free0
                    + [b for b in released if hashes0[b] is not None])
        partial = [table[-1]] if table and len(self.tokens[rid]) % self.bs else []
        assert view["free"] == expected, free_queue_message(self.pool, partial, expected)
        tokens, self.seen = self.tokens.pop(rid), view
        if preempt:
            self.paused.append(tokens)

    # -- invariants --

    def _view(self) -> dict:
        """What the invariants read after a step, in one batch: the step's own (it read
        them with its operation), else read now."""
        if self.seen is None:
            _, self.seen = self._step(self.tokens)
        return self.seen

    @invariant()
    def every_block_is_free_or_owned_and_counted(self):
        view = self._view()
        owners: Counter = Counter()
        for (rid, tokens), table, num_tokens in zip(self.tokens.items(), view["tables"],
                                                    view["num_tokens"]):
            assert num_tokens == len(tokens)
            repeated = len(set(table)) < len(table)
            assert len(table) == math.ceil(len(tokens) / self.bs) == len(set(table)), (
                f"{rid!r} has {len(tokens)} tokens and block table {table}: expected "
                f"ceil({len(tokens)} / {self.bs}) distinct blocks" + (
                    f". One block twice in a table: two of its blocks with the same tokens "
                    f"after different prefixes got one hash, {PREFIX_HASH}" if repeated else "")
            )
            owners.update(table)
        free = view["free"]
        assert len(free) == len(set(free)) == view["num_free"]
        both = sorted(set(free) & set(owners))
        assert not both, f"blocks {both} are in the free queue and in a block table: {EVICT_IN_USE}"
        assert len(free) + len(owners) == self.nb, (
            f"{len(free)} free + {len(owners)} owned blocks != {self.nb}: a block leaked"
        )
        refs = view["refs"]
        for block in range(self.nb):
            assert refs[block] == owners[block], (
                f"block {block} has reference count {refs[block]} but {owners[block]} block "
                "tables hold it: the count must equal its owners"
            )

    @invariant()
    def every_request_reads_back_its_own_tokens(self):
        for (rid, tokens), mapping in zip(self.tokens.items(), self._view()["mappings"]):
            slots = np.asarray(mapping)
            held = self.store[slots].tolist()
            assert held == tokens, (
                f"{rid!r} reads {held} through its block table, but its tokens are {tokens}: "
                f"another request wrote into its blocks ({SHARED_WRITE}) or a copy is missing"
            )

    @invariant()
    def only_full_blocks_are_cached_under_the_hash_of_their_tokens(self):
        bs, view = self.bs, self._view()
        for (rid, tokens), table, cached in zip(self.tokens.items(), view["tables"],
                                                view["cached"]):
            hashes = chain(tokens, bs, memo=self.hashes)
            for i, block in enumerate(table):
                h = view["hashes"][block]
                if h is None:
                    continue
                where = f"block {block} (logical block {i} of {rid!r}, {len(tokens)} tokens)"
                if (i + 1) * bs > len(tokens):
                    parent = hashes[i - 1] if i else None
                    own = h == hash_of(parent, tokens[i * bs:], (), self.hashes)
                    assert not own, f"{where} has a hash: {PARTIAL_CACHED}"
                assert i < len(hashes) and h == hashes[i], (
                    f"{where} is cached under a hash that is not the chained hash of its "
                    "tokens: a stale hash? A block handed out again by allocate must lose the "
                    "hash of its previous content (eviction)"
                )
                assert cached[i] == block, (
                    f"get_cached_block of the hash of {where} returns {cached[i]}")


# The number of runs is the profile's; 20 steps each keep the machine quick. No shrinking (and
# no replay of saved examples): minimising a failing run of a state machine can take minutes,
# so a failure shows its whole run, and the assertion names what went wrong.
MACHINE_SETTINGS = settings(
    stateful_step_count=20,
    phases=[p for p in settings.default.phases if p not in (Phase.reuse, Phase.shrink)],
)


@pytest.mark.points(8)
def test_random_sequences_of_allocate_append_fork_free_preempt_keep_every_invariant():
    run_state_machine_as_test(KVCacheMachine, settings=MACHINE_SETTINGS)


# ---- 5. end to end: K/V through the slot mapping, attention through the block tables ----


@pytest.mark.points(4)
@given(
    block_size=st.sampled_from([1, 2, 3, 4, 16]),
    system_len=st.integers(0, 20),
    suffixes=st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=6), min_size=2,
                      max_size=4),
    decode_steps=st.integers(0, 3),
    finish_first=st.booleans(),
)
def test_decode_over_every_block_table_equals_dense_attention_with_prefix_hits(
    block_size, system_len, suffixes, decode_steps, finish_first
):
    system = list(range(1000, 1000 + system_len))
    num_blocks = sum(math.ceil((system_len + 6 + 3) / block_size) for _ in suffixes) + 1
    pool, manager = pool_and_manager(num_blocks, block_size)
    cache = PagedCache(pool, manager, num_blocks, block_size)
    requests = []
    for i, suffix in enumerate(suffixes):
        request = Request(f"r{i}", system + suffix)
        assert cache.admit(request)[2] is not None
        if finish_first and i == 0:
            manager.free(request)  # its blocks stay cached for the others to hit
        else:
            requests.append(request)
    rng = np.random.default_rng(block_size + system_len)
    for step in range(decode_steps):
        for j, request in enumerate(requests):
            requests[j] = request = request.appended(2000 + step)
            assert cache.write(request, request.num_tokens - 1, request.num_tokens,
                               allocate=1) is not None
    check_decode(cache, requests, rng, "requests sharing a cached prefix")


@pytest.mark.points(2)
@given(block_size=st.sampled_from([2, 3, 4]), prompt_len=st.integers(1, 13),
       steps=st.integers(1, 5), parent_first=st.booleans())
def test_decode_after_a_copy_on_write_fork_equals_dense_attention(
    block_size, prompt_len, steps, parent_first
):
    num_blocks = 2 * math.ceil((prompt_len + steps) / block_size) + 1
    pool, manager = pool_and_manager(num_blocks, block_size)
    cache = PagedCache(pool, manager, num_blocks, block_size)
    parent = Request("parent", list(range(prompt_len)))
    cache.admit(parent)
    child = manager.fork(parent, "child")
    rng = np.random.default_rng(prompt_len)
    for step in range(steps):
        order = ["parent", "child"] if parent_first else ["child", "parent"]
        for who in order:
            request = parent if who == "parent" else child
            request = request.appended(500 + step if who == "parent" else 900 + step)
            assert cache.write(request, request.num_tokens - 1, request.num_tokens,
                               allocate=1) is not None
            parent, child = (request, child) if who == "parent" else (parent, request)
    check_decode(cache, [parent, child], rng, "a parent and its child after a copy-on-write fork")


@pytest.mark.points(2)
def test_decode_after_eviction_and_resume_equals_dense_attention():
    pool, manager = pool_and_manager(6, 4)
    cache = PagedCache(pool, manager, 6, 4)
    a = Request("A", list(range(14)))  # 4 blocks, 3 full
    cache.admit(a)
    manager.free(a)  # preempted: free queue [3, 4, 5, 2, 1, 0]
    other = Request("O", list(range(300, 318)))  # 5 blocks: evicts 3, 4, 5, 2, 1
    cache.admit(other)
    manager.free(other)
    resumed = Request("A", list(range(14)))
    hit_blocks, num_hit, _ = cache.admit(resumed)
    assert (hit_blocks, num_hit) == ([0], 4), (
        f"hit {hit_blocks}: blocks 1 and 2 were reused by another request, so only block 0 "
        "still holds A's tokens; an evicted block must lose its hash (no stale hits)"
    )
    check_decode(cache, [resumed], np.random.default_rng(0), "a request resumed after eviction")


# ---- 6. the scheduler simulation ----------------------------------------------------------


@pytest.mark.points(2)
def test_simulate_preempts_the_newest_request_and_it_recomputes_later():
    # Block size 2, four blocks. R0 and R1 arrive together, prompts of 3 tokens; at step 2
    # R0 needs a third block and none is free: R1 (the newest) is preempted. R1 comes back
    # when R0 finishes, hitting its own first block, which stayed cached.
    workload = [(0, [1, 2, 3], 4), (0, [4, 5, 6], 3)]
    stats = impl.simulate(workload, num_blocks=4, block_size=2, max_num_seqs=8)
    assert stats.preemptions == 1
    assert stats.finish_step[0] != 3 or stats.finish_step[1] <= 4, (
        f"finish steps {stats.finish_step}, expected (3, 4): R1 finished late, as if it had to "
        "sample its outputs again. A preempted request keeps them: recompute preemption loses "
        "the compute, not the tokens; it prefills prompt + outputs so far again (often partly "
        "from its own cached blocks) and goes on from there"
    )
    assert stats.finish_step == (3, 4), (
        f"finish steps {stats.finish_step}, expected (3, 4): when the pool is full the NEWEST "
        "running request is preempted (vLLM: self.running.pop()), so the oldest keeps going"
    )
    assert stats.num_running == (2, 2, 1, 1, 1)
    assert stats.used_slots == (6, 8, 5, 6, 5)
    assert stats.reserved_slots == (8, 8, 6, 6, 6)
    assert (stats.total_slots, stats.prompt_tokens, stats.cached_prompt_tokens) == (8, 6, 0)


@pytest.mark.points(2)
def test_a_preempted_request_goes_back_to_the_front_of_the_waiting_queue():
    # Block size 2, two blocks. Step 0: R0 ([1]) and R1 ([2, 3]) take a block each. Step 1:
    # R2 arrives and waits; R1 needs a second block, none is free, so R1 is preempted and
    # rejoins the waiting queue AHEAD of R2 (vLLM: self.waiting.prepend_request). R0
    # finishes. Step 2: R1 (3 tokens, both blocks) is admitted first; R2 runs at step 3.
    workload = [(0, [1], 2), (0, [2, 3], 2), (1, [4], 1)]
    stats = impl.simulate(workload, num_blocks=2, block_size=2, max_num_seqs=4)
    assert stats.preemptions == 1
    assert stats.finish_step == (1, 2, 3), (
        f"finish steps {stats.finish_step}, expected (1, 2, 3): a preempted request goes back "
        "to the FRONT of the waiting queue (vLLM: self.waiting.prepend_request(preempted_req)), "
        "not behind requests that arrived after it (waiting.appendleft, not append)"
    )
    assert stats.used_slots == (3, 2, 3, 1)


@pytest.mark.points(2)
def test_simulate_counts_prefix_cache_hits_on_a_shared_system_prompt():
    system = list(range(100, 108))  # two full blocks of 4
    workload = [(0, system + [1, 2, 3], 2), (1, system + [4, 5, 6], 2), (5, system + [7, 8, 9], 1)]
    stats = impl.simulate(workload, num_blocks=16, block_size=4, max_num_seqs=8)
    assert (stats.prompt_tokens, stats.cached_prompt_tokens) == (33, 16), (
        "R1 finds R0's two system-prompt blocks while R0 runs; R2 finds them after both "
        "finished (freed blocks stay cached): 16 of 33 prompt tokens"
    )
    assert stats.prefix_hit_rate == pytest.approx(16 / 33)
    assert stats.finish_step == (1, 2, 5)
    assert stats.used_slots == (11, 15, 12, 0, 0, 11)
    assert stats.reserved_slots == (12, 16, 12, 0, 0, 12)
    off = impl.simulate(workload, 16, 4, 8, enable_prefix_caching=False)
    assert off.cached_prompt_tokens == 0 and off.used_slots[1] == 23


@pytest.mark.points(2)
def test_contiguous_reservation_holds_max_model_len_per_request():
    workload = [(0, [1, 2], 3), (0, [3, 4], 3), (0, [5, 6], 3)]
    stats = impl.simulate_contiguous(workload, 8, 2, max_num_seqs=8, max_model_len=8)
    assert stats.finish_step == (2, 2, 5), "16 slots hold two reservations of 8: R2 waits"
    assert stats.used_slots == (4, 6, 8, 2, 3, 4)
    assert stats.reserved_slots == (16, 16, 16, 8, 8, 8), (
        f"reserved {stats.reserved_slots}: a contiguous reservation holds max_model_len slots "
        "per running request from admission, not only the slots it has filled")
    assert stats.mean_utilisation == pytest.approx(27 / 96)
    assert stats.waste == pytest.approx(1 - 27 / 72)
    assert stats.preemptions == 0
    one_at_a_time = impl.simulate_contiguous(workload, 8, 2, max_num_seqs=1, max_model_len=8)
    assert one_at_a_time.finish_step == (2, 5, 8), "max_num_seqs=1: one request at a time"
    paged = impl.simulate(workload, 8, 2, max_num_seqs=8)
    assert paged.finish_step == (2, 2, 2), "paged, all three fit at once"


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 6))
    items = []
    for _ in range(n):
        prefix = draw(st.sampled_from([[], [7, 7, 7, 7], [7, 7, 8, 8, 9]]))
        prompt = prefix + draw(st.lists(st.integers(0, 5), min_size=1, max_size=6))
        items.append((draw(st.integers(0, 6)), prompt, draw(st.integers(1, 6))))
    return items


@pytest.mark.points(2)
@given(workload=workloads(), block_size=st.integers(1, 4), extra=st.integers(0, 6),
       max_num_seqs=st.integers(1, 4), caching=st.booleans())
def test_simulate_serves_every_request_and_waste_stays_in_the_last_blocks(
    workload, block_size, extra, max_num_seqs, caching
):
    longest = max(len(p) + out - 1 for _, p, out in workload)
    num_blocks = math.ceil(longest / block_size) + extra
    stats = impl.simulate(workload, num_blocks, block_size, max_num_seqs,
                          enable_prefix_caching=caching)
    steps = stats.steps
    assert len(stats.reserved_slots) == len(stats.num_running) == steps
    assert all(f >= a for f, (a, _, _) in zip(stats.finish_step, workload)), (
        f"finish steps {stats.finish_step}: every request finishes, after it arrives"
    )
    assert steps == max(stats.finish_step) + 1
    assert sum(stats.num_running) == sum(out for _, _, out in workload), (
        "every running request samples exactly one token per step: the running counts must "
        "add up to the output tokens"
    )
    for used, reserved, running in zip(stats.used_slots, stats.reserved_slots, stats.num_running):
        assert running <= max_num_seqs and used <= reserved <= stats.total_slots
        assert reserved - used <= running * (block_size - 1), (
            f"{reserved - used} held slots are empty with {running} requests running: paged, "
            "only each request's last block may be partly empty"
        )
    if not caching:
        assert stats.cached_prompt_tokens == 0


@pytest.mark.points(2)
def test_the_paper_point_contiguous_uses_20_to_40_percent_and_paged_wastes_under_4():
    workload = provided.synthetic_workload(60, seed=7, mean_prompt=40, mean_output=85,
                                           max_model_len=256, arrivals_per_step=1.0)
    contiguous = impl.simulate_contiguous(workload, 128, 8, 64, max_model_len=256)
    paged = impl.simulate(workload, 128, 8, 64)
    assert 0.20 <= contiguous.mean_utilisation <= 0.40, (
        f"contiguous reservations use {contiguous.mean_utilisation:.1%} of the pool; the "
        "PagedAttention paper found 20.4%-38.2% in such systems"
    )
    assert paged.waste < 0.04, f"paged waste {paged.waste:.1%}: only last blocks are partial"
    assert paged.mean_utilisation > 2 * contiguous.mean_utilisation
    assert paged.steps < contiguous.steps, "more requests fit at once: the workload ends sooner"


BAD_WORKLOADS = {
    "requests (negative arrival)": lambda: impl.simulate([(-1, [1], 1)], 4, 2, 1),
    "requests (empty prompt)": lambda: impl.simulate([(0, [], 1)], 4, 2, 1),
    "requests (no output)": lambda: impl.simulate([(0, [1], 0)], 4, 2, 1),
    "requests (longer than the pool)": lambda: impl.simulate([(0, list(range(9)), 1)], 4, 2, 1),
    "max_num_seqs": lambda: impl.simulate([(0, [1], 1)], 4, 2, 0),
    "max_model_len (more than the pool)": lambda: impl.simulate_contiguous(
        [(0, [1], 1)], 4, 2, 1, 9),
    "requests (longer than max_model_len)": lambda: impl.simulate_contiguous(
        [(0, [1, 2, 3], 2)], 4, 2, 1, 3),
}


test_bad_workloads_raise_ValueError_naming_the_argument = bad_input_test(
    named_by_first_word(BAD_WORKLOADS), points=0.5)
