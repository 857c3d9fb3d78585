"""The kernels ``make gpu-report`` compiles. Adding a kernel (or a config) is one entry.

An entry names the lab folder, the ``@triton.jit`` kernel in the lab's ``solution.py``, a
label for the config, and a *launch* function. Given the lab's loaded modules, a dtype name
(``bf16``, ``fp16``, ``fp32``) and a head dim, the launch function returns what the lab's
launcher passes on a GPU at a benchmark shape (``bench/kernels.py``): every kernel argument
by name (pointers as ``Ptr(dtype)``, ints at their real values, floats, constexprs) and the
launch options (``num_warps``, ``num_stages``). It reads the tile sizes from the lab's own
``provided.gpu_tiles(...)`` (the primer's ``GPU_TILES``), so the report follows the launcher;
where a launcher computes a size (a group padded to a ``tl.dot`` tile), the function restates that
arithmetic in one line.

``bench.gpu_compile`` specialises the arguments as Triton's runtime does (pointers 16-byte
aligned, an int equal to 1 becomes a constant, an int divisible by 16 is marked so) and
compiles for each arch of ``ARCHS``. An entry whose kernel is not in the tree, or whose
arguments no longer match the kernel's parameters (another branch's version of the lab), is
skipped with the reason printed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from common import launch_plan as lp
from common.launch_plan import Plan, Target
from common.triton_env import LOG2E, dot_precision, dot_tile

ARCHS = (80, 86, 90, 100)  # sm_80 (A100), sm_86 (RTX 30, 99 KB a block), sm_90 (H100), sm_100
SMALL_ARCHS = (86,)  # compiled in bf16 at the entry's summary head dim only
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Ptr:
    """A pointer argument: a tensor of ``dtype`` (Triton's name: bf16, fp16, fp32, i32)."""

    dtype: str


@dataclass(frozen=True)
class Lab:
    """A lab's loaded modules: the file under test and its ``provided.py`` (None if none)."""

    solution: ModuleType
    provided: ModuleType | None


@dataclass(frozen=True)
class Launch:
    args: dict[str, Any]  # every kernel parameter by name
    options: dict[str, int] = field(default_factory=dict)  # num_warps, num_stages


LaunchFn = Callable[[Lab, str, int], Launch]
# The launch plan at the entry's bench shape for a target (bench d, bf16): its grid and,
# in ``notes["stage_bytes"]``, the global-memory bytes one CTA loads per pipeline stage.
PlanFn = Callable[[Target], Plan]
# The kernel's own work at that shape, ``(FLOPs, bytes)``: what its roof is computed from.
WorkFn = Callable[[Target], tuple[int, int]]


@dataclass(frozen=True)
class GpuKernel:
    lab: str  # folder under labs/
    kernel: str  # the @triton.jit function of the lab's solution.py
    config: str  # what distinguishes this entry (mask, mode, head group)
    launch: LaunchFn
    bench: str = ""  # the bench.kernels entry whose shapes bound this kernel's time
    shape: str = ""  # the bench shape whose bound the summary shows ("": its first target)
    dtypes: tuple[str, ...] = DTYPES
    head_dims: tuple[int, ...] = HEAD_DIMS
    summary_head_dim: int = 0  # the head dim of the report's summary row (0: 128 if compiled)
    plan: PlanFn | None = None  # the launch plan the report judges (None: not judged)
    role: str = "main"  # "main": the plan's default launch; "helper" (a merge) or
    # "comparison" (a non-default option): grid flags are shown, not failed
    work: WorkFn | None = None  # the kernel's own (FLOPs, bytes) for a target (None: the
    # whole call's at the bench shape, ``bench.gpu_plan.bench_work``)
    archs: tuple[int, ...] = ARCHS  # the targets it compiles for (fp8 e4m3 needs sm_89+)

    @property
    def summary_dims(self) -> int:
        """The head dim the report's summary shows: the bench shape's (128 unless set)."""
        if self.summary_head_dim:
            return self.summary_head_dim
        return 128 if 128 in self.head_dims else self.head_dims[0]

    @property
    def short_lab(self) -> str:
        return "-".join(self.lab.split("-")[:2])

    @property
    def name(self) -> str:
        return f"{self.short_lab} {self.kernel} [{self.config}]"


def strides(*shape: int) -> tuple[int, ...]:
    """Strides (in elements) of a contiguous tensor of ``shape``."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _precision(dtype: str) -> str:
    return dot_precision(TORCH_NAMES[dtype])


def _need(lab: Lab) -> ModuleType:
    if lab.provided is None:
        raise LookupError("the lab has no provided.py with its GPU tile constants")
    return lab.provided


# ---- lab-00: FlashAttention forward, prefill mha b1 L16k (bench "flash") ------------------


def flash_forward(causal: bool) -> LaunchFn:
    """``flash_attention_triton``: q/k/v/out ``[1, 32, 16384, d]``, lse ``[1, 32, 16384]``,
    tiles from ``provided.gpu_tiles(d)``."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        tiles = _need(lab).gpu_tiles(d)
        b, h, n = 1, 32, 16384
        qkvo = strides(b, h, n, d)
        args: dict[str, Any] = {"Q": Ptr(dtype), "K": Ptr(dtype), "V": Ptr(dtype),
                                "Out": Ptr(dtype), "Lse": Ptr("fp32")}  # fmt: skip
        for t, dims in (("q", "bhmd"), ("k", "bhnd"), ("v", "bhnd"), ("o", "bhmd")):
            args.update(zip((f"stride_{t}{x}" for x in dims), qkvo))
        args.update(zip(("stride_lb", "stride_lh", "stride_lm"), strides(b, h, n)))
        args.update(num_heads=h, seqlen_q=n, seqlen_k=n, qk_scale=LOG2E / d**0.5,
                    HEAD_DIM=d, HEAD_DIM_V=d, D_PAD=dot_tile(d), DV_PAD=dot_tile(d),
                    CAUSAL=causal, BLOCK_M=tiles["block_m"], BLOCK_N=tiles["block_n"],
                    DOT_PRECISION=_precision(dtype))  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


# ---- lab-01: paged decode, b64 ctx4k page 16 (bench "decode") -----------------------------


def paged_decode(heads: int, kv_heads: int) -> LaunchFn:
    """``paged_decode_triton``: q ``[64, H, d]``, caches ``[64*256, 16, KVH, d]``, tables
    ``[64, 256]``; ``GROUP_PAD = dot_tile(H // KVH)`` as in the launcher; tiles and launch
    options ``provided.gpu_tiles(...)``."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        provided = _need(lab)
        batch, blocks, page = 64, 256, 16
        cache = strides(batch * blocks, page, kv_heads, d)
        group = heads // kv_heads
        tiles = provided.gpu_tiles(batch, kv_heads, group, d)
        args = {
            "q_ptr": Ptr(dtype), "k_cache_ptr": Ptr(dtype), "v_cache_ptr": Ptr(dtype),
            "block_tables_ptr": Ptr("i32"), "seq_lens_ptr": Ptr("i32"), "out_ptr": Ptr(dtype),
            "lse_ptr": Ptr("fp32"), "qk_scale": LOG2E / d**0.5,
            "stride_q_seq": heads * d, "stride_q_head": d,
            "stride_k_block": cache[0], "stride_k_slot": cache[1], "stride_k_head": cache[2],
            "stride_v_block": cache[0], "stride_v_slot": cache[1], "stride_v_head": cache[2],
            "stride_table_seq": blocks,
            "stride_o_seq": heads * d, "stride_o_head": d, "stride_lse_seq": heads,
            "GROUP": group, "GROUP_PAD": dot_tile(group), "HEAD_DIM": d,
            "HEAD_DIM_PAD": dot_tile(d), "BLOCK_SIZE": page,
            "BLOCK_N": tiles["block_n"], "DOT_PRECISION": _precision(dtype),
        }  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


# ---- lab-12: paged decode over an fp8 (e4m3) cache, b64 ctx4k page 16 (no bench entry) --------


def paged_decode_fp8(heads: int, kv_heads: int, per_token_head: bool) -> LaunchFn:
    """``paged_decode_fp8_triton``: q ``[64, H, d]`` in the report's dtype, uint8 caches
    ``[64*256, 16, KVH, d]``, float32 scales (one each, or ``[64*256, 16, KVH]``), tables
    ``[64, 256]``; tiles ``provided.gpu_tiles(...)`` (>= 32 keys a tile)."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        provided = _need(lab)
        batch, blocks, page = 64, 256, 16
        cache = strides(batch * blocks, page, kv_heads, d)
        scales = strides(batch * blocks, page, kv_heads) if per_token_head else (0, 0, 0)
        group = heads // kv_heads
        tiles = provided.gpu_tiles(batch, kv_heads, group, d)
        args = {
            "q_ptr": Ptr(dtype), "k_cache_ptr": Ptr("u8"), "v_cache_ptr": Ptr("u8"),
            "k_scale_ptr": Ptr("fp32"), "v_scale_ptr": Ptr("fp32"),
            "block_tables_ptr": Ptr("i32"), "seq_lens_ptr": Ptr("i32"), "out_ptr": Ptr(dtype),
            "lse_ptr": Ptr("fp32"), "qk_scale": LOG2E / d**0.5,
            "stride_q_seq": heads * d, "stride_q_head": d,
            "stride_k_block": cache[0], "stride_k_slot": cache[1], "stride_k_head": cache[2],
            "stride_v_block": cache[0], "stride_v_slot": cache[1], "stride_v_head": cache[2],
            "stride_ks_block": scales[0], "stride_ks_slot": scales[1],
            "stride_ks_head": scales[2], "stride_vs_block": scales[0],
            "stride_vs_slot": scales[1], "stride_vs_head": scales[2],
            "stride_table_seq": blocks,
            "stride_o_seq": heads * d, "stride_o_head": d, "stride_lse_seq": heads,
            "GROUP": group, "GROUP_PAD": dot_tile(group), "HEAD_DIM": d,
            "HEAD_DIM_PAD": dot_tile(d), "BLOCK_SIZE": page,
            "BLOCK_N": tiles["block_n"], "PER_TOKEN_HEAD": per_token_head,
            "DOT_PRECISION": _precision(dtype),
        }  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


# ---- lab-03: varlen causal prefill over a paged cache, 8 x 2k (bench "varlen") -----------


def varlen_prefill(heads: int, kv_heads: int) -> LaunchFn:
    """``varlen_prefill_triton``: q ``[16384, H, d]``, caches ``[1024, 16, KVH, d]``, tables
    ``[8, 128]``. GQA-packed tile and launch options from ``provided.gpu_tiles`` (the launch
    plan's ``varlen_prefill`` on the H100), ``BLOCK_Q = BLOCK_M // group`` as the launcher
    computes it."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        tokens, seqs, blocks, page = 16384, 8, 128, 16
        group = heads // kv_heads
        tiles = _need(lab).gpu_tiles(tokens, seqs, group, d)
        block_m = tiles["block_m"]
        cache = strides(seqs * blocks, page, kv_heads, d)
        args: dict[str, Any] = {
            "q_ptr": Ptr(dtype), "k_cache_ptr": Ptr(dtype), "v_cache_ptr": Ptr(dtype),
            "block_tables_ptr": Ptr("i32"), "query_start_loc_ptr": Ptr("i32"),
            "seq_lens_ptr": Ptr("i32"), "out_ptr": Ptr(dtype), "lse_ptr": Ptr("fp32"),
            "qk_scale": LOG2E / d**0.5, "num_seqs": seqs, "num_splits": tiles["num_splits"],
            "stride_bt": blocks,
        }  # fmt: skip
        splits = tiles["num_splits"]  # provided.split_outputs: [T, H, S, d] partials
        args.update(zip(("stride_qt", "stride_qh", "stride_qd"), strides(tokens, heads, d)))
        args.update(zip(("stride_kb", "stride_ks", "stride_kh", "stride_kd"), cache))
        args.update(zip(("stride_vb", "stride_vs", "stride_vh", "stride_vd"), cache))
        args.update(zip(("stride_ot", "stride_oh", "stride_os", "stride_od"),
                        strides(tokens, heads, splits, d)))  # fmt: skip
        args.update(zip(("stride_lt", "stride_lh", "stride_ls"), strides(tokens, heads, splits)))
        args.update(GROUP=group, PAGE_SIZE=page, HEAD_DIM=d, HEAD_DIM_PAD=dot_tile(d),
                    HEAD_DIM_V=d, HEAD_DIM_V_PAD=dot_tile(d), BLOCK_M=block_m,
                    BLOCK_Q=block_m // group, BLOCK_N=tiles["block_n"],
                    DOT_PRECISION=_precision(dtype))  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


# ---- lab-04: split-KV decode, b1 ctx64k page 16 (bench "split") ---------------------------

SPLIT_CONTEXT = 65536  # the bench's target shape: batch 1, 64k tokens, gqa32/8


def split_plan(target: Target) -> Plan:
    """Lab 04's plan at batch 1, 64k context, gqa32/8, d 128."""
    return lp.split_kv_decode(1, 8, 4, 128, SPLIT_CONTEXT, target)


def split_partition(num_segments: int | None) -> LaunchFn:
    """``split_kv_decode_triton``'s partition kernel: q ``[1, 32, d]``, caches ``[4096, 16, 8,
    d]``, partials ``[1, 32, splits, d]`` fp32; ``num_segments`` None = the launch plan's
    partitions (``launch_plan.split_kv_decode`` on the H100); ``block_n`` and the launch
    options from ``provided.gpu_tiles(d)``."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        tiles = _need(lab).gpu_tiles(d)
        heads, kv_heads, page = 32, 8, 16
        blocks = SPLIT_CONTEXT // page
        plan = split_plan(lp.H100)
        size = plan.tiles["partition_size"]
        splits = num_segments or plan.splits
        group = heads // kv_heads
        cache = strides(blocks, page, kv_heads, d)
        args: dict[str, Any] = {
            "q_ptr": Ptr(dtype), "k_cache_ptr": Ptr(dtype), "v_cache_ptr": Ptr(dtype),
            "block_tables_ptr": Ptr("i32"), "seq_lens_ptr": Ptr("i32"),
            "part_out_ptr": Ptr("fp32"), "part_lse_ptr": Ptr("fp32"),
            "qk_scale": LOG2E / d**0.5, "num_splits": splits,
            "stride_qb": heads * d, "stride_qh": d,
            "stride_kb": cache[0], "stride_kt": cache[1], "stride_kh": cache[2],
            "stride_vb": cache[0], "stride_vt": cache[1], "stride_vh": cache[2],
            "stride_bt": blocks,
        }  # fmt: skip
        args.update(zip(("stride_ob", "stride_oh", "stride_op"), strides(1, heads, splits, d)))
        args.update(zip(("stride_lb", "stride_lh"), strides(1, heads, splits)))
        args.update(PARTITION_SIZE=size, NUM_SEGMENTS=num_segments or 0, BLOCK_SIZE=page,
                    GROUP=group, HEAD_DIM=d, HEAD_DIM_V=d, BLOCK_H=dot_tile(group),
                    BLOCK_D=dot_tile(d), BLOCK_DV=dot_tile(d),
                    BLOCK_N=tiles["block_n"], DOT_PRECISION=_precision(dtype),
                    LOG2E=LOG2E)  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


def merge_partitions(splits: int | None) -> LaunchFn:
    """``split_kv_decode_triton``'s merge kernel: fp32 partials ``[1, 32, splits, d]``, out
    ``[1, 32, d]`` in the entry's dtype; ``block_p`` and the launch options from
    ``provided.gpu_tiles(d)``."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        tiles = _need(lab).gpu_tiles(d)
        heads, splits_ = 32, splits or split_plan(lp.H100).splits
        args: dict[str, Any] = {
            "part_out_ptr": Ptr("fp32"), "part_lse_ptr": Ptr("fp32"), "out_ptr": Ptr(dtype),
            "lse_ptr": Ptr("fp32"), "num_partitions": splits_,
        }  # fmt: skip
        args.update(zip(("stride_ob", "stride_oh", "stride_op"), strides(1, heads, splits_, d)))
        args.update(zip(("stride_lb", "stride_lh"), strides(1, heads, splits_)))
        args.update(zip(("stride_fb", "stride_fh"), strides(1, heads, d)))
        args.update(zip(("stride_sb", "stride_sh"), strides(1, heads)))
        args.update(HEAD_DIM_V=d, BLOCK_P=tiles["block_p"], BLOCK_DV=dot_tile(d),
                    LOG2E=LOG2E)  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


# ---- lab-05: FlashAttention backward, mha b1 L16k (bench "backward") ----------------------

BWD_HEADS, BWD_LEN = 32, 16384  # the bench's target shape: q, k, v, o, do [1, 32, 16384, d]


def _bwd_common(lab: Lab, d: int) -> tuple[dict[str, Any], dict[str, int]]:
    """What the launcher passes every backward kernel (its ``common`` dict): head dim, the
    query tile and the launch options of ``provided.gpu_tiles(d)``."""
    tiles = _need(lab).gpu_tiles(d)
    args = {"HEAD_DIM": d, "D_PAD": dot_tile(d), "BLOCK_M": tiles["block_m"]}
    return args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]}


