"""Realistic ingest traffic without client overhead (benchmarks, load tests).

Bodies are encoded up front; a minimal HTTP/1.1 keep-alive client sends them
over loopback, so the sender's CPU cost stays small next to the collector's.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.wire import encode

GPUS_PER_NODE = 8


def gpu_columns(
    node_index: int, t0: float, seconds: int, gpus: int = GPUS_PER_NODE, rng: random.Random | None = None
) -> dict[str, list[Any]]:
    """A node's GPU samples at 1 Hz for ``seconds``: every contract column filled."""
    rng = rng or random.Random(node_index)
    n = seconds * gpus
    busy = [rng.uniform(0.6, 0.98) for _ in range(n)]
    return {
        "time": [t0 + i // gpus for i in range(n)],
        "gpu": [i % gpus for i in range(n)],
        "uuid": [f"GPU-{node_index:05d}-{i % gpus}" for i in range(n)],
        "util_pct": [100.0 * b for b in busy],
        "sm_active": busy,
        "tensor_active": [b * 0.7 for b in busy],
        "dram_active": [b * 0.4 for b in busy],
        "mem_used_mib": [61234.0] * n,
        "mem_total_mib": [81559.0] * n,
        "power_w": [90 + 600 * b for b in busy],
        "energy_mj": [int(1e9 + node_index * 1e6 + i * 500_000) for i in range(n)],
        "power_limit_w": [700.0] * n,
        "sm_clock_mhz": [1980] * n,
        "sm_clock_max_mhz": [1980] * n,
        "mem_clock_mhz": [2619] * n,
        "temp_c": [60 + int(10 * b) for b in busy],
        "mem_temp_c": [70] * n,
        "throttle_reasons": [0] * n,
        "pcie_tx_bytes_s": [1.2e9 * b for b in busy],
        "pcie_rx_bytes_s": [2.1e9 * b for b in busy],
        "pcie_gen": [5] * n,
        "pcie_gen_max": [5] * n,
        "pcie_width": [16] * n,
        "pcie_width_max": [16] * n,
        "nvlink_tx_bytes_s": [3e10 * b for b in busy],
        "nvlink_rx_bytes_s": [3e10 * b for b in busy],
        "ecc_dbe_vol": [0] * n,
        "xid": [0] * n,
    }


def host_columns(t0: float, seconds: int, rng: random.Random) -> dict[str, list[Any]]:
    return {
        "time": [t0 + i for i in range(seconds)],
        "cpu_user_pct": [rng.uniform(10, 40) for _ in range(seconds)],
        "cpu_system_pct": [rng.uniform(2, 6) for _ in range(seconds)],
        "cpu_iowait_pct": [rng.uniform(0, 2) for _ in range(seconds)],
        "cpu_idle_pct": [rng.uniform(50, 80) for _ in range(seconds)],
        "cpu_count": [192] * seconds,
        "disk_read_bytes_s": [rng.uniform(1e7, 5e8) for _ in range(seconds)],
        "disk_write_bytes_s": [rng.uniform(1e6, 1e7) for _ in range(seconds)],
        "disk_util_pct": [rng.uniform(5, 30) for _ in range(seconds)],
        "disk_await_ms": [rng.uniform(0.2, 2) for _ in range(seconds)],
        "net_rx_bytes_s": [rng.uniform(1e8, 1e9) for _ in range(seconds)],
        "net_tx_bytes_s": [rng.uniform(1e8, 1e9) for _ in range(seconds)],
        "host_power_w": [rng.uniform(800, 1200) for _ in range(seconds)],
    }


def batch_doc(node: str, node_index: int, seq: int, t0: float, seconds: int = 10) -> dict[str, Any]:
    rng = random.Random(node_index * 1_000_003 + seq)
    return {
        "batch_id": f"{node}:{seq}",
        "node": node,
        "gpu": gpu_columns(node_index, t0, seconds, rng=rng),
        "host": host_columns(t0, seconds, rng),
    }


@dataclass
class Request:
    body: bytes
    headers: dict[str, str]
    gpu_rows: int
    #: Where it is posted (remote write: ``/api/v1/write``).
    path: str = "/v1/ingest"


def prepared(node: str, node_index: int, token: str, seq: int, t0: float, seconds: int = 10) -> Request:
    body, headers = encode(batch_doc(node, node_index, seq, t0, seconds), "msgpack", "zstd")
    headers["Authorization"] = f"Bearer {token}"
    return Request(body, headers, seconds * GPUS_PER_NODE)


@dataclass
class Stats:
    ok: int = 0
    gpu_rows: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)


async def _send(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, req: Request
) -> tuple[int, bytes]:
    head = [f"POST {req.path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(req.body)}\r\n"]
    head.extend(f"{k}: {v}\r\n" for k, v in req.headers.items())
    head.append("\r\n")
    writer.write("".join(head).encode() + req.body)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        if k.lower() == "content-length":
            length = int(v)
    body = await reader.readexactly(length) if length else b""
    return status, body


async def drive(
    host: str, port: int, queue: asyncio.Queue[Request], connections: int, stats: Stats, deadline: float
) -> None:
    """Send queued requests over ``connections`` keep-alive connections until the
    queue is empty or ``deadline`` (monotonic) passes.  Non-2xx requests are
    retried after a short pause, as an agent would."""

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.monotonic() < deadline:
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t = time.perf_counter()
                try:
                    status, _ = await _send(reader, writer, f"{host}:{port}", req)
                except (ConnectionError, asyncio.IncompleteReadError):
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    queue.put_nowait(req)
                    continue
                stats.by_status[status] = stats.by_status.get(status, 0) + 1
                if 200 <= status < 300:
                    stats.ok += 1
                    stats.gpu_rows += req.gpu_rows
                    stats.latencies.append(time.perf_counter() - t)
                else:
                    queue.put_nowait(req)
                    await asyncio.sleep(0.05)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
