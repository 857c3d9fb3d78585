"""Split-KV partials and their merge, given code for every lab whose kernel splits the keys
(lab 03's prefill, lab 06's window and MLA decode; lab 04 teaches the merge itself).

A split kernel writes one normalised partial ``(out_s, lse_s)`` per split; the merge
combines them exactly: ``lse = log sum_s exp(lse_s)``, ``out = sum_s exp(lse_s - lse)
out_s`` (lab 04's merge of softmax states in its serving form).
"""

from __future__ import annotations

from typing import Any

from common.triton_env import dot_tile, tl, triton


def split_outputs(out: Any, lse: Any, num_splits: int) -> tuple[Any, Any]:
    """Where the split kernel writes: ``(part_out [B, H, S, d], part_lse [B, H, S])`` for
    ``out [B, H, d]`` (B: sequences of a decode, or lab 03's query tokens).

    One split: ``out`` and ``lse`` themselves, viewed with a split dim of 1 (no merge).
    More: new buffers, one partial ``(out, lse)`` per split, for ``merge_splits``; the
    partial outputs in ``out``'s dtype, the lse in float32. (float32 partials cost the MLA
    kernel's 64 x 512 tile a 28 B spill on sm_80, ``make gpu-report``; the merge is a
    weighted mean of normalised partials, so this adds at most one rounding of ``out``'s
    dtype.)
    """
    if num_splits == 1:
        return out.unsqueeze(2), lse.unsqueeze(2)
    batch, num_heads, dim = out.shape
    part_out = out.new_empty((batch, num_heads, num_splits, dim))
    return part_out, lse.new_empty((batch, num_heads, num_splits))


@triton.jit
def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr,
    num_splits,
    stride_po_seq, stride_po_head, stride_po_split,
    stride_pl_seq, stride_pl_head, stride_pl_split,
    stride_o_seq, stride_o_head, stride_lse_seq, stride_lse_head,
    DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    """One program = one (sequence, head): ``lse = log sum_s exp(lse_s)``, ``out = sum_s
    exp(lse_s - lse) out_s``. A split with ``lse_s = -inf`` (no keys) weighs 0; all of them
    ``-inf``: output 0, ``lse = -inf``."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    lse_row = part_lse_ptr + seq * stride_pl_seq + head * stride_pl_head
    out_row = part_out_ptr + seq * stride_po_seq + head * stride_po_head
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < DIM

    m = tl.load(lse_row)  # the largest partial lse
    for split in range(1, num_splits):
        m = tl.maximum(m, tl.load(lse_row + split * stride_pl_split))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = m_safe * 0.0  # sum_s exp(lse_s - m): each split's softmax mass, rescaled to m
    acc = tl.zeros([DIM_PAD], dtype=tl.float32)
    for split in range(0, num_splits):
        weight = tl.exp(tl.load(lse_row + split * stride_pl_split) - m_safe)
        part = tl.load(out_row + split * stride_po_split + dims, mask=dim_ok, other=0.0)
        total += weight
        acc += weight * part
    has_mass = total > 0
    out = acc / tl.where(has_mass, total, 1.0)
    lse = tl.where(has_mass, m_safe + tl.log(tl.where(has_mass, total, 1.0)), float("-inf"))
    tl.store(out_ptr + seq * stride_o_seq + head * stride_o_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_ok)
    tl.store(lse_ptr + seq * stride_lse_seq + head * stride_lse_head, lse)


def merge_splits(part_out: Any, part_lse: Any, out: Any, lse: Any) -> None:
    """Combine the partials of ``split_outputs`` into ``out [B, H, d]`` (unit stride in d)
    and ``lse [B, H]`` (exact: lab 04's merge of softmax states). Nothing for one split."""
    batch, num_heads, num_splits, dim = part_out.shape
    if num_splits == 1 or batch == 0:
        return
    _merge_splits_kernel[(batch, num_heads)](
        part_out, part_lse, out, lse, num_splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), part_lse.stride(2),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        DIM=dim, DIM_PAD=dot_tile(dim),
    )
