"""Lab 02 spec: vLLM 0.33.0's attention-backend selector, and PyTorch SDPA's dispatch.

The expected reasons are vLLM 0.33.0's own strings, in the order its
``AttentionBackend.validate_configuration`` appends them (``make vllm-check`` compares the
lab with the real package on ~300,000 cases). SDPA answers are checked against the float64
reference in ``common``.
"""

from __future__ import annotations

import functools
import json
import pathlib
import random
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import load_impl, reference_attention
from common.loader import load_lab_module
from common.testing import (
    assert_close,
    assert_value_error_names,
    called_on_copies,
    examples,
    raised_as,
)

# every call gets copies of its arrays: expected values come from the test's own
impl = called_on_copies(load_impl(__file__))
provided = load_lab_module(__file__, "provided")  # the given code: format_matrix, GPUS, ...
HERE = pathlib.Path(__file__).resolve().parent
FACTS = json.loads((HERE / "vllm_0_33_facts.json").read_text())

T4, A100, L4, H100, B200, RTX_PRO_6000 = (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0)
LLAMA = {"head_size": 128, "dtype": "bfloat16", "num_heads": 32, "num_kv_heads": 8}
DEEPSEEK_V3 = {
    "head_size": 576, "dtype": "bfloat16", "use_mla": True, "num_heads": 128,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
}
MISTRAL = {**LLAMA, "has_sliding_window": True}
GPT_OSS = {"head_size": 64, "dtype": "bfloat16", "num_heads": 64, "num_kv_heads": 8,
           "has_sink": True, "has_sliding_window": True}
NON_MLA_ORDER = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]
BLACKWELL_ORDER = ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT"]


def expect_reasons(backend, config, capability, expected, why=""):
    got = impl.validate_configuration(backend, config, capability)
    absent = [r for r in got if r not in expected and any(  # a feature the config lacks
        word in r and not config.get(key)
        for word, key in (("sliding window", "has_sliding_window"), ("sink", "has_sink")))]
    assert got == expected, (
        f"{backend} on compute capability {capability} with {config}: expected vLLM 0.33.0's "
        f"reasons {expected}, got {got}. {why}"
        + (f" {absent}: a feature check refused a config without that feature (a sliding "
           "window or sinks filter only the models that have them)" if absent else "")
    )


# ---- the classic cases -------------------------------------------------------------------


@pytest.mark.points(2)
def test_an_fp32_model_on_a_t4_is_refused_by_flash_attn_and_flashinfer_and_runs_on_triton():
    fp32 = {"head_size": 128, "dtype": "float32"}
    both = ["dtype not supported", "compute capability not supported"]
    why = ("FlashAttention and FlashInfer kernels exist for fp16/bf16 only and need compute "
           "capability 8.0; vLLM reports every failed check, in its order, not just the first")
    expect_reasons("FLASH_ATTN", fp32, T4, both, why)
    expect_reasons("FLASHINFER", fp32, T4, both, why)
    expect_reasons("TRITON_ATTN", fp32, T4, [], "the Triton backend runs fp32 on any GPU")
    with raised_as("no backend found for a non-MLA fp32 model on a T4: TRITON_ATTN of the "
                   "non-MLA priority list runs it (was the MLA list searched?)"):
        assert impl.select_backend(fp32, T4).backend == "TRITON_ATTN"


@pytest.mark.points(2)
def test_head_size_96_is_not_a_flashinfer_head_size_but_flash_attention_takes_it():
    config = {"head_size": 96, "dtype": "bfloat16"}
    expect_reasons("FLASHINFER", config, H100, ["head_size not supported"],
                   "FlashInfer is compiled for head sizes 64, 128, 256 and 512 only")
    expect_reasons("FLASH_ATTN", config, H100, [],
                   "FlashAttention takes any multiple of 8 up to 256")
    expect_reasons("FLASH_ATTN", {**config, "head_size": 100}, H100, ["head_size not supported"],
                   "FlashAttention needs head_size % 8 == 0")


@pytest.mark.points(2)
def test_an_mla_model_on_a_non_mla_backend_is_refused_and_the_reverse_too():
    expect_reasons("FLASH_ATTN", DEEPSEEK_V3, H100,
                   ["head_size not supported", "MLA not supported"],
                   "the MLA latent head (576) is neither a FlashAttention head size nor MHA")
    expect_reasons("TRITON_ATTN", DEEPSEEK_V3, H100, ["MLA not supported"])
    expect_reasons("TRITON_MLA", LLAMA, H100, ["non-MLA not supported"],
                   "an MLA backend refuses a model without MLA: the check is use_mla != is_mla")


