"""``POST /api/v1/write``: Prometheus remote write 1.0 into the collector.

A Prometheus (or Grafana Agent, Alloy, vmagent) that already scrapes
dcgm-exporter and node_exporter feeds gpufleet with one ``remote_write``
block and no agent on the node::

    remote_write:
      - url: https://collector.example:8410/api/v1/write
        authorization: {credentials_file: /etc/prometheus/gpufleet-token}   # a remote_write token

Order matters, as on ``/v1/ingest``: the token (role ``remote_write``, which
may write any node; every other role is refused), the body's size, snappy
with its declared length bounded, the protobuf, then every sample checked
against the catalog -- a malformed request is answered 400 with the reason
and nothing of it is stored, so Prometheus drops it instead of retrying it
for ever.  What passes is committed as pieces (:mod:`.remote_write_store`)
before the answer, 204; the database down, or the assembler too far behind,
is 503 with ``Retry-After`` (Prometheus retries 5xx), a token over its rate
429.  Series gpufleet does not read are counted by reason
(``gpufleet_remote_write_dropped_samples_total``) and dropped.

Only remote write 1.0 is spoken: a 2.0 body (``proto=io.prometheus.write.v2.Request``)
is answered 415, which tells a 2.0 sender to fall back to 1.0.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.requests import ClientDisconnect

from gpufleet.auth import AccessDenied, Principal
from gpufleet.collector.ingest import CLIENT_GONE, read_body
from gpufleet.collector.remote_write_pieces import map_request
from gpufleet.collector.remote_write_proto import RemoteWriteError, SeriesCache, decode, decompress
from gpufleet.collector.remote_write_series import SeriesPlans
from gpufleet.collector.remote_write_store import STAGE_SQL, Assembler, Cycle, stage_params
from gpufleet.config import Settings
from gpufleet.httpauth import RateLimiter
from gpufleet.wire import TooLarge

log = logging.getLogger(__name__)

PATH = "/api/v1/write"
#: The message names a sender may put in ``Content-Type: application/x-protobuf;proto=...`` for 1.0.
V1_MESSAGES = ("", "prometheus.WriteRequest")

DOC = """Prometheus remote write 1.0: a snappy-compressed protobuf `WriteRequest` (Content-Type
`application/x-protobuf`, Content-Encoding `snappy`).  dcgm-exporter series become GPU rows and
node_exporter counters host rows, as an agent would send them; other series are counted and dropped.
Answers 204 once committed.  Needs a token of role `remote_write`."""

OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/x-protobuf": {"schema": {"type": "string", "format": "binary"}}},
    },
    "responses": {
        "204": {"description": "committed"},
        "400": {
            "description": "malformed: not snappy, not a WriteRequest, or a sample the catalog refuses; "
            "nothing stored"
        },
        "401": {"description": "missing, invalid or revoked token"},
        "403": {"description": "the token's role is not remote_write"},
        "413": {"description": "body or decompressed body too large"},
        "415": {"description": "not remote write 1.0 (protobuf, snappy)"},
        "429": {"description": "rate limited; see Retry-After"},
        "503": {"description": "database unavailable or rows not assembled fast enough; see Retry-After"},
    },
}


class RemoteWriteMetrics:
    """The remote-write series of the collector's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "gpufleet_remote_write_requests", "Remote-write requests by HTTP status", ["code"], registry=r
        )
        self.samples = Counter(
            "gpufleet_remote_write_samples",
            "Remote-write samples committed (as pieces), by kind",
            ["kind"],
            registry=r,
        )
        self.dropped = Counter(
            "gpufleet_remote_write_dropped_samples",
            "Remote-write samples not used, by reason: unused (a series gpufleet does not read), stale (a "
            "staleness marker), no_node (no node label), no_gpu (a GPU series without a gpu label), histogram",
            ["reason"],
            registry=r,
        )
        self.groups = Counter(
            "gpufleet_remote_write_groups",
            "(node, time) groups assembled, by outcome: stored; duplicate (already stored: a retry, or pieces "
            "later than remote_write.merge_delay_s); empty (no row); failed (pieces that do not read)",
            ["outcome"],
            registry=r,
        )
        self.rows = Counter(
            "gpufleet_remote_write_rows", "Rows stored from remote write, by kind", ["kind"], registry=r
        )
        self.pending = Gauge(
            "gpufleet_remote_write_pending_parts",
            "Pieces waiting for their (node, time) to be assembled",
            registry=r,
        )
        self.latency = Histogram(
            "gpufleet_remote_write_latency_seconds",
            "Remote-write request latency until commit",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )

    def cycle(self, done: Cycle, pending: int) -> None:
        for outcome in ("stored", "duplicate", "empty", "failed"):
            n = getattr(
                done,
                {"stored": "stored", "duplicate": "duplicates", "empty": "empty", "failed": "failed"}[
                    outcome
                ],
            )
            if n:
                self.groups.labels(outcome).inc(n)
        if done.gpu_rows:
            self.rows.labels("gpu").inc(done.gpu_rows)
        if done.host_rows:
            self.rows.labels("host").inc(done.host_rows)
        self.pending.set(pending)


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def media_error(content_type: str | None, content_encoding: str | None) -> str | None:
    """Why the body is not remote write 1.0 by its headers, or None."""
    if (content_encoding or "").strip().lower() != "snappy":
        return f"Content-Encoding must be snappy, not {content_encoding or 'none'}"
    if content_type is None:
        return None
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "application/x-protobuf":
        return f"Content-Type must be application/x-protobuf, not {media.strip()}"
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "proto" and value.strip().strip('"') not in V1_MESSAGES:
            return (
                f"only remote write 1.0 (prometheus.WriteRequest) is spoken, not {value.strip()}; "
                "set protobuf_message: prometheus.WriteRequest"
            )
    return None


