"""Scenarios 10 and 11: nobody writes or reads what is not theirs.

Routes are enumerated from the running apps (collector and API), so a route
added later is covered without touching this file; the few that are public
by design are listed here, each with its reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet import auth
from gpufleet.api.app import create_app as create_api
from gpufleet.collector.app import create_app as create_collector
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from tests.reliability.conftest import gpu_batch, node_tokens, post, role_token

#: Public by design: liveness/readiness probes, Prometheus scrapes (open unless ``metrics``
#: sets a token or client names: tests/collector/test_metrics_protection.py), the API's
#: self-description, the sign-in form and static assets of the web view, and the runbooks
#: every alert's ``runbook_url`` points at: static help text a pager opens before anyone signs
#: in, holding no fleet data (gpufleet/api/web/runbooks.py).
PUBLIC = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/metrics/fleet",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/docs/assets/{name}",
    "/redoc",
    "/login",
    "/logout",
    "/static/web.css",
    "/static/favicon.svg",
    "/favicon.ico",
    "/runbooks",
}
#: Browser pages: without any credentials they send the browser to the sign-in form.
WEB_PAGES = {
    "/",
    "/runs",
    "/runs/{run_id}",
    "/incidents",
    "/incidents/{incident_id}",
    "/accounting",
    "/nodes/{node}",
    "/finance",
    "/finance/report.csv",
    "/finance/report.json",
    "/waste",
}


def routes(app: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path) of every route, through included routers."""
    for r in getattr(app, "routes", []):
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from routes(inner, prefix + r.include_context.prefix)
            continue
        for m in sorted(set(getattr(r, "methods", None) or ()) - {"HEAD"}):
            yield m, prefix + r.path


@dataclass
class Apps:
    col: str
    api: str
    col_routes: list[tuple[str, str]]
    api_routes: list[tuple[str, str]]
    db: str


@pytest.fixture
def apps(fresh_db: str, settings: Settings) -> Iterator[Apps]:
    col_app = create_collector(fresh_db, settings, run_leader=False)
    api_app = create_api(fresh_db, settings)
    with serve(col_app) as col, serve(api_app) as api:
        yield Apps(col.url, api.url, sorted(set(routes(col_app.app))), sorted(set(routes(api_app))), fresh_db)


def _fill(path: str) -> str:
    return path.replace("{", "").replace("}", "")


def _request(
    base: str, method: str, path: str, auth_header: str | None, cookie: str | None = None
) -> httpx.Response:
    headers = {"Authorization": auth_header} if auth_header is not None else {}
    cookies = {"gpufleet_token": cookie} if cookie else None
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None
    return httpx.request(
        method,
        base + _fill(path),
        headers={**headers, "Content-Type": "application/json"},
        content=body,
        cookies=cookies,
        timeout=10,
        follow_redirects=False,
    )


def _revoked(db: str, role: str, node: str | None, use: Any) -> str:
    """A token that worked once (so it is cached) and was then revoked."""
    with psycopg.connect(db, autocommit=True) as c:
        secret = auth.create_token(c, f"revoked-{role}", role, node)  # type: ignore[arg-type]
    use(secret)
    with psycopg.connect(db, autocommit=True) as c:
        assert auth.revoke_token(c, f"revoked-{role}")
    time.sleep(2.5)  # the apps re-check the token table every 2 s
    return secret


