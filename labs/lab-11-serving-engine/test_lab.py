"""Lab 11 spec: a continuous-batching engine that serves a Llama, token for token.

The oracle is transformers' own model: its logits and its greedy ``generate()`` on the same
weights (sdpa attention, float32), never ``solution.py``. The paged caches start as NaN, so
a slot nobody wrote, a stale block table or a wrong slot mapping shows up as NaN or as a
different token. The trained model (``models/adder``) must give exact sums.

Run:  LAB_IMPL=starter pytest labs/lab-11-serving-engine -q   (grades starter.py)
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common.loader import load_impl, load_lab_module
from common.testing import BadInputs, bad_input_test, call_all, called_on_copies, examples

torch.set_num_threads(1)  # a loaded 2-core machine is 100x slower at two threads

impl = called_on_copies(load_impl(__file__))  # every call gets copies of its arrays
provided = load_lab_module(__file__, "provided")
SamplingParams = provided.SamplingParams
RANDOM = provided.RandomModel(seed=0)
VOCAB = RANDOM.vocab_size

# ---- the misconceptions, as the failure messages name them ---------------------------------

WRITE_FIRST = (
    "K/V must be written into the cache BEFORE attention reads it: a prefill's queries "
    "attend their own chunk's keys, which are only in the cache once write_kv has run (NaN "
    "here means they were read before they were written)"
)
CHUNK_CONTINUES = (
    "a prefill chunk continues from num_computed_tokens: its positions (hence RoPE), its "
    "slots and its seq_len (context + chunk) all start where the last chunk stopped"
)
POSITIONS = (
    "positions are absolute: after a prefix-cache hit of h tokens the first computed token "
    "sits at position h (not 0, not h + 1); RoPE and the causal mask both read it"
)
STALE_TABLE = (
    "a preempted request comes back with NEW blocks: its block table is replaced when it "
    "is resumed (is_new), not extended from the old one"
)
SLOTS = (
    "each token's slot comes from ITS request's block table: slot = table[p // block_size] "
    "* block_size + p % block_size"
)
LAST_TOKEN_LOGITS = (
    "the next token comes from the logits of each request's LAST scheduled token "
    "(logits_indices = query_start_loc[1:] - 1), and only once its prompt is fully computed "
    "(a partial prefill chunk samples nothing)"
)
OWN_GENERATOR = (
    "each request owns its generator, seeded by its own SamplingParams.seed: a shared one "
    "makes a request's tokens depend on which other requests ran beside it"
)
LEAK = (
    "every block returns to the pool when a request finishes, is aborted or fails: free "
    "the request's blocks in the manager (kv.free) and forget its table"
)


# ---- the oracle -------------------------------------------------------------------------------


@functools.cache
def reference_model(spec: provided.RandomModel = RANDOM):
    model, _ = provided.load_model(spec)
    model.set_attn_implementation("sdpa")
    return model


@functools.cache
def reference_tokens(prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """transformers' greedy generate() (an explicit all-ones attention_mask: without it, a
    prompt token equal to the pad id would be masked out)."""
    ids = torch.tensor([prompt])
    out = reference_model().generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_tokens, eos_token_id=None,
                                     pad_token_id=0)
    return tuple(out[0, len(prompt):].tolist())


def reference_logits(prompt: list[int]) -> np.ndarray:
    with torch.no_grad():
        return reference_model()(input_ids=torch.tensor([prompt])).logits[0].numpy()


def workload(seed: int, n: int, *, shared_prefix: int = 9, max_len: int = 12
             ) -> list[tuple[int, ...]]:
    """``n`` prompts of 1..max_len tokens; every other one starts with the same
    ``shared_prefix`` tokens (a system prompt: prefix-cache hits)."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, VOCAB, shared_prefix).tolist()
    return [tuple((prefix if i % 2 else []) + rng.integers(0, VOCAB, int(rng.integers(
        1, max_len + 1))).tolist()) for i in range(n)]


