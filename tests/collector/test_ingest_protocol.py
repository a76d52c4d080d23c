"""Plain shipments are answered by the collector's protocol on the connection itself
(``gpufleet.collector.ingest_protocol``); every other request, and every shipment that is
not plain, goes through uvicorn and the app as before. Spoken over raw sockets, so that
keep-alive, pipelining and the framing of each answer are what is tested."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import psycopg
import pytest

from gpufleet.bodylimit import BodyLimit
from gpufleet.wire import encode
from tests.collector.conftest import Collector
from tests.collector.test_ingest import GONE, batch, count, gone_answers, leave_mid_body, wait_for


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> dict:
        return orjson.loads(self.body)


class Conn:
    """One kept-alive connection; answers are read one at a time, in order."""

    def __init__(self, c: Collector) -> None:
        host, port = c.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buf = b""
        self.c = c

    def shipment(self, batch_id: str, extra: dict[str, str] | None = None, chunked: bool = False) -> bytes:
        body, headers = encode(batch(batch_id), "msgpack", "zstd")
        head = {**headers, **self.c.headers("node-a"), **(extra or {})}
        if chunked:
            head["Transfer-Encoding"] = "chunked"
            payload = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        else:
            head["Content-Length"] = str(len(body))
            payload = body
        lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
        return f"POST /v1/ingest HTTP/1.1\r\nHost: collector\r\n{lines}\r\n".encode() + payload

    def read(self) -> Answer:
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            self._more()
        body, self.buf = self.buf[:n], self.buf[n:]
        return Answer(int(status_line.split()[1]), headers, body)

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the collector")
        self.buf += chunk

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except TimeoutError:
            return False


@pytest.fixture
def app_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Paths of the requests that reached the ASGI app (every one passes its body limit first)."""
    calls: list[str] = []
    original = BodyLimit.__call__

    async def spy(self: BodyLimit, scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
        await original(self, scope, receive, send)  # type: ignore[arg-type]

    monkeypatch.setattr(BodyLimit, "__call__", spy)
    yield calls


def test_plain_shipments_are_answered_on_their_kept_connection(
    collector: Collector, app_calls: list[str]
) -> None:
    conn = Conn(collector)
    for i in range(3):
        conn.sock.sendall(conn.shipment(f"a:plain-{i}"))
        a = conn.read()
        assert a.status == 200, a.body
        assert a.json() == {
            "batch_id": f"a:plain-{i}",
            "status": "stored",
            "gpu_rows": 8,
            "host_rows": 1,
            "rejected_skew": 0,
        }
        assert a.headers["content-type"] == "application/json" and "connection" not in a.headers
        assert "date" in a.headers  # the server's own headers, as on every other answer
    # The node's first shipment went through the app, which checked its token before reading
    # the body; the two after it were answered on the connection.
    assert app_calls == ["/v1/ingest"]
    conn.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: collector\r\n\r\n")
    assert conn.read().status == 200
    assert app_calls == ["/v1/ingest", "/healthz"]
    assert count(collector.db) == 24


def test_pipelined_requests_are_answered_in_order(collector: Collector, app_calls: list[str]) -> None:
    conn = Conn(collector)
    conn.sock.sendall(
        conn.shipment("a:pipe-1")
        + b"GET /healthz HTTP/1.1\r\nHost: collector\r\n\r\n"
        + conn.shipment("a:pipe-2")
        + conn.shipment("a:pipe-1")
    )
    answers = [conn.read() for _ in range(4)]
    assert [a.status for a in answers] == [200, 200, 200, 200]
    assert answers[0].json()["batch_id"] == "a:pipe-1" and answers[0].json()["status"] == "stored"
    assert answers[1].json() == {"status": "ok"}
    assert answers[2].json()["batch_id"] == "a:pipe-2"
    assert answers[3].json()["status"] == "duplicate"
    assert "/healthz" in app_calls
    assert count(collector.db) == 16


def test_shipments_that_are_not_plain_go_through_the_app(collector: Collector, app_calls: list[str]) -> None:
    conn = Conn(collector)
    conn.sock.sendall(conn.shipment("a:chunked", chunked=True))
    a = conn.read()
    assert a.status == 200 and a.json()["status"] == "stored"
    assert app_calls == ["/v1/ingest"]

    head, body = conn.shipment("a:expect", {"Expect": "100-continue"}).split(b"\r\n\r\n", 1)
    conn.sock.sendall(head + b"\r\n\r\n")
    assert conn.read().status == 100
    conn.sock.sendall(body)
    a = conn.read()
    assert a.status == 200 and a.json()["batch_id"] == "a:expect"
    assert app_calls == ["/v1/ingest"] * 2

    limit = 1_000_000  # the fixture's ingest.max_body_bytes
    conn.sock.sendall(f"POST /v1/ingest HTTP/1.1\r\nHost: c\r\nContent-Length: {limit + 1}\r\n\r\n".encode())
    a = conn.read()
    assert a.status == 413 and str(limit) in a.json()["detail"]
    assert count(collector.db) == 16

    other = Conn(collector)
    other.sock.sendall(
        b"POST /v1/ingest HTTP/1.1\r\nHost: c\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab"
    )
    a = other.read()
    assert a.status == 400  # refused by the parser or the body limit, never read as a shipment


def test_a_body_is_read_on_the_connection_only_for_a_node_token_already_accepted(
    collector: Collector, app_calls: list[str]
) -> None:
    conn = Conn(collector)
    junk = b"x" * 500_000
    for token in (b"gpf_not-a-real-token", collector.tokens["sre"].encode()):
        conn.sock.sendall(
            b"POST /v1/ingest HTTP/1.1\r\nHost: c\r\nContent-Type: application/msgpack\r\n"
            b"Authorization: Bearer " + token + b"\r\nContent-Length: %d\r\n\r\n" % len(junk) + junk
        )
        a = conn.read()
        assert a.status in (401, 403) and "detail" in a.json()
    assert app_calls == ["/v1/ingest", "/v1/ingest"]  # checked by the app before it read the body
    conn.sock.sendall(conn.shipment("a:first"))
    assert conn.read().status == 200
    conn.sock.sendall(conn.shipment("a:second"))
    assert conn.read().status == 200
    assert app_calls == ["/v1/ingest"] * 3  # the second one, its token now known, was read here
    assert count(collector.db) == 16


def test_a_shipment_whose_connection_is_gone_is_still_stored(collector: Collector) -> None:
    conn = Conn(collector)
    conn.sock.sendall(conn.shipment("a:first"))
    assert conn.read().status == 200  # the node's token is now known: the next body is read here
    conn.sock.sendall(conn.shipment("a:gone"))
    conn.sock.close()
    deadline = time.monotonic() + 10
    while count(collector.db) < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count(collector.db) == 16
    with psycopg.connect(collector.db) as c:
        assert c.execute("SELECT batch_id FROM ingest_batches ORDER BY batch_id").fetchall() == [
            ("a:first",),
            ("a:gone",),
        ]
    again = Conn(collector)
    again.sock.sendall(again.shipment("a:gone"))
    assert again.read().json()["status"] == "duplicate"  # the agent's retry is answered, not stored twice


def test_a_shipment_cut_off_mid_body_is_counted(collector: Collector, app_calls: list[str]) -> None:
    conn = Conn(collector)
    conn.sock.sendall(conn.shipment("a:first"))
    assert conn.read().status == 200  # the node's token is now known: the next body is read here
    leave_mid_body(collector, "node-a", "a:cut")
    assert wait_for(collector, GONE, 1) == 1
    assert gone_answers(collector) == 1
    assert app_calls.count("/v1/ingest") == 1  # the cut one never reached the app
    assert count(collector.db) == 8
