"""Throttling: busy GPUs held below their maximum clock, with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.throttling import detect
from tests.detectors.builders import T0, GpuSpec, run_window, square, steady, switch, times

CFG = DetectorConfig()


@pytest.mark.parametrize(
    ("bits", "cause"),
    [
        (0x4, "power_cap"),
        (0x20, "thermal"),
        (0x40 | 0x8, "thermal"),
        (0x8, "hw_slowdown"),
        (0x80 | 0x8, "power_brake"),
    ],
)
def test_reason_bits_name_the_cause(bits: int, cause: str) -> None:
    fs = detect(run_window([GpuSpec(steady(0.9), throttle=bits, throttle_clock=0.7)]), CFG)
    assert len(fs) == 1
    f = fs[0]
    # a run's throttled GPUs are one run-scoped finding per reason, listing them
    assert (f.kind, f.cause, f.node, f.gpu, f.run_id) == ("throttling", cause, "n0", None, "r1")
    assert f.scope_key == f"throttling|run|r1|{cause}"
    ev = f.evidence
    assert [(g["node"], g["gpu"]) for g in ev["gpus"]] == [("n0", 0)] and ev["gpu_count"] == 1
    assert ev["throttled_share"] == pytest.approx(1.0)
    assert ev["clock_ratio"] == pytest.approx(0.7, abs=0.01)
    assert ev["reasons_mask"] == hex(bits)
    assert cause in ev["reasons"]
    assert ev["throttled_s"] == pytest.approx(600, abs=2)


def test_idle_gpus_with_reason_bits_are_not_throttled() -> None:
    # Idle GPUs drop their clocks and may carry power/thermal bits: not throttling.
    specs = [GpuSpec(steady(0.0), throttle=0x4 | 0x20), GpuSpec(steady(0.02), throttle=0x8)]
    w = run_window(specs)
    for s in w.gpus.values():
        s.cols["throttle_reasons"] = np.full(len(s), float(0x1 | 0x4 | 0x20))
        s.cols["sm_clock_mhz"] = np.full(len(s), 345.0)
    assert detect(w, CFG) == []


def test_clocks_at_max_despite_a_bit_are_not_throttled() -> None:
    fs = detect(run_window([GpuSpec(steady(0.9), throttle=0x4, throttle_clock=0.97)]), CFG)
    assert fs == []


def test_brief_throttling_is_not_reported() -> None:
    spec = GpuSpec(steady(0.9), throttle=0x20, throttle_when=lambda t: t > T0 + 560)
    assert detect(run_window([spec]), CFG) == []


def test_onset_and_share_since_it() -> None:
    spec = GpuSpec(steady(0.9), throttle=0x40, throttle_when=lambda t: t >= T0 + 400)
    f = detect(run_window([spec]), CFG)[0]
    assert f.start == pytest.approx(T0 + 400, abs=1)
    assert f.evidence["throttled_share"] == pytest.approx(1.0)
    assert f.last_active == pytest.approx(T0 + 599, abs=1)


def test_intermittent_throttling_while_busy() -> None:
    # Busy half the time; throttled whenever busy: share of *busy* time is 1.
    spec = GpuSpec(square(20, 0.5), throttle=0x4)
    f = detect(run_window([spec]), CFG)[0]
    assert f.evidence["throttled_share"] == pytest.approx(1.0)
    assert f.evidence["busy_s"] == pytest.approx(300, rel=0.05)


def test_recovered_gpu_is_not_reported() -> None:
    spec = GpuSpec(steady(0.9), throttle=0x4, throttle_when=lambda t: t < T0 + 450)
    assert detect(run_window([spec]), CFG) == []


def test_nvml_without_reason_bits_infers_the_cause() -> None:
    spec = GpuSpec(steady(0.9), throttle=0x4, dcgm=False, drop=("throttle_reasons",))
    f = detect(run_window([spec]), CFG)[0]
    assert f.cause == "power_cap" and f.evidence["reason_source"] == "inferred"
    hot = GpuSpec(steady(0.9), throttle=0x20, temp_busy_c=95, dcgm=False, drop=("throttle_reasons",))
    assert detect(run_window([hot]), CFG)[0].cause == "thermal"


@pytest.mark.parametrize("dt", [0.1, 30.0])
def test_sampling_rates(dt: float) -> None:
    spec = GpuSpec(steady(0.9), throttle=0x20, throttle_when=lambda t: t >= T0 + 300)
    f = detect(run_window([spec], t=times(600, dt, jitter=0.05)), CFG)[0]
    assert f.start == pytest.approx(T0 + 300, abs=dt + 1)


def test_gpu_without_a_run_is_reported_without_run_id() -> None:
    w = run_window([GpuSpec(steady(0.9), throttle=0x4)])
    w.runs = []
    f = detect(w, CFG)[0]
    assert f.run_id is None and f.gpu == 0


def test_gap_does_not_count_as_throttled_or_clear() -> None:
    t = times(600)
    keep = (t < T0 + 200) | (t > T0 + 450)
    spec = GpuSpec(switch(T0, steady(0.9), steady(0.9)), throttle=0x20)
    f = detect(run_window([spec], t=t[keep]), CFG)[0]
    assert f.evidence["throttled_s"] == pytest.approx(200 + 149, abs=3)


def test_many_gpus_of_a_run_throttled_for_one_reason_are_one_finding() -> None:
    # 8 GPUs on two nodes: six power-capped (from different onsets), one thermal, one fine
    specs = [
        GpuSpec(
            steady(0.9),
            throttle=0x4,
            throttle_clock=0.5 + 0.04 * i,
            throttle_when=(lambda t, i=i: t >= T0 + 20 * i),
        )
        for i in range(6)
    ]
    specs += [GpuSpec(steady(0.9), throttle=0x20, throttle_clock=0.8), GpuSpec(steady(0.9))]
    fs = detect(run_window(specs, gpus_per_node=4), CFG)
    assert sorted((f.cause, f.scope_key) for f in fs) == [
        ("power_cap", "throttling|run|r1|power_cap"),
        ("thermal", "throttling|run|r1|thermal"),
    ]
    cap = next(f for f in fs if f.cause == "power_cap")
    ev = cap.evidence
    assert [(g["node"], g["gpu"]) for g in ev["gpus"]] == [
        ("n0", 0),
        ("n0", 1),
        ("n0", 2),
        ("n0", 3),
        ("n1", 0),
        ("n1", 1),
    ]
    assert ev["gpu_count"] == 6 and cap.node is None and cap.gpu is None and cap.run_id == "r1"
    # each GPU keeps its own evidence; the top level summarises them
    assert [g["clock_ratio"] for g in ev["gpus"]] == pytest.approx(
        [0.5, 0.54, 0.58, 0.62, 0.66, 0.7], abs=0.01
    )
    assert ev["clock_ratio"] == pytest.approx(0.6, abs=0.01)
    assert ev["throttled_s"] == pytest.approx(600, abs=2) and ev["reasons"] == ["power_cap"]
    assert ev["reasons_mask"] == "0x4" and ev["reason_source"] == "bitmask"
    assert cap.start == pytest.approx(T0, abs=1)  # the earliest GPU's onset
    # clocks at half of maximum are severe: the group is as severe as its worst GPU
    assert cap.severity == "critical"
    thermal = next(f for f in fs if f.cause == "thermal")
    assert thermal.node == "n1" and [g["gpu"] for g in thermal.evidence["gpus"]] == [2]


def test_the_group_is_one_incident_that_follows_its_gpus() -> None:
    from gpufleet.collector.incidents import MemoryIncidentStore

    store = MemoryIncidentStore()
    two = [
        GpuSpec(steady(0.9), throttle=0x4, throttle_clock=0.7),
        GpuSpec(steady(0.9), throttle=0x4, throttle_clock=0.7),
    ]
    store.sweep(detect(run_window([*two, GpuSpec(steady(0.9))]), CFG), T0 + 600, 120)
    three = [*two, GpuSpec(steady(0.9), throttle=0x4, throttle_clock=0.7)]
    plan = store.sweep(detect(run_window(three), CFG), T0 + 660, 120)
    assert not plan.opens and len(plan.updates) == 1  # a third GPU joins the same incident
    (inc,) = store.open_incidents()
    assert inc.scope_key == "throttling|run|r1|power_cap" and len(inc.evidence["gpus"]) == 3


def test_the_group_takes_the_node_of_its_gpus_as_they_change() -> None:
    from gpufleet.collector.incidents import MemoryIncidentStore

    store = MemoryIncidentStore()
    hot = GpuSpec(steady(0.9), throttle=0x20, throttle_clock=0.7)
    store.sweep(detect(run_window([hot, GpuSpec(steady(0.9))], gpus_per_node=1), CFG), T0 + 600, 120)
    assert store.open_incidents()[0].node == "n0"
    store.sweep(detect(run_window([hot, hot], gpus_per_node=1), CFG), T0 + 660, 120)
    (inc,) = store.open_incidents()
    assert inc.node is None and [g["node"] for g in inc.evidence["gpus"]] == ["n0", "n1"]