def run_arrivals(llm, prompts, params, arrivals_per_step: int) -> dict[str, tuple[int, ...]]:
    """Add ``arrivals_per_step`` requests before each step (the rest arrive later), step
    until all finish: ``{request_id: output tokens}``."""
    pending = list(enumerate(prompts))
    done: dict[str, tuple[int, ...]] = {}
    idle = 0  # steps in a row that gave no request a token
    while pending or llm.has_unfinished_requests():
        for _ in range(min(arrivals_per_step, len(pending))):
            i, prompt = pending.pop(0)
            llm.add_request(list(prompt), params, request_id=f"r{i}")
        outputs = llm.step()
        idle = 0 if outputs else idle + 1
        assert idle < 500, (
            f"the engine stalled: 500 steps in a row gave no request a token, "
            f"{len(done)} of {len(prompts)} finished. Likely the pool never gets its blocks "
            f"back: {LEAK}")
        for out in outputs:
            if out.finished:
                done[out.request_id] = out.token_ids
    return done


def first_difference(got, want) -> str:
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"first differs at output token {i}: got {list(got)}, transformers {list(want)}"


# ---- 1. the glue: paged attention inside transformers' model ---------------------------------


def shuffled_table(n_tokens: int, block_size: int, seed: int) -> tuple[list[int], int]:
    """A block table for ``n_tokens`` over a pool with spare (NaN) blocks, physical blocks
    in shuffled order: ``(table, num_blocks)``."""
    need = -(-n_tokens // block_size)
    num_blocks = need + 3
    return np.random.default_rng(seed).permutation(num_blocks)[:need].tolist(), num_blocks


@pytest.mark.points(3)
@pytest.mark.parametrize("chunk_size", [64, 5, 1])
def test_the_glue_runs_transformers_model_over_the_paged_cache(chunk_size):
    """Exercise 1: the prompt in one pass, in chunks of 5, and one token at a time (decode)
    gives transformers' own logits for every token."""
    prompt = list(workload(1, 2)[1])  # 9 + a few tokens
    table, num_blocks = shuffled_table(len(prompt), 4, seed=chunk_size)
    got = impl.paged_prefill_logits(RANDOM, prompt, table, num_blocks=num_blocks, block_size=4,
                                    chunk_size=chunk_size)
    want = reference_logits(prompt)
    assert not np.isnan(got).any(), WRITE_FIRST
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0, err_msg=(
        f"chunks of {chunk_size}: the logits differ from transformers' (sdpa). "
        + (CHUNK_CONTINUES if chunk_size < len(prompt) else
           "query/key/value arrive as [1, heads, tokens, head_dim] with RoPE applied; the "
           "output must be [1, tokens, heads, head_dim]")))


@pytest.mark.points(2)
@pytest.mark.triton
def test_the_glue_through_the_triton_kernel():
    prompt = list(workload(2, 2)[1])
    table, num_blocks = shuffled_table(len(prompt), 4, seed=3)
    got = impl.paged_prefill_logits(RANDOM, prompt, table, num_blocks=num_blocks, block_size=4,
                                    chunk_size=8, attention="triton")
    assert not np.isnan(got).any(), WRITE_FIRST
    np.testing.assert_allclose(got, reference_logits(prompt), atol=2e-4, rtol=0,
                               err_msg="attention='triton': " + CHUNK_CONTINUES)


# ---- 2. sampling ------------------------------------------------------------------------------


@pytest.mark.points(1)
def test_greedy_is_the_argmax_with_ties_to_the_lowest_id():
    logits = np.array([0.5, 2.0, -1.0, 2.0])
    assert impl.sample(logits, SamplingParams(temperature=0.0), None) == 1


