"""Ingest throughput: many nodes posting through HTTP vs raw COPY of the same rows.

    python bench/ingest.py [--nodes 2000] [--seconds 20] [--connections 64,256,512] [--collectors 1]

Starts a collector process on loopback against a scratch database, posts
realistic batches (8 GPUs x 10 s = 80 GPU rows + 10 host rows per request,
msgpack + zstd) from ``--nodes`` node identities as fast as the collector
acknowledges them, and in the same run measures psycopg binary COPY of the
same rows in 10k-row batches into the same table, before and after the HTTP
phase (on a shared host the database's speed drifts; the ratio is to the
mean of the two).  Prints the rates, their ratio and the stored bytes per GPU sample; on a TimescaleDB server
(GPUFLEET_TEST_TIMESCALE_URL) also the bytes per sample after compression.
``--collectors N`` runs N collector processes (replicas behind a balancer;
the connections are spread over them), since one process is bound by the
interpreter lock well before PostgreSQL is.

Each connection waits for its answer before sending again, so few connections
measure how fast a request goes round, not how much the collector takes: at 64
connections a group commit's time bounds the rate with half the collector's
core idle.  The timed phase is therefore run once per entry of
``--connections`` (a fleet's nodes each hold a connection of their own), each
phase's rate printed with the CPU share of the collector, and the headline
rate is the best phase's.  The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import psycopg

from gpufleet.auth import hash_secret, new_secret
from gpufleet.catalog import GPU_BY_NAME, gpu_columns
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.serverthread import free_port
from gpufleet.wire import encode
from testsupport import loadgen
from testsupport.pg import server_url, timescale_server_url

TEMPLATES = 64


def make_tokens(url: str, nodes: list[str]) -> list[str]:
    secrets_ = [new_secret() for _ in nodes]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_tokens (name, token_hash, role, node) SELECT n, h, 'node', n "
            "FROM unnest(%s::text[], %s::bytea[]) AS u(n, h)",
            (nodes, [hash_secret(s) for s in secrets_]),
        )
    return secrets_


def build_requests(nodes: list[str], tokens: list[str], count: int, t0: float) -> list[loadgen.Request]:
    templates = [loadgen.batch_doc("tmpl", i, 0, t0 + 10 * i) for i in range(TEMPLATES)]
    reqs = []
    for k in range(count):
        i = k % len(nodes)
        doc = dict(templates[k % TEMPLATES])
        doc["node"] = nodes[i]
        doc["batch_id"] = f"{nodes[i]}:{k}"
        body, headers = encode(doc, "msgpack", "zstd")
        headers["Authorization"] = f"Bearer {tokens[i]}"
        reqs.append(loadgen.Request(body, headers, len(doc["gpu"]["time"])))
    return reqs


PG_TYPES = {
    "real": "float4",
    "double": "float8",
    "smallint": "int2",
    "integer": "int4",
    "bigint": "int8",
    "text": "text",
}


def psycopg_copy(conn: psycopg.Connection, rows: list[tuple], names: list[str]) -> None:
    """The standard psycopg way: binary COPY, one write_row per row."""
    types = ["timestamptz", "text", "int2"] + [PG_TYPES[GPU_BY_NAME[n].kind] for n in names[3:]]
    with conn.cursor().copy(f"COPY gpu_samples ({', '.join(names)}) FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(types)
        for row in rows:
            cp.write_row(row)


def template_rows(t0: float, node: str, index: int) -> tuple[list[str], list[tuple]]:
    cols = loadgen.batch_doc(node, index, 0, t0 + 10 * index)["gpu"]
    names = [n for n in gpu_columns() if n == "node" or n in cols]
    cols = dict(
        cols, time=[datetime.fromtimestamp(t, UTC) for t in cols["time"]], node=[node] * len(cols["time"])
    )
    return names, list(zip(*(cols[n] for n in names), strict=True))


def copy_baseline(url: str, rows_total: int, t0: float) -> float:
    """psycopg binary COPY of the same wide rows, 10k rows per transaction."""
    templates = [template_rows(t0, f"copy-{i}", i) for i in range(TEMPLATES)]
    names = templates[0][0]
    rows = [r for _, rs in templates for r in rs]
    batches = [(rows * (10_000 // len(rows) + 1))[:10_000] for _ in range(rows_total // 10_000)]
    with psycopg.connect(url) as conn:
        start = time.perf_counter()
        for b in batches:
            with conn.transaction():
                psycopg_copy(conn, b, names)
        elapsed = time.perf_counter() - start
        conn.execute("TRUNCATE gpu_samples")
        conn.commit()
    return len(batches) * 10_000 / elapsed


def start_collector(url: str, port: int, leader: bool, profile: str | None = None) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        GPUFLEET_DATABASE_URL=url,
        GPUFLEET_COLLECTOR_PORT=str(port),
        GPUFLEET_LOG_LEVEL="WARNING",
        GPUFLEET_LEADER="true" if leader else "false",
    )
    cmd = [sys.executable, "-m", "gpufleet.cli", "collector"]
    if profile:  # py-spy flame data of the collector, for finding where time goes
        cmd = ["py-spy", "record", "--format", "raw", "-o", profile, "--gil", "--threads", "--", *cmd]
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("collector did not become ready")


async def drive_all(
    ports: list[int],
    q: asyncio.Queue[loadgen.Request],
    connections: int,
    stats: loadgen.Stats,
    deadline: float,
) -> None:
    """The connections spread evenly over the collectors, all taking from one queue."""
    share = max(1, connections // len(ports))
    await asyncio.gather(*(loadgen.drive("127.0.0.1", port, q, share, stats, deadline) for port in ports))


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of connection counts: {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"connection counts must be 1 or more: {text!r}")
    return counts


@dataclass
class Phase:
    """One timed phase at a fixed number of connections."""

    connections: int
    stats: loadgen.Stats
    elapsed: float
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        return self.stats.gpu_rows / self.elapsed

    def _quantile_ms(self, q: float) -> float:
        lat = sorted(self.stats.latencies)
        return lat[min(int(len(lat) * q), len(lat) - 1)] * 1000 if lat else float("nan")

    @property
    def p50_ms(self) -> float:
        return self._quantile_ms(0.5)

    @property
    def p99_ms(self) -> float:
        return self._quantile_ms(0.99)

    def cpu_us_per_request(self) -> dict[str, float]:
        return {k: v / max(self.stats.ok, 1) * 1e6 for k, v in self.cpu.items()}

    def cores(self) -> dict[str, float]:
        return {k: v / self.elapsed for k, v in self.cpu.items()}


def timed_phase(
    ports: list[int], pids: list[int], reqs: list[loadgen.Request], connections: int, seconds: float
) -> tuple[Phase, list[loadgen.Request]]:
    """Send ``reqs`` over ``connections`` for ``seconds``; the phase and the requests never taken."""
    q: asyncio.Queue[loadgen.Request] = asyncio.Queue()
    for r in reqs:
        q.put_nowait(r)
    stats = loadgen.Stats()
    cpu0 = cpu_seconds(pids)
    start = time.perf_counter()
    asyncio.run(drive_all(ports, q, connections, stats, time.monotonic() + seconds))
    elapsed = time.perf_counter() - start
    cpu1 = cpu_seconds(pids)
    if q.empty():
        print(
            f"warning: all prepared requests were sent within the phase at {connections} connections; "
            "raise --rate-guess",
            file=sys.stderr,
        )
    left = []
    while not q.empty():
        left.append(q.get_nowait())
    return Phase(connections, stats, elapsed, {k: cpu1[k] - cpu0[k] for k in cpu0}), left


def cpu_seconds(collector_pids: list[int]) -> dict[str, float]:
    """CPU seconds used so far by the collectors, PostgreSQL and this load generator."""
    import psutil

    def total(p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    out = {"collector": 0.0, "collector_sys": 0.0, "postgres": 0.0, "loadgen": total(psutil.Process())}
    for pid in collector_pids:
        try:
            out["collector"] += total(psutil.Process(pid))
            out["collector_sys"] += psutil.Process(pid).cpu_times().system
        except psutil.Error:
            pass
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == "postgres":
            try:
                out["postgres"] += total(p)
            except psutil.Error:
                pass
    return out


def bytes_per_sample(url: str) -> float:
    with psycopg.connect(url) as conn:
        n = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
        size = conn.execute("SELECT pg_total_relation_size('gpu_samples')").fetchone()[0]  # type: ignore[index]
    return size / max(n, 1)


def timescale_compressed_bytes(t0: float) -> float | None:
    """Bytes per GPU sample on TimescaleDB after compression, for realistic
    telemetry: an hour of the simulator's mixed fleet (80 GPUs at 1 Hz; random
    numbers, unlike real telemetry, would not compress and measure nothing)."""
    server = timescale_server_url()
    if server is None:
        return None
    from gpufleet.sim import Fleet
    from testsupport.simfeed import SimFeed

    settings = load_settings()
    with scratch_database(server, "gpufleet_bench") as url:
        migrate.upgrade(url, settings)
        with psycopg.connect(url, autocommit=True) as conn:
            # Compress by hand, not racing the background policy for the same chunk.
            conn.execute("SELECT remove_compression_policy('gpu_samples', if_exists => true)")
            day = float(int(t0 // 86400 - 3) * 86400)
            fleet = Fleet.from_scenario("mixed_fleet", seed=1, start_time=day + 3600)
            feed = SimFeed(conn, fleet, ship_every_s=60)
            feed.run_until(fleet.t0 + 3600)
            feed.ship()
            feed.close()
            n = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
            conn.execute(
                "SELECT compress_chunk(c, if_not_compressed => true) FROM show_chunks('gpu_samples') c"
            )
            size = conn.execute(
                "SELECT sum(total_bytes) FROM hypertable_detailed_size('gpu_samples')"
            ).fetchone()[0]  # type: ignore[index]
    return float(size) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the timed phase")
    ap.add_argument(
        "--connections",
        type=_counts,
        default=[64, 256, 512],
        help="comma-separated connection counts, one timed phase each (the best is the headline)",
    )
    ap.add_argument("--collectors", type=int, default=1, help="collector processes (replicas)")
    ap.add_argument("--rate-guess", type=float, default=120_000, help="GPU samples/s to prepare requests for")
    ap.add_argument("--leader", action="store_true", help="also run rollups in the collector during the test")
    ap.add_argument("--profile", help="write a py-spy profile of the collector to this file")
    args = ap.parse_args()

    t0 = time.time() - 3600
    settings = load_settings()
    with scratch_database(server_url(), "gpufleet_bench") as url:
        migrate.upgrade(url, settings)
        nodes = [f"node-{i:05d}" for i in range(args.nodes)]
        tokens = make_tokens(url, nodes)
        total_requests = (
            int(args.rate_guess * max(1, args.collectors) * args.seconds * len(args.connections) / 80) + 500
        )
        print(f"preparing {total_requests} requests from {args.nodes} nodes ...", flush=True)
        reqs = build_requests(nodes, tokens, total_requests, t0)
        copy_before = copy_baseline(url, 400_000, t0)
        print(f"raw COPY (10k-row batches), before: {copy_before:,.0f} GPU samples/s", flush=True)

        ports: list[int] = []
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(max(1, args.collectors)):
                ports.append(free_port())
                procs.append(
                    start_collector(url, ports[-1], args.leader and i == 0, args.profile if i == 0 else None)
                )
            for port in ports:
                warm = asyncio.Queue()  # type: asyncio.Queue[loadgen.Request]
                for r in reqs[:300]:
                    warm.put_nowait(r)
                asyncio.run(
                    loadgen.drive("127.0.0.1", port, warm, 16, loadgen.Stats(), time.monotonic() + 60)
                )
            phases = []
            left = reqs[300:]
            for connections in args.connections:
                phase, left = timed_phase(ports, [p.pid for p in procs], left, connections, args.seconds)
                phases.append(phase)
        finally:
            for proc in procs:
                proc.send_signal(2 if args.profile else 15)
            for proc in procs:
                proc.wait(60)
        with psycopg.connect(url) as conn:
            stored = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
        bps = bytes_per_sample(url)
        # On a shared host the database's speed drifts: the baseline is taken
        # on both sides of the HTTP phases and the ratio is to their mean.
        copy_after = copy_baseline(url, 400_000, t0)
        copy_rate = (copy_before + copy_after) / 2
    ts_bps = timescale_compressed_bytes(t0)
    for ph in phases:
        print(
            f"HTTP ingest, {ph.connections} connections: {ph.rate:,.0f} GPU samples/s over {ph.elapsed:.1f} s "
            f"({ph.stats.ok} requests, statuses {ph.stats.by_status}, p50 {ph.p50_ms:.1f} ms, p99 {ph.p99_ms:.1f} ms); "
            "CPU per request (us): "
            + ", ".join(f"{k} {v:.0f}" for k, v in ph.cpu_us_per_request().items())
            + "; CPU share: "
            + ", ".join(f"{k} {v:.2f} cores" for k, v in ph.cores().items())
        )
    best = max(phases, key=lambda ph: ph.rate)
    rate = best.rate
    print(
        f"{stored} rows stored; raw COPY (10k-row batches): {copy_before:,.0f} before, {copy_after:,.0f} after, "
        f"{copy_rate:,.0f} GPU samples/s mean"
    )
    print(
        f"ratio to raw COPY: {rate / copy_rate:.2f} (the best phase, {best.connections} connections; "
        + ", ".join(f"{ph.rate / copy_rate:.2f} at {ph.connections}" for ph in phases)
        + ")"
    )
    print(f"stored bytes per GPU sample (plain PostgreSQL, heap + indexes): {bps:.1f}")
    if ts_bps is not None:
        print(f"stored bytes per GPU sample (TimescaleDB, compressed): {ts_bps:.1f}")
    print(
        json.dumps(
            {
                "name": "ingest",
                "value": round(rate),
                "unit": "gpu_samples_per_s",
                "samples_per_s": round(rate),
                "copy_samples_per_s": round(copy_rate),
                "copy_before_samples_per_s": round(copy_before),
                "copy_after_samples_per_s": round(copy_after),
                "ratio_to_copy": round(rate / copy_rate, 3),
                "bytes_per_sample": round(ts_bps if ts_bps else bps, 1),
                "bytes_per_sample_plain": round(bps, 1),
                "bytes_per_sample_timescale_compressed": None if ts_bps is None else round(ts_bps, 1),
                "p50_ms": round(best.p50_ms, 1),
                "p99_ms": round(best.p99_ms, 1),
                "collector_cpu_us_per_request": round(best.cpu_us_per_request()["collector"]),
                "nodes": args.nodes,
                "connections": best.connections,
                "connections_tried": args.connections,
                "phases": [
                    {
                        "connections": ph.connections,
                        "samples_per_s": round(ph.rate),
                        "ratio_to_copy": round(ph.rate / copy_rate, 3),
                        "p99_ms": round(ph.p99_ms, 1),
                        "collector_cores": round(ph.cores()["collector"], 2),
                    }
                    for ph in phases
                ],
                "collectors": max(1, args.collectors),
                "writers": load_settings().ingest.writers,
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        )
    )


if __name__ == "__main__":
    random.seed(1)
    main()
