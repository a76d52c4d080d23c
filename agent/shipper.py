"""Sends sealed spool segments to the collector, oldest first, until each is acknowledged or refused.

What the collector's answer means for a segment:

* **2xx** (``stored`` or ``duplicate``): delivered; the segment is deleted.
* **400, 401, 403, 404, 413, 422** and other 4xx: the batch will never be
  accepted as it is; it was sent once, is moved to the dead-letter folder,
  counted, and the next segment goes.
* **408, 425, 429, 5xx, 3xx, timeouts, connection errors**: the collector (or
  the path to it) is unwell; the same segment is retried after a capped
  exponential backoff with full jitter (a random wait between 0 and
  ``min(retry_max_s, retry_base_s * 2**attempt)``), or after ``Retry-After``
  plus a random share of it when the collector says how long.  Randomised
  waits keep a fleet that lost its collector from reconnecting in lockstep.

A segment leaves the spool only through :meth:`Spool.ack` (2xx) or
:meth:`Spool.dead_letter` (final refusal).
"""

from __future__ import annotations

import email.utils
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import httpx

from gpufleet.agent.batch import BODY_HEADERS
from gpufleet.agent.metrics import AgentMetrics
from gpufleet.agent.ratelog import RateLimitedLog
from gpufleet.agent.spool import CorruptSegment, Segment, Spool

log = logging.getLogger(__name__)

#: A Retry-After beyond this is treated as this, seconds (a bogus header must not stall an agent for days).
MAX_RETRY_AFTER_S = 600.0
#: Statuses that mean "try again later" although they are 4xx.
RETRYABLE_4XX = frozenset({408, 425, 429})


