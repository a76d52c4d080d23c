"""host_misconfig from the job's own cgroup, the GPUs' NUMA placement and NFS stalls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig, RunInfo
from gpufleet.collector.detectors.host_misconfig import detect
from gpufleet.nfs import nfs_verdict
from tests.detectors.builders import GpuSpec, run_window, steady

CFG = DetectorConfig()


def const(v: float) -> Any:
    return lambda t: np.full(t.shape, v)


def job(quota: float | None) -> dict[str, Any]:
    return {
        "job_cpu_cores": const(1.5),
        "job_cpu_quota_cores": const(np.nan if quota is None else quota),
        "job_cpu_pressure_pct": const(0.5),
    }


def node(specs: list[GpuSpec], facts: dict[str, Any], runs: list[tuple[str, list[int]]] | None = None) -> Any:
    w = run_window(specs, facts={"n0": facts})
    if runs is not None:
        keys = w.runs[0].allocations
        w.runs[:] = [RunInfo(r, w.runs[0].start, None, [keys[i] for i in gpus]) for r, gpus in runs]
    return w


def test_the_jobs_own_quota_is_judged_against_the_gpus_it_feeds() -> None:
    # A 2-GPU job with 4 cores on an 8-GPU node: enough for it, whatever the node's GPU count.
    specs = [GpuSpec(steady(0.9), extra=job(4.0)) for _ in range(2)] + [
        GpuSpec(steady(0.0)) for _ in range(6)
    ]
    w = node(specs, {"cpu_quota_cores": 4.0, "gpu_count": 8}, runs=[("small", [0, 1])])
    assert detect(w, CFG) == []
    # The same 4 cores for a job on all 8 GPUs is short.
    w = node([GpuSpec(steady(0.9), extra=job(4.0)) for _ in range(8)], {"gpu_count": 8})
    (f,) = detect(w, CFG)
    assert (f.cause, f.node, f.evidence["quota_basis"], f.evidence["cpu_quota_cores"]) == (
        "cpu_quota",
        "n0",
        "job_columns",
        4.0,
    )
    assert f.evidence["jobs"] == [{"job": "run r1", "gpus": list(range(8)), "cpu_quota_cores": 4.0}]
    assert f.evidence["jobs_short"] == ["run r1"]


def test_an_unlimited_job_is_fine_even_where_the_node_level_fact_says_otherwise() -> None:
    """The node-level quota the agent once read came from its own (root) cgroup: a job's cgroup wins."""
    w = node([GpuSpec(steady(0.9), extra=job(None)) for _ in range(8)], {"cpu_quota_cores": 2.0})
    assert detect(w, CFG) == []


def test_job_cgroups_from_the_node_checks_take_precedence() -> None:
    facts = {
        "job_cgroups": [
            {
                "cgroup": "/kubepods.slice/a.scope",
                "gpus": [0, 1, 2, 3],
                "cpu_quota_cores": 16.0,
                "quota_kind": "cfs",
            },
            {
                "cgroup": "/kubepods.slice/b.scope",
                "gpus": [4, 5, 6, 7],
                "cpu_quota_cores": 2.0,
                "quota_kind": "cfs",
            },
        ]
    }
    # The columns alone would merge both containers of the one run: 2 cores for 8 GPUs.
    (f,) = detect(node([GpuSpec(steady(0.9), extra=job(2.0)) for _ in range(8)], facts), CFG)
    assert (f.cause, f.evidence["quota_basis"], f.evidence["jobs_short"]) == (
        "cpu_quota",
        "job_cgroup",
        ["/kubepods.slice/b.scope"],
    )
    assert f.evidence["cpu_quota_cores"] == 2.0
    facts["job_cgroups"][1]["cpu_quota_cores"] = 8.0
    assert detect(node([GpuSpec(steady(0.9)) for _ in range(8)], facts), CFG) == []


