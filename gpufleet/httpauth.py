"""Bearer-token authentication for the FastAPI apps (collector and API).

Lookups go through a short-lived cache so a busy collector does not query
``agent_tokens`` per request; a database outage while a token is not cached
answers 503 (try again), never 401 (which agents treat as final).
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


GENERATION_SQL = "SELECT count(*), max(id), max(revoked_at) FROM agent_tokens"


class Authenticator:
    """Works over an async pool (collector) or a sync one (API, via a thread)."""

    def __init__(self, pool: AsyncConnectionPool | ConnectionPool, ttl_s: float = 300.0, retry_after_s: int = 2,
                 revocation_check_s: float = 2.0) -> None:
        self.pool = pool
        self.cache = TokenCache(ttl_s)
        self.retry_after_s = retry_after_s
        # Hits are cached for minutes (agents post every few seconds, each with
        # its own token); a cheap check of the token table's state every few
        # seconds drops the cache when anything was revoked or added.
        self.revocation_check_s = revocation_check_s
        self._generation: tuple[object, ...] | None = None
        self._checked = 0.0

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

    async def _check_generation(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.revocation_check_s:
            return
        self._checked = now
        try:
            if isinstance(self.pool, ConnectionPool):
                gen = await run_in_threadpool(self._generation_sync)
            else:
                async with asyncio.timeout(3), self.pool.connection() as conn:
                    cur = await conn.execute(GENERATION_SQL)
                    gen = await cur.fetchone()
        except (psycopg.Error, PoolTimeout, TimeoutError, OSError):
            # Cannot tell: forget cached tokens rather than trust a stale view.
            self.cache.clear()
            self._generation = None
            return
        gen = _as_tuple(gen)
        if gen != self._generation:
            self.cache.clear()
            self._generation = gen

    def _generation_sync(self) -> object:
        assert isinstance(self.pool, ConnectionPool)
        with self.pool.connection(timeout=3) as conn:
            return conn.execute(GENERATION_SQL).fetchone()

    async def _fetch(self, digest: bytes) -> TokenRow | None:
        try:
            if isinstance(self.pool, ConnectionPool):
                return await run_in_threadpool(self._fetch_sync, digest)
            async with asyncio.timeout(3), self.pool.connection() as conn:
                cur = await conn.execute(LOOKUP_SQL, (digest,))
                return await cur.fetchone()
        except psycopg.errors.UndefinedTable as e:
            from gpufleet.db.schema_check import UPGRADE

            raise HTTPException(503, f"the database has no (or an older) gpufleet schema: {UPGRADE}",
                                headers={"Retry-After": "30"}) from e
        except (psycopg.Error, PoolTimeout, TimeoutError, OSError) as e:
            raise HTTPException(503, "database unavailable; retry later",
                                headers={"Retry-After": str(self.retry_after_s)}) from e

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
