"""docs/contracts.md section 4: the Prometheus series outside dashboards and alerts read, by name, type and labels.

The collector's and the agent's registries (the incident and per-run series read from a database with an open
incident and a run) are rendered as Prometheus does and parsed back: every series the section lists must be
there with its type and its labels, and every series the shipped alert rules read must be listed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.metrics import AgentMetrics
from gpufleet.collector.alerting import IncidentMetrics
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.remote_write import RemoteWriteMetrics
from gpufleet.collector.run_metrics import RunMetrics, RunMetricsRefresher
from gpufleet.config import RunMetricsSettings
from tests.accounting.builders import constant_power, gpu_samples, node, site
from tests.contracts import docs

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "gpufleet.rules.yml"


def documented() -> dict[str, tuple[str, set[str]]]:
    """series name (as the family is named: no ``_total``) -> (type, labels) from every table of section 4: the
    labels in ``{...}`` after a name, and those a table's ``labels`` column names (before any ``:``)."""
    body = docs.section("4. Metric names")
    out: dict[str, tuple[str, set[str]]] = {}
    labels_column = False
    for line in body.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "series":
            labels_column = len(cells) > 2 and cells[2] == "labels"
            continue
        if len(cells) < 3 or cells[1] not in ("counter", "gauge", "histogram"):
            continue
        for m in re.finditer(r"`(gpufleet_[a-z_]+)(\{([a-z_, ]+)\})?`", cells[0]):
            name = m.group(1).removesuffix("_total") if cells[1] == "counter" else m.group(1)
            labels = {x.strip() for x in (m.group(3) or "").split(",") if x.strip()}
            if labels_column:
                labels |= set(re.findall(r"`([a-z_]+)`", cells[2].split(":")[0]))
            out[name] = (cells[1], labels)
    return out


@pytest.fixture
def exposition(db: str, settings) -> dict[str, tuple[str, set[str]]]:  # type: ignore[no-untyped-def]
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "eu", price=0.2, gpu_hour=2.0, currency="EUR")
        node(conn, "n1", 2, "eu")
        conn.execute("UPDATE nodes SET first_seen = now() - interval '1 hour', last_seen = now()")
        conn.execute(
            "INSERT INTO runs (run_id, site, team, start) VALUES ('r1', 'eu', 'lm', now() - interval '20 min')"
        )
        conn.execute("INSERT INTO run_allocations (run_id, node, gpu) VALUES ('r1', 'n1', 0)")
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, run_id, node, gpu, cause, severity, start, last_seen, evidence, "
            "actions) VALUES ('starvation', 'k1', 'r1', NULL, NULL, 'cpu', 'warning', now(), now(), %s, "
            '\'[{"action": "slurm_drain", "result": "failed", "time": "2026-01-01T00:00:00Z"}]\')',
            (json.dumps({"duty_cycle": 0.4}),),
        )
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, node, gpu, cause, severity, start, last_seen, evidence, actions) "
            "VALUES ('gpu_health', 'k2', 'n1', 1, 'uncorrectable_ecc', 'critical', now(), now(), '{}', "
            '\'[{"action": "slurm_drain", "result": "done", "time": "2026-01-01T00:00:00Z"}]\')'
        )
        gpu_samples(conn, constant_power("n1", [0], 300.0, 0, 60), queue=False)
        RunMetricsRefresher(db, RunMetricsSettings(per_gpu=True), lambda: True).refresh(conn)
    cm = CollectorMetrics()
    cm.registry.register(IncidentMetrics(db, cache_s=0))
    cm.registry.register(RunMetrics(db, cache_s=0))
    RemoteWriteMetrics(cm.registry)
    agent = AgentMetrics()
    # labelled counters show their labels once counted
    cm.requests.labels(code="200").inc()
    cm.errors.labels(reason="skew").inc()
    agent.source_errors.labels(source="nvml", kind="timeout").inc()
    agent.samples_dropped.labels(reason="spool_full").inc()
    out: dict[str, tuple[str, set[str]]] = {}
    for reg in (cm.registry, agent.registry):
        for fam in text_string_to_metric_families(generate_latest(reg).decode()):
            labels = {k for s in fam.samples for k in s.labels if k not in ("le", "quantile")}
            out[fam.name] = (fam.type, labels)
    return out


def test_every_documented_series_is_exported_with_its_type_and_labels(
    exposition: dict[str, tuple[str, set[str]]],
) -> None:
    listed = documented()
    assert {"gpufleet_incident", "gpufleet_run_cost", "gpufleet_remote_write_requests"} <= set(listed)
    for name, (kind, labels) in listed.items():
        assert name in exposition, f"{name}: documented in docs/contracts.md section 4, not exported"
        got_kind, got_labels = exposition[name]
        assert got_kind == kind, (name, got_kind, kind)
        if got_labels:  # a family with samples shows its labels
            assert labels <= got_labels, (name, labels, got_labels)


def test_the_alert_rules_read_only_documented_series() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    used = {
        m for g in groups for r in g["rules"] for m in re.findall(r"\bgpufleet_[a-z_]+", r["expr"])
    } - recorded
    listed = documented()
    for name in sorted(used):
        base = re.sub(r"_(total|sum|count|bucket)$", "", name)
        assert base in listed or name in listed, (
            f"{name}: read by the alert rules, not in docs/contracts.md section 4"
        )
