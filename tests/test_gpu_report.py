"""`make gpu-report` (bench/gpu_report.py): the parsers, the occupancy arithmetic and the
specialisation rules on canned inputs (fast, no triton), then real compiles for sm_90 on the
CPU: no spills, shared memory within the per-block limit, a tensor-core MMA for every tl.dot.

The quick compile test builds one small config, lab 01's decode kernel at fp16, d=64 (one
worker process: about 2.5 s of CPU with a warm build/gpu-report/, since the worker still
starts to compute the cache key; more cold). A real compile, like the labs' graded
`gpu_compile` tests, it is marked `slow` (`make test-slow`, which CI runs). The check of
every kernel is marked `slow` too and deselected by default (pyproject's addopts
`-m "not slow"`): it compiles one config per kernel (bf16, the bench shapes' head dim),
minutes with a cold cache. `make gpu-report` runs it after the
report (warm cache, seconds); `make test-slow` or `pytest -m slow tests/test_gpu_report.py`
runs it alone. In the default suite too: the committed captured_outputs/gpu-report.json must
cover every config of this tree (same cache keys: kernel source, launch constants, Triton) and
pass every sm_90 check; seconds, since keys are computed and nothing is compiled.
"""

from __future__ import annotations

import importlib.util
import pathlib
from dataclasses import replace
from types import SimpleNamespace

import pytest

from bench import gpu_render, gpu_report
from bench.counts import attention_work, lower_bound_ms
from bench.gpu_compile import (
    SkipEntry,
    Task,
    count_dots,
    count_sass,
    parse_ptxas_log,
    parse_resource_usage,
    run_tasks,
    specialize,
    task_keys,
    triton_version,
)
from bench.gpu_kernels import GPU_KERNELS, Launch, Ptr, strides
from bench.gpu_report import GATE_ARCH, LIMITS, check, make_tasks, occupancy, parse_args, smem_usage
from bench.kernels import by_name
from common.loader import default_impl
from common.triton_env import HAVE_TRITON

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The kernels compiled: the solutions, or in a student copy (none there) the starters.
IMPL = default_impl(ROOT)

PTXAS_LOG = """ptxas-blackwell info    : Compiling entry function '_k' for 'sm_90a'
ptxas-blackwell info    : Function properties for _k
    16 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas-blackwell info    : Used 255 registers, used 1 barriers, 16 bytes cumulative stack size
"""
RESOURCES = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function _k:
  REG:255 STACK:16 SHARED:1024 LOCAL:0 CONSTANT[0]:680 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
SASS = """
        /*0100*/                   UMOV UR41, 0x400 ;
        /*1230*/              @!P1 LDG.E.U16 R3, desc[UR44][R98.64] ;
        /*1240*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR4][R2.64] ;
        /*1250*/               @P0 LDGSTS.E.BYPASS.128 [R5+0x800], desc[UR4][R2.64+0x80] ;
        /*1300*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*1310*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*1320*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*1330*/                   WARPGROUP.ARRIVE ;
        /*1340*/                   UTMALDG.2D [UR8], [UR4] ;
"""


def _tools_available() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    bin_dir = pathlib.Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin"
    return all((bin_dir / tool).is_file() for tool in ("ptxas", "cuobjdump"))


_skip_without_compiler = pytest.mark.skipif(  # no triton at all: conftest's "not run" skip
    HAVE_TRITON and not _tools_available(),
    reason="this triton has no bundled ptxas and cuobjdump",
)


def needs_compiler(test):
    """Skipped without triton's compiler; marked `triton` too, so that where triton cannot be
    installed (macOS, Windows) the test is "not run", like every Triton test."""
    return pytest.mark.triton(_skip_without_compiler(test))


def _result(**overrides: int) -> dict:
    base = {"num_warps": 4, "regs": 128, "smem_static": 1024, "smem_dynamic": 32 * 1024,
            "spill_stores": 0, "spill_loads": 0, "dots": 2,
            "mma": {"HMMA.16816.F32": 8}}  # fmt: skip
    return {**base, **overrides}


# ---- the readers, on canned tool output --------------------------------------------------------


def test_ptxas_log_gives_registers_and_spill_bytes():
    assert parse_ptxas_log(PTXAS_LOG) == {
        "regs": 255, "stack": 16, "spill_stores": 16, "spill_loads": 12,
    }  # fmt: skip


