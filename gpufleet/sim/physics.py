"""GPU physics as pure, vectorised functions: power, clocks, temperature, speed.

The model is deliberately simple but keeps the couplings detectors rely on:

* board power is idle power plus a dynamic part that grows with activity
  (``(tdp - idle) * activity**k``) and with SM clock (``clock_ratio**gamma``);
* an enforced power limit below the demand lowers the clock just enough
  for the power to meet the limit;
* die temperature relaxes exponentially towards inlet + R * power;
* a step's compute time stretches with ``1 / clock_ratio`` for the
  clock-bound share and with the PCIe slowdown for the transfer share.

All functions take numpy arrays (or floats) and broadcast.
"""

from __future__ import annotations

import numpy as np

#: A value or an array of values (functions broadcast).
Num = np.ndarray | float

#: Weights of SM, tensor-pipe and DRAM activity in the power activity index.
ACTIVITY_WEIGHT_SM = 0.6
ACTIVITY_WEIGHT_TENSOR = 0.4
ACTIVITY_WEIGHT_DRAM = 0.25
#: Exponent of activity in dynamic power.
ACTIVITY_POWER_EXPONENT = 1.1
#: Dynamic power scales with SM clock to this power (frequency x voltage^2).
CLOCK_POWER_EXPONENT = 2.0


def activity_index(sm: Num, tensor: Num, dram: Num) -> np.ndarray:
    """Power-relevant activity 0-1 from DCGM-style activities 0-1."""
    a = ACTIVITY_WEIGHT_SM * sm + ACTIVITY_WEIGHT_TENSOR * tensor + ACTIVITY_WEIGHT_DRAM * dram
    return np.clip(a, 0.0, 1.0)


def dynamic_power_w(tdp_w: Num, idle_w: Num, efficiency: Num, activity: Num) -> np.ndarray:
    """Power above idle at full SM clock for ``activity``, W."""
    return (tdp_w - idle_w) * efficiency * np.power(activity, ACTIVITY_POWER_EXPONENT)


def board_power_w(idle_w: Num, dyn_w: Num, clock_ratio: Num) -> np.ndarray:
    """Board power at ``clock_ratio`` (SM clock / maximum), W."""
    return idle_w + dyn_w * np.power(clock_ratio, CLOCK_POWER_EXPONENT)


def clock_ratio_for_limit(limit_w: Num, idle_w: Num, dyn_w: Num) -> np.ndarray:
    """Highest clock ratio (<= 1) at which power stays within ``limit_w``.

    0 when even idle power exceeds the limit (the caller floors it at the
    GPU's minimum clock).
    """
    headroom = np.asarray(limit_w - idle_w, dtype=np.float64)
    dyn = np.asarray(dyn_w, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.power(np.clip(headroom / dyn, 0.0, None), 1.0 / CLOCK_POWER_EXPONENT)
    return np.where(dyn > 0, np.minimum(ratio, 1.0), 1.0)


def temperature_step(temp_c: Num, target_c: Num, dt_s: float, tau_s: Num) -> np.ndarray:
    """Exact first-order lag over ``dt_s`` (stable for any tick length)."""
    return target_c + (temp_c - target_c) * np.exp(-dt_s / tau_s)


def target_temp_c(inlet_c: Num, r_c_per_w: Num, power_w: Num, rise_c: Num) -> np.ndarray:
    """Temperature the die settles at under ``power_w``, degC."""
    return np.asarray(inlet_c + r_c_per_w * power_w + rise_c, dtype=np.float64)


def thermal_limit_power_w(limit_c: Num, inlet_c: Num, r_c_per_w: Num, rise_c: Num) -> np.ndarray:
    """Board power at which the die settles exactly at ``limit_c``, W."""
    return np.asarray((limit_c - inlet_c - rise_c) / r_c_per_w, dtype=np.float64)


def compute_time_factor(
    clock_ratio: Num, mem_bound_share: Num, pcie_share: Num, pcie_bw_ratio: Num
) -> np.ndarray:
    """How much longer a step's compute takes than on a healthy GPU (>= 1).

    ``pcie_bw_ratio`` is current over maximum link bandwidth.
    """
    clock_share = 1.0 - mem_bound_share - pcie_share
    return (
        clock_share / np.maximum(clock_ratio, 1e-3)
        + mem_bound_share
        + pcie_share / np.maximum(pcie_bw_ratio, 1e-3)
    )
