"""Checkpoint stalls: periodic job-wide pauses with write bursts."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.checkpoint_stall import detect
from tests.detectors.builders import T0, GpuSpec, Profile, pauses, run_window, steady, times

CFG = DetectorConfig()


def writes_during(prof: Profile, rate: float = 3e9, base: float = 2e6) -> Profile:
    return lambda t: np.where(prof(t) < 0.1, rate, base)


def test_periodic_pauses_with_disk_write_bursts() -> None:
    prof = pauses(150, 30, start=T0 + 20)
    w = run_window([GpuSpec(prof) for _ in range(16)], host={"disk_write_bytes_s": writes_during(prof)})
    fs = detect(w, CFG)
    assert len(fs) == 1
    f = fs[0]
    assert (f.kind, f.run_id, f.node, f.gpu, f.cause) == ("checkpoint_stall", "r1", None, None, None)
    ev = f.evidence
    assert ev["period_s"] == pytest.approx(150, abs=2)
    assert ev["pause_s"] == pytest.approx(30, abs=2)
    assert ev["run_time_lost_share"] == pytest.approx(0.2, abs=0.02)
    assert ev["write_bytes_s"] > 1e9 and ev["write_path"] == "disk"
    # First pause: 150 - 30 after the pattern's start.
    assert f.start == pytest.approx(T0 + 20 + 120, abs=2)
    assert f.hold_s == pytest.approx(225, abs=5)


def test_network_writes_count_too() -> None:
    prof = pauses(150, 30)
    w = run_window([GpuSpec(prof) for _ in range(8)], host={"net_tx_bytes_s": writes_during(prof)})
    assert detect(w, CFG)[0].evidence["write_path"] == "network"


def test_one_pause_in_view_is_enough_with_a_write_burst() -> None:
    prof = pauses(1800, 60, start=T0 - 1300)  # one pause at T0 + 440
    w = run_window([GpuSpec(prof) for _ in range(8)], host={"disk_write_bytes_s": writes_during(prof)})
    f = detect(w, CFG)[0]
    assert f.evidence["period_s"] is None and f.evidence["pauses"] == 1
    assert f.start == pytest.approx(T0 + 440, abs=2)
    assert f.hold_s == pytest.approx(600, abs=2)


def test_evaluation_pauses_without_writes_are_not_checkpoints() -> None:
    w = run_window([GpuSpec(pauses(150, 30, lo=0.05)) for _ in range(8)])
    assert detect(w, CFG) == []


def test_pauses_of_a_few_gpus_are_not_job_wide() -> None:
    prof = pauses(150, 30)
    specs = [GpuSpec(steady(0.9)) for _ in range(8)]
    specs[0] = specs[1] = GpuSpec(prof)
    w = run_window(specs, host={"disk_write_bytes_s": writes_during(prof)})
    assert detect(w, CFG) == []


def test_without_host_data_all_ranks_idling_at_a_starvation_rhythm_is_no_checkpoint() -> None:
    w = run_window([GpuSpec(pauses(40, 15)) for _ in range(8)], no_host=True)
    assert detect(w, CFG) == []


def test_gpus_sampled_on_different_clocks_still_line_up() -> None:
    prof = pauses(150, 30)
    w = run_window([GpuSpec(prof) for _ in range(16)], host={"disk_write_bytes_s": writes_during(prof)})
    for i, key in enumerate(sorted(w.gpus)):
        s = w.gpus[key]
        s.t = s.t + 0.37 * (i % 3)
    assert len(detect(w, CFG)) == 1


@pytest.mark.parametrize("dt", [0.1, 30.0])
def test_sampling_rates(dt: float) -> None:
    prof = pauses(200, 60, start=T0 + 15)
    w = run_window(
        [GpuSpec(prof) for _ in range(4)], t=times(600, dt), host={"disk_write_bytes_s": writes_during(prof)}
    )
    f = detect(w, CFG)[0]
    assert f.evidence["period_s"] == pytest.approx(200, abs=dt + 1)


def _blocked_rank(period: float = 150, pause: float = 30, n: int = 8, writer: int = 0) -> list[GpuSpec]:
    """nvidia-smi fields only: during each pause the writer runs no kernel
    while its peers spin in the collective at 100 % GPU-Util, idle power."""
    prof = pauses(period, pause, start=T0 + 20)
    spin = {"util_pct": lambda t: np.where(prof(t) < 0.1, 100.0, 99.0)}
    drop = (
        "power_limit_w",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "temp_c",
        "throttle_reasons",
        "pcie_gen",
        "pcie_gen_max",
        "pcie_width",
        "pcie_width_max",
        "xid",
    )
    return [
        GpuSpec(prof, dcgm=False, idle_w=150.0, drop=drop, extra={} if i == writer else spin)
        for i in range(n)
    ]


def test_blocked_rank_pauses_are_checkpoints_without_host_data() -> None:
    w = run_window(_blocked_rank(writer=3), no_host=True)
    (f,) = detect(w, CFG)
    ev = f.evidence
    assert ev["basis"] == "gpu_only"
    assert ev["writer_gpu"] == "n0/3"
    assert ev["period_s"] == pytest.approx(150, abs=3)
    assert ev["pause_s"] == pytest.approx(30, abs=3)
    assert ev["run_time_lost_share"] == pytest.approx(0.2, abs=0.03)
    assert ev["activity_basis"] == "util+power_history"


def test_blocked_rank_pauses_are_not_starvation() -> None:
    from gpufleet.collector.detectors.registry import run_detectors

    w = run_window(_blocked_rank(period=40, pause=15), no_host=True)
    found = sorted(f.kind for f in run_detectors(w, CFG).findings)
    assert found == ["checkpoint_stall"]


def test_host_data_without_a_write_burst_rules_the_blocked_rank_out() -> None:
    w = run_window(_blocked_rank())  # host data, flat write rate: an evaluation pause
    assert detect(w, CFG) == []


def _sharded(d2h: float | None, rx: float = 1e6, period: float = 150, pause: float = 30) -> list[GpuSpec]:
    """Every rank idles at once (none spins) while it copies its shard out over PCIe at ``d2h`` bytes/s
    (None: no PCIe counters, as in an nvidia-smi loop)."""
    specs = _blocked_rank(period=period, pause=pause)
    prof = pauses(period, pause, start=T0 + 20)
    for s in specs:
        s.extra = (
            {}
            if d2h is None
            else {
                "pcie_tx_bytes_s": lambda t, d=d2h: np.where(prof(t) < 0.1, d, 2e8),
                "pcie_rx_bytes_s": lambda t: np.where(prof(t) < 0.1, rx, 3e9),
            }
        )
    return specs


def test_sharded_checkpoints_without_host_data_from_the_device_to_host_copy() -> None:
    (f,) = detect(run_window(_sharded(d2h=6e8), no_host=True), CFG)
    ev = f.evidence
    assert (ev["basis"], ev["signature"], ev["writer_gpu"]) == ("gpu_only", "sharded_d2h", None)
    assert ev["d2h_bytes_s"] == pytest.approx(6e8, rel=0.05) and ev["spinning_gpus"] == 0
    assert ev["period_s"] == pytest.approx(150, abs=3) and ev["pause_s"] == pytest.approx(30, abs=3)


def test_all_ranks_idle_together_without_a_copy_out_is_no_checkpoint() -> None:
    # PCIe counters that show no device-to-host copy: the ranks idle together for another reason
    assert detect(run_window(_sharded(d2h=2e6), no_host=True), CFG) == []
    # ... nor a copy that receives as much as it sends (optimizer offload, input staging)
    assert detect(run_window(_sharded(d2h=6e8, rx=6e8), no_host=True), CFG) == []


def test_sharded_checkpoints_from_an_nvidia_smi_loop_by_their_slow_regular_pauses() -> None:
    (f,) = detect(run_window(_sharded(d2h=None), no_host=True), CFG)
    assert f.evidence["signature"] == "sharded_sync" and f.evidence["d2h_bytes_s"] is None
    # at a pace an input stall keeps, every rank idling at once is starvation's, not a checkpoint
    assert detect(run_window(_sharded(d2h=None, period=40, pause=12), no_host=True), CFG) == []


def _small_job(
    period: float,
    pause: float,
    train_w: float,
    spin_share: float,
    writer_share: float,
    dt: float = 0.1,
    duration: float = 300.0,
) -> list[GpuSpec]:
    """Two ranks of an older board sampled by an nvidia-smi loop (GPU-Util and power only): every
    ``period`` rank 0 writes for ``pause`` s at GPU-Util 0-10 % while rank 1 spins at 100 %, their
    power falling to ``writer_share`` and ``spin_share`` of ``train_w``."""
    rng = np.random.default_rng(7)
    drop = (
        "power_limit_w",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "throttle_reasons",
        "pcie_gen",
        "pcie_gen_max",
        "pcie_width",
        "pcie_width_max",
        "xid",
        "temp_c",
    )

    def paused(t: np.ndarray) -> np.ndarray:
        return ((t - T0) % period) >= period - pause

    def rank(util_pause: float | None, power_share: float) -> GpuSpec:
        def util(t: np.ndarray) -> np.ndarray:
            if util_pause is None:  # spinning in the collective
                return np.full(t.shape, 100.0)
            return np.where(paused(t), util_pause * rng.uniform(0.0, 1.0, t.shape), 100.0)

        def power(t: np.ndarray) -> np.ndarray:
            return train_w * np.where(paused(t), power_share, 1.0) * (1 + 0.03 * rng.standard_normal(t.shape))

        return GpuSpec(steady(0.9), dcgm=False, drop=drop, extra={"util_pct": util, "power_w": power})

    return [rank(10.0, writer_share), rank(None, spin_share)]


def test_a_two_gpu_job_on_an_older_board_pausing_three_seconds_in_thirteen() -> None:
    """Judged by what the pauses cost (a quarter of the GPU time), not by each pause's length, and by
    each GPU's own power levels: the spinning rank still draws 55 % of its training power."""
    specs = _small_job(period=13.0, pause=3.0, train_w=230.0, spin_share=0.55, writer_share=0.55)
    (f,) = detect(run_window(specs, t=times(300, 0.1), no_host=True), CFG)
    ev = f.evidence
    assert (ev["signature"], ev["writer_gpu"]) == ("writer", "n0/0")
    assert ev["period_s"] == pytest.approx(13.0, abs=0.5) and ev["pause_s"] == pytest.approx(3.0, abs=0.5)
    assert ev["run_time_lost_share"] == pytest.approx(3 / 13, abs=0.03)


def test_a_job_that_checkpoints_after_every_step() -> None:
    specs = _small_job(period=5.0, pause=1.4, train_w=140.0, spin_share=0.5, writer_share=0.4)
    (f,) = detect(run_window(specs, t=times(300, 0.1), no_host=True), CFG)
    assert f.evidence["signature"] == "writer" and f.evidence["period_s"] == pytest.approx(5.0, abs=0.3)


def test_sub_second_dips_on_every_rank_are_no_checkpoint() -> None:
    # a kernel queue draining and refilling: every rank dips for half a second, no rank blocks
    specs = _small_job(period=22.0, pause=0.5, train_w=400.0, spin_share=0.7, writer_share=0.7)
    specs[0].extra["util_pct"] = specs[1].extra["util_pct"]
    assert detect(run_window(specs, t=times(300, 0.1), no_host=True), CFG) == []
