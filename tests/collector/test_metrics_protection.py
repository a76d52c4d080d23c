"""``/metrics`` protection (issue 11, seen 12: the collector's /metrics needed no token and listed node
names, run ids and incident evidence): an optional bearer token and client-certificate names on the
collector, a token and mTLS on the agent, and ``metrics.redact`` leaving run ids and evidence out."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.metrics import AgentMetrics
from gpufleet.collector.app import create_app
from gpufleet.collector.tls import protocol_class
from gpufleet.config import ConfigError, Settings, load_settings
from gpufleet.metricsauth import MetricsAuthError, MetricsGuard
from gpufleet.serverthread import free_port, serve
from testsupport.certs import Pair, TestCA

TOKEN = "scrape-token-0123456789abcdef"


@pytest.fixture
def incidents(db: str) -> str:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("INSERT INTO nodes (node, last_seen) VALUES ('node-a', now())")
        c.execute("""INSERT INTO incidents (kind, scope_key, run_id, node, gpu, cause, severity, start, last_seen,
                                            evidence)
                     VALUES ('starvation', 's:secret-run-1', 'secret-run-1', NULL, NULL, 'io', 'warning', now(),
                             now(), '{"run_time_lost_share": 0.4}'),
                            ('starvation', 's:secret-run-2', 'secret-run-2', NULL, NULL, 'io', 'warning', now(),
                             now(), '{"run_time_lost_share": 0.2}'),
                            ('checkpoint_stall', 'c:secret-run-1', 'secret-run-1', NULL, NULL, NULL, 'warning',
                             now(), now(), '{"run_time_lost_share": 0.3}')""")
    return db


def _with(settings: Settings, **metrics: object) -> Settings:
    return settings.model_copy(update={"metrics": settings.metrics.model_copy(update=metrics)})


def _families(text: str) -> dict[str, list[dict[str, str]]]:
    return {f.name: [s.labels for s in f.samples] for f in text_string_to_metric_families(text)}


def test_default_metrics_stay_open_and_complete(incidents: str, settings: Settings) -> None:
    with serve(create_app(incidents, settings, run_leader=False)) as srv:
        r = httpx.get(srv.url + "/metrics", timeout=10)
    assert r.status_code == 200
    fams = _families(r.text)
    assert {s["run_id"] for s in fams["gpufleet_incident_open"]} == {"secret-run-1", "secret-run-2"}
    assert fams["gpufleet_incident_evidence"]


@pytest.mark.parametrize("how", ["token", "token_file"])
def test_collector_metrics_token(incidents: str, settings: Settings, tmp_path: Path, how: str) -> None:
    if how == "token":
        s = _with(settings, token=TOKEN)
    else:
        (tmp_path / "tok").write_text(TOKEN + "\n")
        s = _with(settings, token_file=tmp_path / "tok")
    with serve(create_app(incidents, s, run_leader=False)) as srv:
        url = srv.url + "/metrics"
        none = httpx.get(url, timeout=10)
        wrong = httpx.get(url, headers={"Authorization": "Bearer " + TOKEN[:-1] + "X"}, timeout=10)
        basic = httpx.get(url, headers={"Authorization": "Basic " + TOKEN}, timeout=10)
        right = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        health = httpx.get(srv.url + "/healthz", timeout=10)
    for r in (none, wrong, basic):
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "secret-run" not in r.text and "node-a" not in r.text
    assert right.status_code == 200 and "secret-run-1" in right.text
    assert health.status_code == 200  # probes stay open


def test_redact_leaves_run_ids_and_evidence_out(incidents: str, settings: Settings) -> None:
    with serve(create_app(incidents, _with(settings, redact=True), run_leader=False)) as srv:
        r = httpx.get(srv.url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert "secret-run" not in r.text
    assert "run_time_lost_share" not in r.text
    # No series carries an evidence value, as its value or in a label (the process's own
    # families, CPU seconds and the like, may hold any digits).
    for fam in text_string_to_metric_families(r.text):
        for smp in fam.samples:
            assert not any("0.4" in v for v in smp.labels.values()), smp
            assert not (fam.name.startswith("gpufleet_") and smp.value in (0.2, 0.3, 0.4)), smp
    fams = _families(r.text)
    assert "gpufleet_incident_evidence" not in fams
    # the two starvation incidents now share their labels: one series, value 1 (alert rules compare == 1)
    open_series = sorted((s["kind"], s["run_id"]) for s in fams["gpufleet_incident_open"])
    assert open_series == [("checkpoint_stall", ""), ("starvation", "")]
    assert [s["node"] for s in fams["gpufleet_node_last_seen_timestamp_seconds"]] == ["node-a"]


def test_bad_token_settings_fail_at_start(db: str, settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(MetricsAuthError, match="cannot read token file"):
        create_app(db, _with(settings, token_file=tmp_path / "missing"), run_leader=False)
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(MetricsAuthError, match="at least 16"):
        create_app(db, _with(settings, token_file=tmp_path / "short"), run_leader=False)
    with pytest.raises(ConfigError, match=r"metrics\.token"):
        load_settings(metrics={"token": "short"})
    with pytest.raises(ConfigError, match="client_ca"):
        load_settings(metrics={"client_names": ["prometheus"]})


# ------------------------------------------------------------------ mTLS


@pytest.fixture
def pki(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki")


def _client(ca: TestCA, pair: Pair | None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(ca.pem))
    if pair is not None:
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
    return httpx.Client(verify=ctx, timeout=10)


def test_collector_metrics_client_certificate_names(incidents: str, settings: Settings, pki: TestCA) -> None:
    server = pki.server()
    s = settings.model_copy(
        update={
            "tls": settings.tls.model_copy(
                update={
                    "certfile": server.cert,
                    "keyfile": server.key,
                    "client_ca": pki.pem,
                    "client_cert": "optional",
                }
            ),
            "metrics": settings.metrics.model_copy(update={"client_names": ["prometheus"], "token": TOKEN}),
        }
    )
    app = create_app(incidents, s, run_leader=False)
    with serve(
        app,
        ssl_certfile=str(server.cert),
        ssl_keyfile=str(server.key),
        ssl_ca_certs=str(pki.pem),
        ssl_cert_reqs=ssl.CERT_OPTIONAL,
        http=protocol_class(),
    ) as srv:
        url = srv.url + "/metrics"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with _client(pki, pki.client("prometheus")) as c:
            ok = c.get(url, headers=auth)
            no_token = c.get(url)
        with _client(pki, pki.client("node-a")) as c:
            other = c.get(url, headers=auth)
        with _client(pki, None) as c:
            bare = c.get(url, headers=auth)
            health = c.get(srv.url + "/healthz")
    assert ok.status_code == 200 and "secret-run-1" in ok.text
    assert no_token.status_code == 401
    assert other.status_code == 403 and bare.status_code == 403
    assert health.status_code == 200


# ------------------------------------------------------------------ the agent


@pytest.fixture
def agent_metrics() -> Iterator[AgentMetrics]:
    m = AgentMetrics()
    m.samples_spooled.inc(7)
    yield m
    m.close()


def test_agent_metrics_token(agent_metrics: AgentMetrics) -> None:
    port = agent_metrics.serve(free_port(), "127.0.0.1", MetricsGuard(TOKEN))
    url = f"http://127.0.0.1:{port}/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    assert (
        httpx.get(url, headers={"Authorization": "Bearer nope-nope-nope-nope"}, timeout=10).status_code == 401
    )
    r = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200 and "gpufleet_agent_samples_spooled_total 7.0" in r.text


def test_agent_metrics_open_by_default(agent_metrics: AgentMetrics) -> None:
    port = agent_metrics.serve(free_port(), "127.0.0.1")
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200


def test_agent_metrics_mtls(agent_metrics: AgentMetrics, pki: TestCA, tmp_path: Path) -> None:
    server = pki.server()
    port = agent_metrics.serve(
        free_port(),
        "127.0.0.1",
        MetricsGuard(TOKEN),
        certfile=server.cert,
        keyfile=server.key,
        client_ca=pki.pem,
    )
    url = f"https://127.0.0.1:{port}/metrics"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _client(pki, pki.client("prometheus")) as c:
        assert c.get(url, headers=auth).status_code == 200
        assert c.get(url).status_code == 401
    with _client(pki, None) as c, pytest.raises(httpx.HTTPError):
        c.get(url, headers=auth)
    stranger = TestCA(tmp_path / "other", "other CA").client("prometheus")
    with _client(pki, stranger) as c, pytest.raises(httpx.HTTPError):
        c.get(url, headers=auth)
    with _client(pki, pki.client("prometheus")) as c:  # refused handshakes did not stop the listener
        assert c.get(url, headers=auth).status_code == 200


#: Series of the replica itself (none of the fleet's, which are read from the database).
OWN = "gpufleet_ingest_requests"
#: The fleet's series (docs/contracts.md, section 4): the open incidents and nodes, and the per-run
#: figures of the stored snapshot (``run_metrics``, on by default); counters without ``_total``, as
#: the parser names their families.
FLEET = {
    "gpufleet_incident",
    "gpufleet_incident_info",
    "gpufleet_incident_open",
    "gpufleet_incident_evidence",
    "gpufleet_incident_run",
    "gpufleet_incident_quarantine",
    "gpufleet_incident_run_action",
    "gpufleet_incidents_fresh",
    "gpufleet_node_last_seen_timestamp_seconds",
    "gpufleet_node_rejected_skew_samples",
    "gpufleet_run_energy_kwh",
    "gpufleet_run_cost",
    "gpufleet_run_co2e_kg",
    "gpufleet_run_gpu_seconds",
    "gpufleet_run_goodput",
    "gpufleet_run_metrics_runs",
    "gpufleet_run_metrics_omitted_runs",
    "gpufleet_run_metrics_age_seconds",
}


def test_the_fleets_series_are_served_alone_on_their_own_path(incidents: str, settings: Settings) -> None:
    """Every replica reads the same fleet series from the database: a large fleet scrapes them once,
    on ``/metrics/fleet`` through the balancer, and leaves them off each replica's ``/metrics``."""
    pages = {}
    for on in (True, False):
        with serve(create_app(incidents, _with(settings, fleet_on_metrics=on), run_leader=False)) as srv:
            pages[on] = (
                httpx.get(srv.url + "/metrics", timeout=10),
                httpx.get(srv.url + "/metrics/fleet", timeout=10),
            )
    for on, (own, fleet) in pages.items():
        assert own.status_code == fleet.status_code == 200
        assert (
            own.headers["content-type"].startswith("text/plain")
            and fleet.headers["content-type"] == own.headers["content-type"]
        )
        own_fams, fleet_fams = _families(own.text), _families(fleet.text)
        assert set(fleet_fams) == FLEET, on
        assert {s["node"] for s in fleet_fams["gpufleet_node_last_seen_timestamp_seconds"]} == {"node-a"}
        assert {s["run_id"] for s in fleet_fams["gpufleet_incident_open"]} == {"secret-run-1", "secret-run-2"}
        assert OWN in own_fams and OWN not in fleet_fams
        assert (set(own_fams) >= FLEET) if on else not (FLEET & set(own_fams)), on


