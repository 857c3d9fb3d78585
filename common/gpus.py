"""Per-SM limits of the GPUs the course compiles for (sm_80, sm_86, sm_90, sm_100), with their
sources: read by ``make gpu-report`` (bench/gpu_report.py: occupancy, shared memory) and by the
web book's memory-hierarchy page (book/traces.py). SM counts, bandwidth and throughput are
the launch plan's targets (common/launch_plan.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of one compute capability (sources: ``LIMIT_SOURCES``)."""

    arch: int
    part: str
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024  # the most a block may opt in to (static + dynamic)
    reserved_smem_per_block: int = 1024  # taken by the system from every resident block
    reserved_in_cubin: bool = True  # ptxas puts that 1 KB in the cubin's static smem (sm_90+)
    tmem_cols_per_sm: int = 0  # tensor memory (sm_100): 512 columns x 128 lanes x 32 bit
    reg_unit: int = 256  # registers are allocated per warp in units of 256
    smem_unit: int = 128  # shared memory is allocated in units of 128 bytes


LIMITS = {
    80: ArchLimits(80, "A100", smem_per_sm=164 * 1024, smem_per_block=163 * 1024,
                   reserved_in_cubin=False),
    86: ArchLimits(86, "RTX 30 / laptop (sm_86; sm_89 has the same shared memory)",
                   max_warps_per_sm=48, max_blocks_per_sm=16, smem_per_sm=100 * 1024,
                   smem_per_block=99 * 1024, reserved_in_cubin=False),
    90: ArchLimits(90, "H100"),
    100: ArchLimits(100, "B200", tmem_cols_per_sm=512),
}
LIMIT_SOURCES = (
    "CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' (compute "
    "capabilities 8.0, 8.6, 9.0, 10.0): 64K 32-bit registers per SM, 255 per thread, 64 "
    "resident warps and 32 resident blocks per SM (8.6: 48 and 16); shared memory per SM / per "
    "block 164 / 163 KB (8.0), 100 / 99 KB (8.6, 8.9), 228 / 227 KB (9.0, 10.0).",
    "NVIDIA Ampere, Hopper and Blackwell Tuning Guides, 'Occupancy' and 'Unified Shared "
    "Memory/L1/Texture Cache': the same figures, and 1 KB of shared memory reserved by the "
    "system for each resident block.",
    "CUDA Occupancy Calculator / Nsight Compute 'launch statistics': registers allocated per "
    "warp in units of 256, shared memory in units of 128 bytes.",
    "PTX ISA, 'Tensor Memory' (tcgen05, sm_100a): 128 lanes x 512 columns of 32-bit cells "
    "per SM, allocated by columns; Triton's metadata gives a kernel's columns (tmem_size).",
    "The cubins themselves: for sm_90 and sm_100 ptxas gives every kernel a 1 KB static "
    "shared section (.nv.shared.<kernel>, with .nv.shared.reserved.0) and starts the dynamic "
    "window at 0x400: the reserved 1 KB, counted once; for sm_80 the static section is empty.",
)
