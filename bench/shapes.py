"""Benchmark shapes and the targets attached to them (the course targets in README.md).

Every workload is described the same way, the serving way: per sequence, ``q_len`` new
query tokens at the end of a context of ``seq_len`` tokens (cached + new). Dense prefill
is ``q_len == seq_len``; decode is ``q_len == 1``; chunked prefill is ``1 < q_len <
seq_len``. Causal masks are bottom-right aligned (query i of a chunk sees keys
``0 .. seq_len - q_len + i``), which for ``q_len == seq_len`` is the usual causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Target:
    """A performance goal of one shape, evaluated only on a real GPU run.

    kind:
      ``kv_GBps``      K/V bytes per second >= ``value`` GB/s on an H100 SXM; on another GPU
                       the same fraction of the measured copy roof (``value / 3000``).
      ``pct_of``       throughput >= ``value`` % of the row named ``ref`` (same run).
      ``speedup_over`` time of the row named ``ref`` / kernel time >= ``value``.
      ``merge_share``  time of the merge kernel <= ``value`` % of the whole call.
      ``pct_of_shape`` TFLOP/s >= ``value`` % of the kernel's TFLOP/s on shape ``ref``.
    """

    kind: str
    value: float
    text: str
    ref: str = ""


@dataclass(frozen=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    q_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    causal: bool = True
    block_size: int = 16
    note: str = ""
    targets: tuple[Target, ...] = field(default=())
    window: int | None = None  # sliding window in tokens (lab 06), None = the whole context
    rope_dim: int = 0  # MLA (lab 06): rotary key dims stored after the latent (head_dim = d_c)

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if len(self.q_lens) != len(self.seq_lens):
            raise ValueError(f"{self.name}: q_lens and seq_lens differ in length")

    @property
    def batch(self) -> int:
        return len(self.seq_lens)

    @property
    def uniform(self) -> bool:
        return len(set(self.q_lens)) == 1 and len(set(self.seq_lens)) == 1

    def as_dict(self) -> dict[str, Any]:
        lens = lambda xs: list(xs) if len(set(xs)) > 1 else {"all": xs[0], "count": len(xs)}
        return {
            "name": self.name,
            "batch": self.batch,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "q_lens": lens(self.q_lens),
            "seq_lens": lens(self.seq_lens),
            "causal": self.causal,
            "block_size": self.block_size,
            "window": self.window,
            "rope_dim": self.rope_dim,
            "note": self.note,
        }


def _heads(heads: int, kv_heads: int) -> str:
    return "mha" if heads == kv_heads else f"gqa{heads}/{kv_heads}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def decode(
    batch: int,
    ctx: int | tuple[int, int],
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    note: str = "",
    targets: tuple[Target, ...] = (),
    window: int | None = None,
) -> Shape:
    """One new token per sequence. ``ctx`` an int (all equal) or ``(lo, hi)`` (mixed);
    ``window``: a sliding window of that many tokens (the name ends ``window<n>``)."""
    if isinstance(ctx, tuple):
        lo, hi = ctx
        seq_lens = tuple(int(n) for n in np.random.default_rng(0).integers(lo, hi + 1, batch))
        ctx_name = f"ctx{_k(lo)}-{_k(hi)}"
    else:
        seq_lens = (ctx,) * batch
        ctx_name = f"ctx{_k(ctx)}"
    return Shape(
        f"decode {_heads(heads, kv_heads)} b{batch} {ctx_name} d{head_dim}"
        + (f" window{window}" if window else ""),
        heads, kv_heads, head_dim, (1,) * batch, seq_lens, True, block_size, note, targets,
        window,
    )  # fmt: skip


def mla_decode(
    batch: int, ctx: int, heads: int = 128, kv_lora_rank: int = 512, rope_dim: int = 64,
    note: str = "", targets: tuple[Target, ...] = (),
) -> Shape:
    """MLA decode over a latent cache: one ``[d_c + d_rope]`` row per token shared by every
    head (``kv_heads = 1``, ``head_dim = d_c``); named ``d512+64``."""
    return Shape(
        f"decode mla{heads} b{batch} ctx{_k(ctx)} d{kv_lora_rank}+{rope_dim}",
        heads, 1, kv_lora_rank, (1,) * batch, (ctx,) * batch, True, 16, note, targets,
        None, rope_dim,
    )  # fmt: skip


def prefill(
    batch: int,
    length: int,
    heads: int = 32,
    head_dim: int = 128,
    causal: bool = True,
    kv_heads: int | None = None,
    note: str = "",
    targets: tuple[Target, ...] = (),
) -> Shape:
    """Dense prefill: every sequence ``length`` tokens, no cache."""
    kvh = heads if kv_heads is None else kv_heads
    mask = "causal" if causal else "non-causal"
    return Shape(
        f"prefill {_heads(heads, kvh)} b{batch} L{_k(length)} d{head_dim} {mask}",
        heads, kvh, head_dim, (length,) * batch, (length,) * batch, causal, 16, note, targets,
    )  # fmt: skip


def varlen(
    name: str,
    q_lens: tuple[int, ...],
    seq_lens: tuple[int, ...],
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    note: str = "",
    targets: tuple[Target, ...] = (),
) -> Shape:
    """A serving batch: ``q_lens[b]`` new tokens at the end of ``seq_lens[b]`` of context."""
    return Shape(
        f"varlen {_heads(heads, kv_heads)} {name} d{head_dim}",
        heads, kv_heads, head_dim, tuple(q_lens), tuple(seq_lens), True, block_size, note,
        targets,
    )  # fmt: skip
