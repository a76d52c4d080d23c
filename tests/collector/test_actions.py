"""Run actions on idle and hung runs against fake ``scontrol``/``scancel`` on PATH and a fake Kubernetes
API server on loopback (HTTPS with a CA made for the test), recording on real incidents in PostgreSQL."""

from __future__ import annotations

import json
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
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.types.json import Jsonb
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpufleet.collector.actions import RunActions, k8s_path, slurm_job
from gpufleet.collector.alerting import IncidentMetrics
from gpufleet.collector.quarantine import Quarantine
from gpufleet.collector.scheduler import KubernetesApi
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import QuarantineSettings, RunActionSettings, Settings
from gpufleet.serverthread import serve
from tests.collector.test_quarantine import FakeSlurm, actions
from testsupport.certs import TestCA

NOW = 1_800_000_000.0

FAKE = """#!{python}
# A stand-in for Slurm's {name}: logs its argv, answers as FAKE_SLURM_RC says.
import json, os, sys
with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
    f.write(json.dumps(["{name}", *sys.argv[1:]]) + "\\n")
rc = int(os.environ.get("FAKE_SLURM_RC", "0"))
if rc:
    sys.stderr.write("{name}: error: Invalid job id specified\\n")
elif sys.argv[1:4] == ["show", "job", "-o"]:
    print("JobId=" + sys.argv[4] + " JobName=train UserId=ana(1000) Partition=" +
          os.environ.get("FAKE_SLURM_PARTITION", "batch") + " NumNodes=2 TRES=cpu=64,gres/gpu=16")
sys.exit(rc)
"""


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("scontrol", "scancel"):
        exe = bindir / name
        exe.write_text(FAKE.format(python=sys.executable, name=name))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "slurm.log"))
    monkeypatch.delenv("FAKE_SLURM_RC", raising=False)
    return FakeSlurm(tmp_path / "slurm.log")


def run(
    conn: psycopg.Connection,
    run_id: str,
    team: str | None = None,
    labels: dict[str, str] | None = None,
    ended: bool = False,
) -> None:
    conn.execute(
        'INSERT INTO runs (run_id, team, labels, start, "end") VALUES (%s, %s, %s, to_timestamp(%s), '
        "to_timestamp(%s))",
        (run_id, team, Jsonb(labels or {}), NOW - 7200, NOW - 100 if ended else None),
    )


def incident(
    conn: psycopg.Connection,
    run_id: str,
    kind: str = "idle_allocation",
    cause: str | None = "all",
    started_s_ago: float = 3600.0,
) -> int:
    row = conn.execute(
        "INSERT INTO incidents (kind, scope_key, run_id, cause, severity, state, start, last_seen, evidence) "
        "VALUES (%s, %s, %s, %s, 'warning', 'open', to_timestamp(%s), to_timestamp(%s), '{}') RETURNING id",
        (kind, f"{kind}|{run_id}|{time.monotonic_ns()}", run_id, cause, NOW - started_s_ago, NOW),
    ).fetchone()
    assert row is not None
    return int(row[0])


def slurm_actions(**kw: Any) -> RunActions:
    base: dict[str, Any] = {
        "enabled": True,
        "dry_run": False,
        "teams": ["research"],
        "kinds": {"idle_allocation": "cancel", "hung_collective": "requeue"},
    }
    return RunActions(RunActionSettings(**{**base, **kw}), by="collector c1")


def test_off_by_default_and_dry_run_first(settings: Settings) -> None:
    s = settings.actions
    assert not s.enabled and s.dry_run and set(s.kinds.values()) == {"notify"} and s.teams == []
    assert Sweeper(settings).actions is None


def test_cancels_an_allow_listed_idle_run_once_and_records_who_and_why(
    conn: psycopg.Connection, slurm: FakeSlurm
) -> None:
    run(conn, "4242", team="research")
    inc = incident(conn, "4242")
    acts = slurm_actions()
    (rec,) = acts.run(conn, NOW)
    assert slurm.calls() == [["scancel", "4242"]]
    assert (rec["action"], rec["result"], rec["target"], rec["run_id"]) == (
        "slurm_cancel",
        "done",
        "job 4242",
        "4242",
    )
    assert rec["by"] == "collector c1 (actions.kinds.idle_allocation = cancel)"
    assert rec["allowed_by"] == "team research" and rec["command"] == ["scancel", "4242"]
    assert (
        rec["reason"].startswith("gpufleet idle_allocation (all): run 4242 since ")
        and f"incident {inc}" in rec["reason"]
    )
    assert actions(conn, inc) == [rec]
    assert acts.run(conn, NOW + 60) == [] and len(slurm.calls()) == 1  # once per incident


