"""End to end on a simulated Kubernetes node, with no run registered by hand.

A fake kubelet (the real pod-resources gRPC protocol on a unix socket) says
which pod holds which GPU of a fake-NVML node, a loopback API server gives
the pods' owners: two pods of one PyTorchJob (GPUs 0-3) whose data loader
cannot keep up -- the GPUs alternate 12 s busy, 8 s waiting, on a saturated
host -- and one pod of another Job (GPU 4) working steadily.  The real agent
runtime ticks through 200 s of that, ships to the real collector (its leader
registering inferred runs, rolling up and sweeping the detectors as in
production), and the API then lists both runs, accounts for them and reports
starvation on the starved one only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.agent.k8s.devices import DeviceMap
from gpufleet.agent.main import kubernetes_attribution
from gpufleet.agent.runtime import Agent
from gpufleet.agent.sources.base import Reading, Source
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.api.app import create_app as create_api
from gpufleet.auth import create_token
from gpufleet.collector.app import create_app as create_collector
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import AgentSettings, KubernetesSettings, Settings
from gpufleet.serverthread import serve
from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml
from testsupport.kubelet import FakeApiServer, FakeKubelet, pod_json

PTJ = ("kubeflow.org/v1", "PyTorchJob", "llm-pretrain", "7d1e5a90-1111-4222-8333-944455556666")
EVAL = ("batch/v1", "Job", "eval-nightly", "e7a10000-2222-4333-8444-555566667777")
STARVED = "ml:llm-pretrain:7d1e5a90"
STEADY = "research:eval-nightly:e7a10000"
SECONDS = 200


class SaturatedHost:
    """The node's host counters while a CPU-bound loader runs: every core busy in user space."""

    name = "host"

    def collect(self) -> Reading:
        return Reading(
            host={
                "cpu_user_pct": 93.0,
                "cpu_system_pct": 4.5,
                "cpu_iowait_pct": 0.3,
                "cpu_idle_pct": 2.2,
                "cpu_count": 96,
                "disk_read_bytes_s": 2.0e6,
                "disk_write_bytes_s": 1.0e6,
                "disk_util_pct": 3.0,
                "disk_await_ms": 0.4,
                "net_rx_bytes_s": 1.0e7,
                "net_tx_bytes_s": 1.0e7,
            }
        )


@dataclass
class Stack:
    collector: str
    api: str
    db: str
    node_token: str
    read_token: str


@pytest.fixture
def stack(db: str, settings: Settings) -> Iterator[Stack]:
    s = settings.model_copy(update={"detect": settings.detect.model_copy(update={"sweep_interval_s": 1.0})})
    with psycopg.connect(db, autocommit=True) as c:
        node = create_token(c, "node-a", "node", "node-a")
        sre = create_token(c, "sre", "sre")
    with serve(create_collector(db, s, sweep=Sweeper(s))) as col, serve(create_api(db, s)) as api:
        yield Stack(col.url, api.url, db, node, sre)


def wait_for(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.25)


