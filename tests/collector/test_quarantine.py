"""Quarantine hooks against a fake ``scontrol`` on PATH and a fake Kubernetes API server on loopback
(HTTPS with a CA made for the test), recording on real incidents in PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpufleet.collector.quarantine import (
    K8S_ANNOTATION,
    K8S_TAINT,
    KubernetesCordon,
    Quarantine,
    SlurmDrain,
    node_log,
    node_state,
)
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import QuarantineSettings, Settings
from gpufleet.serverthread import serve
from testsupport.certs import TestCA

NOW = 1_800_000_000.0

FAKE_SCONTROL = """#!{python}
# A stand-in for Slurm's scontrol: logs its argv, answers as FAKE_SCONTROL_RC says.
import json, os, sys
with open(os.environ["FAKE_SCONTROL_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
rc = int(os.environ.get("FAKE_SCONTROL_RC", "0"))
if rc:
    sys.stderr.write("slurm_update error: Invalid node name specified\\n")
elif sys.argv[1:3] == ["show", "node"]:
    # As scontrol prints a drained node (abridged): the reason line with who set it and when.
    print(f"NodeName={{sys.argv[3]}} Arch=x86_64 CoresPerSocket=32")
    print("   State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A")
    print(f"   Reason={{os.environ.get('FAKE_SCONTROL_REASON', 'gpufleet gpu_health')}} [slurm@2027-01-15T08:00:00]")
sys.exit(rc)
"""


@dataclass
class FakeSlurm:
    log: Path

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "scontrol"
    exe.write_text(FAKE_SCONTROL.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_SCONTROL_LOG", str(tmp_path / "scontrol.log"))
    monkeypatch.delenv("FAKE_SCONTROL_RC", raising=False)
    return FakeSlurm(tmp_path / "scontrol.log")


def incident(
    conn: psycopg.Connection,
    node: str | None,
    kind: str = "gpu_health",
    cause: str = "uncorrectable_ecc",
    severity: str = "critical",
    gpu: int | None = 1,
    evidence: dict[str, Any] | None = None,
    state: str = "open",
) -> int:
    row = conn.execute(
        "INSERT INTO incidents (kind, scope_key, node, gpu, cause, severity, state, start, last_seen, evidence) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, now(), now(), %s) RETURNING id",
        (
            kind,
            f"{kind}|{node}|{gpu}|{cause}|{time.monotonic_ns()}",
            node,
            gpu,
            cause,
            severity,
            state,
            Jsonb(evidence or {}),
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def actions(conn: psycopg.Connection, inc: int) -> list[dict[str, Any]]:
    row = conn.execute("SELECT actions FROM incidents WHERE id = %s", (inc,)).fetchone()
    assert row is not None
    return list(row[0])


def slurm_hooks(**kw: Any) -> Quarantine:
    kw.setdefault("dry_run", False)
    return Quarantine(QuarantineSettings(enabled=True, backend="slurm", **kw))


def test_on_by_default_in_dry_run_with_degraded_pcie(settings: Settings) -> None:
    q = QuarantineSettings()
    assert q.enabled is True and q.dry_run is True and q.release is True
    assert "pcie_degraded" in q.kinds and "pcie_degraded" in q.warning_kinds
    assert {"pcie_link", "kernel_xid", "dcgm_diag"} <= set(q.checks)
    assert Sweeper(settings).quarantine is not None


def test_drains_once_and_records_it(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    inc = incident(conn, "n8")
    q = slurm_hooks()
    (rec,) = q.run(conn, NOW)
    reason = f"gpufleet gpu_health uncorrectable_ecc GPU 1 (incident {inc})"
    assert slurm.calls() == [["update", "nodename=n8", "state=drain", f"reason={reason}"]]
    (stored,) = actions(conn, inc)
    assert stored == rec
    assert (stored["action"], stored["target"], stored["result"], stored["dry_run"]) == (
        "slurm_drain",
        "n8",
        "done",
        False,
    )
    assert stored["time"] == "2027-01-15T08:00:00Z" and stored["reason"] == reason
    assert stored["command"] == ["scontrol", "update", "nodename=n8", "state=drain", f"reason={reason}"]
    # Idempotent: later sweeps, a new hook object (another leader), nothing more.
    assert q.run(conn, NOW + 5) == [] and slurm_hooks().run(conn, NOW + 600) == []
    assert len(slurm.calls()) == 1 and len(actions(conn, inc)) == 1


def test_a_second_incident_on_a_quarantined_node_is_recorded_as_skipped_once(
    conn: psycopg.Connection, slurm: FakeSlurm
) -> None:
    first = incident(conn, "n8")
    q = slurm_hooks()
    q.run(conn, NOW)
    second = incident(conn, "n8", kind="nvlink_degraded", cause="links_down", gpu=5)
    q.run(conn, NOW + 5)
    q.run(conn, NOW + 10)
    (skip,) = actions(conn, second)
    assert skip["result"] == "skipped" and f"incident {first}" in skip["detail"]
    assert len(slurm.calls()) == 1


def test_a_resolved_incident_releases_the_node_after_the_hold_down(
    conn: psycopg.Connection, slurm: FakeSlurm
) -> None:
    old = incident(conn, "n8")
    q = slurm_hooks(hold_down_s=1800)
    q.run(conn, NOW)
    conn.execute("UPDATE incidents SET state = 'resolved', \"end\" = now() WHERE id = %s", (old,))
    assert q.run(conn, NOW + 60) == []  # passing starts now: the hold-down runs
    assert q.run(conn, NOW + 60 + 1700) == []
    (rel,) = q.run(conn, NOW + 60 + 1800)
    assert (rel["action"], rel["result"]) == ("slurm_resume", "done")
    assert slurm.calls()[-2:] == [["show", "node", "n8"], ["update", "nodename=n8", "state=resume"]]
    assert node_state(conn, "n8")["state"] == "released"  # type: ignore[index]
    # A new incident after the release drains it again.
    new = incident(conn, "n8", cause="row_remap_failed")
    q.run(conn, NOW + 7200)
    assert actions(conn, new)[0]["result"] == "done"
    assert [c[2] for c in slurm.calls() if c[0] == "update"] == ["state=drain", "state=resume", "state=drain"]
    log = node_log(conn, "n8")
    assert [(r["action"], r["result"]) for r in log] == [
        ("slurm_drain", "done"),
        ("slurm_resume", "done"),
        ("slurm_drain", "done"),
    ]


def test_a_trigger_back_in_the_hold_down_keeps_the_node(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    first = incident(conn, "n8")
    q = slurm_hooks(hold_down_s=600)
    q.run(conn, NOW)
    conn.execute("UPDATE incidents SET state = 'resolved' WHERE id = %s", (first,))
    q.run(conn, NOW + 60)
    again = incident(conn, "n8", kind="nvlink_degraded", cause="links_down", gpu=2)
    q.run(conn, NOW + 300)
    conn.execute("UPDATE incidents SET state = 'resolved' WHERE id = %s", (again,))
    q.run(conn, NOW + 400)  # passing again from here
    assert q.run(conn, NOW + 700) == []  # 600 s from 60 would have released it; from 400 not yet
    (rel,) = q.run(conn, NOW + 1000)
    assert rel["result"] == "done" and "passed for 600 s" in rel["reason"]
    assert actions(conn, again)[0]["result"] == "skipped"


def test_a_failed_check_quarantines_and_its_pass_releases(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    failing: dict[str, Any] = {
        "checks_status": "fail",
        "checks": [
            {
                "check": "pcie_link",
                "subject": "gpu3",
                "status": "fail",
                "finding": "link trained at Gen3 x16 of Gen5 x16 under load",
            },
            {"check": "cpu_governor", "subject": "node", "status": "fail", "finding": "powersave"},
        ],
    }
    conn.execute("INSERT INTO nodes (node, facts) VALUES ('n5', %s)", (Jsonb(failing),))
    q = slurm_hooks(hold_down_s=0)
    (rec,) = q.run(conn, NOW)
    assert rec["reason"] == "gpufleet check pcie_link failed on gpu3" and rec["result"] == "done"
    assert rec["triggers"] == [
        {
            "source": "check",
            "check": "pcie_link",
            "subject": "gpu3",
            "finding": "link trained at Gen3 x16 of Gen5 x16 under load",
        }
    ]
    assert slurm.calls() == [
        ["update", "nodename=n5", "state=drain", "reason=gpufleet check pcie_link failed on gpu3"]
    ]
    # The governor is a setting, not a fault: never a trigger.  The link passes again after a reseat.
    failing["checks"][0]["status"] = "ok"
    conn.execute("UPDATE nodes SET facts = %s WHERE node = 'n5'", (Jsonb(failing),))
    q.run(conn, NOW + 60)
    (rel,) = q.run(conn, NOW + 120)
    assert rel["action"] == "slurm_resume" and rel["result"] == "done"


def test_a_node_drained_since_for_another_reason_is_left_drained(
    conn: psycopg.Connection, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    inc = incident(conn, "n8")
    q = slurm_hooks(hold_down_s=0)
    q.run(conn, NOW)
    conn.execute("UPDATE incidents SET state = 'resolved' WHERE id = %s", (inc,))
    monkeypatch.setenv("FAKE_SCONTROL_REASON", "fan replacement")
    q.run(conn, NOW + 60)
    (rel,) = q.run(conn, NOW + 120)
    assert rel["result"] == "not_ours" and "Reason=fan replacement" in rel["detail"]
    assert ["update", "nodename=n8", "state=resume"] not in slurm.calls()
    assert node_state(conn, "n8")["state"] == "released"  # type: ignore[index]


def test_dry_run_quarantine_and_release_then_for_real(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    inc = incident(conn, "n8")
    dry = slurm_hooks(dry_run=True, hold_down_s=0)
    dry.run(conn, NOW)
    # Turned on for real while the trigger holds: the node is drained now.
    slurm_hooks(hold_down_s=0).run(conn, NOW + 60)
    assert slurm.calls()[0][:3] == ["update", "nodename=n8", "state=drain"]
    conn.execute("UPDATE incidents SET state = 'resolved' WHERE id = %s", (inc,))
    dry.run(conn, NOW + 120)
    (rel,) = dry.run(conn, NOW + 180)
    assert (rel["result"], rel["dry_run"]) == ("dry_run", True) and rel["command"][-1] == "state=resume"
    assert [(r["action"], r["result"]) for r in node_log(conn, "n8")][::-1] == [
        ("slurm_drain", "dry_run"),
        ("slurm_drain", "done"),
        ("slurm_resume", "dry_run"),
    ]


@pytest.mark.parametrize(
    ("kind", "cause", "severity", "evidence"),
    [
        ("gpu_health", "row_remap_pending", "warning", {}),  # a GPU-scoped warning
        ("nvlink_degraded", "link_errors", "warning", {}),
        ("host_misconfig", "cpu_governor", "warning", {}),  # a node setting
        ("host_misconfig", "repeated_xid", "critical", {"xid_codes": [13, 31, 43]}),  # the application's XIDs
        ("straggler", "power_cap", "critical", {}),  # not a configured kind
    ],
)
def test_never_for_warnings_application_xids_or_other_kinds(
    conn: psycopg.Connection, slurm: FakeSlurm, kind: str, cause: str, severity: str, evidence: dict[str, Any]
) -> None:
    inc = incident(conn, "n8", kind=kind, cause=cause, severity=severity, evidence=evidence)
    assert slurm_hooks().run(conn, NOW) == []
    assert slurm.calls() == [] and actions(conn, inc) == []


def test_hardware_xids_do_quarantine(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    inc = incident(conn, "n8", kind="host_misconfig", cause="repeated_xid", evidence={"xid_codes": [13, 79]})
    slurm_hooks().run(conn, NOW)
    assert actions(conn, inc)[0]["result"] == "done"


def test_dry_run_only_logs_and_records(
    conn: psycopg.Connection, slurm: FakeSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    inc = incident(conn, "n8")
    with caplog.at_level(logging.INFO, logger="gpufleet.collector.quarantine"):
        slurm_hooks(dry_run=True).run(conn, NOW)
    assert slurm.calls() == []
    (rec,) = actions(conn, inc)
    assert (rec["result"], rec["dry_run"]) == ("dry_run", True)
    assert rec["command"][:3] == ["scontrol", "update", "nodename=n8"]
    assert any("dry run" in r.message and "n8" in r.message for r in caplog.records)
    slurm_hooks(dry_run=True).run(conn, NOW + 60)
    assert len(actions(conn, inc)) == 1


def test_failure_is_recorded_retried_later_and_given_up(
    conn: psycopg.Connection, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SCONTROL_RC", "1")
    inc = incident(conn, "n8")
    q = slurm_hooks(retry_after_s=300, max_attempts=2)
    q.run(conn, NOW)
    (fail,) = actions(conn, inc)
    assert (
        fail["result"] == "failed" and "exited 1" in fail["detail"] and "Invalid node name" in fail["detail"]
    )
    q.run(conn, NOW + 60)  # too soon to retry
    assert len(slurm.calls()) == 1
    q.run(conn, NOW + 400)
    q.run(conn, NOW + 800)  # max_attempts reached
    assert len(slurm.calls()) == 2 and [a["result"] for a in actions(conn, inc)] == ["failed", "failed"]


def test_scontrol_missing_is_a_failure_that_says_so(conn: psycopg.Connection) -> None:
    inc = incident(conn, "n8")
    slurm_hooks(scontrol="/nonexistent/bin/scontrol").run(conn, NOW)
    assert "not found" in actions(conn, inc)[0]["detail"]


def test_rate_limit_across_the_fleet(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    incs = [incident(conn, f"n{k}") for k in range(3)]
    q = slurm_hooks(max_nodes_per_hour=2)
    q.run(conn, NOW)
    q.run(conn, NOW + 60)
    results = [[a["result"] for a in actions(conn, i)] for i in incs]
    assert results == [["done"], ["done"], ["rate_limited"]]
    assert "max_nodes_per_hour 2" in actions(conn, incs[2])[0]["detail"]
    q.run(conn, NOW + 3700)  # the hour has passed
    assert [a["result"] for a in actions(conn, incs[2])] == ["rate_limited", "done"]
    assert [c[1] for c in slurm.calls()] == ["nodename=n0", "nodename=n1", "nodename=n2"]


def test_scheduler_node_names_and_unsafe_names(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    mapped = incident(conn, "gpu-node-07")
    unsafe = incident(conn, "n9 state=resume")
    slurm_hooks(node_names={"gpu-node-07": "g07"}).run(conn, NOW)
    assert slurm.calls()[0][1] == "nodename=g07" and actions(conn, mapped)[0]["target"] == "g07"
    assert actions(conn, unsafe)[0]["result"] == "failed" and len(slurm.calls()) == 1


def test_node_less_incidents_are_ignored(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    incident(conn, None, kind="gpu_health")
    assert slurm_hooks().run(conn, NOW) == []


# ---------------------------------------------------------------- Kubernetes


@dataclass
class FakeApiServer:
    """Nodes as the API server keeps them: taints an atomic list, every change a new resourceVersion, a PATCH
    naming an older one refused (409)."""

    token: str
    nodes: dict[str, dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def node(request: Request) -> JSONResponse:
            name = request.path_params["name"]
            body = await request.body()
            self.requests.append(
                {
                    "method": request.method,
                    "path": request.url.path,
                    "name": name,
                    "content_type": request.headers.get("content-type"),
                    "auth": request.headers.get("authorization"),
                    "body": json.loads(body or b"{}"),
                }
            )
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse(
                    {"kind": "Status", "status": "Failure", "message": "Unauthorized", "code": 401}, 401
                )
            if name not in self.nodes:
                return JSONResponse(
                    {"kind": "Status", "message": f'nodes "{name}" not found', "code": 404}, 404
                )
            obj = self.nodes[name]
            if request.method == "GET":
                return JSONResponse(obj)
            if request.headers.get("content-type") != "application/strategic-merge-patch+json":
                return JSONResponse({"kind": "Status", "message": "unsupported patch type", "code": 415}, 415)
            patch = json.loads(body)
            want = patch.get("metadata", {}).get("resourceVersion")
            if want is not None and want != obj["metadata"]["resourceVersion"]:
                return JSONResponse(
                    {"kind": "Status", "message": "the object has been modified", "code": 409}, 409
                )
            obj["spec"]["unschedulable"] = bool(patch["spec"]["unschedulable"])
            if "taints" in patch["spec"]:
                obj["spec"]["taints"] = patch["spec"]["taints"]
            notes = obj["metadata"].setdefault("annotations", {})
            for k, v in patch.get("metadata", {}).get("annotations", {}).items():
                if v is None:
                    notes.pop(k, None)
                else:
                    notes[k] = v
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            return JSONResponse(obj)

        return Starlette(routes=[Route("/api/v1/nodes/{name}", node, methods=["GET", "PATCH"])])


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[tuple[FakeApiServer, str, Path, Path]]:
    ca = TestCA(tmp_path / "ca")
    pair = ca.server()
    fake = FakeApiServer(
        token="sa-token-123",
        nodes={
            n: {
                "kind": "Node",
                "metadata": {"name": n, "resourceVersion": "100"},
                "spec": {"unschedulable": False, "taints": [dict(GPU_TAINT)]},
            }
            for n in ("n8", "g07")
        },
    )
    token = tmp_path / "token"
    token.write_text("sa-token-123\n")
    with serve(fake.app(), ssl_certfile=str(pair.cert), ssl_keyfile=str(pair.key)) as srv:
        yield fake, srv.url, token, ca.pem


def test_cordon_and_taint_the_node_then_release_it(
    conn: psycopg.Connection, k8s: tuple[FakeApiServer, str, Path, Path]
) -> None:
    fake, url, token, ca = k8s
    inc = incident(conn, "n8")
    q = Quarantine(
        QuarantineSettings(
            enabled=True,
            dry_run=False,
            backend="kubernetes",
            k8s_api_url=url,
            k8s_token_file=token,
            k8s_ca_file=ca,
            hold_down_s=0,
        )
    )
    q.run(conn, NOW)
    get, patch = fake.requests
    assert (get["method"], patch["method"], patch["path"]) == ("GET", "PATCH", "/api/v1/nodes/n8")
    assert (
        patch["content_type"] == "application/strategic-merge-patch+json"
        and patch["auth"] == "Bearer sa-token-123"
    )
    reason = f"gpufleet gpu_health uncorrectable_ecc GPU 1 (incident {inc})"
    assert patch["body"] == {
        "spec": {
            "unschedulable": True,
            "taints": [
                GPU_TAINT,
                {"key": K8S_TAINT, "value": "gpu_health-uncorrectable_ecc-GPU-1", "effect": "NoSchedule"},
            ],
        },
        "metadata": {"annotations": {K8S_ANNOTATION: reason}, "resourceVersion": "100"},
    }
    node = fake.nodes["n8"]
    assert node["spec"]["unschedulable"] is True and [t["key"] for t in node["spec"]["taints"]] == [
        "nvidia.com/gpu",
        K8S_TAINT,
    ]
    (rec,) = actions(conn, inc)
    assert (rec["action"], rec["result"], rec["target"]) == ("k8s_cordon", "done", "n8")
    assert rec["request"] == f"PATCH {url}/api/v1/nodes/n8"
    q.run(conn, NOW + 5)
    assert len(fake.requests) == 2
    # The incident resolves: uncordoned, gpufleet's taint and annotation gone, the other taint kept.
    conn.execute("UPDATE incidents SET state = 'resolved' WHERE id = %s", (inc,))
    q.run(conn, NOW + 60)
    (rel,) = q.run(conn, NOW + 120)
    assert (rel["action"], rel["result"]) == ("k8s_uncordon", "done")
    assert node["spec"] == {"unschedulable": False, "taints": [GPU_TAINT]}
    assert K8S_ANNOTATION not in node["metadata"]["annotations"]


def test_a_node_changed_between_read_and_write_is_retried(
    conn: psycopg.Connection, k8s: tuple[FakeApiServer, str, Path, Path]
) -> None:
    fake, url, token, ca = k8s
    api = KubernetesCordon(url, token, ca)
    taints, version, _ = api._read("n8")
    fake.nodes["n8"]["metadata"]["resourceVersion"] = "101"  # someone else changed it meanwhile
    out = api.api.patch(
        api.path("n8"), api.body("r", taints, version), "application/strategic-merge-patch+json", ""
    )
    assert out.result == "failed" and out.detail == "HTTP 409: the object has been modified"
    assert fake.nodes["n8"]["spec"]["taints"] == [GPU_TAINT]


def test_cordon_failures_name_the_cause(tmp_path: Path, k8s: tuple[FakeApiServer, str, Path, Path]) -> None:
    fake, url, token, ca = k8s
    bad = tmp_path / "bad-token"
    bad.write_text("nope")
    out = KubernetesCordon(url, bad, ca, taint=False).apply("n8", "r")
    assert out.result == "failed" and out.detail == "HTTP 401: Unauthorized"
    out = KubernetesCordon(url, bad, ca).apply("n8", "r")
    assert out.result == "failed" and out.detail == "reading the node's taints first: HTTP 401: Unauthorized"
    out = KubernetesCordon(url, token, ca).apply("gone", "r")
    assert out.result == "failed" and out.detail.endswith('HTTP 404: nodes "gone" not found')
    out = KubernetesCordon(url, tmp_path / "missing", ca, taint=False).apply("n8", "r")
    assert out.result == "failed" and "cannot read the service account token" in out.detail
    # Without the cluster's CA the server's certificate is not trusted: nothing is sent.
    sent = len(fake.requests)
    out = KubernetesCordon(url, token, None).apply("n8", "r")
    assert out.result == "failed" and "unreachable" in out.detail and len(fake.requests) == sent
    out = KubernetesCordon(url, token, tmp_path / "no-ca.crt").apply("n8", "r")
    assert out.result == "failed" and "cannot load the CA" in out.detail
    out = KubernetesCordon("https://127.0.0.1:1", token, ca, timeout_s=2).apply("n8", "r")
    assert out.result == "failed" and "unreachable" in out.detail


def test_slurm_drain_times_out(tmp_path: Path) -> None:
    slow = tmp_path / "scontrol"
    slow.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    slow.chmod(0o755)
    out = SlurmDrain(str(slow), timeout_s=0.5).apply("n8", "r")
    assert out.result == "failed" and "did not finish" in out.detail


def test_incident_api_returns_the_actions(
    conn: psycopg.Connection, slurm: FakeSlurm, settings: Settings
) -> None:
    from gpufleet.api.app import create_app
    from gpufleet.auth import create_token

    inc = incident(conn, "n8")
    incident(
        conn,
        "n9",
        kind="host_misconfig",
        cause="repeated_xid",
        severity="warning",
        evidence={"xid_codes": [48, 63, 999], "last_xid": 63},
    )
    slurm_hooks().run(conn, NOW)
    token = create_token(conn, "sre-q", "sre")
    with serve(create_app(conn.info.dsn, settings)) as srv:
        got = httpx.get(
            f"{srv.url}/v1/incidents", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).json()
        page = httpx.get(
            f"{srv.url}/incidents/{inc}", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).text
        xids = httpx.get(
            f"{srv.url}/incidents/{inc + 1}", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).text
    (one,) = [i for i in got if i["id"] == inc]
    assert [a["result"] for a in one["actions"]] == ["done"] and one["actions"][0]["action"] == "slurm_drain"
    assert "slurm_drain n8: <strong>done</strong>" in page
    # XIDs decoded in the web view: what each means and the first action.
    assert "XID 48: double-bit ECC error" in xids and "first action: reset gpu" in xids
    assert "XID 63: row remap or page retirement recorded" in xids
    assert "XID 999: not in gpufleet&#x27;s table" in xids


def test_the_live_sweep_drains_the_node_of_an_uncorrectable_error(
    db: str, settings: Settings, slurm: FakeSlurm
) -> None:
    """The simulated gpu_health fleet through the collector's writer and the live sweep: the GPU that
    takes a double-bit error (h100-03/7, ~671 s in) gets a critical incident and its node is drained;
    the correctable-error storm on h100-01/7 (a warning) drains nothing."""
    from tests.surfaces.fleetdb import fill

    live = settings.model_copy(
        update={"quarantine": QuarantineSettings(enabled=True, backend="slurm", dry_run=False)}
    )
    fill(db, live, "gpu_health", 720.0, sweep_every_s=15.0)
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT kind, cause, severity, node, gpu, actions FROM incidents WHERE state = 'open' "
            "ORDER BY node, gpu"
        ).fetchall()
    by = {(r[0], r[3], r[4]): r for r in rows}
    assert by[("gpu_health", "h100-03", 7)][1:3] == ("uncorrectable_ecc", "critical")
    # The same error's XIDs (48, then 63 for the remap) are hardware XIDs: a repeated-XID incident too.
    assert by[("host_misconfig", "h100-03", 7)][1:3] == ("repeated_xid", "critical")
    assert by[("gpu_health", "h100-01", 7)][1:3] == ("correctable_ecc", "warning")
    results = sorted(a["result"] for k in ("gpu_health", "host_misconfig") for a in by[(k, "h100-03", 7)][5])
    assert results == [
        "done",
        "skipped",
    ]  # one drain for the node, the other incident says why it did nothing
    assert by[("gpu_health", "h100-01", 7)][5] == []
    assert [c[:3] for c in slurm.calls()] == [["update", "nodename=h100-03", "state=drain"]]
