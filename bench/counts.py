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

A sliding window of ``w`` tokens (lab 06) lets query position ``p`` attend keys
``p-w+1 .. p`` only: pairs and K/V bytes count just those (``attention_work(window=w)``).
The backward (lab 05, ``backward_work``) and MLA decode (lab 06, ``mla_decode_work``) have
their own counts, stated in their docstrings.
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


def _window_prefix(x: int, w: int) -> int:
    """``sum(min(w, p + 1) for p in range(x))``: keys seen by queries 0..x-1 (causal, window w)."""
    return x * (x + 1) // 2 if x <= w else w * (w + 1) // 2 + (x - w) * w


def attended_pairs(
    q_lens: Sequence[int], seq_lens: Sequence[int], causal: bool, window: int | None = None
) -> int:
    """(query, key) pairs that take part, summed over sequences (bottom-right causal; with
    ``window``, query position p sees keys ``p-window+1 .. p``)."""
    if len(q_lens) != len(seq_lens):
        raise ValueError(f"q_lens has {len(q_lens)} entries but seq_lens has {len(seq_lens)}")
    total = 0
    for q, n in zip(q_lens, seq_lens):
        q, n = int(q), int(n)
        if not 0 <= q <= n:
            raise ValueError(f"need 0 <= query length <= context length, got q={q}, n={n}")
        if window is not None:
            total += _window_prefix(n, window) - _window_prefix(n - q, window)
        else:
            total += q * (n - q) + q * (q + 1) // 2 if causal else q * n
    return total


def keys_read(q_len: int, seq_len: int, window: int | None) -> tuple[int, int]:
    """``(first, end)``: the cached positions some query of the chunk attends (all of them
    without a window; the last ``q_len + window - 1`` with one)."""
    first = 0 if window is None else max(0, seq_len - q_len - window + 1)
    return first, seq_len


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
    window: int | None = None,
) -> Work:
    """The work of one attention call over a batch (dense, paged, varlen or decode).

    ``block_size`` set means a paged cache: count the block-table entries a correct kernel
    reads (``ceil(seq_len / block_size)`` int32 each; with a window, the blocks the window
    touches). ``meta_per_seq`` adds further int32 words per sequence (seq_lens,
    query_start_loc). ``window``: a sliding window of that many tokens (None: none).
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    pairs = attended_pairs(q_lens, seq_lens, causal, window)
    total_q = sum(int(q) for q in q_lens)
    spans = [keys_read(int(q), int(n), window) for q, n in zip(q_lens, seq_lens)]
    total_kv = sum(end - first for first, end in spans)
    meta = 4 * meta_per_seq * len(seq_lens)
    if block_size is not None:
        meta += 4 * sum((end - 1) // block_size - first // block_size + 1
                        for first, end in spans if end > first)  # fmt: skip
    return Work(
        flops=2 * (head_dim + dv) * heads * pairs,
        kv_bytes=total_kv * kv_heads * (head_dim + dv) * elem_bytes,
        q_bytes=total_q * heads * head_dim * elem_bytes,
        out_bytes=total_q * heads * dv * elem_bytes,
        meta_bytes=meta,
    )


def backward_work(
    lens: Sequence[int], *, heads: int, kv_heads: int, head_dim: int, elem_bytes: int,
    causal: bool,
) -> Work:
    """The work of the FlashAttention backward (lab 05) over dense sequences of ``lens``.

    FLOPs: five matmuls per attended (query, key, head) pair instead of the forward's two:
    ``S = Q Kᵀ`` again (2d), ``dV += Pᵀ dO`` (2d), ``dP = dO Vᵀ`` (2d), ``dQ = dS K`` (2d),
    ``dK = dSᵀ Q`` (2d): ``10*d*H*pairs``, 2.5x the forward's ``4*d*H*pairs``
    (FlashAttention-2's convention). The elementwise softmax work is not counted.
    Bytes, each once: read q, k, v, o, dO (``elem_bytes``) and lse (float32), write dq, dk,
    dv. ``kv_bytes`` holds k, v, dk, dv; ``q_bytes`` q, o, dO; ``out_bytes`` dq;
    ``meta_bytes`` lse. The kernel's own Delta (float32, written and read once) is not
    counted: a kernel could fold it into the dQ pass.
    """
    fwd = attention_work(lens, lens, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         elem_bytes=elem_bytes, causal=causal)  # fmt: skip
    total = sum(int(n) for n in lens)
    return Work(
        flops=fwd.flops * 5 // 2,
        kv_bytes=2 * fwd.kv_bytes,
        q_bytes=3 * fwd.q_bytes,
        out_bytes=fwd.q_bytes,
        meta_bytes=4 * total * heads,
    )


def mla_decode_work(
    seq_lens: Sequence[int], *, heads: int, kv_lora_rank: int, rope_dim: int, elem_bytes: int,
    block_size: int,
) -> Work:
    """The work of absorbed MLA decode (lab 06): one query token per sequence.

    A cached token is one latent row of ``d_c + d_rope`` values shared by every head (the
    key is the whole row, the value its first ``d_c``): read once per call, not once per
    head. FLOPs per (head, key): ``2*(d_c + d_rope)`` for the score and ``2*d_c`` for
    ``p · c``. Bytes: the latent rows, q_latent and q_pe, the latent output ``[B, H, d_c]``
    (``w_uv`` is applied outside the kernel, not counted), block-table entries in use and
    seq_lens.
    """
    d_qk = kv_lora_rank + rope_dim
    total_kv = sum(int(n) for n in seq_lens)
    batch = len(seq_lens)
    meta = 4 * batch + 4 * sum(-(-int(n) // block_size) for n in seq_lens)
    return Work(
        flops=2 * (d_qk + kv_lora_rank) * heads * total_kv,
        kv_bytes=total_kv * d_qk * elem_bytes,
        q_bytes=batch * heads * d_qk * elem_bytes,
        out_bytes=batch * heads * kv_lora_rank * elem_bytes,
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
