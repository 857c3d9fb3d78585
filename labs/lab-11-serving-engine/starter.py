"""Lab 11 starter: a continuous-batching engine that serves a Llama.

Your work goes in the functions and methods that raise ``NotImplementedError`` (the ones
marked ``# Given`` are given). Suggested order: ``paged_attention_forward`` and
``paged_prefill_logits`` (exercise 1: your paged attention inside transformers' model),
``sample``, ``Scheduler``, ``ModelRunner.prepare_inputs``, ``LLM.add_request`` and
``LLM.step``. Run the spec:

    LAB_IMPL=starter pytest labs/lab-11-serving-engine -q


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
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=11 STEP=1 LEVEL=1)")


def paged_prefill_logits(model_dir: str | os.PathLike[str] | provided.RandomModel,
                         token_ids: list[int], block_table: list[int], *, num_blocks: int,
                         block_size: int, chunk_size: int, attention: str = "numpy"
                         ) -> np.ndarray:
    """One prompt through transformers' model with the glue as its attention, in forward
    passes of ``chunk_size`` tokens, each continuing from the K/V the earlier ones left in a
    NaN-filled paged cache at ``block_table``. The logits of every token, ``[n, V]``."""
    raise NotImplementedError("TODO: HINTS.md step 1 (make hint LAB=11 STEP=1 LEVEL=1)")


# ---------------------------------------------------------------------------------------
# 2. Sampling.
# ---------------------------------------------------------------------------------------


def sample(logits: Any, params: provided.SamplingParams, rng: np.random.Generator | None
           ) -> int:
    """One token from ``logits [V]``: argmax when ``temperature == 0``; else
    ``softmax(logits / temperature)`` cut to the ``top_k`` largest, then to the smallest
    set (in descending probability) whose mass reaches ``top_p``, renormalised, and one draw
    ``rng.choice(V, p=probs)`` from the request's own generator."""
    raise NotImplementedError("TODO: HINTS.md step 2 (make hint LAB=11 STEP=2 LEVEL=1)")


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

    # Given
    def __init__(self, kv: provided.KVCacheManager, *, max_num_batched_tokens: int,
                 max_num_seqs: int) -> None:
        self.kv = kv
        self.max_num_batched_tokens = provided.check_int(
            "max_num_batched_tokens", max_num_batched_tokens, 1)
        self.max_num_seqs = provided.check_int("max_num_seqs", max_num_seqs, 1)
        self.waiting: list[provided.Sequence] = []  # head first
        self.running: list[provided.Sequence] = []

    # Given
    def add(self, seq: provided.Sequence) -> None:
        """Queue a new request at the tail of ``waiting``."""
        seq.status = "waiting"
        self.waiting.append(seq)

    # Given
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> provided.SchedulerOutput:
        """This step's batch: who runs and how many tokens each, in batch order (decode rows,
        running prefill chunks, newly admitted requests), and who was preempted."""
        raise NotImplementedError(
            "TODO: never more tokens than the budget; every running request keeps its blocks or "
            "is preempted (HINTS.md step 3: make hint LAB=11 STEP=3 LEVEL=1)"
        )

    def update_from_output(self, out: provided.SchedulerOutput, sampled: dict[str, int]
                           ) -> None:
        """After the forward pass: every scheduled request has ``num_new_tokens`` more
        computed tokens, and those in ``sampled`` (their prompt is done) one more output."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=11 STEP=3 LEVEL=1)")

    def _preempt_newest(self) -> provided.Sequence:
        """Recompute preemption: the newest running request loses its blocks and waits at
        the head of the queue; its tokens so far (prompt + outputs) are its new prompt."""
        raise NotImplementedError("TODO: HINTS.md step 3 (make hint LAB=11 STEP=3 LEVEL=1)")

    def finish(self, seq: provided.Sequence, reason: str) -> None:
        """``seq`` is done (``"stop"`` or ``"length"``): leave the queues, free its blocks."""
        raise NotImplementedError(
            "TODO: set status and finish_reason; a running request leaves running and frees its "
            "blocks; a waiting one leaves waiting."
        )


# ---------------------------------------------------------------------------------------
# 4. The model runner: one varlen batch per step.
# ---------------------------------------------------------------------------------------


class ModelRunner:
    """Keeps each running request's block table (updated from each ``SchedulerOutput``) and
    builds the step's ``provided.Batch`` (vLLM: vllm/v1/worker/gpu_model_runner.py)."""

    # Given
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.block_tables: dict[str, list[int]] = {}

    def prepare_inputs(self, out: provided.SchedulerOutput,
                       seqs: dict[str, provided.Sequence]) -> provided.Batch:
        """The step's varlen batch: every scheduled token back to back with its position and
        slot, each request's ``query_start_loc``, ``seq_lens``, block table and the row of its
        last token (``logits_indices``). Updates the kept block tables first."""
        raise NotImplementedError(
            "TODO: every scheduled token gets exactly one position and one slot (HINTS.md step 4:"
            " make hint LAB=11 STEP=4 LEVEL=1)"
        )

    # Given
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

    # Given
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
        raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=11 STEP=5 LEVEL=1)")

    def abort_request(self, request_id: str) -> None:
        """Drop a request (its blocks return to the pool)."""
        raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=11 STEP=5 LEVEL=1)")

    # Given
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[provided.RequestOutput]:
        """One scheduler step and one forward pass: the outputs of the requests that got a
        token this step (finished ones included, then forgotten)."""
        raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=11 STEP=5 LEVEL=1)")

    # Given
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
        raise NotImplementedError("TODO: HINTS.md step 5 (make hint LAB=11 STEP=5 LEVEL=1)")

    # Given
    def _output(self, seq: provided.Sequence) -> provided.RequestOutput:
        text = "" if self.tokenizer is None else self.tokenizer.decode(
            seq.output_token_ids, skip_special_tokens=True)
        return provided.RequestOutput(seq.request_id, seq.prompt_token_ids,
                                      tuple(seq.output_token_ids), text, seq.finish_reason)