def test_every_route_refuses_missing_garbled_and_revoked_tokens(apps: Apps, figures: dict[str, Any]) -> None:
    node_secret = _revoked(apps.db, "node", "n1", lambda s: post(apps.col, s, gpu_batch("rev:1", "n1")))
    sre_secret = _revoked(
        apps.db,
        "sre",
        None,
        lambda s: httpx.get(apps.api + "/v1/runs", headers={"Authorization": f"Bearer {s}"}),
    )
    bad = {
        "missing": None,
        "garbled": "Bearer gpf_this-is-not-a-token-at-all-00000000000000000000",
        "not bearer": "Basic dXNlcjpwYXNz",
        "empty bearer": "Bearer",
        "non-ascii": "Bearer gpf_\u00e9\u00e9",
    }
    checked = 0
    failures: list[str] = []
    for base, table, revoked in (
        (apps.col, apps.col_routes, node_secret),
        (apps.api, apps.api_routes, sre_secret),
    ):
        for method, path in table:
            if path in PUBLIC:
                continue
            for what, header in [*bad.items(), ("revoked", f"Bearer {revoked}")]:
                try:
                    r = _request(base, method, path, header)
                except (UnicodeEncodeError, httpx.LocalProtocolError):
                    continue  # httpx itself refuses a non-ASCII header
                checked += 1
                want_redirect = path in WEB_PAGES and header is None
                ok = (
                    (r.status_code == 303 and r.headers["location"].startswith("/login"))
                    if want_redirect
                    else r.status_code == 401
                )
                if not ok:
                    failures.append(f"{method} {path} {what}: {r.status_code} {r.text[:100]}")
                for secret in (node_secret, sre_secret):
                    assert secret not in r.text
            # a revoked token in the web view's cookie is refused too
            if path in WEB_PAGES:
                r = _request(base, method, path, None, cookie=sre_secret)
                checked += 1
                if not (r.status_code == 303 and r.headers["location"].startswith("/login")):
                    failures.append(f"{method} {path} revoked cookie: {r.status_code}")
    figures.update(
        collector_routes=len(apps.col_routes),
        api_routes=len(apps.api_routes),
        public=sorted(PUBLIC),
        requests_checked=checked,
        failures=len(failures),
    )
    assert not failures, "\n".join(failures)
    assert checked > 100


