"""Lab 08 spec: attention from first principles.

Run:  LAB_IMPL=starter .venv/bin/python -m pytest labs/lab-08-attention-from-scratch -q
Expected values come from ``common``'s float64 reference (``reference_attention``) or from
PyTorch itself in float64 (``scaled_dot_product_attention``, ``nn.MultiheadAttention``), or
from the formula written out here; never from ``solution.py``. The wrong answers that name a
misconception are computed here too, from the same formulas with the classic mistake in.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from common import load_impl, prefix_mask, reference_attention
from common.loader import load_lab_module
from common.reference import to_float64
from common.testing import (
    BOTTOM_RIGHT,
    HEAD_RATIOS,
    NO_SCALE,
    SCALE_IGNORED,
    BadInputs,
    assert_close,
    bad_input_test,
    called_on_copies,
    examples,
    raised_as,
    scale_wrong,
)

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))
provided = load_lab_module(__file__, "provided")

SCALE_BY_D = "divided by d instead of sqrt(d)"
WRONG_AXIS = "softmax over the wrong axis: each query's row must sum to 1 over the KEYS (last axis)"
MASK_INVERTED = (
    "mask inverted: in SDPA's boolean attn_mask True means ATTEND (nn.MultiheadAttention's "
    "key_padding_mask is the one where True means ignore)"
)
ADDITIVE_ONE_ZERO = (
    "additive mask built as 1 / 0: a float mask is ADDED to the scores, so 'attend' is 0.0 "
    "and 'hide' is -inf (adding 1 or 0 hides nothing)"
)
AFTER_SOFTMAX = (
    "mask applied after the softmax (weights multiplied by the mask): the visible weights "
    "no longer sum to 1; mask the scores with -inf before the softmax"
)
BIG_NEGATIVE = (
    "masked with a large negative number instead of -inf: a query that may attend nothing "
    "got the average of every value instead of zeros"
)
KPM_POLARITY = (
    "key_padding_mask polarity: in nn.MultiheadAttention True means PADDING (ignore the key), "
    "the opposite of SDPA's boolean attn_mask"
)
DIAGONAL = "causal mask off by one: query i must attend key i itself (the diagonal)"
GQA_TILE = (
    "GQA heads repeated with np.tile (query head h read KV head h % Hkv): repeat each KV head "
    "in place (np.repeat / repeat_interleave) so that head h reads KV head h // group"
)
HEADS_RESHAPE = (
    "heads split with a straight reshape to [B, H, L, Dh]: reshape to [B, L, H, Dh] first, "
    "then swap L and H (a straight reshape mixes different tokens into one head)"
)
MHA_SCALE_E = "scores scaled by 1/sqrt(E) (the model width) instead of 1/sqrt(E // num_heads)"
WEIGHTS_SUMMED = "attention weights summed over the heads instead of averaged"
ROPE_OTHER_PAIRS = (
    "RoPE rotated the wrong pairs: interleaved=True pairs dims (2i, 2i+1), interleaved=False "
    "pairs (i, i + d/2) ('rotate half')"
)
ROPE_NOT_A_ROTATION = (
    "RoPE's pair update is not a rotation (a sign is wrong): a pair (a, b) must become "
    "(a cos - b sin, a sin + b cos)"
)
ROPE_BACKWARDS = (
    "RoPE rotated backwards (by -p·theta): a pair (a, b) must become (a cos - b sin, "
    "a sin + b cos)"
)
ROPE_THETA = "RoPE frequency theta_i = base**(-i/d): the exponent is -2i/d (i counts pairs)"
SIN_CAT = (
    "sines and cosines concatenated [sin | cos]; the paper interleaves them (sin at 2i, cos at "
    "2i+1)"
)
SIN_EXPONENT = "sinusoidal frequency base**(-i/dim): the exponent is -2i/dim (i counts pairs)"
BITS = "entropy in bits (log2): the contract is nats (natural log)"
TANH_AFTER = "tanh applied after v_a: e = v_a · tanh(q w_q + k w_k), tanh first"
NO_TANH = "tanh left out of the additive score"
W_TRANSPOSED = "general score with w transposed: e = q @ w @ k.T, w is [dq, dk]"
K_T_ON_BATCHES = (
    "k.T on a batch reverses ALL axes ([B, H, L, d] -> [d, L, H, B]): transpose only the last "
    "two (np.swapaxes(k, -1, -2)), so that scores[..., i, j] = q[..., i, :] · k[..., j, :]"
)
SCALE_DIVIDES = "the scale was divided by: scale multiplies the scores (1/sqrt(d) by default)"
MASKED_NOT_LEAKED = (
    "nothing of the padded keys leaked (the output holds no value near {poison:g}), so the "
    "mask works; the unpadded attention itself differs: make "
    "test_scaled_dot_product_attention_equals_the_float64_reference pass first"
)


# ---- helpers: data, references and the wrong answers of classic mistakes ----------------


def normal(seed: int, *shape: int, spread: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape) * spread


def batched_qkv(seed, lead, lq, lk, d, dv):
    """q ``[*lead, Lq, d]``, k ``[*lead, Lk, d]``, v ``[*lead, Lk, dv]``, standard normal."""
    q, k = normal(seed, *lead, lq, d), normal(seed + 1, *lead, lk, d)
    return q, k, normal(seed + 2, *lead, lk, dv)


def t(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))


def reference_sdpa(q, k, v, mask=None, scale=None):
    """common.reference_attention on SDPA's layout ``[..., H, L, d]``; ``mask`` boolean."""
    q, k, v = to_float64(q), to_float64(k), to_float64(v)
    lead = q.shape[:-3]
    q3, k3, v3 = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))
    shape = (*lead, q.shape[-3], q.shape[-2], k.shape[-2])
    masks = None if mask is None else np.broadcast_to(mask, shape).reshape(-1, *shape[-3:])
    outs = []
    for n in range(q3.shape[0]):
        out, _ = reference_attention(
            q3[n].transpose(1, 0, 2),
            k3[n].transpose(1, 0, 2),
            v3[n].transpose(1, 0, 2),
            scale=scale,
            mask=None if masks is None else masks[n],
        )
        outs.append(out.transpose(1, 0, 2))
    return np.stack(outs).reshape(*lead, q.shape[-3], q.shape[-2], v.shape[-1])


def plain_attention(q, k, v, mask=None, scale=None, axis=-1, fill=-np.inf, after=False):
    """softmax(q kᵀ·scale) v written out, with switches for the classic mistakes."""
    s = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None and not after:
        s = np.where(mask, s, fill)
    with np.errstate(all="ignore"):
        e = np.exp(s - np.max(s, axis=axis, keepdims=True))
        p = e / e.sum(axis=axis, keepdims=True)
    if mask is not None and after:
        p = p * mask
    return p @ v


def scale_wrongs(q, k, v, mask=None, bias=None):
    """{misconception: SDPA's output with the 1/sqrt(d) scale forgotten or taken as 1/d}.

    ``mask`` boolean (True = attend) or ``bias`` added to the scores; empty when d = 1 (all
    three scales agree there)."""
    d = q.shape[-1]
    if d == 1:
        return {}

    def run(scale):
        if bias is None:  # a row with nothing to attend: zeros, as the contract says
            return np.nan_to_num(plain_attention(q, k, v, mask, scale=scale))
        s = q @ np.swapaxes(k, -1, -2) * scale + bias
        with np.errstate(all="ignore"):
            return np.nan_to_num(softmax_ref(s)) @ v

    return {NO_SCALE: run(1.0), SCALE_BY_D: run(1.0 / d)}


