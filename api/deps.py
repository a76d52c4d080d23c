"""Shared dependencies: the database pool, the principal, and capability checks.

Routes are plain functions (FastAPI runs them in its thread pool) over the
same synchronous store functions the CLI and replay use.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from typing import Annotated, Any

import psycopg
from fastapi import Depends, HTTPException, Request
from psycopg_pool import ConnectionPool, PoolTimeout

from gpufleet.auth import AccessDenied, Principal
from gpufleet.config import Settings
from gpufleet.db.read_routing import RoutedPool, read_router
from gpufleet.db.schema_check import UPGRADE
from gpufleet.httpauth import Authenticator


class ApiState:
    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        self.statement_timeout_ms = max(1, round(settings.api.statement_timeout_s * 1000))
        #: Writes and token checks (a revoked token must stop working at once, not when a standby replays it).
        self.primary = ConnectionPool(
            url,
            min_size=1,
            max_size=settings.api.pool_size,
            open=False,
            timeout=5,
            kwargs={"autocommit": True, "application_name": "gpufleet-api"},
            configure=self._configure,
        )
        #: Reads (GET routes, web pages): the standby of ``database.read_url`` while its view is fresh
        #: enough, else the primary (:mod:`gpufleet.db.read_routing`).
        self.pool = RoutedPool(read_router(url, settings, self.primary, self._configure, "gpufleet-api"))
        self.auth = Authenticator(self.primary, retry_after_s=settings.ingest.retry_after_s)

    def _configure(self, conn: psycopg.Connection) -> None:
        """Every statement of the API is bounded in time: PostgreSQL cancels one that runs longer, so a
        request that asks too much fails alone, and nothing keeps running after its client gave up."""
        conn.execute(f"SET statement_timeout = {self.statement_timeout_ms}")

    def per_role_limit(self) -> int:
        """Requests one role may have in progress: by default half the pool, so the other roles always
        find connections."""
        return self.settings.api.max_concurrent_per_role or max(1, self.settings.api.pool_size // 2)


def state(request: Request) -> ApiState:
    st: ApiState = request.app.state.api
    return st


StateDep = Annotated[ApiState, Depends(state)]


async def principal(request: Request) -> Principal:
    return await state(request).auth.principal(request)


PrincipalDep = Annotated[Principal, Depends(principal)]


def permit(who: Principal, capability: str) -> None:
    """The API's answer to a missing capability: 403 with the reason."""
    try:
        who.require(capability)
    except AccessDenied as e:
        raise HTTPException(403, str(e)) from None


def allowed(capability: str) -> Callable[..., Coroutine[Any, Any, Principal]]:
    async def check(who: PrincipalDep) -> Principal:
        permit(who, capability)
        return who

    return check


def _pool_for(s: ApiState, request: Request) -> ConnectionPool | RoutedPool:
    """Writes on the primary; reads wherever the router sends them, unless the client asked for
    the newest data (``Cache-Control: no-cache``, as after its own write)."""
    if (
        request.method not in ("GET", "HEAD")
        or "no-cache" in request.headers.get("cache-control", "").lower()
    ):
        return s.primary
    return s.pool


def connection(s: StateDep, request: Request) -> Iterator[psycopg.Connection]:
    try:
        with _pool_for(s, request).connection() as conn:
            yield conn
    except psycopg.errors.QueryCanceled as e:
        raise HTTPException(
            503,
            f"the request ran past the API's {s.settings.api.statement_timeout_s:g}-second "
            "statement limit (api.statement_timeout_s) and was cancelled; ask for a shorter "
            "period or a coarser grouping",
            headers={"Retry-After": "30"},
        ) from e
    except psycopg.errors.SerializationFailure as e:
        # On a hot standby: the read conflicted with a change being replayed (a vacuum's cleanup) and
        # was cancelled; the next one sees the replayed state.
        raise HTTPException(
            503,
            "the read was cancelled by the standby replaying a conflicting change; retry",
            headers={"Retry-After": "1"},
        ) from e
    except (psycopg.OperationalError, PoolTimeout) as e:
        raise HTTPException(503, "database unavailable; retry later", headers={"Retry-After": "2"}) from e
    except (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.UndefinedColumn,
    ) as e:
        # an empty or older database: say the one command that fixes it
        raise HTTPException(
            503,
            f"the database has no (or an older) gpufleet schema: {UPGRADE}",
            headers={"Retry-After": "30"},
        ) from e
    except psycopg.DataError as e:
        # A value the request schema let through but PostgreSQL cannot hold (a NUL
        # in text, a UTC offset beyond +-15:59, a year outside its range) is the
        # client's error, not the server's.  The input is not echoed back.
        raise HTTPException(
            422,
            "a value in the request cannot be stored: text with a NUL character, "
            "or a time or number outside the database's range",
        ) from e


ConnDep = Annotated[psycopg.Connection, Depends(connection)]
Reader = Annotated[Principal, Depends(allowed("read"))]
AccountingReader = Annotated[Principal, Depends(allowed("read_accounting"))]
Admin = Annotated[Principal, Depends(allowed("admin"))]
RunWriter = Annotated[Principal, Depends(allowed("write_runs"))]
ProgressWriter = Annotated[Principal, Depends(allowed("report_progress"))]