def sampling_distribution(logits: np.ndarray, params: provided.SamplingParams) -> np.ndarray:
    """The float64 distribution a draw must follow: temperature, top-k, then top-p."""
    z = logits / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(len(p), dtype=bool)
    keep[order[: len(p) if params.top_k == -1 else params.top_k]] = True
    p = np.where(keep, p, 0.0) / p[keep].sum()
    before = np.cumsum(p[order]) - p[order]
    keep[order[before >= params.top_p]] = False
    return np.where(keep, p, 0.0) / p[keep].sum()


@pytest.mark.points(3)
@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, -1, 1.0), (0.5, -1, 1.0), (1.0, 3, 1.0), (1.0, -1, 0.6), (2.0, 4, 0.7)])
def test_draws_follow_temperature_top_k_and_top_p(temperature, top_k, top_p):
    logits = np.array([1.0, 0.2, 2.0, -0.5, 1.5, 0.0])
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    want = sampling_distribution(logits, params)
    n = 2000  # one generator per draw: a call gets a copy of its arguments (the grader)
    draws = call_all((impl.sample, (logits, params, np.random.default_rng([7, i])))
                     for i in range(n))  # under the grader: one round trip, not 2000
    counts = np.bincount(draws, minlength=len(logits)) / n
    outside = np.flatnonzero((want == 0) & (counts > 0))
    assert not outside.size, (
        f"tokens {outside.tolist()} were drawn but lie outside top_k={top_k} / the top_p="
        f"{top_p} nucleus (the smallest set, most likely first, whose mass reaches top_p)")
    missing = np.flatnonzero((want > 0.02) & (counts == 0))
    assert not missing.size, (
        f"tokens {missing.tolist()} of the nucleus were never drawn: the token whose mass "
        "crosses top_p belongs to the nucleus")
    np.testing.assert_allclose(counts, want, atol=0.05, err_msg=(
        "draw frequencies do not follow softmax(logits / temperature) restricted to the "
        "kept tokens and renormalised (divide the logits by the temperature before softmax)"))


@pytest.mark.points(1)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12), st.integers(1, 4),
       st.floats(0.05, 1.0))
@examples(25)
def test_a_draw_never_leaves_the_top_k(logits, top_k, top_p):
    logits = np.asarray(logits)
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    allowed = sampling_distribution(logits, params) > 0
    token = impl.sample(logits, params, np.random.default_rng(0))
    assert allowed[token], f"drew token {token}, outside top_k={top_k} / top_p={top_p}"


# ---- 3. the scheduler ---------------------------------------------------------------------------


def sequence(rid: str, n_prompt: int, max_tokens: int = 4, first: int = 0) -> provided.Sequence:
    return provided.Sequence(rid, tuple(range(first, first + n_prompt)),
                             SamplingParams(max_tokens=max_tokens))


def scheduler(num_blocks=16, block_size=4, budget=8, max_num_seqs=8, caching=False):
    kv = provided.KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)
    return impl.Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)


def advance(sched, out: provided.SchedulerOutput, lengths: dict[str, int], token=1) -> None:
    """What the engine does after a forward pass: every request whose scheduled tokens
    reach its last token samples ``token``. ``lengths``: each request's tokens so far (the
    test's own count, updated here)."""
    sampled = {s.request_id: token for s in out.scheduled
               if s.num_computed_tokens + s.num_new_tokens == lengths[s.request_id]}
    sched.update_from_output(out, sampled)
    for rid in sampled:
        lengths[rid] += 1


@pytest.mark.points(2)
def test_a_long_prompt_is_prefilled_in_chunks_that_continue_from_num_computed_tokens():
    sched = scheduler(budget=4)
    sched.add(sequence("a", 10))
    chunks, lengths = [], {"a": 10}
    for _ in range(3):
        out = sched.schedule()
        chunks += [(s.num_computed_tokens, s.num_new_tokens) for s in out.scheduled]
        advance(sched, out, lengths)
    assert chunks == [(0, 4), (4, 4), (8, 2)], f"chunks {chunks}: {CHUNK_CONTINUES}"


