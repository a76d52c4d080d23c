"""The collector service: ingest, health, its own metrics, and the leader's work."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from psycopg_pool import AsyncConnectionPool

from gpufleet.auth import Principal
from gpufleet.bodylimit import BodyLimit
from gpufleet.collector.alerting import IncidentMetrics
from gpufleet.collector.connection_age import ConnectionAges, closing
from gpufleet.collector.ingest import CLIENT_GONE, IngestHandler
from gpufleet.collector.leader import DbMonitor, Leader, SweepFn
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.remote_write import DOC as REMOTE_WRITE_DOC
from gpufleet.collector.remote_write import OPENAPI as REMOTE_WRITE_OPENAPI
from gpufleet.collector.remote_write import PATH as REMOTE_WRITE_PATH
from gpufleet.collector.remote_write import RemoteWrite
from gpufleet.collector.run_metrics import RunMetrics, RunMetricsRefresher
from gpufleet.collector.tls import client_cert_names
from gpufleet.collector.writer import GroupWriter
from gpufleet.config import Settings
from gpufleet.connguard import ConnectionGuard, Limits
from gpufleet.db.read_routing import StandbyLagMetrics, standby_lag
from gpufleet.httpauth import Authenticator
from gpufleet.metricsauth import MetricsGuard, read_token

log = logging.getLogger(__name__)

INGEST_DOC = """Store one batch of GPU and host samples from one node.