@pytest.mark.points(2)
def test_sinks_on_flash_attn_below_9_0_give_both_sink_reasons():
    expect_reasons("FLASH_ATTN", GPT_OSS, A100,
                   ["attention sinks not supported",
                    "sink not supported on compute capability < 9.0"],
                   "FA2 (what vLLM runs below 9.0) has no sinks; FLASH_ATTN's own combination "
                   "check adds the second reason")
    expect_reasons("FLASH_ATTN", GPT_OSS, H100, [], "FA3 on Hopper serves attention sinks")
    expect_reasons("FLASH_ATTN", GPT_OSS, RTX_PRO_6000, ["attention sinks not supported"],
                   "12.x runs FA2 (no sinks), but 12.0 >= 9.0 so only the generic reason appears")
    expect_reasons("TRITON_ATTN", GPT_OSS, A100, [], "the Triton backend supports sinks everywhere")


@pytest.mark.points(2)
def test_a_sliding_window_filters_backends_but_never_forces_one():
    for capability in (T4, A100, L4, H100, B200, RTX_PRO_6000):
        for dtype in ("float16", "bfloat16", "float32"):
            window = impl.select_backend({**MISTRAL, "dtype": dtype}, capability).backend
            full = impl.select_backend({**LLAMA, "dtype": dtype}, capability).backend
            assert window == full, (
                f"on {capability} {dtype} the sliding-window model got {window} but the same "
                f"model without a window got {full}: a window only removes the backends that "
                "cannot do it, and every attention backend at the top of the list can"
            )
    expect_reasons("TURBOQUANT", {**MISTRAL, "kv_cache_dtype": "turboquant_k8v4"}, H100,
                   ["sliding window not supported"])
    expect_reasons("FLASHMLA", {**DEEPSEEK_V3, "has_sliding_window": True}, H100,
                   ["sliding window not supported"])


@pytest.mark.points(3)
def test_a_block_size_rules_out_higher_priority_backends_and_vllm_warns():
    auto = impl.select_backend(DEEPSEEK_V3, B200)
    assert auto.backend == "FLASHINFER_MLA" and auto.warning is None
    sel = impl.select_backend({**DEEPSEEK_V3, "block_size": 16}, B200)
    assert sel.backend == "TRITON_MLA", (
        f"with --block-size 16 on a B200 the MLA kernels that need 32/64 (FLASHINFER_MLA) or "
        f"128 (CUTLASS_MLA) token pages are out; expected TRITON_MLA, got {sel.backend}"
    )
    assert sel.rejected["FLASHINFER_MLA"] == ["block_size not supported"]
    assert sel.rejected["CUTLASS_MLA"] == ["block_size not supported"]
    assert sel.warning is not None and sel.warning.startswith(
        "--block-size 16 precluded higher-priority backend(s) FLASHINFER_MLA, CUTLASS_MLA. "
        "Using TRITON_MLA instead"), f"vLLM's warning names the precluded backends: {sel.warning}"
    assert impl.select_backend({**DEEPSEEK_V3, "block_size": 64}, B200).backend == "FLASHINFER_MLA"


@pytest.mark.points(2)
@examples(40)
@given(block=st.integers(1, 1024))
def test_a_block_size_fits_when_it_is_a_multiple_of_the_kernel_block(block):
    def has_block_reason(backend, config, capability):
        reasons = impl.validate_configuration(backend, {**config, "block_size": block}, capability)
        return "block_size not supported" in reasons

    hint = "(hybrid blocks: any multiple of the kernel's page size is accepted)"
    assert has_block_reason("TRITON_ATTN", LLAMA, H100) == (block % 16 != 0), hint
    assert has_block_reason("FLASHINFER_MLA", DEEPSEEK_V3, B200) == (block % 32 != 0), hint
    assert has_block_reason("CUTLASS_MLA", DEEPSEEK_V3, B200) == (block % 128 != 0), hint
    assert has_block_reason("FLASHMLA", DEEPSEEK_V3, H100) == (block % 64 != 0), hint