@pytest.mark.points(1)
def test_after_a_prefix_hit_of_h_tokens_the_first_computed_token_sits_at_position_h():
    sched = scheduler(budget=16, caching=True)
    lengths = {"a": 9, "b": 10}
    sched.add(sequence("a", 9))
    advance(sched, sched.schedule(), lengths)  # a's first 8 tokens fill two cached blocks
    sched.add(provided.Sequence("b", tuple(range(8)) + (90, 91), SamplingParams(max_tokens=4)))
    got = [(s.num_computed_tokens, s.num_new_tokens) for s in sched.schedule().scheduled
           if s.request_id == "b"]
    assert got == [(8, 2)], f"b (10 tokens, its first 8 cached) scheduled as {got}: {POSITIONS}"


@pytest.mark.points(2)
def test_decode_rows_come_first_and_the_budget_is_never_exceeded():
    sched = scheduler(budget=6)
    lengths = {"a": 3, "b": 3, "c": 12}
    sched.add(sequence("a", 3))
    sched.add(sequence("b", 3, first=10))
    advance(sched, sched.schedule(), lengths)  # a and b prefilled in one step (3 + 3)
    sched.add(sequence("c", 12, first=50))
    out = sched.schedule()
    got = [(s.request_id, s.num_new_tokens) for s in out.scheduled]
    assert out.num_batched_tokens <= 6, f"{got}: the step has more tokens than its budget"
    assert got[:2] == [("a", 1), ("b", 1)] and got[2:] == [("c", 4)], (
        f"scheduled {got}: the running requests' decode rows first (one token each), then "
        "the new prompt gets what is left of the token budget (a chunk of 4)")
    advance(sched, out, lengths)
    out = sched.schedule()  # c is running now, mid-prefill: the decodes still go first
    got = [(s.request_id, s.num_new_tokens) for s in out.scheduled]
    assert got == [("a", 1), ("b", 1), ("c", 4)], (
        f"scheduled {got}: decode rows first, then the running prompt's next chunk (a long "
        "prefill must not starve the decodes)")


@pytest.mark.points(2)
def test_when_the_pool_runs_out_the_newest_request_is_preempted_and_recomputed():
    sched = scheduler(num_blocks=3, block_size=2, budget=16)
    lengths = dict.fromkeys("abc", 2)
    for i, r in enumerate("abc"):
        sched.add(sequence(r, 2, max_tokens=8, first=10 * i))
    advance(sched, sched.schedule(), lengths)  # each holds one full block
    out = sched.schedule()  # every decode needs a second block and none is free
    assert out.preempted == ("c", "b"), (
        f"preempted {out.preempted}, want ('c', 'b'): recompute preemption frees the NEWEST "
        "running request (vLLM pops the tail of the running queue): c's block goes to a; "
        "then b needs one, and the newest running request is b itself")
    assert [s.request_id for s in out.scheduled] == ["a"], (
        f"scheduled {[s.request_id for s in out.scheduled]}: only a keeps running")
    waiting = [(s.request_id, s.num_computed_tokens, s.status) for s in sched.waiting]
    assert waiting == [("b", 0, "waiting"), ("c", 0, "waiting")], (
        f"waiting queue {waiting}: a preempted request waits at the HEAD of the queue (the "
        "older first) with num_computed_tokens = 0: its K/V is recomputed")
    held = sched.kv.request_ids
    assert held == ["a"], f"blocks held by {held}: {LEAK}"


@pytest.mark.points(1)
def test_no_more_than_max_num_seqs_requests_run_at_once():
    sched = scheduler(budget=64, max_num_seqs=2)
    for i in range(4):
        sched.add(sequence(f"r{i}", 2, first=10 * i))
    out = sched.schedule()
    assert len(out.scheduled) == 2, (
        f"{len(out.scheduled)} requests scheduled, max_num_seqs=2: admitted while the token "
        "budget lasted, whatever max_num_seqs says (a new request waits once max_num_seqs run)")