def test_cuobjdump_resource_usage_gives_registers_shared_and_local_memory():
    assert parse_resource_usage(RESOURCES) == {"REG": 255, "SHARED": 1024, "LOCAL": 0, "STACK": 16}


def test_sass_counts_tensor_core_instructions_by_mnemonic_and_loads_by_kind():
    counts = count_sass(SASS)
    assert counts["mma"] == {"HGMMA.64x64x16.F32.BF16": 2, "HMMA.16816.F32.BF16": 1}
    assert counts["loads"] == {"LDG": 1, "LDGSTS": 2, "UTMALDG": 1}
    assert gpu_report.load_style(counts["loads"]) == "TMA + cp.async + LDG"
    assert gpu_report.mma_kind(counts["mma"]) == "HGMMA x2, HMMA x1"


def test_triton_ir_dots_are_counted():
    ttir = "%5 = tt.dot %3, %4, %2 : tensor<...>\n%9 = tt.dot %7, %8, %6\n tt.dot_scaled"
    assert count_dots(ttir) == 2


# ---- occupancy and the checks ------------------------------------------------------------------


def test_255_registers_and_8_warps_leave_one_block_per_sm_on_sm_90():
    occ = occupancy(_result(num_warps=8, regs=255), LIMITS[90])
    # 255 regs -> 256 per thread, 8192 per warp: 8 warps fill the 64K register file
    assert occ == {"blocks_per_sm": 1, "warps_per_sm": 8, "percent": 12.5, "limited_by": "regs"}


def test_shared_memory_limits_blocks_and_the_reserved_kilobyte_is_counted_once():
    # 100 KB dynamic on sm_90: the cubin's 1 KB static IS the reserved 1 KB -> 101 KB a block
    used, footprint = smem_usage(_result(smem_dynamic=100 * 1024), LIMITS[90])
    assert (used, footprint) == (100 * 1024, 101 * 1024)
    occ = occupancy(_result(regs=32, smem_dynamic=100 * 1024), LIMITS[90])
    assert occ["blocks_per_sm"] == 2 and occ["limited_by"] == "smem"  # 228 // 101
    # sm_100: a kernel holding 256 of the SM's 512 tensor-memory columns fits twice
    occ = occupancy(_result(regs=32, smem_dynamic=8 * 1024, tmem=256), LIMITS[100])
    assert occ["blocks_per_sm"] == 2 and occ["limited_by"] == "tmem"
    # sm_80: nothing in the cubin, the reserved 1 KB is added
    used, footprint = smem_usage(_result(smem_static=0, smem_dynamic=100 * 1024), LIMITS[80])
    assert (used, footprint) == (100 * 1024, 101 * 1024)


def test_checks_name_spills_oversized_shared_memory_and_dots_without_mma():
    assert check(_result(), LIMITS[90]) == []
    problems = check(_result(spill_stores=16, spill_loads=16, smem_dynamic=228 * 1024, mma={}),
                     LIMITS[90])  # fmt: skip
    assert len(problems) == 3
    assert "spills 16 B" in problems[0] and "shared memory" in problems[1]
    assert "no tensor-core MMA" in problems[2]
    assert occupancy(_result(smem_dynamic=228 * 1024), LIMITS[90])["blocks_per_sm"] == 0
    assert check(_result(dots=0, mma={}), LIMITS[90]) == []  # no tl.dot, no MMA needed


# ---- specialisation, as Triton's runtime does it ------------------------------------------------


def _fake_kernel(*params: tuple[str, bool]) -> SimpleNamespace:
    return SimpleNamespace(
        __name__="_k",
        arg_names=[name for name, _ in params],
        params=[SimpleNamespace(is_constexpr=c, do_not_specialize=False) for _, c in params],
    )


def test_arguments_are_specialised_like_the_triton_runtime():
    fn = _fake_kernel(("q", False), ("stride_t", False), ("stride_d", False), ("n", False),
                      ("big", False), ("scale", False), ("BLOCK", True))  # fmt: skip
    spec = specialize(fn, Launch({"q": Ptr("bf16"), "stride_t": 4096, "stride_d": 1, "n": 17,
                                  "big": 2**31, "scale": 0.5, "BLOCK": 64},
                                 {"num_warps": 4}))  # fmt: skip
    assert spec.signature == {"q": "*bf16", "stride_t": "i32", "stride_d": "constexpr",
                              "n": "i32", "big": "i64", "scale": "fp32",
                              "BLOCK": "constexpr"}  # fmt: skip
    assert spec.constexprs == {"stride_d": 1, "BLOCK": 64}
    assert spec.attrs == {0: [["tt.divisibility", 16]], 1: [["tt.divisibility", 16]],
                          4: [["tt.divisibility", 16]]}  # fmt: skip
    assert spec.options == {"num_warps": 4}


