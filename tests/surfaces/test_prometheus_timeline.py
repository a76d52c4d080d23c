"""Prometheus's own rule engine over 20 minutes of the demo: one alert per incident, and none that flaps.

The simulated fleet runs the demo scenario through the real ingest and the live sweep's detectors; after
every sweep (15 s of simulated time) the collector's incident series are read as a scrape would read them.
That timeline becomes the input of ``promtool test rules`` (Prometheus's rule evaluation, Debian package
``prometheus``), evaluated every 15 s with the shipped rules' expressions, ``for:`` and labels (their
annotations, which need a live server's queries and external labels, are left out here and checked against
a real server in test_prometheus.py).  At every minute, for every incident rule, the firing alerts must be
exactly one per incident open at least the rule's ``for:`` -- whatever its severity did meanwhile -- and
none for any other: an alert that restarted, doubled or went missing for a minute fails the run.  Bounded:
about a minute of wall time.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpufleet.collector.alerting import IncidentMetrics
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from tests.surfaces.fleetdb import fill
from tests.system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "gpufleet.rules.yml"
SECONDS = 1200.0
STEP = 15.0
#: Prometheus's lookback: a series that stopped is still read for this long.
LOOKBACK = 300.0
#: Eval times this close to an alert's start or end are not asserted (the exact evaluation is not the point).
MARGIN = 31.0

Series = dict[tuple[tuple[str, str], ...], dict[float, float]]


@pytest.fixture(scope="module")
def timeline(pg_server: str, settings: Settings) -> Iterator[tuple[float, Series]]:
    """(start, {labels: {seconds since start: value}}) of ``gpufleet_incident`` after each sweep."""
    series: Series = {}
    with scratch_database(pg_server, "gpufleet_timeline") as url:
        migrate.upgrade(url, settings)
        start = math.floor((time.time() - SECONDS) / 60.0) * 60.0

        def scrape(t: float) -> None:
            reg = CollectorRegistry()
            reg.register(IncidentMetrics(url, cache_s=0))
            for fam in reg.collect():
                if fam.name == "gpufleet_incident":
                    for s in fam.samples:
                        series.setdefault(tuple(sorted(s.labels.items())), {})[round(t - start)] = s.value

        fill(url, settings, "demo", SECONDS, start_time=start, after_sweep=scrape)
        yield start, series


def _rules_without_annotations(tmp: Path) -> tuple[Path, dict[str, tuple[str, float]]]:
    """The shipped rules less their annotations; and each incident alert's kind and ``for:`` (seconds)."""
    doc = yaml.safe_load(RULES.read_text())
    alerts: dict[str, tuple[str, float]] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            m = re.fullmatch(
                r'gpufleet:incident_severity:held\{kind="([a-z_]+)"\}', str(rule.get("expr", ""))
            )
            if "alert" in rule and m:
                f = str(rule.get("for", "0s"))
                alerts[rule["alert"]] = (m.group(1), float(f[:-1]) * {"s": 1, "m": 60, "h": 3600}[f[-1]])
    path = tmp / "rules.yml"
    path.write_text(yaml.safe_dump(doc))
    return path, alerts


def _values(points: dict[float, float], end: float) -> str:
    out = []
    t = 0.0
    while t <= end:
        v = points.get(round(t))
        out.append("_" if v is None else f"{v:g}")
        t += STEP
    return " ".join(out)


def test_one_alert_per_incident_and_none_flaps_over_the_demo(
    timeline: tuple[float, Series], tmp_path: Path
) -> None:
    _, series = timeline
    rules, alerts = _rules_without_annotations(tmp_path)
    assert series, "the demo opened no incident"
    kinds_seen = {dict(k)["kind"] for k in series}
    covered = {kind for kind, _ in alerts.values()}
    assert kinds_seen - {"idle_allocation", "hung_collective"} <= covered
    end = SECONDS + LOOKBACK + 120
    inputs = []
    spans: dict[tuple[tuple[str, str], ...], tuple[float, float]] = {}
    for labels, points in series.items():
        times = sorted(points)
        # an incident's series is there from the sweep that opened it to the last that saw it open, unbroken
        assert times == [times[0] + STEP * i for i in range(len(times))], dict(labels)
        spans[labels] = (times[0], times[-1])
        text = ",".join(f'{k}="{v}"' for k, v in labels)
        inputs.append(
            {"series": f'gpufleet_incident{{instance="c1",{text}}}', "values": _values(points, end)}
        )
        inputs.append(
            {"series": f'gpufleet_incident{{instance="c2",{text}}}', "values": _values(points, end)}
        )
    checks = []
    for alertname, (kind, for_s) in alerts.items():
        mine = {k: v for k, v in spans.items() if dict(k)["kind"] == kind}
        t = 60.0
        while t <= end:
            firing, unsure = [], False
            for labels, (a, b) in mine.items():
                fires_from, fires_until = a + for_s, b + LOOKBACK
                if min(abs(t - fires_from), abs(t - fires_until)) < MARGIN:
                    unsure = True
                    break
                if fires_from <= t < fires_until:
                    lab = {k: v for k, v in labels if v}
                    lab["team"] = (
                        "infra"
                        if kind
                        in ("throttling", "pcie_degraded", "host_misconfig", "nvlink_degraded", "gpu_health")
                        else (lab.get("run_team") or "ml-platform")
                    )
                    firing.append({"exp_labels": lab})
            if not unsure:
                checks.append({"eval_time": f"{int(t)}s", "alertname": alertname, "exp_alerts": firing})
            t += 60.0
    assert sum(1 for c in checks if c["exp_alerts"]) >= 30, "too few minutes with alerts to say anything"
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": f"{int(STEP)}s",
        "tests": [{"interval": f"{int(STEP)}s", "input_series": inputs, "alert_rule_test": checks}],
    }
    path = tmp_path / "timeline.test.yml"
    path.write_text(yaml.safe_dump(test, width=10_000))
    r = subprocess.run(
        [tool("promtool", "prometheus"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0 and "SUCCESS" in r.stdout, (r.stdout + r.stderr)[-4000:]