def with_bias(q, k, v, bias):
    """softmax(q kᵀ/sqrt(d) + bias) v: what an additive mask of ``bias`` gives."""
    return F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(bias)).numpy()


def top_left(lq: int, lk: int) -> np.ndarray:
    return prefix_mask(np.arange(lq), lk)


def bottom_right(lq: int, lk: int) -> np.ndarray:
    return prefix_mask(np.arange(lq) + lk - lq, lk)


def causal_wrongs(lq, lk, call):
    """{misconception: what ``call(mask)`` gives with that wrong causal mask}."""
    wrong = {
        DIAGONAL: call(prefix_mask(np.arange(lq) - 1, lk)),
        MASK_INVERTED: call(~top_left(lq, lk)),
    }
    if lq != lk:
        wrong[BOTTOM_RIGHT] = call(bottom_right(lq, lk))
    return wrong


def random_mask(seed, *shape, p=0.6):
    """A boolean mask (True = attend) where every row attends at least one key."""
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) < p
    first = rng.integers(0, shape[-1], shape[:-1])
    np.put_along_axis(mask, first[..., None], True, axis=-1)
    return mask


# ---- 1. scores ---------------------------------------------------------------------------

sizes = st.integers(1, 6)


@pytest.mark.points(1)
@given(lq=sizes, lk=sizes, d=sizes, seed=st.integers(0, 2**16))
def test_dot_scores_are_every_query_dotted_with_every_key(lq, lk, d, seed):
    q, k = normal(seed, lq, d), normal(seed + 1, lk, d)
    want = np.einsum("id,jd->ij", q, k)
    assert_close(impl.dot_scores(q, k), want, what=f"dot_scores [Lq={lq}, Lk={lk}]",
                 hint="scores[i, j] = q[i] · k[j]: q @ k.T, one row per query, one column "
                 "per key")  # fmt: skip


@pytest.mark.points(1)
@given(lq=sizes, lk=sizes, dq=sizes, dk=sizes, seed=st.integers(0, 2**16))
def test_general_scores_put_w_between_the_query_and_the_key(lq, lk, dq, dk, seed):
    q, k, w = normal(seed, lq, dq), normal(seed + 1, lk, dk), normal(seed + 2, dq, dk)
    want = np.einsum("id,de,je->ij", q, w, k)
    wrong = {W_TRANSPOSED: q @ w.T @ k.T} if dq == dk else {}
    assert_close(
        impl.general_scores(q, k, w), want, what="general_scores", wrong_answers=wrong
    )


@pytest.mark.points(2)
@given(lq=sizes, lk=sizes, dq=sizes, dk=sizes, da=sizes, seed=st.integers(0, 2**16))
def test_additive_scores_follow_bahdanau(lq, lk, dq, dk, da, seed):
    q, k = normal(seed, lq, dq), normal(seed + 1, lk, dk)
    w_q, w_k, v_a = normal(seed + 2, dq, da), normal(seed + 3, dk, da), normal(seed + 4, da)
    want = np.array(
        [[v_a @ np.tanh(q[i] @ w_q + k[j] @ w_k) for j in range(lk)] for i in range(lq)]
    ).reshape(lq, lk)
    pre = (q @ w_q)[:, None, :] + (k @ w_k)[None, :, :]
    wrong = {NO_TANH: pre @ v_a, TANH_AFTER: np.tanh(pre @ v_a)}
    assert_close(
        impl.additive_scores(q, k, w_q, w_k, v_a), want, what="additive_scores",
        wrong_answers=wrong,
    )  # fmt: skip


@pytest.mark.points(1)
@pytest.mark.parametrize("d", [1, 4, 16, 24])
def test_scaled_dot_scores_divide_by_sqrt_d(d):
    q, k = normal(d, 5, d), normal(d + 1, 7, d)
    raw = q @ k.T
    wrong = {NO_SCALE: raw, SCALE_BY_D: raw / d} if d > 1 else {}
    assert_close(
        impl.scaled_dot_scores(q, k), raw / math.sqrt(d), what=f"scaled_dot_scores (d={d})",
        wrong_answers=wrong,
    )  # fmt: skip
    assert_close(impl.scaled_dot_scores(q, k, scale=0.3), raw * 0.3, what="scale=0.3",
                 wrong_answers={SCALE_IGNORED: raw / math.sqrt(d), SCALE_DIVIDES: raw / 0.3}
                 if d != 1 else {SCALE_DIVIDES: raw / 0.3})  # fmt: skip


@pytest.mark.points(1)
def test_the_scores_work_on_batches_of_heads():
    q, k = normal(1, 2, 3, 4, 5), normal(2, 2, 3, 6, 5)  # [B, H, L, d]
    w = normal(3, 5, 5)
    assert_close(impl.dot_scores(q, k), np.einsum("bhid,bhjd->bhij", q, k), what="dot_scores",
                 hint=K_T_ON_BATCHES)
    assert_close(
        impl.general_scores(q, k, w), np.einsum("bhid,de,bhje->bhij", q, w, k),
        what="general_scores", hint=K_T_ON_BATCHES,
    )  # fmt: skip


@pytest.mark.points(1)
@pytest.mark.parametrize("lead", [(3,), (2, 3)], ids=["3-D", "4-D"])
def test_the_additive_score_works_on_batches_of_heads(lead):
    q, k = normal(4, *lead, 4, 5), normal(5, *lead, 6, 3)  # [..., Lq, dq], [..., Lk, dk]
    w_q, w_k, v_a = normal(6, 5, 7), normal(7, 3, 7), normal(8, 7)
    want = np.einsum("a,...ija->...ij", v_a, np.tanh(
        np.einsum("...id,da->...ia", q, w_q)[..., :, None, :]
        + np.einsum("...jd,da->...ja", k, w_k)[..., None, :, :]))  # fmt: skip
    batched = "the additive score works only on 2-D inputs: broadcast over the leading axes"
    with raised_as(batched):
        got = impl.additive_scores(q, k, w_q, w_k, v_a)
    assert_close(got, want,
                 what=f"additive_scores on [{', '.join(map(str, lead))}, L, d] inputs",
                 hint=f"{batched}: q w_q is [..., Lq, 1, da], k w_k is [..., 1, Lk, da]")


# ---- 2. softmax, entropy and the √d experiment -------------------------------------------