# ---- 4. the model runner -------------------------------------------------------------------------


@pytest.mark.points(2)
def test_the_runner_builds_the_varlen_batch_from_the_scheduler_output():
    runner = impl.ModelRunner(block_size=4)
    seqs = {"a": sequence("a", 6), "b": sequence("b", 4, first=20)}
    out = provided.SchedulerOutput((
        provided.ScheduledRequest("a", 0, 6, (7, 2), True),
        provided.ScheduledRequest("b", 0, 4, (5,), True)))
    batch = runner.prepare_inputs(out, seqs)
    np.testing.assert_array_equal(batch.query_start_loc, [0, 6, 10], "query_start_loc")
    np.testing.assert_array_equal(batch.positions, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3], "positions")
    np.testing.assert_array_equal(batch.slot_mapping, [28, 29, 30, 31, 8, 9, 20, 21, 22, 23],
                                  err_msg=SLOTS)
    np.testing.assert_array_equal(batch.logits_indices, [5, 9], LAST_TOKEN_LOGITS)
    np.testing.assert_array_equal(batch.seq_lens, [6, 4], "seq_lens: context + new tokens")
    np.testing.assert_array_equal(batch.input_ids, [0, 1, 2, 3, 4, 5, 20, 21, 22, 23],
                                  "input_ids")
    # the next step: both decode; b's token opens a new block
    seqs["a"].num_computed_tokens, seqs["b"].num_computed_tokens = 6, 4
    seqs["a"].output_token_ids.append(9)
    seqs["b"].output_token_ids.append(9)
    out = provided.SchedulerOutput((
        provided.ScheduledRequest("a", 6, 1, (), False),
        provided.ScheduledRequest("b", 4, 1, (11,), False)))
    batch = runner.prepare_inputs(out, seqs)
    np.testing.assert_array_equal(batch.positions, [6, 4], POSITIONS)
    np.testing.assert_array_equal(batch.input_ids, [9, 9], "input_ids: the last sampled token")
    np.testing.assert_array_equal(batch.slot_mapping, [10, 44], SLOTS + " (the table grows "
                                  "by the blocks of each step's output)")
    np.testing.assert_array_equal(batch.block_tables[:, :2], [[7, 2], [5, 11]], "block_tables")
    # a long prompt's second chunk: tokens 4..6 of c, its first chunk (0..3) already computed
    seqs["c"] = sequence("c", 10, first=40)
    runner.prepare_inputs(provided.SchedulerOutput((
        provided.ScheduledRequest("c", 0, 4, (3,), True),)), seqs)
    seqs["c"].num_computed_tokens = 4
    batch = runner.prepare_inputs(provided.SchedulerOutput((
        provided.ScheduledRequest("c", 4, 3, (6,), False),)), seqs)
    np.testing.assert_array_equal(batch.positions, [4, 5, 6], CHUNK_CONTINUES)
    np.testing.assert_array_equal(batch.slot_mapping, [24, 25, 26], CHUNK_CONTINUES)
    np.testing.assert_array_equal(batch.seq_lens, [7], CHUNK_CONTINUES)
    # c is preempted (its blocks freed), then resumed from scratch in block 9
    runner.prepare_inputs(provided.SchedulerOutput((
        provided.ScheduledRequest("a", 6, 1, (), False),), preempted=("c",)), seqs)
    seqs["c"].num_computed_tokens = 0
    batch = runner.prepare_inputs(provided.SchedulerOutput((
        provided.ScheduledRequest("c", 0, 4, (9,), True),)), seqs)
    np.testing.assert_array_equal(batch.slot_mapping, [36, 37, 38, 39], STALE_TABLE)


# ---- 5. the engine: token for token with transformers ---------------------------------------


def engine(**kwargs):
    args = dict(num_blocks=64, block_size=4, max_num_batched_tokens=16, max_num_seqs=8)
    return impl.LLM(RANDOM, **(args | kwargs))


