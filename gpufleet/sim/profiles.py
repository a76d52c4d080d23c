"""GPU model profiles: the datasheet numbers the physics model is scaled by.

Values come from vendor datasheets and from real ``nvidia-smi -q`` captures
(``../shared/realdata``): an idle H100 SXM draws about 70 W at 345 MHz SM
clock with 81559 MiB of framebuffer; an A100 SXM4 80GB idles near 50 W.
``bf16_dense_peak_flops`` is exported as data so that MFU can be computed
against the same peak the simulator assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model. Every field carries its unit in its name."""

    key: str
    #: Product name as NVML reports it (``nvmlDeviceGetName``).
    name: str
    #: Default (and maximum) enforced board power limit, W.
    tdp_w: float
    #: Board power with no kernel running, W.
    idle_w: float
    #: Lowest power limit the driver accepts, W.
    min_power_limit_w: float
    sm_clock_max_mhz: int
    #: SM clock the GPU drops to when no work is queued, MHz.
    sm_clock_idle_mhz: int
    #: Lowest SM clock a throttle can force, MHz.
    sm_clock_min_mhz: int
    mem_clock_mhz: int
    mem_total_mib: float
    pcie_gen_max: int
    pcie_width_max: int
    #: Temperature above which the SW thermal controller lowers clocks, degC.
    temp_sw_limit_c: float
    #: HW thermal slowdown threshold, degC.
    temp_slowdown_c: float
    #: HW shutdown threshold, degC (informational).
    temp_shutdown_c: float
    #: Steady-state rise of die temperature over inlet air per board watt, degC/W.
    thermal_resistance_c_per_w: float
    #: First-order time constant of the die temperature, s.
    thermal_tau_s: float
    #: BF16 dense (no sparsity) tensor peak, FLOP/s, for MFU.
    bf16_dense_peak_flops: float
    #: Peak NVLink bandwidth per direction, bytes/s (0: a PCIe-only board).
    nvlink_bytes_s_max: float
    sm_count: int
    #: NVLink links of the board (0: none; NVML then answers NotSupported).
    nvlink_links: int = 0