class Verdict(Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"


@dataclass
class Attempt:
    """The result of one send of one segment."""

    verdict: Verdict
    #: HTTP status, or the error class name for a transport failure.
    status: str
    detail: str = ""
    retry_after_s: float | None = None


def classify(status: int) -> Verdict:
    if 200 <= status < 300:
        return Verdict.DELIVERED
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return Verdict.DEAD
    return Verdict.RETRY


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        secs = when.timestamp() - (time.time() if now is None else now)
    return min(max(0.0, secs), MAX_RETRY_AFTER_S)


class Backoff:
    """Capped exponential backoff with full jitter; ``Retry-After`` sets a floor."""

    def __init__(self, base_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.rng = rng or random.Random()
        self.attempt = 0

    def next_delay(self, retry_after_s: float | None = None) -> float:
        ceiling = min(self.max_s, self.base_s * 2 ** min(self.attempt, 30))
        self.attempt += 1
        if retry_after_s is not None:
            return retry_after_s + self.rng.uniform(0, max(retry_after_s * 0.5, self.base_s))
        return self.rng.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


def tls_context(
    ca_file: Path | None, client_cert: Path | None, client_key: Path | None
) -> ssl.SSLContext | bool:
    """The ``verify`` argument for httpx: True (system CAs) or a context with our CA and client cert."""
    if ca_file is None and client_cert is None:
        return True
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if client_cert is not None:
        ctx.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
    return ctx


class Shipper:
    """Drains the spool into ``POST {collector_url}/v1/ingest`` on its own thread."""

    def __init__(
        self,
        spool: Spool,
        collector_url: str,
        token: str | None,
        *,
        timeout_s: float = 10.0,
        keepalive_s: float = 20.0,
        retry_base_s: float = 0.5,
        retry_max_s: float = 60.0,
        verify: ssl.SSLContext | bool = True,
        metrics: AgentMetrics | None = None,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool = spool
        self.url = collector_url.rstrip("/") + "/v1/ingest"
        self.timeout_s = timeout_s
        self.metrics = metrics if metrics is not None else spool.metrics
        self.backoff = Backoff(retry_base_s, retry_max_s, rng)
        self._wall = wall
        self._mono = mono
        headers = dict(BODY_HEADERS)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # One connection, kept between shipments: httpx's default 5-s idle expiry equals the
        # ship interval, so without this about every shipment would open a connection (and
        # over TLS do a handshake) or race the collector closing the old one.
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=keepalive_s)
        self.client = httpx.Client(
            headers=headers, verify=verify, timeout=timeout_s, follow_redirects=False, limits=limits
        )
        self._ratelog = RateLimitedLog(log)
        self._stop = threading.Event()
        self._drain_until: float | None = None
        self._thread: threading.Thread | None = None

    # -- one send ----------------------------------------------------------------------------

    def send(self, seg: Segment, body: bytes, timeout_s: float | None = None) -> Attempt:
        """POST one segment's body and classify the answer (no spool changes)."""
        timeout = self.timeout_s if timeout_s is None else max(0.1, timeout_s)
        try:
            resp = self.client.post(self.url, content=body, timeout=timeout)
        except httpx.TimeoutException as e:
            return Attempt(Verdict.RETRY, "timeout", f"{type(e).__name__}: {e}")
        except httpx.TransportError as e:
            return Attempt(Verdict.RETRY, "connection", f"{type(e).__name__}: {e}")
        verdict = classify(resp.status_code)
        detail = "" if verdict is Verdict.DELIVERED else resp.text[:2000]
        if verdict is Verdict.DELIVERED:
            try:
                doc = resp.json()
            except ValueError:
                doc = None
            status = doc.get("status") if isinstance(doc, dict) else None
            return Attempt(verdict, status if status in ("stored", "duplicate") else "stored")
        return Attempt(
            verdict, str(resp.status_code), detail, parse_retry_after(resp.headers.get("retry-after"))
        )

    def ship_one(self, timeout_s: float | None = None) -> Attempt | None:
        """Send the oldest sealed segment and act on the answer; None when the spool is empty."""
        seg = self.spool.lease()
        if seg is None:
            return None
        try:
            body = self.spool.read(seg)
        except CorruptSegment as e:
            log.error("shipper: %s; moved to dead letters", e)
            self.spool.dead_letter(seg, "corrupt", str(e), corrupt=True)
            return Attempt(Verdict.DEAD, "corrupt", str(e))
        except OSError as e:
            self.spool.release(seg)
            self._ratelog.log(logging.ERROR, "read", "shipper: cannot read %s: %s", seg.path, e)
            return Attempt(Verdict.RETRY, "read_error", str(e))
        attempt = self.send(seg, body, timeout_s)
        if attempt.verdict is Verdict.DELIVERED:
            self.spool.ack(seg)
            self.backoff.reset()
            self.metrics.batches_sent.labels(attempt.status).inc()
            self.metrics.last_ship_success.set(self._wall())
        elif attempt.verdict is Verdict.DEAD:
            self._ratelog.log(
                logging.ERROR,
                f"dead:{attempt.status}",
                "shipper: collector refused batch %s (%d samples) with %s: %s; moved to dead letters",
                seg.batch_id,
                seg.samples,
                attempt.status,
                attempt.detail[:300],
            )
            self.spool.dead_letter(seg, attempt.status, attempt.detail)
        else:
            self.spool.release(seg)
            self.metrics.batches_retried.labels(attempt.status).inc()
            self._ratelog.log(
                logging.WARNING,
                f"retry:{attempt.status}",
                "shipper: batch %s not delivered (%s%s); will retry",
                seg.batch_id,
                attempt.status,
                f": {attempt.detail[:200]}" if attempt.detail else "",
            )
        return attempt

    # -- the thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="shipper", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Ship until stopped; in drain mode, until the spool is empty, a retry is needed, or the deadline."""
        while not self._stop.is_set():
            drain_until = self._drain_until
            if drain_until is not None:
                left = drain_until - self._mono()
                if left <= 0:
                    return
                attempt = self.ship_one(timeout_s=min(self.timeout_s, left))
                if attempt is None or attempt.verdict is Verdict.RETRY:
                    return
                continue
            attempt = self.ship_one()
            if attempt is None:
                self.spool.wait_for_sealed(1.0)
            elif attempt.verdict is Verdict.RETRY:
                delay = self.backoff.next_delay(attempt.retry_after_s)
                self._wait(delay)

    def _wait(self, delay: float) -> None:
        """Sleep ``delay`` unless stopped or asked to drain (which retries at once)."""
        end = self._mono() + delay
        while not self._stop.is_set() and self._drain_until is None:
            left = end - self._mono()
            if left <= 0:
                return
            self._stop.wait(min(left, 0.2))

    def drain(self, deadline_s: float) -> bool:
        """Ship what is sealed for at most ``deadline_s`` (no backoff), then stop; True when the spool emptied."""
        self._drain_until = self._mono() + deadline_s
        self.spool.wake()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(deadline_s + 1.0)
        else:
            self.run()
        self._stop.set()
        return self.spool.sealed_count == 0

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self.spool.wake()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        self.stop()
        self.client.close()