@pytest.mark.points(6)
@pytest.mark.parametrize("budget, num_blocks, arrivals", [(3, 8, 2), (8, 9, 3), (32, 20, 6)],
                         ids=["chunks-of-3", "chunks-of-8-tight-pool", "budget-32"])
def test_greedy_tokens_equal_transformers_generate(budget, num_blocks, arrivals):
    """20 requests per setting (60 in all): arriving over several steps, prompts of 1-21
    tokens, half sharing a 9-token prefix, a pool small enough to force preemption."""
    probe = engine(max_num_batched_tokens=budget)  # a prompt longer than one step's budget
    probe.add_request([t % VOCAB for t in range(budget + 1)], SamplingParams(max_tokens=6),
                      request_id="p")
    got = [o.token_ids for o in probe.step()]
    assert not got, (f"a {budget + 1}-token prompt's first chunk of {budget} gave the output "
                     f"{got}: {LAST_TOKEN_LOGITS}")
    prompts = workload(budget, 20)
    llm = engine(max_num_batched_tokens=budget, num_blocks=num_blocks)
    got = run_arrivals(llm, prompts, SamplingParams(max_tokens=6), arrivals)
    kv = llm.kv
    for i, prompt in enumerate(prompts):
        want = reference_tokens(prompt, 6)
        assert f"r{i}" in got, f"request r{i} never finished"
        assert got[f"r{i}"] == want, (
            f"request r{i} (prompt of {len(prompt)} tokens, shared prefix: {i % 2 == 1}): "
            f"{first_difference(got[f'r{i}'], want)}. Likely: "
            + (POSITIONS if i % 2 else CHUNK_CONTINUES) + "; or " + STALE_TABLE + "; or "
            + SLOTS + "; or " + LAST_TOKEN_LOGITS)
    assert kv.num_failed_allocations > 0 and kv.num_hit_tokens > 0, (  # after the tokens: a
        "test set-up: the pool must run out and prefixes must hit")  # wrong one names its cause
    assert kv.num_free_blocks == num_blocks, f"{kv.num_free_blocks} of {num_blocks} free: {LEAK}"


@pytest.mark.points(3)
@pytest.mark.triton
def test_greedy_tokens_through_the_triton_kernel():
    prompts = workload(5, 3, max_len=5)
    llm = engine(attention="triton", max_num_batched_tokens=32, num_blocks=16)
    outs = llm.generate([list(p) for p in prompts], SamplingParams(max_tokens=3))
    for prompt, out in zip(prompts, outs):
        want = reference_tokens(prompt, 3)
        assert out.token_ids == want, "attention='triton': " + first_difference(
            out.token_ids, want)


@pytest.mark.points(4)
def test_the_trained_model_adds_exactly():
    """The course's model (models/adder): 3-digit sums, digits least-significant first.
    A random model cannot tell a wrong RoPE convention from the right one; trained weights
    can."""
    llm = impl.LLM(provided.MODEL_DIR, num_blocks=24, block_size=4, max_num_batched_tokens=32,
                   max_num_seqs=8)
    rng = np.random.default_rng(11)
    problems = [tuple(int(x) for x in rng.integers(0, 1000, 2)) for _ in range(24)]
    prompts = [f"<bos>{str(a).zfill(3)[::-1]}+{str(b).zfill(3)[::-1]}=" for a, b in problems]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8))
    wrong = [(a, b, o.text) for (a, b), o in zip(problems, outs)
             if o.text != str(a + b).zfill(4)[::-1] or o.finish_reason != "stop"]
    assert not wrong, (
        f"{len(wrong)} of {len(problems)} sums wrong, e.g. {wrong[:3]} (a, b, answer text, "
        "least-significant digit first). The weights fix the RoPE convention (rotate_half) "
        "and every position; the model stops at its <eos> (finish_reason 'stop')")