PROFILES: dict[str, GpuProfile] = {
    p.key: p
    for p in (
        GpuProfile(
            key="h100_sxm_80gb",
            name="NVIDIA H100 80GB HBM3",
            tdp_w=700.0,
            idle_w=70.0,
            min_power_limit_w=200.0,
            sm_clock_max_mhz=1980,
            sm_clock_idle_mhz=345,
            sm_clock_min_mhz=345,
            mem_clock_mhz=2619,
            mem_total_mib=81559.0,
            pcie_gen_max=5,
            pcie_width_max=16,
            temp_sw_limit_c=87.0,
            temp_slowdown_c=90.0,
            temp_shutdown_c=92.0,
            thermal_resistance_c_per_w=0.065,
            thermal_tau_s=25.0,
            bf16_dense_peak_flops=989e12,
            nvlink_bytes_s_max=450e9,
            sm_count=132,
            nvlink_links=18,
        ),
        GpuProfile(
            key="a100_sxm_80gb",
            name="NVIDIA A100-SXM4-80GB",
            tdp_w=400.0,
            idle_w=50.0,
            min_power_limit_w=100.0,
            sm_clock_max_mhz=1410,
            sm_clock_idle_mhz=210,
            sm_clock_min_mhz=210,
            mem_clock_mhz=1593,
            mem_total_mib=81920.0,
            pcie_gen_max=4,
            pcie_width_max=16,
            temp_sw_limit_c=85.0,
            temp_slowdown_c=89.0,
            temp_shutdown_c=92.0,
            thermal_resistance_c_per_w=0.11,
            thermal_tau_s=25.0,
            bf16_dense_peak_flops=312e12,
            nvlink_bytes_s_max=300e9,
            sm_count=108,
            nvlink_links=12,
        ),
        GpuProfile(
            key="h200_sxm_141gb",
            name="NVIDIA H200",
            tdp_w=700.0,
            idle_w=78.0,
            min_power_limit_w=200.0,
            sm_clock_max_mhz=1980,
            sm_clock_idle_mhz=345,
            sm_clock_min_mhz=345,
            mem_clock_mhz=3201,
            mem_total_mib=143771.0,
            pcie_gen_max=5,
            pcie_width_max=16,
            temp_sw_limit_c=87.0,
            temp_slowdown_c=90.0,
            temp_shutdown_c=92.0,
            thermal_resistance_c_per_w=0.065,
            thermal_tau_s=25.0,
            bf16_dense_peak_flops=989e12,
            nvlink_bytes_s_max=450e9,
            sm_count=132,
            nvlink_links=18,
        ),
        # A PCIe-only board: no NVLink, collectives between GPUs cross PCIe
        # (and the CPU root complex).  Datasheet: 350 W, 48 GB GDDR6, Gen4 x16,
        # 362 TFLOPS dense BF16; idle and clocks from the L40S capture of
        # realdata/nvidia_gpu_exporter.
        GpuProfile(
            key="l40s_pcie_48gb",
            name="NVIDIA L40S",
            tdp_w=350.0,
            idle_w=60.0,
            min_power_limit_w=100.0,
            sm_clock_max_mhz=2520,
            sm_clock_idle_mhz=210,
            sm_clock_min_mhz=210,
            mem_clock_mhz=9001,
            mem_total_mib=46068.0,
            pcie_gen_max=4,
            pcie_width_max=16,
            temp_sw_limit_c=86.0,
            temp_slowdown_c=89.0,
            temp_shutdown_c=92.0,
            thermal_resistance_c_per_w=0.11,
            thermal_tau_s=30.0,
            bf16_dense_peak_flops=362e12,
            nvlink_bytes_s_max=0.0,
            sm_count=142,
            nvlink_links=0,
        ),
        # Older boards with a fraction of an H100's power range, so that what the detectors judge
        # by is each GPU's own busy and idle levels, never one model's watts.  V100 SXM2 32GB:
        # 300 W, HBM2, 6 NVLink 2.0 links (25 GB/s each way), Gen3 x16, no BF16 (FP16 125 TFLOPS
        # stands in).  A10: 150 W, 24 GB GDDR6, Gen4 x16, no NVLink, 125 TFLOPS dense BF16.
        GpuProfile(
            key="v100_sxm2_32gb",
            name="Tesla V100-SXM2-32GB",
            tdp_w=300.0,
            idle_w=42.0,
            min_power_limit_w=150.0,
            sm_clock_max_mhz=1530,
            sm_clock_idle_mhz=135,
            sm_clock_min_mhz=135,
            mem_clock_mhz=877,
            mem_total_mib=32768.0,
            pcie_gen_max=3,
            pcie_width_max=16,
            temp_sw_limit_c=83.0,
            temp_slowdown_c=87.0,
            temp_shutdown_c=90.0,
            thermal_resistance_c_per_w=0.15,
            thermal_tau_s=30.0,
            bf16_dense_peak_flops=125e12,
            nvlink_bytes_s_max=150e9,
            sm_count=80,
            nvlink_links=6,
        ),
        GpuProfile(
            key="a10_pcie_24gb",
            name="NVIDIA A10",
            tdp_w=150.0,
            idle_w=16.0,
            min_power_limit_w=100.0,
            sm_clock_max_mhz=1695,
            sm_clock_idle_mhz=210,
            sm_clock_min_mhz=210,
            mem_clock_mhz=6251,
            mem_total_mib=23028.0,
            pcie_gen_max=4,
            pcie_width_max=16,
            temp_sw_limit_c=85.0,
            temp_slowdown_c=88.0,
            temp_shutdown_c=92.0,
            thermal_resistance_c_per_w=0.3,
            thermal_tau_s=30.0,
            bf16_dense_peak_flops=125e12,
            nvlink_bytes_s_max=0.0,
            sm_count=72,
            nvlink_links=0,
        ),
    )
}


def profile(key: str) -> GpuProfile:
    """The profile named ``key``; raises KeyError listing the known ones."""
    try:
        return PROFILES[key]
    except KeyError:
        raise KeyError(f"unknown GPU model {key!r}; known: {sorted(PROFILES)}") from None


#: Usable payload bandwidth of one PCIe lane per direction, bytes/s, by
#: generation (line rate after 8b/10b or 128b/130b encoding).
PCIE_LANE_BYTES_S: dict[int, float] = {
    1: 0.25e9,
    2: 0.5e9,
    3: 0.985e9,
    4: 1.969e9,
    5: 3.938e9,
    6: 7.563e9,
}


def pcie_link_bytes_s(gen: int, width: int) -> float:
    """Payload bandwidth of a link per direction, bytes/s."""
    return PCIE_LANE_BYTES_S[gen] * width


#: ``PCIE_LANE_BYTES_S`` as an array indexed by generation (0 unused), for vectorised lookups.
PCIE_LANE_TABLE = np.array([0.0] + [PCIE_LANE_BYTES_S[g] for g in range(1, 7)])
