"""Lab 11 given code: the types that cross the API, the model, the KV cache manager and the
two paged-attention backends the engine calls. Nothing here is an exercise.

- ``SamplingParams``, ``RequestOutput``, ``Sequence`` (one request's state in the engine),
  ``ScheduledRequest`` / ``SchedulerOutput`` (what the scheduler decided) and ``Batch``
  (what the model runner hands the model): every type a test passes or gets back.
- ``KVCacheManager``: block tables over a pool with prefix caching, the interface of
  lab-07's manager (``get_computed_blocks``, ``allocate_slots`` -> ``None`` when the pool
  cannot serve, ``free``, ``block_table``), keyed by request id and token ids.
- ``paged_attention`` (numpy, float64, built on ``common.reference``) and
  ``paged_attention_triton`` (one Triton kernel; the interpreter on a CPU): for every
  request of a varlen batch, its new queries over its whole context in the paged cache.
- ``ForwardContext`` / ``forward_context``: what the model runner sets before a forward pass
  and the attention function reads (vLLM 0.33.0: ``vllm/forward_context.py``).
- ``load_model``, ``RandomModel``, ``register_attention``, ``run_model``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.loader import REPO_ROOT
from common.paged import blocks_needed
from common.reference import prefix_mask, reference_attention
from common.triton_env import cdiv, dot_precision, log2e_scale, tl, triton

LAB = Path(__file__).resolve().parent
MODEL_DIR = REPO_ROOT / "models" / "adder"  # the course's trained model (make model)
ATTENTION_NAME = "course_paged"  # the name the glue is registered under in transformers
ATTENTION_BACKENDS = ("numpy", "triton")
FINISH_REASONS = ("stop", "length")


# ---- checks ---------------------------------------------------------------------------------


def check_int(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as an int ``>= minimum``, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def check_prompt(prompt: Any, vocab_size: int, max_model_len: int) -> tuple[int, ...]:
    """A prompt as token ids: non-empty, ids in ``[0, vocab_size)``, shorter than the
    model's context (one slot must stay for the first output token); else ``ValueError``
    naming ``prompt``."""
    if isinstance(prompt, str | bytes) or not hasattr(prompt, "__iter__"):
        raise ValueError(f"prompt must be a sequence of token ids, got {prompt!r}")
    tokens = tuple(prompt)
    if not tokens:
        raise ValueError("prompt is empty: a request needs at least one token")
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < vocab_size:
            raise ValueError(f"prompt holds {t!r}: token ids must lie in [0, {vocab_size})")
    if len(tokens) >= max_model_len:
        raise ValueError(f"prompt has {len(tokens)} tokens: the model's context "
                         f"(max_model_len) is {max_model_len}, so at most {max_model_len - 1}")
    return tuple(int(t) for t in tokens)


def unknown_request(request_id: Any) -> ValueError:
    return ValueError(f"request_id {request_id!r} is unknown: never added, or finished already")


# ---- the types that cross the API ------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each output token (vLLM: ``SamplingParams``).

    ``temperature == 0`` is greedy (argmax; ties to the lowest id). Otherwise the logits are
    divided by ``temperature``, restricted to the ``top_k`` largest (``-1``: all) and then to
    the smallest set whose probability reaches ``top_p``, and one token is drawn with the
    request's own generator, seeded by ``seed`` (``None``: fresh entropy). Generation stops
    after ``max_tokens`` tokens, at a token of ``stop_token_ids`` or at the model's EOS.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_int("max_tokens", self.max_tokens, 1)
        if not (isinstance(self.temperature, int | float) and self.temperature >= 0
                and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got "
                             f"{self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or (
                self.top_k != -1 and self.top_k < 1):
            raise ValueError(f"top_k must be -1 (all tokens) or >= 1, got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.seed is not None:
            check_int("seed", self.seed)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass
class RequestOutput:
    """What ``LLM.generate`` and ``LLM.step`` return for a request (vLLM: ``RequestOutput``):
    the output token ids so far (a stop token included), their text, and ``finish_reason``
    (``"stop"``, ``"length"``, or ``None`` while it runs)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str = ""
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class Sequence:
    """One request inside the engine (vLLM: ``Request`` in vllm/v1/request.py).

    ``token_ids`` is the prompt followed by every output token so far;
    ``num_computed_tokens`` of them have K/V in the cache. ``status`` is ``"waiting"``,
    ``"running"`` or ``"finished"``. ``rng`` is the request's own random generator.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: str = "waiting"
    finish_reason: str | None = None
    num_preemptions: int = 0
    rng: np.random.Generator | None = None

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + tuple(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass(frozen=True)
class ScheduledRequest:
    """One row group of a step: ``num_new_tokens`` tokens of ``request_id`` starting at
    ``num_computed_tokens``. ``block_ids`` is the request's whole block table when
    ``is_new`` (first scheduled, or resumed after a preemption), else only the blocks
    allocated this step (vLLM: ``NewRequestData`` / ``CachedRequestData``)."""

    request_id: str
    num_computed_tokens: int
    num_new_tokens: int
    block_ids: tuple[int, ...]
    is_new: bool


@dataclass(frozen=True)
class SchedulerOutput:
    """A step's decision: the scheduled requests in batch order, and the requests preempted
    (their blocks freed; they wait to be recomputed)."""

    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[str, ...] = ()

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass
class Batch:
    """One forward pass over a varlen batch (vLLM: ``CommonAttentionMetadata``).

    input_ids, positions, slot_mapping: ``[num_tokens]`` int64, the scheduled tokens of all
        requests back to back;
    query_start_loc: ``[num_reqs + 1]`` int64, request ``i``'s tokens are
        ``query_start_loc[i]:query_start_loc[i + 1]``;
    seq_lens: ``[num_reqs]`` int64, tokens with K/V after this step (context + new);
    block_tables: ``[num_reqs, max_blocks]`` int64 (padding ``-1``);
    logits_indices: ``[num_reqs]`` int64, the row of each request's last scheduled token.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    logits_indices: np.ndarray
    request_ids: tuple[str, ...] = ()


