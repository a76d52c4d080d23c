"""Prometheus configuration and alert rules: promtool checks and unit tests, and a real
Prometheus scraping a real collector and agent on loopback and evaluating the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.metrics import AgentMetrics
from gpufleet.collector.alerting import IncidentMetrics, listed_gpus
from gpufleet.collector.app import create_app as create_collector
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.config import Settings
from gpufleet.serverthread import free_port, serve
from tests.surfaces.fleetdb import FilledFleet
from tests.system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "gpufleet.rules.yml"
RULE_TESTS = PROM / "tests" / "gpufleet.rules.test.yml"

#: PromQL words that look like metric names in an expression.
PROMQL_WORDS = frozenset(
    {
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "rate",
        "increase",
        "irate",
        "time",
        "clamp_min",
        "clamp_max",
        "abs",
        "absent",
        "bool",
        "offset",
        "histogram_quantile",
        "label_replace",
        "vector",
        "scalar",
        "topk",
        "bottomk",
        "delta",
        "deriv",
        "min_over_time",
        "max_over_time",
    }
)


def _tool(name: str) -> str:
    return tool(name, "prometheus-alertmanager" if name == "amtool" else "prometheus")


def _run(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_accepts_config_and_rules() -> None:
    promtool = _tool("promtool")
    r = _run(promtool, "check", "config", "prometheus.yml")
    assert r.returncode == 0 and "FAILED" not in r.stdout + r.stderr, r.stdout + r.stderr
    r = _run(promtool, "check", "rules", str(RULES))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_alertmanager_config_is_valid() -> None:
    amtool = _tool("amtool")
    r = _run(amtool, "check-config", "alertmanager.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_rule_unit_tests_pass() -> None:
    r = _run(_tool("promtool"), "test", "rules", str(RULE_TESTS))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "(gpufleet_node_last_seen_timestamp_seconds)) > 120",
            "(gpufleet_node_last_seen_timestamp_seconds)) > 600",
        ),
        # no de-duplication across replicas: two alerts per incident
        ("max by (incident_id, kind, run_id, run_team, node, gpu) (gpufleet_incident)", "gpufleet_incident"),
        # no hysteresis: a critical incident that falls back reads warning at once
        (
            "max_over_time(min_over_time(gpufleet:incident_severity:max[2m])[10m:])",
            "gpufleet:incident_severity:max",
        ),
        # escalation without hold: a severity flipping every minute reads critical
        (
            "min_over_time(gpufleet:incident_severity:max[2m])",
            "max_over_time(gpufleet:incident_severity:max[2m])",
        ),
        # severity in the alert's identity: each flip would start a new alert
        (
            'expr: gpufleet:incident_severity:held{kind="starvation"}',
            'expr: gpufleet:incident_severity:held{kind="starvation"} * on (incident_id) group_left (severity) '
            "max by (incident_id, severity) (gpufleet_incident_info)",
        ),
        # the run's team left out
        (
            'team: "{{ if $labels.run_team }}{{ $labels.run_team }}{{ else }}ml-platform{{ end }}"\n        annotations:\n'
            '          severity: "{{ if ge $value 2.0 }}critical{{ else }}warning{{ end }}"\n          summary: "{{ $cause := '
            '\\"\\" }}{{ with printf \\"gpufleet_incident_info{incident_id=%q}\\" $labels.incident_id | query }}{{ with '
            "first . }}{{ $cause = .Labels.cause }}{{ end }}{{ end }}Run {{ $labels.run_id }} is starved",
            "team: ml-platform\n        annotations:\n"
            '          severity: "{{ if ge $value 2.0 }}critical{{ else }}warning{{ end }}"\n          summary: "{{ $cause := '
            '\\"\\" }}{{ with printf \\"gpufleet_incident_info{incident_id=%q}\\" $labels.incident_id | query }}{{ with '
            "first . }}{{ $cause = .Labels.cause }}{{ end }}{{ end }}Run {{ $labels.run_id }} is starved",
        ),
        (
            'gpufleet:incident_severity:held{kind="nvlink_degraded"}',
            'gpufleet:incident_severity:held{kind="nvlink"}',
        ),
        (
            'expr: gpufleet:incident_severity:held{kind="gpu_health"}\n        for: 0s',
            'expr: gpufleet:incident_severity:held{kind="gpu_health"}\n        for: 5m',
        ),
        ('runbook_url: "{{ $externalLabels.gpufleet_web }}/runbooks#checkpoint_stall"', 'runbook_url: ""'),
        ('(gpufleet_incident_quarantine{result="failed"})', '(gpufleet_incident_quarantine{result="error"})'),
    ],
)
def test_rule_unit_tests_catch_a_broken_rule(tmp_path: Path, old: str, new: str) -> None:
    text = RULES.read_text()
    assert old in text
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    r = _run(_tool("promtool"), "test", "rules", str(tmp_path / "tests" / RULE_TESTS.name), cwd=tmp_path)
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr


def test_every_incident_kind_raises_an_alert() -> None:
    """Each detector's kind is matched by an alert rule on the per-incident series, which raises every
    incident the detector opens (its thresholds are the alert's: no second threshold on the evidence), with a
    runbook and the incident's page."""
    from gpufleet.collector.detectors.registry import DETECTORS

    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    for kind in DETECTORS:
        rules = [r for r in alerts if f'kind="{kind}"' in r["expr"]]
        (rule,) = rules
        assert rule["expr"] == f'gpufleet:incident_severity:held{{kind="{kind}"}}', rule["expr"]
        assert "severity" not in rule.get("labels", {}), kind  # outside the alert's identity
        assert {"severity", "summary", "runbook_url", "incident", "gpus"} <= set(rule["annotations"]), kind


def test_collector_exports_quarantine_actions_and_health_evidence(db: str) -> None:
    from gpufleet.collector.alerting import IncidentMetrics

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, node, gpu, cause, severity, start, last_seen, evidence, actions) "
            "VALUES ('gpu_health', 'k1', 'n8', 1, 'uncorrectable_ecc', 'critical', now(), now(), "
            '\'{"sbe_per_h": 120.5}\', \'[{"action": "slurm_drain", "result": "failed", '
            '"time": "2026-01-01T00:00:00Z"}, {"action": "slurm_drain", "result": "done", '
            '"time": "2026-01-01T00:05:00Z"}]\')'
        )
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(IncidentMetrics(db, cache_s=0))
    text = generate_latest(reg).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (q,) = fams["gpufleet_incident_quarantine"].samples
    assert q.labels == {
        "kind": "gpu_health",
        "node": "n8",
        "action": "slurm_drain",
        "result": "done",
    }  # the latest
    ev = {s.labels["field"]: s.value for s in fams["gpufleet_incident_evidence"].samples}
    assert ev == {"sbe_per_h": 120.5}


