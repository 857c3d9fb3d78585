"""Lab 07 given code: the types that cross the API, the input checks, the workload and the
statistics recorder that ``starter.py`` and ``solution.py`` share. Nothing here is an
exercise; call the checks at the top of your functions.

Every type a test passes to your code or gets back from it lives here (``Request``,
``SimRequest``, ``BlockCopy``, ``Stats``, ``NoFreeBlocks``), so a grader can run your code in
another process and pickle them across. Bad input is a ``ValueError`` naming the argument.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

# The parent hash of a request's first block. vLLM derives its NONE_HASH from a seed the
# same way (vllm/v1/core/kv_cache_utils.py, init_none_hash).
NONE_HASH: bytes = hashlib.sha256(b"lab-07 none hash").digest()

# Output token j of simulated request i is OUTPUT_TOKEN_BASE + i * MAX_OUTPUT_LEN + j: ids no
# prompt of the synthetic workload uses, distinct per request.
OUTPUT_TOKEN_BASE = 1_000_000
MAX_OUTPUT_LEN = 100_000


class NoFreeBlocks(RuntimeError):
    """``BlockPool.allocate(n)`` was asked for more blocks than are free."""


# ---- checks ---------------------------------------------------------------------------------


def check_int(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as an int ``>= minimum``, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def check_token_ids(name: str, token_ids: Any) -> tuple[int, ...]:
    """Token ids as a tuple of non-negative ints, or ``ValueError`` naming ``name``."""
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Iterable):
        raise ValueError(f"{name} must be a sequence of token ids, got {token_ids!r}")
    tokens = tuple(token_ids)
    if set(map(type, tokens)) <= {int} and (not tokens or min(tokens) >= 0):
        return tokens  # the common case, checked at C speed
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or t < 0:
            raise ValueError(f"{name} must hold integers >= 0, got {t!r}")
    return tuple(int(t) for t in tokens)


def check_parent_hash(parent_hash: Any) -> bytes:
    """The parent hash as bytes (``None`` means the first block: ``NONE_HASH``)."""
    if parent_hash is None:
        return NONE_HASH
    if not isinstance(parent_hash, bytes) or not parent_hash:
        raise ValueError(f"parent_hash must be None or non-empty bytes, got {parent_hash!r}")
    return parent_hash


def check_extra_keys(extra_keys: Any) -> tuple:
    """Extra keys as a tuple of str/int/bytes (a LoRA name, a multimodal id, a cache salt)."""
    if isinstance(extra_keys, str | bytes) or not isinstance(extra_keys, Iterable):
        raise ValueError(f"extra_keys must be a tuple, got {extra_keys!r}")
    keys = tuple(extra_keys)
    for k in keys:
        if not isinstance(k, str | bytes | int):
            raise ValueError(f"extra_keys must hold str, bytes or int, got {k!r}")
    return keys


def check_block_id(name: str, block_id: Any, num_blocks: int) -> int:
    """A block id in ``[0, num_blocks)``, or ``ValueError`` naming ``name``."""
    if isinstance(block_id, bool) or not isinstance(block_id, int | np.integer):
        raise ValueError(f"{name} must hold block ids (integers), got {block_id!r}")
    if not 0 <= block_id < num_blocks:
        raise ValueError(f"{name}: block {int(block_id)} is not in [0, {num_blocks})")
    return int(block_id)


def check_block_ids(name: str, block_ids: Any, num_blocks: int) -> list[int]:
    """A list of block ids in ``[0, num_blocks)``, or ``ValueError`` naming ``name``."""
    if isinstance(block_ids, str | bytes) or not isinstance(block_ids, Iterable):
        raise ValueError(f"{name} must be a list of block ids, got {block_ids!r}")
    return [check_block_id(name, b, num_blocks) for b in block_ids]


def unknown_request(request_id: str) -> ValueError:
    """The error for a request the manager does not hold (never allocated, or freed)."""
    return ValueError(f"request {request_id!r} is unknown: it holds no blocks (freed already?)")


# ---- the request ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A sequence as the cache manager sees it: an id, every token known so far (prompt, then
    sampled outputs), and extra keys that take part in every block hash (e.g. a LoRA name).

    Immutable: ``request.appended(token)`` is the same request one token longer.
    """

    request_id: str
    token_ids: tuple[int, ...]
    extra_keys: tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty str, got {self.request_id!r}")
        object.__setattr__(self, "token_ids", check_token_ids("token_ids", self.token_ids))
        object.__setattr__(self, "extra_keys", check_extra_keys(self.extra_keys))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def appended(self, *token_ids: int) -> Request:
        """This request with ``token_ids`` added at the end (only those are checked)."""
        longer = object.__new__(Request)
        object.__setattr__(longer, "request_id", self.request_id)
        new = check_token_ids("token_ids", token_ids)
        object.__setattr__(longer, "token_ids", self.token_ids + new)
        object.__setattr__(longer, "extra_keys", self.extra_keys)
        return longer


