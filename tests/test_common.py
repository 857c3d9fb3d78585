"""Tests of the shared machinery itself (not graded): the reference is checked against
PyTorch's own SDPA, the paged builders against their promises, the loader against LAB_IMPL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from common import (
    blocks_needed,
    build_paged_kv,
    kv_head_for,
    lab_impl,
    prefix_mask,
    random_kv,
    reference_attention,
)
from common.testing import assert_close, called_on_copies, copied, head_counts, peak_memory


def _sdpa(q, k, v, mask=None, scale=None):
    # torch wants [B, H, L, d]; our arrays are [L, H, d]
    qt, kt, vt = (torch.tensor(x).permute(1, 0, 2)[None] for x in (q, k, v))
    m = None if mask is None else torch.tensor(mask)
    out = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=m, scale=scale, enable_gqa=True
    )
    return out[0].permute(1, 0, 2).numpy()


@given(
    heads=head_counts(),
    lq=st.integers(1, 9),
    lk=st.integers(1, 9),
    d=st.sampled_from([1, 4, 8]),
    dv=st.sampled_from([2, 8]),
    masked=st.booleans(),
)
def test_reference_matches_pytorch_sdpa_in_float64(heads, lq, lk, d, dv, masked):
    h, kvh = heads
    rng = np.random.default_rng(lq * 100 + lk)
    q = rng.standard_normal((lq, h, d))
    k = rng.standard_normal((lk, kvh, d))
    v = rng.standard_normal((lk, kvh, dv))
    mask = prefix_mask(np.arange(lq) + max(lk - lq, 0), lk) if masked else None
    out, lse = reference_attention(q, k, v, mask=mask)
    assert_close(out, _sdpa(q, k, v, mask), what="reference out vs SDPA", atol=1e-12, rtol=1e-10)
    heads_idx = kv_head_for(np.arange(h), h, kvh)
    s = np.einsum("qhd,khd->qhk", q, k[:, heads_idx]) / math.sqrt(d)
    if mask is not None:
        s = np.where(mask[:, None, :], s, -np.inf)
    want = np.log(np.exp(s).sum(-1))
    assert_close(lse, want, what="reference lse", atol=1e-12, rtol=1e-12)


def test_reference_empty_rows_have_zero_output_and_minus_inf_lse():
    q, k, v = np.ones((2, 3)), np.ones((4, 3)), np.ones((4, 5))
    mask = np.array([[False] * 4, [True, False, False, False]])
    out, lse = reference_attention(q, k, v, mask=mask)
    assert np.all(out[0] == 0) and lse[0] == -np.inf
    assert np.allclose(out[1], 1.0) and np.isclose(lse[1], 3 / math.sqrt(3))


def test_reference_rejects_head_counts_that_do_not_divide():
    with pytest.raises(ValueError, match="num_kv_heads"):
        reference_attention(np.ones((1, 3, 4)), np.ones((2, 2, 4)), np.ones((2, 2, 4)))


@given(
    lens=st.lists(st.integers(0, 20), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 2, 3, 16]),
    padding=st.sampled_from(["minus_one", "poisoned"]),
)
def test_paged_builder_places_every_token_and_poisons_the_rest(lens, block_size, padding):
    rng = np.random.default_rng(1)
    ks, vs = random_kv(rng, lens, 2, 4)
    cache = build_paged_kv(ks, vs, block_size, rng=rng, padding=padding)
    used = set()
    for b, n in enumerate(lens):
        table = cache.block_tables[b]
        for t in range(n):
            blk = table[t // block_size]
            used.add(int(blk))
            np.testing.assert_array_equal(cache.k_cache[blk, t % block_size], ks[b][t])
            np.testing.assert_array_equal(cache.v_cache[blk, t % block_size], vs[b][t])
        nb = blocks_needed(n, block_size)
        for pad in table[nb:]:
            assert pad == -1 or np.isnan(cache.k_cache[pad]).all()
        if n % block_size:
            assert np.isnan(cache.k_cache[table[nb - 1], n % block_size :]).all()
    for blk in cache.unused_blocks:
        assert blk not in used and np.isnan(cache.k_cache[blk]).all()


def test_paged_builder_shuffles_physical_blocks():
    ks, vs = random_kv(np.random.default_rng(0), [64], 1, 2)
    cache = build_paged_kv(ks, vs, 4, rng=0)
    assert list(cache.block_tables[0, :16]) != list(range(16))


def test_lab_impl_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("LAB_IMPL", "answer")
    with pytest.raises(ValueError, match="solution, starter"):
        lab_impl()


def test_assert_close_names_the_matching_misconception():
    with pytest.raises(AssertionError, match="forgot the scale"):
        wrong = {"you forgot the scale": 2.0 * np.ones(3)}
        assert_close(np.ones(3) * 2, np.ones(3), wrong_answers=wrong)
    with pytest.raises(AssertionError, match="NaN reached"):
        assert_close(np.array([np.nan]), np.array([1.0]))


def test_after_a_failed_basic_value_test_later_hints_point_back_at_it(monkeypatch):
    from common import testing

    monkeypatch.setattr(testing, "_FAILED_BASICS", {})
    lab = "labs/lab-xx/test_lab.py"

    def hint_of(test_name: str) -> str:
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{lab}::{test_name} (call)")
        with pytest.raises(AssertionError) as failure:
            assert_close(np.ones(2), np.zeros(2), hint="look at the diagonal tiles")
        return str(failure.value)

    @testing.basic_value_test
    def test_basic():
        assert_close(np.ones(2), np.zeros(2), hint="look at the diagonal tiles")

    assert "look at the diagonal tiles" in hint_of("test_later")  # nothing failed yet
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{lab}::test_basic[case] (call)")
    with pytest.raises(AssertionError, match="look at the diagonal tiles"):
        test_basic()  # the basic test keeps its own hint
    later = hint_of("test_later")
    assert "look at the diagonal" not in later and "test_basic failed as well" in later
    assert "look at the diagonal tiles" in hint_of("test_triton_later"), "the other half"


def _scribbler():
    """A module whose functions write into every argument, then answer from what they wrote."""
    import types

    module = types.ModuleType("lab_99_scribble.starter")

    def total(x, pair, t):
        x[...] = 0.0  # overwrite the input, then answer "correctly" for the overwritten one
        pair[0][...] = 1.0
        t.fill_(2.0)
        return float(x.sum() + pair[0].sum() + t.sum())

    def write_into(cache, new):
        cache[: len(new)] = new
        new[...] = -1.0

    def same(a, b):
        return a is b

    module.total, module.write_into, module.same = total, write_into, same
    module.CONSTANT = 3
    return module


def test_called_on_copies_keeps_the_tests_arrays_out_of_the_graded_codes_reach():
    impl = called_on_copies(_scribbler(), writes={"write_into": (0, "cache")})
    x, y = np.arange(6.0).reshape(2, 3), np.ones(2)
    base = torch.arange(12.0).reshape(3, 4)
    t = base[:, 1:3]  # a strided view: the copy keeps its strides and its storage's margins
    assert impl.total(x, (y,), t) == 0.0 + 2.0 + 12.0
    assert x.tolist() == np.arange(6.0).reshape(2, 3).tolist() and y.tolist() == [1.0, 1.0]
    assert base.flatten().tolist() == list(range(12))
    cache, new = np.zeros(4), np.array([5.0, 6.0])
    impl.write_into(cache, new)  # declared: the cache is written, the new tokens are copied
    assert cache.tolist() == [5.0, 6.0, 0.0, 0.0] and new.tolist() == [5.0, 6.0]
    cache = np.zeros(4)
    impl.write_into(cache=cache, new=new)
    assert cache.tolist() == [5.0, 6.0, 0.0, 0.0]
    assert impl.same(x, x), "an array named twice is copied once: aliasing is kept"
    assert impl.CONSTANT == 3 and impl.total is impl.total


def test_a_copied_view_shows_the_same_elements_at_its_own_storage_offset():
    base = torch.arange(12.0).reshape(3, 4)
    for view in (base[1:, 1:3], base[2], base.t()[1:]):
        copy = copied(view)
        assert copy.data_ptr() != view.data_ptr(), "a copy, not the argument itself"
        assert torch.equal(copy, view) and copy.stride() == view.stride(), (
            "the harness copies a tensor argument with its storage offset and strides: a "
            f"sliced view's copy shows other elements ({copy.tolist()} for {view.tolist()})")


def test_called_on_copies_copies_before_peak_memory_measures():
    import types

    module = types.ModuleType("lab_99_peak.starter")
    module.first = lambda a: float(a[0])
    module.first.__module__ = module.__name__
    impl = called_on_copies(module)
    big = np.zeros(2**20)  # 8 MiB: its copy is made outside the measured call
    value, peak = peak_memory(impl.first, big)
    assert value == 0.0 and peak < 2**20


def _raise(error: Exception) -> None:
    raise error


def test_assert_value_error_names_wants_the_argument_as_a_whole_word():
    from common.testing import assert_value_error_names

    assert_value_error_names(lambda: _raise(ValueError("seq_lens must be >= 0")), "seq_lens")
    with pytest.raises(AssertionError, match="should name 'seq_len'"):
        assert_value_error_names(lambda: _raise(ValueError("seq_lens must be >= 0")), "seq_len")
    with pytest.raises(AssertionError, match="none was raised"):
        assert_value_error_names(lambda: None, "k", "case")
    with pytest.raises(NotImplementedError):  # a starter's TODO fails the test
        assert_value_error_names(lambda: _raise(NotImplementedError("TODO")), "k")
    assert_value_error_names(lambda: _raise(ValueError("k or v")), r"\bv\b|block")


def test_bad_input_test_is_one_parametrized_test_with_points_per_case():
    from common.testing import bad_input_test

    test = bad_input_test({"a": ("x", lambda: _raise(ValueError("x < 0")))}, points=0.5,
                          marks=(pytest.mark.triton,))
    marks = {m.name: m for m in test.pytestmark}
    assert marks["points"].args == (0.5,) and "triton" in marks
    assert marks["parametrize"].args == ("case", ["a"])
    test("a")


def test_random_paged_decode_pages_the_dense_kv_it_returns():
    from common.paged import random_paged_decode

    rng = np.random.default_rng(0)
    q, ks, vs, paged = random_paged_decode(rng, [5, 9], 4, 2, 8, 4, shared_prefix=5)
    assert q.shape == (2, 4, 8) and [k.shape for k in ks] == [(5, 2, 8), (9, 2, 8)]
    table = paged.block_tables[1]
    for t in range(9):
        np.testing.assert_array_equal(paged.k_cache[table[t // 4], t % 4], ks[1][t])
    np.testing.assert_array_equal(ks[0], ks[1][:5])  # the shared prefix