def test_a_throttle_listing_gpus_is_a_series_per_gpu(db: str) -> None:
    """One incident for a run's GPUs throttled for one reason still raises GpufleetGpuThrottled per GPU."""
    from prometheus_client import CollectorRegistry

    from gpufleet.collector.alerting import IncidentMetrics, to_alert

    ev = {
        "throttled_share": 0.9,
        "gpus": [
            {"node": "n1", "gpu": 0, "throttled_share": 1.0},
            {"node": "n1", "gpu": 3, "throttled_share": 0.8},
        ],
    }
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, run_id, node, gpu, cause, severity, start, last_seen, evidence) "
            "VALUES ('throttling', 'throttling|run|r1|thermal', 'r1', 'n1', NULL, 'thermal', 'warning', now(), now(), "
            "%s)",
            (json.dumps(ev),),
        )
        row = conn.execute(
            "SELECT id, kind, run_id, node, gpu, cause, severity, start, evidence FROM incidents"
        ).fetchone()
    reg = CollectorRegistry()
    reg.register(IncidentMetrics(db, cache_s=0))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    opened = sorted(
        (s.labels["node"], s.labels["gpu"], s.labels["cause"]) for s in fams["gpufleet_incident_open"].samples
    )
    assert opened == [("n1", "0", "thermal"), ("n1", "3", "thermal")]
    shares = {
        s.labels["gpu"]: s.value
        for s in fams["gpufleet_incident_evidence"].samples
        if s.labels["field"] == "throttled_share"
    }
    assert shares == {"0": 1.0, "3": 0.8}  # each GPU's own
    assert row is not None
    alert = to_alert(
        dict(
            zip(
                ("id", "kind", "run_id", "node", "gpu", "cause", "severity", "start", "evidence"),
                row,
                strict=True,
            )
        )
    )
    assert alert["annotations"]["gpus"] == "n1/0, n1/3" and "gpu" not in alert["labels"]