# ---- the KV cache manager ---------------------------------------------------------------------


def hash_block(parent: bytes, token_ids: tuple[int, ...]) -> bytes:
    """A full block's identity: its tokens and everything before them (the parent hash)."""
    return hashlib.sha256(parent + np.asarray(token_ids, dtype=np.int64).tobytes()).digest()


class KVCacheManager:
    """Block tables over a pool of ``num_blocks`` blocks of ``block_size`` slots, with prefix
    caching of full blocks (lab-07's interface, keyed by request id and token ids; vLLM
    0.33.0: vllm/v1/core/kv_cache_manager.py).

    Free blocks wait in LRU order; a freed block keeps its hash and K/V until it is reused,
    so a later request with the same prefix can take it back (``get_computed_blocks``).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
                 ) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, 1)
        self.block_size = check_int("block_size", block_size, 1)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._tables: dict[str, list[int]] = {}
        self._num_tokens: dict[str, int] = {}
        self.num_hit_tokens = 0  # prefix-cache statistics, over every admission
        self.num_lookup_tokens = 0
        self.num_failed_allocations = 0  # allocate_slots calls answered None (pool ran out)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def request_ids(self) -> list[str]:
        return list(self._tables)

    def get_computed_blocks(self, request_id: str, token_ids: tuple[int, ...]
                            ) -> tuple[list[int], int]:
        """The longest cached prefix of full blocks, at most ``len(token_ids) - 1`` tokens
        (the last token is always computed: its forward pass gives the next token's
        logits): ``(block_ids, num_computed_tokens)``."""
        if request_id in self._tables:
            raise ValueError(f"request_id {request_id!r} holds blocks already")
        blocks = self._lookup(token_ids)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request_id: str, token_ids: tuple[int, ...], num_new_tokens: int
                       ) -> list[int] | None:
        """Slots for the next ``num_new_tokens`` tokens of the request; the new block ids,
        or ``None`` (changing nothing) when the pool cannot serve. A request not held yet
        starts from its cached prefix (``get_computed_blocks``)."""
        n = check_int("num_new_tokens", num_new_tokens, 1)
        if request_id in self._tables:
            hit, table, have = [], self._tables[request_id], self._num_tokens[request_id]
        else:
            hit = self._lookup(token_ids)
            table, have = hit, len(hit) * self.block_size
        if have + n > len(token_ids):
            raise ValueError(f"num_new_tokens={n}: {have} tokens have slots and request "
                             f"{request_id!r} has only {len(token_ids)} tokens")
        need = blocks_needed(have + n, self.block_size) - len(table)
        evictable_hits = sum(b in self._free for b in hit)
        if need + evictable_hits > len(self._free):
            self.num_failed_allocations += 1
            return None
        for b in hit:  # a hit leaves the free queue before anything is allocated
            self._free.pop(b, None)
            self._refs[b] += 1
        if request_id not in self._tables:
            self.num_hit_tokens += len(hit) * self.block_size
            self.num_lookup_tokens += len(token_ids)
        new = [self._take() for _ in range(need)]
        self._tables[request_id] = table + new
        self._num_tokens[request_id] = have + n
        self._cache_full_blocks(request_id, token_ids)
        return new

    def free(self, request_id: str) -> None:
        """Release every block of the request (tail first: evicted before shared heads)."""
        for b in reversed(self._tables.pop(self._known(request_id))):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None
        del self._num_tokens[request_id]

    def block_table(self, request_id: str) -> list[int]:
        return list(self._tables[self._known(request_id)])

    def num_tokens(self, request_id: str) -> int:
        """How many tokens of the request have slots."""
        return self._num_tokens[self._known(request_id)]

    def _known(self, request_id: str) -> str:
        if request_id not in self._tables:
            raise unknown_request(request_id)
        return request_id

    def _take(self) -> int:
        block, _ = self._free.popitem(last=False)  # least recently freed
        if block in self._hash_of:  # evict its cached identity
            del self._block_of[self._hash_of.pop(block)]
        self._refs[block] = 1
        return block

    def _hashes(self, token_ids: tuple[int, ...], num_blocks: int) -> Iterator[bytes]:
        parent, bs = b"lab-11", self.block_size
        for i in range(num_blocks):
            parent = hash_block(parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            yield parent

    def _lookup(self, token_ids: tuple[int, ...]) -> list[int]:
        blocks: list[int] = []
        if not self.enable_prefix_caching:
            return blocks
        for h in self._hashes(token_ids, (len(token_ids) - 1) // self.block_size):
            if h not in self._block_of:
                break
            blocks.append(self._block_of[h])
        return blocks

    def _cache_full_blocks(self, request_id: str, token_ids: tuple[int, ...]) -> None:
        if not self.enable_prefix_caching:
            return
        table = self._tables[request_id]
        full = self._num_tokens[request_id] // self.block_size
        for block, h in zip(table[:full], self._hashes(token_ids, full)):
            if block not in self._hash_of and h not in self._block_of:
                self._hash_of[block], self._block_of[h] = h, block


# ---- paged attention: the two backends ------------------------------------------------------


def check_varlen(q: Any, k_cache: Any, query_start_loc: Any, seq_lens: Any, block_tables: Any
                 ) -> None:
    """Shapes of a varlen paged batch, or ``ValueError`` naming the argument."""
    if len(q.shape) != 3 or len(k_cache.shape) != 4:
        raise ValueError(f"q must be [num_tokens, H, d] and k_cache [blocks, block_size, KVH, "
                         f"d], got {tuple(q.shape)} and {tuple(k_cache.shape)}")
    num_reqs = len(seq_lens)
    if len(query_start_loc) != num_reqs + 1 or len(block_tables) != num_reqs:
        raise ValueError(f"query_start_loc must have num_reqs + 1 = {num_reqs + 1} entries and "
                         f"block_tables {num_reqs} rows, got {len(query_start_loc)} and "
                         f"{len(block_tables)}")


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                    query_start_loc: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray,
                    scale: float | None = None) -> np.ndarray:
    """Causal attention of a varlen batch over a paged cache, in float64.

    q ``[num_tokens, H, d]``; request ``i``'s queries are rows
    ``query_start_loc[i]:query_start_loc[i+1]`` and are the LAST ``q_len`` of its
    ``seq_lens[i]`` tokens (a prefill chunk, or one decode token), so query ``j`` sits at
    position ``seq_lens[i] - q_len + j`` and sees keys ``<=`` that position. Returns
    ``out [num_tokens, H, d]`` float64.
    """
    check_varlen(q, k_cache, query_start_loc, seq_lens, block_tables)
    out = np.zeros(q.shape, dtype=np.float64)
    block_size = k_cache.shape[1]
    for i, seq_len in enumerate(np.asarray(seq_lens, dtype=np.int64)):
        lo, hi = int(query_start_loc[i]), int(query_start_loc[i + 1])
        pos = np.arange(seq_len)  # the context, gathered through the block table
        blocks = np.asarray(block_tables[i], dtype=np.int64)[pos // block_size]
        k, v = k_cache[blocks, pos % block_size], v_cache[blocks, pos % block_size]
        query_pos = np.arange(seq_len - (hi - lo), seq_len)
        out[lo:hi], _ = reference_attention(q[lo:hi], k, v, scale=scale,
                                            mask=prefix_mask(query_pos, int(seq_len)))
    return out


@triton.jit
def _varlen_paged_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_tables_ptr, qk_scale,
    stride_q_tok, stride_q_head, stride_k_block, stride_k_slot, stride_k_head,
    stride_table, stride_o_tok, stride_o_head,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program = BLOCK_M queries of one request x the GROUP query heads of one KV head
    (``BLOCK_M * GROUP`` rows of one tile); online softmax over the request's context in
    tiles of BLOCK_N positions read through its block table."""
    req, kv_head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_lo = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_lo
    seq_len = tl.load(seq_lens_ptr + req)
    rows = tl.arange(0, BLOCK_M * GROUP)
    token = tile * BLOCK_M + rows // GROUP  # [ROWS] the query each row belongs to
    head = kv_head * GROUP + rows % GROUP  # [ROWS] and its query head
    row_ok = token < q_len
    dims = tl.arange(0, HEAD_DIM)
    q_off = (q_lo + token)[:, None] * stride_q_tok + head[:, None] * stride_q_head + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0)  # [ROWS, HEAD_DIM]
    q_pos = seq_len - q_len + token  # where each query sits in the sequence
    m = tl.full([BLOCK_M * GROUP], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M * GROUP], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP, HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        in_seq = pos < seq_len
        block = tl.load(block_tables_ptr + req * stride_table + pos // BLOCK_SIZE,
                        mask=in_seq, other=0).to(tl.int64)
        slot = block * stride_k_block + (pos % BLOCK_SIZE) * stride_k_slot
        kv = slot[:, None] + kv_head * stride_k_head + dims[None, :]
        k = tl.load(k_cache_ptr + kv, mask=in_seq[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        v = tl.load(v_cache_ptr + kv, mask=in_seq[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        causal = (pos[None, :] <= q_pos[:, None]) & in_seq[None, :]
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = alpha * l + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m = m_new
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    o_off = (q_lo + token)[:, None] * stride_o_tok + head[:, None] * stride_o_head + dims[None, :]
    tl.store(out_ptr + o_off, out, mask=row_ok[:, None])


def paged_attention_triton(q: Any, k_cache: Any, v_cache: Any, query_start_loc: Any,
                           seq_lens: Any, block_tables: Any, scale: float | None = None, *,
                           max_query_len: int | None = None, block_m: int = 8,
                           block_n: int = 16) -> Any:
    """``paged_attention`` as one Triton kernel on torch float32 tensors (the interpreter on
    a CPU). ``max_query_len`` (the host knows it) sizes the grid; None reads it."""
    import torch

    check_varlen(q, k_cache, query_start_loc, seq_lens, block_tables)
    num_tokens, num_heads, head_dim = q.shape
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 here, got {head_dim}")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    qsl = torch.as_tensor(query_start_loc, dtype=torch.int32)
    lens = torch.as_tensor(seq_lens, dtype=torch.int32)
    tables = torch.as_tensor(block_tables, dtype=torch.int32).contiguous()
    if max_query_len is None:
        max_query_len = int((qsl[1:] - qsl[:-1]).max()) if len(lens) else 0
    out = torch.zeros_like(q)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    grid = (len(lens), k_cache.shape[2], cdiv(max(max_query_len, 1), block_m))
    _varlen_paged_kernel[grid](
        q, k_cache, v_cache, out, qsl, lens, tables, log2e_scale(scale),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        tables.stride(0), out.stride(0), out.stride(1),
        GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=dot_precision(q.dtype),
    )
    return out


def write_kv(k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
    """Scatter the new tokens' K/V (``[num_tokens, KVH, d]``) into the caches in place:
    token ``i`` goes to flat slot ``slot_mapping[i]`` (lab-01's ``write_kv``)."""
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    k_cache.reshape(-1, kvh, d)[slot_mapping] = k
    v_cache.reshape(-1, kvh, d)[slot_mapping] = v


# ---- the forward context ---------------------------------------------------------------------


@dataclass
class ForwardContext:
    """What one forward pass's attention layers read (vLLM: ``ForwardContext``).

    ``k_caches[layer]``, ``v_caches[layer]``: ``[num_blocks, block_size, KVH, d]`` (numpy
    float64 for ``attention="numpy"``, torch float32 for ``"triton"``); the metadata as in
    ``Batch``. ``max_query_len`` is known on the host (no device read in the kernel's launch).
    """

    k_caches: list[Any]
    v_caches: list[Any]
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    attention: str = "numpy"
    max_query_len: int = 0


_CONTEXT: list[ForwardContext] = []


@contextlib.contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    """``with forward_context(ctx): model(...)``: the attention layers see ``ctx``."""
    _CONTEXT.append(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.pop()


def get_forward_context() -> ForwardContext:
    if not _CONTEXT:
        raise RuntimeError("no forward context: call the model inside `with forward_context()`")
    return _CONTEXT[-1]


def new_kv_caches(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                  head_dim: int, attention: str) -> tuple[list[Any], list[Any]]:
    """One K and one V cache per layer, filled with NaN (a slot nobody wrote poisons the
    output): numpy float64 for ``"numpy"``, torch float32 for ``"triton"``."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if attention == "numpy":
        make = lambda: np.full(shape, np.nan)  # noqa: E731
    else:
        import torch

        make = lambda: torch.full(shape, float("nan"))  # noqa: E731
    return [make() for _ in range(num_layers)], [make() for _ in range(num_layers)]


# ---- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomModel:
    """A random-weight model of the course model's shape, built from its config in code (no
    file): for unit tests. ``eos_token_id`` is None, so generation runs to ``max_tokens``."""

    seed: int = 0
    num_hidden_layers: int = 2
    initializer_range: float = 0.2  # big weights: clear winners among the logits
    max_position_embeddings: int = 64
    vocab_size: int = 32


def model_config(spec: RandomModel) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=64, intermediate_size=192,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
        initializer_range=spec.initializer_range, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )


def load_model(model: str | os.PathLike[str] | RandomModel = MODEL_DIR) -> tuple[Any, Any]:
    """``(LlamaForCausalLM in float32, eval mode; its tokenizer or None)`` from a local
    folder (offline: nothing is downloaded) or a ``RandomModel``."""
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    if isinstance(model, RandomModel):
        torch.manual_seed(model.seed)
        net = LlamaForCausalLM(model_config(model)).float().eval()
        net.generation_config.eos_token_id = None
        return net, None
    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise ValueError(f"model_dir {str(folder)!r} holds no config.json (run `make model`)")
    # Each file read by name (never a directory listing: the grader's sandbox may not list
    # the course's folders), as LlamaForCausalLM.from_pretrained(folder) would read them.
    from safetensors.torch import load_file
    from transformers import GenerationConfig, LlamaConfig

    config = LlamaConfig.from_json_file(str(folder / "config.json"))
    net = LlamaForCausalLM(config).float()
    # tied embeddings (SmolLM2): the file holds embed_tokens only, and lm_head is that tensor
    missing, unexpected = net.load_state_dict(load_file(str(folder / "model.safetensors")),
                                              strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"model_dir {str(folder)!r}: model.safetensors lacks "
                         f"{sorted(set(missing) - tied)} and has unknown {sorted(unexpected)}")
    if tied:
        net.tie_weights()
    net.generation_config = GenerationConfig.from_dict(
        json.loads((folder / "generation_config.json").read_text()))
    special = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        **{k: special[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")
           if k in special})
    return net.eval(), tokenizer


def register_attention(fn: Any, name: str = ATTENTION_NAME) -> str:
    """Register ``fn`` in transformers' ``AttentionInterface`` under ``name`` (no mask
    function is registered, so transformers builds no mask: ``fn`` applies its own)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, fn)
    return name


def run_model(model: Any, batch: Batch, ctx: ForwardContext) -> Any:
    """One forward pass of ``batch`` (all requests' tokens as ONE row, positions given) with
    the paged attention of ``ctx``: the logits of ``batch.logits_indices``, ``[num_reqs, V]``
    float32 torch. The model must have the glue set (``model.set_attn_implementation``)."""
    import torch

    with torch.no_grad(), forward_context(ctx):
        out = model(input_ids=torch.as_tensor(batch.input_ids, dtype=torch.long)[None],
                    position_ids=torch.as_tensor(batch.positions, dtype=torch.long)[None],
                    use_cache=False,
                    logits_to_keep=torch.as_tensor(batch.logits_indices, dtype=torch.long))
    return out.logits[0]
