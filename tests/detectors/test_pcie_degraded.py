"""Degraded PCIe links on busy GPUs; idle downshift is normal."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.pcie_degraded import detect
from tests.detectors.builders import T0, GpuSpec, run_window, steady, times

CFG = DetectorConfig()


@pytest.mark.parametrize(
    ("gen", "width", "severity"), [(5, 8, "critical"), (4, 16, "warning"), (3, 16, "critical")]
)
def test_degraded_link_while_busy(gen: int, width: int, severity: str) -> None:
    fs = detect(run_window([GpuSpec(steady(0.9), pcie_gen=gen, pcie_width=width)]), CFG)
    assert len(fs) == 1
    f = fs[0]
    assert (f.kind, f.node, f.gpu, f.run_id, f.severity) == ("pcie_degraded", "n0", 0, "r1", severity)
    ev = f.evidence
    assert (ev["pcie_gen"], ev["pcie_gen_max"], ev["pcie_width"], ev["pcie_width_max"]) == (gen, 5, width, 16)
    assert ev["degraded_share"] == pytest.approx(1.0)


def test_idle_gpus_downshift_legitimately() -> None:
    specs = [GpuSpec(steady(0.0)), GpuSpec(steady(0.05), pcie_width=4)]
    assert detect(run_window(specs), CFG) == []


def test_link_downshift_between_bursts_is_not_degradation() -> None:
    # Busy/idle alternation: the link drops to gen 1 only while idle.
    prof = lambda t: np.where(np.mod(t - T0, 60) < 30, 0.9, 0.0)  # noqa: E731
    assert detect(run_window([GpuSpec(prof)]), CFG) == []


def test_missing_maximum_falls_back_to_the_highest_seen() -> None:
    spec = GpuSpec(steady(0.9), pcie_gen=5, drop=("pcie_gen_max", "pcie_width_max"))
    w = run_window([spec])
    s = w.gpus[("n0", 0)]
    s.cols["pcie_width"] = np.where(s.t >= T0 + 300, 8.0, 16.0)
    f = detect(w, CFG)[0]
    assert f.evidence["pcie_width"] == 8 and f.start == pytest.approx(T0 + 300, abs=1)


def test_no_link_columns_no_findings() -> None:
    spec = GpuSpec(steady(0.9), drop=("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"))
    assert detect(run_window([spec]), CFG) == []


@pytest.mark.parametrize("dt", [0.1, 30.0])
def test_sampling_rates(dt: float) -> None:
    w = run_window([GpuSpec(steady(0.9), pcie_width=8), GpuSpec(steady(0.9))], t=times(600, dt))
    assert [f.gpu for f in detect(w, CFG)] == [0]


def test_nvml_only() -> None:
    w = run_window([GpuSpec(steady(0.9), pcie_width=8, dcgm=False)])
    assert [f.gpu for f in detect(w, CFG)] == [0]