def softmax_ref(x, axis=-1):
    with np.errstate(invalid="ignore"):  # a row of -inf gives NaN here: only wrong answers
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.points(2)
@given(rows=st.integers(1, 6), cols=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_softmax_normalises_each_row_over_the_keys(rows, cols, seed):
    x = normal(seed, 2, rows, cols, spread=3.0)
    wrong = {WRONG_AXIS: softmax_ref(x, axis=-2)} if rows > 1 else {}
    assert_close(impl.softmax(x), softmax_ref(x), what="softmax", wrong_answers=wrong)


@pytest.mark.points(1)
def test_softmax_of_huge_scores_does_not_overflow():
    x = np.array([[1000.0, 999.0, -1000.0], [-1e4, -1e4 + 1.0, -1e4 + 2.0]])
    with np.errstate(all="ignore"):
        got = impl.softmax(x)
    assert_close(got, softmax_ref(x), what="softmax of scores near ±1000",
                 hint="subtract each row's OWN max (over the keys, keepdims=True) before exp",
                 nan_hint="exp(1000) is inf: subtract each row's max before exp")  # fmt: skip


@pytest.mark.points(1)
def test_a_row_of_minus_inf_gets_zero_weights_not_nan():
    x = np.array([[-np.inf, 0.5, -np.inf, 1.0], [-np.inf] * 4])
    with np.errstate(all="ignore"):
        got = impl.softmax(x)
    want = np.array([[0.0, *softmax_ref(np.array([0.5, -np.inf, 1.0]))]] + [[0.0] * 4])
    assert_close(
        got, want, what="softmax with masked (-inf) scores",
        nan_hint="NaN: a row that is -inf everywhere gives exp(-inf - (-inf)); when the row "
        "max is -inf use 0 instead, and divide 0 by 1, not by 0",
    )  # fmt: skip


def entropy_ref(x):
    p = softmax_ref(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=-1)


@pytest.mark.points(1)
@given(rows=st.integers(1, 5), cols=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_softmax_entropy_is_in_nats(rows, cols, seed):
    x = normal(seed, rows, cols, spread=2.0)
    want = entropy_ref(x)
    assert_close(
        impl.softmax_entropy(x), want, what="softmax_entropy",
        wrong_answers={BITS: want / math.log(2)},
    )  # fmt: skip


@pytest.mark.points(1)
def test_softmax_entropy_is_log_n_for_a_uniform_row_and_zero_for_one_hot():
    x = np.array([[0.0] * 8, [0.0, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf],
                  [2000.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])  # fmt: skip
    with np.errstate(all="ignore"):
        got = impl.softmax_entropy(x)
    assert_close(got, [math.log(8), 0.0, 0.0], what="entropy of uniform / one-hot rows",
                 nan_hint="NaN: 0 * log(0) must count as 0 (use log-probabilities, or skip p = 0)")


# The √d experiment draws random numbers, so its checks are statistical. With Lq = Lk = 256
# and q, k ~ N(0, I_d), the measured variance V of the scores has (exactly, counting the
# pairs that share a query or a key)  Var(V / d) = (2 + 6/d + 2(Lq + Lk - 2)/d) / (Lq Lk):
# a standard deviation of 0.032, 0.017 and 0.010 for d = 16, 64, 256. The band |V/d - 1| < 0.5
# therefore fails a correct implementation (whatever random numbers it draws) with
# probability at most 0.56% in all by Chebyshev's inequality (no assumption about the shape of
# the distribution), and about 1e-50 if V is treated as normal. The seeds are fixed, so a
# given implementation gets the same verdict on every run.
VARIANCE_CASES = [16, 64, 256]


def run_experiment(d, **kwargs):
    stats = impl.scale_experiment(d, **kwargs)
    assert isinstance(stats, tuple) and len(stats) == 5, (
        "scale_experiment returns ScaleStats(d, variance_unscaled, variance_scaled, "
        "entropy_unscaled, entropy_scaled)"
    )
    return provided.ScaleStats(*(float(x) for x in stats))


@pytest.mark.points(2)
@pytest.mark.parametrize("d", VARIANCE_CASES)
def test_scale_experiment_score_variance_is_d_without_the_scale_and_1_with_it(d):
    stats = run_experiment(d, seed=d)
    assert stats.d == d, f"ScaleStats.d should be {d}, got {stats.d}"
    assert abs(stats.variance_unscaled / d - 1) < 0.5, (
        f"variance of q·k for d={d} should be about d={d} (each of the d products q_i k_i has "
        f"variance 1), got {stats.variance_unscaled:.4g}"
    )
    assert abs(stats.variance_scaled - 1) < 0.5, (
        f"variance of q·k/sqrt(d) should be about 1, got {stats.variance_scaled:.4g}"
        + (f": {NO_SCALE}" if abs(stats.variance_scaled / d - 1) < 0.5 else "")
        + (f": {SCALE_BY_D}" if abs(stats.variance_scaled * d - 1) < 0.5 else "")
    )
    ratio = stats.variance_unscaled / stats.variance_scaled
    assert abs(ratio / d - 1) < 1e-9, (
        f"both variances are measured on the same scores, so their ratio is exactly "
        f"(sqrt(d))² = {d}, got {ratio:.6g}"
    )


# Entropy bands, checked on 400 seeds (0…399) of the reference: the scaled entropy stayed in
# 4.98…5.11 nats for d = 16, 64, 256 (log 256 = 5.55); the unscaled one in 1.71…2.18 (d=16),
# 0.65…0.87 (d=64) and 0.26…0.40 (d=256). The bands below sit far outside those ranges.
@pytest.mark.points(2)
def test_scale_experiment_entropy_collapses_without_the_scale_and_not_with_it():
    stats = {d: run_experiment(d, seed=7) for d in VARIANCE_CASES}
    top = math.log(256)
    for d, s in stats.items():
        assert s.entropy_scaled <= top + 1e-9 and s.entropy_unscaled <= top + 1e-9, (
            f"entropy above log(num_keys) = {top:.3f} nats for d={d}: {s}. "
            + (BITS if max(s.entropy_scaled, s.entropy_unscaled) <= math.log2(256) else "")
        )
        assert s.entropy_scaled > top - 1.0, (
            f"with the 1/sqrt(d) scale the softmax should stay spread out (entropy near "
            f"log 256 = {top:.2f} nats) for d={d}, got {s.entropy_scaled:.3f}"
        )
    h = [stats[d].entropy_unscaled for d in VARIANCE_CASES]
    assert h[0] > h[1] > h[2] and h[1] < 1.5 and h[2] < 1.0, (
        f"without the scale the softmax should collapse towards one-hot as d grows "
        f"(entropy d=16, 64, 256: {[round(x, 3) for x in h]}; expected falling, below 1.5 "
        "and 1.0 nats for d=64 and 256)"
    )


@pytest.mark.points(1)
def test_scale_experiment_uses_its_sizes():
    s = run_experiment(32, num_queries=8, num_keys=4, seed=1)
    assert s.entropy_scaled <= math.log(4) + 1e-9 and s.entropy_unscaled <= math.log(4) + 1e-9, (
        f"with num_keys=4 a row's entropy is at most log 4 = {math.log(4):.3f} nats, got {s}"
    )


# ---- 3. masks: four conventions, one meaning ---------------------------------------------


@pytest.mark.points(1)
@pytest.mark.parametrize("lq, lk", [(4, 4), (3, 6), (6, 3), (1, 5), (0, 2)])
def test_causal_mask_is_top_left_and_includes_the_diagonal(lq, lk):
    got = np.asarray(impl.causal_mask(lq, lk))
    assert got.dtype == bool, f"causal_mask must be boolean (True = attend), got {got.dtype}"
    assert_close(got, top_left(lq, lk), what=f"causal_mask({lq}, {lk})",
                 wrong_answers=causal_wrongs(lq, lk, lambda m: m))  # fmt: skip


@pytest.mark.points(1)
def test_key_padding_mask_true_means_ignore():
    got = np.asarray(impl.key_padding_mask(np.array([3, 1, 4, 0]), 4))
    want = np.array([[0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)
    assert got.dtype == bool, f"key_padding_mask must be boolean, got {got.dtype}"
    assert_close(got, want, what="key_padding_mask(lengths=[3, 1, 4, 0], num_keys=4)",
                 wrong_answers={KPM_POLARITY: ~want})  # fmt: skip


@pytest.mark.points(1)
def test_bool_to_additive_gives_zero_where_attended_and_minus_inf_elsewhere():
    mask = random_mask(3, 3, 5)
    got = impl.bool_to_additive(mask)
    want = np.where(mask, 0.0, -np.inf)
    assert_close(got, want, what="bool_to_additive", wrong_answers={
        ADDITIVE_ONE_ZERO: mask.astype(float), MASK_INVERTED: np.where(mask, -np.inf, 0.0),
        "hidden keys got -1e9 instead of -inf": np.where(mask, 0.0, -1e9)})  # fmt: skip


@pytest.mark.points(1)
def test_additive_to_bool_keeps_every_key_whose_entry_is_not_minus_inf():
    mask = np.array([[0.0, -np.inf, -1.5, 2.0], [-np.inf, 0.0, 0.0, -np.inf]])  # ALiBi-like biases
    got = np.asarray(impl.additive_to_bool(mask))
    want = np.array([[1, 0, 1, 1], [0, 1, 1, 0]], dtype=bool)
    assert got.dtype == bool, f"additive_to_bool must return booleans, got {got.dtype}"
    assert_close(got, want, what="additive_to_bool", wrong_answers={
        MASK_INVERTED: ~want,
        "only entries equal to 0 were kept: a finite bias (-1.5, 2.0) still attends": mask == 0,
    })  # fmt: skip


@pytest.mark.points(1)
def test_key_padding_to_attn_mask_inverts_and_broadcasts_over_heads_and_queries():
    kpm = np.array([[False, False, True], [False, True, True]])
    got = np.asarray(impl.key_padding_to_attn_mask(kpm))
    want = ~kpm[:, None, None, :]
    assert got.dtype == bool, f"the SDPA mask must be boolean, got {got.dtype}"
    assert_close(got, want, what="key_padding_to_attn_mask [B, 1, 1, Lk]",
                 wrong_answers={KPM_POLARITY: kpm[:, None, None, :]})  # fmt: skip


# ---- 4. scaled dot-product attention ------------------------------------------------------


@pytest.mark.points(3)
@given(
    b=st.integers(1, 2), h=st.integers(1, 3), lq=st.integers(1, 7), lk=st.integers(1, 7),
    d=st.integers(1, 6), dv=st.integers(1, 5), causal=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_scaled_dot_product_attention_equals_the_float64_reference(
    b, h, lq, lk, d, dv, causal, seed
):
    q, k, v = batched_qkv(seed, (b, h), lq, lk, d, dv)
    mask = top_left(lq, lk) if causal else None
    want = reference_sdpa(q, k, v, mask)
    wrong = scale_wrongs(q, k, v, mask)
    if lq > 1:
        wrong[WRONG_AXIS] = plain_attention(q, k, v, mask, axis=-2)
    if causal:
        wrong.update(causal_wrongs(lq, lk, lambda m: reference_sdpa(q, k, v, m)))
        wrong[AFTER_SOFTMAX] = plain_attention(q, k, v, mask, after=True)
    with np.errstate(all="ignore"):
        got = impl.scaled_dot_product_attention(q, k, v, is_causal=causal)
    what = f"SDPA out [B={b}, H={h}, Lq={lq}, Lk={lk}, d={d}, dv={dv}], is_causal={causal}"
    assert_close(got, want, what=what, wrong_answers=wrong)


@pytest.mark.points(2)
@examples(15)
@given(lq=st.integers(1, 6), lk=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_a_boolean_attn_mask_means_true_attends_as_in_pytorch(lq, lk, seed):
    q, k, v = batched_qkv(seed, (2, 2), lq, lk, 4, 3)
    mask = random_mask(seed, 2, 1, lq, lk)  # [B, 1, Lq, Lk]: broadcast over the heads
    want = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=torch.from_numpy(mask))
    wrong = {
        MASK_INVERTED: reference_sdpa(q, k, v, ~mask),
        AFTER_SOFTMAX: plain_attention(q, k, v, mask, after=True),
        **scale_wrongs(q, k, v, mask),
    }
    got = impl.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(got, want, what="SDPA with a boolean attn_mask", wrong_answers=wrong)


@pytest.mark.points(2)
def test_a_float_attn_mask_is_added_to_the_scores_as_in_pytorch():
    q, k, v = normal(1, 1, 2, 4, 4), normal(2, 1, 2, 6, 4), normal(3, 1, 2, 6, 3)
    visible = random_mask(4, 4, 6)
    bias = np.where(visible, normal(5, 4, 6), -np.inf)  # finite biases where visible
    want = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(bias))
    got = impl.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    wrong = {"the float mask was used as a boolean (its finite values must be ADDED)":
             reference_sdpa(q, k, v, visible), **scale_wrongs(q, k, v, bias=bias)}  # fmt: skip
    assert_close(got, want, what="SDPA with a float attn_mask", wrong_answers=wrong)
    additive = np.where(visible, 0.0, -np.inf)
    assert_close(
        impl.scaled_dot_product_attention(q, k, v, attn_mask=additive),
        reference_sdpa(q, k, v, visible),
        what="SDPA with a 0/-inf mask (must equal the boolean mask it came from)",
        wrong_answers={ADDITIVE_ONE_ZERO: with_bias(q, k, v, visible.astype(float))},
    )


# Poison, the honest way. A masked key's weight is exactly 0, but 0 * NaN is NaN: a NaN in a
# masked slot poisons even a correct masked softmax (and PyTorch's SDPA, which returns NaN
# there). So these tests fill masked keys with HUGE FINITE values (1e6): a correct mask makes
# them contribute exactly 0, and any leak (an inverted mask, a 1/0 additive mask, a mask
# applied after the softmax) turns the output into numbers of size 1e5 or more.
POISON = 1e6


@pytest.mark.points(2)
@given(lens=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_padded_keys_holding_huge_values_contribute_exactly_nothing(lens, seed):
    b, h, lq, lk = len(lens), 2, 3, 6
    q, k, v = batched_qkv(seed, (b, h), lq, lk, 4, 3)
    attend = np.arange(lk)[None, :] < np.array(lens)[:, None]  # [B, Lk] True = real key
    want = reference_sdpa(q, k, v, attend[:, None, None, :])
    k = np.where(attend[:, None, :, None], k, POISON)
    v = np.where(attend[:, None, :, None], v, POISON)
    mask = attend[:, None, None, :]
    wrong = {
        MASK_INVERTED: reference_sdpa(q, k, v, ~mask),
        AFTER_SOFTMAX: plain_attention(q, k, v, mask, after=True),
        **scale_wrongs(q, k, v, mask),
    }
    with np.errstate(all="ignore"):
        got = impl.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        got_additive = impl.scaled_dot_product_attention(q, k, v, attn_mask=bool_additive(mask))
    hint = leak_hint(got)
    assert_close(got, want, what="SDPA over a padded batch (boolean mask)", hint=hint,
                 wrong_answers=wrong)  # fmt: skip
    wrong_additive = {ADDITIVE_ONE_ZERO: with_bias(q, k, v, mask.astype(float)),
                      **scale_wrongs(q, k, v, mask)}  # fmt: skip
    assert_close(got_additive, want, what="SDPA over a padded batch (0/-inf mask)",
                 hint=leak_hint(got_additive),
                 wrong_answers=wrong_additive)  # fmt: skip


def leak_hint(got):
    """Why a padded batch's output differs: the poison leaked, or attention itself is off."""
    with np.errstate(all="ignore"):
        leaked = not np.all(np.abs(to_float64(got)) < POISON / 100)
    if leaked:
        return f"the padded keys hold {POISON:g}: some of their weight leaked into the output"
    return MASKED_NOT_LEAKED.format(poison=POISON)


def bool_additive(mask):
    return np.where(mask, 0.0, -np.inf)


@pytest.mark.points(1)
def test_a_query_with_nothing_to_attend_gets_zeros():
    q, k, v = normal(1, 1, 1, 3, 4), normal(2, 1, 1, 5, 4), normal(3, 1, 1, 5, 2)
    mask = random_mask(4, 3, 5)
    mask[1] = False  # query 1 may attend nothing
    want = reference_sdpa(q, k, v, mask)
    with np.errstate(all="ignore"):
        got = impl.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(
        got, want, what="SDPA row with an all-False mask (expected zeros, as PyTorch 2.13)",
        wrong_answers={BIG_NEGATIVE: plain_attention(q, k, v, mask, fill=-1e9),
                       **scale_wrongs(q, k, v, mask)},
        nan_hint="NaN: the row is -inf everywhere; its weights must be 0 (see softmax)",
    )  # fmt: skip


@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [0.37, 0.0], ids=["scale=0.37", "scale=0"])
def test_sdpa_and_the_weights_use_their_scale_keyword_as_pytorch(scale):
    q, k, v = normal(11, 2, 2, 4, 6), normal(12, 2, 2, 5, 6), normal(13, 2, 2, 5, 3)
    want = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True, scale=scale)
    default = reference_sdpa(q, k, v, top_left(4, 5))
    assert_close(impl.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale), want,
                 what=f"SDPA with scale={scale}",
                 wrong_answers=scale_wrong(scale, default))  # fmt: skip
    s = q @ np.swapaxes(k, -1, -2) * scale
    assert_close(impl.attention_weights(q, k, scale=scale), softmax_ref(s),
                 what=f"attention_weights with scale={scale}",
                 wrong_answers=scale_wrong(scale, softmax_ref(q @ np.swapaxes(k, -1, -2)
                                                              / math.sqrt(6))))  # fmt: skip
    assert_close(impl.scaled_dot_scores(q, k, scale=scale), s,
                 what=f"scaled_dot_scores with scale={scale}")  # fmt: skip


@pytest.mark.points(1)
@pytest.mark.parametrize("lq, lk", [(4, 0), (0, 5), (0, 0)])
def test_sdpa_with_no_keys_or_no_queries_is_what_pytorch_returns(lq, lk):
    """Lk = 0: every query may attend nothing, so its output is 0 (PyTorch 2.13's SDPA gives
    zeros too); Lq = 0: an empty ``[..., 0, dv]``."""
    q, k, v = normal(14, 1, 2, lq, 4), normal(15, 1, 2, lk, 4), normal(16, 1, 2, lk, 3)
    want = F.scaled_dot_product_attention(t(q), t(k), t(v))
    with np.errstate(all="ignore"), raised_as(f"SDPA with Lq={lq}, Lk={lk}: with no keys the "
                                              "softmax's max is over nothing (every weight 0)"):
        got = impl.scaled_dot_product_attention(q, k, v)
    assert_close(got, want, what=f"SDPA with Lq={lq}, Lk={lk}",
                 nan_hint="NaN: with no keys the softmax's max and sum are over nothing; "
                 "the row's weights are all 0 (see softmax)")  # fmt: skip


@pytest.mark.points(1)
def test_sdpa_dtypes_float64_stays_float64_and_float16_is_computed_in_float32():
    """The lab's stated dtype rule (README, "How this lab differs"): float64 in, float64 out;
    float32 in, float32 out; float16 in, computed and returned in float32 (PyTorch's SDPA
    would return float16)."""
    q, k, v = normal(17, 1, 2, 3, 4), normal(18, 1, 2, 5, 4), normal(19, 1, 2, 5, 3)
    for dtype, out_dtype in ((np.float64, np.float64), (np.float32, np.float32),
                             (np.float16, np.float32)):  # fmt: skip
        x = [a.astype(dtype) for a in (q, k, v)]
        got = np.asarray(impl.scaled_dot_product_attention(*x))
        assert got.dtype == out_dtype, (
            f"SDPA of {np.dtype(dtype).name} inputs returned {got.dtype}, expected "
            f"{np.dtype(out_dtype).name} (the lab computes float16 in float32 and keeps it)"
        )
        want = reference_sdpa(*(a.astype(out_dtype) for a in x))
        tol = 1e-12 if out_dtype == np.float64 else 1e-5
        assert_close(got, want, what=f"SDPA of {np.dtype(dtype).name} inputs", atol=tol, rtol=tol)


@pytest.mark.points(2)
@pytest.mark.parametrize("h, h_kv", [r for r in HEAD_RATIOS if r[0] <= 8])
def test_gqa_repeats_each_kv_head_for_its_group_as_sdpa_enable_gqa(h, h_kv):
    lq, lk, d = 3, 5, 4
    q, k, v = normal(h, 1, h, lq, d), normal(h_kv, 1, h_kv, lk, d), normal(7, 1, h_kv, lk, 2)
    want = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True, enable_gqa=True)
    group = h // h_kv
    wrong = {GQA_TILE: reference_sdpa(q, np.tile(k, (1, group, 1, 1)),
                                      np.tile(v, (1, group, 1, 1)), top_left(lq, lk))}
    if not (h_kv > 1 and group > 1):
        wrong = {}
    wrong.update(scale_wrongs(q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1),
                              top_left(lq, lk)))
    got = impl.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert_close(got, want, what=f"SDPA with enable_gqa, H={h}, Hkv={h_kv}",
                 wrong_answers=wrong)  # fmt: skip
    # the same, from common's reference (query head h reads KV head h // group)
    assert_close(got, reference_sdpa_gqa(q, k, v, top_left(lq, lk)), what="SDPA with GQA",
                 hint="query head h reads KV head h // (H // Hkv)")


def reference_sdpa_gqa(q, k, v, mask):
    outs, _ = reference_attention(q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2),
                                  v[0].transpose(1, 0, 2), mask=mask)  # fmt: skip
    return outs.transpose(1, 0, 2)[None]