@pytest.mark.points(2)
def test_reasons_come_in_vllms_order_and_all_of_them_are_reported():
    config = {"head_size": 96, "dtype": "float32", "kv_cache_dtype": "int8_per_token_head",
              "block_size": 8, "has_sink": True, "has_sliding_window": True}
    expect_reasons("FLASHINFER", config, T4, [
        "head_size not supported", "dtype not supported", "kv_cache_dtype not supported",
        "block_size not supported", "attention sinks not supported",
        "compute capability not supported"],
        "vLLM checks head size, dtype, KV-cache dtype, block size, MLA, sinks, sparse, compute "
        "capability, sliding window, then the backend's own combination rules")
    expect_reasons("TURBOQUANT", {**DEEPSEEK_V3, "use_sparse": True, "has_sliding_window": True},
                   H100, ["kv_cache_dtype not supported", "MLA not supported",
                          "sparse not supported", "sliding window not supported"])
    expect_reasons("FLASHMLA", DEEPSEEK_V3, B200,
                   ["FlashMLA Dense is only supported on Hopper devices."],
                   "FLASHMLA's capability check allows 9.x and 10.x, its combination check then "
                   "refuses dense MLA off Hopper")
    expect_reasons("FLASHMLA", {**DEEPSEEK_V3, "has_sliding_window": True}, A100,
                   ["compute capability not supported", "sliding window not supported",
                    "FlashMLA Dense is only supported on Hopper devices."],
                   "compute capability is checked before the sliding window, and the backend's "
                   "own combination reason always comes last")


@pytest.mark.points(2)
def test_flash_attention_takes_multiples_of_8_up_to_256_and_up_to_512_where_fa4_loads():
    cases = [  # (head size, GPU, accepted?)
        (8, A100, True), (256, A100, True), (264, A100, False), (100, A100, False),
        (256, H100, True), (264, H100, True), (512, H100, True), (520, H100, False),
        (512, B200, True), (264, RTX_PRO_6000, False),
    ]
    for head, capability, accepted in cases:
        expect_reasons("FLASH_ATTN", {**LLAMA, "head_size": head}, capability,
                       [] if accepted else ["head_size not supported"],
                       "FlashAttention takes head sizes that are multiples of 8 up to 256 "
                       "(inclusive), and up to 512 where FA4 can load (9.x, 10.x, 11.x)")
    expect_reasons("TRITON_ATTN", {**LLAMA, "head_size": 32}, T4, [],
                   "the Triton backend takes any head size from 32 up")
    expect_reasons("TRITON_ATTN", {**LLAMA, "head_size": 24}, T4, ["head_size not supported"])
    expect_reasons("FLASHINFER", {**LLAMA, "head_size": 512}, H100, [],
                   "FlashInfer's head sizes are a list: 64, 128, 256, 512")


@pytest.mark.points(2)
def test_an_fp8_kv_cache_needs_fa3_on_hopper_or_fa4_on_blackwell():
    fp8 = {**LLAMA, "kv_cache_dtype": "fp8"}
    fa_fp8 = ("FP8 KV cache requires FA3 on SM90, FA4 with head_size=512 on SM90, or FA4 on "
              "SM100")
    expect_reasons("FLASH_ATTN", fp8, A100, ["kv_cache_dtype not supported", fa_fp8],
                   "FA2 (what vLLM runs on 8.x and 12.x) has no FP8 KV cache: the generic "
                   "kv_cache_dtype check refuses it, then FLASH_ATTN's own combination check")
    expect_reasons("FLASH_ATTN", fp8, RTX_PRO_6000, ["kv_cache_dtype not supported", fa_fp8])
    expect_reasons("FLASH_ATTN", fp8, H100, [], "FA3 on Hopper reads an FP8 KV cache")
    expect_reasons("FLASH_ATTN", fp8, B200, [], "FA4 on Blackwell reads an FP8 KV cache")
    expect_reasons("FLASH_ATTN", {**fp8, "head_size": 256}, B200, [fa_fp8],
                   "the generic check asks without a head size (FA4: yes), the combination "
                   "check asks with it: at head size 256 a quantized cache sends FA4's kernel "
                   "back to FA2, which has no FP8 cache")
    expect_reasons("FLASH_ATTN", {**fp8, "kv_cache_dtype": "fp8_e5m2"}, H100,
                   ["kv_cache_dtype not supported", fa_fp8],
                   "FlashAttention lists fp8 and fp8_e4m3 only, never fp8_e5m2")
    sel = impl.select_backend(fp8, A100)
    assert sel.backend == "FLASHINFER", (
        f"an FP8 KV cache on an A100 moves Llama from FLASH_ATTN to FLASHINFER, got {sel}")


@pytest.mark.points(1)
def test_compute_capability_bounds_are_inclusive():
    for capability, accepted in ((T4, False), (A100, True), ((12, 1), True), ((13, 0), False)):
        expect_reasons("FLASHINFER", LLAMA, capability,
                       [] if accepted else ["compute capability not supported"],
                       "FLASHINFER's compute capability runs from 8.0 to 12.1, both ends "
                       "included (facts: {'min': [8, 0], 'max': [12, 1]})")


