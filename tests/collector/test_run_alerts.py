"""Alerts on idle and hung runs: one per incident, naming the run, its team, the web pages and the runbook."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector.alerting import IncidentMetrics, to_alert
from tests.system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "gpufleet.rules.yml"
RULE_TESTS = PROM / "tests" / "gpufleet.rules.test.yml"


def _open(
    conn: psycopg.Connection,
    kind: str,
    run_id: str | None,
    severity: str,
    evidence: dict[str, object],
    cause: str | None = None,
) -> int:
    row = conn.execute(
        "INSERT INTO incidents (kind, scope_key, run_id, node, cause, severity, start, last_seen, evidence) "
        "VALUES (%s, %s, %s, %s, %s, %s, now(), now(), %s) RETURNING id",
        (kind, f"{kind}|{run_id}", run_id, None if run_id else "n1", cause, severity, json.dumps(evidence)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _families(db: str, redact: bool = False) -> dict[str, list[dict[str, str]]]:
    reg = CollectorRegistry()
    reg.register(IncidentMetrics(db, cache_s=0, redact=redact))
    fams = text_string_to_metric_families(generate_latest(reg).decode())
    return {f.name: [s.labels for s in f.samples] for f in fams}


def test_each_open_run_incident_is_one_series_with_its_team(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, team, start) VALUES ('notebook', 'research', now()), "
            "('orphan', NULL, now())"
        )
        idle = _open(
            conn,
            "idle_allocation",
            "notebook",
            "warning",
            {"gpus": [{"node": "n1", "gpu": g} for g in range(8)]},
            cause="all",
        )
        hung = _open(conn, "hung_collective", "orphan", "critical", {"gpus": [{"node": "n2", "gpu": 3}]})
        _open(conn, "host_misconfig", None, "warning", {}, cause="cpu_governor")  # a node's: not a run's
    series = _families(db)["gpufleet_incident_run"]
    assert sorted(series, key=lambda s: s["incident_id"]) == [
        {
            "kind": "idle_allocation",
            "incident_id": str(idle),
            "run_id": "notebook",
            "run_team": "research",
            "cause": "all",
            "severity": "warning",
        },
        {
            "kind": "hung_collective",
            "incident_id": str(hung),
            "run_id": "orphan",
            "run_team": "",
            "cause": "",
            "severity": "critical",
        },
    ]
    # the per-GPU series stay as they were: eight for the idle incident's GPUs
    assert len([s for s in _families(db)["gpufleet_incident_open"] if s["kind"] == "idle_allocation"]) == 8
    # redacted metrics name no run
    assert "gpufleet_incident_run" not in _families(db, redact=True)


def test_a_pushed_alert_names_the_runs_team(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, team, start) VALUES ('notebook', 'research', now())")
        _open(conn, "idle_allocation", "notebook", "warning", {}, cause="all")
        row = conn.execute(
            "SELECT id, kind, run_id, node, gpu, cause, severity, start, evidence, "
            "(SELECT team FROM runs r WHERE r.run_id = i.run_id) AS team FROM incidents i"
        ).fetchone()
    assert row is not None
    alert = to_alert(
        dict(
            zip(
                ("id", "kind", "run_id", "node", "gpu", "cause", "severity", "start", "evidence", "team"),
                row,
                strict=True,
            )
        )
    )
    assert (
        alert["labels"]["alertname"] == "GpufleetIdleAllocation" and alert["labels"]["run_team"] == "research"
    )


TEAM = 'team: "{{ if $labels.run_team }}{{ $labels.run_team }}{{ else }}ml-platform{{ end }}"'


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # another kind's incidents
        (
            'gpufleet:incident_severity:held{kind="hung_collective"}',
            'gpufleet:incident_severity:held{kind="hung"}',
        ),
        # severity in the alert's identity: a change would start a new alert
        (
            'expr: gpufleet:incident_severity:held{kind="idle_allocation"}',
            'expr: gpufleet:incident_severity:held{kind="idle_allocation"} * on (incident_id) group_left (severity) '
            "max by (incident_id, severity) (gpufleet_incident_info)",
        ),
        # the run's team left out
        (
            f'held{{kind="idle_allocation"}}\n        for: 1m\n        labels:\n          {TEAM}',
            'held{kind="idle_allocation"}\n        for: 1m\n        labels:\n          team: ml-platform',
        ),
        # a hung run waits before it alerts
        ('held{kind="hung_collective"}\n        for: 0s', 'held{kind="hung_collective"}\n        for: 5m'),
        # the wording, the incident's page or the runbook left out
        ("holds GPUs that do no work", "holds idle GPUs"),
        (
            '/incidents/{{ $labels.incident_id }}"\n          run_page: "{{ $externalLabels.gpufleet_web }}/runs/{{ '
            '$labels.run_id | urlquery }}"\n          runbook_url: "{{ $externalLabels.gpufleet_web }}/runbooks#hung_collective"',
            '/incidents/"\n          run_page: "{{ $externalLabels.gpufleet_web }}/runs/{{ '
            '$labels.run_id | urlquery }}"\n          runbook_url: "{{ $externalLabels.gpufleet_web }}/runbooks#hung_collective"',
        ),
        ('/runbooks#idle_allocation"', '/runbooks"'),
        # a failed run action no longer alerts
        ('(gpufleet_incident_run_action{result="failed"})', '(gpufleet_incident_run_action{result="error"})'),
    ],
)
def test_the_rule_tests_catch_a_broken_run_rule(tmp_path: Path, old: str, new: str) -> None:
    text = RULES.read_text()
    assert old in text
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    r = subprocess.run(
        [tool("promtool", "prometheus"), "test", "rules", str(tmp_path / "tests" / RULE_TESTS.name)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr
