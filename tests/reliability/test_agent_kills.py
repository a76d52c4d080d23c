"""Scenario 3: the agent process is killed -9 again and again while the collector is down half the time.

The agent runs as a process of its own (:class:`testsupport.procs.AgentProc`)
and is restarted right after each kill, as systemd or a DaemonSet would;
the collector process is started and killed on a schedule offset by half a
period, so kills land both while batches are in flight and while sealed
segments wait for a collector that is not there.  On some kills the open
segment's last frame is also cut short before the restart -- the torn write a
kill in the middle of ``write`` leaves -- which recovery must count and drop
without wedging the agent.

What the agent produced is known exactly: the agent process lists every tick
record just before spooling it (:mod:`testsupport.agentproc`).  Checked
against the database:

* a kill costs only what was not yet on disk (the record being written) and a
  torn frame: every lost tick lies within 1 s before its kill, and the loss is
  counted per kill, in ticks and samples;
* ticks land whole, never twice (rows = distinct (node, gpu, time));
* every acknowledged batch is stored (the oracle);
* the last agent ships everything its killed predecessors left, then stops
  cleanly with an empty spool.
"""

from __future__ import annotations

import json
import struct
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.agent.spool import OPEN_MAGIC, read_records
from gpufleet.collector.copy_binary import PG_EPOCH_S
from tests.reliability.conftest import knob, node_tokens
from testsupport.oracle import Oracle, integrity, micros
from testsupport.procs import AgentProc, CollectorProc

#: A lost tick must lie within this long before the kill that cost it, seconds.
LOSS_BOUND_S = 1.0