@pytest.mark.points(2)
def test_the_sparse_mla_part_of_the_list_depends_on_cache_heads_and_head_size():
    def sparse_part(capability, config, skip):
        return impl.backend_priorities(capability, True, config)[skip:]

    cases = [
        (B200, {**DEEPSEEK_V3, "num_heads": 16},
         ["FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"],
         "on 10.x 'few heads' means num_heads <= 16: FA4's sparse MLA first"),
        (B200, {**DEEPSEEK_V3, "num_heads": 17}, ["FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"],
         "more than 16 heads with a bf16 cache: FlashMLA's sparse kernel first"),
        (B200, {**DEEPSEEK_V3, "kv_cache_dtype": "fp8"},
         ["FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"],
         "a quantized cache picks the quantized list, whatever the heads"),
        (H100, {**DEEPSEEK_V3, "head_size": 512},
         ["FLASHINFER_MLA_SPARSE_SM90", "FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE"],
         "elsewhere FLASHINFER_MLA_SPARSE_SM90 goes first at head size 512"),
        (H100, DEEPSEEK_V3, ["FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE",
                             "FLASHINFER_MLA_SPARSE_SM90"],
         "... and last otherwise"),
    ]
    for capability, config, expected, why in cases:
        skip = 6 if capability == B200 else 4  # the dense MLA backends come first
        got = sparse_part(capability, config, skip)
        assert got == expected, f"{capability}: {why}; expected {expected}, got {got}"


# ---- selection ------------------------------------------------------------------------------


@pytest.mark.points(2)
def test_backend_priorities_follow_the_compute_capability():
    for capability in (A100, L4, H100, RTX_PRO_6000, (8, 6), (11, 0)):
        got = impl.backend_priorities(capability, False)
        assert got == NON_MLA_ORDER, (
            f"{capability}, not MLA: expected {NON_MLA_ORDER} (the 'non_mla_other' list without "
            f"its multimodal-prefix entry), got {got}")
    for capability in (B200, (10, 3)):
        got = impl.backend_priorities(capability, False)
        assert got == BLACKWELL_ORDER, (
            f"{capability}: on Blackwell (10.x) vLLM 0.33.0 tries FlashInfer first, "
            f"expected {BLACKWELL_ORDER}, got {got}")
    mla_orders = [
        (H100, 4, ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"],
         "'mla_other' starts with FA3's MLA path, then FlashMLA"),
        (B200, 6, ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA",
                   "FLASHMLA", "TRITON_MLA"], "'mla_major_10' starts with FlashInfer's MLA"),
        (RTX_PRO_6000, None, ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"],
         "12.x has its own short MLA list, 'mla_major_12'"),
    ]
    for capability, n, expected, why in mla_orders:
        got = impl.backend_priorities(capability, True)[:n]
        assert got == expected, f"{capability}, MLA: {why}; expected {expected}, got {got}"
    lists = FACTS["priorities"]["lists"]
    assert impl.backend_priorities(A100, False) == lists["non_mla_other"]["backends"][1:], (
        "the facts file's list, minus its {'only_if': ...} entry (multimodal prefix only)")


@pytest.mark.points(1)
@examples(25)
@given(major=st.sampled_from([7, 8, 9, 10, 11, 12]), minor=st.integers(0, 9),
       use_mla=st.booleans())
def test_backend_priorities_depend_on_the_major_version_only(major, minor, use_mla):
    got = impl.backend_priorities((major, minor), use_mla)
    base = impl.backend_priorities((major, 0), use_mla)
    assert got == base, (
        f"use_mla={use_mla}: ({major}, {minor}) gave {got} but ({major}, 0) gave {base}. "
        "_get_backend_priorities reads only device_capability.major: a 10.3 is tried like a "
        "10.0 and an 8.6 like an 8.0 (whether the GPU is new enough is each backend's own "
        "compute-capability check, not the list's)")


@pytest.mark.points(2)
def test_rejected_lists_every_refused_backend_in_priority_order():
    sel = impl.select_backend({**LLAMA, "dtype": "float32"}, A100)
    assert sel.backend == "TRITON_ATTN"
    assert list(sel.rejected) == ["FLASH_ATTN", "FLASHINFER", "TURBOQUANT"], (
        "every backend of the list is validated (vLLM logs them all), refused ones in order")
    assert sel.rejected["FLASH_ATTN"] == ["dtype not supported"]
    assert sel.rejected["TURBOQUANT"] == ["dtype not supported", "kv_cache_dtype not supported"]
    assert sel.valid == ["TRITON_ATTN", "FLEX_ATTENTION"]


