"""Starvation: oscillating or steadily low GPUs of a run, and the hosts' part in it."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig, RunInfo
from gpufleet.collector.detectors.starvation import detect
from tests.detectors.builders import (
    T0,
    GpuSpec,
    averaged,
    noisy,
    pauses,
    ramp_after,
    run_window,
    square,
    steady,
    switch,
    times,
)

CFG = DetectorConfig()
CPU_BUSY = {"cpu_user_pct": 95.0}
IO_BUSY = {"cpu_iowait_pct": 35.0, "disk_util_pct": 99.0, "disk_await_ms": 80.0, "cpu_user_pct": 12.0}


def one(findings: list) -> object:
    assert len(findings) == 1, findings
    return findings[0]


@pytest.mark.parametrize(("host", "cause"), [(CPU_BUSY, "cpu"), (IO_BUSY, "io"), ({}, "unknown")])
def test_oscillating_run_is_starved_with_the_hosts_cause(host: dict, cause: str) -> None:
    w = run_window([GpuSpec(noisy(square(20, 0.5), seed=i)) for i in range(16)], host=host)
    f = one(detect(w, CFG))
    assert f.kind == "starvation" and f.run_id == "r1" and f.node is None and f.gpu is None
    assert f.cause == cause
    ev = f.evidence
    assert ev["pattern"] == "oscillating"
    assert ev["period_s"] == pytest.approx(20, abs=1)
    assert ev["duty_cycle"] == pytest.approx(0.5, abs=0.06)
    assert ev["depth"] > 0.7
    assert ev["gpu_time_lost_share"] == pytest.approx(0.5, abs=0.1)
    assert ev["gpus_affected"] == 16
    for key in ("cpu_user_pct", "iowait_pct", "disk_util_pct"):
        assert key in ev
    assert ev["host"] in ("n0", "n1")


def test_no_host_data_gives_cause_unknown() -> None:
    w = run_window([GpuSpec(square(20, 0.4)) for _ in range(8)], no_host=True, host=CPU_BUSY)
    f = one(detect(w, CFG))
    assert f.cause == "unknown"
    assert f.evidence["cpu_user_pct"] is None and f.evidence["host"] is None


def test_nvml_only_gpus_fall_back_to_power_and_util() -> None:
    w = run_window([GpuSpec(square(20, 0.5), dcgm=False) for _ in range(8)], host=CPU_BUSY)
    f = one(detect(w, CFG))
    assert f.cause == "cpu"
    assert f.evidence["activity_source"] == "nvml"


@pytest.mark.parametrize(("dt", "period"), [(0.1, 4.0), (1.0, 20.0), (30.0, 60.0)])
def test_sampling_rates(dt: float, period: float) -> None:
    # Phase edges a quarter period away from the samples: no aliasing at 30 s.
    prof = [noisy(square(period, 0.5, start=T0 + period / 4), sd=0.02, seed=i) for i in range(4)]
    w = run_window([GpuSpec(p) for p in prof], t=times(600, dt, jitter=0.05), host=CPU_BUSY)
    f = one(detect(w, CFG))
    assert f.evidence["period_s"] == pytest.approx(period, rel=0.1)


def test_coarse_averaged_samples_of_a_fast_cycle() -> None:
    # A 30 s busy/idle cycle seen through 10 s averages: 0.9, 0.54, 0.2 ...
    prof = averaged(square(30, 0.6), 10.0)
    w = run_window([GpuSpec(prof) for _ in range(8)], t=times(600, 10.0), host=IO_BUSY)
    f = one(detect(w, CFG))
    assert f.cause == "io"
    assert f.evidence["period_s"] == pytest.approx(30, abs=1)


def test_cycle_averaged_away_leaves_a_low_mean() -> None:
    # Sampled once per cycle, only the mean remains: steady, and low.
    prof = averaged(square(30, 0.4, hi=0.95), 30.0)
    w = run_window([GpuSpec(prof) for _ in range(8)], t=times(600, 30.0), host=CPU_BUSY)
    f = one(detect(w, CFG))
    assert (f.cause, f.evidence["pattern"]) == ("cpu", "steady_low")


def test_onset_inside_the_window_is_dated_from_the_first_idle_phase() -> None:
    prof = switch(T0 + 300, steady(0.9), square(20, 0.4, start=T0 + 300))
    w = run_window([GpuSpec(prof) for _ in range(8)], host=CPU_BUSY)
    f = one(detect(w, CFG))
    assert T0 + 300 <= f.start <= T0 + 300 + 20


def test_steady_low_activity_on_idle_hosts_is_not_starvation() -> None:
    w = run_window([GpuSpec(noisy(steady(0.25), seed=i)) for i in range(8)])
    assert detect(w, CFG) == []


@pytest.mark.parametrize(("host", "cause"), [(CPU_BUSY, "cpu"), (IO_BUSY, "io")])
def test_steady_low_activity_with_a_saturated_host_is(host: dict, cause: str) -> None:
    w = run_window([GpuSpec(noisy(steady(0.25), seed=i)) for i in range(8)], host=host)
    f = one(detect(w, CFG))
    assert f.cause == cause
    assert f.evidence["pattern"] == "steady_low"
    assert f.evidence["mean_activity"] == pytest.approx(0.25, abs=0.03)


def _shared_node(neighbour: GpuSpec) -> object:
    """A serving run on GPUs 4-7 of a node whose GPUs 0-3 belong to another
    run, with the node's iowait high (the demo's h100-04)."""
    w = run_window(
        [neighbour] * 4 + [GpuSpec(noisy(steady(0.25), seed=i)) for i in range(4)],
        host=IO_BUSY,
        run_id="trainer",
    )
    trainer = w.runs[0]
    keys = trainer.allocations
    w.runs[:] = [
        RunInfo("trainer", trainer.start, None, keys[:4]),
        RunInfo("serve", trainer.start, None, keys[4:]),
    ]
    return w


@pytest.mark.parametrize(
    "neighbour",
    [
        GpuSpec(noisy(steady(0.9))),  # a busy trainer
        GpuSpec(square(period=20, duty=0.5)),  # a trainer whose own loader starves it
    ],
)
def test_steady_low_run_is_not_blamed_for_a_neighbours_host_pressure(neighbour: GpuSpec) -> None:
    """Node-wide iowait cannot say whose I/O it is: with another run working
    or swinging on the node, the lightly loaded run is not called starved,
    whatever else the same sweep reports (live and replay decide alike)."""
    w = _shared_node(neighbour)
    assert [f.run_id for f in detect(w, CFG) if f.evidence["pattern"] == "steady_low"] == []


def test_steady_low_runs_alone_on_a_saturated_shared_node_are_still_starved() -> None:
    w = _shared_node(GpuSpec(noisy(steady(0.2), seed=9)))
    assert {(f.run_id, f.cause, f.evidence["pattern"]) for f in detect(w, CFG)} == {
        ("trainer", "io", "steady_low"),
        ("serve", "io", "steady_low"),
    }


def test_steady_low_without_host_data_is_not_reported() -> None:
    w = run_window([GpuSpec(steady(0.25)) for _ in range(8)], no_host=True)
    assert detect(w, CFG) == []


def test_warmup_at_run_start_is_not_starvation() -> None:
    # Model load and compilation: GPUs idle, CPUs busy, for four minutes.
    w = run_window([GpuSpec(ramp_after(240)) for _ in range(8)], run_start=T0, host=CPU_BUSY)
    assert detect(w, CFG) == []
    # A run that started 200 s before the window's end, still loading.
    w = run_window([GpuSpec(ramp_after(650)) for _ in range(8)], run_start=T0 + 400, host=CPU_BUSY)
    assert detect(w, CFG) == []
    # Low for longer than warm-up may last: reported.
    w = run_window([GpuSpec(ramp_after(900)) for _ in range(8)], run_start=T0 - 100, host=CPU_BUSY)
    assert one(detect(w, CFG)).start >= T0 - 100 + CFG.warmup_max_s


def test_short_evaluation_pauses_are_not_starvation() -> None:
    # 10 s of evaluation every 2 minutes, GPUs nearly idle meanwhile.
    w = run_window([GpuSpec(pauses(120, 10, lo=0.05)) for _ in range(8)], host=CPU_BUSY)
    assert detect(w, CFG) == []


def test_checkpoint_pauses_with_write_bursts_are_left_to_their_detector() -> None:
    prof = pauses(60, 20)
    writes = lambda t: np.where(prof(t) < 0.1, 3e9, 2e6)  # noqa: E731
    w = run_window([GpuSpec(prof) for _ in range(8)], host={"disk_write_bytes_s": writes})
    assert detect(w, CFG) == []
    # The same pauses with no write burst are starvation.
    w = run_window([GpuSpec(prof) for _ in range(8)])
    assert one(detect(w, CFG)).cause == "unknown"


def test_a_straggler_holding_the_others_back_is_not_starvation() -> None:
    specs = [GpuSpec(steady(0.4)) for _ in range(8)]
    specs[3] = GpuSpec(steady(0.95))
    w = run_window(specs, host=CPU_BUSY)
    assert detect(w, CFG) == []


def test_a_few_oscillating_gpus_do_not_make_the_run_starved() -> None:
    specs = [GpuSpec(steady(0.9)) for _ in range(8)]
    specs[0] = specs[1] = GpuSpec(square(20, 0.5))
    assert detect(run_window(specs, host=CPU_BUSY), CFG) == []


def test_gaps_are_not_idle_time() -> None:
    t = times(600)
    keep = ~(
        ((t > T0 + 100) & (t < T0 + 130))
        | ((t > T0 + 300) & (t < T0 + 320))
        | ((t > T0 + 450) & (t < T0 + 470))
    )
    w = run_window([GpuSpec(steady(0.9)) for _ in range(4)], t=t[keep], host=CPU_BUSY)
    assert detect(w, CFG) == []
    # An oscillation survives a gap.
    w = run_window([GpuSpec(square(20, 0.5)) for _ in range(4)], t=t[keep], host=CPU_BUSY)
    assert one(detect(w, CFG)).evidence["period_s"] == pytest.approx(20, abs=1)


def test_recovered_run_is_no_longer_reported() -> None:
    prof = switch(T0 + 250, square(20, 0.5), steady(0.9))
    w = run_window([GpuSpec(prof) for _ in range(8)], host=CPU_BUSY)
    assert detect(w, CFG) == []


def test_gpus_without_a_run_are_ignored() -> None:
    w = run_window([GpuSpec(square(20, 0.5)) for _ in range(8)], host=CPU_BUSY)
    w.runs = []
    assert detect(w, CFG) == []
