"""Lab 11 reference solution: a continuous-batching engine that serves a Llama.

    step():  scheduler.schedule()          who runs, how many tokens each (token budget)
             runner.prepare_inputs(...)    one varlen batch: positions, slot_mapping, tables
             provided.run_model(...)       transformers' model; attention = our glue
             sample(...) per request       greedy, or its own seeded generator
             scheduler.update(...)         append tokens, stop, free blocks

Laid out like nano-vllm's ``engine/`` and shaped like vLLM's surface
(``LLM.generate(prompts, SamplingParams)``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from common.loader import load_lab_module

provided = load_lab_module(__file__, "provided")
SamplingParams = provided.SamplingParams
RequestOutput = provided.RequestOutput

# ---------------------------------------------------------------------------------------
# 1. The glue: paged attention inside transformers' own model.
# ---------------------------------------------------------------------------------------


def paged_attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature, served from the paged cache of the forward context.

    query ``[1, H, T, d]``, key/value ``[1, KVH, T, d]``: the T scheduled tokens of every
    request back to back, RoPE applied. Write their K/V at ``slot_mapping`` first, then each
    request's queries attend its whole context through its block table. Returns
    ``(out [1, T, H, d], None)``.
    """
    ctx = provided.get_forward_context()
    layer = module.layer_idx
    k_cache, v_cache = ctx.k_caches[layer], ctx.v_caches[layer]
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    if ctx.attention == "numpy":  # [T, H, d] float64 on the host
        provided.write_kv(k_cache, v_cache, k.double().numpy(), v.double().numpy(),
                          ctx.slot_mapping)
        out = torch.from_numpy(provided.paged_attention(
            q.double().numpy(), k_cache, v_cache, ctx.query_start_loc, ctx.seq_lens,
            ctx.block_tables, scaling)).to(query.dtype)
    else:
        slots = torch.as_tensor(ctx.slot_mapping, dtype=torch.long)
        provided.write_kv(k_cache, v_cache, k, v, slots)
        out = provided.paged_attention_triton(
            q, k_cache, v_cache, ctx.query_start_loc, ctx.seq_lens, ctx.block_tables, scaling,
            max_query_len=ctx.max_query_len)
    return out[None], None


def paged_prefill_logits(model_dir: str | os.PathLike[str] | provided.RandomModel,
                         token_ids: list[int], block_table: list[int], *, num_blocks: int,
                         block_size: int, chunk_size: int, attention: str = "numpy"
                         ) -> np.ndarray:
    """One prompt through transformers' model with the glue as its attention, in forward
    passes of ``chunk_size`` tokens, each continuing from the K/V the earlier ones left in a
    NaN-filled paged cache at ``block_table``. The logits of every token, ``[n, V]``."""
    model, _ = provided.load_model(model_dir)
    model.set_attn_implementation(provided.register_attention(paged_attention_forward))
    cfg = model.config
    k_caches, v_caches = provided.new_kv_caches(cfg.num_hidden_layers, num_blocks, block_size,
                                                cfg.num_key_value_heads, cfg.head_dim, attention)
    table = np.asarray(block_table, dtype=np.int64)
    logits = []
    for start in range(0, len(token_ids), chunk_size):
        pos = np.arange(start, min(start + chunk_size, len(token_ids)))  # this chunk
        batch = provided.Batch(
            input_ids=np.asarray(token_ids, dtype=np.int64)[pos], positions=pos,
            query_start_loc=np.array([0, len(pos)]), seq_lens=np.array([pos[-1] + 1]),
            slot_mapping=table[pos // block_size] * block_size + pos % block_size,
            block_tables=table[None], logits_indices=np.arange(len(pos)))
        ctx = provided.ForwardContext(k_caches, v_caches, batch.query_start_loc,
                                      batch.seq_lens, batch.slot_mapping, batch.block_tables,
                                      attention, max_query_len=len(pos))
        logits.append(provided.run_model(model, batch, ctx).numpy())
    return np.concatenate(logits)


# ---------------------------------------------------------------------------------------
# 2. Sampling.
# ---------------------------------------------------------------------------------------


def sample(logits: Any, params: provided.SamplingParams, rng: np.random.Generator | None
           ) -> int:
    """One token from ``logits [V]``: argmax when ``temperature == 0``; else
    ``softmax(logits / temperature)`` cut to the ``top_k`` largest, then to the smallest
    set (in descending probability) whose mass reaches ``top_p``, renormalised, and one draw
    ``rng.choice(V, p=probs)`` from the request's own generator."""
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)  # [V]
    if params.temperature == 0:
        return int(np.argmax(logits))
    if rng is None:
        raise ValueError("rng must be the request's generator when temperature > 0")
    z = logits / params.temperature
    order = np.argsort(-z, kind="stable")  # [V], most likely first
    keep = np.zeros(z.shape, dtype=bool)
    k = len(z) if params.top_k == -1 else min(params.top_k, len(z))
    keep[order[:k]] = True
    probs = np.where(keep, np.exp(z - z.max()), 0.0)
    probs /= probs.sum()
    mass_before = np.cumsum(probs[order]) - probs[order]  # mass of the tokens ranked above
    keep[order[mass_before >= params.top_p]] = False  # the nucleus: until top_p is reached
    probs = np.where(keep, probs, 0.0)
    return int(rng.choice(len(z), p=probs / probs.sum()))