def test_a_hang_is_requeued_by_partition(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    run(conn, "gpu-77", labels={"slurm.job_id": "77", "slurm.partition": "batch"})
    inc = incident(conn, "gpu-77", kind="hung_collective", cause=None)
    slurm_actions(teams=[], partitions=["batch"]).run(conn, NOW)
    assert slurm.calls() == [["scontrol", "requeue", "77"]]
    (rec,) = actions(conn, inc)
    assert rec["allowed_by"] == "partition batch" and rec["detail"] == "requeued"


def test_the_partition_is_asked_of_slurm_when_the_run_has_no_label(
    conn: psycopg.Connection, slurm: FakeSlurm
) -> None:
    run(conn, "78", team="other")
    inc = incident(conn, "78")
    slurm_actions(partitions=["batch"]).run(conn, NOW)
    assert slurm.calls() == [["scontrol", "show", "job", "-o", "78"], ["scancel", "78"]]
    assert actions(conn, inc)[0]["allowed_by"] == "partition batch"


def test_runs_not_allow_listed_are_skipped_once(
    conn: psycopg.Connection, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(conn, "5", team="other", labels={"slurm.partition": "debug"})
    run(conn, "50", team="other")
    inc = incident(conn, "5")
    asked = incident(conn, "50")
    monkeypatch.setenv("FAKE_SLURM_PARTITION", "interactive")
    acts = slurm_actions(partitions=["batch"])
    acts.run(conn, NOW)
    acts.run(conn, NOW + 60)
    assert [c[0:2] for c in slurm.calls()] == [
        ["scontrol", "show"],
        ["scontrol", "show"],
    ]  # asked, never acted
    (rec,) = actions(conn, inc)
    assert rec["result"] == "skipped"
    assert (
        rec["detail"]
        == "run 5 is not allow-listed (team other, partition debug; actions.teams, actions.partitions)"
    )
    (rec,) = actions(conn, asked)
    assert rec["detail"] == (
        "run 50 is not allow-listed (team other, partition interactive; actions.teams, actions.partitions)"
    )


def test_dry_run_only_logs_and_records(
    conn: psycopg.Connection, slurm: FakeSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    run(conn, "6", team="research")
    inc = incident(conn, "6")
    slurm_actions(dry_run=True).run(conn, NOW)
    assert slurm.calls() == []
    (rec,) = actions(conn, inc)
    assert rec["result"] == "dry_run" and rec["dry_run"] is True and rec["command"] == ["scancel", "6"]
    assert "would slurm_cancel job 6" in caplog.text


def test_notify_only_records_the_decision_for_every_run(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    run(conn, "7", team="anyone")
    inc = incident(conn, "7")
    RunActions(RunActionSettings(enabled=True), by="c1").run(conn, NOW)
    (rec,) = actions(conn, inc)
    assert (rec["action"], rec["result"], rec["dry_run"]) == ("notify", "done", False)
    assert slurm.calls() == []


def test_waits_and_leaves_ended_runs_alone(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    run(conn, "8", team="research")
    run(conn, "9", team="research", ended=True)
    young = incident(conn, "8", started_s_ago=60)
    incident(conn, "9")
    acts = slurm_actions(wait_s=600)
    assert acts.run(conn, NOW) == []  # one too young, one whose run ended
    assert [r["result"] for r in acts.run(conn, NOW + 600)] == ["done"]
    assert slurm.calls() == [["scancel", "8"]] and actions(conn, young)[0]["result"] == "done"


def test_failure_is_recorded_retried_later_and_given_up(
    conn: psycopg.Connection, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SLURM_RC", "1")
    run(conn, "10", team="research")
    inc = incident(conn, "10")
    acts = slurm_actions(retry_after_s=300, max_attempts=2)
    acts.run(conn, NOW)
    acts.run(conn, NOW + 60)  # too soon to retry
    acts.run(conn, NOW + 400)
    acts.run(conn, NOW + 1000)  # given up after two
    recs = actions(conn, inc)
    assert [r["result"] for r in recs] == ["failed", "failed"]
    assert recs[0]["detail"] == "scancel exited 1: scancel: error: Invalid job id specified"


def test_no_job_id_is_a_failure_that_says_so_once(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    run(conn, "notebook-ab", team="research")
    inc = incident(conn, "notebook-ab")
    acts = slurm_actions()
    acts.run(conn, NOW)
    acts.run(conn, NOW + 600)
    (rec,) = actions(conn, inc)
    assert rec["result"] == "failed" and rec["detail"].startswith("no Slurm job id for run notebook-ab")
    assert slurm.calls() == []


def test_one_action_per_run_and_a_rate_limit(conn: psycopg.Connection, slurm: FakeSlurm) -> None:
    for r in ("11", "12", "13"):
        run(conn, r, team="research")
    first = incident(conn, "11")
    second = incident(conn, "11", kind="hung_collective", cause=None)
    incident(conn, "12")
    limited = incident(conn, "13")
    acts = slurm_actions(max_per_hour=2)
    acts.run(conn, NOW)
    acts.run(conn, NOW + 60)
    assert slurm.calls() == [["scancel", "11"], ["scancel", "12"]]
    assert actions(conn, first)[0]["result"] == "done"
    (held,) = actions(conn, second)
    assert held["result"] == "skipped" and held["detail"] == f"run 11 already acted on for incident {first}"
    (rl,) = actions(conn, limited)
    assert rl["result"] == "rate_limited"
    acts.run(conn, NOW + 3700)  # a new hour
    assert slurm.calls()[-1] == ["scancel", "13"]


def test_the_backend_refuses_an_action_it_cannot_take() -> None:
    with pytest.raises(ValidationError, match="cancel is not an action of the kubernetes backend"):
        RunActionSettings(backend="kubernetes", kinds={"idle_allocation": "cancel"})


@pytest.mark.parametrize(
    ("run_id", "labels", "prefix", "job"),
    [
        ("4242", {}, "", "4242"),
        ("slurm-4242", {}, "slurm-", "4242"),
        ("123_4", {}, "", "123_4"),
        ("x", {"slurm.job_id": "99+1"}, "", "99+1"),
        ("nb-1", {}, "", None),
        ("12; rm -rf /", {}, "", None),
        ("x", {"slurm.job_id": "--all"}, "", None),
    ],
)
def test_slurm_job_ids(run_id: str, labels: dict[str, str], prefix: str, job: str | None) -> None:
    assert slurm_job(run_id, labels, prefix) == job


@pytest.mark.parametrize(
    ("labels", "path"),
    [
        (
            {"k8s.namespace": "ml", "k8s.kind": "PyTorchJob", "k8s.name": "bert"},
            "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/bert",
        ),
        ({"k8s.namespace": "ml", "k8s.kind": "Pod", "k8s.name": "nb-0"}, "/api/v1/namespaces/ml/pods/nb-0"),
        ({"k8s.namespace": "ml", "k8s.kind": "Job", "k8s.name": "j"}, "/apis/batch/v1/namespaces/ml/jobs/j"),
        ({"k8s.namespace": "ml", "k8s.kind": "Widget", "k8s.name": "w"}, None),
        ({"k8s.namespace": "ml", "k8s.kind": "Pod", "k8s.name": "../x"}, None),
        ({}, None),
    ],
)
def test_kubernetes_owner_paths(labels: dict[str, str], path: str | None) -> None:
    assert k8s_path(labels, {})[0] == path


# ---------------------------------------------------------------- Kubernetes


@dataclass
class FakeApiServer:
    token: str
    objects: set[str]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def patch(request: Request) -> JSONResponse:
            body = await request.body()
            self.requests.append(
                {
                    "path": request.url.path,
                    "content_type": request.headers.get("content-type"),
                    "auth": request.headers.get("authorization"),
                    "body": json.loads(body or b"{}"),
                }
            )
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"kind": "Status", "message": "Unauthorized", "code": 401}, 401)
            if request.headers.get("content-type") != "application/merge-patch+json":
                return JSONResponse({"kind": "Status", "message": "unsupported patch type", "code": 415}, 415)
            if request.url.path not in self.objects:
                return JSONResponse({"kind": "Status", "message": "not found", "code": 404}, 404)
            return JSONResponse({"metadata": json.loads(body)["metadata"]})

        return Starlette(routes=[Route("/{rest:path}", patch, methods=["PATCH"])])


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[tuple[FakeApiServer, str, Path, Path]]:
    ca = TestCA(tmp_path / "ca")
    pair = ca.server()
    fake = FakeApiServer(token="sa-token-9", objects={"/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/bert"})
    token = tmp_path / "token"
    token.write_text("sa-token-9\n")
    with serve(fake.app(), ssl_certfile=str(pair.cert), ssl_keyfile=str(pair.key)) as srv:
        yield fake, srv.url, token, ca.pem


def test_annotates_the_runs_owner(
    conn: psycopg.Connection, k8s: tuple[FakeApiServer, str, Path, Path]
) -> None:
    fake, url, token, ca = k8s
    owner = {"k8s.namespace": "ml", "k8s.kind": "PyTorchJob", "k8s.name": "bert"}
    run(conn, "ml:bert:1234abcd", team="nlp", labels=owner)
    run(conn, "ml:gone", team="nlp", labels={**owner, "k8s.name": "gone"})
    inc = incident(conn, "ml:bert:1234abcd", kind="hung_collective", cause=None)
    missing = incident(conn, "ml:gone")
    s = RunActionSettings(
        enabled=True,
        dry_run=False,
        backend="kubernetes",
        teams=["nlp"],
        k8s_api_url=url,
        k8s_token_file=token,
        k8s_ca_file=ca,
        kinds={"idle_allocation": "annotate", "hung_collective": "annotate"},
    )
    RunActions(s, by="c1").run(conn, NOW)
    ok = next(r for r in fake.requests if r["path"].endswith("/bert"))
    assert ok["auth"] == "Bearer sa-token-9" and ok["content_type"] == "application/merge-patch+json"
    (rec,) = actions(conn, inc)
    assert ok["body"] == {"metadata": {"annotations": {"gpufleet.io/hung-collective": rec["reason"]}}}
    assert (rec["action"], rec["result"], rec["target"]) == ("k8s_annotate", "done", "PyTorchJob ml/bert")
    assert rec["request"] == f"PATCH {url}/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/bert"
    (bad,) = actions(conn, missing)
    assert bad["result"] == "failed" and bad["detail"] == "HTTP 404: not found"


def test_the_shared_kubernetes_client_says_why_it_failed(
    tmp_path: Path, k8s: tuple[FakeApiServer, str, Path, Path]
) -> None:
    _, url, token, ca = k8s
    out = KubernetesApi(url, tmp_path / "missing", ca).patch(
        "/api/v1/x", {}, "application/merge-patch+json", "ok"
    )
    assert out.result == "failed" and "cannot read the service account token" in out.detail
    out = KubernetesApi(url, token, None).patch("/api/v1/x", {}, "application/merge-patch+json", "ok")
    assert out.result == "failed" and "unreachable" in out.detail


# ---------------------------------------------------------------- with the quarantine hooks, the API, the metrics


def test_quarantine_and_run_actions_keep_to_their_own_records(
    conn: psycopg.Connection, slurm: FakeSlurm
) -> None:
    run(conn, "14", team="research")
    inc = incident(conn, "14")
    slurm_actions().run(conn, NOW)
    # the quarantine hook acts on critical node incidents only, and reads only its own records
    assert Quarantine(QuarantineSettings(enabled=True)).run(conn, NOW) == []
    reg = CollectorRegistry()
    reg.register(IncidentMetrics(conn.info.dsn, cache_s=0))
    fams = {
        f.name: [s.labels for s in f.samples]
        for f in text_string_to_metric_families(generate_latest(reg).decode())
    }
    assert fams["gpufleet_incident_run_action"] == [
        {"kind": "idle_allocation", "run_id": "14", "action": "slurm_cancel", "result": "done"}
    ]
    assert fams["gpufleet_incident_quarantine"] == []
    assert [a["action"] for a in actions(conn, inc)] == ["slurm_cancel"]


def test_the_incident_api_shows_the_action(
    conn: psycopg.Connection, slurm: FakeSlurm, settings: Settings
) -> None:
    from gpufleet.api.app import create_app
    from gpufleet.auth import create_token

    run(conn, "15", team="research")
    inc = incident(conn, "15")
    slurm_actions().run(conn, NOW)
    token = create_token(conn, "sre-a", "sre")
    with serve(create_app(conn.info.dsn, settings)) as srv:
        got = httpx.get(
            f"{srv.url}/v1/incidents/{inc}", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).json()
    (rec,) = got["actions"]
    assert (rec["action"], rec["result"], rec["by"]) == (
        "slurm_cancel",
        "done",
        "collector c1 (actions.kinds.idle_allocation = cancel)",
    )
    assert rec["reason"].endswith(f"(incident {inc})")


def test_the_live_sweep_runs_the_actions(db: str, settings: Settings, slurm: FakeSlurm) -> None:
    s = settings.model_copy(
        update={
            "actions": RunActionSettings(
                enabled=True, dry_run=False, teams=["research"], kinds={"idle_allocation": "cancel"}
            )
        }
    )
    with psycopg.connect(db, autocommit=True) as conn:
        run(conn, "16", team="research")
        inc = incident(conn, "16", started_s_ago=600)
        sweeper = Sweeper(s, snapshots=False)
        sweeper(conn, NOW)
        assert sweeper.last["run_actions"] == 1
        assert actions(conn, inc)[0]["result"] == "done" and slurm.calls() == [["scancel", "16"]]
