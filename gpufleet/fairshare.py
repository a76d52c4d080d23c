"""Requests in progress per token and per role, so one caller cannot hold the API's database pool.

The API answers from a small pool of database connections.  Eight finance
reports of a large fleet in flight at once held all of them for 12 s each,
and an SRE's ``GET /v1/runs`` behind them waited out the pool's timeout and
answered 503.  This middleware, outermost but the body limit, counts the
requests each credential and each role have in progress:

* a **credential** (the bearer token, else the web session's cookie, else the
  client address for requests with neither) has at most ``per_token`` at once;
* a **role** (the credential's, through the authenticator and its cache) has
  at most ``per_role`` at once, so the other roles always find connections
  free.

A request beyond either waits up to ``wait_s`` for its turn, then answers
429 with ``Retry-After``: the caller that asks too much waits, not everyone
else.  Credentials are kept as their SHA-256 digest, as the token cache keeps
them; nothing here logs or returns them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from gpufleet.auth import Principal, hash_secret

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _credential(scope: Scope, cookie: str) -> tuple[bytes, str | None]:
    """(key, bearer secret or None): the digest of what identifies the caller, and the secret to look
    its role up by."""
    auth = cookie_value = None
    for k, v in scope.get("headers", ()):
        if k == b"authorization":
            auth = v.decode("latin-1")
        elif k == b"cookie":
            for part in v.decode("latin-1").split(";"):
                name, _, value = part.strip().partition("=")
                if name == cookie:
                    cookie_value = value
    if auth:
        scheme, _, secret = auth.partition(" ")
        secret = secret.strip() if scheme.lower() == "bearer" else auth
        return hash_secret(secret), secret
    if cookie_value:
        return hash_secret(cookie_value), cookie_value
    client = scope.get("client") or ("", 0)
    return hashlib.sha256(b"address:" + str(client[0]).encode()).digest(), None


class FairShare:
    """ASGI middleware limiting requests in progress per credential and per role (module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        lookup: Callable[[str], Awaitable[Principal | None]],
        per_token: int,
        per_role: int,
        wait_s: float,
        retry_after_s: int = 1,
        cookie: str = "gpufleet_token",
        exempt: Iterable[str] = (),
    ) -> None:
        self.app = app
        #: The principal of a bearer secret (the API's authenticator), None when it has none.
        self.lookup = lookup
        self.per_token = per_token
        self.per_role = per_role
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.cookie = cookie
        #: Paths that use no database (health, the offline docs' assets): never counted.
        self.exempt = tuple(exempt)
        self._by_key: dict[bytes, int] = {}
        self._by_role: dict[str, int] = {}
        self._freed = asyncio.Event()
        #: Requests answered 429, by the limit they met (``token`` or ``role``).
        self.refused: dict[str, int] = {"token": 0, "role": 0}

    def in_progress(self) -> tuple[dict[bytes, int], dict[str, int]]:
        return dict(self._by_key), dict(self._by_role)

    async def _role(self, secret: str | None) -> str | None:
        if not secret or len(secret) > 200 or not secret.isascii() or not secret.isprintable():
            return None
        who = await self.lookup(secret)
        return who.role if who is not None else None

    def _blocked(self, key: bytes, role: str | None) -> str | None:
        if self._by_key.get(key, 0) >= self.per_token:
            return "token"
        if role is not None and self._by_role.get(role, 0) >= self.per_role:
            return "role"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "").startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        key, secret = _credential(scope, self.cookie)
        role = await self._role(secret)
        blocked = self._blocked(key, role)
        if blocked is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_s
            while blocked is not None and (left := deadline - loop.time()) > 0:
                freed = self._freed
                try:
                    await asyncio.wait_for(freed.wait(), left)
                except TimeoutError:
                    pass
                blocked = self._blocked(key, role)
            if blocked is not None:
                self.refused[blocked] += 1
                await self._refuse(send, blocked, role)
                return
        self._by_key[key] = self._by_key.get(key, 0) + 1
        if role is not None:
            self._by_role[role] = self._by_role.get(role, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            n = self._by_key[key] - 1
            if n:
                self._by_key[key] = n
            else:
                del self._by_key[key]
            if role is not None:
                self._by_role[role] -= 1
            # Wake every waiter; each checks its own limits again.
            freed, self._freed = self._freed, asyncio.Event()
            freed.set()

    async def _refuse(self, send: Send, blocked: str, role: str | None) -> None:
        if blocked == "token":
            msg = (
                f"this token already has {self.per_token} requests in progress "
                f"(api.max_concurrent_per_token); retry when one has been answered"
            )
        else:
            msg = (
                f"role {role!r} already has {self.per_role} requests in progress "
                f"(api.max_concurrent_per_role); retry in a moment"
            )
        body = orjson.dumps({"detail": msg})
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(self.retry_after_s).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