def check_request(request: Any) -> str:
    """The id of ``request``, which must be a ``Request``; else ``ValueError``."""
    if not isinstance(request, Request):
        raise ValueError(f"request must be a Request, got {request!r}")
    return request.request_id


def request_id_of(request: Request | str) -> str:
    """The id of a ``Request`` (or the id itself), or ``ValueError`` naming ``request``."""
    if isinstance(request, Request):
        return request.request_id
    if isinstance(request, str) and request:
        return request
    raise ValueError(f"request must be a Request or a request id, got {request!r}")


class BlockCopy(NamedTuple):
    """A copy-on-write the worker must perform: copy every slot of ``src_block_id`` into
    ``dst_block_id`` (vLLM 0.33.0: ``KVCacheBlockCopy`` in vllm/v1/core/kv_cache_utils.py)."""

    src_block_id: int
    dst_block_id: int


# ---- the workload and the statistics of a simulation ----------------------------------------


class SimRequest(NamedTuple):
    """One request of a simulated workload: it arrives at step ``arrival`` with
    ``prompt_tokens`` and generates ``output_len`` tokens."""

    arrival: int
    prompt_tokens: tuple[int, ...]
    output_len: int


def check_workload(requests: Any, capacity: int, limit: str) -> list[SimRequest]:
    """The workload as a list of ``SimRequest``; ``ValueError`` naming ``requests`` if an item
    is malformed or needs more than ``capacity`` KV slots (``limit`` names that bound)."""
    if isinstance(requests, str | bytes) or not isinstance(requests, Iterable):
        raise ValueError("requests must be a list of (arrival, prompt_tokens, output_len)")
    workload = []
    for i, item in enumerate(requests):
        try:
            arrival, prompt, output_len = item
        except (TypeError, ValueError):
            message = f"requests[{i}] must be (arrival, prompt_tokens, output_len)"
            raise ValueError(message) from None
        arrival = check_int(f"requests[{i}].arrival", arrival)
        prompt = check_token_ids(f"requests[{i}].prompt_tokens", prompt)
        output_len = check_int(f"requests[{i}].output_len", output_len, minimum=1)
        if not prompt:
            raise ValueError(f"requests[{i}].prompt_tokens is empty: a request needs a prompt")
        if output_len >= MAX_OUTPUT_LEN:
            raise ValueError(f"requests[{i}].output_len must be < {MAX_OUTPUT_LEN}")
        if len(prompt) + output_len - 1 > capacity:
            raise ValueError(
                f"requests[{i}] needs {len(prompt) + output_len - 1} KV slots "
                f"(prompt + output_len - 1) but {limit} = {capacity}: it could never finish"
            )
        workload.append(SimRequest(arrival, prompt, output_len))
    return workload


def output_token(index: int, j: int) -> int:
    """The ``j``-th token that simulated request ``index`` generates."""
    return OUTPUT_TOKEN_BASE + index * MAX_OUTPUT_LEN + j


class Stats(NamedTuple):
    """What a simulation reports. Per-step tuples have one entry per scheduler step.

    used_slots:      slots holding a running request's K/V after the step was scheduled
    reserved_slots:  slots held by running requests (their blocks, or their reservations)
    """

    total_slots: int
    used_slots: tuple[int, ...]
    reserved_slots: tuple[int, ...]
    num_running: tuple[int, ...]
    preemptions: int
    prompt_tokens: int  # prompt tokens looked up at first admission
    cached_prompt_tokens: int  # of which the prefix cache held
    finish_step: tuple[int, ...]  # the step each request (workload order) finished in

    @property
    def steps(self) -> int:
        return len(self.used_slots)

    @property
    def utilisation(self) -> np.ndarray:
        """``used / total`` per step: the share of the KV pool holding real tokens."""
        return np.asarray(self.used_slots, dtype=float) / self.total_slots

    @property
    def mean_utilisation(self) -> float:
        """Mean of ``utilisation`` over the steps where something ran."""
        busy = np.asarray(self.num_running) > 0
        return float(self.utilisation[busy].mean()) if busy.any() else 0.0

    @property
    def waste(self) -> float:
        """Share of the held (reserved) slots that held no token, over the whole run."""
        reserved = sum(self.reserved_slots)
        return 1.0 - sum(self.used_slots) / reserved if reserved else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Share of prompt tokens served by the prefix cache (first admissions)."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class StatsRecorder:
    """Collects a simulation's numbers step by step and builds its ``Stats``."""

    def __init__(self, num_requests: int, total_slots: int) -> None:
        self.total_slots = total_slots
        self.used: list[int] = []
        self.reserved: list[int] = []
        self.running: list[int] = []
        self.preemptions = 0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.finish_step = [-1] * num_requests
        self._admitted: set[int] = set()

    def record_step(self, used: int, reserved: int, num_running: int) -> None:
        """Once per step, after scheduling: the slots in use and held, the running count."""
        self.used.append(int(used))
        self.reserved.append(int(reserved))
        self.running.append(int(num_running))

    def record_preemption(self) -> None:
        self.preemptions += 1

    def record_admission(self, index: int, num_prompt_tokens: int, num_cached: int) -> None:
        """Request ``index`` was admitted with ``num_cached`` tokens from the prefix cache;
        only its first admission counts (a resumed request re-reads its own blocks)."""
        if index not in self._admitted:
            self._admitted.add(index)
            self.prompt_tokens += num_prompt_tokens
            self.cached_prompt_tokens += min(num_cached, num_prompt_tokens)

    def record_finish(self, index: int, step: int) -> None:
        self.finish_step[index] = step

    @property
    def num_finished(self) -> int:
        return sum(s >= 0 for s in self.finish_step)

    def stats(self) -> Stats:
        return Stats(
            self.total_slots, tuple(self.used), tuple(self.reserved), tuple(self.running),
            self.preemptions, self.prompt_tokens, self.cached_prompt_tokens,
            tuple(self.finish_step),
        )