@pytest.mark.points(1)
def test_repeat_kv_repeats_each_head_in_place():
    x = normal(1, 2, 3, 4, 5)  # [B, Hkv=3, L, d]
    got = impl.repeat_kv(x, 2)
    want = torch.repeat_interleave(t(x), 2, dim=1)
    assert_close(got, want, what="repeat_kv(x [2, 3, 4, 5], 2)",
                 wrong_answers={GQA_TILE: np.tile(x, (1, 2, 1, 1))})  # fmt: skip


@pytest.mark.points(1)
def test_attention_weights_are_the_softmax_of_the_masked_scaled_scores():
    q, k = normal(1, 2, 4, 6), normal(2, 2, 5, 6)
    mask = random_mask(3, 4, 5)
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) / math.sqrt(6), -np.inf)
    want = softmax_ref(s)
    raw = np.where(mask, q @ np.swapaxes(k, -1, -2), -np.inf)
    assert_close(impl.attention_weights(q, k, attn_mask=mask), want, what="attention_weights",
                 wrong_answers={WRONG_AXIS: softmax_ref(s, axis=-2), NO_SCALE: softmax_ref(raw),
                                SCALE_BY_D: softmax_ref(raw / 6)})  # fmt: skip


# ---- 5. multi-head attention -------------------------------------------------------------