@pytest.mark.points(1)
def test_stop_tokens_and_max_tokens_end_a_request():
    prompt = list(workload(3, 1)[0])
    want = reference_tokens(tuple(prompt), 6)
    stop = want[2]
    [out] = engine().generate([prompt], SamplingParams(max_tokens=6, stop_token_ids=(stop,)))
    k = want.index(stop)
    assert out.token_ids == want[:k + 1] and out.finish_reason == "stop", (
        f"got {out.token_ids} ({out.finish_reason}): generation stops AT a stop token (it is "
        f"the last output token, finish_reason 'stop'); want {want[:k + 1]}")
    [out] = engine().generate([prompt], SamplingParams(max_tokens=2))
    assert out.token_ids == want[:2] and out.finish_reason == "length", (
        f"got {out.token_ids} ({out.finish_reason}): max_tokens=2 gives 2 tokens, 'length'")


# ---- 6. seeded sampling -------------------------------------------------------------------------


def seeded(seed: int) -> provided.SamplingParams:
    return SamplingParams(max_tokens=8, temperature=1.0, top_k=8, seed=seed)


@pytest.mark.points(3)
def test_a_seeded_request_gives_the_same_tokens_whatever_runs_beside_it():
    prompts = [list(p) for p in workload(4, 4)]
    alone = engine().generate([prompts[0]], seeded(1))[0].token_ids
    crowd = engine().generate(prompts, [seeded(1), seeded(2), seeded(3), seeded(4)])
    assert crowd[0].token_ids == alone, (
        f"seed 1 alone {alone}, beside three others {crowd[0].token_ids}: {OWN_GENERATOR}")
    twins = engine().generate([prompts[1], prompts[1]], [seeded(5), seeded(5)])
    assert twins[0].token_ids == twins[1].token_ids, f"two requests with seed 5: {OWN_GENERATOR}"
    tight = engine(num_blocks=10, max_num_batched_tokens=4).generate(
        prompts, [seeded(1), seeded(2), seeded(3), seeded(4)])
    assert [o.token_ids for o in tight] == [o.token_ids for o in crowd], (
        "the same seeded requests with a tiny pool (preemptions) and small chunks: the tokens "
        "changed. A recomputed request keeps its generator and samples only after its whole "
        "prompt is computed")


# ---- 7. bad input and leaks ---------------------------------------------------------------------


def _bad_inputs() -> BadInputs:
    p = SamplingParams(max_tokens=4)
    return {
        "empty prompt": ("prompt", lambda: engine().add_request([], p)),
        "prompt beyond the context": ("prompt", lambda: engine().add_request([1] * 64, p)),
        "token outside the vocabulary": ("prompt", lambda: engine().add_request([VOCAB], p)),
        "pool too small for one request": (
            "num_blocks", lambda: engine(num_blocks=2).add_request([1] * 9, p)),
        "unknown request id": ("request_id", lambda: engine().abort_request("nobody")),
    }


test_bad_input_is_a_value_error_naming_it = bad_input_test(_bad_inputs(), points=0.5)


@pytest.mark.points(2)
def test_every_block_returns_after_finish_abort_and_failure():
    llm = engine(num_blocks=12, max_num_batched_tokens=4)
    for i, prompt in enumerate(workload(6, 6)):
        llm.add_request(list(prompt), SamplingParams(max_tokens=5), request_id=f"r{i}")
    llm.step()
    llm.step()
    llm.abort_request("r0")  # running
    llm.abort_request("r5")  # still waiting
    with pytest.raises(ValueError):
        llm.add_request([1] * 64, SamplingParams(max_tokens=4))  # fails: holds nothing
    while llm.has_unfinished_requests():
        llm.step()
    assert llm.kv.num_free_blocks == 12 and not llm.kv.request_ids, (
        f"{llm.kv.num_free_blocks} of 12 blocks free, held by {llm.kv.request_ids}: {LEAK}")
