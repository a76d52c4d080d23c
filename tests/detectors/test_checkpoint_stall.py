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


def test_no_host_data_no_finding() -> None:
    w = run_window([GpuSpec(pauses(150, 30)) for _ in range(8)], no_host=True)
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
    w = run_window([GpuSpec(prof) for _ in range(4)], t=times(600, dt),
                   host={"disk_write_bytes_s": writes_during(prof)})
    f = detect(w, CFG)[0]
    assert f.evidence["period_s"] == pytest.approx(200, abs=dt + 1)


def _blocked_rank(period: float = 150, pause: float = 30, n: int = 8, writer: int = 0) -> list[GpuSpec]:
    """nvidia-smi fields only: during each pause the writer runs no kernel
    while its peers spin in the collective at 100 % GPU-Util, idle power."""
    prof = pauses(period, pause, start=T0 + 20)
    spin = {"util_pct": lambda t: np.where(prof(t) < 0.1, 100.0, 99.0)}
    drop = ("power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "throttle_reasons",
            "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "xid")
    return [GpuSpec(prof, dcgm=False, idle_w=150.0, drop=drop, extra={} if i == writer else spin)
            for i in range(n)]


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


def test_all_ranks_idle_together_without_host_data_is_no_checkpoint() -> None:
    specs = _blocked_rank()
    for s in specs:
        s.extra = {}
    assert detect(run_window(specs, no_host=True), CFG) == []
