"""Scenarios 6 and 4: how real agents treat each kind of refusal, and a long outage with a capped spool.

A scripted collector answers whatever the scenario needs and records every
request (its time and batch id), so the agents' behaviour is read from the
wire: how often each batch was sent, how long they waited, whether a fleet
came back in lockstep.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gpufleet.serverthread import serve
from tests.reliability.conftest import knob
from testsupport.faultproxy import fault_proxy
from testsupport.fleet import Fleet
from testsupport.oracle import decode_body


class Scripted:
    """A stand-in collector: ``answer(batch_id, attempt)`` gives the status (200 acknowledges)."""

    def __init__(self, answer: Callable[[str, int], int]) -> None:
        self.answer = answer
        self.sends: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()
        self.app = FastAPI()

        @self.app.post("/v1/ingest")
        async def ingest(request: Request) -> JSONResponse:
            batch_id = decode_body(await request.body())["batch_id"]
            with self.lock:
                self.sends[batch_id].append(time.monotonic())
                attempt = len(self.sends[batch_id])
            status = self.answer(batch_id, attempt)
            if status == 200:
                return JSONResponse({"batch_id": batch_id, "status": "stored"})
            return JSONResponse({"detail": "scripted"}, status_code=status)


@pytest.fixture
def scripted() -> Iterator[Callable[[Callable[[str, int], int]], tuple[Scripted, str]]]:
    servers = []

    def make(answer: Callable[[str, int], int]) -> tuple[Scripted, str]:
        s = Scripted(answer)
        cm = serve(s.app)
        srv = cm.__enter__()
        servers.append(cm)
        return s, srv.url

    try:
        yield make
    finally:
        for cm in servers:
            cm.__exit__(None, None, None)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # sealed, shipped or dropped meanwhile
        return 0


def _run(fleet: Fleet, seconds: float, drain: float = 0.0) -> None:
    try:
        fleet.start()
        time.sleep(seconds)
        fleet.stop_sampling()
        if drain:
            fleet.wait_drained(drain)
    finally:
        fleet.close()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_final_refusals_are_sent_once_then_dead_lettered(
    status: int, scripted: Any, tmp_path: Path, figures: dict[str, Any]
) -> None:
    col, url = scripted(lambda _b, _n: status)
    fleet = Fleet({"dl-node": "gpf_token"}, url, tmp_path / "spools", interval_s=0.1, ship_interval_s=0.3)
    _run(fleet, 1.5)
    time.sleep(0.5)
    (a,) = fleet.agents
    dead = sorted(p.name for p in a.spool.dead_dir.glob("*.seg"))
    sends = {b: len(t) for b, t in col.sends.items()}
    counted = a.metrics.value("gpufleet_agent_batches_dead_lettered_total", status=str(status))
    figures.update(
        status=status,
        batches=len(sends),
        max_sends=max(sends.values()),
        dead_lettered=len(dead),
        counted=counted,
        dropped_dead=a.spool.stats.dropped_dead,
    )
    assert len(sends) >= 3 and set(sends.values()) == {1}
    assert len(dead) == counted == len(sends)
    assert a.spool.stats.dropped_dead > 0 and a.spool.stats.delivered == 0


@pytest.mark.parametrize("fault", ["429", "500", "503", "reset", "timeout"])
def test_transient_failures_are_retried_with_capped_jittered_backoff(
    fault: str, scripted: Any, tmp_path: Path, figures: dict[str, Any]
) -> None:
    fails = 4
    status = int(fault) if fault.isdigit() else 200
    col, url = scripted(lambda _b, n: status if n <= fails else 200)
    settings: dict[str, Any] = {
        "interval_s": 0.1,
        "ship_interval_s": 0.5,
        "retry_base_s": 0.1,
        "retry_max_s": 0.8,
    }
    with fault_proxy(int(url.rsplit(":", 1)[1])) as proxy:
        if fault == "timeout":
            settings["request_timeout_s"] = 0.5
        fleet = Fleet({"retry-node": "gpf_token"}, proxy.url, tmp_path / "spools", **settings)
        if fault in ("reset", "timeout"):
            proxy.set_mode("reset" if fault == "reset" else "blackhole")
            threading.Timer(3.0, proxy.set_mode, args=("pass",)).start()
        _run(fleet, 1.0, drain=30)
    sends = {b: t for b, t in col.sends.items()}
    gaps = [b - a for t in sends.values() for a, b in itertools.pairwise(t)]
    (a,) = fleet.agents
    figures.update(
        fault=fault,
        batches=len(sends),
        sends_per_batch=sorted({len(t) for t in sends.values()}),
        max_gap_s=round(max(gaps), 2) if gaps else None,
        retried=a.metrics.value(
            "gpufleet_agent_batches_retried_total",
            reason=fault if fault.isdigit() else ("connection" if fault == "reset" else "timeout"),
        ),
        delivered=a.spool.stats.delivered,
        spooled=a.spool.stats.spooled,
    )
    assert a.spool.stats.delivered == a.spool.stats.spooled and a.spool.stats.dropped_dead == 0
    if fault.isdigit():
        first = min(sends, key=lambda b: sends[b][0])
        assert len(sends[first]) == fails + 1  # retried until acknowledged, then never again
        # Retry-After (1 s on 429/503 from a real collector) is absent here: waits are the capped backoff
        assert max(gaps) <= 0.8 + 0.5
    else:
        assert figures["retried"] > 0


def test_fleet_does_not_reconnect_in_lockstep(scripted: Any, tmp_path: Path, figures: dict[str, Any]) -> None:
    n = int(knob("s6_agents", 20, 50))
    outage_until = time.monotonic() + 6
    col, url = scripted(lambda _b, _n: 503 if time.monotonic() < outage_until else 200)
    fleet = Fleet(
        {f"herd-{i:02d}": "gpf_token" for i in range(n)},
        url,
        tmp_path / "spools",
        interval_s=0.2,
        ship_interval_s=0.5,
        retry_base_s=0.5,
        retry_max_s=4.0,
        host=False,
    )
    _run(fleet, 8.0, drain=30)
    after = sorted(
        min(t for t in ts if t >= outage_until) - outage_until
        for ts in col.sends.values()
        if any(t >= outage_until for t in ts)
    )
    firsts = {}
    for b, ts in col.sends.items():
        node = b.split(":")[0]
        for t in ts:
            if t >= outage_until:
                firsts[node] = min(firsts.get(node, t), t)
    spread = sorted(t - outage_until for t in firsts.values())
    figures.update(
        agents=n,
        first_retry_after_recovery_s={
            "min": round(spread[0], 2),
            "max": round(spread[-1], 2),
            "stdev": round(statistics.pstdev(spread), 2),
        },
        requests_in_first_100ms=sum(1 for t in spread if t - spread[0] < 0.1),
    )
    assert len(after) > 0 and len(firsts) == n
    # full jitter: the fleet's first attempts after recovery are spread over seconds, not one burst
    assert spread[-1] - spread[0] >= 1.0
    assert figures["requests_in_first_100ms"] <= n // 2


def test_long_outage_with_capped_spool(scripted: Any, tmp_path: Path, figures: dict[str, Any]) -> None:
    outage_s = knob("s4_outage_s", 20, 600)
    # fake GPUs compress to ~15 B a sample: at 180 samples/s a 16 MiB cap would take hours to fill
    cap = int(knob("s4_spool_bytes", 32 * 1024, 1 * 2**20))
    col, url = scripted(lambda _b, _n: 200)
    with fault_proxy(int(url.rsplit(":", 1)[1])) as proxy:
        proxy.set_mode("refuse")
        fleet = Fleet(
            {"cap-node": "gpf_token"},
            proxy.url,
            tmp_path / "spools",
            interval_s=0.05,
            ship_interval_s=0.5,
            spool_max_bytes=cap,
            retry_base_s=0.2,
            retry_max_s=1.0,
        )
        (a,) = fleet.agents
        sizes: list[int] = []
        biggest_segment = 0
        try:
            fleet.start()
            t0 = time.monotonic()
            while time.monotonic() - t0 < outage_s:
                sizes.append(a.spool.bytes)
                # "one segment": the open one (raw frames) or a sealed one, whichever is bigger
                segs = [p for p in a.spool.dir.iterdir() if p.suffix in (".seg", ".open")]
                biggest_segment = max([biggest_segment, *map(_size, segs)])
                time.sleep(0.1)
            proxy.set_mode("pass")
            fleet.stop_sampling()
            fleet.wait_drained(60)
        finally:
            fleet.close()
    st = a.spool.stats
    figures.update(
        outage_s=outage_s,
        cap_bytes=cap,
        max_spool_bytes=max(sizes),
        biggest_segment=biggest_segment,
        spooled=st.spooled,
        delivered=st.delivered,
        dropped=st.dropped_full,
        dropped_metric=a.metrics.value("gpufleet_agent_samples_dropped_total", reason="spool_full"),
        received=sum(len(t) for t in col.sends.values()),
    )
    assert st.dropped_full > 0, "the outage never filled the spool"
    assert max(sizes) <= cap + biggest_segment
    assert st.dropped_full == st.spooled - st.delivered == figures["dropped_metric"]
