"""The collector meets its whole fleet at once (a start, a failover, a scale-out):
token lookups for many new nodes share queries, the cache outlives what does
not call for dropping it, and made-up tokens cannot push real ones out.
Real collector, real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import HTTPException
from psycopg_pool import AsyncConnectionPool

from gpufleet.auth import Principal, TokenCache, create_token, hash_secret, new_secret
from gpufleet.httpauth import Authenticator
from gpufleet.wire import encode
from tests.collector.conftest import Collector
from tests.collector.test_ingest import batch, count, post


def _auth(c: Collector) -> Authenticator:
    app: Any = c.server.server.config.app
    return app.state.auth


def test_many_new_nodes_at_once_share_their_token_lookups(collector: Collector) -> None:
    nodes = [f"burst-{i:03d}" for i in range(300)]
    with psycopg.connect(collector.db, autocommit=True) as c:
        secrets_ = {n: create_token(c, n, "node", n) for n in nodes}
    bodies = {n: encode(batch(f"{n}:1", n), "msgpack", "zstd") for n in nodes}
    auth = _auth(collector)
    before = auth.lookups

    async def fleet() -> list[int]:
        limits = httpx.Limits(max_connections=len(nodes))
        async with httpx.AsyncClient(base_url=collector.url, timeout=30, limits=limits) as client:

            async def one(n: str) -> int:
                body, headers = bodies[n]
                r = await client.post(
                    "/v1/ingest", content=body, headers={**headers, "Authorization": f"Bearer {secrets_[n]}"}
                )
                return r.status_code

            return await asyncio.gather(*(one(n) for n in nodes))

    statuses = asyncio.run(fleet())
    assert statuses == [200] * len(nodes)
    assert auth.lookups - before < len(nodes)  # how many share a query depends on the arrivals
    assert count(collector.db) == 8 * len(nodes)


class _Req:
    """What Authenticator reads of a request."""

    def __init__(self, secret: str) -> None:
        self.headers = {"authorization": f"Bearer {secret}"}


def test_lookups_waiting_together_are_one_query(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        secrets_ = {f"q-{i:03d}": create_token(c, f"q-{i:03d}", "node", f"q-{i:03d}") for i in range(300)}

    async def scenario() -> tuple[list[Any], int]:
        pool = AsyncConnectionPool(db, min_size=1, max_size=4, open=False, kwargs={"autocommit": True})
        await pool.open()
        try:
            auth = Authenticator(pool)
            got = await asyncio.gather(
                *(auth.principal(_Req(s)) for s in secrets_.values()),  # type: ignore[arg-type]
                auth.principal(_Req(new_secret())),
                return_exceptions=True,
            )  # type: ignore[arg-type]
            return got, auth.lookups
        finally:
            await pool.close()

    got, lookups = asyncio.run(scenario())
    assert [p.node for p in got[:-1]] == list(secrets_)
    assert getattr(got[-1], "status_code", None) == 401  # an unknown one in the same query is refused
    # One query per digest would be 301: all of them waited together.
    assert lookups <= 2, lookups


def test_a_token_added_keeps_the_cache_and_ends_its_own_refusal(collector: Collector) -> None:
    assert post(collector, batch("keep:1")).status_code == 200
    # A secret used before its token exists is refused, and the refusal cached.
    early = new_secret()
    body, headers = encode(batch("early:1", "node-early"), "msgpack", "zstd")
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=body,
        headers={**headers, "Authorization": f"Bearer {early}"},
        timeout=10,
    )
    assert r.status_code == 401
    auth = _auth(collector)
    with psycopg.connect(collector.db, autocommit=True) as c:
        c.execute(
            "INSERT INTO agent_tokens (name, token_hash, role, node) VALUES ('node-early', %s, 'node', "
            "'node-early')",
            (hash_secret(early),),
        )
    time.sleep(2.5)  # the collector checks the token table every 2 s
    looked_up = auth.lookups
    assert post(collector, batch("keep:2")).status_code == 200  # still cached: no query
    assert auth.lookups == looked_up
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=body,
        headers={**headers, "Authorization": f"Bearer {early}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert auth.lookups == looked_up + 1


def test_a_failed_check_keeps_the_cache_for_the_grace_only(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        secret = create_token(c, "grace-node", "node", "grace-node")

    async def scenario() -> list[Any]:
        pool = AsyncConnectionPool(
            db, min_size=1, max_size=2, open=False, timeout=1, kwargs={"autocommit": True}
        )
        await pool.open()
        auth = Authenticator(pool, revocation_check_s=0.0, stale_grace_s=1.0)
        seen: list[Any] = [await auth.principal(_Req(secret))]  # type: ignore[arg-type]
        await pool.close()  # the token table can no longer be checked
        seen.append(await auth.principal(_Req(secret)))  # type: ignore[arg-type]  # within the grace: cached
        await asyncio.sleep(1.2)
        try:
            await auth.principal(_Req(secret))  # type: ignore[arg-type]
        except HTTPException as e:  # past the grace: forgotten, and the lookup cannot be made
            seen.append(e)
        return seen

    first, within, past = asyncio.run(scenario())
    assert isinstance(first, Principal) and first.node == "grace-node"
    assert within == first
    assert getattr(past, "status_code", None) == 503, past


def test_made_up_tokens_do_not_push_known_ones_out() -> None:
    cache = TokenCache(ttl_s=60, max_entries=10)
    known = hash_secret("known")
    row = (known, 1, "n", "node", None, "n")
    assert isinstance(cache.put(known, row), Principal)  # type: ignore[arg-type]
    for i in range(50):
        cache.put(hash_secret(f"made-up-{i}"), None)
    assert isinstance(cache.get(known), Principal)
    assert len(cache) <= 11  # the one known, at most ten refused


def test_entries_filled_together_do_not_expire_together(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    cache = TokenCache(ttl_s=100)
    digests = [hash_secret(f"t{i}") for i in range(200)]
    for d in digests:
        cache.put(d, None)
    alive = []
    for at in (74.9, 87.5, 100.1):
        now[0] = 1000.0 + at
        alive.append(sum(cache.get(d) is None for d in digests))
    # All live through 75 % of the TTL, about half past 87.5 %, none past it.
    assert alive[0] == 200 and 40 < alive[1] < 160 and alive[2] == 0, alive
