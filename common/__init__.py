"""What every lab shares: the float64 reference, paged-cache builders, the LAB_IMPL loader,
device detection and test helpers. Labs import ``common``; they never import each other."""

from common.device import configure_triton, has_cuda, interpreter_mode, triton_device
from common.loader import ALLOWED_IMPLS, lab_impl, load_impl
from common.paged import PagedKV, blocks_needed, build_paged_kv, random_kv, random_kv_shared_prefix
from common.reference import kv_head_for, prefix_mask, reference_attention, to_float64

__all__ = [
    "ALLOWED_IMPLS",
    "PagedKV",
    "blocks_needed",
    "build_paged_kv",
    "configure_triton",
    "has_cuda",
    "interpreter_mode",
    "kv_head_for",
    "lab_impl",
    "load_impl",
    "prefix_mask",
    "random_kv",
    "random_kv_shared_prefix",
    "reference_attention",
    "to_float64",
    "triton_device",
]