def test_an_entry_whose_arguments_do_not_match_the_kernel_is_skipped_with_the_reason():
    fn = _fake_kernel(("q", False), ("NEW_ARG", True))
    with pytest.raises(SkipEntry, match=r"missing \['NEW_ARG'\], unexpected \['OLD'\]"):
        specialize(fn, Launch({"q": Ptr("fp16"), "OLD": 1}))


# ---- the table and the lower bounds --------------------------------------------------------------


def test_every_entry_names_a_lab_folder_and_a_bench_kernel():
    for entry in GPU_KERNELS:
        assert (ROOT / "labs" / entry.lab).is_dir(), entry.name
        assert entry.bench == "" or by_name(entry.bench).lab == entry.lab, entry.name
    assert strides(2, 3, 4) == (12, 4, 1)


def test_lower_bound_is_the_slower_of_the_two_roofs():
    decode = attention_work((1,) * 64, (4096,) * 64, heads=32, kv_heads=8, head_dim=128,
                            elem_bytes=2, causal=True)  # fmt: skip
    ms, roof = lower_bound_ms(decode)
    assert roof == "memory" and ms == pytest.approx(decode.bytes / 3.35e12 * 1e3)
    prefill = attention_work((16384,), (16384,), heads=32, kv_heads=32, head_dim=128,
                             elem_bytes=2, causal=False)  # fmt: skip
    ms, roof = lower_bound_ms(prefill)
    assert roof == "compute" and ms == pytest.approx(prefill.flops / 989e12 * 1e3)


def test_the_markdown_is_a_function_of_the_report_alone():
    row = {"lab": "lab-01-paged-attention-gather", "kernel": "_k", "config": "c", "bench": "",
           "bench_shape": "",
           "dtype": "bf16", "head_dim": 128, "arch": "sm_90", "num_warps": 4, "num_stages": 2,
           "regs": 96, "spill_stores": 0, "spill_loads": 0, "smem_static": 1024,
           "smem_dynamic": 38912, "dots": 2, "mma": {"HMMA.16816.F32.BF16": 32},
           "loads": {"LDGSTS": 32}, "mma_kind": "HMMA x32", "load_style": "cp.async",
           "occupancy": occupancy(_result(regs=96, smem_dynamic=38912), LIMITS[90]),
           "problems": []}  # fmt: skip
    report = {"provenance": {"note": gpu_report.NOT_RUN, "command": "python -m bench.gpu_report",
                             "commit": "abc", "date": "2026-01-01", "date_is": "commit date",
                             "triton": "3.9.0", "ptxas": ["sm_90: ptxas 13.4"],
                             "cuobjdump": "13.1"},
              "limits": {"sm_90": vars(LIMITS[90])}, "limit_sources": ["guide"], "rows": [row],
              "errors": [], "skipped": [], "lower_bounds": []}  # fmt: skip
    text = gpu_render.markdown(report)
    assert text == gpu_render.markdown(report)
    assert "Compiled, not run: no GPU was used" in text and "`make gpu-report`" in text
    assert "| 01 | `_k` [c] | 128 | 4/2 | 96 | 0/0 | 1.0 + 38.0 |" in text


# ---- real compiles (sm_90) -----------------------------------------------------------------------


def _assert_sm90_clean(task: Task, outcome: dict) -> None:
    if outcome["status"] == "skip":
        pytest.skip(outcome["reason"])
    assert outcome["status"] == "ok", f"{task.label}: {outcome.get('reason')}"
    result = outcome["result"]
    assert result["spill_stores"] == 0 and result["spill_loads"] == 0, (
        f"{task.label} spills {result['spill_stores']} B / {result['spill_loads']} B "
        f"at {result['regs']} registers: remove this tile config from the launcher"
    )
    used, _ = smem_usage(result, LIMITS[90])
    assert used <= LIMITS[90].smem_per_block, f"{task.label}: {used} B of shared memory"
    if result["dots"]:
        assert result["mma"], f"{task.label}: {result['dots']} tl.dot but no MMA in the SASS"


def _index(lab: str, config: str) -> int:
    return next(i for i, e in enumerate(GPU_KERNELS)
                if e.lab.startswith(lab) and e.config == config)  # fmt: skip


