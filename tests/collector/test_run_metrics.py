"""gpufleet_run_* on /metrics: the accounting's own figures, bounded, computed by the leader, not per scrape."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.accounting import run_accounting
from gpufleet.collector.app import create_app
from gpufleet.collector.run_metrics import RunMetrics, RunMetricsRefresher, compute, store
from gpufleet.collector.service import server_options
from gpufleet.config import RunMetricsSettings, Settings
from gpufleet.serverthread import serve
from tests.accounting.builders import at, constant_power, drain, gpu_samples, run
from tests.accounting.test_incident_cost import fleet, incident, stall_and_throttle
from tests.system_tools import tool

NOW = at(7200)


@pytest.fixture
def filled(conn: psycopg.Connection) -> psycopg.Connection:
    """Run ``r`` (ended, with a checkpoint stall and throttling), ``live`` (running) and ``old`` (ended
    two days before): the accounting fixture of the incident-cost tests, and two more runs."""
    fleet(conn)
    stall_and_throttle(conn)
    run(conn, "live", 1800, None, {"n1": [4, 5]}, site_name="s1", team="vision")
    run(conn, "old", -3 * 86400, -2 * 86400, {"n1": [6]}, site_name="s1", team="vision")
    gpu_samples(conn, constant_power("n1", [6], 250.0, -3 * 86400, -3 * 86400 + 600))
    conn.execute("UPDATE runs SET team = 'nlp' WHERE run_id = 'r'")
    return conn


def families(collector: RunMetrics) -> tuple[str, dict[str, Any]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in fams[name].samples}


def test_the_series_are_the_accounting_of_running_and_recent_runs(
    filled: psycopg.Connection, db: str
) -> None:
    store(filled, compute(filled, RunMetricsSettings(horizon_s=86400), NOW), NOW)
    text, fams = families(RunMetrics(db, cache_s=0))
    energy = samples(fams, "gpufleet_run_energy_kwh")
    assert {dict(k)["run"] for k in energy} == {"r", "live"}  # "old" ended beyond the horizon
    for run_id, team in (("r", "nlp"), ("live", "vision")):
        body = run_accounting(filled, run_id, now=NOW)
        lv = (("run", run_id), ("site", "s1"), ("team", team))
        assert energy[lv] == pytest.approx(body["facility_kwh"], rel=1e-12)
        assert samples(fams, "gpufleet_run_cost")[tuple(sorted((*lv, ("currency", "USD"))))] == pytest.approx(
            body["total_cost"], rel=1e-12
        )
        assert samples(fams, "gpufleet_run_co2e_kg")[lv] == pytest.approx(body["co2e_kg"], rel=1e-12)
        hours = {
            dict(k)["state"]: v / 3600.0
            for k, v in samples(fams, "gpufleet_run_gpu_seconds").items()
            if dict(k)["run"] == run_id
        }
        ledger = body["ledger"]  # type: ignore[typeddict-item]
        assert hours == pytest.approx({state: line["gpu_hours"] for state, line in ledger.items()}, rel=1e-12)
        assert sum(hours.values()) == pytest.approx(body["gpu_hours"], rel=1e-9)
        assert samples(fams, "gpufleet_run_goodput")[lv] == pytest.approx(
            hours["productive"] / body["gpu_hours"]
        )
    # The stall and the throttling of run r are in their states.
    r_hours = {
        dict(k)["state"]: v / 3600
        for k, v in samples(fams, "gpufleet_run_gpu_seconds").items()
        if dict(k)["run"] == "r"
    }
    assert r_hours["checkpoint"] > 0 and r_hours["throttled"] > 0 and r_hours["productive"] < 4.0
    assert samples(fams, "gpufleet_run_metrics_runs")[()] == 2
    assert samples(fams, "gpufleet_run_metrics_omitted_runs")[()] == 0
    assert fams["gpufleet_run_energy_kwh"].type == "counter" and fams["gpufleet_run_goodput"].type == "gauge"
    r = subprocess.run(
        [tool("promtool", "prometheus"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0 and (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr


def test_cardinality_is_bounded_by_max_runs_newest_first(filled: psycopg.Connection, db: str) -> None:
    store(filled, compute(filled, RunMetricsSettings(horizon_s=86400, max_runs=1), NOW), NOW)
    _, fams = families(RunMetrics(db, cache_s=0))
    assert {dict(k)["run"] for k in samples(fams, "gpufleet_run_energy_kwh")} == {"live"}
    assert samples(fams, "gpufleet_run_metrics_omitted_runs")[()] == 1
    store(filled, compute(filled, RunMetricsSettings(horizon_s=10 * 86400), NOW), NOW)
    _, fams = families(RunMetrics(db, cache_s=0))
    assert {dict(k)["run"] for k in samples(fams, "gpufleet_run_energy_kwh")} == {"r", "live", "old"}


def test_per_gpu_energy_and_incidents_join_dcgm_exporter_by_uuid(filled: psycopg.Connection, db: str) -> None:
    filled.execute("""UPDATE nodes SET facts = '{"gpus": [{"gpu": 0, "uuid": "GPU-aaa"}, {"gpu": 4, "uuid": "GPU-eee"}]}'
                      WHERE node = 'n1'""")
    incident(filled, "pcie_degraded", 100, None, {}, run_id="r", node_name="n1", gpu=4, scope="pcie-4")
    drain(filled)
    store(filled, compute(filled, RunMetricsSettings(horizon_s=86400, per_gpu=True), NOW), NOW)
    text, fams = families(RunMetrics(db, cache_s=0))
    energy = samples(fams, "gpufleet_gpu_run_energy_kwh")
    # 300 W for the hour of run r on each of its GPUs (minute rollups); run "live" holds GPUs 4 and 5.
    assert energy[(("UUID", "GPU-aaa"), ("gpu", "0"), ("node", "n1"), ("run", "r"))] == pytest.approx(
        0.3, rel=0.02
    )
    assert {dict(k)["gpu"] for k in energy if dict(k)["run"] == "live"} == {"4", "5"}
    assert samples(fams, "gpufleet_gpu_incident_open") == {
        (("UUID", "GPU-eee"), ("gpu", "4"), ("kind", "pcie_degraded"), ("node", "n1")): 1.0
    }
    # Only the running run holds GPUs now.
    assert samples(fams, "gpufleet_gpu_run_info") == {
        (("UUID", "GPU-eee"), ("gpu", "4"), ("node", "n1"), ("run", "live"), ("team", "vision")): 1.0,
        (("UUID", ""), ("gpu", "5"), ("node", "n1"), ("run", "live"), ("team", "vision")): 1.0,
    }
    r = subprocess.run(
        [tool("promtool", "prometheus"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0 and (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr


def test_redacted_the_figures_are_per_team_and_site(filled: psycopg.Connection, db: str) -> None:
    store(filled, compute(filled, RunMetricsSettings(horizon_s=10 * 86400), NOW), NOW)
    _, plain = families(RunMetrics(db, cache_s=0))
    _, redacted = families(RunMetrics(db, cache_s=0, redact=True))
    energy = samples(redacted, "gpufleet_run_energy_kwh")
    assert set(energy) == {
        (("run", ""), ("site", "s1"), ("team", "nlp")),
        (("run", ""), ("site", "s1"), ("team", "vision")),
    }
    vision = sum(
        v for k, v in samples(plain, "gpufleet_run_energy_kwh").items() if dict(k)["team"] == "vision"
    )
    assert energy[(("run", ""), ("site", "s1"), ("team", "vision"))] == pytest.approx(vision)


@pytest.fixture
def collector(db: str, settings: Settings) -> Iterator[str]:
    with serve(create_app(db, settings, run_leader=False), **server_options(settings)) as srv:
        yield srv.url


def test_scrapes_serve_the_stored_snapshot_and_never_compute(
    filled: psycopg.Connection, collector: str
) -> None:
    page = httpx.get(f"{collector}/metrics", timeout=10).text
    assert "gpufleet_run_metrics_runs 0.0" in page and "gpufleet_run_energy_kwh_total{" not in page
    store(filled, compute(filled, RunMetricsSettings(horizon_s=86400), NOW), NOW)
    filled.execute("INSERT INTO runs (run_id, start) VALUES ('new', %s)", (at(5000),))
    time.sleep(5.2)  # past the cache of /metrics
    for path in ("/metrics", "/metrics/fleet"):
        page = httpx.get(f"{collector}{path}", timeout=10).text
        assert 'gpufleet_run_energy_kwh_total{run="r",site="s1",team="nlp"}' in page, path
        assert 'run="new"' not in page  # the scrape read the snapshot; it did not account
    assert filled.execute("SELECT count(*) FROM run_metrics_snapshot").fetchone() == (1,)


def test_only_the_leader_refreshes_at_its_interval(filled: psycopg.Connection, db: str) -> None:
    leading = {"now": False}
    ref = RunMetricsRefresher(
        db, RunMetricsSettings(refresh_s=5, horizon_s=86400), lambda: leading["now"], clock=lambda: NOW
    )
    ref.start()
    try:
        time.sleep(2.5)
        assert ref.refreshed == 0
        leading["now"] = True
        deadline = time.monotonic() + 10
        while ref.refreshed == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ref.refreshed == 1
        time.sleep(2.0)
        assert ref.refreshed == 1  # not again before refresh_s
    finally:
        ref.stop()
    row = filled.execute(
        "SELECT computed_at, jsonb_array_length(body->'runs') FROM run_metrics_snapshot"
    ).fetchone()
    assert row == (NOW, 2)
