"""A small fleet under attack: one database, a collector and an API over real HTTP, tokens of every role.

Each attack test plays what a careless or hostile node, a typo or a slow
client did in the black-box round (issue 36), and checks what was stored and
billed afterwards, not only the status.  The collector's leader is off: tests
run the inferred-run pass themselves, at the time they choose.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.api.app import create_app as create_api
from gpufleet.auth import create_token
from gpufleet.collector.app import create_app as create_collector
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from gpufleet.store.inferred import Inferrer
from gpufleet.wire import encode

GRACE_S = 300.0
#: The fleet's one site: energy at 0.30 EUR/kWh, GPU-hours at 2 EUR, 10 EUR on an H100.
SITE = {
    "pue": 1.0,
    "price_per_kwh": 0.3,
    "gpu_hour_price": 2.0,
    "currency": "EUR",
    "gpu_hour_prices": {"H100": 10.0},
}
_seq = itertools.count(1)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


@dataclass
class World:
    db: str
    collector: str
    api: str
    tokens: dict[str, str]

    def client(self, who: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who in self.tokens else {}
        return httpx.Client(base_url=self.api, headers=headers, timeout=30)

    def call(self, who: str, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
        with self.client(who) as c:
            return c.request(method, path, json=body, params=params or None)

    def ship(self, who: str, doc: dict[str, Any]) -> httpx.Response:
        body, headers = encode(doc)
        return httpx.post(
            self.collector + "/v1/ingest",
            content=body,
            headers={**headers, "Authorization": f"Bearer {self.tokens[who]}"},
            timeout=30,
        )

    def infer(self, now: float) -> Any:
        with psycopg.connect(self.db, autocommit=True) as conn:
            return Inferrer(GRACE_S).run_once(conn, at(now))

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.db, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def run(self, run_id: str) -> dict[str, Any]:
        r = self.call("admin", "get", f"/v1/runs/{run_id}")
        return r.json() if r.status_code == 200 else {}

    def accounting(self, run_id: str) -> dict[str, Any]:
        r = self.call("admin", "get", f"/v1/runs/{run_id}/accounting")
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body


def batch(
    node: str,
    t0: float,
    seconds: int,
    gpus: Mapping[int, str | None],
    *,
    power_w: float = 300.0,
    energy: dict[int, list[int]] | None = None,
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Samples of ``gpus`` (GPU -> run id) once a second for ``seconds`` from ``t0``."""
    rows = [(t0 + s, g, r) for s in range(seconds) for g, r in gpus.items()]
    doc: dict[str, Any] = {
        "batch_id": f"{node}:{next(_seq)}",
        "node": node,
        "gpu": {
            "time": [r[0] for r in rows],
            "gpu": [r[1] for r in rows],
            "run_id": [r[2] for r in rows],
            "power_w": [power_w] * len(rows),
            "util_pct": [90.0] * len(rows),
        },
    }
    if energy is not None:
        doc["gpu"]["energy_mj"] = [energy[r[1]][int(r[0] - t0)] for r in rows]
    if facts is not None:
        doc["facts"] = facts
    return doc


def whole_seconds_ago(s: float) -> float:
    """Whole seconds, so stored and expected times round alike."""
    return float(int(time.time() - s))


@pytest.fixture
def world(db: str, settings: Settings) -> Iterator[World]:
    with psycopg.connect(db, autocommit=True) as c:
        tokens = {role: create_token(c, role, role) for role in ("admin", "sre", "finance")}
        tokens["finance2"] = create_token(c, "finance2", "finance")
        tokens["progress"] = create_token(c, "trainer", "progress")
        for n in ("node-01", "node-02"):
            tokens[n] = create_token(c, n, "node", n)
    with (
        serve(create_collector(db, settings, run_leader=False), **server_options(settings)) as col,
        serve(create_api(db, settings)) as api,
    ):
        w = World(db, col.url, api.url, tokens)
        r = w.call("admin", "put", "/v1/sites/eu1", SITE, **{"from": "2020-01-01"})
        assert r.status_code in (200, 201), r.text
        w.sql("INSERT INTO nodes (node, site) VALUES ('node-01', 'eu1'), ('node-02', 'eu1')")
        yield w
