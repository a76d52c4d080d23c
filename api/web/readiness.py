"""``GET /readyz`` for the API: ready when the database answers and has this gpufleet's schema.

Liveness stays ``/healthz`` (the process answers); readiness takes a replica
out of a load balancer while its database is unreachable, as the collector's
``/readyz`` does, so orchestrators probe both services the same way.
"""

from __future__ import annotations

import psycopg
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout

from gpufleet.api.deps import ApiState, state
from gpufleet.db.schema_check import schema_problem

router = APIRouter(tags=["health"])


def _check(st: ApiState) -> tuple[bool, str | None]:
    """(database answers, what is wrong with its schema or None)."""
    try:
        with st.pool.connection(timeout=2) as conn:
            return True, schema_problem(conn)
    except (psycopg.Error, PoolTimeout):
        return False, None


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    st = state(request)
    db, problem = await run_in_threadpool(_check, st)
    ok = db and problem is None
    body: dict[str, object] = {"ready": ok, "database": db}
    if problem:
        body["schema"] = problem
    return JSONResponse(
        body,
        status_code=200 if ok else 503,
        headers=None if ok else {"Retry-After": str(st.settings.ingest.retry_after_s)},
    )
