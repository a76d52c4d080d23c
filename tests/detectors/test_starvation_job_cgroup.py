"""Starvation's cause from the job's own cgroup (the GPU rows' job_* columns), the host as the fallback."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig, RunInfo
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.hosts import job_pressure
from gpufleet.collector.detectors.starvation import detect
from tests.detectors.builders import GpuSpec, noisy, run_window, square, steady

CFG = DetectorConfig()
#: A 192-core host whose CPUs are mostly idle.
BIG_IDLE_HOST = {"cpu_user_pct": 7.0, "cpu_count": 192.0, "cpu_iowait_pct": 0.3}


def const(v: float) -> Any:
    return lambda t: np.full(t.shape, v)


def job(
    cores: float,
    quota: float | None = None,
    throttled: float | None = None,
    cpu_psi: float = 0.5,
    io_psi: float = 0.2,
) -> dict[str, Any]:
    nan = float("nan")
    return {
        "job_cpu_cores": const(cores),
        "job_cpu_quota_cores": const(nan if quota is None else quota),
        "job_cpu_throttled_share": const(nan if throttled is None else throttled),
        "job_cpu_pressure_pct": const(cpu_psi),
        "job_io_pressure_pct": const(io_psi),
    }


def starving(extra: dict[str, Any] | None = None, n: int = 8, profile: Any = None) -> list[GpuSpec]:
    return [GpuSpec(profile or noisy(square(20, 0.5), seed=i), extra=extra or {}) for i in range(n)]


def one(findings: list) -> Any:
    assert len(findings) == 1, findings
    return findings[0]


def test_a_loader_at_its_quota_on_a_big_idle_host_is_cpu_starved() -> None:
    w = run_window(starving(job(11.8, quota=12.0, throttled=0.91, cpu_psi=96.0)), host=BIG_IDLE_HOST)
    f = one(detect(w, CFG))
    assert f.cause == "cpu" and f.evidence["pattern"] == "oscillating"
    ev = f.evidence
    assert ev["cause_basis"] == "job_cgroup" and ev["job_cause_basis"] == "throttled"
    assert ev["job_node"] == "n0" and ev["job_cpu_quota_cores"] == pytest.approx(12.0)
    assert ev["job_cpu_cores"] == pytest.approx(11.8) and ev["job_cpu_throttled_share"] == pytest.approx(0.91)
    assert ev["cpu_user_pct"] == pytest.approx(7.0)  # the host alone would not say it
    # Without the job's cgroup, the same GPUs and host give no cause.
    bare = one(detect(run_window(starving(), host=BIG_IDLE_HOST), CFG))
    assert (
        bare.cause == "unknown" and bare.evidence["cause_basis"] is None and bare.evidence["job_node"] is None
    )


def test_at_quota_alone_or_cpu_pressure_alone_is_enough() -> None:
    # A cpuset-limited job (Slurm): no CFS throttling, CPU used up to what it may use.
    f = one(detect(run_window(starving(job(11.9, quota=12.0)), host=BIG_IDLE_HOST), CFG))
    assert (f.cause, f.evidence["job_cause_basis"]) == ("cpu", "quota")
    # No quota at all, tasks waiting for CPU most of the time.
    f = one(detect(run_window(starving(job(60.0, cpu_psi=55.0)), host=BIG_IDLE_HOST), CFG))
    assert (f.cause, f.evidence["job_cause_basis"]) == ("cpu", "cpu_pressure")


def test_the_jobs_io_pressure_says_io_where_the_host_shows_little() -> None:
    # Reads from network storage: local disks idle, iowait diluted over 192 CPUs.
    f = one(detect(run_window(starving(job(3.0, io_psi=62.0)), host=BIG_IDLE_HOST), CFG))
    assert (f.cause, f.evidence["cause_basis"], f.evidence["job_cause_basis"]) == (
        "io",
        "job_cgroup",
        "io_pressure",
    )


def test_a_job_cgroup_without_shortage_leaves_the_cause_to_the_host() -> None:
    f = one(
        detect(run_window(starving(job(4.0, quota=32.0, throttled=0.0)), host={"cpu_user_pct": 95.0}), CFG)
    )
    assert (f.cause, f.evidence["cause_basis"]) == ("cpu", "host")
    assert f.evidence["job_cpu_quota_cores"] == pytest.approx(32.0)


def test_the_stronger_of_cpu_and_io_decides() -> None:
    f = one(detect(run_window(starving(job(11.9, quota=12.0, throttled=0.3, io_psi=90.0)), host={}), CFG))
    assert f.cause == "io"  # 90 % I/O pressure is 4.5x its threshold; CPU at most 1.2x


def test_a_throttled_job_whose_gpus_keep_up_is_not_starved() -> None:
    specs = [
        GpuSpec(noisy(steady(0.9), seed=i), extra=job(11.9, quota=12.0, throttled=0.9, cpu_psi=90.0))
        for i in range(8)
    ]
    assert detect(run_window(specs, host=BIG_IDLE_HOST), CFG) == []


def test_steady_low_at_its_own_quota_is_starved_whatever_a_neighbour_does() -> None:
    """Node-wide counters cannot say whose load it is; the job's own cgroup can."""
    low = [
        GpuSpec(noisy(steady(0.25), seed=i), extra=job(5.9, quota=6.0, throttled=0.8, cpu_psi=80.0))
        for i in range(4)
    ]
    busy = [GpuSpec(noisy(steady(0.9), seed=10 + i)) for i in range(4)]
    w = run_window(busy + low, host=BIG_IDLE_HOST, run_id="trainer")
    keys = w.runs[0].allocations
    w.runs[:] = [
        RunInfo("trainer", w.runs[0].start, None, keys[:4]),
        RunInfo("starved", w.runs[0].start, None, keys[4:]),
    ]
    f = one(detect(w, CFG))
    assert (f.run_id, f.cause, f.evidence["pattern"], f.evidence["cause_basis"]) == (
        "starved",
        "cpu",
        "steady_low",
        "job_cgroup",
    )
    # The same run without its cgroup figures: host idle, nothing to report.
    plain = [GpuSpec(noisy(steady(0.25), seed=i)) for i in range(4)]
    w2 = run_window(busy + plain, host=BIG_IDLE_HOST)
    w2.runs[:] = [
        RunInfo("trainer", w2.runs[0].start, None, keys[:4]),
        RunInfo("starved", w2.runs[0].start, None, keys[4:]),
    ]
    assert detect(w2, CFG) == []


def test_the_worst_node_of_a_multi_node_run_is_reported() -> None:
    specs = starving(job(3.0, quota=12.0, throttled=0.0), n=8) + starving(
        job(11.9, quota=12.0, throttled=0.9), n=8
    )
    w = run_window(specs, host=BIG_IDLE_HOST)
    fr = Frame(w, CFG)
    rows = list(range(fr.rows))
    jp = job_pressure(fr, rows, w.t_start, w.t_end, CFG)
    assert (jp.cause, jp.node, jp.basis) == ("cpu", "n1", "throttled")
    assert jp.throttled_share == pytest.approx(0.9)
    f = one(detect(w, CFG))
    assert f.cause == "cpu" and f.evidence["job_node"] == "n1"


def test_thresholds_are_settings() -> None:
    w = run_window(starving(job(11.8, quota=12.0, throttled=0.3, cpu_psi=20.0)), host=BIG_IDLE_HOST)
    assert one(detect(w, CFG)).cause == "cpu"
    strict = DetectorConfig(
        job_at_quota_share=1.0, job_throttled_high_share=0.5, job_cpu_pressure_high_pct=50.0
    )
    assert one(detect(w, strict)).cause == "unknown"
