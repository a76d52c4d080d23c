"""Host misconfiguration from node facts, and repeated XIDs."""

from __future__ import annotations

import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.host_misconfig import detect, governors, quota_cores
from tests.detectors.builders import T0, GpuSpec, run_window, steady

CFG = DetectorConfig()


def window(facts: dict | None = None, **spec: object):  # type: ignore[no-untyped-def]
    return run_window([GpuSpec(steady(0.9), **spec) for _ in range(8)], facts={"n0": facts or {}})  # type: ignore[arg-type]


def test_powersave_governor() -> None:
    fs = detect(window({"cpu_governor": "powersave", "cpu_governors": {"powersave": 64}}), CFG)
    assert [(f.kind, f.cause, f.node, f.gpu, f.run_id) for f in fs] == [
        ("host_misconfig", "cpu_governor", "n0", None, None)
    ]
    assert fs[0].evidence["cpu_governor"] == ["powersave"]


def test_mixed_governors_with_powersave() -> None:
    assert governors({"cpu_governor": "mixed: ondemand=2,powersave=6"}) == {"ondemand", "powersave"}
    assert (
        detect(window({"cpu_governor": "mixed: performance=2,powersave=6"}), CFG)[0].cause == "cpu_governor"
    )


def test_cpu_quota_below_a_core_per_gpu() -> None:
    fs = detect(window({"cpu_quota_cores": 4.0, "cpu_governor": "performance"}), CFG)
    assert [(f.cause, f.evidence["cpu_quota_cores"], f.evidence["gpu_count"]) for f in fs] == [
        ("cpu_quota", 4.0, 8)
    ]
    # Both issues: one finding per node, the quota named.
    f = detect(window({"cpu_quota_cores": 2.0, "cpu_governor": "powersave"}), CFG)[0]
    assert f.cause == "cpu_quota" and f.evidence["issues"] == ["cpu_governor", "cpu_quota"]


@pytest.mark.parametrize(
    "facts",
    [
        {},
        {"cpu_governor": "performance", "cpu_quota_cores": 32.0},
        {"cpu_quota_cores": None},
        {"cpu_max": "max 100000"},
    ],
)
def test_healthy_nodes(facts: dict) -> None:
    assert detect(window(facts), CFG) == []


def test_quota_forms() -> None:
    assert quota_cores({"cpu_max": "400000 100000"}) == 4.0
    assert quota_cores({"cpu_quota_us": 200000, "cpu_period_us": 100000}) == 2.0
    assert quota_cores({"cpu_quota_cores": -1}) is None


def test_repeated_xids_on_a_gpu() -> None:
    w = window()
    s = w.gpus[("n0", 3)]
    s.cols["xid"][[100, 250, 400]] = [79, 79, 48]
    fs = detect(w, CFG)
    assert [(f.cause, f.node, f.gpu, f.run_id) for f in fs] == [("repeated_xid", "n0", 3, "r1")]
    f = fs[0]
    assert f.evidence["xid_events"] == 3 and f.evidence["xid_codes"] == [48, 79]
    assert f.start == pytest.approx(T0 + 100, abs=0.01) and f.last_active == pytest.approx(T0 + 400, abs=0.01)
    assert f.severity == "critical" and f.hold_s == pytest.approx(600, abs=1)


def test_a_single_xid_is_not_repeated() -> None:
    w = window()
    w.gpus[("n0", 3)].cols["xid"][100] = 79
    assert detect(w, CFG) == []


def test_ignored_xid_codes() -> None:
    w = window()
    w.gpus[("n0", 3)].cols["xid"][[100, 200]] = 13
    assert detect(w, DetectorConfig(xid_ignore=(13,))) == []
