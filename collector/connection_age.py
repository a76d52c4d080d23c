"""Ends long-lived agent connections now and then, so a balancer can spread them again.

Agents keep one HTTP connection to the collector between shipments (a TLS
handshake per batch otherwise).  Behind a connection-level balancer (a
Kubernetes Service, an L4 load balancer) that pins every node to the replica
it first reached: after a scale-out the new replica gets no traffic, and after
a replica restarts, its nodes stay on the survivors for good.  So once a
connection is older than ``ingest.max_connection_age_s`` (less a random share
of up to a quarter, so a fleet that connected together does not reconnect
together), its next answer carries ``Connection: close``; the agent's next
batch opens a new connection, which the balancer places afresh.  At the
default of 5 minutes and 5-s shipments, one shipment in about 50 reconnects.

An ASGI scope does not name its connection, but the client's address and
port do, for as long as the connection is open.  A closed connection's entry
is forgotten once it could no longer be open.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

#: Share of the age by which each connection's limit is shortened at random.
JITTER = 0.25


class ConnectionAges:
    def __init__(
        self,
        max_age_s: float,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.max_age_s = max_age_s
        #: An entry older than its limit plus this was a connection that closed on its own
        #: (an idle one is closed by the server after ``idle_timeout_s``).
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._deadline: dict[Any, float] = {}
        self._next_prune = 0.0

    def should_close(self, scope: dict[str, Any]) -> bool:
        """Whether this request's answer should end its connection (and forget it)."""
        if self.max_age_s <= 0:
            return False
        client, server = scope.get("client"), scope.get("server")
        if not client:
            return False
        key = (tuple(client), tuple(server or ()))  # ASGI servers may give lists
        now = self._clock()
        if now >= self._next_prune:
            self._prune(now)
        deadline = self._deadline.get(key)
        if deadline is None:
            self._deadline[key] = now + self.max_age_s * (1.0 - JITTER * self._rng.random())
            return False
        if now < deadline:
            return False
        del self._deadline[key]
        return True

    def _prune(self, now: float) -> None:
        # Past its deadline by more than an idle timeout, a connection is gone: a request
        # after the deadline closed it, and without one the server closed it as idle.
        stale = now - self.idle_timeout_s - 1.0
        for key in [k for k, d in self._deadline.items() if d < stale]:
            del self._deadline[key]
        self._next_prune = now + max(self.max_age_s, 1.0)

    def __len__(self) -> int:
        return len(self._deadline)


def closing(send: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """``send`` with ``Connection: close`` added to the response's headers."""

    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return wrapped
