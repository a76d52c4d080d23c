"""Connection hygiene for the collector's and the API's HTTP servers: slow clients are let go.

uvicorn holds a connection for as long as its client keeps it open: it times
out an idle connection between requests (``timeout_keep_alive``) but not a
request that is being sent.  A hundred connections each sending a header
line now and then, and sixteen node connections each sending an 8 MiB body
one byte short, stayed open as long as their clients wished, and the
collector grew from 116 to 246 MB.  The protocol mixin here (for uvicorn's
httptools protocol, which both servers run) bounds, per server:

* **headers**: a connection must send a request's headers within
  ``header_timeout_s`` of connecting or of the request's first byte;
* **bodies**: a request's body must arrive within ``body_timeout_s`` of its
  headers;
* **bodies in flight**: the declared bodies of the requests being received
  (and a chunked body's bytes so far) add up to at most
  ``max_body_bytes_in_flight``; a request beyond it answers 503 with
  ``Retry-After`` at once and its connection closes, so memory does not grow
  with the number of senders;
* **slow connections per address before headers**: an address may hold
  ``max_pending_per_ip`` connections whose request headers have been
  incomplete for longer than :data:`SLOW_AFTER_S` (the part of the server
  anyone can reach without a token); while it does, another connection of
  that address is closed as soon as it opens.  A burst of honest
  connections (300 agents behind one address reconnecting at once) is never
  slow that long and is not refused.

A connection cut for any of these is counted by reason (:class:`ConnectionGuard`,
and the collector's ``gpufleet_http_connections_cut``).  The limits come from
the app the server runs: the protocol finds a :class:`ConnectionGuard` as the
``connection_guard`` attribute of the app or of an app it wraps; without one
it behaves as uvicorn's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

#: How long a connection answered 503 for the body budget is read (and what arrives dropped) before it
#: is closed, seconds.
LINGER_S = 2.0
#: A connection whose request headers are incomplete for longer than this counts against its
#: address's ``max_pending_per_ip``, seconds.
SLOW_AFTER_S = 1.0
#: Why a connection was cut (the counters' keys).
REASONS = ("header_timeout", "body_timeout", "bodies_in_flight", "pending_per_ip")


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_body_bytes_in_flight: int = 128 * 1024 * 1024
    max_pending_per_ip: int = 64
    retry_after_s: int = 2
    #: The largest body any route of the server reads: a request declaring more is answered 413 by the
    #: app's body limit without a byte read, so it holds at most this much of the budget.
    max_request_bytes: int = 16 * 1024 * 1024

    @classmethod
    def of(cls, settings: Any, retry_after_s: int = 2) -> Limits:
        """The limits of an ``IngestSettings`` or ``ApiSettings`` (fields of the same names)."""
        return cls(
            settings.header_timeout_s,
            settings.body_timeout_s,
            settings.max_body_bytes_in_flight,
            settings.max_pending_connections_per_ip,
            retry_after_s,
            settings.max_body_bytes,
        )


@dataclass
class ConnectionGuard:
    """The state one server's connections share: bodies in flight, pending connections per address, and
    counts of what was cut.  Used from the event loop's thread only."""

    limits: Limits
    #: Called with a reason of :data:`REASONS` whenever a connection is cut.
    on_cut: Callable[[str], None] | None = None
    in_flight_bytes: int = 0
    #: Per address, its connections waiting for request headers and since when (monotonic), oldest first.
    pending: dict[str, dict[int, float]] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))

    def count(self, reason: str) -> None:
        self.cut[reason] += 1
        if self.on_cut is not None:
            self.on_cut(reason)

    def slow(self, ip: str, now: float) -> int:
        """How many of ``ip``'s connections have waited for headers longer than :data:`SLOW_AFTER_S`
        (counted up to the limit, oldest first: a burst of young ones costs nothing)."""
        n = 0
        for since in self.pending.get(ip, {}).values():
            if now - since <= SLOW_AFTER_S or n >= self.limits.max_pending_per_ip:
                break
            n += 1
        return n

    def pend(self, ip: str, conn: int, now: float) -> None:
        waiting = self.pending.setdefault(ip, {})
        waiting.pop(conn, None)
        waiting[conn] = now

    def unpend(self, ip: str, conn: int) -> None:
        waiting = self.pending.get(ip)
        if waiting is not None:
            waiting.pop(conn, None)
            if not waiting:
                del self.pending[ip]

    def reserve(self, n: int) -> bool:
        if n and self.in_flight_bytes + n > self.limits.max_body_bytes_in_flight:
            return False
        self.in_flight_bytes += n
        return True

    def release(self, n: int) -> None:
        self.in_flight_bytes = max(0, self.in_flight_bytes - n)