@pytest.mark.points(3)
def test_an_invalid_override_raises_with_its_reasons_and_never_falls_back():
    config = {"head_size": 96, "dtype": "bfloat16"}
    with pytest.raises(ValueError, match=(
        r"^Selected backend AttentionBackendEnum\.FLASHINFER is not valid for this "
        r"configuration\. Reason: \['head_size not supported'\]$")):
        impl.select_backend(config, H100, override="FLASHINFER")
        pytest.fail("an invalid override fell back to another backend: vLLM raises with the "
                    "override's reasons and never falls back")
    with pytest.raises(ValueError, match=r"'attention sinks not supported', 'sink not supported"):
        impl.select_backend(GPT_OSS, A100, override="FLASH_ATTN")
    sel = impl.select_backend(LLAMA, H100, override="TRITON_ATTN")
    assert sel.backend == "TRITON_ATTN", "a valid override wins even over a higher priority"
    assert impl.select_backend(LLAMA, H100, override="flash_attn").backend == "FLASH_ATTN", (
        "vLLM upper-cases the name")
    assert impl.select_backend(LLAMA, B200, override="auto").backend == "FLASHINFER", (
        "'auto' means automatic selection")
    with pytest.raises(ValueError, match="Unknown attention backend: 'FOO'"):
        impl.select_backend(LLAMA, H100, override="FOO")


@pytest.mark.points(2)
def test_no_valid_backend_raises_listing_every_backends_reasons():
    with pytest.raises(ValueError, match=r"^No valid attention backend found for cuda") as e:
        impl.select_backend({**DEEPSEEK_V3, "dtype": "float32"}, H100)
    assert "FLASH_ATTN_MLA: [dtype not supported]" in str(e.value)
    assert "TRITON_MLA: [dtype not supported]" in str(e.value)
    with pytest.raises(ValueError, match="No valid attention backend"):
        impl.select_backend({**LLAMA, "block_size": 8}, B200)


@pytest.mark.points(2)
@examples(20)
@given(seed=st.integers(0, 10_000), model=st.sampled_from([LLAMA, DEEPSEEK_V3, MISTRAL, GPT_OSS]),
       capability=st.sampled_from([T4, A100, H100, B200, RTX_PRO_6000]))
def test_selection_does_not_depend_on_the_order_of_the_config_keys(seed, model, capability):
    items = list({**model, "dtype": "float16", "block_size": 64}.items())
    shuffled = items[:]
    random.Random(seed).shuffle(shuffled)
    a = impl.select_backend(dict(items), capability)
    b = impl.select_backend(dict(shuffled), capability)
    assert (a.backend, a.rejected) == (b.backend, b.rejected), "the config is a set of facts"


@pytest.mark.points(1)
@examples(25)
@given(model=st.sampled_from([LLAMA, DEEPSEEK_V3, MISTRAL, GPT_OSS]),
       dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
       block=st.sampled_from([None, 16, 32, 64, 128]),
       capability=st.sampled_from([T4, A100, L4, H100, B200, RTX_PRO_6000]))
def test_the_chosen_backend_is_the_first_valid_one_of_the_priority_list(model, dtype, block,
                                                                       capability):
    config = {**model, "dtype": dtype, "block_size": block}
    order = impl.backend_priorities(capability, config.get("use_mla", False), config)
    verdicts = [(b, impl.validate_configuration(b, config, capability)) for b in order]
    first = next((b for b, r in verdicts if not r), None)
    if first is None:
        with pytest.raises(ValueError, match="No valid attention backend"):
            impl.select_backend(config, capability)
    else:
        assert impl.select_backend(config, capability).backend == first


@pytest.mark.points(2)
def test_bad_inputs_raise_value_error_naming_the_argument():
    ok = {"head_size": 128, "dtype": "bfloat16"}
    cases = [
        ("a config without head_size", "FLASH_ATTN", {"dtype": "bfloat16"}, H100, "head_size"),
        ("dtype float64 (vLLM serves float16, bfloat16, float32)", "FLASH_ATTN",
         {**ok, "dtype": "float64"}, H100, "dtype"),
        ("kv_cache_dtype 'fp9' (not one of the facts' kv_cache_dtypes values)", "FLASH_ATTN",
         {**ok, "kv_cache_dtype": "fp9"}, H100, "kv_cache_dtype"),
        ("an unknown config key 'head_dim' (a typo must not be ignored)", "FLASH_ATTN",
         {**ok, "head_dim": 128}, H100, "head_dim"),
        ("block_size 0", "FLASH_ATTN", {**ok, "block_size": 0}, H100, "block_size"),
        ("capability 'nine' (not a (major, minor) tuple or a GPUS name)", "FLASH_ATTN", ok,
         "nine", "capability"),
        ("backend 'XFORMERS' (not a vLLM 0.33.0 backend)", "XFORMERS", LLAMA, H100,
         "Unknown attention backend"),
    ]
    for case, backend, config, capability, name in cases:
        assert_value_error_names(
            functools.partial(impl.validate_configuration, backend, config, capability),
            name, f"case {case}")