def _exported_names(fleet_url: str) -> set[str]:
    """Sample names the collector (with its incident metrics) and the agent can export."""
    names = {"up"}
    registries = []
    cm = CollectorMetrics()
    cm.registry.register(IncidentMetrics(fleet_url, cache_s=0))
    registries.append(cm.registry)
    registries.append(AgentMetrics().registry)
    for reg in registries:
        for fam in reg.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(
                fam.type, ("",)
            )
            names.update(fam.name + s for s in suffixes)
    return names


def _rule_metric_names() -> set[str]:
    """Series the rules read, other than those they record themselves."""
    out: set[str] = set()
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    for group in groups:
        for rule in group["rules"]:
            expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # drop label values
            expr = re.sub(r"\{[^}]*\}", "{}", expr)  # and matchers
            expr = re.sub(r"\[[^\]]*\]", "[]", expr)  # and ranges
            expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # and grouping labels
            out.update(w for w in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", expr) if w not in PROMQL_WORDS)
    return out - recorded


def test_rules_only_use_metrics_that_exist(fleet: FilledFleet) -> None:
    used = _rule_metric_names()
    assert {
        "gpufleet_incident",
        "gpufleet_node_last_seen_timestamp_seconds",
        "gpufleet_database_up",
        "gpufleet_ingest_errors_total",
    } <= used
    assert used - _exported_names(fleet.url) == set()


def test_collector_exposition_parses(fleet: FilledFleet) -> None:
    cm = CollectorMetrics()
    cm.registry.register(IncidentMetrics(fleet.url, cache_s=0))
    text = generate_latest(cm.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert len(families["gpufleet_incident_open"].samples) > 0
    evidence = {
        (s.labels["run_id"], s.labels["field"]): s.value
        for s in families["gpufleet_incident_evidence"].samples
    }
    assert 0 < evidence[("demo-pretrain", "run_time_lost_share")] < 1
    assert {s.labels["node"] for s in families["gpufleet_node_last_seen_timestamp_seconds"].samples} == set(
        fleet.nodes
    )
    r = subprocess.run(
        [_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "error" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


# ---------------------------------------------------------------- a real Prometheus


@pytest.fixture
def prometheus_stack(fleet: FilledFleet, settings: Settings, tmp_path: Path) -> Iterator[dict[str, Any]]:
    prometheus = _tool("prometheus")
    agent = AgentMetrics()
    agent_port = agent.serve(free_port(), host="127.0.0.1")
    agent.samples_spooled.inc(100)
    with serve(create_collector(fleet.url, settings, run_leader=False)) as collector:
        cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
        cfg["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
        cfg["rule_files"] = [str(RULES)]
        cfg.pop("alerting")
        (tmp_path / "agents").mkdir()
        (tmp_path / "agents" / "nodes.yml").write_text(
            yaml.safe_dump([{"targets": [f"127.0.0.1:{agent_port}"]}])
        )
        port = free_port()
        for job in cfg["scrape_configs"]:
            if job["job_name"] == "gpufleet-collector":
                job["static_configs"] = [{"targets": [collector.url.removeprefix("http://")]}]
            elif job["job_name"] == "gpufleet-agent":
                job["file_sd_configs"][0]["files"] = [str(tmp_path / "agents" / "*.yml")]
            elif job["job_name"] == "prometheus":
                job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )
        try:
            yield {"url": f"http://127.0.0.1:{port}", "log": tmp_path / "prometheus.log"}
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            agent.close()


def _until(fn: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except (
            httpx.HTTPError,
            ValueError,
        ) as e:  # not listening yet, or "Service Unavailable" while starting
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


@pytest.mark.timeout(120)
def test_real_prometheus_scrapes_collector_and_agent_and_evaluates_the_rules(
    prometheus_stack: dict[str, Any], fleet: FilledFleet
) -> None:
    api = httpx.Client(base_url=prometheus_stack["url"], timeout=10)

    def query(q: str) -> list[dict[str, Any]]:
        body = api.get("/api/v1/query", params={"query": q}).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def targets_up() -> list[dict[str, Any]] | None:
        active = api.get("/api/v1/targets").json()["data"]["activeTargets"]
        jobs = {t["labels"]["job"]: t["health"] for t in active}
        return (
            active
            if jobs == {"gpufleet-collector": "up", "gpufleet-agent": "up", "prometheus": "up"}
            else None
        )

    _until(lambda: api.get("/-/ready").status_code == 200, 30, "Prometheus ready")
    active = _until(targets_up, 40, "all three targets up")
    agent_target = next(t for t in active if t["labels"]["job"] == "gpufleet-agent")
    assert agent_target["labels"]["node"] == "127.0.0.1"  # relabelled from the address

    with psycopg.connect(fleet.url) as conn:
        # one series per GPU an open incident is about (a run's throttle incident lists its GPUs)
        open_n = sum(
            len(listed_gpus(n, g, ev))
            for n, g, ev in conn.execute(
                "SELECT node, gpu, evidence FROM incidents WHERE state = 'open'"
            ).fetchall()
        )
        starved = {
            r[0]
            for r in conn.execute(
                "SELECT run_id FROM incidents WHERE state = 'open' AND kind = 'starvation'"
            ).fetchall()
        }
    assert (
        int(_until(lambda: query("count(gpufleet_incident_open)"), 20, "incident series")[0]["value"][1])
        == open_n
    )
    assert query("gpufleet_agent_samples_spooled_total")[0]["value"][1] == "100"

    def rules_evaluated() -> list[dict[str, Any]] | None:
        groups = api.get("/api/v1/rules").json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r["lastEvaluation"] > "2000" for r in rules) else None

    rules = _until(rules_evaluated, 30, "every rule evaluated")
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []

    def starved_alerts() -> set[str] | None:
        got = {a["metric"]["run_id"] for a in query('ALERTS{alertname="GpufleetStarvedJob"}')}
        return got if got == starved else None

    assert _until(starved_alerts, 20, "starvation alerts pending")

    # one alert per open incident, whatever number of GPUs it lists, each saying its severity, its GPUs,
    # its page and its runbook
    with psycopg.connect(fleet.url) as conn:
        incidents = {
            str(i): k for i, k in conn.execute("SELECT id, kind FROM incidents WHERE state = 'open'")
        }

    def incident_alerts() -> list[dict[str, Any]] | None:
        alerts = [
            a for a in api.get("/api/v1/alerts").json()["data"]["alerts"] if "incident_id" in a["labels"]
        ]
        return alerts if {a["labels"]["incident_id"] for a in alerts} == set(incidents) else None

    alerts = _until(incident_alerts, 30, "an alert for every open incident")
    assert sorted(a["labels"]["incident_id"] for a in alerts) == sorted(incidents)  # one each
    for a in alerts:
        iid = a["labels"]["incident_id"]
        assert a["labels"]["kind"] == incidents[iid] and "severity" not in a["labels"]
        ann = a["annotations"]
        assert ann["severity"] in ("warning", "critical") and ann["incident"].endswith(f"/incidents/{iid}"), a
        assert "/runbooks#" in ann["runbook_url"] and "error expanding" not in " ".join(ann.values()), a
    throttled = [
        a for a in alerts if a["labels"]["kind"] == "throttling" and a["labels"]["run_id"] == "demo-hot"
    ]
    assert len(throttled) == 1 and len(throttled[0]["annotations"]["gpus"].split(",")) == 8
    assert {a["labels"]["team"] for a in alerts if a["labels"]["kind"] == "starvation"} == {
        "vision",
        "speech",
    }
    assert "error" not in prometheus_stack["log"].read_text().lower().replace("err=null", "")
