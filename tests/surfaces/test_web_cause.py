"""Each incident kind's cause in words, from the evidence its detector writes (shapes as stored by the demo)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.api.web.cause import FORMATTERS, explain

T0 = datetime(2026, 12, 6, 1, 36, tzinfo=UTC)


def inc(
    kind: str,
    evidence: Any,
    cause: str | None = None,
    run_id: str | None = "demo-vision",
    node: str | None = None,
    gpu: int | None = None,
) -> dict[str, Any]:
    return {
        "id": 1,
        "kind": kind,
        "cause": cause,
        "severity": "warning",
        "state": "open",
        "run_id": run_id,
        "node": node,
        "gpu": gpu,
        "start": T0,
        "end": None,
        "evidence": evidence,
    }


STARVED_CPU = {
    "host": "h100-03",
    "depth": 0.73,
    "cycles": 51,
    "pattern": "oscillating",
    "job_node": "h100-03",
    "period_s": 9.0,
    "gpu_count": 8,
    "duty_cycle": 0.431,
    "iowait_pct": 0.139,
    "cause_basis": "job_cgroup",
    "cpu_user_pct": 96.682,
    "disk_await_ms": 0.711,
    "disk_util_pct": 2.777,
    "gpus_affected": 8,
    "job_cpu_cores": 220.656,
    "job_cause_basis": "cpu_pressure",
    "gpu_time_lost_share": 0.55,
    "job_cpu_quota_cores": None,
    "job_io_pressure_pct": 0.28,
    "job_cpu_pressure_pct": 38.136,
}
STARVED_IO = {
    "host": "h100-04",
    "depth": 0.75,
    "cycles": 18,
    "pattern": "oscillating",
    "period_s": 23.0,
    "gpu_count": 4,
    "gpus_affected": 4,
    "iowait_pct": 38.459,
    "cpu_user_pct": 8.175,
    "disk_await_ms": 90.168,
    "disk_util_pct": 99.741,
    "gpu_time_lost_share": 0.462,
    "job_io_pressure_pct": 57.766,
}


def test_starvation_says_which_resource_with_its_numbers() -> None:
    cpu = explain(inc("starvation", STARVED_CPU, "cpu"))
    assert cpu.title == "Input starvation: CPU-bound"
    for text in (
        "All 8 GPUs of run demo-vision wait for input",
        "idle 55 %",
        "every 9 s",
        "CPU-bound",
        "220.7 cores",
        "96.7 % busy",
    ):
        assert text in cpu.sentence, (text, cpu.sentence)
    assert ("job CPU used", "220.7 cores") in cpu.figures
    io = explain(inc("starvation", STARVED_IO, "io", run_id="demo-audio"))
    for text in ("I/O-bound", "99.7 % busy on h100-04", "iowait is 38.5 %", "90 ms"):
        assert text in io.sentence, (text, io.sentence)


def test_checkpoint_stall_names_the_pause_the_share_and_the_writer() -> None:
    ev = {
        "host": "h100-02",
        "basis": "gpu+host",
        "pauses": 1,
        "pause_s": 50.0,
        "period_s": 720.0,
        "gpu_count": 16,
        "write_path": "disk",
        "writer_gpu": "h100-01/0",
        "spinning_gpus": 15.0,
        "write_bytes_s": 2481031168.0,
        "run_time_lost_share": 0.0833,
    }
    s = explain(inc("checkpoint_stall", ev, run_id="demo-pretrain")).sentence
    for text in (
        "pause 50 s at a time",
        "every 12 min",
        "8.3 % of the run's time",
        "h100-01/0 writes to disk",
        "2.5 GB/s",
        "15 other GPUs wait",
    ):
        assert text in s, (text, s)


def test_gpu_kinds_name_the_gpu_and_compare_it() -> None:
    strag = explain(
        inc(
            "straggler",
            {"power_limit_w": 418.0, "peer_power_limit_w": 700.0, "activity": 0.853, "peer_activity": 0.766},
            "power_cap",
            "demo-pretrain",
            "h100-01",
            0,
        )
    )
    assert "GPU h100-01/0 holds run demo-pretrain back" in strag.sentence
    assert "418 W against its peers' 700 W" in strag.sentence and strag.gpus == (("h100-01", 0),)
    pcie = explain(
        inc(
            "pcie_degraded",
            {
                "pcie_gen": 3.0,
                "pcie_gen_max": 4.0,
                "pcie_width": 16.0,
                "pcie_width_max": 16.0,
                "degraded_share": 1.0,
            },
            None,
            "demo-bert",
            "a100-01",
            2,
        )
    )
    assert "Gen3 x16 instead of Gen4 x16, 16 of 32 GB/s" in pcie.sentence
    nv = explain(
        inc(
            "nvlink_degraded",
            {
                "issues": ["link_errors"],
                "crc_errors": 7023,
                "replay_errors": 1099,
                "recoveries": 1,
                "errors_per_min": 813.556,
            },
            "link_errors",
            None,
            "h100-06",
            3,
        )
    )
    assert "814 a minute" in nv.sentence and "7023 CRC errors" in nv.sentence
    health = explain(
        inc(
            "gpu_health",
            {"issues": ["uncorrectable_ecc"], "dbe_errors": 3, "xid_codes": [48]},
            "uncorrectable_ecc",
            None,
            "n1",
            5,
        )
    )
    assert "3 uncorrectable (double-bit) ECC errors" in health.sentence and "XID 48" in health.sentence


def test_a_run_throttled_on_many_gpus_is_one_sentence_listing_them() -> None:
    gpus = [{"node": "h100-05", "gpu": g, "throttled_share": 1.0} for g in range(8)]
    ex = explain(
        inc(
            "throttling",
            {
                "gpus": gpus,
                "throttled_share": 1.0,
                "clock_ratio": 0.84,
                "sm_clock_mhz": 1666.0,
                "sm_clock_max_mhz": 1980.0,
                "temp_c_max": 87.0,
            },
            "thermal",
            "demo-hot",
            "h100-05",
        )
    )
    assert ex.sentence.startswith("8 GPUs of run demo-hot on h100-05 are held down by heat")
    assert "84 % of the maximum clock (1666 of 1980 MHz)" in ex.sentence and "87 °C" in ex.sentence
    assert len(ex.gpus) == 8


def test_repeated_xids_are_decoded() -> None:
    ex = explain(
        inc(
            "host_misconfig",
            {"xid_events": 5, "xid_codes": [48, 63], "last_xid": 48},
            "repeated_xid",
            None,
            "h100-05",
            1,
        )
    )
    assert ex.title == "Repeated XID errors"
    assert "logged 5 XID errors" in ex.sentence and "first action" in ex.sentence


def test_the_new_kinds_name_idle_gpus_and_the_dead_rank() -> None:
    idle = explain(
        inc(
            "idle_allocation",
            {
                "scope": "some",
                "gpu_count": 8,
                "idle_gpus": 2,
                "idle_s": 1560.0,
                "since_before_window": False,
                "gpus": [
                    {
                        "node": "h100-06",
                        "gpu": g,
                        "since": "2026-12-06T01:10:00Z",
                        "idle_s": 1560.0,
                        "util_pct": 0.0,
                        "power_w": 71.0,
                        "mem_used_mib": 0.0,
                    }
                    for g in (2, 3)
                ],
            },
            "some",
            "demo-late",
        )
    )
    assert (
        "2 of 8 GPUs of run demo-late have done no work since 2026-12-06 01:10:00 UTC (26 min)"
        in idle.sentence
    )
    assert (
        "h100-06/2,3" in idle.sentence
        and "71 W each" in idle.sentence
        and ("idle for", "26 min") in idle.figures
    )
    assert idle.gpus == (("h100-06", 2), ("h100-06", 3))
    hung = explain(
        inc(
            "hung_collective",
            {
                "hung_s": 420.0,
                "since": "2026-12-06T01:30:00Z",
                "gpu_count": 4,
                "power_basis": "power_w",
                "spinning_gpus": [
                    {
                        "node": "n1",
                        "gpu": g,
                        "util_pct": 100.0,
                        "power_w": 95.0,
                        "power_frac": 0.14,
                        "sm_active": 0.99,
                    }
                    for g in (0, 1, 2)
                ],
                "dead_gpus": ["n1/3"],
            },
            None,
            "r1",
        )
    )
    for text in (
        "run r1 is hung in a collective since 2026-12-06 01:30:00 UTC (7 min)",
        "3 GPUs spin at 100 % utilisation",
        "only 95 W (14 % of their power limit, idle power)",
        "waiting on GPU n1/3, which stopped",
    ):
        assert text.lower() in hung.sentence.lower(), (text, hung.sentence)
    assert ("dead rank", "n1/3") in hung.figures and len(hung.gpus) == 3


@pytest.mark.parametrize("kind", [*FORMATTERS, "some_future_kind"])
@pytest.mark.parametrize(
    "evidence",
    [
        None,
        {},
        {"gpus": "not a list", "period_s": "nine", "issues": [1, None]},
        {"depth": float("nan"), "gpus": [{"node": None}], "xid_codes": [True]},
    ],
)
def test_missing_or_odd_evidence_still_reads_as_a_sentence(kind: str, evidence: Any) -> None:
    ex = explain(inc(kind, evidence, "cpu", node="n1"))
    assert ex.title and ex.sentence.endswith(".") and ex.sentence[0].isupper()
    assert "None" not in ex.sentence and "nan" not in ex.sentence


def test_an_unknown_kind_reads_from_its_name_cause_and_numbers() -> None:
    ex = explain(inc("disk_full", {"used_share": 0.97, "mount": "/scratch"}, "quota", None, "n4"))
    assert ex.sentence == "Disk full on node n4, cause quota (used share 0.97, mount /scratch)."
