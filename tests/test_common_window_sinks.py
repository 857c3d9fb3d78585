"""The reference's window and sink options, checked against an independent PyTorch float64
computation (not graded). The PyTorch side follows gpt-oss's reference ``sdpa``: the window
is a band of the causal mask, and the sink is one more logit column that is dropped after
the softmax."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common.reference import kv_head_for, reference_attention, window_mask
from common.testing import assert_close, head_counts

WINDOW = ("a window of w keeps the last w keys, the query's own included (keys > pos - w): "
          "one more is an off-by-one")


def torch_attention(q, k, v, window=None, sinks=None, scale=None):
    """float64 PyTorch attention of the last ``Lq`` of ``Lk`` tokens: ``[Lq, H, d]``."""
    q, k, v = (torch.tensor(x, dtype=torch.float64) for x in (q, k, v))
    lq, h, d = q.shape
    lk, kvh = k.shape[:2]
    heads = torch.tensor(kv_head_for(np.arange(h), h, kvh))
    scale = 1 / math.sqrt(d) if scale is None else scale
    s = torch.einsum("qhd,khd->hqk", q, k[:, heads]) * scale  # [H, Lq, Lk]
    if window is not None:  # query i sits at position lk - lq + i; the band ends there
        band = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
        band &= ~torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq - window)
        s = s.masked_fill(~band, -math.inf)
    if sinks is not None:
        column = torch.tensor(sinks, dtype=torch.float64).reshape(h, 1, 1).expand(h, lq, 1)
        s = torch.cat([s, column], dim=-1)
    lse = torch.logsumexp(s, dim=-1)  # [H, Lq]
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # an all -inf row: weights 0
    if sinks is not None:
        w = w[..., :-1]
    out = torch.einsum("hqk,khd->qhd", w, v[:, heads])
    return out.numpy(), lse.T.numpy()


@given(
    heads=head_counts(),
    lq=st.integers(1, 6),
    extra=st.integers(0, 10),
    window=st.one_of(st.none(), st.integers(1, 20)),
    with_sinks=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_window_and_sinks_match_pytorch_in_float64(heads, lq, extra, window, with_sinks, seed):
    h, kvh = heads
    lk = lq + extra
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, x, 4)) for n, x in ((lq, h), (lk, kvh), (lk, kvh)))
    sinks = 2 * rng.standard_normal(h) if with_sinks else None
    want_out, want_lse = torch_attention(q, k, v, window, sinks)
    out, lse = reference_attention(q, k, v, window=window, sinks=sinks)
    assert_close(out, want_out, what="reference out with window/sinks vs PyTorch", rtol=1e-10,
                 hint=WINDOW)
    assert_close(lse, want_lse, what="reference lse with window/sinks vs PyTorch", rtol=1e-10)


def test_window_mask_keeps_each_querys_window_most_recent_keys_itself_included():
    # 2 queries at positions 4 and 5 of 6 tokens, window 3: keys 2..4 and 3..5
    assert window_mask(2, 6, 3).astype(int).tolist() == [
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ], WINDOW
    # FlashAttention's window_size=(window - 1, 0) reaches window - 1 keys to the left
    assert window_mask(1, 10, 1).astype(int).tolist() == [[0] * 9 + [1]]


def test_a_window_at_least_the_length_is_causal_attention_and_none_changes_nothing():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2, 4)), rng.standard_normal((7, 1, 4)), rng.standard_normal(
        (7, 1, 4))
    causal = reference_attention(q, k, v, mask=window_mask(3, 7, 7))
    for got in (reference_attention(q, k, v, window=7), reference_attention(q, k, v, window=99)):
        assert_close(got[0], causal[0], what="out with a window >= Lk")
    plain = reference_attention(q, k, v)
    same = reference_attention(q, k, v, window=None, sinks=None)
    assert_close(same[0], plain[0], what="out with window=None, sinks=None")
    assert_close(same[1], plain[1], what="lse with window=None, sinks=None")


def test_a_sink_adds_a_weight_without_a_value_and_minus_inf_is_no_sink():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 2, 4)), rng.standard_normal((5, 2, 4)), rng.standard_normal(
        (5, 2, 4))
    out, lse = reference_attention(q, k, v)
    sinks = np.array([0.5, -1.0])
    out_s, lse_s = reference_attention(q, k, v, sinks=sinks)
    # the sink only enlarges the denominator: out shrinks by l / (l + exp(sink))
    shrink = np.exp(lse) / (np.exp(lse) + np.exp(sinks))  # [1, H]
    assert_close(out_s, out * shrink[..., None], what="out with sinks")
    assert_close(lse_s, np.logaddexp(lse, sinks), what="lse with sinks")
    none = reference_attention(q, k, v, sinks=np.full(2, -np.inf))
    assert_close(none[0], out, what="out with sinks = -inf")


def test_a_row_with_nothing_to_attend_gives_zero_and_its_sink_as_lse():
    q, k, v = np.ones((1, 2, 4)), np.ones((3, 2, 4)), np.ones((3, 2, 4))
    nothing = np.zeros((1, 3), dtype=bool)
    out, lse = reference_attention(q, k, v, mask=nothing, sinks=np.array([0.25, -np.inf]))
    assert np.array_equal(out, np.zeros((1, 2, 4)))
    assert lse.tolist() == [[0.25, -np.inf]]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_a_bad_window_or_sink_shape_is_a_value_error_naming_it(bad):
    q = k = v = np.ones((2, 2, 4))
    with pytest.raises(ValueError, match="window"):
        reference_attention(q, k, v, window=bad)
    with pytest.raises(ValueError, match="sinks"):
        reference_attention(q, k, v, sinks=np.zeros(3))
