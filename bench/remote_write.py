"""GPU-samples per collector core through Prometheus remote write, beside the agents' wire format.

    python bench/remote_write.py [--nodes 100] [--scrapes 10] [--connections 8] [--samples-per-send 2000]

One collector process on loopback, against a scratch database, is fed the
same GPU rows twice, in one run:

* **native**: as the agents ship them: each node's dcgm-exporter scrapes
  parsed by the agent's ``dcgm_exporter`` source and attribution, 10 scrapes
  of 8 GPUs a batch (80 GPU-samples), msgpack + zstd, to ``/v1/ingest``;
* **remote write**: as a Prometheus scraping those exporters sends them: one
  ``TimeSeries`` per sample, every node scraped each second, cut into
  requests of ``--samples-per-send`` samples (Prometheus's
  ``max_samples_per_send``, 2000 by default), snappy, to ``/api/v1/write``.

The exporter is gpufleet's constructed dcgm-exporter output for its shipped
field list (``tests/fixtures/dcgm_exporter``), widened to 8 GPUs: 39 series a
GPU with dcgm-exporter's label set and Prometheus's ``instance`` and ``job``.
Both phases carry GPU rows only, every field alike.

The figure is GPU rows stored per CPU-second of the collector process (all of
its threads: HTTP, decoding, the group writer, and for remote write the
assembler that merges each (node, time) once its pieces are in), from the
first request until the last row is committed.  PostgreSQL's CPU is printed
beside it, not counted.  The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import psutil
import psycopg

from bench.ingest import start_collector
from gpufleet.agent.attribution import Attributor
from gpufleet.agent.batch import tick_record, to_batch
from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource
from gpufleet.auth import create_token
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.serverthread import free_port
from gpufleet.wire import encode
from testsupport import loadgen
from testsupport import remote_write as rw
from testsupport.pg import server_url

ROOT = Path(__file__).resolve().parents[1]
EXPOSITION = (ROOT / "tests" / "fixtures" / "dcgm_exporter" / "shipped_counters_2xh100.prom").read_text()
GPUS = 8


def node_exposition(node: str) -> str:
    """The 2-GPU exposition widened to 8 GPUs of ``node``, each with its own UUID, bus id and pod."""
    lines = []
    for line in EXPOSITION.splitlines():
        if line.startswith("#") or 'gpu="1"' in line:
            if line.startswith("#"):
                lines.append(line)
            continue
        for g in range(GPUS):
            lines.append(
                line.replace('gpu="0"', f'gpu="{g}"')
                .replace("nvidia0", f"nvidia{g}")
                .replace("00000000:18:00.0", f"00000000:{0x18 + g:02X}:00.0")
                .replace("GPU-5e3b8c1a-7d2f-4a96-b1c0-3f8e2d9a4b71", f"GPU-5e3b8c1a-7d2f-4a96-b1c0-{g:012d}")
                .replace("llm-pretrain-master-0", f"{node}-job-worker-{g}")
                .replace("gpu-node-7", node)
            )
    return "\n".join(lines) + "\n"


def native_requests(nodes: list[str], tokens: list[str], scrapes: int, t0: float) -> list[loadgen.Request]:
    """The agents' batches: 10 scrapes a batch, through the agent's own source and attribution."""
    out = []
    for i, node in enumerate(nodes):
        src = DcgmExporterSource("http://unused.invalid/metrics")
        text = node_exposition(node)
        src.scrape = lambda text=text: text  # type: ignore[method-assign]
        records = []
        for k in range(scrapes):
            rows = src.collect().gpus
            Attributor(use_processes=False).label(rows)
            records.append(tick_record(t0 + k, rows, None))
            if len(records) == 10 or k == scrapes - 1:
                body, headers = encode(to_batch(records, f"{node}:{k}", node), "msgpack", "zstd")
                headers["Authorization"] = f"Bearer {tokens[i]}"
                out.append(loadgen.Request(body, headers, len(records) * GPUS))
                records = []
    return out


def remote_write_requests(
    nodes: list[str], token: str, scrapes: int, t0_ms: int, per_send: int
) -> list[loadgen.Request]:
    """Prometheus's requests: scrape after scrape of every node, one series a sample, cut every ``per_send``."""
    per_node = {
        n: rw.from_exposition(node_exposition(n), 0, {"instance": f"{n}:9400", "job": "dcgm-exporter"})
        for n in nodes
    }
    series: list[rw.Series] = []
    for k in range(scrapes):
        for n in nodes:
            series.extend((labels, [(v, t0_ms + 1000 * k)]) for labels, ((v, _),) in per_node[n])
    headers = {**rw.HEADERS, "Authorization": f"Bearer {token}"}
    out = []
    for a in range(0, len(series), per_send):
        chunk = series[a : a + per_send]
        body = rw.compress(rw.write_request(chunk))
        out.append(loadgen.Request(body, headers, 0, path="/api/v1/write"))
    return out


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL process by pid (backends come and go: compare pid by pid)."""
    out = {}
    for p in psutil.process_iter(["name"]):
        if p.info["name"] and ("postgres" in p.info["name"] or "postmaster" in p.info["name"]):
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.Error:
                pass
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def gpu_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0])  # type: ignore[index]


def phase(
    name: str,
    url: str,
    port: int,
    pid: int,
    reqs: list[loadgen.Request],
    connections: int,
    expect_rows: int,
    timeout: float,
) -> dict[str, float]:
    """Send every request and wait for every row; the collector's CPU over that span."""
    before = gpu_rows(url)
    q: asyncio.Queue[loadgen.Request] = asyncio.Queue()
    for r in reqs:
        q.put_nowait(r)
    stats = loadgen.Stats()
    c0, p0, w0 = cpu(pid), postgres_cpu(), time.perf_counter()
    asyncio.run(loadgen.drive("127.0.0.1", port, q, connections, stats, time.monotonic() + timeout))
    deadline = time.monotonic() + timeout
    stored = gpu_rows(url) - before
    while stored < expect_rows and time.monotonic() < deadline:
        time.sleep(0.05)
        stored = gpu_rows(url) - before
    c1, p1, w1 = cpu(pid), postgres_cpu(), time.perf_counter()
    if stored != expect_rows:
        raise SystemExit(f"{name}: {stored} GPU rows stored of {expect_rows} (answers {stats.by_status})")
    out = {
        "rows": stored,
        "requests": len(reqs),
        "collector_cpu_s": c1 - c0,
        "postgres_cpu_s": spent(p0, p1),
        "wall_s": w1 - w0,
        "per_core": stored / (c1 - c0),
        "us_per_row": (c1 - c0) / stored * 1e6,
    }
    print(
        f"{name:>12}: {stored} GPU rows in {len(reqs)} requests, {out['wall_s']:.1f} s; collector "
        f"{out['collector_cpu_s']:.2f} CPU-s = {out['per_core']:,.0f} GPU-samples per core-second "
        f"({out['us_per_row']:.1f} µs a row); PostgreSQL {out['postgres_cpu_s']:.2f} CPU-s"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--scrapes", type=int, default=30, help="scrapes of each node (1 s apart) per phase")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--samples-per-send", type=int, default=2000, help="Prometheus's max_samples_per_send")
    ap.add_argument(
        "--merge-delay", type=float, default=1.0, help="remote_write.merge_delay_s of the collector"
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()

    settings = load_settings()
    nodes = [f"gpu-{i:04d}" for i in range(args.nodes)]
    with scratch_database(server_url(), "gpufleet_bench") as url:
        migrate.upgrade(url, settings)
        with psycopg.connect(url, autocommit=True) as conn:
            tokens = [create_token(conn, n, "node", n) for n in nodes]
            prom = create_token(conn, "prometheus", "remote_write")
        now = time.time()
        native = native_requests(nodes, tokens, args.scrapes, now - 3600)
        remote = remote_write_requests(
            nodes, prom, args.scrapes, int((now - 1800) * 1000), args.samples_per_send
        )
        series = len(rw.from_exposition(node_exposition("x"), 0))
        print(
            f"{args.nodes} nodes x {GPUS} GPUs x {args.scrapes} scrapes; {series // GPUS} series a GPU; "
            f"remote write: {len(remote)} requests of <= {args.samples_per_send} samples "
            f"({sum(len(r.body) for r in remote) / len(remote) / 1024:.0f} KiB snappy each)"
        )
        port = free_port()
        # Not the leader: its sweeps, rollups and run inference would spend CPU in both phases alike.
        os.environ.update(
            GPUFLEET_REMOTE_WRITE__MERGE_DELAY_S=str(args.merge_delay),
            GPUFLEET_REMOTE_WRITE__ASSEMBLE_EVERY_S="0.2",
            GPUFLEET_REMOTE_WRITE__ASSEMBLE="true",
        )
        proc = start_collector(url, port, leader=False)
        try:
            expect = args.nodes * args.scrapes * GPUS
            # A short warm-up of each path (the remote-write series cache fills on its first requests).
            phase(
                "warm-up",
                url,
                port,
                proc.pid,
                native_requests(nodes[:4], tokens[:4], 2, now - 7200),
                4,
                4 * 2 * GPUS,
                args.timeout,
            )
            phase(
                "warm-up",
                url,
                port,
                proc.pid,
                remote_write_requests(nodes, prom, 1, int((now - 5400) * 1000), args.samples_per_send),
                args.connections,
                args.nodes * GPUS,
                args.timeout,
            )
            nat = phase("native", url, port, proc.pid, native, args.connections, expect, args.timeout)
            rem = phase("remote write", url, port, proc.pid, remote, args.connections, expect, args.timeout)
        finally:
            proc.terminate()
            proc.wait(30)
    ratio = nat["per_core"] / rem["per_core"]
    print(
        f"remote write takes {ratio:.2f}x the collector CPU of the native format per GPU-sample "
        f"({rem['us_per_row']:.1f} against {nat['us_per_row']:.1f} µs)"
    )
    print(
        json.dumps(
            {
                "name": "remote_write_gpu_samples_per_core",
                "value": round(rem["per_core"]),
                "unit": "GPU-samples per collector CPU-second",
                "native": round(nat["per_core"]),
                "native_over_remote_write": round(ratio, 3),
                "remote_write_us_per_row": round(rem["us_per_row"], 2),
                "native_us_per_row": round(nat["us_per_row"], 2),
                "nodes": args.nodes,
                "scrapes": args.scrapes,
                "samples_per_send": args.samples_per_send,
                "connections": args.connections,
            }
        )
    )


if __name__ == "__main__":
    main()