def run_steps(
    workload: list[SimRequest],
    requests: list[Request],
    recorder: StatsRecorder,
    schedule: Callable[[list[int], deque[int]], None],
    usage: Callable[[list[int]], tuple[int, int]],
    finish: Callable[[int], None],
) -> None:
    """The step loop of both simulations. Requests are named by their index in ``workload``;
    ``requests[i]`` holds request i's tokens so far (prompt, then outputs) and grows here.

    Each step, until every request has finished:
      1. requests whose ``arrival <= step`` join the end of ``waiting`` (arrival order);
      2. ``schedule(running, waiting)`` decides this step's batch: it moves requests between
         ``waiting`` and ``running`` (both mutated in place) and allocates their KV memory;
      3. ``recorder.record_step(*usage(running), len(running))``;
      4. every running request samples one token (``output_token``); one that has now
         produced ``output_len`` tokens is finished: ``finish(i)`` releases its memory, it
         leaves ``running``, and ``recorder.record_finish(i, step)``.
    """
    arrivals = deque(sorted(range(len(workload)), key=lambda i: (workload[i].arrival, i)))
    waiting: deque[int] = deque()
    running: list[int] = []
    step = 0
    while recorder.num_finished < len(workload):
        while arrivals and workload[arrivals[0]].arrival <= step:
            waiting.append(arrivals.popleft())
        schedule(running, waiting)
        used, reserved = usage(running)
        recorder.record_step(used, reserved, len(running))
        for i in list(running):
            generated = requests[i].num_tokens - len(workload[i].prompt_tokens)
            requests[i] = requests[i].appended(output_token(i, generated))
            if generated + 1 == workload[i].output_len:
                finish(i)
                running.remove(i)
                recorder.record_finish(i, step)
        step += 1


def synthetic_workload(
    num_requests: int,
    *,
    seed: int = 0,
    mean_prompt: float = 160.0,
    mean_output: float = 340.0,
    max_model_len: int = 1024,
    arrivals_per_step: float = 1.0,
    shared_prefix_len: int = 0,
    vocab_size: int = 32_000,
) -> list[SimRequest]:
    """A reproducible chat-like workload: log-normal prompt and output lengths (a long
    tail, as in conversation traces), Poisson arrivals, and optionally one shared system
    prompt of ``shared_prefix_len`` tokens in front of every prompt. Every request fits
    ``max_model_len``: ``prompt + output_len - 1 <= max_model_len``."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab_size, shared_prefix_len).tolist()
    gaps = rng.exponential(1.0 / arrivals_per_step, num_requests)
    arrivals = np.floor(np.cumsum(gaps) - gaps[0]).astype(int)
    workload = []
    for arrival in arrivals:
        prompt_len = int(np.clip(rng.lognormal(np.log(mean_prompt) - 0.32, 0.8), 4,
                                 max_model_len // 2))
        output_len = int(np.clip(rng.lognormal(np.log(mean_output) - 0.32, 0.8), 1,
                                 max_model_len + 1 - prompt_len - shared_prefix_len))
        prompt = system + rng.integers(0, vocab_size, prompt_len).tolist()
        workload.append(SimRequest(int(arrival), tuple(prompt), output_len))
    return workload
