"""Slow clients are let go: header and body timeouts, bodies in flight, connections per address.

Probe 7: 100 unauthenticated connections sending partial headers and 16 node
connections sending 8 MiB bodies one byte short stayed open past
``keep_alive_s``, and the collector grew by 130 MB for as long as the clients
wished.  Here, on loopback and at a small scale (a dozen connections, limits
of a fraction of a second), the same attack against the collector and the API:
every connection is closed by the server, what was cut is counted, the bodies
held never pass the budget, and an honest shipment is answered meanwhile.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest

from gpufleet.api.app import create_app as create_api
from gpufleet.auth import create_token
from gpufleet.collector.app import create_app as create_collector
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.connguard import SLOW_AFTER_S, ConnectionGuard, find_guard, guarded_protocol
from gpufleet.serverthread import ServerThread, serve
from gpufleet.wire import encode
from tests.attacks.conftest import batch, whole_seconds_ago

#: An address's share of slow connections is counted on the server's clock within a window of seconds:
#: under four parallel workers on two cores the share was missed in one run of three, twice with the
#: window widened, so these run after the workers, alone.
pytestmark = pytest.mark.serial

PENDING_PER_IP = 8
LIMITS: dict[str, float] = {
    # well past SLOW_AFTER_S: a connection counts against its address's share from 1 s after the server
    # accepted it until its header timeout cuts it, and on a loaded machine a one-second window was missed
    "header_timeout_s": 5.0,
    "body_timeout_s": 1.0,
    "max_body_bytes_in_flight": 5 * 2**19,
    "max_pending_connections_per_ip": PENDING_PER_IP,
}
#: Longest any connection may stay open here before the test calls the server stuck.
STUCK_S = 15.0


def _open(port: int, first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=STUCK_S)
    if first:
        s.sendall(first)
    return s


def _closed_by_server(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails if it never does)."""
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    finally:
        s.close()
    return got


def _wait_until_slow(guard: ConnectionGuard, n: int) -> None:
    """Until ``n`` of loopback's connections have waited for their headers past :data:`SLOW_AFTER_S` as
    the server counts (from when its loop accepted them, which on a loaded machine lags the client's
    connect): a fixed sleep on the client's clock let the next connection in before they were."""
    deadline = time.monotonic() + STUCK_S
    while time.monotonic() < deadline:
        try:
            # asyncio's loop.time() is time.monotonic(); the dict is the server thread's, so a read may race
            if guard.slow("127.0.0.1", time.monotonic()) >= n:
                return
        except RuntimeError:  # changed size during iteration
            pass
        time.sleep(0.02)
    raise AssertionError(f"the server never counted {n} slow connections: {guard.pending}")


@contextmanager
def collector(db: str, settings: Settings) -> Iterator[tuple[ServerThread, ConnectionGuard, str]]:
    s = settings.model_copy(update={"ingest": settings.ingest.model_copy(update=LIMITS)})
    with psycopg.connect(db, autocommit=True) as c:
        token = create_token(c, "slow-node", "node", "slow-node")
    app = create_collector(db, s, run_leader=False)
    guard = find_guard(app)
    assert guard is not None
    with serve(app, **server_options(s)) as srv:
        yield srv, guard, token


def _ship(url: str, token: str, t0: float) -> httpx.Response:
    body, headers = encode(batch("slow-node", t0, 2, {0: None, 1: None}))
    return httpx.post(
        url + "/v1/ingest",
        content=body,
        headers={**headers, "Authorization": f"Bearer {token}"},
        timeout=STUCK_S,
    )