# ---- the matrix ------------------------------------------------------------------------------


@pytest.mark.points(3)
def test_the_selection_matrix_over_real_gpus_dtypes_and_models():
    gpus = {"T4": T4, "A100": A100, "L4": L4, "H100": H100, "B200": B200,
            "RTX PRO 6000": RTX_PRO_6000}
    models = {"llama": LLAMA, "deepseek": DEEPSEEK_V3, "mistral": MISTRAL, "gpt-oss": GPT_OSS}
    m = impl.selection_matrix(gpus, ["float16", "bfloat16", "float32"], models)
    assert len(m) == 6 * 3 * 4
    expected = {
        ("H100", "bfloat16", "llama"): "FLASH_ATTN",
        ("B200", "bfloat16", "llama"): "FLASHINFER",
        ("T4", "float16", "llama"): "TRITON_ATTN",
        ("A100", "float32", "llama"): "TRITON_ATTN",
        ("H100", "bfloat16", "deepseek"): "FLASH_ATTN_MLA",
        ("B200", "bfloat16", "deepseek"): "FLASHINFER_MLA",
        ("A100", "bfloat16", "deepseek"): "TRITON_MLA",
        ("RTX PRO 6000", "bfloat16", "deepseek"): "TRITON_MLA",
        ("H100", "float32", "deepseek"): None,
        ("A100", "bfloat16", "gpt-oss"): "TRITON_ATTN",
        ("H100", "bfloat16", "gpt-oss"): "FLASH_ATTN",
        ("B200", "bfloat16", "gpt-oss"): "FLASHINFER",
        ("RTX PRO 6000", "bfloat16", "gpt-oss"): "FLASHINFER",
        ("L4", "float16", "mistral"): "FLASH_ATTN",
    }
    wrong = {k: (m[k], v) for k, v in expected.items() if m[k] != v}
    sinks = ("gpt-oss has attention sinks: FlashInfer serves them through its TRTLLM kernels on "
             "9.0, 10.x and 12.x, not on Blackwell (10.x) only; ")
    assert not wrong, (f"{sinks if any(k[2] == 'gpt-oss' for k in wrong) else ''}"
                       f"(got, expected) per cell: {wrong}")


@pytest.mark.points(1)
def test_the_default_matrix_covers_every_real_gpu_dtype_and_model_and_prints_as_a_table():
    m = impl.selection_matrix()
    cells = [(g, d, model) for g in provided.GPUS for d in provided.DTYPES
             for model in provided.MODELS]
    assert sorted(m) == sorted(cells), (
        "selection_matrix() with no arguments means every GPU of GPUS, every dtype of DTYPES "
        "and every model of MODELS, keyed (gpu, dtype, model)")
    table = provided.format_matrix(m)  # what `provided.py --matrix` prints
    for name in ("T4 (7.5)", "H100 (9.0)", "B200 (10.0)", "RTX PRO 6000 (12.0)", "gpt-oss-20b",
                 "FLASH_ATTN_MLA", "FLASHINFER", "(none)"):
        assert name in table, f"{name!r} missing from the printed matrix:\n{table}"
    named = impl.selection_matrix(["H100"], ["bfloat16"], ["gpt-oss-20b"])
    assert named == {("H100", "bfloat16", "gpt-oss-20b"): "FLASH_ATTN"}, (
        f"names from GPUS and MODELS are looked up there: {named}")


@pytest.mark.points(1)
def test_a_broken_model_config_in_the_matrix_is_an_error_not_an_empty_cell():
    with pytest.raises(ValueError, match="head_dim"):
        impl.selection_matrix(["H100"], ["bfloat16"], {"typo": {"head_dim": 128}})
        pytest.fail("a broken model config became a cell: it must raise a ValueError naming "
                    "the bad key (head_dim), not be swallowed as 'no backend'")
    # an empty cell means "vLLM finds no backend", and only that
    assert impl.selection_matrix(["H100"], ["float32"], ["DeepSeek-V3"]) == {
        ("H100", "float32", "DeepSeek-V3"): None}


# ---- vocabulary ------------------------------------------------------------------------------


