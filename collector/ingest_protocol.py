"""The collector's HTTP protocol: uvicorn's, with agents' shipments answered on the connection itself.

At fleet rates one collector process answers hundreds of shipments a second,
and uvicorn's machinery around each request (a request cycle, a task, an
event, a message dict each way, the middleware chain) cost about as much as
everything the request needs outside validation: 204 µs per request against
73 for a bare protocol with the same parser, under the same load
(``bench/vs_prometheus.py --http-floor --fleets 24000``).

A shipment this protocol can take whole is read here and handed to the
collector's ingest handler with its headers and body, and the answer is
written straight to the transport.  That is ``POST /v1/ingest`` with exactly
one Content-Length within the ingest limit, no Transfer-Encoding, no
``Expect: 100-continue``, no upgrade, nothing else in flight on the
connection, and a bearer token already cached as a node's: the body is read
before the handler checks the token again, so a client without one never
has a body buffered here.  Everything else (every other route, every
first shipment of a node, every refused token, and every shipment that is
not plain) goes through uvicorn and the ASGI app as before, so body limits,
errors, pipelining and the OpenAPI description keep one implementation each.
Middleware between uvicorn and the collector's app (uvicorn's proxy headers)
is not applied to these shipments: the handler reads the client's address
only to tell connections apart, and the transport's is the one for that.
While a shipment is in flight it stands in uvicorn's place for the current
request, so a request pipelined behind it waits for its answer, a graceful
shutdown lets it finish and closes the connection after it, and a lost
connection is noticed before anything is written.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gpufleet.connguard import GuardMixin

log = logging.getLogger(__name__)

PATH = b"/v1/ingest"


class ShipmentApp(Protocol):
    """What the protocol needs of the collector's app (:class:`gpufleet.collector.app.IngestFastPath`)."""

    max_body_bytes: int

    def admits(self, authorization: bytes | None) -> bool: ...

    def closes(self, scope: dict[str, Any]) -> bool: ...

    def client_gone(self) -> None: ...

    async def answer(self, scope: dict[str, Any], receive: Any) -> Any: ...


class _NoEvent:
    @staticmethod
    def set() -> None:
        pass


class Shipment:
    """A shipment read by this protocol, standing where uvicorn keeps its request cycle."""

    __slots__ = ("body", "disconnected", "headers", "http_version", "keep_alive", "response_complete")
    message_event = _NoEvent  # uvicorn sets it when the connection is lost

    def __init__(self, headers: list[tuple[bytes, bytes]], http_version: str, keep_alive: bool) -> None:
        self.headers = headers
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.body = bytearray()
        self.response_complete = False
        self.disconnected = False


def shipment_app(app: Any) -> ShipmentApp | None:
    """The collector app inside uvicorn's middleware (proxy headers, message logging), if it is one."""
    for _ in range(8):
        if app is None:
            return None
        if callable(getattr(app, "answer", None)) and hasattr(app, "max_body_bytes"):
            return app
        app = getattr(app, "app", None)
    return None


class ShipmentProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shipments = shipment_app(self.app)
        #: The verified client certificate's TLS extension (set by the TLS variant).
        self.tls_ext: dict[str, Any] | None = None
        self.reading: Shipment | None = None

    def on_headers_complete(self) -> None:
        if (
            self.shipments is not None
            and self.url == PATH
            and not self.pipeline
            and (self.cycle is None or self.cycle.response_complete)
            and not self.expect_100_continue
            and self.limit_concurrency is None
        ):
            shipment = self._plain_shipment(self.shipments)
            if shipment is not None:
                self.cycle = shipment  # type: ignore[assignment]
                self.reading = shipment
                return
        super().on_headers_complete()

    def _plain_shipment(self, shipments: ShipmentApp) -> Shipment | None:
        if self.parser.get_method() != b"POST" or self.parser.should_upgrade():
            return None
        length = authorization = None
        for name, value in self.headers:
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return None
                length = int(value)
            elif name == b"authorization":
                if authorization is not None:
                    return None
                authorization = value
            elif name == b"transfer-encoding":
                return None
        # The body is read here before the handler checks the token, so only for a token
        # known to be a node's; any other goes through the app, which checks it first.
        if length is None or length > shipments.max_body_bytes or not shipments.admits(authorization):
            return None
        version = self.parser.get_http_version()
        return Shipment(self.headers, version, version != "1.0" and self.parser.should_keep_alive())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reading is not None and self.shipments is not None:
            # Gone mid-body: nothing is stored and the agent sends the batch again.
            self.reading = None
            self.shipments.client_gone()
        super().connection_lost(exc)

    def on_body(self, body: bytes) -> None:
        if self.reading is not None:
            self.reading.body += body
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        shipment = self.reading
        if shipment is None:
            super().on_message_complete()
            return
        self.reading = None
        if getattr(self.config, "reset_contextvars", False):  # as uvicorn starts its own tasks
            task = self.loop.create_task(self._answer(shipment), context=contextvars.Context())
        else:
            task = self.loop.create_task(self._answer(shipment))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer(self, shipment: Shipment) -> None:
        assert self.shipments is not None
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": shipment.http_version,
            "method": "POST",
            "scheme": self.scheme,
            "path": "/v1/ingest",
            "raw_path": PATH,
            "root_path": self.root_path,
            "query_string": b"",
            "headers": shipment.headers,
            "client": self.client,
            "server": self.server,
            "state": self.app_state.copy(),
        }
        if self.tls_ext is not None:
            scope["extensions"] = {"tls": self.tls_ext}
        body = bytes(shipment.body)
        shipment.body = bytearray()
        delivered = False

        async def receive() -> dict[str, Any]:
            # The body is here whole even if the client has gone since: it is stored, and
            # the agent's retry of the unanswered shipment is answered as a duplicate.
            nonlocal delivered
            if delivered:
                return {"type": "http.disconnect"}
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        if self.shipments.closes(scope):
            shipment.keep_alive = False
        try:
            response = await self.shipments.answer(scope, receive)
            status, headers, content = response.status_code, response.raw_headers, response.body
        except Exception:
            log.exception("ingest: unexpected error answering a shipment")
            status, content = 500, b"Internal Server Error"
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")]
            shipment.keep_alive = False
        if self.flow.write_paused and not shipment.disconnected:
            # A client not reading its answers: wait, as uvicorn does.  Until this answer is
            # written the shipment is not complete, so whatever the client sends next waits
            # in uvicorn's queue with reading paused, instead of piling up here.
            await self.flow.drain()
        shipment.response_complete = True
        if shipment.disconnected or self.transport.is_closing():
            return
        out = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            out += [name, b": ", value, b"\r\n"]
        if not shipment.keep_alive:
            out.append(b"connection: close\r\n")
        out += [b"\r\n", content]
        self.transport.write(b"".join(out))
        if not shipment.keep_alive:
            self.transport.close()
        self.on_response_complete()


class IngestProtocol(GuardMixin, ShipmentProtocol):
    """The collector's protocol: shipments answered on the connection, slow clients let go
    (:mod:`gpufleet.connguard`: header and body timeouts, bodies in flight, connections per address
    before headers; the limits are ``ingest.*``), on both paths."""
