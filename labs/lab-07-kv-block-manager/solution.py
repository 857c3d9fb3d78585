"""Lab 07 reference solution: the KV block manager behind a block table.

A pool of fixed-size KV blocks with reference counts and a free queue in eviction order;
chained block hashes; a cache manager that finds the longest cached prefix, allocates slots,
shares blocks between forks with copy-on-write, and frees; a scheduler simulation with
recompute preemption, next to the contiguous reservation it replaced.

    Request(request_id, token_ids, extra_keys=())   every token known so far
    block_table(request)[i]                         physical block of logical block i
    slot of position p                              block_table[p // block_size] * block_size
                                                    + p % block_size
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter, OrderedDict, deque
from typing import Any

import numpy as np

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
        self._num_blocks = provided.check_int("num_blocks", num_blocks, minimum=1)
        self._block_size = provided.check_int("block_size", block_size, minimum=1)
        self._ref = [0] * self._num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(self._num_blocks))
        self._hash_of: dict[int, bytes] = {}  # block -> its hash (cached blocks only)
        self._block_of: dict[bytes, int] = {}  # hash -> the cached block holding it

    @property
    def num_blocks(self) -> int:
        """How many blocks the pool has."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """How many token slots a block has."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks with reference count 0 (cached ones included: they can be evicted)."""
        return len(self._free)

    def free_block_ids(self) -> list[int]:
        """The free queue, the next block ``allocate`` hands out first."""
        return list(self._free)

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold ``block_id``."""
        return self._ref[provided.check_block_id("block_id", block_id, self._num_blocks)]

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue (count 1 each; a cached block
        loses its hash: it is evicted). ``NoFreeBlocks`` if fewer than ``n`` are free."""
        n = provided.check_int("n", n)
        if n > len(self._free):
            raise NoFreeBlocks(f"cannot allocate n={n} blocks: only {len(self._free)} are free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._ref[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, block_ids: list[int]) -> None:
        """One more reference to each block; a free (cached) block leaves the free queue."""
        for block in provided.check_block_ids("block_ids", block_ids, self._num_blocks):
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1

    def free(self, block_ids: list[int]) -> None:
        """One reference fewer to each block, in the order given. A block reaching 0 joins
        the free queue: at the head without a hash, at the tail with one (in that order)."""
        block_ids = provided.check_block_ids("block_ids", block_ids, self._num_blocks)
        for block, times in Counter(block_ids).items():
            if times > self._ref[block]:
                raise ValueError(
                    f"block_ids: block {block} has {self._ref[block]} reference(s) but is "
                    f"freed {times} time(s) (freeing a block twice)"
                )
        reuse_first, evict_last = [], []
        for block in block_ids:
            self._ref[block] -= 1
            if self._ref[block] == 0:
                (evict_last if block in self._hash_of else reuse_first).append(block)
        for block in reversed(reuse_first):
            self._free[block] = None
            self._free.move_to_end(block, last=False)
        for block in evict_last:
            self._free[block] = None

    def cache_block(self, block_id: int, block_hash: bytes) -> bool:
        """Make a full, owned block findable by ``block_hash``. False (and nothing changes)
        if another block already holds that hash: the first one stays the cached copy."""
        block = provided.check_block_id("block_id", block_id, self._num_blocks)
        if self._ref[block] == 0:
            raise ValueError(f"block_id: block {block} is free; only owned blocks are cached")
        if self._hash_of.get(block, block_hash) != block_hash:
            raise ValueError(f"block_id: block {block} is cached under another hash already")
        if self._block_of.setdefault(block_hash, block) != block:
            return False
        self._hash_of[block] = block_hash
        return True

    def get_cached_block(self, block_hash: bytes) -> int | None:
        """The block cached under ``block_hash`` (owned or free), or None."""
        return self._block_of.get(block_hash)

    def block_hash(self, block_id: int) -> bytes | None:
        """The hash ``block_id`` is cached under, or None."""
        return self._hash_of.get(provided.check_block_id("block_id", block_id, self._num_blocks))

    def _evict(self, block: int) -> None:
        block_hash = self._hash_of.pop(block, None)
        if block_hash is not None:
            del self._block_of[block_hash]


# ---- 2. chained block hashes ----------------------------------------------------------------


def hash_block(parent_hash: bytes | None, token_ids: Any, extra_keys: tuple = ()) -> bytes:
    """The identity of a full block: SHA-256 over (parent hash, its tokens, extra keys).

    ``parent_hash`` is the previous block's hash (None for the first block, which then uses
    ``NONE_HASH``), so a block's hash covers every token before it as well as its own.
    """
    parent = provided.check_parent_hash(parent_hash)
    tokens = provided.check_token_ids("token_ids", token_ids)
    keys = provided.check_extra_keys(extra_keys)
    return hashlib.sha256(pickle.dumps((parent, tokens, keys), protocol=4)).digest()


# ---- 3. the cache manager -------------------------------------------------------------------


class KVCacheManager:
    """Who owns which block: one block table per request over a shared ``BlockPool``
    (vLLM: ``KVCacheManager`` in vllm/v1/core/kv_cache_manager.py).

    A request's tokens ``[0, num_tokens(request))`` have slots. Its full blocks are cached
    under their chained hashes (only with ``enable_prefix_caching``), so a later request
    with the same prefix reuses them instead of recomputing their K/V.
    """

    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True) -> None:
        self._pool = pool
        self.block_size = pool.block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._tables: dict[str, list[int]] = {}
        self._num_tokens: dict[str, int] = {}
        self._hashes: dict[str, list[bytes]] = {}  # the chain of the request's full blocks
        self._copies: list[BlockCopy] = []

    @property
    def request_ids(self) -> list[str]:
        """The requests that hold blocks, in the order they were admitted."""
        return list(self._tables)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest cached prefix of full blocks: ``(block_ids, num_computed_tokens)``.

        At most ``num_tokens - 1`` tokens: the last prompt token is always recomputed (its
        forward pass gives the logits of the next token), so a full hit still computes one
        token, and with whole blocks, recomputes the whole last block.
        """
        self._check_new(request)
        blocks, _ = self._lookup(request)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Slots for the next ``num_new_tokens`` tokens of ``request``; the new block ids
        (a copy-on-write copy first), or None, changing nothing, if the pool cannot serve.

        A request not yet held starts from its longest cached prefix (as
        ``get_computed_blocks`` reports it) and ``num_new_tokens`` counts the tokens after it.
        """
        n = provided.check_int("num_new_tokens", num_new_tokens)
        rid = provided.check_request(request)
        if rid not in self._tables:
            if n == 0:
                raise ValueError(
                    f"num_new_tokens must be >= 1 for request {rid!r}, which holds no blocks: "
                    "the last prompt token is always computed"
                )
            hit, hashes = self._lookup(request)
            table, num_tokens = list(hit), len(hit) * self.block_size
        else:
            hit, hashes = [], self._hashes[rid]
            table, num_tokens = self._tables[rid], self._num_tokens[rid]
        total = num_tokens + n
        if total > request.num_tokens:
            raise ValueError(
                f"num_new_tokens={n}: {num_tokens} tokens have slots and request "
                f"{rid!r} has only {request.num_tokens} tokens"
            )
        copy_on_write = self._must_copy(table, num_tokens, n)
        num_new_blocks = -(-total // self.block_size) - len(table) + copy_on_write
        evictable_hits = sum(self._pool.ref_count(b) == 0 for b in hit)
        if num_new_blocks + evictable_hits > self._pool.num_free_blocks:
            return None
        self._pool.touch(hit)  # before allocating: a hit must not be evicted for this request
        new_blocks = self._pool.allocate(num_new_blocks)
        if copy_on_write:
            src, dst = table[-1], new_blocks[0]
            self._copies.append(BlockCopy(src, dst))
            table = table[:-1] + [dst]
            self._pool.free([src])  # still held by its other owners
        self._tables[rid] = table + new_blocks[copy_on_write:]
        self._num_tokens[rid] = total
        self._hashes[rid] = list(hashes)
        self._cache_full_blocks(request)
        return new_blocks

    def take_copies(self) -> list[BlockCopy]:
        """The copy-on-writes ``allocate_slots`` decided since the last call (then cleared).
        Perform them (copy every slot of src into dst) before writing the new tokens."""
        copies, self._copies = self._copies, []
        return copies

    def free(self, request: Request | str) -> None:
        """Release every block of ``request``, tail first, so that its tail blocks are
        evicted before the head blocks other requests are more likely to share."""
        rid = self._known(request)
        self._pool.free(list(reversed(self._tables.pop(rid))))
        del self._num_tokens[rid], self._hashes[rid]

    def fork(self, request: Request, new_id: str) -> Request:
        """A new request ``new_id`` sharing every block of ``request`` (reference counts + 1);
        the first write into a shared partial block copies it (see ``allocate_slots``)."""
        rid = self._known(request)
        if not isinstance(new_id, str) or not new_id or new_id in self._tables:
            raise ValueError(f"new_id must be a new request id, got {new_id!r}")
        self._pool.touch(self._tables[rid])
        self._tables[new_id] = list(self._tables[rid])
        self._num_tokens[new_id] = self._num_tokens[rid]
        self._hashes[new_id] = list(self._hashes[rid])
        return Request(new_id, request.token_ids, request.extra_keys)

    def block_table(self, request: Request | str) -> list[int]:
        """The physical block of each logical block of ``request``."""
        return list(self._tables[self._known(request)])

    def num_tokens(self, request: Request | str) -> int:
        """How many tokens of ``request`` have slots."""
        return self._num_tokens[self._known(request)]

    def slot_mapping(self, request: Request | str, positions: Any) -> np.ndarray:
        """``block_table[p // block_size] * block_size + p % block_size`` per position."""
        rid = self._known(request)
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions.size and (positions.min() < 0 or positions.max() >= self._num_tokens[rid]):
            raise ValueError(
                f"positions must lie in [0, {self._num_tokens[rid]}) (the tokens of {rid!r} "
                f"that have slots), got {positions.tolist()}"
            )
        table = np.asarray(self._tables[rid], dtype=np.int64)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    # -- helpers --

    def _known(self, request: Request | str) -> str:
        rid = provided.request_id_of(request)
        if rid not in self._tables:
            raise provided.unknown_request(rid)
        return rid

    def _check_new(self, request: Request) -> None:
        if provided.check_request(request) in self._tables:
            raise ValueError(f"request {request.request_id!r} holds blocks already")

    def _lookup(self, request: Request) -> tuple[list[int], list[bytes]]:
        """The cached blocks of the longest full-block prefix (< num_tokens) and their hashes."""
        blocks: list[int] = []
        hashes: list[bytes] = []
        if not self.enable_prefix_caching:
            return blocks, hashes
        bs = self.block_size
        for i in range((request.num_tokens - 1) // bs):
            parent = hashes[-1] if hashes else None
            block_hash = hash_block(parent, request.token_ids[i * bs:(i + 1) * bs],
                                    request.extra_keys)
            block = self._pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
        return blocks, hashes

    def _must_copy(self, table: list[int], num_tokens: int, n: int) -> int:
        """1 if the new tokens start inside a partial last block that others share, else 0."""
        partial = num_tokens % self.block_size != 0
        return int(n > 0 and partial and self._pool.ref_count(table[-1]) > 1)

    def _cache_full_blocks(self, request: Request) -> None:
        """Hash every newly full block (never the partial last one) and cache it."""
        rid, bs = request.request_id, self.block_size
        hashes, table = self._hashes[rid], self._tables[rid]
        if not self.enable_prefix_caching:
            return
        for i in range(len(hashes), self._num_tokens[rid] // bs):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, request.token_ids[i * bs:(i + 1) * bs],
                                     request.extra_keys))
            self._pool.cache_block(table[i], hashes[-1])


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
    workload = provided.check_workload(requests, num_blocks * block_size, "num_blocks * block_size")
    max_num_seqs = provided.check_int("max_num_seqs", max_num_seqs, minimum=1)
    pool = BlockPool(num_blocks, block_size)
    manager = KVCacheManager(pool, enable_prefix_caching)
    recorder = provided.StatsRecorder(len(workload), num_blocks * block_size)
    requests = [Request(f"req-{i}", r.prompt_tokens) for i, r in enumerate(workload)]

    def grow_running(running: list[int], waiting: deque[int]) -> bool:
        """Slots for every running request's next token; True if anyone was preempted."""
        preempted, k = False, 0
        while k < len(running):
            current = running[k]
            req = requests[current]
            num_new = req.num_tokens - manager.num_tokens(req)
            while manager.allocate_slots(req, num_new) is None:
                victim = running.pop()  # the newest
                manager.free(requests[victim])
                waiting.appendleft(victim)  # it will recompute: prompt + outputs so far
                recorder.record_preemption()
                preempted = True
                if victim == current:
                    break
            else:
                k += 1
        return preempted

    def admit(running: list[int], waiting: deque[int]) -> None:
        while waiting and len(running) < max_num_seqs:
            req = requests[waiting[0]]
            _, num_cached = manager.get_computed_blocks(req)
            if manager.allocate_slots(req, req.num_tokens - num_cached) is None:
                return
            i = waiting.popleft()
            running.append(i)
            recorder.record_admission(i, len(workload[i].prompt_tokens), num_cached)

    def usage(running: list[int]) -> tuple[int, int]:
        """Held blocks are full except each request's last one (prefix hits are whole
        blocks), so the only unused slots are the tails of the last blocks."""
        reserved = (num_blocks - pool.num_free_blocks) * block_size
        empty = sum(-requests[i].num_tokens % block_size for i in running)
        return reserved - empty, reserved

    def finish(i: int) -> None:
        manager.free(requests[i])

    def schedule(running: list[int], waiting: deque[int]) -> None:
        if not grow_running(running, waiting):
            admit(running, waiting)

    provided.run_steps(workload, requests, recorder, schedule, usage, finish)
    return recorder.stats()


def simulate_contiguous(
    requests: list, num_blocks: int, block_size: int, max_num_seqs: int, max_model_len: int,
) -> Stats:
    """The pre-paging baseline: each admitted request reserves ``max_model_len`` contiguous
    slots of the ``num_blocks * block_size`` and keeps them until it finishes, so at most
    ``total_slots // max_model_len`` requests run at once. Same steps as ``simulate``;
    waiting requests are admitted in order while a reservation fits; nothing is ever
    preempted (a reservation covers the longest possible request); no prefix cache."""
    total = provided.check_int("num_blocks", num_blocks, 1) * provided.check_int(
        "block_size", block_size, 1)
    max_model_len = provided.check_int("max_model_len", max_model_len, minimum=1)
    if max_model_len > total:
        raise ValueError(f"max_model_len={max_model_len} exceeds the {total} slots of the pool")
    workload = provided.check_workload(requests, max_model_len, "max_model_len")
    max_num_seqs = provided.check_int("max_num_seqs", max_num_seqs, minimum=1)
    recorder = provided.StatsRecorder(len(workload), total)
    requests = [Request(f"req-{i}", r.prompt_tokens) for i, r in enumerate(workload)]
    capacity = min(max_num_seqs, total // max_model_len)

    def admit(running: list[int], waiting: deque[int]) -> None:
        while waiting and len(running) < capacity:
            i = waiting.popleft()
            running.append(i)
            recorder.record_admission(i, len(workload[i].prompt_tokens), 0)

    def usage(running: list[int]) -> tuple[int, int]:
        return sum(requests[i].num_tokens for i in running), max_model_len * len(running)

    provided.run_steps(workload, requests, recorder, admit, usage, lambda i: None)
    return recorder.stats()