@pytest.mark.points(2)
def test_classify_sorts_the_terms_of_the_field():
    table = {
        "softmax(QKᵀ/√d)V": "math", "online softmax": "math", "grouped-query attention": "math",
        "multi-head latent attention": "math", "causal mask": "math",
        "SDPA": "api", "torch.nn.functional.scaled_dot_product_attention": "api",
        "--attention-backend": "api",
        "FlashAttention-2": "kernel", "FlashAttention-3": "kernel", "FlashInfer": "kernel",
        "FlashMLA": "kernel", "paged_attention_v2": "kernel",
        "PagedAttention": "runtime", "KV cache": "runtime", "continuous batching": "runtime",
        "chunked prefill": "runtime",
    }
    wrong = {t: (impl.classify(t), want) for t, want in table.items() if impl.classify(t) != want}
    assert not wrong, ("terms sorted into the wrong layer (math: the formula; api: what you call; "
                       "kernel: the code that runs on the GPU; runtime: the serving system "
                       f"around it); (got, expected): {wrong}")
    with pytest.raises(ValueError):
        impl.classify("warp specialisation of the softmax")


@pytest.mark.points(1)
def test_sdpa_is_an_api_not_a_kernel():
    assert impl.classify("SDPA") == "api", (
        "misconception 'SDPA is a kernel': scaled_dot_product_attention is an API that "
        "dispatches to one of several kernels (flash, efficient, cuDNN, math)")


@pytest.mark.points(1)
def test_pagedattention_is_runtime_memory_management_not_a_kernel_backend():
    assert impl.classify("PagedAttention") == "runtime", (
        "misconception 'PagedAttention is a kernel backend': it is how the serving runtime "
        "stores the KV cache in blocks; kernels (paged_attention_v1/v2, FlashAttention, "
        "FlashInfer) read those blocks")


@pytest.mark.points(1)
def test_flashattention_is_a_kernel_that_computes_the_exact_math():
    assert impl.classify("FlashAttention") == "kernel" and impl.classify(
        "scaled dot-product attention") == "math", (
        "misconception 'FlashAttention approximates attention': it is a kernel computing "
        "exactly softmax(QKᵀ/√d)V, tiled so the score matrix never reaches HBM")


# ---- PyTorch SDPA on this machine ------------------------------------------------------------


def _qkv(dtype, b=2, h=4, kvh=4, lq=16, lk=16, d=32, seed=0, device="cpu"):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, kvh, lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, kvh, lk, d, generator=g, dtype=torch.float64)
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


def _runs_alone(name, q, k, v, **kw):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with sdpa_kernel([SDPBackend.__members__[name]]):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
        except RuntimeError:
            return False
    return True