@pytest.mark.slow
@needs_compiler
def test_paged_decode_compiles_for_sm_90_without_spills_and_with_tensor_core_mmas():
    task = Task(_index("lab-01", "gqa32/8"), "fp16", 64, 90, IMPL)
    (outcome,) = run_tasks([task], workers=1)
    _assert_sm90_clean(task, outcome)
    assert outcome["result"]["dots"] == 2  # q k^T and p v


SM90_TASKS = [Task(i, "bf16" if "bf16" in e.dtypes else e.dtypes[0], e.summary_dims, 90, IMPL)
              for i, e in enumerate(GPU_KERNELS)]  # fmt: skip


@pytest.fixture(scope="module")
def sm90_outcomes() -> list[dict]:
    return run_tasks(SM90_TASKS, workers=2)


@pytest.mark.slow
@pytest.mark.gpu_report
@needs_compiler
@pytest.mark.parametrize("index", range(len(SM90_TASKS)), ids=[e.name for e in GPU_KERNELS])
def test_every_kernel_compiles_for_sm_90_without_spills_and_with_tensor_core_mmas(
    index: int, sm90_outcomes: list[dict]
):
    _assert_sm90_clean(SM90_TASKS[index], sm90_outcomes[index])


CAPTURED = ROOT / "captured_outputs" / "gpu-report.json"


@pytest.mark.slow  # whole-tree (recompiles to compare): make test-slow, which CI runs
@needs_compiler
def test_the_captured_report_was_compiled_from_this_tree_and_every_sm_90_config_passes():
    """The committed report is the evidence: every config `make gpu-report` would compile
    today has a row in it whose key (kernel source, specialisation, options, arch, Triton)
    matches, and every sm_90 row passes (no spills, shared memory within the per-block limit,
    tensor-core MMAs for the dots). Seconds: cache keys are computed, nothing is compiled."""
    import json

    if not list(ROOT.glob("labs/*/solution.py")):
        pytest.skip("a student copy: the committed report was compiled from the instructor's "
                    "solutions, whose source its keys hold (make gpu-report compiles yours)")
    report = json.loads(CAPTURED.read_text())
    made_with = report["provenance"]["triton"]
    if made_with != triton_version():
        pytest.skip(f"the report was compiled with triton {made_with}, this machine has "
                    f"{triton_version()}: keys are not comparable (make gpu-report)")
    rows = {r["key"]: r for r in report["rows"] if "key" in r}
    tasks = make_tasks(parse_args([]))
    stale = [t.label for t, k in zip(tasks, task_keys(tasks))
             if k["status"] == "ok" and k["key"] not in rows]
    assert not stale, (f"captured_outputs/gpu-report.json does not cover {len(stale)} configs of "
                       f"this tree (a kernel or a launch constant changed): run make gpu-report; "
                       f"first: {stale[:3]}")
    failing = [f"{r['lab']} {r['kernel']} [{r['config']}] {r['dtype']} d{r['head_dim']}: "
               f"{r['problems']}" for r in rows.values()
               if r["arch"] == f"sm_{GATE_ARCH}" and r["problems"]]
    assert not failing, "configs that fail the sm_90 checks: " + "; ".join(failing)
    plans = [f"{p['kernel']} [{p['config']}] {p['arch']}: {p['problems']}"
             for p in report.get("plan_checks", []) if p["problems"]]  # fmt: skip
    assert report.get("plan_checks") and not plans, "launch plans that fail: " + "; ".join(plans)


# ---- the launch plan, judged (bench/gpu_plan.py): canned rows, no compile ----------------------


def _row(mma_kind: str, blocks_per_sm: int = 2, stages: int = 3) -> dict:
    return {"mma_kind": mma_kind, "dots": 2, "num_warps": 4, "num_stages": stages,
            "spill_stores": 0, "spill_loads": 0, "occupancy": {"blocks_per_sm": blocks_per_sm}}


def _entry(lab: str, config: str):
    return GPU_KERNELS[_index(lab, config)]


