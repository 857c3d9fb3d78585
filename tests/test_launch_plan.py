"""common/launch_plan.py: the launch plan changes the way the lessons say it does (pure
functions, no GPU, milliseconds)."""

from __future__ import annotations

import pytest

from common import launch_plan as lp

SM90 = lp.H100


def waves(plan: lp.Plan, target: lp.Target) -> float:
    return plan.ctas / target.sms


@pytest.mark.points(2)
def test_batch_1_at_64k_context_splits_until_the_grid_fills_132_sms():
    plan = lp.split_kv_decode(1, 8, 4, 128, 65536, SM90)
    assert plan.splits > 1, "batch 1 x 8 KV heads is 8 CTAs on 132 SMs: the plan must split"
    assert waves(plan, SM90) >= 1, f"grid {plan.grid}: {plan.ctas} CTAs < 132 SMs"
    assert plan.tiles["partition_size"] * plan.splits >= 65536
    assert plan.tiles["partition_size"] % plan.tiles["block_n"] == 0


@pytest.mark.points(1)
def test_a_batch_that_fills_the_machine_does_not_split():
    plan = lp.split_kv_decode(64, 8, 4, 128, 4096, SM90)
    assert plan.splits == 1 and plan.grid == (64, 8)


@pytest.mark.points(1)
def test_short_contexts_do_not_split_below_the_minimum_chunk():
    assert lp.split_kv_decode(1, 8, 4, 128, lp.MIN_SPLIT_KEYS, SM90).splits == 1


@pytest.mark.points(2)
@pytest.mark.parametrize("group", [1, 4, 8, 32])
def test_long_prompts_get_at_least_64_row_query_tiles_on_sm_90(group: int):
    plan = lp.varlen_prefill(16384, 8, 8, group, 128, SM90)
    assert plan.tiles["block_m"] >= 64, f"group {group}: {plan.tiles} (16 rows: mma.sync, L2-bound)"
    assert plan.tiles["block_m"] % group == 0, "a tile holds whole groups (GQA packing)"


@pytest.mark.points(1)
def test_prefill_follows_flashinfers_packed_row_thresholds():
    assert lp.query_tile_rows(65, 128, SM90) == 128
    assert lp.query_tile_rows(64, 128, SM90) == 64
    assert lp.query_tile_rows(16, 128, SM90) == 16
    assert lp.query_tile_rows(4096, 256, SM90) == 64


@pytest.mark.points(1)
@pytest.mark.parametrize("family", ["prefill", "split", "mla", "forward", "backward"])
def test_the_interpreter_keeps_16_wide_tiles(family: str):
    t = lp.INTERPRETER
    plan = {"prefill": lambda: lp.varlen_prefill(64, 2, 2, 2, 32, t),
            "split": lambda: lp.split_kv_decode(1, 2, 2, 32, 65536, t),
            "mla": lambda: lp.mla_decode(2, 16, 64, 64, t),
            "forward": lambda: lp.flash_forward(64, t),
            "backward": lambda: lp.flash_backward(64, t)}[family]()
    assert plan.tiles.get("block_n", 16) == 16 and plan.tiles.get("block_m", 16) == 16


@pytest.mark.points(1)
def test_mla_tiles_hold_64_heads_on_a_gpu():
    plan = lp.mla_decode(64, 128, 512, 4096, SM90)
    # 64 x 2 = 128 work items on 132 SMs: split 3 ways (384 CTAs, over one wave)
    assert plan.tiles["block_h"] == 64 and plan.grid == (64, 2, 3) and plan.splits == 3


@pytest.mark.points(1)
def test_mla_and_window_decode_at_batch_1_split_into_at_least_one_wave():
    mla = lp.mla_decode(1, 128, 512, 65536, SM90)
    assert mla.splits > 1 and mla.ctas >= SM90.sms and mla.grid == (1, 2, mla.splits)
    window = lp.window_decode(1, 8, 4, 128, 65536, None, SM90)
    assert window.splits > 1 and window.ctas >= SM90.sms and window.grid[-1] == window.splits
    # a 128-token window is too few keys to split (MIN_SPLIT_KEYS)
    assert lp.window_decode(1, 8, 4, 128, 65536, 128, SM90).splits == 1
    # enough work items: no split (FlashInfer's "no split" case)
    assert lp.window_decode(64, 8, 4, 128, 4096, None, SM90).splits == 1
    assert lp.mla_decode(2, 16, 64, 64, lp.INTERPRETER).splits == 1


@pytest.mark.points(1)
def test_targets_by_compute_capability():
    assert lp.target_for(90).sms == 132 and lp.target_for(100).sms == 148
    assert lp.target_for(89, 84).sms == 84 and lp.target_for(0).interpreter
