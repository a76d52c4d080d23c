"""Request body bounds for the collector and the API, enforced before any route runs.

An ASGI middleware, outermost in both apps, so it holds for every route,
including those that read the body before authenticating (FastAPI parses a
body model before it resolves the dependencies that check the token) and the
collector's ingest fast path:

* a ``Content-Length`` above the route's limit is answered 413 at once,
  without reading a byte of the body;
* a body without a declared length (chunked) is counted as it streams and cut
  off with a 413 once it passes the limit, so no route ever holds more;
* ``precheck`` (the API passes its token check) runs before the body is read
  for requests that carry one, so a client without valid credentials cannot
  make the server read, buffer or parse anything it sends.

Answers sent before the body was read close the connection, so the rest of
the body is not read either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: An early answer: (status, JSON detail, extra headers); None lets the request through.
Refusal = tuple[int, Any, dict[str, str]]
Precheck = Callable[[Scope], Awaitable[Refusal | None]]


class _TooLarge(Exception):
    """Raised from ``receive`` once the streamed body passes the limit."""


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [v for k, v in scope.get("headers", ()) if k.lower() == name]


async def _answer(send: Send, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
    body = orjson.dumps({"detail": detail})
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Caps request bodies at ``limits`` or ``default``: (path, bytes) pairs, the first match wins; a
    path ending in ``/`` matches every path under it."""

    def __init__(
        self,
        app: ASGIApp,
        default: int,
        limits: Sequence[tuple[str, int]] = (),
        precheck: Precheck | None = None,
    ) -> None:
        self.app = app
        self.default = default
        self.limits = list(limits)
        self.precheck = precheck

    def limit(self, path: str) -> int:
        for prefix, n in self.limits:
            if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
                return n
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.limit(scope.get("path", ""))
        declared = _header(scope, b"content-length")
        chunked = any(b"chunked" in v.lower() for v in _header(scope, b"transfer-encoding"))
        if declared:
            if len(set(declared)) != 1 or not declared[0].strip().isdigit():
                await _answer(send, 400, "Content-Length must be one non-negative integer")
                return
            n = int(declared[0])
            if n > cap:
                await _answer(send, 413, f"body of {n} bytes exceeds the {cap}-byte limit of this route")
                return
            has_body = n > 0
        else:
            has_body = chunked
        if has_body and self.precheck is not None:
            refusal = await self.precheck(scope)
            if refusal is not None:
                status, detail, headers = refusal
                await _answer(send, status, detail, headers)
                return
        state = {"seen": 0, "over": False, "started": False}

        async def capped_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["seen"] += len(message.get("body", b""))
                if state["seen"] > cap:
                    state["over"] = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            if state["over"]:
                return  # the app's answer to the cut-off body (often a 500) is replaced by the 413
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not state["over"]:
                raise
        if state["over"] and not state["started"]:
            await _answer(send, 413, f"body exceeds the {cap}-byte limit of this route")
