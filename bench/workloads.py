"""Inputs, a spot-check reference and the baselines for each calling convention.

Three conventions cover the labs' Triton kernels (each lab README's "Contract" section):

* ``DenseWorkload``  ``fn(q, k, v, causal=...)`` on ``[B, H, L, d]`` (lab-00).
* ``PagedDecodeWorkload``  ``fn(q, k_cache, v_cache, block_tables, seq_lens, ...)`` with q
  ``[B, H, d]`` (lab-01; lab-04 adds ``partition_size``).
* ``VarlenWorkload``  ``fn(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)``
  with q ``[total_q, H, d]`` (lab-03).
* ``BackwardWorkload``  ``fn(q, k, v, o, lse, do, causal=...)`` -> ``(dq, dk, dv)`` (lab-05).
* ``WindowSinkDecodeWorkload``  paged decode plus ``window=`` and ``sinks=`` (lab-06).
* ``MLADecodeWorkload``  ``fn(q_latent, q_pe, kv_cache, block_tables, seq_lens)`` over a
  latent cache ``[num_blocks, block_size, d_c + d_rope]`` (lab-06).

Paged caches are NHD ``[num_blocks, block_size, KVH, d]`` with shuffled physical blocks.
Baselines run in the same process on the same tensors: every PyTorch SDPA backend forced
one at a time with ``torch.nn.attention.sdpa_kernel`` (a backend that refuses the inputs is
reported with torch's reason, not hidden), and a plain eager torch implementation. Every
baseline's output is checked against the same reference as the kernel's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bench.counts import Work, attention_work, backward_work, mla_decode_work
from bench.shapes import Shape

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def sdpa_backend(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


@dataclass
class Baseline:
    """A competitor timed on the same inputs. ``fn`` is what is timed; ``canon`` (untimed)
    turns its output into the kernel's layout for the correctness check."""

    name: str
    fn: Callable[[], Any]
    canon: Callable[[Any], torch.Tensor]
    kind: str  # "sdpa" or "torch"
    note: str = ""
    backend: str | None = None  # an SDPA backend forced with sdpa_kernel while timing
    skip: str | None = None  # a reason not to try (e.g. it would materialise 40 GiB)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        if self.backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel([sdpa_backend(self.backend)])


