"""The fleet's state and its advance by one tick, vectorised over all GPUs.

A tick ``(a, b]`` goes: faults in force at ``b`` -> each GPU's clock limits
(power cap, thermal controller, HW slowdown, power brake, locked clocks)
-> each run lays out its GPUs' time over the states -> power, clocks,
throttle reasons, temperature and counters.  The energy counter integrates
the reported power exactly (trapezoid over the tick), so accounting can be
checked against it to the millijoule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpufleet.catalog import (
    THROTTLE_GPU_IDLE,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)
from gpufleet.sim import states as st
from gpufleet.sim.fault_state import FaultState, faults_in_force
from gpufleet.sim.host import HostModel
from gpufleet.sim.jobs import JobModel
from gpufleet.sim.physics import (
    CLOCK_POWER_EXPONENT,
    activity_index,
    board_power_w,
    clock_ratio_for_limit,
    dynamic_power_w,
    target_temp_c,
    temperature_step,
    thermal_limit_power_w,
)
from gpufleet.sim.plan import FleetPlan, GpuPlan, RunPlan
from gpufleet.sim.profiles import PCIE_LANE_TABLE, pcie_link_bytes_s
from gpufleet.sim.workload import (
    PCIE_EFFICIENCY,
    GpuTick,
    HostLoad,
    RunTickInputs,
    StepTiming,
    lay_out_run,
)

#: Below this clock ratio the SW thermal controller gives up and HW thermal
#: slowdown (clocks halved or worse) takes over.
HW_THERMAL_RATIO = 0.5
#: The thermal controller engages this close to its limit, and lets go only
#: once the GPU has cooled this far below it (hysteresis).
THERMAL_ENGAGE_MARGIN_C = 0.5
THERMAL_RELEASE_MARGIN_C = 5.0
#: A throttle reason is reported when its condition held this share of the tick.
REASON_SHARE = 0.5
#: Power sensor noise: relative and absolute standard deviations.
POWER_NOISE_REL = 0.008
POWER_NOISE_W = 1.5
#: The XID that comes with a double-bit ECC error.
XID_DBE = 48
#: XIDs of an uncorrectable ECC error (48 double-bit; 94 contained, 95 uncontained on
#: Ampere and later), of a row remap being recorded (63) and of a remap failing (64).
XID_UNCORRECTABLE = (48, 94, 95)
XID_ROW_REMAP = 63
XID_REMAP_FAILURE = 64
#: Healthy boards' rare PCIe replays, per second (a few a day).
BACKGROUND_PCIE_REPLAY_PER_S = 1.0 / 7200.0


@dataclass
class Levels:
    """Per-GPU, per-state activity (GPU count x N_STATES) and the dynamic power it asks for."""

    util_pct: np.ndarray
    sm: np.ndarray
    tensor: np.ndarray
    dram: np.ndarray
    #: Power above idle at full clock, W.
    dyn_w: np.ndarray


@dataclass
class Clocks:
    """Per-GPU, per-state clock ratio after every limit, and the power at it."""

    ratio: np.ndarray
    #: Whether the power cap (not another limit) set the clock in that state.
    capped: np.ndarray
    power_w: np.ndarray
    sw_thermal: np.ndarray
    hw_thermal: np.ndarray


class FleetEngine:
    """Holds per-GPU and per-node state; :meth:`step` advances it one tick."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        gp = plan.gpus
        self.n_gpus = len(gp)
        self.node_names = list(plan.nodes)
        self.node_index = {n: k for k, n in enumerate(self.node_names)}
        self.gpu_node = np.array([self.node_index[g.node] for g in gp], dtype=np.intp)

        def arr(f: Callable[[GpuPlan], float]) -> np.ndarray:
            return np.array([f(g) for g in gp], dtype=np.float64)

        self.tdp_w = arr(lambda g: g.profile.tdp_w)
        self.idle_w = arr(lambda g: g.profile.idle_w)
        self.efficiency = arr(lambda g: g.efficiency)
        self.clock_max = arr(lambda g: g.profile.sm_clock_max_mhz)
        self.clock_idle = arr(lambda g: g.profile.sm_clock_idle_mhz)
        self.ratio_min = arr(lambda g: g.profile.sm_clock_min_mhz / g.profile.sm_clock_max_mhz)
        self.mem_clock = arr(lambda g: g.profile.mem_clock_mhz)
        self.mem_total = arr(lambda g: g.profile.mem_total_mib)
        self.gen_max = arr(lambda g: g.profile.pcie_gen_max)
        self.width_max = arr(lambda g: g.profile.pcie_width_max)
        self.r_th = arr(lambda g: g.profile.thermal_resistance_c_per_w)
        self.tau = arr(lambda g: g.profile.thermal_tau_s)
        self.t_sw = arr(lambda g: g.profile.temp_sw_limit_c)
        self.inlet = arr(lambda g: g.inlet_c)
        self.nvlink_max = arr(lambda g: g.profile.nvlink_bytes_s_max)
        self.nvlink_links = arr(lambda g: g.profile.nvlink_links)
        self.link_max = np.array(
            [pcie_link_bytes_s(int(g.profile.pcie_gen_max), int(g.profile.pcie_width_max)) for g in gp]
        )
        self.node_plans = [plan.nodes[n] for n in self.node_names]
        self.host_model = HostModel(self.node_plans)
        self.job_model = JobModel(self.node_plans, plan.seed)
        self._idle_state = np.isin(np.arange(st.N_STATES), st.IDLE_STATES)[None, :]

        self._noise = np.random.default_rng(np.random.SeedSequence([plan.seed & 0xFFFFFFFF, 0x5EED]))
        self.t = plan.t0 - plan.interval_s
        self.temp_c = self.inlet + self.r_th * self.idle_w
        self.power_w = self.idle_w.copy()
        self.energy_mj = np.array([g.energy0_mj for g in gp])
        self.ecc_dbe = np.zeros(self.n_gpus)
        self._health_init(plan)
        self.thermal_on = np.zeros(self.n_gpus, dtype=bool)
        self.last_xid_time = np.full(self.n_gpus, -np.inf)
        self.last_xid_code = np.zeros(self.n_gpus, dtype=np.int64)
        self._xid_next = 0
        self._reset_next = 0
        self.run_steps = {r.run_id: 0.0 for r in plan.runs}
        #: The last tick's step timing of each training run that was on.
        self.step_timing: dict[str, StepTiming] = {}
        self.gpu: dict[str, np.ndarray] = {}
        self.host: dict[str, np.ndarray] = {}
        #: Which GPUs / nodes report a sample at ``self.t``.
        self.gpu_present = np.ones(self.n_gpus, dtype=bool)
        self.host_present = np.ones(len(self.node_names), dtype=bool)
        self._starv_by_run = {
            r.run_id: [s for s in plan.starvations if s.run_id == r.run_id] for r in plan.runs
        }

    def step(self, t: float) -> None:
        """Advance to ``t`` (> current time): one tick of length ``t - self.t``."""
        a, b = self.t, float(t)
        if b <= a:
            raise ValueError(f"step to {b} is not after the current time {a}")
        z = self._noise.standard_normal((self.n_gpus, 6))
        zh = self._noise.standard_normal((len(self.node_names), 8))
        faults = faults_in_force(
            self.plan.gpu_faults, b, self.tdp_w, self.gen_max, self.width_max, self.nvlink_links
        )
        active = [r for r in self.plan.runs if r.start < b and (r.end is None or r.end > a)]
        levels = self._levels(active)
        clocks = self._clocks(levels, faults)
        tick, load = self._lay_out(active, a, b, clocks, faults, z)
        self._gpu_outputs(a, b, tick, levels, clocks, faults, z)
        self.host = self.host_model.metrics(load, zh)
        self.gpu.update(self.job_model.metrics(load.jobs, self.n_gpus))
        self.t = b
        self._presence(b)

    def _levels(self, active: list[RunPlan]) -> Levels:
        """Activity of every GPU in every state, with each run's workload on its GPUs."""
        util, sm, tensor, dram = st.fixed_levels(self.n_gpus)
        for r in active:
            w, i = r.workload, r.gpu_idx
            sm[i, st.COMPUTE], tensor[i, st.COMPUTE], dram[i, st.COMPUTE] = (
                w.sm_active,
                w.tensor_active,
                w.dram_active,
            )
            for col, scale in ((st.EVAL, st.EVAL_SCALE), (st.RAMP, st.RAMP_SCALE)):
                sm[i, col] = scale[0] * w.sm_active
                tensor[i, col] = scale[1] * w.tensor_active
                dram[i, col] = scale[2] * w.dram_active
        dyn = dynamic_power_w(
            self.tdp_w[:, None],
            self.idle_w[:, None],
            self.efficiency[:, None],
            activity_index(sm, tensor, dram),
        )
        return Levels(util, sm, tensor, dram, dyn)

    def _clocks(self, lv: Levels, faults: FaultState) -> Clocks:
        """Clock limits that hold whatever the GPU does, then the power cap in each state."""
        fixed = faults.fixed_clock_ratio
        thermal_ratio, sw_th, hw_th = self._thermal(
            lv.dyn_w[:, st.COMPUTE], fixed, faults.cap_w, faults.rise_c
        )
        persist = np.maximum(np.minimum(fixed, thermal_ratio), self.ratio_min)
        dyn_at = lv.dyn_w * np.power(persist, CLOCK_POWER_EXPONENT)[:, None]
        cap_ratio = clock_ratio_for_limit(faults.cap_w[:, None], self.idle_w[:, None], dyn_at)
        ratio = np.maximum(persist[:, None] * cap_ratio, self.ratio_min[:, None])
        return Clocks(
            ratio=ratio,
            capped=cap_ratio < 0.999,
            power_w=board_power_w(self.idle_w[:, None], lv.dyn_w, ratio),
            sw_thermal=sw_th,
            hw_thermal=hw_th,
        )

    def _lay_out(
        self, active: list[RunPlan], a: float, b: float, clocks: Clocks, faults: FaultState, z: np.ndarray
    ) -> tuple[GpuTick, HostLoad]:
        """Each run splits its GPUs' tick over the states; what is left is unallocated time."""
        link_now = PCIE_LANE_TABLE[faults.pcie_gen.astype(np.intp)] * faults.pcie_width
        inputs = RunTickInputs(
            compute_clock_ratio=clocks.ratio[:, st.COMPUTE],
            pcie_bw_ratio=link_now / self.link_max,
            pcie_bw_bytes_s=PCIE_EFFICIENCY * link_now,
            pcie_bw_max_bytes_s=self.link_max,
            nvlink_max_bytes_s=self.nvlink_max,
            mem_total_mib=self.mem_total,
            jitter=z[:, 0],
            nvlink_bw_ratio=faults.nvlink_bw_ratio,
        )
        tick = GpuTick(self.n_gpus)
        load = HostLoad(len(self.node_names))
        self.step_timing = {}
        for r in active:
            timing = lay_out_run(
                self.plan,
                r,
                self._starv_by_run[r.run_id],
                a,
                b,
                inputs,
                tick,
                load,
                self.node_index,
                self.gpu_node,
            )
            if timing is not None:
                self.run_steps[r.run_id] += timing.steps
                self.step_timing[r.run_id] = timing
        tick.frac[:, st.FREE] = np.clip(1.0 - tick.frac[:, : st.FREE].sum(axis=1), 0.0, 1.0)
        return tick, load

    def _thermal(
        self, dyn_busy: np.ndarray, fixed: np.ndarray, cap: np.ndarray, rise: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Clock ratio the thermal controller allows, and the SW/HW thermal flags.

        The controller holds the die at its limit: the clock is set so that
        the busy power settles the temperature exactly there.  Below
        ``HW_THERMAL_RATIO`` it cannot, and HW slowdown halves the clocks.
        """
        p_busy = np.minimum(board_power_w(self.idle_w, dyn_busy, fixed), cap)
        hot = (rise > 0) & (target_temp_c(self.inlet, self.r_th, p_busy, rise) > self.t_sw)
        engage = hot & (self.temp_c >= self.t_sw - THERMAL_ENGAGE_MARGIN_C)
        hold = hot & self.thermal_on & (self.temp_c >= self.t_sw - THERMAL_RELEASE_MARGIN_C)
        self.thermal_on = engage | hold
        allowed = thermal_limit_power_w(self.t_sw, self.inlet, self.r_th, rise)
        ratio = clock_ratio_for_limit(allowed, self.idle_w, dyn_busy)
        hw = self.thermal_on & (ratio < HW_THERMAL_RATIO)
        ratio = np.where(hw, np.minimum(ratio, HW_THERMAL_RATIO), ratio)
        return np.where(self.thermal_on, ratio, 1.0), self.thermal_on.copy(), hw

    def _gpu_outputs(
        self, a: float, b: float, tick: GpuTick, lv: Levels, clocks: Clocks, faults: FaultState, z: np.ndarray
    ) -> None:
        """Power, clocks, reasons, counters and temperature reported for the tick."""
        frac = tick.frac
        dt = b - a
        idle_share = frac[:, st.IDLE] + frac[:, st.FREE]
        power = (frac * clocks.power_w).sum(axis=1)
        power = power * (1.0 + POWER_NOISE_REL * z[:, 1]) + POWER_NOISE_W * z[:, 2]
        power = np.clip(power, 0.6 * self.idle_w, faults.cap_w)
        power = np.round(power, 2)
        clock_state = np.where(
            self._idle_state, self.clock_idle[:, None], clocks.ratio * self.clock_max[:, None]
        )
        clock = np.rint((frac * clock_state).sum(axis=1))

        reasons = np.zeros(self.n_gpus, dtype=np.int64)
        reasons |= np.where(idle_share >= REASON_SHARE, THROTTLE_GPU_IDLE, 0)
        reasons |= np.where((frac * clocks.capped).sum(axis=1) >= REASON_SHARE, THROTTLE_SW_POWER_CAP, 0)
        reasons |= np.where(faults.hw_slowdown_on, THROTTLE_HW_SLOWDOWN, 0)
        reasons |= np.where(clocks.sw_thermal, THROTTLE_SW_THERMAL, 0)
        reasons |= np.where(clocks.hw_thermal, THROTTLE_HW_THERMAL, 0)
        reasons |= np.where(faults.power_brake_on, THROTTLE_HW_POWER_BRAKE, 0)

        # Energy: trapezoid of the reported power; a driver reload restarts the counter.
        inc = 0.5 * (self.power_w + power) * dt * 1000.0
        self.energy_mj = self.energy_mj + inc
        while self._reset_next < len(self.plan.resets) and self.plan.resets[self._reset_next].time <= b:
            ev = self.plan.resets[self._reset_next]
            if ev.time > a:
                self.energy_mj[ev.gpu_idx] = inc[ev.gpu_idx] * (b - ev.time) / dt
                self.ecc_dbe[ev.gpu_idx] = 0
                self._health_reset(ev.gpu_idx)
            self._reset_next += 1
        self.power_w = power

        xid = np.zeros(self.n_gpus, dtype=np.int64)
        while self._xid_next < len(self.plan.xids) and self.plan.xids[self._xid_next].time <= b:
            x = self.plan.xids[self._xid_next]
            if x.time > a:
                xid[x.gpu_idx] = x.code
                self.last_xid_time[x.gpu_idx] = x.time
                self.last_xid_code[x.gpu_idx] = x.code
                self._health_xid(x.gpu_idx, x.code)
            self._xid_next += 1
        self._health_step(dt, faults)

        target = target_temp_c(self.inlet, self.r_th, power, faults.rise_c)
        self.temp_c = temperature_step(self.temp_c, target, dt, self.tau)
        temp = np.rint(self.temp_c + 0.3 * z[:, 3])
        util = (frac * lv.util_pct).sum(axis=1)
        sm = (frac * lv.sm).sum(axis=1)
        dram = (frac * lv.dram).sum(axis=1)
        busy = 1.0 - idle_share
        self.gpu = {
            "util_pct": np.rint(np.clip(util + 0.5 * busy * z[:, 4], 0.0, 100.0)),
            "sm_active": np.round(np.clip(sm * (1.0 + 0.01 * z[:, 5]), 0.0, 1.0), 4),
            "tensor_active": np.round(np.clip((frac * lv.tensor).sum(axis=1), 0.0, 1.0), 4),
            "dram_active": np.round(np.clip(dram, 0.0, 1.0), 4),
            "mem_used_mib": np.round(tick.mem_used_mib),
            "mem_total_mib": self.mem_total,
            "power_w": power,
            "energy_mj": np.floor(self.energy_mj),
            "power_limit_w": faults.cap_w,
            "sm_clock_mhz": clock,
            "sm_clock_max_mhz": self.clock_max,
            "mem_clock_mhz": self.mem_clock,
            "temp_c": temp,
            "mem_temp_c": np.rint(self.temp_c + 4.0 + 10.0 * dram),
            "throttle_reasons": reasons.astype(np.float64),
            "pcie_tx_bytes_s": np.round(tick.pcie_tx_bytes_s + 2e4 * np.abs(z[:, 4])),
            "pcie_rx_bytes_s": np.round(tick.pcie_rx_bytes_s + 5e4 * np.abs(z[:, 5])),
            "pcie_gen": faults.pcie_gen,
            "pcie_gen_max": self.gen_max,
            "pcie_width": faults.pcie_width,
            "pcie_width_max": self.width_max,
            "nvlink_tx_bytes_s": np.round(tick.nvlink_bytes_s),
            "nvlink_rx_bytes_s": np.round(tick.nvlink_bytes_s),
            "ecc_dbe_vol": self.ecc_dbe.copy(),
            "xid": xid.astype(np.float64),
            **self._health_outputs(faults),
        }

    # --- memory, bus and NVLink health ----------------------------------------------------

    def _health_init(self, plan: FleetPlan) -> None:
        """Counters as boards carry them: some history in the aggregate (InfoROM)
        counters and in correctable row remaps, volatile ones from zero.  Drawn
        from a stream of their own so that adding them changed no other number."""
        n = self.n_gpus
        self._health_rng = np.random.default_rng(np.random.SeedSequence([plan.seed & 0xFFFFFFFF, 0x4EA17]))
        rng = self._health_rng
        self.sbe_vol = np.zeros(n)
        self.sbe_agg = np.where(rng.random(n) < 0.3, rng.integers(1, 40, n), 0).astype(np.float64)
        self.dbe_agg = np.zeros(n)
        self.remap_cor = np.where(rng.random(n) < 0.2, rng.integers(1, 4, n), 0).astype(np.float64)
        self.remap_unc = np.zeros(n)
        self.remap_pending = np.zeros(n)
        self.remap_failed = np.zeros(n)
        self.pcie_replay = rng.integers(0, 200, n).astype(np.float64)
        self.nvl_crc = np.zeros(n)
        self.nvl_replay = np.zeros(n)
        self.nvl_recovery = np.zeros(n)

    def _health_xid(self, gi: int, code: int) -> None:
        if code in XID_UNCORRECTABLE:
            self.ecc_dbe[gi] += 1
            self.dbe_agg[gi] += 1
            self.remap_unc[gi] += 1
            self.remap_pending[gi] = 1
        elif code == XID_ROW_REMAP:
            self.remap_pending[gi] = 1
        elif code == XID_REMAP_FAILURE:
            self.remap_failed[gi] = 1

    def _health_reset(self, gi: np.ndarray) -> None:
        """A driver reload (GPU reset): volatile counters restart; a pending remap takes effect."""
        for arr in (self.sbe_vol, self.nvl_crc, self.nvl_replay, self.nvl_recovery, self.remap_pending):
            arr[gi] = 0

    def _health_step(self, dt: float, faults: FaultState) -> None:
        rng = self._health_rng
        sbe = rng.poisson(faults.sbe_per_s * dt)
        self.sbe_vol += sbe
        self.sbe_agg += sbe
        self.pcie_replay += rng.poisson((faults.pcie_replay_per_s + BACKGROUND_PCIE_REPLAY_PER_S) * dt)
        self.nvl_crc += rng.poisson(faults.nvlink_crc_per_s * dt)
        self.nvl_replay += rng.poisson(faults.nvlink_replay_per_s * dt)
        self.nvl_recovery += rng.poisson(faults.nvlink_recovery_per_s * dt)

    def _health_outputs(self, faults: FaultState) -> dict[str, np.ndarray]:
        """The health columns; NVLink ones are NULL on boards without NVLink (NVML answers NotSupported)."""
        has = np.where(self.nvlink_links > 0, 1.0, np.nan)
        return {
            "ecc_sbe_vol": self.sbe_vol.copy(),
            "ecc_sbe_agg": self.sbe_agg.copy(),
            "ecc_dbe_agg": self.dbe_agg.copy(),
            "remapped_rows_correctable": self.remap_cor.copy(),
            "remapped_rows_uncorrectable": self.remap_unc.copy(),
            "remapped_rows_pending": self.remap_pending.copy(),
            "remapped_rows_failed": self.remap_failed.copy(),
            "pcie_replay_count": self.pcie_replay.copy(),
            "nvlink_crc_errors": self.nvl_crc * has,
            "nvlink_replay_errors": self.nvl_replay * has,
            "nvlink_recovery_errors": self.nvl_recovery * has,
            "nvlink_links_up": faults.nvlink_up * has,
            "nvlink_links_max": self.nvlink_links * has,
        }

    def _presence(self, t: float) -> None:
        plan = self.plan
        for k, name in enumerate(self.node_names):
            gaps = plan.node_gaps.get(name)
            self.host_present[k] = not (gaps is not None and gaps.contains(t))
        self.gpu_present = self.host_present[self.gpu_node].copy()
        for gi, gaps in plan.gpu_gaps.items():
            if gaps.contains(t):
                self.gpu_present[gi] = False