def test_processes_confined_to_another_numa_node() -> None:
    facts = {
        "gpu_processes": [
            {"gpu": 0, "pids": 3, "gpu_numa_node": 0, "cpus_allowed": "0-47", "numa_nodes": [0]},
            {"gpu": 4, "pids": 3, "gpu_numa_node": 1, "cpus_allowed": "0-47", "numa_nodes": [0]},
            {"gpu": 5, "pids": 1, "gpu_numa_node": 1, "cpus_allowed": "0-95", "numa_nodes": [0, 1]},
            {"gpu": 6, "pids": 1, "gpu_numa_node": None, "cpus_allowed": "0-47", "numa_nodes": [0]},
        ]
    }
    (f,) = detect(node([GpuSpec(steady(0.9)) for _ in range(8)], facts), CFG)
    assert f.cause == "numa_affinity" and f.evidence["issues"] == ["numa_affinity"]
    assert f.evidence["numa_misplaced"] == [
        {"gpu": 4, "gpu_numa_node": 1, "numa_nodes": [0], "cpus_allowed": "0-47"}
    ]


@pytest.mark.parametrize(
    ("mount", "stalled"),
    [
        ({"ops": 900, "retrans": 4, "timeouts": 0, "queue_ms": 0.2, "rtt_ms": 3.0}, True),
        ({"ops": 900, "retrans": 0, "timeouts": 1, "queue_ms": 0.2, "rtt_ms": 3.0}, True),
        ({"ops": 900, "retrans": 0, "timeouts": 0, "queue_ms": 80.0, "rtt_ms": 3.0}, True),
        ({"ops": 900, "retrans": 0, "timeouts": 0, "queue_ms": 1.0, "rtt_ms": 150.0}, True),
        ({"ops": 900, "retrans": 0, "timeouts": 0, "queue_ms": 0.3, "rtt_ms": 2.0}, False),
        ({"ops": 3, "retrans": 0, "timeouts": 0, "queue_ms": 900.0, "rtt_ms": 900.0}, False),
        (
            {"ops": 9e6, "retrans": 40, "timeouts": 2, "queue_ms": 0.2, "rtt_ms": 3.0, "since_mount": True},
            False,
        ),
    ],
)
def test_nfs_stalls_over_the_agents_interval(mount: dict[str, Any], stalled: bool) -> None:
    m = {"mountpoint": "/datasets", "device": "nas:/export", "interval_s": 300.0, "since_mount": False}
    m.update({k: int(v) if k in ("ops", "retrans", "timeouts") else v for k, v in mount.items()})
    fs = detect(node([GpuSpec(steady(0.9)) for _ in range(8)], {"nfs_mounts": [m]}), CFG)
    if stalled:
        (f,) = fs
        assert f.cause == "nfs_stall" and f.evidence["nfs_stalls"][0]["mountpoint"] == "/datasets"
    else:
        assert fs == []


def test_the_most_serious_cause_is_named_and_every_issue_listed() -> None:
    facts = {
        "cpu_governor": "powersave",
        "gpu_processes": [{"gpu": 1, "gpu_numa_node": 1, "numa_nodes": [0]}],
        "nfs_mounts": [{"mountpoint": "/d", "since_mount": False, "ops": 100, "retrans": 1}],
    }
    (f,) = detect(node([GpuSpec(steady(0.9)) for _ in range(8)], facts), CFG)
    assert f.cause == "numa_affinity" and f.evidence["issues"] == [
        "cpu_governor",
        "numa_affinity",
        "nfs_stall",
    ]
    facts["job_cgroups"] = [{"cgroup": "/x", "gpus": list(range(8)), "cpu_quota_cores": 1.0}]
    (f,) = detect(node([GpuSpec(steady(0.9)) for _ in range(8)], facts), CFG)
    assert f.cause == "cpu_quota"


def test_nfs_verdict_thresholds_are_settings() -> None:
    assert nfs_verdict(100, 0, 0, 60.0, 1.0, CFG)[0] == "fail"
    assert nfs_verdict(100, 0, 0, 60.0, 1.0, DetectorConfig(nfs_stall_queue_ms=100.0))[0] == "ok"
    assert nfs_verdict(5, 0, 0, 60.0, 1.0, DetectorConfig(nfs_min_ops=5))[0] == "fail"
