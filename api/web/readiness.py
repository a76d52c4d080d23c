"""``GET /readyz`` for the API: ready when the database answers.

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

router = APIRouter(tags=["health"])


def _database_ok(st: ApiState) -> bool:
    try:
        with st.pool.connection(timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except (psycopg.Error, PoolTimeout):
        return False


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    st = state(request)
    ok = await run_in_threadpool(_database_ok, st)
    return JSONResponse({"ready": ok, "database": ok}, status_code=200 if ok else 503,
                        headers=None if ok else {"Retry-After": str(st.settings.ingest.retry_after_s)})