def find_guard(app: Any) -> ConnectionGuard | None:
    """The :class:`ConnectionGuard` of ``app`` or of an app it wraps (uvicorn's middleware, the collector's
    fast path), if any."""
    for _ in range(8):
        if app is None:
            return None
        guard = getattr(app, "connection_guard", None)
        if isinstance(guard, ConnectionGuard):
            return guard
        app = getattr(app, "app", None)
    return None


class GuardMixin:
    """Put before uvicorn's ``HttpToolsProtocol`` in the bases (module docstring)."""

    app: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    parser: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = find_guard(self.app)
        self._ip = ""
        self._pending = False
        self._reserved = 0
        self._chunked = False
        self._timer: asyncio.TimerHandle | None = None
        #: The current request was refused here: the parser's callbacks for it are ignored.
        self._refused = False
        #: Answered and shut for writing: what the client still sends is dropped unread.
        self._lingering = False

    # -- the connection -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        g = self._guard
        if g is None:
            return
        peer = transport.get_extra_info("peername")
        self._ip = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        now = self.loop.time()
        if g.slow(self._ip, now) >= g.limits.max_pending_per_ip:
            g.count("pending_per_ip")
            self._refused = True
            transport.close()
            return
        g.pend(self._ip, id(self), now)
        self._pending = True
        self._arm(g.limits.header_timeout_s, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle()
        super().connection_lost(exc)  # type: ignore[misc]

    def _settle(self) -> None:
        """Give back what the connection holds: its pending place, its reserved bytes, its timer."""
        self._disarm()
        if self._guard is not None:
            if self._pending:
                self._guard.unpend(self._ip, id(self))
                self._pending = False
            if self._reserved:
                self._guard.release(self._reserved)
                self._reserved = 0

    def _arm(self, after_s: float, reason: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(after_s, self._expire, reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, reason: str) -> None:
        self._timer = None
        if self._guard is not None and not self.transport.is_closing():
            self._guard.count(reason)
            self.transport.close()

    # -- a request ---------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        g = self._guard
        if g is None:
            return
        self._refused = False
        self._chunked = False
        if not self._pending:  # a keep-alive connection's next request
            self._pending = True
            g.pend(self._ip, id(self), self.loop.time())
        self._arm(g.limits.header_timeout_s, "header_timeout")

    def on_headers_complete(self) -> None:
        g = self._guard
        if g is None:
            super().on_headers_complete()  # type: ignore[misc]
            return
        self._disarm()
        if self._pending:
            g.unpend(self._ip, id(self))
            self._pending = False
        declared = 0
        for name, value in getattr(self, "headers", None) or ():
            if name == b"content-length" and value.isdigit():
                declared = max(declared, int(value))
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
        declared = min(declared, g.limits.max_request_bytes)
        if not g.reserve(declared):
            g.count("bodies_in_flight")
            self._refuse_busy(g)
            return
        self._reserved += declared
        if declared or self._chunked:
            self._arm(g.limits.body_timeout_s, "body_timeout")
        super().on_headers_complete()  # type: ignore[misc]

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        g = self._guard
        if g is not None and self._chunked:
            if not g.reserve(len(body)):
                g.count("bodies_in_flight")
                self._refused = True
                self.transport.close()
                return
            self._reserved += len(body)
        super().on_body(body)  # type: ignore[misc]

    def on_message_complete(self) -> None:
        if self._refused:
            return
        if self._guard is not None:
            self._disarm()
        super().on_message_complete()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        if self._guard is not None and self._reserved:
            self._guard.release(self._reserved)
            self._reserved = 0
        super().on_response_complete()  # type: ignore[misc]

    def _refuse_busy(self, g: ConnectionGuard) -> None:
        """503 on the connection itself, before any app sees the request, then close it.

        The client is likely still sending its body: closing at once with unread bytes makes the kernel
        reset the connection, and the client would never read the answer.  So the write side is shut
        after the answer and whatever still arrives is read and dropped (nothing is parsed or kept) for
        at most :data:`LINGER_S`, as web servers' lingering close does."""
        self._refused = self._lingering = True
        body = orjson.dumps(
            {
                "detail": "the server is receiving as many request bodies as it holds at once; "
                f"retry in {g.limits.retry_after_s} s"
            }
        )
        self.transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nretry-after: %d\r\nconnection: close\r\n\r\n%s"
            % (len(body), g.limits.retry_after_s, body)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._disarm()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # after a refusal: read and dropped until the client closes or LINGER_S passes
        super().data_received(data)  # type: ignore[misc]


def guarded_protocol() -> type[asyncio.Protocol] | str:
    """uvicorn's httptools protocol with the guard (``"auto"`` where httptools is not installed)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class GuardedHttpToolsProtocol(GuardMixin, HttpToolsProtocol):
        pass

    return GuardedHttpToolsProtocol