# ---------------------------------------------------------------------------------------
# 3. The scheduler: continuous batching under a token budget.
# ---------------------------------------------------------------------------------------


class Scheduler:
    """Waiting and running queues over a ``provided.KVCacheManager`` (vLLM:
    vllm/v1/core/sched/scheduler.py).

    Each ``schedule()``: decode rows first, then running requests' prefill chunks, then new
    requests from the waiting queue, until ``max_num_batched_tokens`` tokens or
    ``max_num_seqs`` requests. A prompt longer than the budget is prefilled in chunks, each
    continuing from ``num_computed_tokens``. When ``allocate_slots`` returns None the newest
    running request is preempted (its blocks freed, to be recomputed) and the allocation
    retried.
    """

    def __init__(self, kv: provided.KVCacheManager, *, max_num_batched_tokens: int,
                 max_num_seqs: int) -> None:
        self.kv = kv
        self.max_num_batched_tokens = provided.check_int(
            "max_num_batched_tokens", max_num_batched_tokens, 1)
        self.max_num_seqs = provided.check_int("max_num_seqs", max_num_seqs, 1)
        self.waiting: list[provided.Sequence] = []  # head first
        self.running: list[provided.Sequence] = []

    def add(self, seq: provided.Sequence) -> None:
        """Queue a new request at the tail of ``waiting``."""
        seq.status = "waiting"
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> provided.SchedulerOutput:
        """This step's batch: who runs and how many tokens each, in batch order (decode rows,
        running prefill chunks, newly admitted requests), and who was preempted."""
        budget = self.max_num_batched_tokens
        scheduled: dict[str, provided.ScheduledRequest] = {}
        preempted: list[str] = []
        decodes = [s for s in self.running if s.num_tokens - s.num_computed_tokens == 1]
        prefills = [s for s in self.running if s.num_tokens - s.num_computed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0 or seq.status != "running":
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            new_blocks = self.kv.allocate_slots(seq.request_id, seq.token_ids, n)
            while new_blocks is None:
                victim = self._preempt_newest()
                preempted.append(victim.request_id)
                if victim.request_id in scheduled:  # give back what it was granted
                    budget += scheduled.pop(victim.request_id).num_new_tokens
                if victim is seq:
                    break
                new_blocks = self.kv.allocate_slots(seq.request_id, seq.token_ids, n)
            if new_blocks is None:
                continue
            scheduled[seq.request_id] = provided.ScheduledRequest(
                seq.request_id, seq.num_computed_tokens, n, tuple(new_blocks), False)
            budget -= n
        while (self.waiting and budget > 0 and not preempted
               and len(self.running) < self.max_num_seqs):
            seq = self.waiting[0]
            _, num_computed = self.kv.get_computed_blocks(seq.request_id, seq.token_ids)
            n = min(seq.num_tokens - num_computed, budget)
            if self.kv.allocate_slots(seq.request_id, seq.token_ids, n) is None:
                break
            self.waiting.pop(0)
            seq.status, seq.num_computed_tokens = "running", num_computed
            self.running.append(seq)
            scheduled[seq.request_id] = provided.ScheduledRequest(
                seq.request_id, num_computed, n, tuple(self.kv.block_table(seq.request_id)),
                True)
            budget -= n
        return provided.SchedulerOutput(tuple(scheduled.values()), tuple(preempted))

    def update_from_output(self, out: provided.SchedulerOutput, sampled: dict[str, int]
                           ) -> None:
        """After the forward pass: every scheduled request has ``num_new_tokens`` more
        computed tokens, and those in ``sampled`` (their prompt is done) one more output."""
        for s in out.scheduled:
            seq = next(q for q in self.running if q.request_id == s.request_id)
            seq.num_computed_tokens += s.num_new_tokens
            if s.request_id in sampled:
                seq.output_token_ids.append(sampled[s.request_id])

    def _preempt_newest(self) -> provided.Sequence:
        """Recompute preemption: the newest running request loses its blocks and waits at
        the head of the queue; its tokens so far (prompt + outputs) are its new prompt."""
        victim = self.running.pop()
        self.kv.free(victim.request_id)
        victim.status, victim.num_computed_tokens = "waiting", 0
        victim.num_preemptions += 1
        self.waiting.insert(0, victim)
        return victim

    def finish(self, seq: provided.Sequence, reason: str) -> None:
        """``seq`` is done (``"stop"`` or ``"length"``): leave the queues, free its blocks."""
        seq.status, seq.finish_reason = "finished", reason
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq.request_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)


