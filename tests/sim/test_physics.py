"""Physics invariants of the simulated fleet, checked on the telemetry it emits."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from gpufleet.catalog import (
    THROTTLE_GPU_IDLE,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)
from gpufleet.sim import Fleet, Trace, record
from gpufleet.sim.profiles import PROFILES
from gpufleet.sim.scenario import load_scenario, parse_scenario

H100 = PROFILES["h100_sxm_80gb"]
KNOWN_BITS = (
    THROTTLE_GPU_IDLE
    | THROTTLE_SW_POWER_CAP
    | THROTTLE_HW_SLOWDOWN
    | THROTTLE_SW_THERMAL
    | THROTTLE_HW_THERMAL
    | THROTTLE_HW_POWER_BRAKE
)
TraceFn = Callable[..., Trace]


def bit(tr: Trace, node: str, gpu: int, mask: int) -> np.ndarray:
    return (tr.col("throttle_reasons", node, gpu).astype(np.int64) & mask) != 0


def trapezoid_mj(t: np.ndarray, p: np.ndarray) -> float:
    return float(np.sum(0.5 * (p[1:] + p[:-1]) * np.diff(t)) * 1000.0)


@pytest.mark.parametrize(
    "name", ["straggler_power_cap", "thermal_throttling", "hw_throttling", "starvation_io"]
)
def test_invariants_hold_everywhere(trace: TraceFn, name: str) -> None:
    tr = trace(name)
    g = tr.gpu
    assert np.all(g["power_w"] <= g["power_limit_w"] + 1e-9)
    assert np.all(g["power_w"] > 0)
    assert np.all((g["util_pct"] >= 0) & (g["util_pct"] <= 100))
    for c in ("sm_active", "tensor_active", "dram_active"):
        assert np.all((g[c] >= 0) & (g[c] <= 1)), c
    assert np.all(g["sm_clock_mhz"] <= g["sm_clock_max_mhz"])
    assert np.all((g["throttle_reasons"].astype(np.int64) & ~KNOWN_BITS) == 0)
    assert np.all(g["pcie_gen"] <= g["pcie_gen_max"]) and np.all(g["pcie_width"] <= g["pcie_width_max"])
    assert np.all(g["mem_used_mib"] <= g["mem_total_mib"])
    assert np.all((g["temp_c"] > 15) & (g["temp_c"] < 100))
    h = tr.host
    total = h["cpu_user_pct"] + h["cpu_system_pct"] + h["cpu_iowait_pct"] + h["cpu_idle_pct"]
    assert np.allclose(total, 100.0, atol=1e-6)
    assert np.all(h["disk_util_pct"] <= 100) and np.all(h["host_power_w"] > 0)


def test_energy_counter_is_the_integral_of_power(trace: TraceFn) -> None:
    tr = trace("straggler_power_cap")
    for j in range(len(tr.gpu_keys)):
        e = tr.gpu["energy_mj"][:, j]
        assert np.all(np.diff(e) >= 0)
        integral = trapezoid_mj(tr.t, tr.gpu["power_w"][:, j])
        assert abs((e[-1] - e[0]) - integral) <= 1e-3 * integral
        # Also exact over short stretches, not only on average.
        assert abs((e[600] - e[300]) - trapezoid_mj(tr.t[300:601], tr.gpu["power_w"][300:601, j])) < 2.0


def test_counter_reset_and_gaps(trace: TraceFn) -> None:
    tr = trace("counters_and_gaps")
    fleet = tr.fleet
    reset = fleet.plan.resets[0]
    for gi in reset.gpu_idx.tolist():
        e = tr.gpu["energy_mj"][:, gi]
        seen = np.isfinite(e)
        before = e[seen & (tr.t < reset.time)]
        after = e[seen & (tr.t > reset.time)]
        assert after[0] < before[-1], "a driver reload restarts the counter"
        assert after[0] < 0.6 * 1000 * 700 * (reset.gap_s + 10)
        assert np.all(np.diff(after) >= 0) and np.all(np.diff(before) >= 0)
        hidden = (tr.t >= reset.time) & (tr.t < reset.time + reset.gap_s)
        assert hidden.any() and not np.isfinite(e[hidden]).any()
    # The agent outage: no GPU and no host rows, but the counter bridges it.
    node, (g0, g1) = "h100-02", fleet.plan.node_gaps["h100-02"].pairs()[0]
    inside = (tr.t >= g0) & (tr.t < g1)
    j = tr.gpu_keys.index((node, 0))
    assert not np.isfinite(tr.gpu["power_w"][inside, j]).any()
    assert not np.isfinite(tr.host_col("cpu_user_pct", node)[inside]).any()
    e = tr.gpu["energy_mj"][:, j]
    before, after = np.flatnonzero(tr.t < g0)[-1], np.flatnonzero(tr.t >= g1)[0]
    bridged = e[after] - e[before]
    assert 0.8 * 400e3 * (g1 - g0) < bridged < 700e3 * (tr.t[after] - tr.t[before])


def test_power_cap_holds_power_lowers_clocks_and_sets_the_bit(trace: TraceFn) -> None:
    tr = trace("straggler_power_cap")
    lab = tr.fleet.labels()
    (thr,) = lab.of_kind("throttling")
    limit = thr.evidence["limit_w"]
    assert thr.node is not None and thr.gpu is not None
    during = tr.between(thr.start + 5, thr.start + 1200)
    p = tr.col("power_w", thr.node, thr.gpu)[during]
    assert np.all(p <= limit + 1e-9)
    assert np.all(tr.col("power_limit_w", thr.node, thr.gpu)[during] == limit)
    assert np.median(tr.col("sm_clock_mhz", thr.node, thr.gpu)[during]) < 0.95 * H100.sm_clock_max_mhz
    assert bit(tr, thr.node, thr.gpu, THROTTLE_SW_POWER_CAP)[during].mean() > 0.9
    before = tr.between(thr.start - 200, thr.start)
    assert not bit(tr, thr.node, thr.gpu, THROTTLE_SW_POWER_CAP)[before].any()
    for node, gpu in tr.gpu_keys:
        if (node, gpu) != (thr.node, thr.gpu):
            assert not bit(tr, node, gpu, THROTTLE_SW_POWER_CAP).any(), (node, gpu)


def test_synchronous_step_lasts_as_long_as_the_slowest_gpu() -> None:
    fleet = Fleet.from_scenario("straggler_power_cap")
    lab = fleet.labels()
    (strag,) = lab.of_kind("straggler")
    run = next(r for r in fleet.plan.runs if r.run_id == strag.run_id)
    fleet.advance_to(strag.start - 60)
    healthy = fleet.step_timing(run.run_id)
    assert healthy is not None
    assert healthy.step_s == pytest.approx(float(healthy.compute_s.max()) + healthy.comm_s)
    fleet.advance_to(strag.start + 600)
    slow = fleet.step_timing(run.run_id)
    assert slow is not None
    assert slow.step_s == pytest.approx(float(slow.compute_s.max()) + slow.comm_s)
    slowest = fleet.plan.gpus[int(run.gpu_idx[int(np.argmax(slow.compute_s))])]
    assert (slowest.node, slowest.gpu) == (strag.node, strag.gpu)
    # Everyone's step got longer by the straggler's slowdown, not just its own.
    assert slow.step_s / healthy.step_s == pytest.approx(1 + strag.evidence["slowdown"], rel=0.03)


def test_peers_wait_in_the_collective_util_stays_up_activity_and_power_drop(trace: TraceFn) -> None:
    tr = trace("straggler_power_cap")
    (strag,) = tr.fleet.labels().of_kind("straggler")
    run = next(r for r in tr.fleet.plan.runs if r.run_id == strag.run_id)
    before = tr.between(strag.start - 300, strag.start)
    during = tr.between(strag.start + 60, strag.start + 900)
    peers = [j for j in run.gpu_idx.tolist() if tr.gpu_keys[j] != (strag.node, strag.gpu)]
    s = tr.gpu_keys.index((strag.node, strag.gpu))
    slow = strag.evidence["slowdown"]
    for j in peers:
        assert tr.gpu["util_pct"][during, j].mean() > 95
        assert tr.gpu["sm_active"][during, j].mean() < tr.gpu["sm_active"][before, j].mean() * (1 - slow / 3)
        assert tr.gpu["power_w"][during, j].mean() < tr.gpu["power_w"][before, j].mean() * (1 - slow / 3)
        assert tr.gpu["sm_active"][during, j].mean() < tr.gpu["sm_active"][during, s].mean()


def test_uniform_power_cap_is_uniform(trace: TraceFn) -> None:
    tr = trace("uniform_power_cap")
    fleet = tr.fleet
    run = next(r for r in fleet.plan.runs if r.run_id == "capped")
    f = fleet.plan.gpu_faults[0]
    during = tr.between(f.start + 30, f.end)
    idx = run.gpu_idx.tolist()
    capped = np.array([bit(tr, *tr.gpu_keys[j], THROTTLE_SW_POWER_CAP)[during].mean() for j in idx])
    assert np.all(capped > 0.9)
    clocks = tr.gpu["sm_clock_mhz"][during][:, idx].mean(axis=0)
    assert clocks.max() < 0.97 * H100.sm_clock_max_mhz
    assert (clocks.max() - clocks.min()) / clocks.mean() < 0.05
    sm = tr.gpu["sm_active"][during][:, idx].mean(axis=0)
    assert sm.max() - sm.min() < 0.03
    lab = fleet.labels()
    assert not [i for i in lab.of_kind("straggler") if i.run_id == "capped"]
    assert len([i for i in lab.of_kind("throttling") if i.run_id == "capped"]) == len(idx)
    assert any(h.reason == "uniform_power_cap" and h.run_id == "capped" for h in lab.hard_negatives)


def test_idle_unallocated_gpus_report_idle(trace: TraceFn) -> None:
    tr = trace("idle_unallocated")
    for gpu in range(8):
        assert bit(tr, "h100-03", gpu, THROTTLE_GPU_IDLE).all()
        assert np.all(tr.col("util_pct", "h100-03", gpu) == 0)
        assert np.all(tr.col("sm_clock_mhz", "h100-03", gpu) == H100.sm_clock_idle_mhz)
        assert tr.col("power_w", "h100-03", gpu).max() < H100.idle_w * 1.2
        assert np.all(tr.col("mem_used_mib", "h100-03", gpu) == 0)
    # A busy GPU does not report idle once its run has warmed up.
    run = tr.fleet.plan.runs[0]
    busy = tr.t > run.train_start + 5
    assert not bit(tr, "h100-01", 0, THROTTLE_GPU_IDLE)[busy].any()
    # GPUs freed by a run that ended go idle again.
    short = next(r for r in tr.fleet.plan.runs if r.run_id == "short")
    assert short.end is not None
    assert bit(tr, "h100-02", 0, THROTTLE_GPU_IDLE)[tr.t > short.end + 1].all()


def test_thermal_fault_heats_to_the_limit_then_throttles(trace: TraceFn) -> None:
    tr = trace("straggler_thermal")
    (thr,) = tr.fleet.labels().of_kind("throttling")
    assert thr.node is not None and thr.gpu is not None
    temp = tr.col("temp_c", thr.node, thr.gpu)
    settled = tr.between(thr.start + 120, thr.end or tr.t[-1])
    assert temp[tr.between(thr.start - 60, thr.start)].max() < H100.temp_sw_limit_c - 10
    assert np.all(np.abs(temp[settled] - H100.temp_sw_limit_c) <= 3)
    assert bit(tr, thr.node, thr.gpu, THROTTLE_SW_THERMAL)[settled].mean() > 0.95
    assert not bit(tr, thr.node, thr.gpu, THROTTLE_HW_THERMAL).any()
    assert np.median(tr.col("sm_clock_mhz", thr.node, thr.gpu)[settled]) < 0.95 * H100.sm_clock_max_mhz
    # It recovers once the fault is gone.
    after = tr.between((thr.end or 0) + 300, tr.t[-1] + 1)
    assert not bit(tr, thr.node, thr.gpu, THROTTLE_SW_THERMAL)[after].any()


def test_severe_thermal_fault_engages_hw_slowdown(trace: TraceFn) -> None:
    tr = trace("thermal_throttling")
    lab = tr.fleet.labels()
    hot = [i for i in lab.of_kind("throttling") if i.run_id == "hw-hot"]
    assert len(hot) == 1
    i = hot[0]
    assert i.node is not None and i.gpu is not None
    settled = tr.between(i.start + 180, i.end or tr.t[-1])
    assert bit(tr, i.node, i.gpu, THROTTLE_HW_THERMAL)[settled].mean() > 0.95
    assert np.median(tr.col("sm_clock_mhz", i.node, i.gpu)[settled]) <= 0.5 * H100.sm_clock_max_mhz + 1
    # The node-wide fault throttles all 8 GPUs of the other run, SW only.
    node_wide = [x for x in lab.of_kind("throttling") if x.run_id == "hot-node"]
    assert len(node_wide) == 8
    for x in node_wide:
        assert x.node is not None and x.gpu is not None
        sel = tr.between(x.start + 180, x.end or tr.t[-1])
        assert bit(tr, x.node, x.gpu, THROTTLE_SW_THERMAL)[sel].mean() > 0.9


def test_hw_slowdown_and_power_brake_bits(trace: TraceFn) -> None:
    tr = trace("hw_throttling")
    lab = tr.fleet.labels()
    for cause, mask in (("power_brake", THROTTLE_HW_POWER_BRAKE), ("hw_slowdown", THROTTLE_HW_SLOWDOWN)):
        for i in [x for x in lab.of_kind("throttling") if x.cause == cause]:
            assert i.node is not None and i.gpu is not None and i.end is not None
            sel = tr.between(i.start + 1, i.end)
            assert bit(tr, i.node, i.gpu, mask)[sel].all()
            assert not bit(tr, i.node, i.gpu, mask)[tr.between(i.end + 1, tr.t[-1] + 1)].any()
            assert tr.col("sm_clock_mhz", i.node, i.gpu)[sel].max() < 0.55 * H100.sm_clock_max_mhz


def test_cpu_starvation_sawtooth_and_saturated_host(trace: TraceFn) -> None:
    tr = trace("starvation_cpu")
    s = tr.fleet.plan.starvations[0]
    sel = tr.between(s.start, s.end)
    for node in ("h100-01", "h100-02"):
        util = tr.col("util_pct", node, 3)[sel]
        idle_share = float((util < 5).mean())
        assert idle_share == pytest.approx(1 - s.duty, abs=0.1)
        waiting = util < 50
        edges = int(np.count_nonzero(waiting[1:] & ~waiting[:-1]))
        assert edges == pytest.approx((s.end - s.start) / s.period_s, rel=0.15)
        user = tr.host_col("cpu_user_pct", node)[sel]
        assert user.mean() > 94 and user.min() > 90
        assert tr.host_col("cpu_iowait_pct", node)[sel].mean() < 2
    # The control run never waits for input.
    control = next(r for r in tr.fleet.plan.runs if r.run_id == "cpu-control")
    busy = tr.t > control.train_start + 5
    assert tr.col("util_pct", "h100-03", 0)[busy].min() > 80
    assert tr.host_col("cpu_user_pct", "h100-03")[busy].max() < 60


def test_io_starvation_saturates_the_disk_not_the_cpu(trace: TraceFn) -> None:
    tr = trace("starvation_io")
    s = tr.fleet.plan.starvations[0]
    sel = tr.between(s.start, s.end)
    util = tr.col("util_pct", "h100-02", 0)[sel]
    assert float((util < 5).mean()) == pytest.approx(1 - s.duty, abs=0.1)
    for node in s.nodes:
        assert tr.host_col("cpu_iowait_pct", node)[sel].mean() == pytest.approx(
            s.params["cpu_iowait_pct"], rel=0.1
        )
        assert tr.host_col("disk_util_pct", node)[sel].min() > 95
        assert tr.host_col("disk_await_ms", node)[sel].mean() > 30
        assert tr.host_col("cpu_user_pct", node)[sel].mean() < 50
    # The lightly loaded serving run: steady low utilisation and an idle host.
    serving = next(r for r in tr.fleet.plan.runs if r.workload.kind == "serving")
    busy = tr.t > serving.train_start + 5
    u = tr.col("util_pct", "h100-03", 0)[busy]
    assert 10 < u.mean() < 40 and u.std() < 5
    assert tr.host_col("cpu_idle_pct", "h100-03")[busy].mean() > 85


def test_checkpoint_stalls_block_the_writer_while_its_peers_spin_and_the_host_writes(trace: TraceFn) -> None:
    tr = trace("checkpoint_stalls")
    c = tr.fleet.plan.checkpoints[0]
    run = next(r for r in tr.fleet.plan.runs if r.run_id == c.run_id)
    stalls = c.stalls.pairs()
    assert len(stalls) >= 4
    inside = np.zeros(tr.t.shape, dtype=bool)
    for a, b in stalls:
        inside |= (tr.t >= a + 1) & (tr.t <= b)
        d = b - a
        assert c.duration_s * 0.85 <= d <= c.duration_s * 1.15
    training = (tr.t > run.train_start + 5) & ~inside
    for a, b in itertools.pairwise(stalls):
        assert b[0] - a[0] == pytest.approx(c.period_s)
    idx = run.gpu_idx.tolist()
    # Rank 0 writes: no kernel at all.  Its peers wait in the next
    # collective: GPU-Util ~100 % at idle-level power, no SM activity.
    writer, peers = idx[0], idx[1:]
    assert np.all(tr.gpu["util_pct"][inside][:, writer] == 0)
    assert tr.gpu["util_pct"][inside][:, peers].min() >= 90
    assert tr.gpu["sm_active"][inside][:, peers].max() < 0.3
    busy_power = np.median(tr.gpu["power_w"][training][:, peers])
    assert np.median(tr.gpu["power_w"][inside][:, peers]) < 0.5 * busy_power
    for node in run.nodes:
        w = tr.host_col("disk_write_bytes_s", node)
        assert w[inside].min() > 0.3e9
        edge = np.zeros(tr.t.shape, dtype=bool)
        for a, b in stalls:
            edge |= (tr.t > a - 2) & (tr.t < b + 2)
        assert w[training & ~edge].max() < 50e6


def test_degraded_pcie_link_only_on_the_faulty_gpu(trace: TraceFn) -> None:
    tr = trace("straggler_pcie")
    (pd,) = tr.fleet.labels().of_kind("pcie_degraded")
    for node, gpu in tr.gpu_keys:
        gen, width = tr.col("pcie_gen", node, gpu), tr.col("pcie_width", node, gpu)
        if (node, gpu) == (pd.node, pd.gpu):
            assert np.all((gen < H100.pcie_gen_max) | (width < H100.pcie_width_max))
        else:
            assert np.all(gen == H100.pcie_gen_max) and np.all(width == H100.pcie_width_max)


def test_xids_and_double_bit_ecc(trace: TraceFn) -> None:
    tr = trace("host_misconfig")
    plan = tr.fleet.plan
    assert len(plan.xids) >= 4
    for x in plan.xids:
        gp = plan.gpus[x.gpu_idx]
        k = int(np.searchsorted(tr.t, x.time))  # the first sample at or after the event
        assert tr.col("xid", gp.node, gp.gpu)[k] == x.code
    dbe = sum(1 for x in plan.xids if x.code == 48)
    gi = plan.xids[0].gpu_idx
    assert tr.gpu["ecc_dbe_vol"][-1, gi] == dbe
    assert np.count_nonzero(tr.gpu["xid"]) == len(
        {(x.gpu_idx, int(np.searchsorted(tr.t, x.time))) for x in plan.xids}
    )


@pytest.mark.parametrize("interval_s", [0.1, 30.0])
def test_any_sampling_interval_keeps_energy_exact_and_duty_cycles(interval_s: float) -> None:
    raw = load_scenario("starvation_cpu").model_dump()
    raw["sample_interval_s"] = interval_s
    raw["faults"][0]["start_s"] = 60.0  # input waits begin right after warm-up
    sc = parse_scenario(raw)
    fleet = Fleet.from_scenario(sc)
    s = fleet.plan.starvations[0]
    if interval_s < 1:
        fleet.advance_to(s.start + 10)
    tr = record(fleet, 150.0 if interval_s < 1 else 3600.0)
    assert np.allclose(np.diff(tr.t), interval_s)
    j = tr.gpu_keys.index(("h100-01", 0))
    e = tr.gpu["energy_mj"][:, j]
    integral = trapezoid_mj(tr.t, tr.gpu["power_w"][:, j])
    assert abs((e[-1] - e[0]) - integral) <= 1e-3 * integral + 1.0
    a, b = max(s.start, tr.t[0]), min(s.end, tr.t[-1])
    sel = (tr.t > a) & (tr.t <= b)
    busy_share = tr.gpu["util_pct"][sel, j].mean() / 100
    # A tick's value is the exact share of it spent busy, whatever the sampling.
    expected = 1 - s.waits.covered_in(a, b) / (b - a)
    assert busy_share == pytest.approx(expected, abs=0.02)
