"""``POST /v1/ingest``: from request bytes to a committed batch.

Order matters: authenticate before reading the body, cap the body while
reading it, cap decompression, validate everything, authorise the node, then
hand the batch to the group-commit writer and answer only after COMMIT.  Any
refusal happens before a single row is written, so a batch lands whole or not
at all.

Whatever one request contains fails that request alone: a parser or
validator error the wire module did not foresee answers 422 (it is the
input's fault), a write that fails answers 500 or 503, and an answer never
waits longer than ``write_wait_s`` for the writer (503 then: the batch may or
may not have landed, and a retry is harmless since batch ids are idempotent).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from gpufleet.auth import AccessDenied, Principal
from gpufleet.collector import ingest_bounds
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.tls import client_cert_names
from gpufleet.collector.writer import BatchRejected, DatabaseUnavailable, GroupWriter, Overloaded, WriteFailed
from gpufleet.config import IngestSettings
from gpufleet.httpauth import RateLimiter
from gpufleet.wire import (
    ParseLimits,
    TooLarge,
    Unreadable,
    WireError,
    decompress,
    drop_skewed,
    parse,
    validate,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The status recorded for a request whose client left before its body was whole (as nginx records it).
CLIENT_GONE = 499

#: The answer to each kind of refused batch (:attr:`gpufleet.wire.WireError.kind`).
STATUS = {"invalid": 422, "unreadable": 400, "unsupported": 415, "too_large": 413, "wrong_node": 403}


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read at most ``max_bytes``; a larger body (declared or chunked) is a 413."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise Unreadable("Content-Length is not a number", ("Content-Length",)) from None
        if n > max_bytes:
            raise TooLarge(f"body of {n} bytes exceeds the {max_bytes}-byte limit")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise TooLarge(f"body exceeds the {max_bytes}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def wait_at_most(fut: asyncio.Future[T], timeout: float) -> T:
    """``fut``'s result, or TimeoutError after ``timeout`` seconds with ``fut`` left running.

    What ``wait_for(shield(fut), timeout)`` does, without its wrapping future and
    task machinery: every shipment waits this way, and on uvloop this costs 3.3 µs
    against 5.5 (``bench/request_cpu.py`` prints both).  Cancelling the waiter leaves
    ``fut`` alone, as shield does.
    """
    if not fut.done():
        waiter = fut.get_loop().create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = waiter.get_loop().call_later(timeout, wake)
        fut.add_done_callback(wake)
        try:
            await waiter
        finally:
            timer.cancel()
            fut.remove_done_callback(wake)
        if not fut.done():
            raise TimeoutError
    return fut.result()


def stored_answer(batch_id: str, status: str, gpu_rows: int, host_rows: int, rejected_skew: int) -> Response:
    """The JSON answer to an accepted shipment, formatted directly: a batch id is
    validated to ``[A-Za-z0-9._:-]``, which JSON needs no escape for, so this is
    what ``JSONResponse`` would send, without its encoder on every shipment."""
    return Response(
        b'{"batch_id":"%s","status":"%s","gpu_rows":%d,"host_rows":%d,"rejected_skew":%d}'
        % (batch_id.encode("ascii"), status.encode("ascii"), gpu_rows, host_rows, rejected_skew),
        media_type="application/json",
    )


def _error(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


class IngestHandler:
    #: Longest a request waits for the writer's answer, seconds.  Bounds how
    #: long a stopping collector (SIGTERM) can be held by in-flight requests.
    write_wait_s = 30.0

    def __init__(self, writer: GroupWriter, settings: IngestSettings, metrics: CollectorMetrics) -> None:
        self.writer = writer
        self.settings = settings
        self.metrics = metrics
        self.limiter = RateLimiter(settings.rate_limit_per_s)
        self.limits = ParseLimits.for_samples(settings.max_samples_per_batch)
        # The series every accepted shipment moves, looked up once (a labels() call costs
        # four times the increment it precedes).
        self._answered_ok = metrics.requests.labels("200")
        self._gpu_samples = metrics.samples.labels("gpu")
        self._host_samples = metrics.samples.labels("host")

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    async def handle(self, request: Request, principal: Principal) -> Response:
        t0 = time.perf_counter()
        resp = await self._handle(request, principal)
        (
            self._answered_ok
            if resp.status_code == 200
            else self.metrics.requests.labels(str(resp.status_code))
        ).inc()
        self.metrics.latency.observe(time.perf_counter() - t0)
        return resp

    async def _handle(self, request: Request, principal: Principal) -> Response:
        s = self.settings
        try:
            principal.require("ingest")
        except AccessDenied as e:
            self.metrics.errors.labels("forbidden").inc()
            return _error(403, str(e))
        try:
            principal.require_certificate(client_cert_names(request.scope))
        except AccessDenied as e:
            self.metrics.errors.labels("wrong_certificate").inc()
            return _error(403, str(e))
        if not self.limiter.allow(principal.token_id):
            self.metrics.errors.labels("rate_limited").inc()
            return _error(429, "rate limit exceeded for this token", self._retry())
        if not self.writer.db_ok:
            self.metrics.errors.labels("db_down").inc()
            return _error(503, "database unavailable; retry later", self._retry())
        try:
            body = await read_body(request, s.max_body_bytes)
            raw = decompress(body, request.headers.get("content-encoding"), s.max_decompressed_bytes)
            del body
            doc = parse(raw, request.headers.get("content-type"), self.limits)
            del raw
            batch = validate(doc)
        except ClientDisconnect:
            # The node went away mid-upload (restarted, timed out, network cut): nothing was
            # stored and its agent sends the batch again; not a refusal, and not a crash of
            # the app. Answered with 499 (a client that closed its request), to nobody.
            self.metrics.client_gone.inc()
            return _error(CLIENT_GONE, "the client disconnected before its body was read; nothing was stored")
        except WireError as e:
            self.metrics.errors.labels("too_large" if e.kind == "too_large" else "malformed").inc()
            return _error(STATUS[e.kind], [e.detail()])
        except (RecursionError, MemoryError, TypeError, ValueError, OverflowError, KeyError, IndexError) as e:
            # A shape the validator did not foresee: still the input's fault.
            log.warning("ingest: unexpected %s while validating a batch: %s", e.__class__.__name__, e)
            self.metrics.errors.labels("malformed").inc()
            return _error(
                422, [{"loc": ["body"], "msg": f"batch could not be validated ({e.__class__.__name__})"}]
            )
        if batch.node != principal.node:
            self.metrics.errors.labels("wrong_node").inc()
            return _error(403, f"this token may write node {principal.node!r} only, not {batch.node!r}")
        if batch.n_gpu + batch.n_host > s.max_samples_per_batch:
            self.metrics.errors.labels("too_many_samples").inc()
            return _error(
                413,
                f"{batch.n_gpu + batch.n_host} samples exceed the "
                f"{s.max_samples_per_batch}-sample batch limit",
            )
        try:
            ingest_bounds.check(batch, s.max_gpu_index, s.max_runs_per_batch)
        except WireError as e:
            self.metrics.errors.labels("out_of_bounds").inc()
            return _error(STATUS[e.kind], [e.detail()])
        drop_skewed(batch, time.time(), s.future_grace_s, s.past_grace_s)
        if batch.rejected_skew:
            self.metrics.rejected_skew.labels(batch.node).inc(batch.rejected_skew)
        try:
            fut = self.writer.submit(batch)
        except Overloaded as e:
            self.metrics.errors.labels("overloaded").inc()
            return _error(429, f"collector busy: {e}; retry later", self._retry())
        except DatabaseUnavailable:
            self.metrics.errors.labels("db_down").inc()
            return _error(503, "database unavailable; retry later", self._retry())
        self.metrics.queue_rows.set(self.writer.queued_rows)
        try:
            outcome = await wait_at_most(fut, self.write_wait_s)
        except TimeoutError:
            self.metrics.errors.labels("db_down").inc()
            return _error(
                503,
                f"the batch was not confirmed within {self.write_wait_s:g} s; retry later "
                "(a retry is never stored twice)",
                self._retry(),
            )
        except WriteFailed as e:
            self.metrics.errors.labels("write_failed").inc()
            return _error(500, f"{e}; the batch was not stored")
        except DatabaseUnavailable:
            self.metrics.errors.labels("db_down").inc()
            return _error(503, "database unavailable; the batch was not stored, retry later", self._retry())
        except BatchRejected as e:
            self.metrics.errors.labels("db_refused").inc()
            return _error(422, [{"loc": ["body"], "msg": str(e)}])
        if outcome.stored:
            self._gpu_samples.inc(outcome.gpu_rows)
            self._host_samples.inc(outcome.host_rows)
            if outcome.energy_glitches:
                self.metrics.energy_glitches.labels(batch.node).inc(outcome.energy_glitches)
        else:
            self.metrics.duplicates.inc()
        return stored_answer(
            batch.batch_id,
            "stored" if outcome.stored else "duplicate",
            outcome.gpu_rows,
            outcome.host_rows,
            outcome.rejected_skew,
        )