def test_a_plan_with_16_row_prefill_tiles_fails_with_the_reason():
    from bench.gpu_plan import bench_work, judge
    from common import launch_plan as lp

    entry = _entry("lab-03", "gqa32/8")
    planned = entry.plan(lp.H100)
    assert planned.tiles["block_m"] >= 64
    sixteen = replace(planned, tiles={"block_m": 16, "block_n": 32})
    verdict = judge(entry, sixteen, lp.H100, _row("HMMA x32", 4), bench_work(entry))
    assert verdict["bound"] == "compute"
    assert any("16-row query tiles" in p for p in verdict["problems"]), verdict["problems"]
    assert any("wgmma" in p for p in verdict["problems"]), verdict["problems"]
    good = judge(entry, planned, lp.H100, _row("HGMMA x24, HMMA x8", 1), bench_work(entry))
    assert not good["problems"], good["problems"]
    assert good["model_fraction"] <= 0.75  # a model, never above its stated ceiling


def test_a_sub_wave_decode_grid_at_batch_1_fails_with_the_reason():
    from bench.gpu_plan import bench_work, judge
    from common import launch_plan as lp

    entry = _entry("lab-04", "planned split")
    unsplit = replace(entry.plan(lp.H100), splits=1, grid=(1, 8))
    verdict = judge(entry, unsplit, lp.H100, _row("HMMA x12", 8), bench_work(entry))
    assert verdict["bound"] == "memory"
    assert any("sub-wave grid: 8 CTAs on 132 SMs" in p for p in verdict["problems"])
    planned = judge(entry, entry.plan(lp.H100), lp.H100, _row("HMMA x12", 8), bench_work(entry))
    assert not planned["problems"] and planned["ctas"] >= 132, planned


def test_littles_law_needs_bandwidth_times_latency_per_sm():
    from bench.gpu_plan import bench_work, judge
    from common import launch_plan as lp

    entry = _entry("lab-04", "planned split")
    verdict = judge(entry, entry.plan(lp.H100), lp.H100, _row("HMMA x12", 1, 2),
                    bench_work(entry))  # fmt: skip
    assert verdict["needed_kb"] == round(3.35e12 * 600e-9 / 132 / 1024, 1)
    assert verdict["in_flight_kb"] == 8.0  # 1 CTA x 1 stage ahead x 16 keys x 256 x 2 B
    assert any("Little's law" in f for f in verdict["flags"])


TTIR = """
tt.func @_k(%k_cache_ptr: !tt.ptr<f32>, %q_ptr: !tt.ptr<f32>, %out_ptr: !tt.ptr<f32>) {
%0 = tt.splat %k_cache_ptr : !tt.ptr<f32> -> tensor<16x!tt.ptr<f32>>
%1 = tt.addptr %0, %offs : tensor<16x!tt.ptr<f32>>, tensor<16xi32>
%q_1 = tt.addptr %q_ptr, %b : !tt.ptr<f32>, i64
%q_2 = tt.splat %q_1 : !tt.ptr<f32> -> tensor<16x!tt.ptr<f32>>
%q_3 = tt.addptr %q_2, %d : tensor<16x!tt.ptr<f32>>, tensor<16xi32>
%s = tt.dot %a, %b, %c, inputPrecision = tf32 : tensor<4x4xf32> * tensor<4x4xf32> -> tensor<4x4xf32>
%t = tt.dot %a, %b, %c : tensor<4x4xf32> * tensor<4x4xf32> -> tensor<4x4xf32>
%u = tt.dot %e, %f, %c, inputPrecision = tf32 : tensor<4x4xf16> * tensor<4x4xf16> -> tensor<4x4xf32>
"""


def test_the_compiled_ir_shows_tf32_dots_on_float32_and_32_bit_offset_chains():
    from bench.gpu_compile import first_offsets, tf32_dots_on_f32

    assert tf32_dots_on_f32(TTIR) == 1  # the ieee dot prints no precision; fp16 is exact
    widths = first_offsets(TTIR)
    assert widths["k_cache_ptr"] == ["i32"], "the whole cache offset is 32-bit: flagged"
    assert widths["q_ptr"] == ["i32", "i64"], "widened once on the chain: fine"
    assert "out_ptr" not in widths


