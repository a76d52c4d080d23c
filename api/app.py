"""The read/write API: runs, sites, carbon, nodes, tokens, incidents, accounting."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gpufleet.api import web
from gpufleet.api.deps import ApiState
from gpufleet.api.routes import accounting, advisor, docs, incidents, reports, runs, sites, tokens
from gpufleet.api.web.session import MAX_FORM_BYTES
from gpufleet.bodylimit import BodyLimit, Refusal
from gpufleet.config import Settings
from gpufleet.connguard import ConnectionGuard, Limits
from gpufleet.fairshare import FairShare

#: Largest body of a route outside /v1 other than the sign-in form (web pages take none), bytes.
OTHER_BODY_MAX = 64 * 1024


def create_app(url: str, settings: Settings) -> FastAPI:
    st = ApiState(url, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        st.pool.open(wait=False)
        try:
            yield
        finally:
            st.pool.close()

    app = FastAPI(
        title="gpufleet API",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="Runs, incidents and per-run energy, cost and CO2e accounting.",
    )
    app.state.api = st
    #: Slow clients are let go when served with gpufleet.connguard's protocol (``gpufleet api`` does).
    app.connection_guard = ConnectionGuard(Limits.of(settings.api, settings.ingest.retry_after_s))  # type: ignore[attr-defined]

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Name the field; never echo the input back (it may hold secrets).
        detail = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", "invalid"), "type": e.get("type")}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    for r in (runs.router, sites.router, tokens.router, incidents.router):
        app.include_router(r)
    app.include_router(accounting.router)
    app.include_router(reports.router)
    app.include_router(advisor.router)
    app.include_router(web.router)
    app.include_router(docs.router)  # /docs with its assets served here (offline)

    async def token_first(scope: dict[str, Any]) -> Refusal | None:
        """/v1 bodies are read only for a valid token (the route checks its role as before)."""
        if not scope.get("path", "").startswith("/v1/"):
            return None
        try:
            await st.auth.principal(Request(scope))
        except HTTPException as e:
            return e.status_code, e.detail, dict(e.headers or {})
        return None

    # Inside the body limit (added after it): a request refused for its size is never counted.
    app.add_middleware(
        FairShare,
        lookup=st.auth.lookup,
        per_token=settings.api.max_concurrent_per_token,
        per_role=st.per_role_limit(),
        wait_s=settings.api.concurrency_wait_s,
        retry_after_s=settings.ingest.retry_after_s,
        exempt=("/healthz", "/docs", "/static/", "/favicon.ico"),
    )
    app.add_middleware(
        BodyLimit,
        default=OTHER_BODY_MAX,
        precheck=token_first,
        limits=[
            ("/v1/", settings.api.max_body_bytes),
            ("/login", MAX_FORM_BYTES),
            ("/logout", MAX_FORM_BYTES),
        ],
    )

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
