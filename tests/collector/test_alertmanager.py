"""Alerts pushed to a real Alertmanager started on loopback (v2 API), resolutions too."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psycopg
import pytest

from gpufleet.collector import incident_store
from gpufleet.collector.alerting import AlertmanagerPusher
from gpufleet.collector.detectors.window import Finding
from tests.system_tools import unavailable
from testsupport import alertmanager as am


@pytest.fixture
def alertmanager_url(tmp_path: Path):  # type: ignore[no-untyped-def]
    if am.binary() is None:
        unavailable("Alertmanager", "prometheus-alertmanager")
    with am.alertmanager(tmp_path) as url:
        yield url


def alerts(url: str, active: bool = True) -> list[dict]:
    r = httpx.get(
        url + "/api/v2/alerts",
        params={
            "active": str(active).lower(),
            "silenced": "false",
            "inhibited": "false",
            "unprocessed": "true",
        },
    )
    r.raise_for_status()
    return [a for a in r.json() if a["labels"].get("source") == "gpufleet"]


def test_open_and_resolved_incidents_reach_alertmanager(
    conn: psycopg.Connection, alertmanager_url: str
) -> None:
    pusher = AlertmanagerPusher(alertmanager_url)
    now = time.time()
    f = Finding(
        kind="starvation",
        cause="io",
        severity="warning",
        start=now - 120,
        evidence={"period_s": 30.0, "duty_cycle": 0.4},
        run_id="llm-1",
    )
    incident_store.sweep(conn, [f], now, resolve_after_s=10)
    assert pusher.sync(conn, [])
    got = alerts(alertmanager_url)
    assert len(got) == 1
    a = got[0]
    assert a["labels"]["alertname"] == "GpufleetStarvation"
    assert (
        a["labels"]["run_id"] == "llm-1"
        and a["annotations"]["cause"] == "io"
        and "severity" not in a["labels"]
    )
    assert '"period_s": 30.0' in a["annotations"]["evidence"]
    # resolve: clear for longer than the hold-off
    plan = incident_store.sweep(conn, [], now + 20, resolve_after_s=10)
    assert plan.resolves
    ids = [r[0] for r in conn.execute("SELECT id FROM incidents WHERE state = 'resolved'").fetchall()]
    assert pusher.sync(conn, ids)
    deadline = time.monotonic() + 10
    while alerts(alertmanager_url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alerts(alertmanager_url) == []
    pusher.close()


def test_unreachable_alertmanager_is_counted_not_fatal(conn: psycopg.Connection) -> None:
    from gpufleet.serverthread import free_port

    pusher = AlertmanagerPusher(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    f = Finding(
        kind="throttling",
        cause="thermal",
        severity="warning",
        start=time.time(),
        evidence={},
        node="n",
        gpu=1,
    )
    incident_store.sweep(conn, [f], time.time(), resolve_after_s=10)
    assert pusher.sync(conn, []) is False
    assert pusher.failures == 1


class _Recorded(AlertmanagerPusher):
    """A pusher that keeps what it would send."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9")
        self.sent: list[dict] = []

    def push(self, alerts: list[dict]) -> bool:
        self.sent += alerts
        return True


def test_sweep_shards_each_send_their_own_alerts(conn: psycopg.Connection) -> None:
    """Sharded, every open incident is sent by exactly one shard each sweep (each shard sent them all,
    so Alertmanager took every alert once per shard); unsharded, one pusher sends them all."""
    from gpufleet.collector.detectors.window import RunInfo
    from gpufleet.collector.shards import ShardScope

    now = time.time()
    runs = [RunInfo(f"run-{i}", now - 600, None, [(f"node-{i}", 0), (f"node-{i}", 1)]) for i in range(12)]
    findings = [
        Finding(
            kind="starvation", cause="io", severity="warning", start=now - 120, evidence={}, run_id=r.run_id
        )
        for r in runs
    ]
    findings += [
        Finding(
            kind="pcie_degraded",
            cause=None,
            severity="warning",
            start=now - 120,
            evidence={},
            node=f"spare-{i}",
            gpu=0,
        )
        for i in range(12)
    ]
    findings.append(
        Finding(
            kind="host_misconfig", cause=None, severity="warning", start=now - 120, evidence={}, node="node-3"
        )
    )
    incident_store.sweep(conn, findings, now, resolve_after_s=10)
    scopes = [ShardScope(k, 4) for k in range(4)]
    sent: list[list[dict]] = []
    for sc in scopes:
        sc.update(runs)
        p = _Recorded()
        assert p.sync(conn, [], owns=sc.owns)
        sent.append(p.sent)
    ids = sorted(a["annotations"]["incident_id"] for s in sent for a in s)
    assert len(ids) == len(findings) == len(set(ids))
    assert sum(1 for s in sent if s) >= 2  # the incidents are spread over the shards
    # A node's own incident goes with the run on it.
    (home,) = [k for k, s in enumerate(sent) if any(a["labels"].get("run_id") == "run-3" for a in s)]
    assert any(a["labels"]["kind"] == "host_misconfig" for a in sent[home])
    whole = _Recorded()
    assert whole.sync(conn, [])
    assert sorted(a["annotations"]["incident_id"] for a in whole.sent) == ids