def bwd_preprocess(lab: Lab, dtype: str, d: int) -> Launch:
    """``_bwd_preprocess_kernel``: ``Delta = rowsum(dO * O)``, o/do ``[1, 32, 16384, d]``."""
    args, options = _bwd_common(lab, d)
    args.update(O=Ptr(dtype), DO=Ptr(dtype), Delta=Ptr("fp32"), num_heads=BWD_HEADS,
                seqlen_q=BWD_LEN)  # fmt: skip
    return Launch(args, options)


def flash_bwd(kernel: str, causal: bool) -> LaunchFn:
    """``flash_attention_backward_triton``'s dK/dV (``kernel="dkdv"``) or dQ kernel: q, k, v,
    do ``[1, 32, 16384, d]`` (MHA: ``GROUP = 1``), lse and Delta fp32 ``[1, 32, 16384]``,
    tiles from ``provided.gpu_tiles(d)``."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        args, options = _bwd_common(lab, d)
        args.update({name: Ptr(dtype) for name in ("Q", "K", "V", "DO")})
        args.update(LSE=Ptr("fp32"), Delta=Ptr("fp32"))
        if kernel == "dkdv":
            args.update(DK=Ptr(dtype), DV=Ptr(dtype), num_kv_heads=BWD_HEADS)
        else:
            args.update(DQ=Ptr(dtype))
        args.update(num_heads=BWD_HEADS, seqlen_q=BWD_LEN, seqlen_k=BWD_LEN,
                    qk_scale=LOG2E / d**0.5, scale=1 / d**0.5, GROUP=1, CAUSAL=causal,
                    BLOCK_N=_need(lab).gpu_tiles(d)["block_n"],
                    DOT_PRECISION=_precision(dtype))  # fmt: skip
        return Launch(args, options)

    return launch


# ---- lab-06: window/sink paged decode (gpt-oss-like) and MLA decode (DeepSeek-V3-like) -----

WINDOW = 128  # gpt-oss's sliding window (tokens), the bench's windowed shape
MLA_ROPE_DIM = 64  # DeepSeek-V3: kv_lora_rank 512 (the entry's head dim) + 64 rotary dims



def _split_outputs(batch: int, heads: int, d: int, splits: int,
                   dtype: str) -> dict[str, Any]:  # fmt: skip
    """``provided.split_outputs``' buffers as kernel arguments: ``out`` / ``lse`` themselves
    (a split dim of 1) for one split, else partials ``[B, H, S, d]`` in the output's dtype
    and fp32 ``[B, H, S]``."""
    o = strides(batch, heads, splits, d)
    sl = strides(batch, heads, splits)
    return {"out_ptr": Ptr(dtype), "lse_ptr": Ptr("fp32"),
            "num_splits": splits, "stride_o_seq": o[0], "stride_o_head": o[1],
            "stride_o_split": o[2], "stride_lse_seq": sl[0], "stride_lse_head": sl[1],
            "stride_lse_split": sl[2]}  # fmt: skip


def window_sink_decode(heads: int, kv_heads: int, sinks: bool) -> LaunchFn:
    """``paged_decode_window_sink_triton``: q ``[64, H, d]``, caches ``[64*256, 16, KVH, d]``,
    tables ``[64, 256]``, a 128-token window; ``GROUP_PAD = dot_tile(H // KVH)``; tiles and
    launch options ``provided.window_gpu_tiles(...)``; the launch plan's KV splits on the
    H100 (``launch_plan.window_decode``)."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        provided = _need(lab)
        batch, blocks, page = 64, 256, 16
        cache = strides(batch * blocks, page, kv_heads, d)
        group = heads // kv_heads
        splits = lp.window_decode(batch, kv_heads, group, d, blocks * page,
                                  WINDOW if sinks else None, lp.H100).splits
        tiles = provided.window_gpu_tiles(batch, kv_heads, group, d)
        args = {
            "q_ptr": Ptr(dtype), "k_cache_ptr": Ptr(dtype), "v_cache_ptr": Ptr(dtype),
            "block_tables_ptr": Ptr("i32"), "seq_lens_ptr": Ptr("i32"),
            "sinks_ptr": Ptr("fp32"),
            "qk_scale": LOG2E / d**0.5, "window": WINDOW if sinks else 0,
            "stride_q_seq": heads * d, "stride_q_head": d,
            "stride_k_block": cache[0], "stride_k_slot": cache[1], "stride_k_head": cache[2],
            "stride_v_block": cache[0], "stride_v_slot": cache[1], "stride_v_head": cache[2],
            "stride_table_seq": blocks, **_split_outputs(batch, heads, d, splits, dtype),
            "GROUP": group, "GROUP_PAD": dot_tile(group), "HEAD_DIM": d,
            "HEAD_DIM_PAD": dot_tile(d), "BLOCK_SIZE": page,
            "BLOCK_N": tiles["block_n"], "HAS_SINKS": sinks, "DOT_PRECISION": _precision(dtype),
        }  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


def mla_decode(heads: int, batch: int = 64, context: int = 4096) -> LaunchFn:
    """``mla_decode_triton``: q_latent ``[B, H, d_c]``, q_pe ``[B, H, 64]``, latent cache
    ``[B*blocks, 16, d_c + 64]``, tables ``[B, context / 16]`` (B = 64 at 4k context by
    default); ``d`` is ``d_c`` (512 for DeepSeek-V3);
    ``BLOCK_H = min(mla_gpu_tiles(...)["block_h"], dot_tile(H))`` as in the launcher; the launch
    plan's KV splits on the H100 (``launch_plan.mla_decode``: partials when > 1)."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        provided = _need(lab)
        page, rope = 16, MLA_ROPE_DIM
        blocks = context // page
        splits = lp.mla_decode(batch, heads, d, context, lp.H100).splits
        tiles = provided.mla_gpu_tiles(batch, heads, d)
        args = {
            "q_latent_ptr": Ptr(dtype), "q_pe_ptr": Ptr(dtype), "kv_cache_ptr": Ptr(dtype),
            "block_tables_ptr": Ptr("i32"), "seq_lens_ptr": Ptr("i32"),
            "qk_scale": LOG2E / (d + rope) ** 0.5,
            "stride_ql_seq": heads * d, "stride_ql_head": d,
            "stride_qr_seq": heads * rope, "stride_qr_head": rope,
            "stride_kv_block": page * (d + rope), "stride_kv_slot": d + rope,
            "stride_table_seq": blocks, **_split_outputs(batch, heads, d, splits, dtype),
            "NUM_HEADS": heads,
            "BLOCK_H": min(tiles["block_h"], dot_tile(heads)),
            "KV_LORA_RANK": d, "KV_LORA_PAD": dot_tile(d), "ROPE_DIM": rope,
            "ROPE_PAD": dot_tile(rope), "BLOCK_SIZE": page,
            "BLOCK_N": tiles["block_n"], "DOT_PRECISION": _precision(dtype),
        }  # fmt: skip
        return Launch(args, {"num_warps": tiles["num_warps"], "num_stages": tiles["num_stages"]})

    return launch


# ---- lab-09: the Triton primer, at GPU sizes (no bench entry: the lab has no workload) ----


def primer(kernel: str) -> LaunchFn:
    """The primer's launchers on a GPU with ``provided.GPU_TILES``: vectors of 2^24
    elements; 4096 rows of ``d`` (softmax); ``4096 x 4096 x d`` (matmul); 4096 rows of 4096
    scores times V ``[4096, d]`` (online softmax, ``d`` = dv). Contiguous buffers."""

    def launch(lab: Lab, dtype: str, d: int) -> Launch:
        t, rows, p = _need(lab).GPU_TILES, 4096, Ptr(dtype)
        args: dict[str, Any] = {
            "_add_vectors_kernel": {"X": p, "Y": p, "Out": p, "n": 1 << 24, "BLOCK": t["block"]},
            "_softmax_rows_kernel": {"X": p, "Out": p, "n": d, "stride_xm": d, "stride_xn": 1,
                                     "stride_om": d, "stride_on": 1, "BLOCK_N": dot_tile(d)},
            "_matmul_kernel": {"A": p, "B": p, "Out": p, "m": rows, "n": rows, "k": d,
                               "stride_am": d, "stride_ak": 1, "stride_bk": rows,
                               "stride_bn": 1, "stride_om": rows, "stride_on": 1,
                               "BLOCK_M": t["block_m"], "BLOCK_N": t["block_n"],
                               "BLOCK_K": t["block_k"], "DOT_PRECISION": _precision(dtype)},
            "_online_softmax_kernel": {"S": p, "V": p, "Out": p, "Lse": Ptr("fp32"), "m": rows,
                                       "n": rows, "dv": d, "stride_sm": rows, "stride_sn": 1,
                                       "stride_vn": d, "stride_vd": 1, "stride_om": d,
                                       "stride_od": 1, "BLOCK_M": t["block_m"],
                                       "BLOCK_N": t["block_n"], "DV_PAD": dot_tile(d),
                                       "DOT_PRECISION": _precision(dtype)},
        }[kernel]  # fmt: skip
        return Launch(args, dict(_need(lab).GPU_LAUNCH))

    return launch


# ---- the launch plans at the bench shapes (bf16, the bench head dim) --------------------------


def _kv_stage(block_n: int, d: int = 128, dv: int | None = None) -> int:
    """bf16 bytes of one K and one V tile of ``block_n`` keys."""
    return block_n * (d + (dv or d)) * 2


def _at(plan: Plan, grid: tuple[int, ...], stage_bytes: int) -> Plan:
    return replace(plan, grid=grid, notes={**plan.notes, "stage_bytes": stage_bytes})


def forward_plan(t: Target) -> Plan:
    """Lab 00 at b1 h32 L16k d128: grid ``(L / block_m, B * H)``, a K/V tile per stage."""
    p = lp.flash_forward(128, t)
    return _at(p, (BWD_LEN // p.tiles["block_m"], BWD_HEADS), _kv_stage(p.tiles["block_n"]))


def backward_plan(kernel: str) -> PlanFn:
    """Lab 05 at b1 h32 L16k d128: dK/dV streams Q and dO tiles (grid ``(L / block_n, H)``),
    dQ streams K and V (grid ``(L / block_m, H)``), the preprocess O and dO rows."""

    def plan(t: Target) -> Plan:
        p = lp.flash_backward(128, t)
        bm, bn = p.tiles["block_m"], p.tiles["block_n"]
        if kernel == "dkdv":
            return _at(p, (BWD_LEN // bn, BWD_HEADS), _kv_stage(bm))
        return _at(p, (BWD_LEN // bm, BWD_HEADS), _kv_stage(bn if kernel == "dq" else bm))

    return plan


def paged_plan(heads: int, kv_heads: int) -> PlanFn:
    """Lab 01 at b64 ctx4k d128: one CTA per (sequence, KV head)."""
    return lambda t: _at(p := lp.paged_decode(64, kv_heads, heads // kv_heads, 128, t), p.grid,
                         _kv_stage(p.tiles["block_n"]))  # fmt: skip


def prefill_plan(heads: int, kv_heads: int) -> PlanFn:
    """Lab 03 at 8 x 2k tokens d128: grid ``(T // BLOCK_Q + B, KVH)``."""
    return lambda t: _at(
        p := lp.varlen_prefill(16384, 8, kv_heads, heads // kv_heads, 128, t), p.grid,
        _kv_stage(p.tiles["block_n"]))  # fmt: skip


def split_partition_plan(num_segments: int | None) -> PlanFn:
    """Lab 04's partition kernel at b1 64k: the plan's splits, or a fixed segment count
    (``tiles["segment"]``: the keys a segment holds, what that kernel runs)."""

    def plan(t: Target) -> Plan:
        p = split_plan(t)
        stage = _kv_stage(p.tiles["block_n"])
        if not num_segments:
            return _at(p, (p.splits, 8), stage)
        seg = -(-SPLIT_CONTEXT // (num_segments * 16)) * 16
        tiles = {"block_n": 16, "block_p": 16, "segment": seg}
        return _at(replace(p, splits=num_segments, tiles=tiles, model={}), (num_segments, 8),
                   stage)  # fmt: skip

    return plan


def _partial_row(dv: int = 128, elem: int = 4) -> int:
    """Bytes of one partial of one head: its output (fp32 in lab 04) and its lse."""
    return dv * elem + 4


def split_work(num_segments: int | None) -> WorkFn:
    """The partition kernel's own work at b1 64k gqa32/8: the call's minimum plus the
    partials it writes (32 heads x splits x ``_partial_row``)."""

    def work(t: Target) -> tuple[int, int]:
        flops, nbytes = _bench_work("split")
        splits = num_segments or split_plan(t).splits
        return flops, nbytes + (32 * splits * _partial_row() if splits > 1 else 0)

    return work


def merge_plan(t: Target) -> Plan:
    """Lab 04's merge kernel: one CTA per (sequence, head), ``block_p`` fp32 partials a step."""
    p = split_plan(t)
    return _at(replace(p, num_warps=4, num_stages=3, model={}), (1, 32),
               p.tiles["block_p"] * 128 * 4)  # fmt: skip


def merge_work(t: Target) -> tuple[int, int]:
    """The merge kernel's own work: read every partial once, write out and lse (bf16 out)."""
    splits = split_plan(t).splits
    return 3 * 32 * splits * 128, 32 * splits * _partial_row() + 32 * (128 * 2 + 4)


def preprocess_work(t: Target) -> tuple[int, int]:
    """``Delta = rowsum(dO * O)`` at b1 h32 L16k d128: read O and dO (bf16), write Delta
    (fp32); a multiply-add per element."""
    elems = BWD_HEADS * BWD_LEN * 128
    return 2 * elems, 2 * elems * 2 + BWD_HEADS * BWD_LEN * 4


def group32_work(t: Target) -> tuple[int, int]:
    """Lab 01 at b64 ctx4k with 32 query heads on ONE KV head: its own K/V bytes."""
    from bench.counts import attention_work

    w = attention_work((1,) * 64, (4096,) * 64, heads=32, kv_heads=1, head_dim=128,
                       elem_bytes=2, causal=True, block_size=16, meta_per_seq=1)  # fmt: skip
    return w.flops, w.bytes


def _bench_work(bench: str, shape: str = "") -> tuple[int, int]:
    """``(FLOPs, bytes)`` of a bench entry's shape (default: its first target shape), bf16."""
    from bench.kernels import by_name

    spec = by_name(bench)
    s = next((x for x in spec.gpu if x.name == shape), None) or next(
        (x for x in spec.gpu if x.targets), spec.gpu[0])
    w = spec.workload.count(s, elem_bytes=2)
    return w.flops, w.bytes


def window_plan(heads: int, kv_heads: int, d: int, window: int | None) -> PlanFn:
    """Lab 06's window decode at b64 ctx4k."""
    return lambda t: _at(
        p := lp.window_decode(64, kv_heads, heads // kv_heads, d, 4096, window, t), p.grid,
        _kv_stage(p.tiles["block_n"], d))  # fmt: skip


def mla_plan(heads: int, batch: int = 64, context: int = 4096) -> PlanFn:
    """Lab 06's MLA decode at b64 ctx4k (default), d_c 512 + 64 rotary dims: one latent row
    per key."""
    return lambda t: _at(p := lp.mla_decode(batch, heads, 512, context, t), p.grid,
                         p.tiles["block_n"] * (512 + MLA_ROPE_DIM) * 2)  # fmt: skip


# ---- the table ------------------------------------------------------------------------------

LAB00 = "lab-00-online-softmax"
LAB01 = "lab-01-paged-attention-gather"
LAB03 = "lab-03-causal-prefill-attention"
LAB04 = "lab-04-flash-decoding-partitions"
LAB05 = "lab-05-flash-attention-backward"
LAB06 = "lab-06-mla-window-sinks"
LAB09 = "lab-09-triton-primer"
LAB12 = "lab-12-fp8-kv-and-cascade"
WIDE = {"dtypes": ("bf16",), "head_dims": (128,)}  # extra configs: the bench dtype and d only

GPU_KERNELS: tuple[GpuKernel, ...] = (
    GpuKernel(LAB00, "_flash_attn_fwd_kernel", "non-causal", flash_forward(False), "flash",
              "prefill mha b1 L16k d128 non-causal", plan=forward_plan),
    GpuKernel(LAB00, "_flash_attn_fwd_kernel", "causal", flash_forward(True), "flash",
              "prefill mha b1 L16k d128 causal", plan=forward_plan),
    GpuKernel(LAB01, "_paged_decode_kernel", "gqa32/8", paged_decode(32, 8), "decode",
              plan=paged_plan(32, 8)),
    GpuKernel(LAB01, "_paged_decode_kernel", "group 32", paged_decode(32, 1), "decode", **WIDE,
              plan=paged_plan(32, 1), role="comparison", work=group32_work),
    GpuKernel(LAB03, "_varlen_prefill_kernel", "gqa32/8", varlen_prefill(32, 8), "varlen",
              plan=prefill_plan(32, 8)),
    GpuKernel(LAB03, "_varlen_prefill_kernel", "group 32", varlen_prefill(32, 1), "varlen",
              **WIDE, plan=prefill_plan(32, 1)),  # fmt: skip
    GpuKernel(LAB04, "_split_kv_partition_kernel", "16 segments", split_partition(16), "split",
              plan=split_partition_plan(16), role="comparison", work=split_work(16)),
    GpuKernel(LAB04, "_split_kv_partition_kernel", "planned split", split_partition(None),
              "split", plan=split_partition_plan(None), work=split_work(None)),  # fmt: skip
    GpuKernel(LAB04, "_merge_partitions_kernel", "planned split", merge_partitions(None),
              "split", plan=merge_plan, role="helper", work=merge_work),
    GpuKernel(LAB05, "_bwd_preprocess_kernel", "Delta", bwd_preprocess, "backward",
              "prefill mha b1 L16k d128 causal", plan=backward_plan("pre"), role="helper",
              work=preprocess_work),
    GpuKernel(LAB05, "_bwd_dkdv_kernel", "non-causal", flash_bwd("dkdv", False), "backward",
              "prefill mha b1 L16k d128 non-causal", plan=backward_plan("dkdv")),
    GpuKernel(LAB05, "_bwd_dkdv_kernel", "causal", flash_bwd("dkdv", True), "backward",
              "prefill mha b1 L16k d128 causal", plan=backward_plan("dkdv")),
    GpuKernel(LAB05, "_bwd_dq_kernel", "non-causal", flash_bwd("dq", False), "backward",
              "prefill mha b1 L16k d128 non-causal", plan=backward_plan("dq")),
    GpuKernel(LAB05, "_bwd_dq_kernel", "causal", flash_bwd("dq", True), "backward",
              "prefill mha b1 L16k d128 causal", plan=backward_plan("dq")),
    GpuKernel(LAB06, "_window_sink_decode_kernel", "gqa64/8 window 128 + sinks",
              window_sink_decode(64, 8, True), "window", "decode gqa64/8 b64 ctx4k d64 window128",
              summary_head_dim=64, plan=window_plan(64, 8, 64, WINDOW)),
    GpuKernel(LAB06, "_window_sink_decode_kernel", "gqa32/8 no window, no sinks",
              window_sink_decode(32, 8, False), "window", "decode gqa32/8 b64 ctx4k d128",
              plan=window_plan(32, 8, 128, None)),
    GpuKernel(LAB06, "_mla_decode_kernel", "128 heads", mla_decode(128), "mla",
              "decode mla128 b64 ctx4k d512+64", head_dims=(512,), plan=mla_plan(128)),
    GpuKernel(LAB06, "_mla_decode_kernel", "16 heads (TP8)", mla_decode(16), "mla",
              "decode mla16 b64 ctx4k d512+64", dtypes=("bf16",), head_dims=(512,),
              plan=mla_plan(16)),
    GpuKernel(LAB06, "_mla_decode_kernel", "128 heads, batch 1", mla_decode(128, 1, 65536),
              "mla", "decode mla128 b1 ctx64k d512+64", dtypes=("bf16",), head_dims=(512,),
              plan=mla_plan(128, 1, 65536)),
)

# Head dim 256 (Gemma-like): each main kernel at the plan's d = 256 tiles, bf16, compiled and
# checked (shared memory within every arch's limit), not judged at a bench shape.
D256 = {"dtypes": ("bf16",), "head_dims": (256,), "role": "comparison"}
GPU_KERNELS += (
    GpuKernel(LAB00, "_flash_attn_fwd_kernel", "causal, d256", flash_forward(True), **D256),
    GpuKernel(LAB01, "_paged_decode_kernel", "gqa32/8, d256", paged_decode(32, 8), **D256),
    GpuKernel(LAB03, "_varlen_prefill_kernel", "gqa32/8, d256", varlen_prefill(32, 8), **D256),
    GpuKernel(LAB04, "_split_kv_partition_kernel", "planned split, d256", split_partition(None),
              **D256),
    GpuKernel(LAB05, "_bwd_dkdv_kernel", "causal, d256", flash_bwd("dkdv", True), **D256),
    GpuKernel(LAB05, "_bwd_dq_kernel", "causal, d256", flash_bwd("dq", True), **D256),
    GpuKernel(LAB06, "_window_sink_decode_kernel", "gqa32/8 no window, no sinks, d256",
              window_sink_decode(32, 8, False), **D256),
)

# lab-09's kernels, fp16 (float32 tl.dot in "ieee" precision has no tensor-core instruction)
PRIMER_CONFIGS = {"_add_vectors_kernel": "n 2^24", "_softmax_rows_kernel": "4096 rows of d",
                  "_matmul_kernel": "4096 x 4096 x d", "_online_softmax_kernel": "4096 x 4096 @ V"}
GPU_KERNELS += tuple(GpuKernel(LAB09, k, c, primer(k), dtypes=("fp16",), head_dims=(128,))
                     for k, c in PRIMER_CONFIGS.items())  # fmt: skip

# lab-12's fp8-cache decode: per-tensor and per-token-head scales (no bench entry, no plan
# judged: the launch plan's stage bytes are bf16's). sm_90 and sm_100 only: Triton 3.7.1
# offers tl.float8e4nv from compute capability 8.9 (backends/nvidia/compiler.py adds
# "fp8e4nv" to supported_fp8_dtypes only when capability >= 89), so sm_80/86 cannot compile
# the e4m3 bitcast; vLLM reads an fp8 cache there through its own conversion code.
FP8_ARCHS = tuple(a for a in ARCHS if a >= 89)
GPU_KERNELS += (
    GpuKernel(LAB12, "_paged_decode_fp8_kernel", "gqa32/8 per-tensor",
              paged_decode_fp8(32, 8, False), archs=FP8_ARCHS),
    GpuKernel(LAB12, "_paged_decode_fp8_kernel", "gqa32/8 per-token-head",
              paged_decode_fp8(32, 8, True), archs=FP8_ARCHS, **WIDE),
)
