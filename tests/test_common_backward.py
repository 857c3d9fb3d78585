"""The float64 reference backward (``common.reference.reference_attention_backward``) is
itself checked against torch.autograd in float64 on an independent torch implementation
of attention (softmax of masked scores, K/V repeated per query head for GQA)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from common.reference import prefix_mask, reference_attention, reference_attention_backward

# (Lq, Lk, H, KVH, d, dv, causal, scale)
CASES = {
    "single-head-2d": (5, 7, None, None, 4, 3, False, None),
    "single-head-2d-causal-lq<lk": (4, 9, None, None, 3, 5, True, None),
    "mha": (6, 6, 3, 3, 4, 4, True, 0.3),
    "gqa-8-2": (5, 8, 8, 2, 4, 3, False, None),
    "gqa-6-3-causal-lq>lk": (9, 5, 6, 3, 5, 2, True, None),
    "mqa-4-1": (7, 7, 4, 1, 3, 3, True, 1.7),
}


def autograd_gradients(q, k, v, do, scale, causal):
    """dq, dk, dv of sum(out * do) through torch.autograd in float64 (out [Lq, H, dv])."""
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    do = torch.tensor(do, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    k_rep = k.repeat_interleave(group, dim=1)  # [Lk, H, d]: head h reads KV head h // group
    v_rep = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else scale
    s = torch.einsum("qhd,khd->hqk", q, k_rep) * scale
    if causal:
        s = s.masked_fill(~torch.tensor(prefix_mask(np.arange(q.shape[0]), k.shape[0])),
                          float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v_rep)
    (out * do).sum().backward()
    return q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_reference_backward_equals_torch_autograd_in_float64(case):
    lq, lk, h, kvh, d, dv, causal, scale = CASES[case]
    rng = np.random.default_rng(lq * 100 + lk)
    heads = () if h is None else (h,)
    kv_heads = () if kvh is None else (kvh,)
    q = rng.standard_normal((lq, *heads, d))
    k = rng.standard_normal((lk, *kv_heads, d))
    v = rng.standard_normal((lk, *kv_heads, dv))
    do = rng.standard_normal((lq, *heads, dv))
    mask = prefix_mask(np.arange(lq), lk) if causal else None

    got = reference_attention_backward(q, k, v, do, scale=scale, mask=mask)

    as_3d = (lambda x: x[:, None, :]) if h is None else (lambda x: x)
    want = autograd_gradients(as_3d(q), as_3d(k), as_3d(v), as_3d(do), scale, causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        w = w[:, 0, :] if h is None else w
        assert g.shape == w.shape, f"{name}: shape {g.shape}, autograd {w.shape}"
        np.testing.assert_allclose(g, w, atol=1e-12, rtol=1e-12, err_msg=f"{case}: {name}")


def test_reference_backward_of_a_row_that_attends_nothing_is_zero():
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal(s) for s in ((3, 4), (5, 4), (5, 2), (3, 2)))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False  # row 1 attends no key: out 0, lse -inf, and no gradient flows
    dq, dk, dv = reference_attention_backward(q, k, v, do, mask=mask)
    assert np.all(dq[1] == 0), "a row with no keys has dq = 0"
    rows = np.array([0, 2])
    want = reference_attention_backward(q[rows], k, v, do[rows], mask=mask[rows])
    for name, g, w in zip(("dq", "dk", "dv"), (dq[rows], dk, dv), want):
        np.testing.assert_allclose(g, w, atol=1e-12, rtol=1e-12, err_msg=name)


def test_reference_backward_agrees_with_the_forward_by_finite_differences():
    """d/dε of sum(out(q + ε e) * do) at ε = 0, central differences, for a few entries."""
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((4, 2, 3)), rng.standard_normal((6, 1, 3)), rng.standard_normal(
        (6, 1, 2)
    )
    do = rng.standard_normal((4, 2, 2))
    mask = prefix_mask(np.arange(4), 6)
    grads = reference_attention_backward(q, k, v, do, mask=mask)

    def loss(q_, k_, v_):
        return float((reference_attention(q_, k_, v_, mask=mask)[0] * do).sum())

    eps = 1e-6
    for which, grad in enumerate(grads):
        args = [q, k, v]
        index = tuple(rng.integers(0, n) for n in args[which].shape)
        plus, minus = [a.copy() for a in args], [a.copy() for a in args]
        plus[which][index] += eps
        minus[which][index] -= eps
        numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert abs(numeric - grad[index]) < 1e-7, (which, index, numeric, grad[index])


def test_reference_backward_rejects_mismatched_do():
    with pytest.raises(ValueError, match="do"):
        reference_attention_backward(np.zeros((3, 4)), np.zeros((5, 4)), np.zeros((5, 2)),
                                     np.zeros((3, 3)))