def test_the_fleet_path_is_guarded_and_redacted_as_metrics_is(incidents: str, settings: Settings) -> None:
    with serve(create_app(incidents, _with(settings, token=TOKEN, redact=True), run_leader=False)) as srv:
        none = httpx.get(srv.url + "/metrics/fleet", timeout=10)
        right = httpx.get(
            srv.url + "/metrics/fleet", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
    assert none.status_code == 401 and "node-a" not in none.text
    assert right.status_code == 200 and "node-a" in right.text
    assert "secret-run" not in right.text and "gpufleet_incident_evidence" not in _families(right.text)


def test_the_fleet_path_reads_the_database_on_every_scrape(incidents: str, settings: Settings) -> None:
    """Scraped through a balancer, successive scrapes land on any replica: a read cached by one
    replica must never follow a newer one from another, or a counter would seem to go back."""

    def skew(text: str) -> float:
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        return fams["gpufleet_node_rejected_skew_samples"].samples[0].value

    with serve(create_app(incidents, settings, run_leader=False)) as srv:
        before = httpx.get(srv.url + "/metrics/fleet", timeout=10).text
        cached = httpx.get(srv.url + "/metrics", timeout=10).text
        with psycopg.connect(incidents, autocommit=True) as c:
            c.execute("UPDATE nodes SET rejected_skew = rejected_skew + 7 WHERE node = 'node-a'")
        after = httpx.get(srv.url + "/metrics/fleet", timeout=10).text
        still_cached = httpx.get(srv.url + "/metrics", timeout=10).text
    assert skew(after) == skew(before) + 7
    assert skew(still_cached) == skew(cached)  # /metrics keeps its 5-s cache, as before
