"""The progress reporter against the real API and PostgreSQL: batched, cumulative, never raising."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from gpufleet_client import ProgressReporter

from tests.api.conftest import Api


def progress_rows(db: str, run_id: str) -> list[tuple]:
    with psycopg.connect(db) as c:
        return c.execute(
            "SELECT tokens, samples, steps FROM run_progress WHERE run_id = %s ORDER BY time", (run_id,)
        ).fetchall()


def create_run(api: Api, run_id: str) -> None:
    with api.client("admin") as c:
        r = c.post("/v1/runs", json={"run_id": run_id, "allocations": [{"node": "n1", "gpus": [0]}]})
        assert r.status_code == 201, r.text


def test_reports_are_batched_and_land_as_cumulative_progress(api: Api) -> None:
    create_run(api, "llm-7b")
    rep = ProgressReporter(api.url, api.tokens["admin"], interval_s=3600, start=False)
    for step in range(1, 101):
        rep.report("llm-7b", tokens=step * 4096.0, samples=step * 8.0, steps=step)
    assert rep.flush() is True
    # A hundred calls in one interval: one request with the latest counts.
    assert progress_rows(api.db, "llm-7b") == [(409600.0, 800.0, 100.0)]
    assert (rep.stats.reported, rep.stats.sent, rep.stats.failed) == (100, 1, 0)
    rep.report("llm-7b", steps=101)
    rep.close()
    assert progress_rows(api.db, "llm-7b")[-1] == (None, None, 101.0)
    with api.client("sre") as c:
        eff = c.get("/v1/runs/llm-7b/accounting").json()["efficiency"]
    assert eff["tokens"] == 409600.0


def test_the_background_thread_sends_every_interval(api: Api) -> None:
    create_run(api, "bg")
    rep = ProgressReporter(api.url, api.tokens["admin"], interval_s=0.2)
    try:
        rep.report("bg", tokens=10)
        deadline = time.monotonic() + 10
        while rep.stats.sent == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rep.close()
    assert progress_rows(api.db, "bg") == [(10.0, None, None)]


def test_network_errors_never_raise_and_are_retried(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    create_run(api, "flaky")
    rep = ProgressReporter(
        "http://127.0.0.1:9", api.tokens["admin"], interval_s=3600, start=False, timeout_s=1
    )
    rep.report("flaky", tokens=5)
    assert rep.flush() is False and rep.stats.failed == 1
    assert "cannot reach http://127.0.0.1:9" in caplog.text
    rep.report("flaky", tokens=7)  # newer counts replace the pending ones
    rep.api_url = api.url  # the API is back
    assert rep.flush() is True
    assert progress_rows(api.db, "flaky") == [(7.0, None, None)] and rep.stats.sent == 1


def test_an_unknown_run_is_retried_until_it_appears(api: Api) -> None:
    # A run gpufleet infers from the GPUs appears a sweep after the job starts.
    rep = ProgressReporter(api.url, api.tokens["admin"], interval_s=3600, start=False)
    rep.report("later", steps=3)
    assert rep.flush() is False and rep.stats.failed == 1
    create_run(api, "later")
    assert rep.flush() is True and progress_rows(api.db, "later") == [(None, None, 3.0)]


@pytest.fixture
def refusing() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"detail": "tokens: must be >= 0"}).encode()
            self.send_response(422)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_refused_body_is_dropped_and_counted(refusing: str, caplog: pytest.LogCaptureFixture) -> None:
    rep = ProgressReporter(refusing, "t", interval_s=3600, start=False)
    rep.report("r", tokens=1)
    assert rep.flush() is True and rep.stats.dropped == 1 and rep.stats.sent == 0
    assert "HTTP 422: tokens: must be >= 0" in caplog.text


def test_only_impossible_calls_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    rep = ProgressReporter("http://127.0.0.1:9", "t", start=False)
    with pytest.raises(ValueError, match="give tokens, samples or steps"):
        rep.report("r")
    with pytest.raises(ValueError, match="tokens must be a finite count"):
        rep.report("r", tokens=-1)
    with pytest.raises(ValueError, match="steps must be a finite count"):
        rep.report("r", steps=float("nan"))
    monkeypatch.delenv("GPUFLEET_RUN_ID", raising=False)
    with pytest.raises(ValueError, match="GPUFLEET_RUN_ID"):
        rep.report(tokens=1)
    monkeypatch.setenv("GPUFLEET_RUN_ID", "from-env")
    rep.report(tokens=1)
    assert "from-env" in rep._pending
