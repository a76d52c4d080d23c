"""Bearer-token authentication for the FastAPI apps (collector and API).

Lookups go through a short-lived cache so a busy collector does not query
``agent_tokens`` per request; a database outage while a token is not cached
answers 503 (try again), never 401 (which agents treat as final).

The collector meets its whole fleet at once: after a start, a failover or a
scale-out every node's first shipment is a cache miss.  Its misses are
therefore looked up together, one query for all digests waiting (never one
connection per node), and the cache survives what does not call for
dropping it: a token added (only the cached refusals go), a check of the
token table that failed for a moment (the cache is kept for
``stale_grace_s``).  Before, 10,000 nodes arriving within one ship interval
queued lookups on the four-connection pool past its timeout, the failed
checks cleared the cache, and the collector answered 503 to every node for
good (bench/vs_prometheus.py at 80,000 GPUs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from gpufleet.auth import (
    LOOKUP_MANY_SQL,
    LOOKUP_SQL,
    MISS,
    AuthError,
    Principal,
    TokenCache,
    TokenRow,
    hash_secret,
    parse_bearer,
)


def _as_tuple(row: Any) -> tuple[Any, ...]:
    if row is None:
        return ()
    return tuple(row.values()) if isinstance(row, dict) else tuple(row)


#: The token table's state (rows, newest id, latest revocation) and how many
#: rows are newer than the id given: rows added and nothing else changed when
#: the count grew by exactly those.
GENERATION_SQL = (
    "SELECT count(*), max(id), max(revoked_at), count(*) FILTER (WHERE id > %s) FROM agent_tokens"
)


class Authenticator:
    """Works over an async pool (collector) or a sync one (API, via a thread)."""

    def __init__(
        self,
        pool: AsyncConnectionPool | ConnectionPool,
        ttl_s: float = 300.0,
        retry_after_s: int = 2,
        revocation_check_s: float = 2.0,
        stale_grace_s: float = 30.0,
    ) -> None:
        self.pool = pool
        self.cache = TokenCache(ttl_s)
        self.retry_after_s = retry_after_s
        # Hits are cached for minutes (agents post every few seconds, each with
        # its own token); a cheap check of the token table's state every few
        # seconds drops the cache when anything was revoked or removed.
        self.revocation_check_s = revocation_check_s
        #: How long the cache is trusted while the token table cannot be checked.
        self.stale_grace_s = stale_grace_s
        self._generation: tuple[Any, ...] | None = None
        self._checked = 0.0
        self._last_ok: float | None = None
        #: Digests waiting for the next coalesced lookup, and the task doing them.
        self._pending: dict[bytes, asyncio.Future[TokenRow | BaseException | None]] = {}
        self._drainer: asyncio.Task[None] | None = None
        self.lookups = 0  # queries made for uncached digests

    async def principal(self, request: Request) -> Principal:
        try:
            secret = parse_bearer(request.headers.get("authorization"))
        except AuthError as e:
            raise HTTPException(401, str(e), headers={"WWW-Authenticate": "Bearer"}) from None
        await self._check_generation()
        digest = hash_secret(secret)
        hit = self.cache.get(digest)
        if hit is MISS:
            hit = self.cache.put(digest, await self._fetch(digest))
        if not isinstance(hit, Principal):
            raise HTTPException(401, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
        return hit

    async def lookup(self, secret: str) -> Principal | None:
        """The principal of a bearer secret (cached, else looked up); None when unknown, revoked or
        not answerable now (the route's own check answers for it)."""
        digest = hash_secret(secret)
        hit = self.cache.get(digest)
        if hit is MISS:
            try:
                hit = self.cache.put(digest, await self._fetch(digest))
            except HTTPException:
                return None
        return hit if isinstance(hit, Principal) else None

    def cached_node(self, authorization: str | None) -> bool:
        """Whether ``authorization`` carries a cached token that may ingest, answered without a
        query or a wait.  The collector's protocol reads a shipment's body on the connection
        only then (:mod:`gpufleet.collector.ingest_protocol`); anyone else's body is read
        after :meth:`principal` has accepted the token, as on every other path."""
        try:
            secret = parse_bearer(authorization)
        except AuthError:
            return False
        hit = self.cache.get(hash_secret(secret))
        return isinstance(hit, Principal) and hit.may("ingest")

    async def _check_generation(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.revocation_check_s:
            return
        self._checked = now
        old = self._generation
        since = old[1] if old is not None and old[1] is not None else -1
        try:
            if isinstance(self.pool, ConnectionPool):
                row = await run_in_threadpool(self._generation_sync, since)
            else:
                async with asyncio.timeout(3), self.pool.connection() as conn:
                    cur = await conn.execute(GENERATION_SQL, (since,))
                    row = await cur.fetchone()
        except (psycopg.Error, PoolTimeout, TimeoutError, OSError):
            # Cannot tell.  A moment's trouble keeps the cache (dropping it would
            # send every node to the database at once); a longer one forgets
            # cached tokens rather than trust a stale view.
            if self._last_ok is None or now - self._last_ok > self.stale_grace_s:
                self.cache.clear()
                self._generation = None
            return
        self._last_ok = now
        got = _as_tuple(row)
        gen, newer = got[:3], got[3]
        if old is None:
            self.cache.clear()
        elif gen != old:
            if gen[2] == old[2] and gen[0] - newer == old[0]:
                self.cache.forget_unknown()  # tokens added, none revoked or removed
            else:
                self.cache.clear()
        self._generation = gen

    def _generation_sync(self, since: int) -> object:
        assert isinstance(self.pool, ConnectionPool)
        with self.pool.connection(timeout=3) as conn:
            return conn.execute(GENERATION_SQL, (since,)).fetchone()

    async def _fetch(self, digest: bytes) -> TokenRow | None:
        if isinstance(self.pool, ConnectionPool):
            try:
                return await run_in_threadpool(self._fetch_sync, digest)
            except (psycopg.Error, PoolTimeout, TimeoutError, OSError) as e:
                raise self._unavailable(e) from e
        fut = self._pending.get(digest)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._pending[digest] = loop.create_future()
            if self._drainer is None or self._drainer.done():
                self._drainer = loop.create_task(self._drain())
        # Shielded: a client that goes away must not cancel the others' lookup.
        got = await asyncio.shield(fut)
        if isinstance(got, BaseException):
            raise self._unavailable(got) from got
        return got

    async def _drain(self) -> None:
        """Looks up every waiting digest, one query at a time; digests that
        arrive meanwhile wait for the next query, so the batch grows with the
        load instead of the number of connections."""
        assert isinstance(self.pool, AsyncConnectionPool)
        while self._pending:
            batch, self._pending = self._pending, {}
            outcome: dict[bytes, TokenRow | None] | BaseException
            try:
                self.lookups += 1
                async with asyncio.timeout(3), self.pool.connection() as conn:
                    cur = await conn.execute(LOOKUP_MANY_SQL, (list(batch),))
                    outcome = {bytes(r[0]): r for r in map(_as_tuple, await cur.fetchall())}
            except (psycopg.Error, PoolTimeout, TimeoutError, OSError) as e:
                outcome = e
            except BaseException as e:  # cancelled, or unforeseen: answer every waiter, then let it go
                for f in batch.values():
                    if not f.done():
                        f.set_result(e)
                raise
            for d, f in batch.items():
                if not f.done():
                    f.set_result(outcome if isinstance(outcome, BaseException) else outcome.get(d))

    def _unavailable(self, e: BaseException) -> HTTPException:
        if isinstance(e, psycopg.errors.UndefinedTable):
            from gpufleet.db.schema_check import UPGRADE

            return HTTPException(
                503,
                f"the database has no (or an older) gpufleet schema: {UPGRADE}",
                headers={"Retry-After": "30"},
            )
        return HTTPException(
            503, "database unavailable; retry later", headers={"Retry-After": str(self.retry_after_s)}
        )

    def _fetch_sync(self, digest: bytes) -> TokenRow | None:
        assert isinstance(self.pool, ConnectionPool)
        with self.pool.connection(timeout=3) as conn:
            row = conn.execute(LOOKUP_SQL, (digest,)).fetchone()
        if isinstance(row, dict):
            return tuple(row.values())
        return row


class RateLimiter:
    """Token bucket per principal: ``rate`` requests/s, bursts of 2 s worth."""

    def __init__(self, rate_per_s: float) -> None:
        self.rate = rate_per_s
        self.burst = max(1.0, 2 * rate_per_s)
        self._buckets: dict[int, tuple[float, float]] = {}

    def allow(self, key: int) -> bool:
        if self.rate <= 0:
            return True
        now = time.monotonic()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True
