"""Idle allocations: a run holds GPUs that do no work, all of them or some for the run's whole life."""

from __future__ import annotations

import numpy as np

from gpufleet.collector.detectors import DetectorConfig, run_detectors
from gpufleet.collector.detectors.idle_allocation import detect
from gpufleet.collector.detectors.window import RunInfo
from tests.detectors.builders import T0, GpuSpec, pauses, run_window, steady, switch, times

CFG = DetectorConfig()


def spinning() -> GpuSpec:
    """A rank polling in a collective: GPU-Util 100 %, little SM activity, idle-level power."""
    return GpuSpec(steady(0.12), extra={"util_pct": steady(100.0)})


def test_a_run_whose_gpus_all_stop_working_for_ten_minutes_is_an_idle_allocation() -> None:
    busy_then_idle = switch(T0 + 240, steady(0.9), steady(0.0))
    w = run_window([GpuSpec(busy_then_idle) for _ in range(8)], t=times(900))
    (f,) = detect(w, CFG)
    assert f.kind == "idle_allocation" and f.run_id == "r1" and f.node is None and f.gpu is None
    ev = f.evidence
    assert ev["scope"] == "all" and ev["idle_gpus"] == 8 == ev["gpu_count"]
    assert abs(f.start - (T0 + 240)) <= 2.0
    assert [(g["node"], g["gpu"]) for g in ev["gpus"]] == [("n0", i) for i in range(8)]
    assert all(
        g["util_pct"] == 0.0 and g["power_w"] is not None and g["since"].endswith("Z") for g in ev["gpus"]
    )
    assert ev["idle_s"] >= 600 and ev["since_before_window"] is False


def test_nine_minutes_idle_is_not_yet_an_incident() -> None:
    w = run_window([GpuSpec(switch(T0 + 360, steady(0.9), steady(0.0))) for _ in range(8)], t=times(900))
    assert detect(w, CFG) == []


def test_work_that_resumes_ends_it() -> None:
    prof = switch(T0 + 860, switch(T0 + 100, steady(0.9), steady(0.0)), steady(0.9))
    w = run_window([GpuSpec(prof) for _ in range(8)], t=times(900))
    assert detect(w, CFG) == []


def test_a_notebook_that_never_computes_is_idle_from_its_start_whatever_its_warm_up() -> None:
    t = times(900)
    w = run_window([GpuSpec(steady(0.0)) for _ in range(4)], t=t, run_start=T0 + 100)
    (f,) = detect(w, CFG)
    assert f.evidence["scope"] == "all" and abs(f.start - (T0 + 100)) <= 2.0


def test_six_of_eight_gpus_used_names_the_two_idle_ones() -> None:
    specs = [GpuSpec(steady(0.85)) for _ in range(6)] + [GpuSpec(steady(0.0)) for _ in range(2)]
    w = run_window(specs, t=times(700))
    (f,) = detect(w, CFG)
    assert f.evidence["scope"] == "some" and f.evidence["idle_gpus"] == 2 and f.evidence["gpu_count"] == 8
    assert [(g["node"], g["gpu"]) for g in f.evidence["gpus"]] == [("n0", 6), ("n0", 7)]
    assert f.evidence["since_before_window"] is True


def test_gpus_that_stop_mid_window_while_peers_work_are_not_idle_allocations() -> None:
    """Some GPUs are an idle allocation only when idle since the run (or the window) began."""
    specs = [GpuSpec(steady(0.85)) for _ in range(6)] + [
        GpuSpec(switch(T0 + 50, steady(0.85), steady(0.0))) for _ in range(2)
    ]
    assert detect(run_window(specs, t=times(900)), CFG) == []


def test_pauses_evaluation_and_checkpoints_are_not_idle() -> None:
    # two-minute pauses every five minutes, and a long evaluation at GPU-Util 90 %
    specs = [GpuSpec(pauses(300, 120)) for _ in range(8)]
    assert detect(run_window(specs, t=times(1200)), CFG) == []
    evals = [GpuSpec(steady(0.5), extra={"util_pct": steady(90.0)}) for _ in range(8)]
    assert detect(run_window(evals, t=times(900)), CFG) == []


def test_idle_gpus_no_run_holds_are_spare_capacity() -> None:
    w = run_window([GpuSpec(steady(0.0)) for _ in range(8)], t=times(900))
    w.runs = []
    assert detect(w, CFG) == []
    # ... and a run that has ended does not hold them afterwards
    w.runs = [RunInfo("r1", T0 - 3600, T0 + 100, [("n0", g) for g in range(8)])]
    assert detect(w, CFG) == []


def test_a_dead_rank_among_spinning_peers_is_a_hang_not_an_idle_allocation() -> None:
    specs = [GpuSpec(steady(0.0))] + [spinning() for _ in range(7)]
    w = run_window(specs, t=times(900))
    assert detect(w, CFG) == []
    assert [f.kind for f in run_detectors(w, CFG).findings] == ["hung_collective"]


def test_nvidia_smi_fields_only_without_limit_or_model() -> None:
    """An nvidia-smi loop: GPU-Util and power, no limit, no model, no DCGM fields."""
    drop = (
        "power_limit_w",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "throttle_reasons",
        "pcie_gen",
        "pcie_gen_max",
        "pcie_width",
        "pcie_width_max",
    )
    busy_then_idle = switch(T0 + 200, steady(0.9), steady(0.0))
    w = run_window(
        [GpuSpec(busy_then_idle, dcgm=False, drop=drop) for _ in range(2)], t=times(900, dt=0.1), no_host=True
    )
    (f,) = detect(w, CFG)
    assert f.evidence["scope"] == "all" and abs(f.start - (T0 + 200)) <= 1.0


def test_a_probe_waking_the_gpu_for_a_sample_does_not_end_it() -> None:
    blips = {T0 + 300 + 60 * k for k in range(8)}

    def prof(t: np.ndarray) -> np.ndarray:
        out = np.zeros(t.shape)
        for b in blips:
            out[np.abs(t - b) < 0.5] = 0.3
        return out

    w = run_window([GpuSpec(prof) for _ in range(8)], t=times(900))
    (f,) = detect(w, CFG)
    assert f.evidence["scope"] == "all"
