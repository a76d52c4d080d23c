"""What the GPU faults in force at one instant impose on each GPU.

Faults overlap freely (a power cap on a GPU whose link is also degraded);
each limit combines with the others by taking the most restrictive value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.sim.plan import GpuFaultPlan


@dataclass
class FaultState:
    """Per-GPU arrays: limits and flags from the faults in force."""

    #: Enforced power limit, W.
    cap_w: np.ndarray
    #: Extra temperature the cooling fault adds, degC.
    rise_c: np.ndarray
    #: Clock factors imposed whatever the load (HW slowdown, power brake, locked clocks).
    hw_factor: np.ndarray
    brake_factor: np.ndarray
    lock_factor: np.ndarray
    pcie_gen: np.ndarray
    pcie_width: np.ndarray
    hw_slowdown_on: np.ndarray
    power_brake_on: np.ndarray
    #: NVLink links of the board, links up, and whether peer traffic can use NVLink at all.
    nvlink_max_links: np.ndarray
    nvlink_up: np.ndarray
    nvlink_p2p: np.ndarray
    #: Rates of the error counters the health faults drive, per second.
    nvlink_crc_per_s: np.ndarray
    nvlink_replay_per_s: np.ndarray
    nvlink_recovery_per_s: np.ndarray
    sbe_per_s: np.ndarray
    pcie_replay_per_s: np.ndarray

    @property
    def fixed_clock_ratio(self) -> np.ndarray:
        """The clock ceiling that holds regardless of power and temperature."""
        return np.minimum(np.minimum(self.hw_factor, self.brake_factor), self.lock_factor)

    @property
    def nvlink_bw_ratio(self) -> np.ndarray:
        """Usable share of each GPU's NVLink bandwidth (0 where peer traffic cannot use it)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(
                self.nvlink_max_links > 0, self.nvlink_up / np.maximum(self.nvlink_max_links, 1), 0.0
            )
        return np.where(self.nvlink_p2p, r, 0.0)


def faults_in_force(
    faults: list[GpuFaultPlan],
    t: float,
    tdp_w: np.ndarray,
    gen_max: np.ndarray,
    width_max: np.ndarray,
    nvlink_links: np.ndarray | None = None,
) -> FaultState:
    """The state at time ``t`` (a fault holds for ``start <= t < end``)."""
    n = tdp_w.shape[0]
    links = np.zeros(n) if nvlink_links is None else np.asarray(nvlink_links, dtype=np.float64)
    fs = FaultState(
        cap_w=tdp_w.copy(),
        rise_c=np.zeros(n),
        hw_factor=np.ones(n),
        brake_factor=np.ones(n),
        lock_factor=np.ones(n),
        pcie_gen=gen_max.copy(),
        pcie_width=width_max.copy(),
        hw_slowdown_on=np.zeros(n, dtype=bool),
        power_brake_on=np.zeros(n, dtype=bool),
        nvlink_max_links=links,
        nvlink_up=links.copy(),
        nvlink_p2p=links > 0,
        nvlink_crc_per_s=np.zeros(n),
        nvlink_replay_per_s=np.zeros(n),
        nvlink_recovery_per_s=np.zeros(n),
        sbe_per_s=np.zeros(n),
        pcie_replay_per_s=np.zeros(n),
    )
    for f in faults:
        if not f.start <= t < f.end:
            continue
        i, p = f.gpu_idx, f.params
        if f.kind == "power_cap":
            fs.cap_w[i] = np.minimum(fs.cap_w[i], p["limit_w"])
        elif f.kind == "thermal":
            fs.rise_c[i] = np.maximum(fs.rise_c[i], p["temp_rise_c"])
        elif f.kind == "hw_slowdown":
            fs.hw_factor[i] = np.minimum(fs.hw_factor[i], p["clock_factor"])
            fs.hw_slowdown_on[i] = True
        elif f.kind == "power_brake":
            fs.brake_factor[i] = np.minimum(fs.brake_factor[i], p["clock_factor"])
            fs.power_brake_on[i] = True
        elif f.kind == "clock_lock":
            fs.lock_factor[i] = np.minimum(fs.lock_factor[i], p["clock_fraction"])
        elif f.kind == "nvlink_down":
            fs.nvlink_up[i] = np.maximum(np.minimum(fs.nvlink_up[i], links[i] - p["links_down"]), 0.0)
        elif f.kind == "nvlink_fallback":
            fs.nvlink_p2p[i] = False
        elif f.kind == "nvlink_errors":
            fs.nvlink_crc_per_s[i] += p["crc_per_s"]
            fs.nvlink_replay_per_s[i] += p["replay_per_s"]
            fs.nvlink_recovery_per_s[i] += p["recovery_per_h"] / 3600.0
        elif f.kind == "ecc_sbe":
            fs.sbe_per_s[i] += p["sbe_per_h"] / 3600.0
        elif f.kind == "pcie_replay":
            fs.pcie_replay_per_s[i] += p["replays_per_min"] / 60.0
        elif f.kind == "pcie_degraded":
            if p["gen"] is not None:
                fs.pcie_gen[i] = np.minimum(fs.pcie_gen[i], p["gen"])
            if p["width"] is not None:
                fs.pcie_width[i] = np.minimum(fs.pcie_width[i], p["width"])
    return fs