def test_student_compile_names_32_bit_offsets_into_a_cache_and_tf32_dots():
    from grading.plugin.compile_check import plain_outcome, problems

    result = {"tf32_dots_on_f32": 2, "first_offsets": {"k_cache_ptr": ["i32"], "q_ptr": ["i32"]},
              "spill_stores": 0, "spill_loads": 0, "dots": 2, "mma": {"HMMA": 2}, "regs": 64,
              "loads": {"LDG": 8}, "smem_static": 0, "smem_dynamic": 40960}
    lab = "lab-04-flash-decoding-partitions"
    task = {"kernel": "_split_kv_partition_kernel", "dtype": "fp32", "head_dim": 128,
            "arch": 90, "check": "fp32"}
    found = problems(task, plain_outcome({"status": "ok", "result": result}), lab)
    assert any("TF32" in p for p in found) and any("k_cache_ptr" in p for p in found)
    assert not any("q_ptr" in p for p in found), "a decode step's q is small: not flagged"
    assert not any("shared memory" in p for p in found), "40 KB fits an H100"
    big = dict(result, smem_dynamic=256 * 1024)  # d = 256 given the d = 128 tiles
    assert any("256 KB of shared memory" in p for p in problems(
        task, plain_outcome({"status": "ok", "result": big}), lab))
    error = problems(dict(task, dtype="bf16", check="bf16"),
                     {"status": "error", "reason": "CompilationError: NameError('LOG2E')"}, lab)
    assert error and "does not compile for sm_90" in error[0] and "LOG2E" in error[0]


# One widened term on the chain (the batch-head base) does not save a 32-bit row * stride.
TTIR_ROWS = """
tt.func @_k(%Q: !tt.ptr<f32>, %k_cache_ptr: !tt.ptr<f32>, %stride_qm: i32, %stride_kh: i32) {
%off_bh = arith.extsi %pid : i32 to i64 loc(#loc1)
%base = tt.addptr %Q, %off_bh : !tt.ptr<f32>, i64 loc(#loc1)
%r = tt.make_range {end = 16 : i32, start = 0 : i32} : tensor<16xi32> loc(#loc2)
%m0 = arith.muli %pid, %c16_i32 : i32 loc(#loc2)
%m1 = tt.splat %m0 : i32 -> tensor<16xi32> loc(#loc2)
%rows = arith.addi %m1, %r : tensor<16xi32> loc(#loc2)
%s = tt.splat %stride_qm : i32 -> tensor<16xi32> loc(#loc3)
%prod = arith.muli %rows, %s : tensor<16xi32> loc(#loc3)
%p0 = tt.splat %base : !tt.ptr<f32> -> tensor<16x!tt.ptr<f32>> loc(#loc3)
%p1 = tt.addptr %p0, %prod : tensor<16x!tt.ptr<f32>>, tensor<16xi32> loc(#loc3)
%tile = arith.muli %r, %s : tensor<16xi32> loc(#loc4)
%p2 = tt.addptr %p0, %tile : tensor<16x!tt.ptr<f32>>, tensor<16xi32> loc(#loc4)
%h = tt.splat %stride_kh : i32 -> tensor<16xi32> loc(#loc5)
%kh = arith.muli %rows, %h : tensor<16xi32> loc(#loc5)
%c0 = tt.splat %k_cache_ptr : !tt.ptr<f32> -> tensor<16x!tt.ptr<f32>> loc(#loc5)
%c1 = tt.addptr %c0, %kh : tensor<16x!tt.ptr<f32>>, tensor<16xi32> loc(#loc5)
"""
TTIR_ROWS += '#loc3 = loc("solution.py":293:8)\n#loc5 = loc("solution.py":300:8)\n'


def test_each_32_bit_index_times_stride_product_is_named_even_with_a_64_bit_term():
    from bench.gpu_compile import first_offsets, narrow_products
    from grading.plugin.compile_check import plain_outcome, problems

    assert first_offsets(TTIR_ROWS)["Q"] == ["i32", "i64"], "the old rule: some term is i64"
    products = narrow_products(TTIR_ROWS)
    assert products["Q"] == [["stride_qm", "solution.py:293"]], products
    assert products["k_cache_ptr"] == [["stride_kh", "solution.py:300"]], products
    result = {"first_offsets": first_offsets(TTIR_ROWS), "narrow_products": products,
              "tf32_dots_on_f32": 0, "spill_stores": 0, "spill_loads": 0, "dots": 0, "mma": {},
              "regs": 64, "loads": {"LDG": 8}, "smem_static": 0, "smem_dynamic": 0}
    task = {"kernel": "_flash_attention_kernel", "dtype": "bf16", "head_dim": 128, "arch": 90,
            "check": "bf16"}
    found = problems(task, plain_outcome({"status": "ok", "result": result}),
                     "lab-00-online-softmax")
    assert any("stride_qm (solution.py:293) into Q computed in 32 bits" in p for p in found), found
    assert not any("stride_kh" in p for p in found), "a cache's head stride times d: small"
