"""What the GPU faults in force at one instant impose on each GPU.

Faults overlap freely (a power cap on a GPU whose link is also degraded);
each limit combines with the others by taking the most restrictive value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.agent.simulator.plan import GpuFaultPlan


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

    @property
    def fixed_clock_ratio(self) -> np.ndarray:
        """The clock ceiling that holds regardless of power and temperature."""
        return np.minimum(np.minimum(self.hw_factor, self.brake_factor), self.lock_factor)


def faults_in_force(faults: list[GpuFaultPlan], t: float, tdp_w: np.ndarray, gen_max: np.ndarray,
                    width_max: np.ndarray) -> FaultState:
    """The state at time ``t`` (a fault holds for ``start <= t < end``)."""
    n = tdp_w.shape[0]
    fs = FaultState(
        cap_w=tdp_w.copy(), rise_c=np.zeros(n), hw_factor=np.ones(n), brake_factor=np.ones(n),
        lock_factor=np.ones(n), pcie_gen=gen_max.copy(), pcie_width=width_max.copy(),
        hw_slowdown_on=np.zeros(n, dtype=bool), power_brake_on=np.zeros(n, dtype=bool),
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
        elif f.kind == "pcie_degraded":
            if p["gen"] is not None:
                fs.pcie_gen[i] = np.minimum(fs.pcie_gen[i], p["gen"])
            if p["width"] is not None:
                fs.pcie_width[i] = np.minimum(fs.pcie_width[i], p["width"])
    return fs