def tear_open_segment(spool: Path) -> float | None:
    """Cut the open segment's last frame in half (a torn write); the torn record's time, or None when
    there is no record to tear."""
    opens = sorted(spool.glob("*.open"))
    if not opens:
        return None
    path = opens[-1]
    data = path.read_bytes()
    got = read_records(data)
    if not got.records or got.good_bytes != len(data):
        return None
    starts, pos = [], len(OPEN_MAGIC)
    while pos < len(data):
        starts.append(pos)
        pos += 8 + struct.unpack_from("<I", data, pos)[0]
    last = starts[-1]
    with open(path, "r+b") as f:
        f.truncate(last + (len(data) - last) // 2)
    t: float = got.records[-1]["t"]
    return t


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by kill -9
    return out


def landed(db: str, node: str) -> Counter[int]:
    """Rows in the database per sample time (microseconds since 2000, as the oracle keys them)."""
    out: Counter[int] = Counter()
    with psycopg.connect(db) as conn:
        for table in ("gpu_samples", "host_samples"):
            rows = conn.execute(
                f"SELECT ((extract(epoch FROM time) - %s) * 1000000)::int8, count(*) "
                f"FROM {table} WHERE node = %s GROUP BY time",
                (PG_EPOCH_S, node),
            ).fetchall()
            for us, n in rows:
                out[us] += n
    return out


@pytest.mark.timeout(900)  # full size: 10 kills over 5 minutes, then the drain
def test_agent_kill9_every_period_with_collector_down_half_the_time(
    fresh_db: str, tmp_path: Path, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    every = knob("s3_kill_every_s", 5, 30)
    kills = int(knob("s3_duration_s", 40, 300) // every)
    interval = knob("s3_interval_s", 0.2, 0.2)
    node = "kill-node"
    token = node_tokens(fresh_db, [node])[node]
    col = collectors(fresh_db)
    agent = AgentProc(
        col.url,
        token,
        node,
        tmp_path,
        gpus=2,
        settings={
            "interval_s": interval,
            "ship_interval_s": 1.0,
            "retry_base_s": 0.2,
            "retry_max_s": 1.0,
            "request_timeout_s": 5.0,
            "shutdown_ship_s": 15.0,
        },
    )
    # Kill k at k * every; the collector switches at (j + 1/2) * every: up in [0, every/2), down in
    # [every/2, 3 every/2), up again ..., so odd kills find it down and even ones up.
    events = sorted(
        [(k * every, "kill", k) for k in range(1, kills + 1)]
        + [((j + 0.5) * every, "collector", j) for j in range(kills)]
    )
    kill_times: list[float] = []
    torn: dict[int, float] = {}
    up_s = polled_s = 0.0
    try:
        col.start().wait_up()
        agent.start()
        t0 = time.monotonic()
        for at, what, k in events:
            while time.monotonic() < t0 + at:
                tp = time.monotonic()
                try:
                    up = col.alive() and httpx.get(col.url + "/healthz", timeout=0.2).status_code == 200
                except httpx.HTTPError:
                    up = False
                time.sleep(max(0.0, min(0.25, t0 + at - time.monotonic())))
                dt = time.monotonic() - tp
                polled_s += dt
                up_s += dt if up else 0.0
            if what == "collector":
                if col.alive():
                    col.kill()
                else:
                    col.start()
                continue
            assert agent.alive(), agent.tail()
            kill_times.append(time.time())
            agent.kill()
            if k % 4 in (1, 2):  # both while the collector is down (odd k) and up (even k)
                t_torn = tear_open_segment(agent.spool_dir)
                if t_torn is not None:
                    torn[k] = t_torn
            agent.start()
        if not col.alive():
            col.start()
        col.wait_up()
        # The last agent ships what every killed one left, and keeps shipping what it samples.
        t_last = time.time()
        deadline = time.monotonic() + 60
        while not (
            any(p["t"] > t_last + 2 for p in read_jsonl(agent.produced))
            and not list(agent.spool_dir.glob("*.seg"))
        ):
            assert agent.alive(), agent.tail()
            assert time.monotonic() < deadline, f"spool not drained: {sorted(agent.spool_dir.iterdir())}"
            time.sleep(0.5)
        assert agent.terminate(30) == 0, agent.tail()
    finally:
        agent.kill()
        col.kill()

    produced = read_jsonl(agent.produced)
    rows = landed(fresh_db, node)
    produced_us = {int(micros([p["t"]])[0]): p for p in produced}
    # Lives: the ticks before kill 1, between kill 1 and 2, ..., after the last kill (a clean stop).
    bounds = [*kill_times, float("inf")]
    lost: list[list[float]] = [[] for _ in bounds]
    lost_samples = [0] * len(bounds)
    partial = []
    for us, p in produced_us.items():
        got = rows.get(us, 0)
        if got == p["n"]:
            continue
        if got:
            partial.append((p["t"], got, p["n"]))
            continue
        life = next(i for i, b in enumerate(bounds) if p["t"] <= b)
        lost[life].append(p["t"])
        lost_samples[life] += p["n"]
    unknown = sorted(set(rows) - set(produced_us))
    oracle = Oracle.load([agent.acked])
    result = integrity(fresh_db, oracle)
    log = agent.tail(10**7)
    counted_torn = log.count("ends in a torn or corrupt record")
    lost_span = [round(max(kill_times[i] - t for t in ts), 3) for i, ts in enumerate(lost[:-1]) if ts]
    figures.update(
        kill_every_s=every,
        kills=len(kill_times),
        interval_s=interval,
        agent_starts=agent.starts,
        collector_starts=col.starts,
        collector_up_share=round(up_s / polled_s, 2),
        torn_injected=len(torn),
        torn_counted=counted_torn,
        produced_ticks=len(produced),
        produced_samples=sum(p["n"] for p in produced),
        lost_ticks_per_kill=[len(x) for x in lost[:-1]],
        lost_samples_per_kill=lost_samples[:-1],
        lost_after_last_restart=len(lost[-1]),
        max_lost_before_kill_s=max(lost_span, default=0.0),
        partial_ticks=len(partial),
        unknown_rows=len(unknown),
        **result.as_dict(),
    )

    assert len(kill_times) == kills and agent.starts == kills + 1
    assert (
        up_s / polled_s < 0.75 and col.starts >= kills // 2
    )  # the collector really was down much of the time
    assert not partial and not unknown  # ticks land whole; nothing lands that was not produced
    for i, ts in enumerate(lost[:-1]):
        # At most the record being written when the kill came, plus the record torn on disk.
        assert len(ts) <= 1 + (i + 1 in torn), (i + 1, ts, kill_times[i])
        assert all(kill_times[i] - LOSS_BOUND_S <= t <= kill_times[i] for t in ts), (i + 1, ts, kill_times[i])
        if i + 1 in torn:
            assert torn[i + 1] in ts  # the torn record is the one lost
    assert not lost[-1]  # the last agent stopped cleanly: everything it produced landed
    assert counted_torn >= len(torn) > 0
    assert result.missing_samples == 0 and result.missing_batches == 0
    assert result.duplicate_rows == 0
    # Everything that landed was acknowledged to the agent at some point, and nothing else did.
    assert (
        result.acked_samples == sum(rows.values()) == result.rows["gpu_samples"] + result.rows["host_samples"]
    )
    assert not list(agent.spool_dir.glob("*.seg")) and not list(agent.spool_dir.glob("*.open"))