SDPA_NAMES = ["MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "OVERRIDEABLE"]


@pytest.mark.points(2)
def test_sdpa_backends_that_run_are_exactly_the_ones_that_run_here():
    import torch

    q, k, v = _qkv(torch.float32)
    got = impl.sdpa_backends_that_run(q, k, v, is_causal=True)
    truth = [n for n in SDPA_NAMES if _runs_alone(n, q, k, v, is_causal=True)]
    assert sorted(got) == sorted(truth), f"got {got}; trying each backend alone gives {truth}"
    assert "MATH" in got, "the math backend runs everywhere: it is the fallback"
    assert "CUDNN_ATTENTION" not in got and "EFFICIENT_ATTENTION" not in got, (
        "CPU tensors: cuDNN and memory-efficient attention are CUDA kernels")


@pytest.mark.points(1)
def test_inputs_that_no_sdpa_backend_accepts_give_an_empty_list():
    import torch

    q, _, _ = _qkv(torch.float32, d=32)
    _, k, v = _qkv(torch.float32, d=16)
    assert impl.sdpa_backends_that_run(q, k, v) == [], (
        "q and k with different head dims: every backend refuses, and the answer is [], "
        "not an exception")


@pytest.mark.points(1)
def test_sdpa_backends_that_run_pass_the_attention_mask_on():
    """``attn_mask=`` reaches every backend tried: a mask of a shape that does not broadcast
    to the [Lq, Lk] scores is refused by all of them (so none runs), a good one by none."""
    import torch

    q, k, v = _qkv(torch.float32, lq=5, lk=6)
    mask = torch.rand(5, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True  # every query attends something
    got = impl.sdpa_backends_that_run(q, k, v, attn_mask=mask)
    truth = [n for n in SDPA_NAMES if _runs_alone(n, q, k, v, attn_mask=mask)]
    assert sorted(got) == sorted(truth), f"got {got}; trying each backend alone gives {truth}"
    bad = torch.ones(3, 4, dtype=torch.bool)  # [3, 4] does not broadcast to [5, 6]
    assert impl.sdpa_backends_that_run(q, k, v, attn_mask=bad) == [], (
        "a [3, 4] mask for [5, 6] scores: every backend refuses it, so the answer is []; "
        "backends ran, so attn_mask was not passed on to scaled_dot_product_attention")

@pytest.mark.points(2)
def test_sdpa_bisect_deviations_are_rounding_not_approximation():
    import torch

    q, k, v = _qkv(torch.float64)
    dev64 = impl.sdpa_bisect(q, k, v, is_causal=True)
    assert isinstance(dev64, dict) and "MATH" in dev64, (
        "sdpa_bisect returns {backend: deviation} for every backend that runs (MATH always does)")
    assert set(dev64) == set(impl.sdpa_backends_that_run(q, k, v, is_causal=True))
    for name, dev in dev64.items():
        assert dev < 1e-12, (
            f"{name} deviates {dev:.2e} from the float64 reference in float64: misconception "
            "'FlashAttention approximates attention' - a backend is exact up to rounding")
    q32, k32, v32 = _qkv(torch.float32)
    for name, dev in impl.sdpa_bisect(q32, k32, v32, is_causal=True).items():
        assert 0 < dev < 2e-5, f"{name}: float32 rounding gives a small non-zero deviation, {dev}"


@pytest.mark.points(2)
def test_sdpa_bisect_measures_against_the_reference_with_the_right_mask_and_scale():
    import torch

    q, k, v = _qkv(torch.float64, lq=8, lk=16)
    keep = torch.rand(8, 16, generator=torch.Generator().manual_seed(1)) < 0.7
    keep[:, 0] = True  # no empty rows
    dev = impl.sdpa_bisect(q, k, v, attn_mask=keep, scale=0.3)
    assert dev and max(dev.values()) < 1e-12, dev
    # the reference itself, for one batch element, to pin the layout convention
    out, _ = reference_attention(q[0].transpose(0, 1), k[0].transpose(0, 1),
                                 v[0].transpose(0, 1), scale=0.3, mask=keep.numpy())
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3)
    assert_close(sdpa[0].transpose(0, 1), out, what="SDPA vs reference (sanity)")


@pytest.mark.points(1)
def test_sdpa_bisect_handles_grouped_query_attention():
    import torch

    q, k, v = _qkv(torch.float64, h=4, kvh=2, lq=8, lk=16)
    dev = impl.sdpa_bisect(q, k, v, is_causal=True, enable_gqa=True)
    assert dev and max(dev.values()) < 1e-12, (
        f"{dev}: with enable_gqa query head h reads KV head h // (H // KVH), and SDPA's "
        "is_causal is the top-left mask (query i sees keys 0..i) even when there are more "
        "keys than queries")


# ---- the same on a CUDA GPU ------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.points(2)
def test_on_cuda_flash_efficient_and_math_run_bf16_and_cudnn_where_supported():
    import torch

    q, k, v = _qkv(torch.bfloat16, b=2, h=8, kvh=8, lq=1024, lk=1024, d=128, device="cuda")
    got = impl.sdpa_backends_that_run(q, k, v, is_causal=True)
    truth = [n for n in SDPA_NAMES if _runs_alone(n, q, k, v, is_causal=True)]
    assert sorted(got) == sorted(truth), f"got {got}, each backend alone: {truth}"
    assert {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"} <= set(got), got
    if torch.cuda.get_device_capability() >= (9, 0) and torch.backends.cudnn.version() >= 90000:
        assert "CUDNN_ATTENTION" in got, "cuDNN 9 attention runs bf16 d=128 on Hopper"


@pytest.mark.gpu
@pytest.mark.points(1)
def test_on_cuda_flash_attention_refuses_float32():
    import torch

    q, k, v = _qkv(torch.float32, lq=256, lk=256, d=64, device="cuda")
    got = impl.sdpa_backends_that_run(q, k, v)
    assert "FLASH_ATTENTION" not in got and "MATH" in got, (
        f"{got}: the CUDA FlashAttention kernel exists for fp16/bf16 only")


@pytest.mark.gpu
@pytest.mark.points(2)
def test_on_cuda_every_backend_is_within_bf16_rounding_of_the_reference():
    import torch

    q, k, v = _qkv(torch.bfloat16, b=1, h=8, kvh=2, lq=512, lk=512, d=128, device="cuda")
    dev = impl.sdpa_bisect(q, k, v, is_causal=True, enable_gqa=True)
    assert len(dev) >= 2, dev
    for name, d in dev.items():  # outputs reach ~3.5, where one bf16 step is 1.6e-2
        assert d < 6e-2, (
            f"{name} deviates {d} from the float64 reference in bf16: more than a few rounding "
            "steps, so something other than summation order differs (mask? GQA mapping?)")