class RemoteWrite:
    """The handler, its pool and the assembler of one collector process."""

    def __init__(
        self, url: str, settings: Settings, registry: CollectorRegistry, rejected_skew: Counter | None = None
    ) -> None:
        self.settings = settings
        rw = settings.remote_write
        ing = settings.ingest
        self.plans = SeriesPlans(node_labels=tuple(rw.node_labels), max_gpu_index=ing.max_gpu_index)
        targets = self.plans.targets
        self.cache: SeriesCache[int] = SeriesCache(self.plans.plan, target_of=targets.__getitem__)
        self.metrics = RemoteWriteMetrics(registry)
        self.rejected_skew = rejected_skew
        self.limiter = RateLimiter(settings.ingest.rate_limit_per_s)
        self.pool = AsyncConnectionPool(
            url,
            min_size=0,
            max_size=4,
            open=False,
            timeout=5,
            kwargs={"autocommit": True, "application_name": "gpufleet-remote-write"},
        )
        self.assembler = Assembler(
            url,
            merge_delay_s=rw.merge_delay_s,
            every_s=rw.assemble_every_s,
            on_cycle=self.metrics.cycle,
            max_gpu_index=ing.max_gpu_index,
            max_runs=ing.max_runs_per_batch,
        )
        self._kinds = (self.metrics.samples.labels("gpu"), self.metrics.samples.labels("host"))

    async def open(self, assemble: bool) -> None:
        await self.pool.open(wait=False)
        if assemble:
            self.assembler.start()

    async def close(self) -> None:
        self.assembler.stop()
        await self.pool.close()

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.ingest.retry_after_s)}

    async def handle(self, request: Request, principal: Principal) -> Response:
        t0 = time.perf_counter()
        resp = await self._handle(request, principal)
        self.metrics.requests.labels(str(resp.status_code)).inc()
        self.metrics.latency.observe(time.perf_counter() - t0)
        return resp

    async def _handle(self, request: Request, principal: Principal) -> Response:
        s = self.settings.ingest
        try:
            principal.require("remote_write")
        except AccessDenied as e:
            return _error(403, str(e))
        if not self.limiter.allow(principal.token_id):
            return _error(429, "rate limit exceeded for this token", self._retry())
        if self.assembler.pending > self.settings.remote_write.max_pending_parts:
            return _error(
                503, f"{self.assembler.pending} pieces wait to be assembled; retry later", self._retry()
            )
        refused = media_error(request.headers.get("content-type"), request.headers.get("content-encoding"))
        if refused is not None:
            return _error(415, refused)
        try:
            body = await read_body(request, s.max_body_bytes)
            raw = decompress(body, s.max_decompressed_bytes)
            del body
            decoded = decode(raw, self.cache)
            del raw
            mapped = map_request(
                decoded, self.plans, time.time(), s.future_grace_s, s.past_grace_s, s.max_runs_per_batch
            )
        except ClientDisconnect:
            return _error(CLIENT_GONE, "the client disconnected before its body was read; nothing was stored")
        except TooLarge as e:
            return _error(413, e.msg)
        except RemoteWriteError as e:
            return _error(400, f"{e}; nothing of this request was stored")
        for reason, n in mapped.dropped.items():
            self.metrics.dropped.labels(reason).inc(n)
        if self.rejected_skew is not None:
            for node, n in mapped.skewed.items():
                self.rejected_skew.labels(node).inc(n)
        if mapped.pieces:
            try:
                async with self.pool.connection() as conn:
                    await conn.execute(STAGE_SQL, stage_params(mapped.pieces))
            except (TimeoutError, psycopg.OperationalError, PoolTimeout) as e:
                log.warning("remote write: staging failed (%s); answering 503", e.__class__.__name__)
                return _error(503, "database unavailable; nothing was stored, retry later", self._retry())
            except psycopg.Error as e:
                log.error("remote write: the database refused a request's pieces: %s", e)
                return _error(500, "the request could not be stored; nothing was stored")
        if mapped.gpu_samples:
            self._kinds[0].inc(mapped.gpu_samples)
        if mapped.host_samples:
            self._kinds[1].inc(mapped.host_samples)
        return Response(status_code=204)