def test_pytorchjob_and_job_pods_become_runs_with_accounting_and_starvation(
    stack: Stack, tmp_path: Path
) -> None:
    sock = tmp_path / "kubelet.sock"
    token = tmp_path / "sa-token"
    token.write_text("sa-token")
    clock = [time.time() - SECONDS - 5]
    fake = FakeNvml([H100_SXM] * 5, clock=lambda: clock[0])
    uuids = [g.uuid for g in fake.gpus]
    pods = [
        ("ml", "llm-pretrain-master-0", {"pytorch": [("nvidia.com/gpu", uuids[0:2])]}),
        ("ml", "llm-pretrain-worker-0", {"pytorch": [("nvidia.com/gpu", uuids[2:4])]}),
        ("research", "eval-nightly-x7k2p", {"eval": [("nvidia.com/gpu", [uuids[4]])]}),
    ]
    meta = [
        pod_json(
            "ml",
            "llm-pretrain-master-0",
            "0a000000-0000-4000-8000-000000000001",
            {"team": "llm", "training.kubeflow.org/job-name": "llm-pretrain"},
            owner=PTJ,
        ),
        pod_json("ml", "llm-pretrain-worker-0", "0a000000-0000-4000-8000-000000000002", owner=PTJ),
        pod_json(
            "research",
            "eval-nightly-x7k2p",
            "0b000000-0000-4000-8000-000000000003",
            {"batch.kubernetes.io/job-name": "eval-nightly"},
            owner=EVAL,
        ),
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"namespace": "research", "name": "eval-nightly", "uid": EVAL[3]},
    }
    with (
        FakeKubelet(sock, pods),
        FakeApiServer(meta, {"/apis/batch/v1/namespaces/research/jobs/eval-nightly": job}) as api,
    ):
        settings = AgentSettings(
            collector_url=stack.collector,
            token=stack.node_token,
            interval_s=1.0,
            ship_interval_s=5.0,
            segment_max_samples=300,
            metrics_port=0,
            start_jitter_s=0.0,
            attribute_processes=False,
            kubernetes=KubernetesSettings(
                enabled=True, pod_resources_socket=sock, api_server=api.url, token_file=token
            ),
        )
        k8s = kubernetes_attribution(settings, "node-a")
        assert k8s is not None
        sources: list[Source] = [NvmlSource(fake, sys_root="/nonexistent"), SaturatedHost()]
        agent = Agent(
            settings,
            sources,
            node="node-a",
            spool_dir=tmp_path / "spool",
            wall=lambda: clock[0],
            kubernetes=k8s,
            facts_of_node=lambda: {"hostname": "node-a", "cpu_count": 96},
        )
        agent.start(serve_metrics=False)
        wait_for(
            "the first kubelet snapshot",
            lambda: k8s.runs_by_place(DeviceMap.build([{"gpu": i, "uuid": u} for i, u in enumerate(uuids)])),
            10,
        )
        try:
            for s in range(SECONDS):
                # The PyTorchJob: 40 s of steady start-up, then busy 12 s / waiting for data 8 s.
                starving = s >= 40 and (s - 40) % 20 >= 12
                for g in fake.gpus[:4]:
                    g.idle() if starving else g.load()
                fake.gpus[4].load()
                agent.tick(s)
                clock[0] += 1.0
        finally:
            assert agent.shutdown(ship_s=20) is True
    # Everything below is what the collector and the API did on their own.
    client = httpx.Client(
        base_url=stack.api, headers={"Authorization": f"Bearer {stack.read_token}"}, timeout=30
    )

    def both_runs() -> dict[str, dict[str, Any]] | None:
        runs = {r["run_id"]: r for r in client.get("/v1/runs").json()}
        return runs if {STARVED, STEADY} <= set(runs) else None

    runs = wait_for("both inferred runs", both_runs)
    starved, steady = runs[STARVED], runs[STEADY]
    assert starved["source"] == steady["source"] == "inferred"
    assert starved["allocations"] == [{"node": "node-a", "gpus": [0, 1, 2, 3]}]
    assert steady["allocations"] == [{"node": "node-a", "gpus": [4]}]
    assert (starved["name"], starved["team"], steady["name"], steady["team"]) == (
        "llm-pretrain",
        "llm",
        "eval-nightly",
        "research",
    )
    assert starved["labels"]["k8s.kind"] == "PyTorchJob" and steady["labels"]["k8s.kind"] == "Job"

    def starvation() -> list[dict[str, Any]]:
        return [i for i in client.get(f"/v1/runs/{STARVED}/incidents").json() if i["kind"] == "starvation"]

    (inc,) = wait_for("a starvation incident on the PyTorchJob", starvation)
    assert inc["cause"] == "cpu" and inc["evidence"]["pattern"] == "oscillating"
    assert inc["evidence"]["period_s"] == pytest.approx(20, abs=2)
    assert [i for i in client.get(f"/v1/runs/{STEADY}/incidents").json() if i["kind"] == "starvation"] == []
    for run_id, gpus in ((STARVED, 4), (STEADY, 1)):
        acc = client.get(f"/v1/runs/{run_id}/accounting")
        assert acc.status_code == 200, acc.text
        body = acc.json()
        assert body["gpu_count"] == gpus and body["gpu_kwh"] > 0 and body["coverage"] > 0.9, body
    lost = client.get(f"/v1/runs/{STARVED}/accounting").json()["efficiency"]
    assert lost["lost_gpu_hours"] > 0 and lost["goodput"] < 1.0
    # the finance report has the inferred runs as rows like any run's, and its rows make up the fleet
    began = datetime.fromtimestamp(clock[0] - SECONDS - 60, UTC)
    period = {"from": began.isoformat(), "to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat()}
    rep = client.get("/v1/reports/finance.json", params=period)
    assert rep.status_code == 200, rep.text
    rows = rep.json()["rows"]
    by_run = {r["key"]: r for r in rows if r["row_type"] == "run"}
    assert set(by_run) == {STARVED, STEADY}
    assert (
        by_run[STARVED]["team"],
        by_run[STARVED]["gpu_count"],
        by_run[STEADY]["team"],
        by_run[STEADY]["gpu_count"],
    ) == ("llm", 4, "research", 1)
    assert by_run[STARVED]["lost_gpu_hours"] > 0 and by_run[STEADY]["gpu_kwh"] > 0
    (total,) = [r for r in rows if r["row_type"] == "total"]
    for k in ("gpu_hours", "gpu_kwh"):
        # every row is rounded to 1e-9 on its own: n rows differ from the total by at most n + 1 roundings
        summed = [float(r[k]) for r in rows if r["row_type"] in ("run", "unallocated", "no_telemetry")]
        assert sum(summed) == pytest.approx(float(total[k]), rel=1e-9, abs=(len(summed) + 1) * 5e-10), k
    with psycopg.connect(stack.db) as c:
        assert c.execute("SELECT count(*) FROM run_progress").fetchone()[0] == 0  # no POST by hand
        assert (
            c.execute(
                "SELECT count(*) FROM run_sightings WHERE status NOT IN ('allocated', 'moved')"
            ).fetchone()[0]
            == 0
        )