# ---------------------------------------------------------------------------------------
# 4. The model runner: one varlen batch per step.
# ---------------------------------------------------------------------------------------


class ModelRunner:
    """Keeps each running request's block table (updated from each ``SchedulerOutput``) and
    builds the step's ``provided.Batch`` (vLLM: vllm/v1/worker/gpu_model_runner.py)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.block_tables: dict[str, list[int]] = {}

    def prepare_inputs(self, out: provided.SchedulerOutput,
                       seqs: dict[str, provided.Sequence]) -> provided.Batch:
        """The step's varlen batch: every scheduled token back to back with its position and
        slot, each request's ``query_start_loc``, ``seq_lens``, block table and the row of its
        last token (``logits_indices``). Updates the kept block tables first."""
        for rid in out.preempted:
            self.block_tables.pop(rid, None)
        input_ids, positions, slots, seq_lens, tables = [], [], [], [], []
        query_start_loc = [0]
        for s in out.scheduled:
            if s.is_new:  # first scheduled, or resumed after a preemption: a fresh table
                self.block_tables[s.request_id] = list(s.block_ids)
            else:
                self.block_tables[s.request_id] += s.block_ids
            table = np.asarray(self.block_tables[s.request_id], dtype=np.int64)
            pos = np.arange(s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens)
            input_ids.append(np.asarray(seqs[s.request_id].token_ids, dtype=np.int64)[pos])
            positions.append(pos)
            slots.append(table[pos // self.block_size] * self.block_size
                         + pos % self.block_size)
            seq_lens.append(pos[-1] + 1)
            tables.append(table)
            query_start_loc.append(query_start_loc[-1] + s.num_new_tokens)
        width = max((len(t) for t in tables), default=1)
        block_tables = np.full((len(tables), width), -1, dtype=np.int64)
        for i, t in enumerate(tables):
            block_tables[i, :len(t)] = t
        qsl = np.asarray(query_start_loc, dtype=np.int64)
        cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
        return provided.Batch(
            input_ids=cat(input_ids), positions=cat(positions), query_start_loc=qsl,
            seq_lens=np.asarray(seq_lens, dtype=np.int64), slot_mapping=cat(slots),
            block_tables=block_tables, logits_indices=qsl[1:] - 1,
            request_ids=tuple(s.request_id for s in out.scheduled))

    def finish(self, request_id: str) -> None:
        self.block_tables.pop(request_id, None)


# ---------------------------------------------------------------------------------------
# 5. The engine.
# ---------------------------------------------------------------------------------------


class LLM:
    """A continuous-batching engine over a paged KV cache (vLLM: ``vllm.LLM``).

    ``model_dir``: a folder transformers loads (``config.json``, safetensors, tokenizer) or
    a ``provided.RandomModel``. ``num_blocks`` x ``block_size`` slots per layer;
    ``attention``: ``"numpy"`` (float64 reference) or ``"triton"`` (the Triton kernel; the
    interpreter on a CPU).
    """

    def __init__(self, model_dir: str | os.PathLike[str] | provided.RandomModel, *,
                 num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int, enable_prefix_caching: bool = True,
                 attention: str = "numpy") -> None:
        if attention not in provided.ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {provided.ATTENTION_BACKENDS}, got "
                             f"{attention!r}")
        self.model, self.tokenizer = provided.load_model(model_dir)
        provided.register_attention(paged_attention_forward)
        self.model.set_attn_implementation(provided.ATTENTION_NAME)
        cfg = self.model.config
        self.max_model_len = int(cfg.max_position_embeddings)
        self.eos_token_id = self.model.generation_config.eos_token_id
        self.attention = attention
        self.kv = provided.KVCacheManager(num_blocks, block_size, enable_prefix_caching)
        self.k_caches, self.v_caches = provided.new_kv_caches(
            cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads,
            cfg.head_dim, attention)
        self.scheduler = Scheduler(self.kv, max_num_batched_tokens=max_num_batched_tokens,
                                   max_num_seqs=max_num_seqs)
        self.runner = ModelRunner(block_size)
        self.seqs: dict[str, provided.Sequence] = {}
        self._next_id = 0

    def add_request(self, prompt: Iterable[int] | str, params: provided.SamplingParams,
                    request_id: str | None = None) -> str:
        """Queue a request (token ids, or text when the model has a tokenizer); its id."""
        if not isinstance(params, provided.SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {params!r}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is text but this model has no tokenizer")
            prompt = self.tokenizer(prompt).input_ids
        tokens = provided.check_prompt(prompt, self.model.config.vocab_size, self.max_model_len)
        slots = min(len(tokens) + params.max_tokens, self.max_model_len) - 1
        if -(-slots // self.kv.block_size) > self.kv.num_blocks:
            raise ValueError(
                f"num_blocks={self.kv.num_blocks} is too small for this request: it needs "
                f"{slots} KV slots = {-(-slots // self.kv.block_size)} blocks of "
                f"{self.kv.block_size}")
        if request_id is None:
            request_id, self._next_id = str(self._next_id), self._next_id + 1
        if request_id in self.seqs:
            raise ValueError(f"request_id {request_id!r} is in use")
        rng = np.random.default_rng(params.seed)
        seq = provided.Sequence(request_id, tokens, params, rng=rng)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Drop a request (its blocks return to the pool)."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            raise provided.unknown_request(request_id)
        self.scheduler.finish(seq, "abort")
        self.runner.finish(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[provided.RequestOutput]:
        """One scheduler step and one forward pass: the outputs of the requests that got a
        token this step (finished ones included, then forgotten)."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        batch = self.runner.prepare_inputs(out, self.seqs)
        ctx = provided.ForwardContext(
            self.k_caches, self.v_caches, batch.query_start_loc, batch.seq_lens,
            batch.slot_mapping, batch.block_tables, self.attention,
            max_query_len=max(s.num_new_tokens for s in out.scheduled))
        logits = provided.run_model(self.model, batch, ctx)  # [num_reqs, V]
        sampled = {}
        for row, s in enumerate(out.scheduled):
            seq = self.seqs[s.request_id]
            if s.num_computed_tokens + s.num_new_tokens == seq.num_tokens:  # prompt done
                sampled[s.request_id] = sample(logits[row].numpy(), seq.params, seq.rng)
        self.scheduler.update_from_output(out, sampled)
        outputs = []
        for rid, token in sampled.items():
            seq = self.seqs[rid]
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self.runner.finish(rid)
                del self.seqs[rid]
            outputs.append(self._output(seq))
        return outputs

    def generate(self, prompts: list[Any], params: provided.SamplingParams |
                 list[provided.SamplingParams]) -> list[provided.RequestOutput]:
        """Run ``prompts`` to completion; one ``RequestOutput`` each, in prompt order."""
        many = params if isinstance(params, list) else [params] * len(prompts)
        if len(many) != len(prompts):
            raise ValueError(f"params: {len(many)} for {len(prompts)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, many)]
        done: dict[str, provided.RequestOutput] = {}
        while self.has_unfinished_requests():
            done.update((o.request_id, o) for o in self.step() if o.finished)
        return [done[i] for i in ids]

    def _finish_reason(self, seq: provided.Sequence, token: int) -> str | None:
        """``"stop"``, ``"length"`` or None (keep going) after ``seq`` sampled ``token``."""
        if token in seq.params.stop_token_ids or (
                self.eos_token_id is not None and token == self.eos_token_id):
            return "stop"
        if len(seq.output_token_ids) >= seq.params.max_tokens or (
                seq.num_tokens >= self.max_model_len):
            return "length"
        return None

    def _output(self, seq: provided.Sequence) -> provided.RequestOutput:
        text = "" if self.tokenizer is None else self.tokenizer.decode(
            seq.output_token_ids, skip_special_tokens=True)
        return provided.RequestOutput(seq.request_id, seq.prompt_token_ids,
                                      tuple(seq.output_token_ids), text, seq.finish_reason)
