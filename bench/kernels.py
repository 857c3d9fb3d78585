"""The table of kernels ``make bench`` measures. Adding a kernel is one entry in KERNELS.

An entry names the lab folder, the public function (loaded with ``common.load_impl``), its
calling convention (a Workload class from bench.workloads) and three shape lists: ``gpu``
(the shapes that matter: short and long context, batch 1 and 64, MHA and GQA 32/8, d=128,
bf16), ``quick`` (names from ``gpu``: the target shapes, plus short-context decode) and
``tiny`` (a few programs, float32, for the Triton interpreter). The targets are the course's
performance targets (bench/README.md), set against the published figures cited there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from bench.shapes import Shape, Target, decode, mla_decode, prefill, varlen
from bench.workloads import (
    BackwardWorkload,
    DenseWorkload,
    MLADecodeWorkload,
    PagedDecodeWorkload,
    VarlenWorkload,
    WindowSinkDecodeWorkload,
    Workload,
)

# ---- targets (bench/README.md: the course's performance targets) --------------------------
DECODE_TARGET = Target(
    "kv_GBps", 2500, "paged decode >= 2.5 TB/s of K/V bytes at long context (course target)"
)
SPLIT_TARGETS = (
    Target("kv_GBps", 2400, "split-KV at batch 1, 64k context >= 2.4 TB/s (course target)"),
    Target("merge_share", 10, "merge <= 10% of the split-KV call's kernel time (course target)"),
    Target(
        "speedup_over",
        1.5,
        "split-KV >= 1.5x the no-split kernel at batch 1 (floor from published kernels, README)",
        ref="lab-01 paged_decode_triton (no split)",
    ),
)
PREFILL_TARGET = Target(
    "pct_of", 90, "prefill >= 90% of SDPA's FlashAttention backend, same run (course target)",
    ref="sdpa[flash]",
)  # fmt: skip
BACKWARD_TARGET = Target(
    "pct_of", 80, "backward >= 80% of SDPA's FlashAttention backward, same run (course target)",
    ref="sdpa[flash] backward",
)  # fmt: skip
VARLEN_FIXED = "varlen gqa32/8 8x2k from scratch d128"
VARLEN_TARGET = Target(
    "pct_of_shape", 85, "mixed lengths >= 85% of fixed-length TFLOP/s, same total tokens "
    "(floor from published kernels, README)", ref=VARLEN_FIXED,
)  # fmt: skip


@dataclass(frozen=True)
class KernelSpec:
    name: str  # what --only selects
    lab: str  # folder under labs/
    func: str  # the public function of the lab's solution.py (or starter.py)
    workload: type[Workload]
    gpu: tuple[Shape, ...]
    quick: tuple[str, ...]
    tiny: tuple[Shape, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra arguments on a GPU
    tiny_kwargs: dict[str, Any] = field(default_factory=dict)  # ... under the interpreter
    compare: tuple[str, ...] = ()  # other kernels (by name) to time on the same inputs
    breakdown: bool = False  # per-kernel device times from torch.profiler (GPU only)
    what: str = ""

    @property
    def label(self) -> str:
        return f"{self.lab.split('-')[0]}-{self.lab.split('-')[1]} {self.func}"

    def shapes(self, mode: str) -> tuple[Shape, ...]:
        if mode == "tiny":
            return self.tiny
        if mode == "quick":
            return tuple(s for s in self.gpu if s.name in self.quick)
        return self.gpu


KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec(
        name="flash",
        lab="lab-00-online-softmax",
        func="flash_attention_triton",
        workload=DenseWorkload,
        what="FlashAttention forward, [B, H, L, d], MHA",
        gpu=(
            prefill(1, 16384, causal=False, note="target shape", targets=(PREFILL_TARGET,)),
            prefill(1, 16384, causal=True, note="target shape", targets=(PREFILL_TARGET,)),
            prefill(4, 4096, causal=True, note="16k tokens in 4 sequences"),
            prefill(16, 1024, causal=True, note="short prompts"),
        ),
        quick=(
            "prefill mha b1 L16k d128 non-causal",
            "prefill mha b1 L16k d128 causal",
        ),
        tiny=(
            prefill(1, 48, heads=2, head_dim=32, causal=False, targets=(PREFILL_TARGET,)),
            prefill(1, 40, heads=2, head_dim=32, causal=True, targets=(PREFILL_TARGET,)),
        ),
    ),
    KernelSpec(
        name="decode",
        lab="lab-01-paged-attention-gather",
        func="paged_decode_triton",
        workload=PagedDecodeWorkload,
        what="PagedAttention decode, one token per sequence, page 16",
        gpu=(
            decode(64, 256, note="short context: launch/latency bound, report only"),
            decode(64, 4096, note="target regime (bs >= 32, ctx >= 2k)", targets=(DECODE_TARGET,)),
            decode(64, 4096, heads=32, kv_heads=32, note="MHA: 4x the K/V bytes"),
            decode(64, (1024, 7168), note="mixed lengths, mean ~4k"),
            decode(1, 8192, note="batch 1: only KVH programs; what split-KV fixes"),
        ),
        quick=("decode gqa32/8 b64 ctx256 d128", "decode gqa32/8 b64 ctx4k d128"),
        tiny=(
            decode(2, (17, 40), heads=4, kv_heads=2, head_dim=32, targets=(DECODE_TARGET,)),
            decode(2, 33, heads=2, kv_heads=2, head_dim=32),
        ),
    ),
    KernelSpec(
        name="varlen",
        lab="lab-03-causal-prefill-attention",
        func="varlen_prefill_triton",
        workload=VarlenWorkload,
        what="varlen causal prefill over a paged cache (the serving batch)",
        gpu=(
            varlen("8x2k from scratch", (2048,) * 8, (2048,) * 8, note="fixed lengths, 16k tokens"),
            varlen(
                "8 mixed 768-4k from scratch",
                (4096, 3072, 2560, 2048, 1536, 1280, 1024, 768),
                (4096, 3072, 2560, 2048, 1536, 1280, 1024, 768),
                note="mixed lengths, same 16k tokens",
                targets=(VARLEN_TARGET,),
            ),
            varlen("4x1k chunks after 7k cached", (1024,) * 4, (8192,) * 4, note="chunked prefill"),
            varlen(
                "2x2k prefill + 62 decodes at 4k",
                (2048, 2048) + (1,) * 62,
                (2048, 2048) + (4096,) * 62,
                note="a mixed prefill + decode step",
            ),
        ),
        quick=(
            "varlen gqa32/8 8x2k from scratch d128",
            "varlen gqa32/8 8 mixed 768-4k from scratch d128",
        ),
        tiny=(
            varlen("2x24 from scratch", (24, 24), (24, 24), 4, 2, 32),
            varlen(
                "mixed 5+16+1",
                (5, 16, 1),
                (21, 16, 30),
                4,
                2,
                32,
                targets=(replace(VARLEN_TARGET, ref="varlen gqa4/2 2x24 from scratch d32"),),
            ),  # fmt: skip
        ),
    ),
    KernelSpec(
        name="split",
        lab="lab-04-flash-decoding-partitions",
        func="split_kv_decode_triton",
        workload=PagedDecodeWorkload,
        what="split-KV (flash-decoding) decode: partition kernel + merge kernel",
        kwargs={},  # on a GPU: the launch plan's partitions (common/launch_plan.py)
        tiny_kwargs={"partition_size": 32},
        compare=("decode",),
        breakdown=True,
        gpu=(
            decode(1, 16384, note="batch 1, long context"),
            decode(1, 65536, note="target shape", targets=SPLIT_TARGETS),
            decode(1, 65536, heads=32, kv_heads=32, note="MHA, batch 1"),
            decode(4, 32768, note="small batch, long context"),
            decode(64, 4096, note="large batch: splitting should not be needed here"),
        ),
        quick=("decode gqa32/8 b1 ctx64k d128",),
        tiny=(decode(2, (33, 70), heads=4, kv_heads=2, head_dim=32, targets=SPLIT_TARGETS),),
    ),
    KernelSpec(
        name="backward",
        lab="lab-05-flash-attention-backward",
        func="flash_attention_backward_triton",
        workload=BackwardWorkload,
        what="FlashAttention backward (preprocess, dK/dV, dQ kernels), [B, H, L, d]",
        gpu=(
            prefill(1, 16384, causal=False, note="lab 00's forward shape",
                    targets=(BACKWARD_TARGET,)),
            prefill(1, 16384, causal=True, note="lab 00's forward shape",
                    targets=(BACKWARD_TARGET,)),
            prefill(4, 4096, causal=True, note="16k tokens in 4 sequences"),
            prefill(1, 16384, kv_heads=8, causal=True, note="GQA: dK, dV summed over the group"),
        ),
        quick=("prefill mha b1 L16k d128 non-causal", "prefill mha b1 L16k d128 causal"),
        tiny=(
            prefill(1, 40, heads=2, head_dim=32, causal=False),
            prefill(1, 33, heads=2, head_dim=32, causal=True),
        ),
    ),
    KernelSpec(
        name="window",
        lab="lab-06-mla-window-sinks",
        func="paged_decode_window_sink_triton",
        workload=WindowSinkDecodeWorkload,
        what="paged decode with a sliding window and attention sinks (gpt-oss layers)",
        gpu=(
            decode(64, 4096, heads=64, kv_heads=8, head_dim=64, window=128,
                   note="gpt-oss-120b's windowed layers: 128 tokens, sinks; no target"),
            decode(64, 4096, heads=64, kv_heads=8, head_dim=64,
                   note="gpt-oss-120b's full layers: sinks, no window"),
            decode(64, 4096, note="lab 01's target shape, with sinks"),
        ),
        quick=("decode gqa64/8 b64 ctx4k d64 window128",),
        tiny=(
            decode(2, (20, 45), heads=4, kv_heads=2, head_dim=32, window=16),
            decode(2, 33, heads=2, kv_heads=2, head_dim=32),
        ),
    ),
    KernelSpec(
        name="mla",
        lab="lab-06-mla-window-sinks",
        func="mla_decode_triton",
        workload=MLADecodeWorkload,
        what="absorbed MLA decode over a paged latent cache (DeepSeek-V3: d_c 512 + 64 rotary)",
        gpu=(
            mla_decode(64, 4096, note="DeepSeek-V3's 128 heads on one GPU; no target"),
            mla_decode(64, 4096, heads=16, note="128 heads split over 8 GPUs (TP8)"),
            mla_decode(1, 65536, note="batch 1, long context: 2 head tiles per sequence"),
        ),
        quick=("decode mla128 b64 ctx4k d512+64",),
        tiny=(mla_decode(2, 40, heads=4, kv_lora_rank=32, rope_dim=16),),
    ),
)


def by_name(name: str) -> KernelSpec:
    for spec in KERNELS:
        if spec.name == name:
            return spec
    raise KeyError(name)


def select(only: str | None, kernels: tuple[KernelSpec, ...] = KERNELS) -> list[KernelSpec]:
    """``--only decode,split`` or lab numbers ``--only 01,04``; None = all."""
    if not only:
        return list(kernels)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    chosen = []
    for spec in kernels:
        number = spec.lab.split("-")[1]
        if spec.name in wanted or number in wanted or spec.lab in wanted:
            chosen.append(spec)
    unknown = [
        w for w in wanted
        if not any(w in (s.name, s.lab.split("-")[1], s.lab) for s in kernels)
    ]  # fmt: skip
    if unknown:
        names = ", ".join(s.name for s in kernels)
        raise ValueError(f"--only {','.join(unknown)}: unknown kernel (choose from {names})")
    return chosen
