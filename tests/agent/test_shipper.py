"""The shipper against a local HTTP server that answers scripted statuses.

Final refusals (400/401/403/404/413/422) are sent exactly once and dead-lettered;
429/503/5xx/timeouts/refused connections are retried with jittered backoff,
honouring Retry-After; nothing leaves the spool without a 2xx.
"""

from __future__ import annotations

import itertools
import json
import random
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard

from gpufleet.agent.batch import encode_batch, tick_record, to_batch
from gpufleet.agent.shipper import Backoff, Shipper, Verdict, classify, parse_retry_after, tls_context
from gpufleet.agent.spool import Spool
from gpufleet.serverthread import free_port
from testsupport.certs import TestCA


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=lambda: {"status": "stored"})
    #: Seconds to wait before answering (a hung collector).
    delay_s: float = 0.0


@dataclass
class Seen:
    at: float
    batch_id: str
    headers: dict[str, str]


class ScriptedCollector:
    """Answers each POST with the next scripted reply (the last one repeats)."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.seen: list[Seen] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                doc = msgpack.unpackb(
                    zstandard.ZstdDecompressor().decompressobj().decompress(body), raw=False
                )
                outer.seen.append(Seen(time.monotonic(), doc["batch_id"], dict(self.headers)))
                reply = outer.replies.pop(0) if len(outer.replies) > 1 else outer.replies[0]
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def ids(self) -> list[str]:
        return [s.batch_id for s in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def script() -> Iterator[list[ScriptedCollector]]:
    made: list[ScriptedCollector] = []
    yield made
    for s in made:
        s.close()


def serve(made: list[ScriptedCollector], *replies: Reply) -> ScriptedCollector:
    srv = ScriptedCollector(list(replies))
    made.append(srv)
    return srv


def spool_with(tmp_path: Path, segments: int) -> Spool:
    spool = Spool(
        tmp_path, lambda recs, bid: encode_batch(to_batch(recs, bid, "node-a")), max_bytes=10**8
    ).open()
    for i in range(segments):
        spool.append(tick_record(1000.0 + i, [{"gpu": 0, "power_w": 1.0}], {"cpu_user_pct": 1.0}))
        spool.seal()
    return spool


def shipper(spool: Spool, url: str, **kw: Any) -> Shipper:
    kw.setdefault("retry_base_s", 0.01)
    kw.setdefault("retry_max_s", 0.05)
    kw.setdefault("timeout_s", 2.0)
    return Shipper(spool, url, "secret-token", rng=random.Random(7), **kw)


def test_classification_of_answers() -> None:
    assert classify(200) is Verdict.DELIVERED and classify(204) is Verdict.DELIVERED
    for status in (400, 401, 403, 404, 409, 413, 415, 422):
        assert classify(status) is Verdict.DEAD, status
    for status in (408, 425, 429, 500, 502, 503, 504, 301, 307):
        assert classify(status) is Verdict.RETRY, status


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert parse_retry_after("99999999") == 600.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_backoff_is_capped_full_jitter_and_spreads_a_fleet() -> None:
    b = Backoff(0.5, 8.0, random.Random(1))
    delays = [b.next_delay() for _ in range(12)]
    ceilings = [min(8.0, 0.5 * 2**i) for i in range(12)]
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    b.reset()
    assert b.attempt == 0
    # A fleet retrying after the same outage does not come back in lockstep.
    fleet = [Backoff(0.5, 60.0, random.Random(seed)) for seed in range(200)]
    for f in fleet:
        f.attempt = 8
    waits = sorted(f.next_delay() for f in fleet)
    assert waits[-1] - waits[0] > 30 and len({round(w, 1) for w in waits}) > 150
    # Retry-After is a floor, with jitter above it.
    ra = [Backoff(0.5, 60.0, random.Random(s)).next_delay(retry_after_s=2.0) for s in range(50)]
    assert min(ra) >= 2.0 and max(ra) <= 3.0 and max(ra) - min(ra) > 0.5


def test_2xx_deletes_in_order_and_carries_the_token(tmp_path: Path, script: list[ScriptedCollector]) -> None:
    srv = serve(script, Reply(200))
    spool = spool_with(tmp_path, 3)
    sh = shipper(spool, srv.url)
    while sh.ship_one() is not None:
        pass
    assert srv.ids() == [f"{spool.agent_id}:{n}" for n in (1, 2, 3)]
    assert srv.seen[0].headers["Authorization"] == "Bearer secret-token"
    assert srv.seen[0].headers["Content-Type"] == "application/msgpack"
    assert srv.seen[0].headers["Content-Encoding"] == "zstd"
    assert spool.sealed_count == 0 and spool.stats.delivered == 6
    assert sh.metrics.value("gpufleet_agent_batches_sent_total", status="stored") == 3
    assert sh.metrics.value("gpufleet_agent_last_ship_success_timestamp_seconds") > 0
    sh.close()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_final_refusals_are_sent_once_then_dead_lettered(
    tmp_path: Path, script: list[ScriptedCollector], status: int
) -> None:
    srv = serve(script, Reply(status, body={"detail": "no"}), Reply(200))
    spool = spool_with(tmp_path, 2)
    sh = shipper(spool, srv.url)
    first = sh.ship_one()
    assert first is not None and first.verdict is Verdict.DEAD and first.status == str(status)
    second = sh.ship_one()
    assert second is not None and second.verdict is Verdict.DELIVERED
    assert sh.ship_one() is None
    # Exactly one send of the refused batch, then the next one went.
    assert srv.ids() == [f"{spool.agent_id}:1", f"{spool.agent_id}:2"]
    assert [p.name for p in (tmp_path / "dead").glob("*.seg")] == ["0000000000000001-2.seg"]
    assert sh.metrics.value("gpufleet_agent_batches_dead_lettered_total", status=str(status)) == 1
    assert spool.stats.dropped_dead == 2 and spool.stats.delivered == 2
    sh.close()


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_retryable_answers_keep_the_segment_and_retry_it_first(
    tmp_path: Path, script: list[ScriptedCollector], status: int
) -> None:
    srv = serve(script, Reply(status), Reply(status), Reply(200))
    spool = spool_with(tmp_path, 2)
    sh = shipper(spool, srv.url)
    sh.start()
    deadline = time.monotonic() + 10
    while spool.sealed_count and time.monotonic() < deadline:
        time.sleep(0.01)
    sh.close()
    one, two = f"{spool.agent_id}:1", f"{spool.agent_id}:2"
    assert srv.ids() == [one, one, one, two]
    assert sh.metrics.value("gpufleet_agent_batches_retried_total", reason=str(status)) == 2
    assert spool.stats.delivered == 4 and not list((tmp_path / "dead").glob("*"))


def test_retry_after_is_honoured(tmp_path: Path, script: list[ScriptedCollector]) -> None:
    srv = serve(script, Reply(429, {"Retry-After": "1"}), Reply(503, {"Retry-After": "1"}), Reply(200))
    spool = spool_with(tmp_path, 1)
    sh = shipper(spool, srv.url)
    sh.start()
    deadline = time.monotonic() + 10
    while spool.sealed_count and time.monotonic() < deadline:
        time.sleep(0.01)
    sh.close()
    times = [s.at for s in srv.seen]
    assert len(times) == 3
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times))


def test_timeouts_and_refused_connections_are_retried(
    tmp_path: Path, script: list[ScriptedCollector]
) -> None:
    spool = spool_with(tmp_path, 1)
    # Nobody listens on this port.
    down = shipper(spool, f"http://127.0.0.1:{free_port()}")
    attempt = down.ship_one()
    assert attempt is not None and attempt.verdict is Verdict.RETRY and attempt.status == "connection"
    down.close()
    # A collector that answers too late.
    slow = serve(script, Reply(200, delay_s=1.0), Reply(200))
    sh = shipper(spool, slow.url, timeout_s=0.3)
    attempt = sh.ship_one()
    assert attempt is not None and attempt.verdict is Verdict.RETRY and attempt.status == "timeout"
    assert spool.sealed_count == 1
    attempt = sh.ship_one()
    assert attempt is not None and attempt.verdict is Verdict.DELIVERED
    assert sh.metrics.value("gpufleet_agent_batches_retried_total", reason="timeout") == 1
    sh.close()


def test_drain_ships_what_it_can_and_stops_at_the_first_retry(
    tmp_path: Path, script: list[ScriptedCollector]
) -> None:
    srv = serve(script, Reply(200), Reply(503))
    spool = spool_with(tmp_path, 3)
    sh = shipper(spool, srv.url)
    t0 = time.monotonic()
    assert sh.drain(5.0) is False
    assert time.monotonic() - t0 < 2.0  # no backoff while draining
    assert len(srv.seen) == 2 and spool.sealed_count == 2
    sh.close()


def test_drain_respects_its_deadline_with_a_hung_collector(
    tmp_path: Path, script: list[ScriptedCollector]
) -> None:
    srv = serve(script, Reply(200, delay_s=3.0))
    spool = spool_with(tmp_path, 1)
    sh = shipper(spool, srv.url, timeout_s=10.0)
    t0 = time.monotonic()
    assert sh.drain(0.5) is False
    assert time.monotonic() - t0 < 2.0
    assert spool.sealed_count == 1  # still there for the next start
    sh.close()


def test_tls_with_our_ca_and_a_client_certificate(tmp_path: Path, script: list[ScriptedCollector]) -> None:
    ca = TestCA(tmp_path / "ca")
    server, client = ca.server(), ca.client("client")
    srv = serve(script, Reply(200))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.pem))
    server_ctx.load_cert_chain(str(server.cert), str(server.key))
    server_ctx.verify_mode = ssl.CERT_REQUIRED  # mTLS: no client certificate, no connection
    srv.server.socket = server_ctx.wrap_socket(srv.server.socket, server_side=True)
    url = srv.url.replace("http://", "https://")
    spool = spool_with(tmp_path / "spool", 2)
    # Without our client certificate the handshake fails: a retry, never a dead letter.
    no_cert = shipper(spool, url, verify=tls_context(ca.pem, None, None))
    attempt = no_cert.ship_one()
    assert attempt is not None and attempt.verdict is Verdict.RETRY
    no_cert.close()
    sh = shipper(spool, url, verify=tls_context(ca.pem, client.cert, client.key))
    while sh.ship_one() is not None:
        pass
    assert spool.sealed_count == 0 and len(srv.seen) == 2
    sh.close()
    assert tls_context(None, None, None) is True