def torch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    positions: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain attention. q ``[N, H, Lq, d]``, k/v ``[N, KVH, Lk, d]`` -> ``[N, H, Lq, dv]``.

    GQA without copying K/V: query head ``h`` reads KV head ``h // (H // KVH)``.
    ``positions [Lq]``: query i may attend keys ``j <= positions[i]`` (None: all keys).
    ``key_mask [N, Lk]`` bool: keys that exist (for padded, mixed-length batches).
    Scores and softmax in float32, the products in the input dtype.
    """
    n, h, lq, d = q.shape
    kvh, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = h // kvh
    s = torch.matmul(q.reshape(n, kvh, g * lq, d), k.transpose(-1, -2))
    s = s.to(torch.promote_types(s.dtype, torch.float32)) * scale  # float32 at least
    s = s.view(n, kvh, g, lq, lk)
    if positions is not None:  # in place: s is our own tensor, and it can be GiBs
        keys = torch.arange(lk, device=q.device)
        s.masked_fill_(keys[None, :] > positions[:, None], float("-inf"))
    if key_mask is not None:
        s.masked_fill_(~key_mask[:, None, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(v.dtype).view(n, kvh, g * lq, lk)
    return torch.matmul(p, v).view(n, kvh, g, lq, dv).reshape(n, h, lq, dv)


def gather_dense(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of every sequence, dense: ``[B, KVH, length, d]``.

    A copy (advanced indexing) of ``ceil(length / block_size)`` blocks per sequence,
    returned as a transposed view (last dim contiguous, which SDPA accepts).
    """
    block_size = cache.shape[1]
    nblk = -(-length // block_size)
    blocks = cache[block_tables[:, :nblk]]  # [B, nblk, block_size, KVH, d]
    return blocks.flatten(1, 2)[:, :length].transpose(1, 2)


def build_paged(
    seq_lens: tuple[int, ...],
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V caches ``[num_blocks, block_size, KVH, d]`` and shuffled block tables.

    One spare block is left unreferenced; table padding points at it (a valid block, so
    an over-reading kernel gets a wrong answer, not a crash that ends the whole run).
    """
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + 1
    physical = torch.randperm(num_blocks)
    tables = torch.full((len(seq_lens), max(max(per_seq), 1)), int(physical[-1]))
    cursor = 0
    for b, nb in enumerate(per_seq):
        tables[b, :nb] = physical[cursor : cursor + nb]
        cursor += nb
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    return k_cache, v_cache, tables.to(device=device, dtype=torch.int32)


def memory_limit(device: str) -> int:
    """Bytes a baseline may materialise: half the free GPU memory; 2 GiB on the CPU."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return free // 2
    return 2 * 2**30


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"


class Workload:
    """Tensors for one shape plus what the runner needs around the kernel call."""

    roof = "compute"  # which roof the kernel is judged against: "compute" or "bandwidth"
    paged = False

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.scale = 1.0 / math.sqrt(shape.head_dim + shape.rope_dim)
        self.gqa = shape.heads != shape.kv_heads
        self.work: Work = self.count(shape, torch.empty((), dtype=dtype).element_size())

    meta_per_seq = 0
    work_note = ""

    @classmethod
    def count(cls, shape: Shape, elem_bytes: int) -> Work:
        """The minimum work of one call at ``shape`` (``bench.counts``); the GPU report's
        lower bounds come from here too."""
        return attention_work(
            shape.q_lens, shape.seq_lens, heads=shape.heads, kv_heads=shape.kv_heads,
            head_dim=shape.head_dim, elem_bytes=elem_bytes, causal=shape.causal,
            block_size=shape.block_size if cls.paged else None, meta_per_seq=cls.meta_per_seq,
            window=shape.window,
        )  # fmt: skip

    # -- the kernel ------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def output(result: Any) -> torch.Tensor:
        """A kernel may return ``out`` or ``(out, lse)``: the output tensor."""
        return result[0] if isinstance(result, (tuple, list)) else result

    # -- correctness -----------------------------------------------------------------
    def sequence(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Dense ``(q [q_len, H, d], k [seq_len, KVH, d], v)`` of sequence ``b``."""
        raise NotImplementedError

    def rows_of(self, out: torch.Tensor, b: int) -> torch.Tensor:
        """Sequence ``b``'s rows ``[q_len, H, dv]`` of an output in the kernel's layout."""
        raise NotImplementedError

    def check(self, out: torch.Tensor) -> float:
        """Max |out - reference| over a spot check: the first, last and longest sequence,
        their first and last 32 queries, every head (float32 reference)."""
        lens = self.shape.seq_lens
        picks = sorted({0, len(lens) - 1, max(range(len(lens)), key=lens.__getitem__)})
        worst = 0.0
        for b in picks:
            q, k, v = self.sequence(b)
            q_len, n = q.shape[0], k.shape[0]
            rows = torch.arange(q_len, device=q.device)
            if q_len > 64:
                rows = torch.cat([rows[:32], rows[-32:]])
            positions = (n - q_len + rows) if self.shape.causal else None
            ref = torch_attention(
                q[rows].float().transpose(0, 1)[None],
                k.float().transpose(0, 1)[None],
                v.float().transpose(0, 1)[None],
                self.scale,
                positions=positions,
            )[0].transpose(0, 1)
            got = self.rows_of(out, b)[rows].float()
            if got.shape != ref.shape:
                raise ValueError(f"output rows have shape {tuple(got.shape)}, want {ref.shape}")
            if not torch.isfinite(got).all():
                return float("inf")
            worst = max(worst, float((got - ref).abs().max()))
        return worst

    # -- baselines -------------------------------------------------------------------
    def baselines(self) -> list[Baseline]:
        return []

    def followups(self, fastest_sdpa: str | None) -> list[Baseline]:
        """Baselines that depend on which SDPA backend won (decode: gather included)."""
        return []

    def _math_guard(self, score_elems: int) -> str | None:
        need = score_elems * 12  # fp32 scores + fp32 probabilities + the product's input
        limit = memory_limit(self.device)
        if need > limit:
            return f"would materialise ~{_gib(need)} of scores (limit {_gib(limit)})"
        return None

    def _sdpa_baselines(
        self,
        run: Callable[[], Any],
        canon: Callable[[Any], torch.Tensor],
        score_elems: int,
        suffix: str = "",
        note: str = "",
    ) -> list[Baseline]:
        out = []
        for backend in SDPA_BACKENDS:
            skip = self._math_guard(score_elems) if backend == "math" else None
            out.append(
                Baseline(f"sdpa[{backend}]{suffix}", run, canon, "sdpa", note, backend, skip)
            )
        return out


class DenseWorkload(Workload):
    """``fn(q, k, v, causal=...)`` with q ``[B, H, L, d]``, k/v ``[B, KVH, L, d]``."""

    work_note = "FLOPs = 4*d*H*(attended (q,k) pairs); bytes = q + k + v + out, once each"

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        super().__init__(shape, dtype, device)
        if not shape.uniform or shape.q_lens[0] != shape.seq_lens[0]:
            raise ValueError(f"{shape.name}: dense prefill needs q_len == seq_len for all")
        b, h, kvh, n, d = (
            shape.batch,
            shape.heads,
            shape.kv_heads,
            shape.seq_lens[0],
            shape.head_dim,
        )
        self.q = torch.randn(b, h, n, d, dtype=dtype, device=device)
        self.k = torch.randn(b, kvh, n, d, dtype=dtype, device=device)
        self.v = torch.randn(b, kvh, n, d, dtype=dtype, device=device)

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return fn(self.q, self.k, self.v, causal=self.shape.causal, **kwargs)

    def sequence(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q[b].transpose(0, 1), self.k[b].transpose(0, 1), self.v[b].transpose(0, 1)

    def rows_of(self, out: torch.Tensor, b: int) -> torch.Tensor:
        return out[b].transpose(0, 1)

    def baselines(self) -> list[Baseline]:
        q, k, v, causal = self.q, self.k, self.v, self.shape.causal
        gqa = {"enable_gqa": True} if self.gqa else {}
        n = q.shape[2]
        positions = torch.arange(n, device=self.device) if causal else None
        scores = q.shape[0] * q.shape[1] * n * n
        out = self._sdpa_baselines(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa),
            lambda o: o,
            scores,
        )
        out.append(
            Baseline(
                "torch eager (matmul, fp32 softmax, matmul)",
                lambda: torch_attention(q, k, v, self.scale, positions=positions),
                lambda o: o,
                "torch",
                skip=self._math_guard(scores),
            )
        )
        return out


class _PagedWorkload(Workload):
    paged = True

    def _build_cache(self) -> None:
        s = self.shape
        self.k_cache, self.v_cache, self.block_tables = build_paged(
            s.seq_lens, s.kv_heads, s.head_dim, s.block_size, self.dtype, self.device
        )
        self.seq_lens = torch.tensor(s.seq_lens, dtype=torch.int32, device=self.device)
        self._tables_long = self.block_tables.long()  # indexing wants int64; made once

    def _seq_kv(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.shape.seq_lens[b]
        k = gather_dense(self.k_cache, self._tables_long[b : b + 1], n)[0].transpose(0, 1)
        v = gather_dense(self.v_cache, self._tables_long[b : b + 1], n)[0].transpose(0, 1)
        return k, v


class PagedDecodeWorkload(_PagedWorkload):
    """``fn(q, k_cache, v_cache, block_tables, seq_lens, **kw)`` with q ``[B, H, d]``."""

    roof = "bandwidth"
    meta_per_seq = 1  # seq_lens
    work_note = (
        "bytes = K+V of every cached token once per KV head (sum(seq_lens)*KVH*d*2*elem) "
        "+ q + out + block-table entries in use; FLOPs = 4*d*H*sum(seq_lens)"
    )

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        super().__init__(shape, dtype, device)
        if any(q != 1 for q in shape.q_lens):
            raise ValueError(f"{shape.name}: decode needs q_len == 1 for every sequence")
        self._build_cache()
        self.q = torch.randn(shape.batch, shape.heads, shape.head_dim, dtype=dtype, device=device)

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return fn(self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens, **kwargs)

    def sequence(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.q[b][None], *self._seq_kv(b))

    def rows_of(self, out: torch.Tensor, b: int) -> torch.Tensor:
        return out[b][None]

    def _dense_inputs(self) -> None:
        """Gather the cache once, outside any timing: ``[B, KVH, max_len, d]``."""
        if hasattr(self, "k_dense"):
            return
        s = self.shape
        self.max_len = max(s.seq_lens)
        self.k_dense = gather_dense(self.k_cache, self._tables_long, self.max_len).contiguous()
        self.v_dense = gather_dense(self.v_cache, self._tables_long, self.max_len).contiguous()
        keys = torch.arange(self.max_len, device=self.device)
        self.key_mask = None if s.uniform else keys[None, :] < self.seq_lens[:, None].long()
        self.attn_mask = None if self.key_mask is None else self.key_mask[:, None, None, :]
        self.q4 = self.q[:, :, None, :]  # [B, H, 1, d]

    def baselines(self) -> list[Baseline]:
        self._dense_inputs()
        gqa = {"enable_gqa": True} if self.gqa else {}
        q4, kd, vd, mask = self.q4, self.k_dense, self.v_dense, self.attn_mask
        scores = self.shape.batch * self.shape.heads * self.max_len
        out = self._sdpa_baselines(
            lambda: F.scaled_dot_product_attention(q4, kd, vd, attn_mask=mask, **gqa),
            lambda o: o[:, :, 0],
            scores,
            " on dense cache",
            "gather excluded: the cache was gathered once, untimed",
        )

        def eager() -> torch.Tensor:
            k = gather_dense(self.k_cache, self._tables_long, self.max_len)
            v = gather_dense(self.v_cache, self._tables_long, self.max_len)
            return torch_attention(q4, k, v, self.scale, key_mask=self.key_mask)

        out.append(
            Baseline(
                "torch eager: gather + matmul + softmax",
                eager,
                lambda o: o[:, :, 0],
                "torch",
                note="gather included",
            )
        )
        return out

    def followups(self, fastest_sdpa: str | None) -> list[Baseline]:
        if fastest_sdpa is None:
            return []
        gqa = {"enable_gqa": True} if self.gqa else {}

        def gather_then_sdpa() -> torch.Tensor:
            k = gather_dense(self.k_cache, self._tables_long, self.max_len)
            v = gather_dense(self.v_cache, self._tables_long, self.max_len)
            return F.scaled_dot_product_attention(self.q4, k, v, attn_mask=self.attn_mask, **gqa)

        return [
            Baseline(
                f"sdpa[{fastest_sdpa}] gather + dense",
                gather_then_sdpa,
                lambda o: o[:, :, 0],
                "sdpa",
                note="gather included: copies the whole cache every call",
                backend=fastest_sdpa,
            )
        ]


class VarlenWorkload(_PagedWorkload):
    """``fn(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)``, q ``[T, H, d]``."""

    meta_per_seq = 2  # seq_lens and query_start_loc
    work_note = (
        "FLOPs = 4*d*H*(attended pairs, bottom-right causal); bytes = q + out + K/V of "
        "every context token once per KV head + block-table entries"
    )

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        super().__init__(shape, dtype, device)
        self._build_cache()
        total = sum(shape.q_lens)
        self.q = torch.randn(total, shape.heads, shape.head_dim, dtype=dtype, device=device)
        starts = [0]
        for q_len in shape.q_lens:
            starts.append(starts[-1] + q_len)
        self.starts = starts
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32, device=device)

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return fn(
            self.q, self.k_cache, self.v_cache, self.block_tables, self.query_start_loc,
            self.seq_lens, **kwargs,
        )  # fmt: skip

    def sequence(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.q[self.starts[b] : self.starts[b + 1]], *self._seq_kv(b))

    def rows_of(self, out: torch.Tensor, b: int) -> torch.Tensor:
        return out[self.starts[b] : self.starts[b + 1]]

    def _mask_kwargs(self, q_len: int, n: int) -> dict[str, Any]:
        """SDPA arguments for ``q_len`` queries ending a context of ``n`` (bottom-right)."""
        if q_len == n and q_len > 1:
            return {"is_causal": True}
        if q_len == 1:
            return {}
        rows = torch.arange(q_len, device=self.device)[:, None] + (n - q_len)
        return {"attn_mask": torch.arange(n, device=self.device)[None, :] <= rows}

    def baselines(self) -> list[Baseline]:
        s = self.shape
        gqa = {"enable_gqa": True} if self.gqa else {}
        per_seq = self._per_sequence_sdpa_inputs()
        if s.uniform:
            scores = s.heads * sum(q * n for q, n in zip(s.q_lens, s.seq_lens))
            return self._uniform_baselines(per_seq, gqa, scores)
        biggest = s.heads * max(q * n for q, n in zip(s.q_lens, s.seq_lens))
        return self._per_sequence_baselines(per_seq, gqa, biggest)

    def _per_sequence_sdpa_inputs(self) -> list[tuple[Any, ...]]:
        """Per sequence: ``(q, k, v, mask kwargs, start position)``, q/k/v ``[1, H, n, d]``."""
        s = self.shape
        return [
            (q[None].transpose(1, 2), k.transpose(0, 1)[None].contiguous(),
             v.transpose(0, 1)[None].contiguous(), self._mask_kwargs(s.q_lens[b], s.seq_lens[b]),
             s.seq_lens[b] - s.q_lens[b])
            for b, (q, k, v) in enumerate(self.sequence(b) for b in range(s.batch))
        ]  # fmt: skip

    def _uniform_baselines(
        self, per_seq: list[tuple[Any, ...]], gqa: dict[str, bool], scores: int
    ) -> list[Baseline]:
        """Equal lengths: one batched call, ``[B, H, q_len, d]`` against ``[B, KVH, n, d]``."""
        s = self.shape
        total, h, d = self.q.shape
        q_len, n = s.q_lens[0], s.seq_lens[0]
        qd = self.q.view(s.batch, q_len, h, d).transpose(1, 2)
        kd = torch.cat([p[1] for p in per_seq])
        vd = torch.cat([p[2] for p in per_seq])
        kw = per_seq[0][3]
        canon = lambda o: o.transpose(1, 2).reshape(total, h, -1)
        out = self._sdpa_baselines(
            lambda: F.scaled_dot_product_attention(qd, kd, vd, **kw, **gqa),
            canon,
            scores,
            " batched",
            "gather excluded",
        )
        if 1 < q_len < n:
            from torch.nn.attention.bias import causal_lower_right

            bias = causal_lower_right(q_len, n)
            out.append(
                Baseline(
                    "sdpa causal_lower_right (CausalBias)",
                    lambda: F.scaled_dot_product_attention(qd, kd, vd, attn_mask=bias, **gqa),
                    canon,
                    "sdpa",
                    note="gather excluded; torch picks flash, else efficient, else a mask",
                )
            )
        positions = torch.arange(n - q_len, n, device=self.device)
        out.append(
            Baseline(
                "torch eager (matmul, fp32 softmax, matmul)",
                lambda: torch_attention(qd, kd, vd, self.scale, positions=positions),
                canon,
                "torch",
                skip=self._math_guard(scores),
            )
        )
        return out

    def _per_sequence_baselines(
        self, per_seq: list[tuple[Any, ...]], gqa: dict[str, bool], biggest: int
    ) -> list[Baseline]:
        """Mixed lengths: one call per sequence (what a user without a varlen kernel does)."""
        batch = self.shape.batch

        def loop() -> list[torch.Tensor]:
            return [
                F.scaled_dot_product_attention(q, k, v, **kw, **gqa) for q, k, v, kw, _ in per_seq
            ]

        canon_loop = lambda outs: torch.cat([o[0].transpose(0, 1) for o in outs])
        out = self._sdpa_baselines(
            loop,
            canon_loop,
            biggest,
            f" x{batch} calls",
            "one call per sequence; gather excluded",
        )
        positions = [torch.arange(p, p + q.shape[2], device=self.device) for q, *_, p in per_seq]

        def eager_loop() -> list[torch.Tensor]:
            return [
                torch_attention(q, k, v, self.scale, positions=pos)
                for (q, k, v, _, _), pos in zip(per_seq, positions)
            ]

        out.append(
            Baseline(
                f"torch eager x{batch} calls",
                eager_loop,
                canon_loop,
                "torch",
                note="one call per sequence",
                skip=self._math_guard(biggest),
            )
        )
        return out

# ---- lab 05: the FlashAttention backward ---------------------------------------------------


def _dense_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   causal: bool, rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` in float32 for ``[B, H, L, d]`` inputs, ``rows`` queries at a time (the
    scores of one chunk, never the whole ``L x L``). Top-left causal, GQA by head index."""
    b, h, n, _ = q.shape
    group = h // k.shape[1]
    o = torch.empty(b, h, n, v.shape[3], dtype=torch.float32, device=q.device)
    lse = torch.empty(b, h, n, dtype=torch.float32, device=q.device)
    keys = torch.arange(k.shape[2], device=q.device)
    for head in range(h):
        kh, vh = k[:, head // group].float(), v[:, head // group].float()  # [B, Lk, d]
        for start in range(0, n, rows):
            s = q[:, head, start : start + rows].float() @ kh.transpose(1, 2) * scale
            if causal:
                pos = torch.arange(start, start + s.shape[1], device=q.device)
                s.masked_fill_(keys[None, :] > pos[:, None], float("-inf"))
            lse[:, head, start : start + rows] = torch.logsumexp(s, dim=-1)
            o[:, head, start : start + rows] = torch.softmax(s, dim=-1) @ vh
    return o, lse


class BackwardWorkload(Workload):
    """``fn(q, k, v, o, lse, do, causal=...)`` -> ``(dq, dk, dv)``, dense ``[B, H, L, d]``.

    ``o`` and ``lse`` come from a float32 forward made once, untimed. The spot check
    compares dq on the first and last 32 query rows and dk, dv on the first and last 32 keys
    (every head of the first and last sequence) with float32 formulas; the baselines are
    SDPA's backward per backend (its forward is built once, untimed; only
    ``autograd.grad`` is timed).
    """

    work_note = (
        "FLOPs = 10*d*H*(attended pairs): 5 matmuls (S, dV, dP, dQ, dK), 2.5x the forward; "
        "bytes = q, k, v, o, dO, lse read + dq, dk, dv written, once each"
    )

    @classmethod
    def count(cls, shape: Shape, elem_bytes: int) -> Work:
        return backward_work(shape.seq_lens, heads=shape.heads, kv_heads=shape.kv_heads,
                             head_dim=shape.head_dim, elem_bytes=elem_bytes,
                             causal=shape.causal)  # fmt: skip

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        super().__init__(shape, dtype, device)
        if not shape.uniform or shape.q_lens[0] != shape.seq_lens[0]:
            raise ValueError(f"{shape.name}: the backward needs q_len == seq_len for all")
        b, h, kvh, d = shape.batch, shape.heads, shape.kv_heads, shape.head_dim
        n = shape.seq_lens[0]
        self.q = torch.randn(b, h, n, d, dtype=dtype, device=device)
        self.k = torch.randn(b, kvh, n, d, dtype=dtype, device=device)
        self.v = torch.randn(b, kvh, n, d, dtype=dtype, device=device)
        self.do = torch.randn(b, h, n, d, dtype=dtype, device=device)
        o, self.lse = _dense_forward(self.q, self.k, self.v, self.scale, shape.causal)
        self.o = o.to(dtype)

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return fn(self.q, self.k, self.v, self.o, self.lse, self.do, causal=self.shape.causal,
                  **kwargs)  # fmt: skip

    @staticmethod
    def output(result: Any) -> Any:
        return tuple(result)  # (dq, dk, dv)

    def _spot(self, b: int, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """float32 ``(dq[rows], dk[cols], dv[cols])`` of sequence ``b``, ``[H or KVH, n, d]``."""
        group = self.shape.heads // self.shape.kv_heads
        q, do = self.q[b].float(), self.do[b].float()  # [H, L, d]
        k = self.k[b].float().repeat_interleave(group, 0)
        v = self.v[b].float().repeat_interleave(group, 0)
        lse, delta = self.lse[b], (do * self.o[b].float()).sum(-1)  # [H, L]

        def ds_and_p(qi: torch.Tensor, ki: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            s = q[:, qi] @ k[:, ki].transpose(1, 2) * self.scale  # [H, |qi|, |ki|]
            p = torch.exp(s - lse[:, qi, None])
            if self.shape.causal:
                p = p.masked_fill(ki[None, None, :] > qi[None, :, None], 0.0)
            dp = do[:, qi] @ v[:, ki].transpose(1, 2)
            return p * (dp - delta[:, qi, None]), p

        every = torch.arange(q.shape[1], device=q.device)
        ds, _ = ds_and_p(rows, every)
        dq = ds @ k * self.scale
        ds, p = ds_and_p(every, cols)
        dk = (ds.transpose(1, 2) @ q * self.scale).unflatten(0, (-1, group)).sum(1)
        dv = (p.transpose(1, 2) @ do).unflatten(0, (-1, group)).sum(1)
        return dq, dk, dv

    def check(self, out: Any) -> float:
        dq, dk, dv = out
        n = self.shape.seq_lens[0]
        picks = torch.arange(n, device=self.q.device)
        if n > 64:
            picks = torch.cat([picks[:32], picks[-32:]])
        worst = 0.0
        for b in sorted({0, self.shape.batch - 1}):
            want = self._spot(b, picks, picks)
            got = (dq[b][:, picks], dk[b][:, picks], dv[b][:, picks])
            for g, w in zip(got, want):
                if not torch.isfinite(g).all():
                    return float("inf")
                worst = max(worst, float((g.float() - w).abs().max()))
        return worst

    def baselines(self) -> list[Baseline]:
        gqa = {"enable_gqa": True} if self.gqa else {}
        n = self.shape.seq_lens[0]
        out = []
        for backend in SDPA_BACKENDS:
            graph: list[Any] = []

            def backward(graph: list[Any] = graph) -> Any:
                if not graph:  # the first (untimed) call builds the forward with this backend
                    q, k, v = (t.detach().requires_grad_(True) for t in (self.q, self.k, self.v))
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=self.shape.causal,
                                                       **gqa)  # fmt: skip
                    graph += [o, (q, k, v)]
                return torch.autograd.grad(graph[0], graph[1], self.do, retain_graph=True)

            skip = self._math_guard(self.shape.batch * self.shape.heads * n * n * 2) \
                if backend == "math" else None
            out.append(Baseline(f"sdpa[{backend}] backward", backward, tuple, "sdpa",
                                "autograd.grad only; the forward was built once, untimed",
                                backend, skip))  # fmt: skip
        return out


# ---- lab 06: sliding window + sinks, and MLA decode -----------------------------------------


def _sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    sinks: torch.Tensor | None) -> torch.Tensor:
    """One decode token: q ``[H, d]``, k/v ``[n, KVH, d]`` (already cut to the window),
    sinks ``[H]`` logits in the softmax's denominator only; float32 ``[H, dv]``."""
    group = q.shape[0] // k.shape[1]
    kh = k.float().repeat_interleave(group, 1).transpose(0, 1)  # [H, n, d]
    vh = v.float().repeat_interleave(group, 1).transpose(0, 1)
    s = (kh @ q.float()[:, :, None])[..., 0] * scale  # [H, n]
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None]], dim=1)
    p = torch.softmax(s, dim=1)[:, : kh.shape[1]]
    return (p[:, None, :] @ vh)[:, 0]


class WindowSinkDecodeWorkload(PagedDecodeWorkload):
    """``fn(q, k_cache, v_cache, block_tables, seq_lens, window=, sinks=)``: lab 01's paged
    decode with the shape's sliding window and one sink logit per head (gpt-oss)."""

    work_note = (
        "bytes = K+V of the tokens inside the window once per KV head + q + out + the "
        "block-table entries the window touches + seq_lens (the sinks' H floats are not "
        "counted); FLOPs = 4*d*H*(keys in the window)"
    )

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        super().__init__(shape, dtype, device)
        self.sinks = torch.randn(shape.heads, dtype=torch.float32, device=device)

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return fn(self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                  window=self.shape.window, sinks=self.sinks, **kwargs)  # fmt: skip

    def _reference(self, b: int) -> torch.Tensor:
        n, w = self.shape.seq_lens[b], self.shape.window
        k, v = self._seq_kv(b)  # [n, KVH, d]
        first = 0 if w is None else max(0, n - w)
        return _sink_attention(self.q[b], k[first:], v[first:], self.scale, self.sinks)

    def check(self, out: torch.Tensor) -> float:
        lens = self.shape.seq_lens
        worst = 0.0
        for b in sorted({0, len(lens) - 1, max(range(len(lens)), key=lens.__getitem__)}):
            got = out[b].float()
            if not torch.isfinite(got).all():
                return float("inf")
            worst = max(worst, float((got - self._reference(b)).abs().max()))
        return worst

    def baselines(self) -> list[Baseline]:
        def eager() -> torch.Tensor:
            return torch.stack([self._reference(b) for b in range(self.shape.batch)])

        return [Baseline("torch eager: gather the window + sink softmax, per sequence", eager,
                         lambda o: o, "torch", note="SDPA has no sinks: no SDPA baseline")]


class MLADecodeWorkload(_PagedWorkload):
    """``fn(q_latent [B, H, d_c], q_pe [B, H, d_rope], kv_cache, block_tables, seq_lens)``
    with a latent cache ``[num_blocks, block_size, d_c + d_rope]`` (one row per token, for
    every head); the output is the latent ``[B, H, d_c]``."""

    roof = "bandwidth"
    meta_per_seq = 1
    work_note = (
        "bytes = one (d_c + d_rope) latent row per cached token (shared by every head) + "
        "q_latent + q_pe + the latent output + block-table entries; "
        "FLOPs = 2*(2*d_c + d_rope)*H*sum(seq_lens)"
    )

    @classmethod
    def count(cls, shape: Shape, elem_bytes: int) -> Work:
        return mla_decode_work(shape.seq_lens, heads=shape.heads, kv_lora_rank=shape.head_dim,
                               rope_dim=shape.rope_dim, elem_bytes=elem_bytes,
                               block_size=shape.block_size)  # fmt: skip

    def __init__(self, shape: Shape, dtype: torch.dtype, device: str) -> None:
        super().__init__(shape, dtype, device)
        d_c, d_qk = shape.head_dim, shape.head_dim + shape.rope_dim
        cache, _, self.block_tables = build_paged(shape.seq_lens, 1, d_qk, shape.block_size,
                                                  dtype, device)  # fmt: skip
        self.kv_cache = cache[:, :, 0]  # [num_blocks, block_size, d_c + d_rope]
        self.seq_lens = torch.tensor(shape.seq_lens, dtype=torch.int32, device=device)
        self._tables_long = self.block_tables.long()
        self.q_latent = torch.randn(shape.batch, shape.heads, d_c, dtype=dtype, device=device)
        self.q_pe = torch.randn(shape.batch, shape.heads, shape.rope_dim, dtype=dtype,
                                device=device)  # fmt: skip

    def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return fn(self.q_latent, self.q_pe, self.kv_cache, self.block_tables, self.seq_lens,
                  **kwargs)  # fmt: skip

    def sequence(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.shape.seq_lens[b]
        rows = gather_dense(self.kv_cache[:, :, None], self._tables_long[b : b + 1], n)[0]
        rows = rows.transpose(0, 1)  # [n, 1, d_c + d_rope]
        q = torch.cat([self.q_latent[b], self.q_pe[b]], dim=-1)[None]  # [1, H, d_c + d_rope]
        return q, rows, rows[..., : self.shape.head_dim]

    def rows_of(self, out: torch.Tensor, b: int) -> torch.Tensor:
        return out[b][None]

    def baselines(self) -> list[Baseline]:
        def eager() -> torch.Tensor:
            outs = []
            for b in range(self.shape.batch):
                q, k, v = self.sequence(b)
                outs.append(torch_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                            v.transpose(0, 1)[None], self.scale)[0, :, 0])
            return torch.stack(outs)  # fmt: skip

        return [Baseline("torch eager: gather the latent + matmul + softmax, per sequence",
                         eager, lambda o: o, "torch", note="gather included")]  # fmt: skip