@pytest.mark.points(1)
def test_split_heads_gives_each_head_its_own_columns_of_every_token():
    x = np.arange(2 * 3 * 8, dtype=np.float64).reshape(2, 3, 8)  # [B, L, E]
    want = np.stack([x[:, :, h * 2 : h * 2 + 2] for h in range(4)], axis=1)  # [B, H, L, Dh]
    got = impl.split_heads(x, 4)
    assert_close(got, want, what="split_heads(x [2, 3, 8], 4)",
                 wrong_answers={HEADS_RESHAPE: x.reshape(2, 4, 3, 2)})  # fmt: skip
    back = impl.merge_heads(want)
    assert_close(back, x, what="merge_heads (the inverse of split_heads)",
                 wrong_answers={HEADS_RESHAPE: want.reshape(2, 3, 8)})  # fmt: skip


def torch_mha(e, h, kdim, vdim, bias, seed):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(e, h, bias=bias, batch_first=True, kdim=kdim, vdim=vdim,
                                      dtype=torch.float64)  # fmt: skip
    if bias:  # nn.MultiheadAttention starts its biases at 0: make them count
        with torch.no_grad():
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    return mha


def copied_weights(mha):
    """The module's weights, copied unchanged (nn.Linear layout)."""
    e = mha.embed_dim
    if mha.in_proj_weight is not None:
        w_q, w_k, w_v = (to_float64(w) for w in mha.in_proj_weight.split(e))
    else:
        w_q, w_k, w_v = (to_float64(w) for w in (mha.q_proj_weight, mha.k_proj_weight,
                                                  mha.v_proj_weight))  # fmt: skip
    biases = mha.in_proj_bias
    b = [None] * 3 if biases is None else [to_float64(x) for x in biases.split(e)]
    b_o = None if mha.out_proj.bias is None else to_float64(mha.out_proj.bias)
    return provided.MultiHeadWeights(w_q, w_k, w_v, to_float64(mha.out_proj.weight), *b, b_o)