def test_tokens_stored_hashed_and_compared_in_constant_time(
    apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = node_tokens(apps.db, ["hash-node"])["hash-node"]
    with psycopg.connect(apps.db) as c:
        row = c.execute(
            "SELECT token_hash, t::text FROM agent_tokens t WHERE name = 'tok-hash-node'"
        ).fetchone()
    assert row is not None
    assert bytes(row[0]) == auth.hash_secret(secret) and len(row[0]) == 32
    assert secret not in row[1] and secret.removeprefix(auth.PREFIX) not in row[1]
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((bytes(a), bytes(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert post(apps.col, secret, gpu_batch("hash:1", "hash-node")).status_code == 200
    assert (auth.hash_secret(secret), auth.hash_secret(secret)) in calls


def test_secrets_never_in_logs_or_error_bodies(
    apps: Apps, caplog: pytest.LogCaptureFixture, figures: dict[str, Any]
) -> None:
    caplog.set_level(logging.DEBUG)
    admin = role_token(apps.db, "log-admin", "admin")
    h = {"Authorization": f"Bearer {admin}"}
    created = httpx.post(
        apps.api + "/v1/tokens",
        json={"name": "log-node", "role": "node", "node": "log-node"},
        headers=h,
        timeout=10,
    )
    assert created.status_code == 201
    node_secret = created.json()["token"]
    bodies = [
        post(apps.col, node_secret, gpu_batch("log:1", "log-node")),
        post(apps.col, node_secret, gpu_batch("log:2", "someone-else")),
        post(apps.col, node_secret, {"batch_id": "log:3", "node": "log-node", "gpu": {"time": ["x"]}}),
        post(apps.col, node_secret + "x", gpu_batch("log:4", "log-node")),
        httpx.get(apps.api + "/v1/runs", headers={"Authorization": f"Bearer {node_secret}"}),
        httpx.get(apps.api + "/v1/runs", headers={"Authorization": f"Bearer {admin[:-1]}"}),
        httpx.post(apps.api + "/v1/runs", json={"run_id": "r1", "token": node_secret}, headers=h),
        httpx.delete(apps.api + "/v1/tokens/log-node", headers=h),
        post(apps.col, node_secret, gpu_batch("log:5", "log-node")),
    ]
    time.sleep(2.5)
    bodies.append(post(apps.col, node_secret, gpu_batch("log:6", "log-node")))
    statuses = [r.status_code for r in bodies]
    text = caplog.text
    figures.update(statuses=statuses, log_records=len(caplog.records))
    assert statuses[0] == 200 and statuses[-1] == 401
    for secret in (admin, node_secret):
        for s in (secret, secret.removeprefix(auth.PREFIX), auth.hash_secret(secret).hex()):
            assert s not in text
            for r in bodies:
                assert s not in r.text, (r.request.url, r.status_code, r.text[:200])


def test_authorization(apps: Apps, figures: dict[str, Any]) -> None:
    tokens = node_tokens(apps.db, ["node-a", "node-b"])
    finance = role_token(apps.db, "finance", "finance")
    # node A writing node B: refused, nothing stored (whole batch and a single sample)
    r1 = post(apps.col, tokens["node-a"], gpu_batch("a-as-b:1", "node-b"))
    doc = gpu_batch("a-as-b:2", "node-a", n=16)
    doc["gpu"]["node"] = ["node-a"] * 15 + ["node-b"]
    r2 = post(apps.col, tokens["node-a"], doc, fmt="json", comp=None)
    with psycopg.connect(apps.db) as c:
        rows = c.execute(
            "SELECT (SELECT count(*) FROM gpu_samples) + (SELECT count(*) FROM host_samples) "
            "+ (SELECT count(*) FROM ingest_batches)"
        ).fetchone()
    assert (r1.status_code, r2.status_code, rows) == (403, 403, (0,))
    # node tokens cannot read anything
    reads = [(m, p) for m, p in apps.api_routes if m == "GET" and p not in PUBLIC and p not in WEB_PAGES]
    node_reads = {
        p: httpx.get(
            apps.api + _fill(p), headers={"Authorization": f"Bearer {tokens['node-a']}"}, timeout=10
        ).status_code
        for _, p in reads
    }
    assert set(node_reads.values()) == {403}, node_reads
    # finance reads accounting but cannot change sites, prices, carbon, nodes or tokens
    fh = {"Authorization": f"Bearer {finance}"}
    assert httpx.get(apps.api + "/v1/sites", headers=fh).status_code == 200
    writes = {
        ("PUT", "/v1/sites/eu1"): {"pue": 1.1},
        ("PUT", "/v1/sites/eu1/prices"): {"points": [{"time": "2026-01-01T00:00:00Z", "price_per_kwh": 0.1}]},
        ("PUT", "/v1/carbon/DE"): {"points": [{"time": "2026-01-01T00:00:00Z", "g_co2e_per_kwh": 300}]},
        ("PATCH", "/v1/nodes/node-a"): {"site": "eu1"},
        ("POST", "/v1/tokens"): {"name": "mine", "role": "admin"},
        ("DELETE", "/v1/tokens/tok-node-a"): None,
        ("POST", "/v1/runs"): {"run_id": "fin-run"},
    }
    finance_writes = {
        f"{m} {p}": httpx.request(m, apps.api + p, json=b, headers=fh, timeout=10).status_code
        for (m, p), b in writes.items()
    }
    assert set(finance_writes.values()) == {403}, finance_writes
    with psycopg.connect(apps.db) as c:
        assert c.execute("SELECT count(*) FROM sites").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM agent_tokens WHERE revoked_at IS NOT NULL").fetchone() == (0,)
    # unknown fields are refused, naming the field
    admin = role_token(apps.db, "authz-admin", "admin")
    r3 = httpx.post(
        apps.api + "/v1/runs",
        json={"run_id": "r1", "colour": "red"},
        headers={"Authorization": f"Bearer {admin}"},
    )
    r4 = post(
        apps.col, tokens["node-a"], {**gpu_batch("unk:1", "node-a"), "colour": "red"}, fmt="json", comp=None
    )
    assert r3.status_code == 422 and "colour" in r3.text
    assert r4.status_code == 422 and r4.json()["detail"][0]["loc"] == ["colour"]
    figures.update(
        node_a_as_b=[r1.status_code, r2.status_code],
        node_reads=len(node_reads),
        finance_writes=finance_writes,
        unknown_field=[r3.status_code, r4.status_code],
    )