def test_the_collector_lets_slow_and_excess_clients_go(db: str, settings: Settings) -> None:
    with collector(db, settings) as (srv, guard, token):
        t0 = whole_seconds_ago(30)
        assert _ship(srv.url, token, t0).status_code == 200  # the token is now cached as a node's

        # node connections sending 1 MiB bodies one byte short: two fit the 2.5 MiB budget, the third is
        # answered 503 at once
        head = (
            f"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/msgpack\r\nContent-Length: {2**20}\r\n\r\n"
        ).encode()
        bodies = [_open(srv.port, head + b"\0" * (2**20 - 1)) for _ in range(2)]
        time.sleep(0.1)
        third = _closed_by_server(_open(srv.port, head + b"\0" * 1000))
        assert third.startswith(b"HTTP/1.1 503") and b"retry-after: 2" in third.lower(), third[:200]
        assert guard.in_flight_bytes <= LIMITS["max_body_bytes_in_flight"]
        for s in bodies:
            assert _closed_by_server(s) == b""  # cut at the body timeout, never answered
        # unauthenticated: partial headers, up to the per-address share, and one more
        partial = [_open(srv.port, b"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(8)]
        _wait_until_slow(guard, PENDING_PER_IP)  # slow now: the address has its share
        extra = _open(srv.port, b"GET /healthz HTTP/1.1\r\n")
        assert _closed_by_server(extra) == b""  # closed as it opened: no answer at all
        for s in partial:
            assert _closed_by_server(s) == b""
        # and an honest shipment is answered as before
        assert _ship(srv.url, token, t0 + 2).status_code == 200
        assert guard.in_flight_bytes == 0 and guard.pending == {}
        cut = dict(guard.cut)
    assert cut["pending_per_ip"] >= 1 and cut["bodies_in_flight"] == 1, cut
    assert cut["header_timeout"] >= 8 and cut["body_timeout"] == 2, cut
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM gpu_samples").fetchone() == (8,)


def test_a_burst_of_honest_connections_from_one_address_is_not_refused(db: str, settings: Settings) -> None:
    """Three times an address's share of slow connections, opened at once, each sending its request: all
    answered (a fleet behind one address reconnecting after a restart)."""
    with collector(db, settings) as (srv, guard, _):
        opened = [_open(srv.port) for _ in range(3 * PENDING_PER_IP)]
        time.sleep(SLOW_AFTER_S / 3)  # all accepted and waiting for their headers at once, none slow yet
        assert sum(len(w) for w in guard.pending.values()) == 3 * PENDING_PER_IP
        for s in opened:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = [_closed_by_server(s) for s in opened]
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:20] for a in answers]
    assert guard.cut["pending_per_ip"] == 0


def test_the_collector_counts_what_it_cut_for_sres(db: str, settings: Settings) -> None:
    with collector(db, settings) as (srv, _, _):
        assert _closed_by_server(_open(srv.port, b"GET /metrics HTTP/1.1\r\n")) == b""
        page = httpx.get(srv.url + "/metrics", timeout=STUCK_S).text
    assert 'gpufleet_http_connections_cut_total{reason="header_timeout"} 1.0' in page


@pytest.fixture
def api_server(db: str, settings: Settings) -> Iterator[tuple[ServerThread, ConnectionGuard]]:
    s = settings.model_copy(update={"api": settings.api.model_copy(update=LIMITS)})
    app = create_api(db, s)
    guard = find_guard(app)
    assert guard is not None
    with serve(app, http=guarded_protocol()) as srv:
        yield srv, guard


def test_the_api_lets_slow_and_excess_clients_go(api_server: tuple[ServerThread, ConnectionGuard]) -> None:
    srv, guard = api_server
    slow_form = _open(
        srv.port,
        b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n\r\ntoken=",
    )
    assert _closed_by_server(slow_form) == b""
    partial = [_open(srv.port, b"POST /login HTTP/1.1\r\nHost: x\r\n") for _ in range(8)]
    _wait_until_slow(guard, PENDING_PER_IP)
    assert _closed_by_server(_open(srv.port)) == b""
    for s in partial:
        assert _closed_by_server(s) == b""
    assert httpx.get(srv.url + "/healthz", timeout=STUCK_S).status_code == 200
    assert (
        guard.cut["header_timeout"] >= 8
        and guard.cut["body_timeout"] == 1
        and guard.cut["pending_per_ip"] >= 1
    ), dict(guard.cut)
    assert guard.in_flight_bytes == 0