def mha_wrongs(query, key, value, w, h, mask, flipped=None):
    """(out, weights) of multi-head attention with the classic mistakes, in numpy."""

    def run(split, scale_width, reduce, mask):
        def lin(x, wt, bt):
            return x @ wt.T + (0 if bt is None else bt)

        q, k, v = lin(query, w.w_q, w.b_q), lin(key, w.w_k, w.b_k), lin(value, w.w_v, w.b_v)
        q, k, v = (split(x) for x in (q, k, v))
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(scale_width)
        p = softmax_ref(np.where(mask, s, -np.inf) if mask is not None else s)
        p = np.nan_to_num(p)  # a row with nothing to attend: zero weights
        o = (p @ v).transpose(0, 2, 1, 3).reshape(query.shape)
        return lin(o, w.w_o, w.b_o), reduce(p)

    e = query.shape[-1]

    def good(x):
        return x.reshape(*x.shape[:2], h, e // h).transpose(0, 2, 1, 3)

    def straight(x):
        return x.reshape(x.shape[0], h, x.shape[1], e // h)

    def mean(p):
        return p.mean(axis=1)

    out = {HEADS_RESHAPE: run(straight, e // h, mean, mask), WEIGHTS_SUMMED: None}
    if e // h > 1:
        out[NO_SCALE] = run(good, 1, mean, mask)
    if h > 1:
        out[MHA_SCALE_E] = run(good, e, mean, mask)
        out[WEIGHTS_SUMMED] = run(good, e // h, lambda p: p.sum(axis=1), mask)
    if flipped is not None:
        out[KPM_POLARITY] = run(good, e // h, mean, flipped)
    return {k: v for k, v in out.items() if v is not None}


def inner_call_diagnosis(kpm, lq, lk, causal, seed):
    """The first of the functions multi_head_attention builds on that is itself wrong, as a
    sentence; "" when they are right (or not written: multi_head_attention need not use them)."""
    q, k = normal(seed + 3, 2, 3, lq, 2), normal(seed + 4, 2, 3, lk, 2)
    x = normal(seed + 5, 2, lq, 6)
    checks = [
        ("key_padding_to_attn_mask", lambda: impl.key_padding_to_attn_mask(kpm),
         ~kpm[:, None, None, :], "test_key_padding_to_attn_mask_inverts_and_broadcasts_over_"
         "heads_and_queries"),
        ("causal_mask", lambda: impl.causal_mask(lq, lk), top_left(lq, lk),
         "test_causal_mask_is_top_left_and_includes_the_diagonal"),
        ("split_heads", lambda: impl.split_heads(x, 3),
         x.reshape(2, lq, 3, 2).transpose(0, 2, 1, 3),
         "test_split_heads_gives_each_head_its_own_columns_of_every_token"),
        ("attention_weights", lambda: impl.attention_weights(q, k),
         softmax_ref(q @ np.swapaxes(k, -1, -2) / math.sqrt(2)),
         "test_attention_weights_are_the_softmax_of_the_masked_scaled_scores"),
    ]
    if not causal:
        checks.pop(1)
    for name, call, want, test in checks:
        try:
            with np.errstate(all="ignore"):
                got = to_float64(np.asarray(call()))
        except NotImplementedError:
            continue
        except Exception as err:  # noqa: BLE001 (any failure of the helper is the diagnosis)
            return f"{name}, which multi_head_attention builds on, raised {err!r} ({test})"
        if got.shape != want.shape or not np.allclose(got, want, atol=1e-12, equal_nan=True):
            return (f"{name}, which multi_head_attention builds on, is itself wrong: fix it "
                    f"first ({test} names how); multi_head_attention's own code may be right")
    return ""


@pytest.mark.points(4)
@examples(20)
@given(
    b=st.integers(1, 2), lq=st.integers(1, 5), lk=st.integers(1, 5), h=st.sampled_from([1, 2, 4]),
    head_dim=st.integers(1, 3), cross=st.booleans(), padded=st.booleans(), causal=st.booleans(),
    bias=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_multi_head_attention_matches_torch_nn_multiheadattention(
    b, lq, lk, h, head_dim, cross, padded, causal, bias, seed
):
    e = h * head_dim
    kdim, vdim = (e + 1, e + 2) if cross else (e, e)
    if not cross:
        lk = lq  # self-attention: the sequence attends to itself
    mha = torch_mha(e, h, kdim, vdim, bias, seed)
    query = normal(seed, b, lq, e)
    key = normal(seed + 1, b, lk, kdim) if cross else query
    value = normal(seed + 2, b, lk, vdim) if cross else query
    lengths = np.random.default_rng(seed).integers(1, lk + 1, b) if padded else np.full(b, lk)
    kpm = np.arange(lk)[None, :] >= lengths[:, None]  # True = padding
    if cross:  # poison the padded keys: a correct mask reads them with weight exactly 0
        key, value = (np.where(kpm[:, :, None], POISON, x) for x in (key, value))
    causal_t = torch.from_numpy(~top_left(lq, lk)) if causal else None  # MHA: True = NOT allowed
    out_t, w_t = mha(t(query), t(key), t(value), key_padding_mask=torch.from_numpy(kpm),
                     attn_mask=causal_t, need_weights=True)  # fmt: skip
    causal_part = top_left(lq, lk) if causal else True
    attend = ~kpm[:, None, None, :] & causal_part
    flipped = kpm[:, None, None, :] & causal_part if padded else None  # polarity swapped
    wrong = mha_wrongs(query, key, value, copied_weights(mha), h, attend, flipped)
    with np.errstate(all="ignore"):
        result = impl.multi_head_attention(
            query, key, value, copied_weights(mha), h,
            key_padding_mask=kpm if padded else None, is_causal=causal,
        )  # fmt: skip
    assert isinstance(result, tuple) and len(result) == 2, "return (out, averaged weights)"
    what = (f"B={b} Lq={lq} Lk={lk} E={e} H={h} {'cross' if cross else 'self'}-attention, "
            f"lengths={lengths.tolist()}, causal={causal}, bias={bias}")  # fmt: skip
    try:
        assert_close(result[0], out_t, what=f"out ({what})",
                     wrong_answers={k: v[0] for k, v in wrong.items()})  # fmt: skip
        assert_close(result[1], w_t, what=f"head-averaged weights ({what})",
                     wrong_answers={k: v[1] for k, v in wrong.items()})  # fmt: skip
    except AssertionError as err:
        diagnosis = inner_call_diagnosis(kpm, lq, lk, causal, seed)
        if diagnosis:
            raise AssertionError(f"{diagnosis}. The symptom: {err}") from None
        raise


@pytest.mark.points(1)
def test_a_fully_padded_sequence_gets_the_output_bias_not_nan():
    """The lab's stated difference from ``nn.MultiheadAttention`` (README, "How this lab
    differs"): for a query whose keys are all padding, torch 2.13's module returns NaN; the
    lab follows SDPA's rule (weights 0, so each head's output is 0) and returns ``b_o``."""
    e, h = 4, 2
    mha = torch_mha(e, h, e, e, True, 3)
    w = copied_weights(mha)
    query = normal(20, 2, 3, e)
    kpm = np.array([[False, False, True], [True, True, True]])  # sequence 1: all padding
    with np.errstate(all="ignore"):
        out, weights = impl.multi_head_attention(query, query, query, w, h, key_padding_mask=kpm)
    out, weights = to_float64(out), to_float64(weights)
    assert_close(out[1], np.broadcast_to(w.b_o, (3, e)),
                 what="out of a sequence whose keys are all padding (expected b_o)",
                 nan_hint="NaN: a row with nothing to attend must get zero weights (as SDPA), "
                 "not NaN (as nn.MultiheadAttention)")  # fmt: skip
    assert_close(weights[1], np.zeros((3, 3)), what="weights of an all-padding sequence")
    out_t, w_t = mha(t(query[:1]), t(query[:1]), t(query[:1]),
                     key_padding_mask=torch.from_numpy(kpm[:1]))  # fmt: skip
    assert_close(out[:1], out_t, what="out of the sequence beside it (as nn.MultiheadAttention)")
    assert_close(weights[:1], w_t, what="its weights")


# ---- 6. positions ------------------------------------------------------------------------


@pytest.mark.points(1)
@pytest.mark.parametrize("length, dim", [(6, 2), (9, 8), (4, 16)])
def test_sinusoidal_positions_interleave_sin_and_cos(length, dim):
    want = np.zeros((length, dim))
    for p in range(length):
        for i in range(dim // 2):
            want[p, 2 * i] = math.sin(p / 10000 ** (2 * i / dim))
            want[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / dim))
    angle = np.arange(length)[:, None] * 10000.0 ** (-np.arange(dim // 2) / dim)
    wrong = {
        SIN_CAT: np.concatenate([want[:, 0::2], want[:, 1::2]], axis=1),
        SIN_EXPONENT: np.stack([np.sin(angle), np.cos(angle)], -1).reshape(length, dim),
    }
    assert_close(impl.sinusoidal_positions(length, dim), want,
                 what=f"sinusoidal_positions({length}, {dim})", wrong_answers=wrong)  # fmt: skip


def rope_ref(x, positions, interleaved, base=10000.0, exponent=2.0):
    """RoPE as complex multiplication: pair (a, b) is a + ib, rotated by e^{i p theta}."""
    d = x.shape[-1]
    if interleaved:
        z = x[..., 0::2] + 1j * x[..., 1::2]
    else:
        z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    theta = base ** (-exponent * np.arange(d // 2) / d)
    z = z * np.exp(1j * np.asarray(positions)[:, None] * theta)
    if interleaved:
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)
    return np.concatenate([z.real, z.imag], axis=-1)


def rope_signs_wrong(x, positions, interleaved, base=10000.0):
    """{misconception: RoPE with a sign of its pair update wrong}: (a, b) becomes
    (a cos - b sin, a sin - b cos), a reflection, or the rotation the other way."""
    d = x.shape[-1]
    second = np.arange(1, d, 2) if interleaved else np.arange(d // 2, d)  # the b of each pair
    cos = np.cos(np.asarray(positions)[:, None] * base ** (-2 * np.arange(d // 2) / d))
    reflected = rope_ref(x, positions, interleaved, base=base)
    reflected[..., second] -= 2 * x[..., second] * cos  # a sin + b cos -> a sin - b cos
    return {ROPE_NOT_A_ROTATION: reflected,
            ROPE_BACKWARDS: rope_ref(x, -np.asarray(positions), interleaved, base=base)}


BASE_IGNORED = "base= was ignored (10000 used): Llama 3's RoPE and encodings use base=500000"


@pytest.mark.points(1)
@pytest.mark.parametrize("interleaved", [True, False])
def test_positions_use_their_base_keyword(interleaved):
    length, dim, base = 7, 8, 500000.0
    pos = np.arange(length) * 997  # far positions: a wrong base shows at once
    want = np.zeros((length, dim))
    for p in range(length):
        for i in range(dim // 2):
            want[p, 2 * i] = math.sin(p / base ** (2 * i / dim))
            want[p, 2 * i + 1] = math.cos(p / base ** (2 * i / dim))
    assert_close(impl.sinusoidal_positions(length, dim, base=base), want,
                 what=f"sinusoidal_positions({length}, {dim}, base={base:g})",
                 wrong_answers={BASE_IGNORED: impl.sinusoidal_positions(length, dim)})
    x = normal(21, 2, length, dim)
    assert_close(impl.apply_rope(x, pos, base=base, interleaved=interleaved),
                 rope_ref(x, pos, interleaved, base=base),
                 what=f"apply_rope(base={base:g}, interleaved={interleaved})",
                 atol=1e-10, rtol=1e-10,
                 wrong_answers={BASE_IGNORED: rope_ref(x, pos, interleaved),
                                ROPE_OTHER_PAIRS: rope_ref(x, pos, not interleaved, base=base),
                                ROPE_THETA: rope_ref(x, pos, interleaved, base=base, exponent=1.0),
                                **rope_signs_wrong(x, pos, interleaved, base)})  # fmt: skip


@pytest.mark.points(2)
@given(
    length=st.integers(1, 6), half=st.integers(1, 4), interleaved=st.booleans(),
    offset=st.integers(0, 5000), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_rope_rotates_the_pairs_of_its_style(length, half, interleaved, offset, seed):
    d = 2 * half
    x = normal(seed, 2, length, d)
    pos = offset + np.arange(length)
    want = rope_ref(x, pos, interleaved)
    wrong = {ROPE_THETA: rope_ref(x, pos, interleaved, exponent=1.0)} if half > 1 else {}
    wrong.update(rope_signs_wrong(x, pos, interleaved))
    if half > 1:
        wrong[ROPE_OTHER_PAIRS] = rope_ref(x, pos, not interleaved)
    got = impl.apply_rope(x, pos, interleaved=interleaved)
    assert_close(got, want, what=f"apply_rope (d={d}, interleaved={interleaved})",
                 atol=1e-10, rtol=1e-10, wrong_answers=wrong)  # fmt: skip


@pytest.mark.points(1)
@given(half=st.integers(1, 8), interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_preserves_norms_and_leaves_position_zero_alone(half, interleaved, seed):
    x = normal(seed, 5, 2 * half)
    pos = np.array([0, 1, 7, 100, 4096])
    got = to_float64(impl.apply_rope(x, pos, interleaved=interleaved))
    assert_close(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1),
                 what="norms after RoPE (a rotation keeps lengths)", atol=1e-10, rtol=1e-10,
                 hint=ROPE_NOT_A_ROTATION)
    assert_close(got[0], x[0], what="RoPE at position 0 (angle 0: nothing moves)",
                 hint="the angle is position * theta_i: at position 0 every pair stays put")


@pytest.mark.points(2)
@given(
    half=st.integers(1, 8), m=st.integers(0, 300), n=st.integers(0, 300),
    shift=st.integers(1, 2000), interleaved=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_rope_scores_depend_only_on_the_distance_m_minus_n(half, m, n, shift, interleaved, seed):
    d = 2 * half
    q, k = normal(seed, 1, d), normal(seed + 1, 1, d)

    def score(pm, pn):
        qr = to_float64(impl.apply_rope(q, np.array([pm]), interleaved=interleaved))
        kr = to_float64(impl.apply_rope(k, np.array([pn]), interleaved=interleaved))
        return float(qr[0] @ kr[0])

    # the closed form: Re(sum_i q_i conj(k_i) e^{i (m-n) theta_i}) for the complex pairs
    want = float(rope_ref(q, [m - n], interleaved)[0] @ k[0])
    got, shifted = score(m, n), score(m + shift, n + shift)
    assert abs(got - want) < 1e-9, (
        f"q_m·k_n after RoPE should be {want:.12g} (a function of m-n={m - n} only), got {got:.12g}"
    )
    assert abs(shifted - got) < 1e-9, (
        f"shifting both positions by {shift} changed q·k from {got:.12g} to {shifted:.12g}: "
        "RoPE's score must depend only on m - n (rotate q and k by the SAME frequencies)"
    )


@pytest.mark.points(1)
def test_zero_sizes_give_empty_arrays_not_errors():
    """The contract allows 0 queries, keys, positions and sequence lengths (``minimum=0``)."""
    cases = {
        "causal_mask(0, 3)": (lambda: impl.causal_mask(0, 3), (0, 3)),
        "causal_mask(2, 0)": (lambda: impl.causal_mask(2, 0), (2, 0)),
        "key_padding_mask([0, 0], 0)": (lambda: impl.key_padding_mask(np.array([0, 0]), 0),
                                        (2, 0)),
        "sinusoidal_positions(0, 4)": (lambda: impl.sinusoidal_positions(0, 4), (0, 4)),
        "apply_rope(x [2, 0, 4], positions [])": (
            lambda: impl.apply_rope(np.zeros((2, 0, 4)), np.arange(0)), (2, 0, 4)),
    }  # fmt: skip
    for what, (call, shape) in cases.items():
        with raised_as(f"{what}: a zero size is allowed, the answer is an empty array"):
            got = np.asarray(call())
        assert got.shape == shape, f"{what} has shape {got.shape}, expected {shape} (empty)"


# ---- 7. bad input is a ValueError that names the argument ---------------------------------

_q, _k, _v = normal(1, 1, 2, 3, 4), normal(2, 1, 2, 5, 4), normal(3, 1, 2, 5, 2)
_w = provided.MultiHeadWeights(*(normal(i, 4, 4) for i in range(4)))
BAD_INPUTS: BadInputs = {
    "dot_scores-k": ("k", lambda: impl.dot_scores(_q, _k[..., :3])),
    "general_scores-w": ("w", lambda: impl.general_scores(_q[0, 0], _k[0, 0], np.ones((3, 4)))),
    "additive_scores-v_a": (
        "v_a", lambda: impl.additive_scores(_q[0, 0], _k[0, 0], np.ones((4, 3)), np.ones((4, 3)),
            np.ones(2))),
    "sdpa-v": ("v", lambda: impl.scaled_dot_product_attention(_q, _k, _v[..., :4, :])),
    "sdpa-attn_mask": (
        "attn_mask", lambda: impl.scaled_dot_product_attention(_q, _k, _v, np.ones((3, 4), bool))),
    "sdpa-attn_mask-2": (
        "attn_mask", lambda: impl.scaled_dot_product_attention(
            _q, _k, _v, np.ones((3, 5), bool), is_causal=True)),
    "sdpa-mixed-dtypes": (
        "k", lambda: impl.scaled_dot_product_attention(_q, _k.astype(np.float32), _v)),
    "sdpa-gqa-k": (
        "k", lambda: impl.scaled_dot_product_attention(
            normal(1, 1, 3, 3, 4), _k, _v, enable_gqa=True)),
    "key_padding_mask-lengths": ("lengths", lambda: impl.key_padding_mask(np.array([2, 6]), 5)),
    "split_heads-num_heads": ("num_heads", lambda: impl.split_heads(np.ones((1, 2, 6)), 4)),
    "multi_head_attention-num_heads": (
        "num_heads", lambda: impl.multi_head_attention(
            np.ones((1, 2, 4)), np.ones((1, 3, 4)), np.ones((1, 3, 4)), _w, 3)),
    "multi_head_attention-w_k": (
        "w_k", lambda: impl.multi_head_attention(
            np.ones((1, 2, 4)), np.ones((1, 3, 5)), np.ones((1, 3, 4)), _w, 2)),
    "sinusoidal_positions-dim": ("dim", lambda: impl.sinusoidal_positions(4, 5)),
    "apply_rope-x": ("x", lambda: impl.apply_rope(np.ones((3, 5)), np.arange(3))),
    "apply_rope-positions": ("positions", lambda: impl.apply_rope(np.ones((3, 4)), np.arange(4))),
    "scale_experiment-d": ("d", lambda: impl.scale_experiment(0)),
}  # fmt: skip
test_bad_input_raises_value_error_naming_the_argument = bad_input_test(BAD_INPUTS, points=0.5)
