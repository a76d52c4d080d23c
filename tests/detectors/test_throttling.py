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
    [(0x4, "power_cap"), (0x20, "thermal"), (0x40 | 0x8, "thermal"), (0x8, "hw_slowdown"), (0x80 | 0x8, "power_brake")],
)
def test_reason_bits_name_the_cause(bits: int, cause: str) -> None:
    fs = detect(run_window([GpuSpec(steady(0.9), throttle=bits, throttle_clock=0.7)]), CFG)
    assert len(fs) == 1
    f = fs[0]
    assert (f.kind, f.cause, f.node, f.gpu, f.run_id) == ("throttling", cause, "n0", 0, "r1")
    ev = f.evidence
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
    spec = GpuSpec(steady(0.9), throttle=0x20, throttle_when=lambda t: (t > T0 + 560))
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
