"""NVLink degradation: links down, collectives over PCIe, rising link errors; PCIe-only boards and
GPUs that never talk to each other stay silent."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.nvlink_degraded import detect
from gpufleet.collector.detectors.registry import DETECTORS
from tests.detectors.builders import T0, GpuSpec, run_window, steady, times

CFG = DetectorConfig()
HEALTHY_NVL = 25e9
INPUT_PCIE = (2e6, 40e6)  # tx, rx of a data loader: small and one-sided


def const(v: float):  # type: ignore[no-untyped-def]
    return lambda t: np.full(t.shape, float(v))


def nvl_gpu(
    nvl: float = HEALTHY_NVL,
    pcie: tuple[float, float] = INPUT_PCIE,
    links: float | None = 18,
    links_max: float | None = 18,
    act: float = 0.85,
    **extra,
) -> GpuSpec:  # type: ignore[no-untyped-def]
    cols = {
        "nvlink_tx_bytes_s": const(nvl),
        "nvlink_rx_bytes_s": const(nvl),
        "pcie_tx_bytes_s": const(pcie[0]),
        "pcie_rx_bytes_s": const(pcie[1]),
    }
    if links is not None:
        cols["nvlink_links_up"] = const(links)
    if links_max is not None:
        cols["nvlink_links_max"] = const(links_max)
    cols.update(extra)
    return GpuSpec(steady(act), extra=cols)


def test_registered() -> None:
    assert DETECTORS["nvlink_degraded"] is detect


def test_healthy_node_is_silent() -> None:
    assert detect(run_window([nvl_gpu() for _ in range(8)]), CFG) == []


def test_links_down_on_one_gpu() -> None:
    specs = [nvl_gpu() for _ in range(8)]
    specs[3] = nvl_gpu(links=12)
    (f,) = detect(run_window(specs), CFG)
    assert (f.kind, f.cause, f.severity, f.node, f.gpu, f.run_id) == (
        "nvlink_degraded",
        "links_down",
        "warning",
        "n0",
        3,
        "r1",
    )
    assert (f.evidence["links_up"], f.evidence["links_expected"], f.evidence["links_down"]) == (12, 18, 6)
    assert f.evidence["down_s"] >= 590


def test_every_link_down_is_critical_and_carries_the_fallback_numbers() -> None:
    specs = [nvl_gpu(nvl=4e9) for _ in range(8)]
    specs[5] = nvl_gpu(nvl=0.0, pcie=(12e9, 12e9), links=0)
    (f,) = detect(run_window(specs), CFG)
    assert (f.cause, f.severity, f.gpu) == ("links_down", "critical", 5)
    assert f.evidence["issues"] == ["links_down", "pcie_fallback"]
    assert f.evidence["nvlink_bytes_s"] == 0 and f.evidence["pcie_rx_bytes_s"] == pytest.approx(12e9)


def test_link_state_read_every_ten_seconds_still_counts_as_down() -> None:
    specs = [nvl_gpu() for _ in range(8)]
    w = run_window(specs)
    s = w.gpus[("n0", 2)]
    sparse = np.full(s.t.shape, np.nan)
    sparse[::10] = 16
    s.cols["nvlink_links_up"] = sparse
    s.cols["nvlink_links_max"] = np.where(np.isfinite(sparse), 18.0, np.nan)
    (f,) = detect(w, CFG)
    assert (f.gpu, f.cause, f.evidence["links_up"]) == (2, "links_down", 16)


def test_without_links_max_the_node_peers_set_the_expectation() -> None:
    specs = [nvl_gpu(links_max=None) for _ in range(8)]
    specs[1] = nvl_gpu(links=14, links_max=None)
    (f,) = detect(run_window(specs), CFG)
    assert (f.gpu, f.evidence["links_expected"]) == (1, 18)


def test_a_link_that_retrains_within_seconds_is_not_down() -> None:
    specs = [nvl_gpu() for _ in range(8)]
    w = run_window(specs)
    s = w.gpus[("n0", 4)]
    s.cols["nvlink_links_up"] = np.where((s.t > T0 + 300) & (s.t < T0 + 320), 17.0, 18.0)
    assert detect(w, CFG) == []


def test_fabric_manager_down_collectives_over_pcie_on_every_gpu() -> None:
    specs = [nvl_gpu(nvl=0.0, pcie=(9e9, 9e9)) for _ in range(8)]
    fs = detect(run_window(specs), CFG)
    assert sorted(f.gpu for f in fs) == list(range(8))  # type: ignore[type-var]
    f = fs[0]
    assert (f.cause, f.severity) == ("pcie_fallback", "critical")
    assert f.evidence["nvlink_bytes_s"] == 0 and f.evidence["pcie_tx_bytes_s"] == pytest.approx(9e9)


def test_one_gpu_far_below_its_peers_with_its_collectives_on_pcie() -> None:
    specs = [nvl_gpu() for _ in range(8)]
    specs[6] = nvl_gpu(nvl=2e9, pcie=(8e9, 8e9))
    (f,) = detect(run_window(specs), CFG)
    assert (f.gpu, f.cause) == (6, "pcie_fallback")
    assert f.evidence["peers_nvlink_bytes_s"] == pytest.approx(HEALTHY_NVL)


def test_pcie_only_boards_are_not_degraded() -> None:
    """L40S-like boxes: no NVLink at all (links NULL, bytes 0 or NULL), collectives over PCIe by design."""
    for nvl in (0.0, np.nan):
        specs = [nvl_gpu(nvl=nvl, pcie=(8e9, 8e9), links=None, links_max=None) for _ in range(8)]
        assert detect(run_window(specs), CFG) == [], nvl
    specs = [nvl_gpu(nvl=0.0, pcie=(8e9, 8e9), links=0, links_max=0) for _ in range(8)]
    assert detect(run_window(specs), CFG) == []


def test_gpus_that_never_talk_are_not_a_broken_fabric() -> None:
    """Inference replicas on an HGX node: no NVLink traffic, and no collective on PCIe either."""
    specs = [nvl_gpu(nvl=0.0, pcie=(5e6, 80e6), act=0.4) for _ in range(8)]
    assert detect(run_window(specs), CFG) == []


def test_single_gpu_runs_and_warmup_are_not_judged_on_bandwidth() -> None:
    assert detect(run_window([nvl_gpu(nvl=0.0, pcie=(9e9, 9e9))], gpus_per_node=1), CFG) == []
    specs = [nvl_gpu(nvl=0.0, pcie=(9e9, 9e9)) for _ in range(8)]
    assert detect(run_window(specs, run_start=T0 + 500), CFG) == []  # still in warm-up


def test_rising_crc_and_replay_errors() -> None:
    specs = [nvl_gpu() for _ in range(8)]
    specs[2] = nvl_gpu(
        nvlink_crc_errors=lambda t: np.floor((t - T0) / 10.0) + 5000,
        nvlink_replay_errors=lambda t: np.floor((t - T0) / 60.0),
    )
    (f,) = detect(run_window(specs), CFG)
    assert (f.gpu, f.cause, f.severity) == (2, "link_errors", "warning")
    assert f.evidence["crc_errors"] == 59 and f.evidence["replay_errors"] == 9
    assert f.evidence["errors_per_min"] == pytest.approx(6.9, abs=0.2)


def test_static_error_counts_and_a_driver_reload_are_not_rising() -> None:
    specs = [nvl_gpu(nvlink_crc_errors=const(123456)) for _ in range(8)]
    # A reload restarts the counter: the drop is not 123k errors, and 3 after it are below the bar.
    specs[1] = nvl_gpu(
        nvlink_crc_errors=lambda t: np.where(t < T0 + 300, 123456.0, np.minimum(3.0, (t - T0 - 300) // 30))
    )
    assert detect(run_window(specs), CFG) == []


def test_a_link_recovery_counts_on_its_own() -> None:
    specs = [nvl_gpu() for _ in range(8)]
    specs[7] = nvl_gpu(nvlink_recovery_errors=lambda t: np.where(t < T0 + 550, 0.0, 1.0))
    (f,) = detect(run_window(specs), CFG)
    assert (f.gpu, f.cause, f.evidence["recoveries"]) == (7, "link_errors", 1)


@pytest.mark.parametrize("dt", [0.1, 30.0])
def test_sampling_rates(dt: float) -> None:
    specs = [nvl_gpu() for _ in range(8)]
    specs[3] = nvl_gpu(links=9)
    fs = detect(run_window(specs, t=times(600, dt)), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(3, "links_down")]


def test_no_nvlink_columns_no_findings() -> None:
    assert detect(run_window([GpuSpec(steady(0.9)) for _ in range(8)]), CFG) == []