Body: JSON (`application/json`) or msgpack (`application/msgpack`), optionally
`Content-Encoding: gzip` or `zstd`.  See `gpufleet.wire` for the format.
Answers 200 only after the batch is committed; a retried `batch_id` (from the
same node) answers 200 with `status: duplicate` and is not stored twice."""

INGEST_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["batch_id", "node"],
                    "additionalProperties": False,
                    "properties": {
                        "batch_id": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                        "node": {"type": "string"},
                        "gpu": {"type": "object", "additionalProperties": {"type": "array"}},
                        "host": {"type": "object", "additionalProperties": {"type": "array"}},
                        "facts": {
                            "type": "object",
                            "description": "node facts; see gpufleet.facts.NodeFacts",
                        },
                        "agent": {"type": "object"},
                    },
                }
            },
            "application/msgpack": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    "responses": {
        "200": {"description": "committed (or a duplicate of a committed batch)"},
        "400": {"description": "unparseable body"},
        "401": {"description": "missing, invalid or revoked token"},
        "403": {"description": "token may not write this node"},
        "413": {"description": "body, decompressed body or sample count too large"},
        "422": {"description": "a sample is malformed; detail names the sample index and field"},
        "429": {"description": "overloaded or rate limited; see Retry-After"},
        "500": {"description": "the batch could not be written (it alone); not stored"},
        "503": {"description": "database or writer unavailable; see Retry-After"},
    },
}


#: Largest body any collector route other than ingest accepts (they take none), bytes.
OTHER_BODY_MAX = 64 * 1024


class CollectorState:
    def __init__(self, url: str, settings: Settings, sweep: SweepFn | None) -> None:
        self.url = url
        self.settings = settings
        self.metrics = CollectorMetrics()
        ing = settings.ingest
        self.writer = GroupWriter(
            url,
            max_rows=ing.group_max_rows,
            linger_s=ing.group_linger_s,
            linger_batches=ing.group_linger_batches,
            queue_max_rows=ing.queue_max_rows,
            threads=ing.writers,
        )
        self.pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=4,
            open=False,
            timeout=3,
            kwargs={"autocommit": True, "application_name": "gpufleet-collector"},
        )
        self.auth = Authenticator(self.pool, retry_after_s=ing.retry_after_s)
        self.ingest = IngestHandler(self.writer, ing, self.metrics)
        self.connection_ages = ConnectionAges(ing.max_connection_age_s, ing.keep_alive_s)
        shards = settings.detect.shards
        if shards > 1 and sweep is not None:  # every replica sweeps its share of the shards
            from gpufleet.collector.sweep import Sweeper

            self.leader = Leader(
                url, settings, self.metrics, shard_sweep=lambda k: Sweeper(settings, shard=k, shards=shards)
            )
        else:
            self.leader = Leader(url, settings, self.metrics, sweep=sweep)
        self.monitor = DbMonitor(url, self._db_changed)
        #: Prometheus remote write (``POST /api/v1/write``) and its assembler (``remote_write.assemble``).
        self.remote_write = RemoteWrite(url, settings, self.metrics.registry, self.metrics.rejected_skew)
        #: The per-run figures (gpufleet_run_*): computed by the leader, served by every replica.
        self.run_metrics = RunMetricsRefresher(
            url, settings.run_metrics, lambda: self.leader.is_leader, settings.accounting.max_gap_s
        )
        #: Where ``/metrics`` is rendered (see the route).
        self.scrapes = ThreadPoolExecutor(1, thread_name_prefix="gpufleet-metrics")

    def _db_changed(self, ok: bool) -> None:
        self.writer.mark_db(ok)
        self.metrics.db_up.set(1 if ok else 0)


class IngestFastPath:
    """Serves ``POST /v1/ingest`` without FastAPI's routing, dependency and
    middleware layers (a third of the CPU per request at fleet rates); every
    other path, and the OpenAPI description of this one, stay with FastAPI."""

    def __init__(self, app: FastAPI, state: CollectorState) -> None:
        self.app = app
        self.state = state
        # Bodies are bounded before anything reads them: ingest at its own limit, every other
        # route (they take no body) at a few KiB.
        self._bounded = BodyLimit(
            self._dispatch,
            default=OTHER_BODY_MAX,
            limits=[
                ("/v1/ingest", state.settings.ingest.max_body_bytes),
                (REMOTE_WRITE_PATH, state.settings.ingest.max_body_bytes),
            ],
        )
        #: Slow clients are let go (gpufleet.connguard; the collector's protocol finds this).
        self.connection_guard = ConnectionGuard(
            Limits.of(state.settings.ingest, state.settings.ingest.retry_after_s),
            on_cut=lambda reason: state.metrics.connections_cut.labels(reason).inc(),
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._bounded(scope, receive, send)

    @property
    def max_body_bytes(self) -> int:
        return self.state.settings.ingest.max_body_bytes

    def admits(self, authorization: bytes | None) -> bool:
        """Whether a shipment with this Authorization header may be read whole before its token
        is checked again: the token is cached as a node's."""
        return self.state.auth.cached_node(None if authorization is None else authorization.decode("latin-1"))

    def client_gone(self) -> None:
        """A shipment's client left before its body was whole: nothing was stored."""
        self.state.metrics.client_gone.inc()
        self.state.metrics.requests.labels(str(CLIENT_GONE)).inc()

    def closes(self, scope: dict[str, Any]) -> bool:
        """Whether this answer ends its connection (the connection has reached its age)."""
        if self.state.connection_ages.should_close(scope):
            self.state.metrics.connections_aged.inc()
            return True
        return False

    async def answer(self, scope: dict[str, Any], receive: Any) -> Response:
        """The answer to one shipment; also called by :mod:`gpufleet.collector.ingest_protocol`,
        which reads plain shipments on the connection itself."""
        request = Request(scope, receive)
        try:
            who = await self.state.auth.principal(request)
        except HTTPException as e:
            self.state.metrics.requests.labels(str(e.status_code)).inc()
            return JSONResponse({"detail": e.detail}, status_code=e.status_code, headers=e.headers)
        return await self.state.ingest.handle(request, who)

    async def _dispatch(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/ingest" and scope["method"] == "POST":
            if self.closes(scope):
                send = closing(send)
            response = await self.answer(scope, receive)
            await response(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == REMOTE_WRITE_PATH and scope["method"] == "POST":
            response = await self.remote_write(scope, receive)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def remote_write(self, scope: dict[str, Any], receive: Any) -> Response:
        request = Request(scope, receive)
        try:
            who = await self.state.auth.principal(request)
        except HTTPException as e:
            self.state.remote_write.metrics.requests.labels(str(e.status_code)).inc()
            return JSONResponse({"detail": e.detail}, status_code=e.status_code, headers=e.headers)
        return await self.state.remote_write.handle(request, who)


def create_app(url: str, settings: Settings, sweep: SweepFn | None = None, run_leader: bool = True) -> Any:
    state = CollectorState(url, settings, sweep)
    #: The standby of database.read_url, its lag measured here and shown on /metrics.
    standby = standby_lag(url, settings)
    if standby is not None:
        state.metrics.registry.register(StandbyLagMetrics(standby))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if standby is not None:
            standby.start()
        await state.pool.open(wait=False)
        await state.remote_write.open(assemble=settings.remote_write.assemble)
        state.writer.start()
        state.monitor.start()
        if run_leader:
            state.leader.start()
            if settings.run_metrics.enabled:
                state.run_metrics.start()
        try:
            yield
        finally:
            state.run_metrics.stop()
            state.leader.stop()
            state.monitor.stop()
            state.writer.stop()
            state.scrapes.shutdown(wait=False, cancel_futures=True)
            await state.remote_write.close()
            await state.pool.close()
            if standby is not None:
                standby.stop()

    app = FastAPI(title="gpufleet collector", version="1", lifespan=lifespan)
    app.state.collector = state
    m = settings.metrics
    guard = MetricsGuard(read_token(m.token, m.token_file, "metrics"), tuple(m.client_names))
    #: The fleet-wide series (open incidents, nodes, quarantine and run actions, the per-run figures of
    #: ``run_metrics``): read from the database, the same on every replica.  On ``/metrics`` unless
    #: ``metrics.fleet_on_metrics`` is off, and always alone on ``/metrics/fleet``.  That path is scraped through a balancer, each
    #: scrape landing on any replica: it reads the database every time, so that a replica's
    #: older cached read never follows a newer one and a counter never seems to go back.
    own: tuple[CollectorRegistry, ...] = (state.metrics.registry,)
    if m.fleet_on_metrics:
        fleet = CollectorRegistry(auto_describe=False)
        fleet.register(IncidentMetrics(url, redact=m.redact))
        if settings.run_metrics.enabled:
            fleet.register(RunMetrics(url, redact=m.redact))
        own += (fleet,)
    fleet_fresh = CollectorRegistry(auto_describe=False)
    fleet_fresh.register(IncidentMetrics(url, cache_s=0, redact=m.redact))
    if settings.run_metrics.enabled:
        fleet_fresh.register(RunMetrics(url, redact=m.redact, cache_s=0))

    async def principal(request: Request) -> Principal:
        return await state.auth.principal(request)

    @app.post("/v1/ingest", description=INGEST_DOC, openapi_extra=INGEST_OPENAPI, tags=["ingest"])
    async def ingest(request: Request, who: Principal = Depends(principal)) -> Response:
        return await state.ingest.handle(request, who)

    @app.post(
        REMOTE_WRITE_PATH,
        description=REMOTE_WRITE_DOC,
        openapi_extra=REMOTE_WRITE_OPENAPI,
        tags=["ingest"],
        status_code=204,
    )
    async def remote_write(request: Request, who: Principal = Depends(principal)) -> Response:
        return await state.remote_write.handle(request, who)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Readiness: the database accepts writes (false within ~2 s of an outage)
        and every writer thread is alive (false from a writer's crash to its restart)."""
        db = state.monitor.ok and state.writer.db_ok
        writer = state.writer.healthy
        ok = db and writer
        body = {
            "ready": ok,
            "database": db,
            "writer": writer,
            "leader": state.leader.is_leader,
            "queued_rows": state.writer.queued_rows,
        }
        return JSONResponse(
            body,
            status_code=200 if ok else 503,
            headers=None if ok else {"Retry-After": str(settings.ingest.retry_after_s)},
        )

    def page(*registries: CollectorRegistry) -> bytes:
        return b"".join(generate_latest(r) for r in registries)

    async def exposition(request: Request, *registries: CollectorRegistry) -> Response:
        refused = guard.refusal(request.headers.get("authorization"), client_cert_names(request.scope))
        if refused is not None:
            status, detail, headers = refused
            return JSONResponse({"detail": detail}, status_code=status, headers=headers)
        # Off the event loop: the fleet's series are read from the database, and a scrape
        # waiting on it must not hold every agent's shipment meanwhile.  One thread, so
        # scrapes never overlap and a stuck database ties up that thread only.
        body = await asyncio.get_running_loop().run_in_executor(state.scrapes, page, *registries)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics", tags=["health"])
    async def metrics(request: Request) -> Response:
        """Prometheus exposition of this replica, with the fleet's series unless ``metrics.fleet_on_metrics``
        is off; a bearer token and/or a client certificate when ``metrics`` says so."""
        state.metrics.queue_rows.set(state.writer.queued_rows)
        return await exposition(request, *own)

    @app.get("/metrics/fleet", tags=["health"])
    async def fleet_metrics(request: Request) -> Response:
        """The fleet's series alone (open incidents, nodes last seen, skew refusals, quarantine and run
        actions, the per-run figures): the same from every replica, so one scrape through the balancer
        carries them for all."""
        return await exposition(request, fleet_fresh)

    return IngestFastPath(app, state)
