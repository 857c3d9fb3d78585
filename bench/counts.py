"""Honest work counts: the FLOPs and bytes an attention call *needs*, not what a kernel does.

A kernel earns credit only for the minimum work of the answer. Reading a KV head once per
query head (no GQA packing), re-reading K/V for each split, writing and re-reading partial
results, padding a partial last block: all of that costs time and earns no bytes here.

FLOPs (multiply-add = 2 FLOPs):
    QK^T costs 2*d and PV costs 2*dv per (query, attended key, head), so
    ``flops = 2 * (d + dv) * H * attended``  (= 4*d*H*attended when dv == d)
    where ``attended`` is the number of (query, key) pairs the mask lets through, summed
    over the batch. Causal counts only the attended keys: a chunk of ``q`` queries ending at
    context length ``n`` (bottom-right alignment, queries at positions n-q .. n-1) attends
    ``q*(n-q) + q*(q+1)/2`` keys; for ``q == n`` that is ``n*(n+1)/2``, the tutorial's
    ``n^2/2`` plus the diagonal (0.006 % more at 16k).

Bytes (the minimum traffic to and from memory):
    queries ``T_q*H*d``, output ``T_q*H*dv``, each cached token's K and V once per KV head
    ``sum(seq_lens)*KVH*(d+dv)``, all times the element size, plus the int32 metadata a
    paged kernel must read (the block-table entries in use, seq_lens, query_start_loc).
    For decode the K/V term dominates (99.9 % at 4k context); the DESIGN targets are stated
    in K/V bytes, so ``kv_bytes`` is recorded separately and targets use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Work:
    """What one call must do. ``bytes`` = ``kv_bytes + q_bytes + out_bytes + meta_bytes``."""

    flops: int
    kv_bytes: int
    q_bytes: int
    out_bytes: int
    meta_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.q_bytes + self.out_bytes + self.meta_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte (the x axis of a roofline)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def as_dict(self) -> dict[str, int | float]:
        return {**asdict(self), "bytes": self.bytes, "flop_per_byte": self.intensity}


def attended_pairs(q_lens: Sequence[int], seq_lens: Sequence[int], causal: bool) -> int:
    """(query, key) pairs that take part, summed over sequences (bottom-right causal)."""
    if len(q_lens) != len(seq_lens):
        raise ValueError(f"q_lens has {len(q_lens)} entries but seq_lens has {len(seq_lens)}")
    total = 0
    for q, n in zip(q_lens, seq_lens):
        q, n = int(q), int(n)
        if not 0 <= q <= n:
            raise ValueError(f"need 0 <= query length <= context length, got q={q}, n={n}")
        total += q * (n - q) + q * (q + 1) // 2 if causal else q * n
    return total


def attention_work(
    q_lens: Sequence[int],
    seq_lens: Sequence[int],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    elem_bytes: int,
    causal: bool,
    head_dim_v: int | None = None,
    block_size: int | None = None,
    meta_per_seq: int = 0,
) -> Work:
    """The work of one attention call over a batch (dense, paged, varlen or decode).

    ``block_size`` set means a paged cache: count the block-table entries a correct kernel
    reads (``ceil(seq_len / block_size)`` int32 each). ``meta_per_seq`` adds further int32
    words per sequence (seq_lens, query_start_loc).
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    pairs = attended_pairs(q_lens, seq_lens, causal)
    total_q = sum(int(q) for q in q_lens)
    total_kv = sum(int(n) for n in seq_lens)
    meta = 4 * meta_per_seq * len(seq_lens)
    if block_size is not None:
        meta += 4 * sum(-(-int(n) // block_size) for n in seq_lens)
    return Work(
        flops=2 * (head_dim + dv) * heads * pairs,
        kv_bytes=total_kv * kv_heads * (head_dim + dv) * elem_bytes,
        q_bytes=total_q * heads * head_dim * elem_bytes,
        out_bytes=total_q * heads * dv * elem_bytes,
        meta_bytes=meta,
    )


def rate(work: Work, ms: float) -> dict[str, float]:
    """Achieved GB/s (all bytes, and K/V bytes only) and TFLOP/s for a time in ms."""
    if ms <= 0:
        raise ValueError(f"time must be positive, got {ms} ms")
    return {
        "GBps": work.bytes / ms / 1e6,
        "kv_GBps": work.kv_bytes / ms / 1e6,
        "TFLOPs": work.flops / ms / 1e9,
    }


# The H100 SXM5 datasheet figures (NVIDIA): 3.35 TB/s of HBM3, 989 dense bf16 TFLOP/s.
H100_TBPS = 3.35
H100_TFLOPS = 989.0


def lower_bound_ms(
    work: Work, tbps: float = H100_TBPS, tflops: float = H100_TFLOPS
) -> tuple[float, str]:
    """``(ms, roof)``: no kernel can beat moving ``work.bytes`` at ``tbps`` TB/s nor doing
    ``work.flops`` at ``tflops`` TFLOP/s; ``roof`` names the one that binds (``memory`` or
    ``compute``). On an H100 by default: what a kernel would have to reach."""
    memory_ms = work.bytes / (tbps * 1e12) * 1e3
    compute_ms = work.flops / (tflops * 1e12) * 1e3
    return (memory_ms, "memory") if memory_ms >= compute_ms else (compute_ms, "compute")
