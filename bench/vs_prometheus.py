"""gpufleet beside Prometheus and VictoriaMetrics: one simulated fleet, three stacks, one run.

    python bench/vs_prometheus.py [--quick] [--fleets 1000,4000,8000,16000,32000] [--window 12]

About 10 minutes with the defaults on 2 cores, under 7 with ``--quick``.

The same fleet (8 GPUs a node, 25 values per GPU a second) is offered to
every side, one side after the other so they never compete for the CPU:

* **Prometheus** (the Debian package's binary, own config, storage in a
  temporary directory, loopback only) scrapes every node's dcgm-exporter
  ``/metrics`` at 1 s.  The endpoints are simulated by one exporter process
  serving the exposition dcgm-exporter prints: the 25 fields of its shipped
  ``default-counters.csv`` (``tests/fixtures/realdata/dcgm-exporter``), with
  the label set of the real 8xH100 capture in
  ``tests/fixtures/realdata/dcgm-exporter-output-samples`` (gpu, UUID,
  pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, container,
  namespace, pod, pod_uid), integers for integer fields and six decimals for
  ratios and watts.
* **VictoriaMetrics** (the Debian package's single-node ``victoria-metrics``,
  ``-promscrape.config`` with the same targets, its own storage directory)
  scrapes the same endpoints at 1 s, measured as Prometheus is.  Its stored
  bytes per GPU-sample are those of the same hours of four nodes as
  promtool's block, imported through its ``/api/v1/import`` and force-merged
  (``/internal/force_merge``), caches left out.  It does extra index work
  around the UTC day boundary: a run between 23:00 and 01:00 UTC says so.
* **gpufleet**: every node ships its batch of the same values every
  ``ship_interval_s`` (the agent's default, 10 s, or ``--ship-interval``; the agents' wire format:
  msgpack, typed columns, zstd, with the agent's id and version) to one collector
  process (``--collectors N``: N replicas, the nodes spread over them as a
  balancer would, all their CPU and memory counted), which stores them in
  PostgreSQL; node ship times are spread over the interval, and each node
  sends over a connection of its own, kept alive between shipments as long
  as the collector keeps it open.

Measured for each side at each fleet size, over a steady window after a
warm-up: CPU per GPU-sample of everything the side runs (Prometheus; the
collector and the PostgreSQL processes serving its database plus the WAL
writer, checkpointer and background writer, read from /proc), resident
memory, and whether it keeps up at 1 Hz.  Prometheus keeps up when at least
99 % of the scrapes due in the window were done and the p99 scrape duration
is under half the interval; gpufleet when at least 99 % of the batches due
were acknowledged as stored and the p99 time from a batch being due to its
acknowledgement is under half the interval.  Stored bytes per GPU-sample:
Prometheus's TSDB as persisted blocks (an admin-API snapshot that writes the
head out as a block: chunks and index), gpufleet's ``gpu_samples`` table
with its indexes (plain PostgreSQL; with ``--timescale``, the gpufleet side
runs on the TimescaleDB server ``GPUFLEET_TEST_TIMESCALE_URL`` names, the
production layout, and this figure is its uncompressed chunks).  The storage ratio compares two hours
of four nodes' values as each side keeps them for good: a Prometheus block
made by promtool's backfill, and, where ``GPUFLEET_TEST_TIMESCALE_URL``
names a TimescaleDB 2.x server, the same values stored through gpufleet's
storing step and compressed.  The node side (exporters, agents) is left out on both
sides: it runs on the GPU nodes.  The exporter simulator's and the load
driver's CPU are printed so a reader can see they did not starve either side.

Ratios (Prometheus / gpufleet, VictoriaMetrics / gpufleet) are printed at the
largest fleet both kept up with, and of the largest fleets, with the host's
load average when each size was measured (the machine is shared).  The last
line is JSON.

``--http-floor`` measures, under the same load, the HTTP server alone (uvicorn
as the collector runs it, an app that stores nothing): the CPU a request costs
before any ingest work, which no change inside the collector's ingest path
can go below at the agents' batch size; beside it, in the same run, a bare
asyncio protocol on uvloop with httptools' parser answering the same bytes,
what a leaner Python front end could get down to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import errno
import json
import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import psycopg
import zstandard

from gpufleet import __version__
from gpufleet.config import AgentSettings
from gpufleet.serverthread import free_port

ROOT = Path(__file__).resolve().parents[1]
GPUS_PER_NODE = 8
#: Seconds of samples in each node's batch: the agent's default ``ship_interval_s``
#: (a longer interval would spread each request's fixed cost over more samples
#: than a fleet running the defaults does).
SHIP_EVERY_S = round(AgentSettings().ship_interval_s)
#: Seconds of distinct values per node template (the bodies cycle through them).
VARIANTS = 60
TEMPLATES = 16
#: Per second, the share of its distance to the mean a GPU's load gives back (long storage models).
MEAN_REVERSION = 0.05
COUNTERS_CSV = ROOT / "tests/fixtures/realdata/dcgm-exporter/default-counters.csv"

# The 25 fields of dcgm-exporter's default-counters.csv, in its order, and the
# value model each one follows: a gpufleet catalog field, which the agent sends
# in its place (gpufleet's agent reads NVML/DCGM and names the fields by its
# own catalog), except free memory, which the catalog keeps as the total.
DCGM_TO_FIELD = {
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_MEMORY_TEMP": "mem_temp_c",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_count",
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_copy_util_pct",
    "DCGM_FI_DEV_ENC_UTIL": "pcie_gen",  # no encoder field: the agent sends the PCIe generation
    "DCGM_FI_DEV_DEC_UTIL": "pcie_width",  # no decoder field: the PCIe width
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_FB_FREE": "mem_free_mib",  # the exporter's free memory; gpufleet stores the total (GPUFLEET_FIELDS)
    "DCGM_FI_DEV_FB_USED": "mem_used_mib",
    "DCGM_FI_DEV_FB_RESERVED": "sm_clock_max_mhz",  # no reserved field: the clock ceiling
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "nvlink_bandwidth_mb_s",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "power_limit_w",  # no licence field: the power limit
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failed",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx_bytes_s",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx_bytes_s",
}


#: The 25 fields gpufleet's agent sends for them: the catalog has no free memory, but the total
#: (DCGM_FI_DEV_FB_TOTAL, NVML's total), a constant from which free = total - used.
GPUFLEET_FIELDS = tuple("mem_total_mib" if f == "mem_free_mib" else f for f in DCGM_TO_FIELD.values())


def dcgm_fields() -> list[tuple[str, str, str]]:
    """(name, Prometheus type, help) of the shipped default counters, labels left out."""
    out = []
    with COUNTERS_CSV.open() as f:
        for row in csv.reader(f):
            if not row or row[0].lstrip().startswith("#") or len(row) < 3:
                continue
            name, kind, help_ = row[0].strip(), row[1].strip(), ",".join(row[2:]).strip()
            if kind != "label":
                out.append((name, kind, help_))
    assert [n for n, _, _ in out] == list(DCGM_TO_FIELD), "default-counters.csv changed"
    return out


# ----------------------------------------------------------------------------
# One value model for both sides


def value_model(seed: int = 1, seconds: int = VARIANTS, templates: int = TEMPLATES) -> dict[str, np.ndarray]:
    """Per field: values[template, second, gpu], shaped like real telemetry
    (a slowly moving load per GPU, constants that stay constant, a counter).

    The live runs cycle through ``VARIANTS`` seconds of it (harmless for CPU); the storage
    comparison takes as many seconds as it stores (:func:`storage_model`), since a series that
    repeats every minute is one a block compressor (VictoriaMetrics' zstd) stores nearly for free:
    0.8 B per GPU-sample for two hours of four nodes, where no real GPU repeats itself."""
    rng = np.random.default_rng(seed)
    shape = (templates, seconds, GPUS_PER_NODE)
    steps = rng.normal(0, 0.02, shape)
    if seconds <= VARIANTS:
        walk = np.cumsum(steps, axis=1)
    else:
        # Over hours a free random walk of this step wanders to the clip and stays there (constant
        # series, which cost any store nothing); the load reverts to its mean instead, spread +-0.06.
        walk = np.empty(shape)
        x = np.zeros((templates, GPUS_PER_NODE))
        for t in range(seconds):
            x = x * (1 - MEAN_REVERSION) + steps[:, t]
            walk[:, t] = x
    busy = np.clip(0.8 + walk, 0.05, 0.99)
    busy = np.round(busy, 3)
    ones = np.ones(shape)
    power = np.round(90 + 600 * busy, 3)
    energy = 1e9 + np.cumsum(power * 1000, axis=1)
    return {
        "sm_clock_mhz": np.where(busy > 0.95, 1755, 1980) * ones,
        "mem_clock_mhz": 2619 * ones,
        "mem_temp_c": np.round(70 + 6 * busy),
        "temp_c": np.round(55 + 12 * busy),
        "power_w": power,
        "energy_mj": np.round(energy),
        "pcie_replay_count": 0 * ones,
        "util_pct": np.round(100 * busy),
        "mem_copy_util_pct": np.round(40 * busy),
        "pcie_gen": 5 * ones,
        "pcie_width": 16 * ones,
        "xid": 0 * ones,
        "mem_total_mib": 81559 * ones,
        "mem_free_mib": 81559 - np.round(61234 + 40 * busy),
        "mem_used_mib": np.round(61234 + 40 * busy),
        "sm_clock_max_mhz": 1980 * ones,
        "nvlink_bandwidth_mb_s": np.round(30000 * busy),
        "power_limit_w": 700 * ones,
        "remapped_rows_uncorrectable": 0 * ones,
        "remapped_rows_correctable": 0 * ones,
        "remapped_rows_failed": 0 * ones,
        "gr_engine_active": np.round(busy * 0.97, 6),
        "tensor_active": np.round(busy * 0.45, 6),
        "dram_active": np.round(busy * 0.55, 6),
        "pcie_tx_bytes_s": np.round(1.2e9 * busy),
        "pcie_rx_bytes_s": np.round(2.1e9 * busy),
    }


def storage_model(nodes: int, seconds: int) -> dict[str, np.ndarray]:
    """The value model over every second the storage comparison stores, a template per node."""
    return value_model(seed=1, seconds=seconds, templates=max(1, min(nodes, TEMPLATES)))


def stored_series(model: dict[str, np.ndarray], name: str, k: int, secs: np.ndarray) -> np.ndarray:
    """values[second, gpu] of node template ``k`` at absolute seconds ``secs``, for the storage
    comparison (:func:`storage_model`: as many seconds as stored), except the energy counter, which
    keeps counting up as a real one does (the live runs' bodies cycle it too, harmless for
    CPU, but a counter falling back every minute would cost every side's compression)."""
    if name != "energy_mj":
        return model[name][k, secs % model[name].shape[1]]
    step = np.round(model["power_w"][k, secs % model["power_w"].shape[1]] * 1000)
    return 1e9 + np.cumsum(step, axis=0)


NODE_MARK = b"#####"  # five characters: the node number, so every body keeps its length


def exposition_bodies(model: dict[str, np.ndarray]) -> list[list[bytes]]:
    """bodies[template][second]: dcgm-exporter's text, the node number left as NODE_MARK."""
    fields = dcgm_fields()
    out: list[list[bytes]] = []
    for k in range(TEMPLATES):
        per_second = []
        labels = [
            f'gpu="{g}",UUID="GPU-{k:02x}{g:02x}9c8d-69c4-b61d-e0bc-#####{g:07d}",'
            f'pci_bus_id="00000000:{0x18 + 0x11 * g:02X}:00.0",device="nvidia{g}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-#####",DCGM_FI_DRIVER_VERSION="580.105.08",'
            f'container="main",namespace="ml-research",pod="llm-pretrain-worker-#####-{g}",pod_uid=""'
            for g in range(GPUS_PER_NODE)
        ]
        for s in range(VARIANTS):
            lines = []
            for name, kind, help_ in fields:
                lines.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n")
                vals = model[DCGM_TO_FIELD[name]][k, s]
                ints = (
                    bool(np.all(vals == np.round(vals)))
                    and "ACTIVE" not in name
                    and name != "DCGM_FI_DEV_POWER_USAGE"
                )
                for g in range(GPUS_PER_NODE):
                    v = f"{int(vals[g])}" if ints else f"{vals[g]:.6f}"
                    lines.append(f"{name}{{{labels[g]}}} {v}\n")
            per_second.append("".join(lines).encode())
        out.append(per_second)
    return out


# ----------------------------------------------------------------------------
# The exporter simulator (its own process: --serve-exporter)


def serve_exporter(port: int) -> None:
    model = value_model()
    bodies = exposition_bodies(model)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: "

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                path = line.split(b" ")[1] if line.count(b" ") >= 2 else b"/"
                while await reader.readline() not in (b"\r\n", b""):
                    pass
                parts = path.split(b"/")  # /n/<node>/metrics
                node = int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else 0
                body = bodies[node % TEMPLATES][int(time.time()) % VARIANTS].replace(
                    NODE_MARK, b"%05d" % node
                )
                writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    refused = [0]

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Past the process's file descriptors (Prometheus far behind, reconnecting on
        # every timed-out scrape) every refused accept would print a traceback: count them.
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            refused[0] += 1
            return
        loop.default_exception_handler(context)

    async def report() -> None:
        while True:
            await asyncio.sleep(5)
            if refused[0]:
                print(
                    f"exporter simulator: {refused[0]} connections refused in the last 5 s, out of file "
                    f"descriptors (limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}); scrapes of this "
                    "size are failing here, not in Prometheus",
                    file=sys.stderr,
                    flush=True,
                )
                refused[0] = 0

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(on_error)
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await asyncio.gather(server.serve_forever(), report())

    asyncio.run(main())


# ----------------------------------------------------------------------------
# /proc readings


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared memory (PostgreSQL's buffers) counted once over its sharers."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------
# Prometheus side


@dataclass
class Step:
    gpus: int
    cpu_us_per_gpu_sample: float = float("nan")
    cpu_cores: float = float("nan")
    rss_mib: float = float("nan")
    bytes_per_gpu_sample: float = float("nan")
    kept_up: bool = False
    done_frac: float = 0.0
    p99_s: float = float("nan")
    helper_cores: float = float("nan")  # the exporter simulator or the load driver
    detail: dict[str, Any] = field(default_factory=dict)


def stored_bytes(
    base: str, data: Path, detail: dict[str, Any], timeout_s: float = 120.0
) -> tuple[float, float]:
    """Bytes per GPU-sample in a snapshot of Prometheus's storage and in its WAL.

    Far past its edge Prometheus can take minutes to answer, or not answer: the
    step's figures are then NaN (printed "n/a") and ``detail["not_measured"]``
    says why, instead of the run ending there and losing every figure before it.
    """
    try:
        own = httpx.get(f"{base}/metrics", timeout=timeout_s).text
        appended = sum(
            float(line.rsplit(" ", 1)[1])
            for line in own.splitlines()
            if line.startswith("prometheus_tsdb_head_samples_appended_total")
        )
        r = httpx.post(f"{base}/api/v1/admin/tsdb/snapshot", params={"skip_head": "false"}, timeout=timeout_s)
        r.raise_for_status()
        snap = data / "snapshots" / r.json()["data"]["name"]
    except (httpx.HTTPError, KeyError, ValueError) as e:
        detail["not_measured"] = (
            f"storage: Prometheus did not answer for its snapshot ({type(e).__name__}: {e})"
        )
        return math.nan, math.nan
    per_scrape = 25 * GPUS_PER_NODE
    dcgm_samples = appended * per_scrape / (per_scrape + 5)  # + up, scrape_duration_seconds, ...
    return (
        per_sample(tree_size(snap), dcgm_samples / 25),
        per_sample(tree_size(data / "wal"), dcgm_samples / 25),
    )


def write_scrape_config(tmp: Path, config: Path, exporter_port: int, nodes: int) -> None:
    """A 1 s scrape of every simulated node's dcgm-exporter page (file service discovery in ``tmp``),
    the same for Prometheus and VictoriaMetrics."""
    targets = [
        {
            "targets": [f"127.0.0.1:{exporter_port}"],
            "labels": {"__metrics_path__": f"/n/{i}/metrics", "instance": f"gpu-node-{i:05d}:9400"},
        }
        for i in range(nodes)
    ]
    (tmp / "targets.json").write_text(json.dumps(targets))
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: dcgm\n    file_sd_configs:\n"
        f"      - files: ['{tmp / 'targets.json'}']\n"
    )


def prometheus_step(gpus: int, exporter_port: int, exporter_pid: int, warm_s: float, window_s: float) -> Step:
    nodes = gpus // GPUS_PER_NODE
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-vs-prom-"))
    port = free_port()
    write_scrape_config(tmp, tmp / "prometheus.yml", exporter_port, nodes)
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-admin-api",
            "--log.level=warn",
            "--storage.tsdb.retention.time=1d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    step = Step(gpus)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("prometheus did not become ready")
            time.sleep(0.2)
        # Discovered targets reach the scrape manager in 5-s steps: wait for
        # every target to have been scraped, then warm up.
        while time.monotonic() < deadline + 30:
            r = httpx.get(f"{api}/query", params={"query": 'count(up{job="dcgm"})'}, timeout=30)
            got = r.json()["data"]["result"]
            if got and int(float(got[0]["value"][1])) >= nodes:
                break
            time.sleep(0.5)
        time.sleep(warm_s)
        c0, e0, t0 = cpu_s(proc.pid), cpu_s(exporter_pid), time.time()
        time.sleep(window_s)
        c1, e1, t1 = cpu_s(proc.pid), cpu_s(exporter_pid), time.time()
        step.rss_mib = rss_bytes(proc.pid) / 2**20
        time.sleep(2.5)  # let the last scrapes of the window land
        w = int(t1 - t0)

        def query(q: str) -> list[dict[str, Any]]:
            r = httpx.get(f"{api}/query", params={"query": q, "time": f"{t1:.3f}"}, timeout=60)
            r.raise_for_status()
            return r.json()["data"]["result"]

        step.cpu_cores = (c1 - c0) / (t1 - t0)
        step.helper_cores = (e1 - e0) / (t1 - t0)
        try:
            ups = query(f'up{{job="dcgm"}}[{w}s]')
            durs = query(f'scrape_duration_seconds{{job="dcgm"}}[{w}s]')
        except (httpx.HTTPError, KeyError, ValueError) as e:
            # Not one minute to answer a query over its own window: not keeping up, whatever
            # share of the scrapes it may have done.
            step.done_frac = math.nan
            step.detail = {
                "scrapes_due": nodes * w,
                "not_measured": f"scrapes: Prometheus did not answer a query over the window "
                f"({type(e).__name__}: {e})",
            }
            return step
        done = sum(sum(1 for _, v in s["values"] if v == "1") for s in ups)
        # A target that caught up after a late scrape can show w + 1 in the window.
        step.done_frac = min(1.0, done / max(nodes * w, 1))
        dur = np.array([float(v) for s in durs for _, v in s["values"]]) if durs else np.array([np.inf])
        step.p99_s = float(np.quantile(dur, 0.99))
        step.kept_up = step.done_frac >= 0.99 and step.p99_s < 0.5
        gpu_samples = done * GPUS_PER_NODE
        step.cpu_us_per_gpu_sample = per_sample(c1 - c0, gpu_samples) * 1e6
        step.detail = {"scrapes_due": nodes * w, "scrapes_done": done}
        step.bytes_per_gpu_sample, wal = stored_bytes(f"http://127.0.0.1:{port}", tmp / "data", step.detail)
        step.detail["wal_bytes_per_gpu_sample"] = none_if_nan(wal, 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return step


def prometheus_block_bytes(nodes: int = 1, hours: float = 2.0) -> dict[str, float]:
    """Bytes per GPU-sample of a persisted Prometheus block holding ``hours`` of
    ``nodes`` nodes at 1 Hz: the same exposition (series, labels, values) written
    as OpenMetrics with timestamps and turned into a block by ``promtool tsdb
    create-blocks-from openmetrics`` (Prometheus's own backfill), so each series
    holds a full block's samples as it would in production, not the few
    seconds a bounded run can scrape."""
    model = storage_model(nodes, int(hours * 3600))
    fields = dcgm_fields()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-vs-prom-block-"))
    try:
        seconds = int(hours * 3600)
        t0 = block_start(hours)
        src = tmp / "samples.om"
        with src.open("w") as f:
            for name, _kind, help_ in fields:
                f.write(f"# HELP {name} {help_}\n# TYPE {name} gauge\n")
                vals = model[DCGM_TO_FIELD[name]]
                ints = (
                    bool(np.all(vals == np.round(vals)))
                    and "ACTIVE" not in name
                    and name != "DCGM_FI_DEV_POWER_USAGE"
                )
                for i in range(nodes):
                    k = i % TEMPLATES
                    per_s = stored_series(model, DCGM_TO_FIELD[name], k, np.arange(seconds))
                    for g in range(GPUS_PER_NODE):
                        lab = (
                            f'gpu="{g}",UUID="GPU-{k:02x}{g:02x}9c8d-69c4-b61d-e0bc-{i:05d}{g:07d}",'
                            f'pci_bus_id="00000000:{0x18 + 0x11 * g:02X}:00.0",device="nvidia{g}",'
                            f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-{i:05d}",'
                            f'DCGM_FI_DRIVER_VERSION="580.105.08",container="main",namespace="ml-research",'
                            f'pod="llm-pretrain-worker-{i:05d}-{g}",pod_uid="",instance="gpu-node-{i:05d}:9400",'
                            f'job="dcgm"'
                        )
                        text = [f"{int(v)}" if ints else f"{v:.6f}" for v in per_s[:, g]]
                        f.writelines(f"{name}{{{lab}}} {text[s]} {t0 + s}\n" for s in range(seconds))
            f.write("# EOF\n")
        out = tmp / "blocks"
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(src), str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        gpu_samples = nodes * GPUS_PER_NODE * seconds
        chunks = sum(p.stat().st_size for p in out.rglob("chunks/*"))
        index = sum(p.stat().st_size for p in out.rglob("index"))
        return {
            "bytes_per_gpu_sample": tree_size(out) / gpu_samples,
            "chunk_bytes_per_gpu_sample": chunks / gpu_samples,
            "index_bytes_per_gpu_sample": index / gpu_samples,
            "hours": hours,
            "nodes": nodes,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------
# VictoriaMetrics side

#: Subfolders of VictoriaMetrics' storage that hold no samples (query caches, locks, snapshots).
VM_NOT_DATA = ("cache", "snapshots", "flock.lock")


def vm_data_bytes(data: Path) -> int:
    """Bytes of samples and index under a VictoriaMetrics storage directory (its caches left out)."""
    return sum(
        p.stat().st_size
        for p in data.rglob("*")
        if p.is_file() and not any(part in VM_NOT_DATA for part in p.relative_to(data).parts)
    )


def vm_wait_merged(base: str, data: Path, partition: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Flush VictoriaMetrics' in-memory parts, force-merge ``partition`` (YYYY_MM) and wait until no merge
    runs and the stored size holds still: what a long-lived database of these samples settles to."""
    t0 = time.monotonic()
    httpx.get(f"{base}/internal/force_flush", timeout=timeout_s).raise_for_status()
    httpx.get(
        f"{base}/internal/force_merge", params={"partition_prefix": partition}, timeout=timeout_s
    ).raise_for_status()
    last, still = -1, 0
    while time.monotonic() - t0 < timeout_s:
        text = httpx.get(f"{base}/metrics", timeout=30).text
        active = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vm_active_merges") or line.startswith("vm_active_force_merges")
        )
        size = vm_data_bytes(data)
        still = still + 1 if active == 0 and size == last else 0
        if still >= 3:
            break
        last = size
        time.sleep(1.0)
    return {"merge_s": round(time.monotonic() - t0, 1), "bytes": vm_data_bytes(data)}


def start_vm(tmp: Path, port: int, scrape: Path | None) -> subprocess.Popen[bytes]:
    cmd = [
        "victoria-metrics",
        f"-storageDataPath={tmp / 'data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=30d",
        "-loggerLevel=WARN",
        "-search.latencyOffset=1s",
        "-search.disableCache",
    ]
    if scrape is not None:
        cmd += [f"-promscrape.config={scrape}", "-promscrape.fileSDCheckInterval=1s"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("victoria-metrics did not become ready")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def vm_step(gpus: int, exporter_port: int, exporter_pid: int, warm_s: float, window_s: float) -> Step:
    """VictoriaMetrics (the Debian package's single-node binary) scraping every node's simulated
    dcgm-exporter at 1 s with ``-promscrape.config``, its own storage directory: kept up when 99 % of
    the window's scrapes were done and their p99 duration is under half the interval, as Prometheus."""
    nodes = gpus // GPUS_PER_NODE
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-vs-vm-"))
    port = free_port()
    write_scrape_config(tmp, tmp / "scrape.yml", exporter_port, nodes)
    proc = start_vm(tmp, port, tmp / "scrape.yml")
    api = f"http://127.0.0.1:{port}/api/v1"
    step = Step(gpus)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
                got = httpx.get(f"{api}/query", params={"query": 'count(up{job="dcgm"})'}, timeout=30).json()
                if int(float(got["data"]["result"][0]["value"][1])) >= nodes:
                    break
            time.sleep(0.5)
        time.sleep(warm_s)
        c0, e0, t0 = cpu_s(proc.pid), cpu_s(exporter_pid), time.time()
        time.sleep(window_s)
        c1, e1, t1 = cpu_s(proc.pid), cpu_s(exporter_pid), time.time()
        step.rss_mib = rss_bytes(proc.pid) / 2**20
        time.sleep(2.5)
        w = int(t1 - t0)
        step.cpu_cores = (c1 - c0) / (t1 - t0)
        step.helper_cores = (e1 - e0) / (t1 - t0)

        def query(q: str) -> list[dict[str, Any]]:
            r = httpx.get(f"{api}/query", params={"query": q, "time": f"{t1:.3f}"}, timeout=120)
            r.raise_for_status()
            return r.json()["data"]["result"]

        try:
            ups = query(f'up{{job="dcgm"}}[{w}s]')
            durs = query(f'scrape_duration_seconds{{job="dcgm"}}[{w}s]')
        except (httpx.HTTPError, KeyError, ValueError) as e:
            said = e.response.text[:300] if isinstance(e, httpx.HTTPStatusError) else str(e)
            step.done_frac = math.nan
            step.detail = {
                "scrapes_due": nodes * w,
                "not_measured": f"scrapes: VictoriaMetrics did not answer a "
                f"query over the window ({type(e).__name__}: {said})",
            }
            return step
        done = sum(sum(1 for _, v in s["values"] if v == "1") for s in ups)
        step.done_frac = min(1.0, done / max(nodes * w, 1))
        dur = np.array([float(v) for s in durs for _, v in s["values"]]) if durs else np.array([np.inf])
        step.p99_s = float(np.quantile(dur, 0.99))
        step.kept_up = step.done_frac >= 0.99 and step.p99_s < 0.5
        step.cpu_us_per_gpu_sample = per_sample(c1 - c0, done * GPUS_PER_NODE) * 1e6
        step.detail = {"scrapes_due": nodes * w, "scrapes_done": done}
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
            rows = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("vm_rows_added_to_storage_total")
            )
            merged = vm_wait_merged(
                f"http://127.0.0.1:{port}", tmp / "data", datetime.now(UTC).strftime("%Y_%m")
            )
            per_scrape = 25 * GPUS_PER_NODE
            dcgm = rows * per_scrape / (per_scrape + 5)  # + up, scrape_duration_seconds, ...
            step.bytes_per_gpu_sample = per_sample(merged["bytes"], dcgm / 25)
            step.detail["force_merge_s"] = merged["merge_s"]
        except httpx.HTTPError as e:
            step.detail["not_measured"] = f"storage: VictoriaMetrics did not answer ({type(e).__name__}: {e})"
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    return step


def block_start(hours: float) -> int:
    """The first second of the storage comparison's hours: ended two 2-h blocks ago, and never across a
    UTC midnight (VictoriaMetrics indexes every series once more per day it has samples in)."""
    end = (int(time.time()) // 7200 - 1) * 7200
    start = end - int(hours * 3600)
    if start // 86_400 != (end - 1) // 86_400:
        start = (end // 86_400) * 86_400 - int(hours * 3600) - 3600
    return start


def vm_block_bytes(nodes: int = 1, hours: float = 2.0) -> dict[str, float]:
    """Bytes per GPU-sample of VictoriaMetrics holding ``hours`` of ``nodes`` nodes at 1 Hz, after a
    force merge: the same series, labels and values as :func:`prometheus_block_bytes` writes for
    promtool, imported through VictoriaMetrics' own ``/api/v1/import`` (its backfill path)."""
    model = storage_model(nodes, int(hours * 3600))
    fields = dcgm_fields()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-vs-vm-block-"))
    port = free_port()
    proc = start_vm(tmp, port, None)
    seconds = int(hours * 3600)
    t0 = block_start(hours)
    try:

        def lines() -> Any:
            for name, _kind, _help in fields:
                vals = model[DCGM_TO_FIELD[name]]
                ints = (
                    bool(np.all(vals == np.round(vals)))
                    and "ACTIVE" not in name
                    and name != "DCGM_FI_DEV_POWER_USAGE"
                )
                for i in range(nodes):
                    k = i % TEMPLATES
                    per_s = stored_series(model, DCGM_TO_FIELD[name], k, np.arange(seconds))
                    for g in range(GPUS_PER_NODE):
                        labels = {
                            "__name__": name,
                            "gpu": str(g),
                            "UUID": f"GPU-{k:02x}{g:02x}9c8d-69c4-b61d-e0bc-{i:05d}{g:07d}",
                            "pci_bus_id": f"00000000:{0x18 + 0x11 * g:02X}:00.0",
                            "device": f"nvidia{g}",
                            "modelName": "NVIDIA H100 80GB HBM3",
                            "Hostname": f"gpu-node-{i:05d}",
                            "DCGM_FI_DRIVER_VERSION": "580.105.08",
                            "container": "main",
                            "namespace": "ml-research",
                            "pod": f"llm-pretrain-worker-{i:05d}-{g}",
                            "pod_uid": "",
                            "instance": f"gpu-node-{i:05d}:9400",
                            "job": "dcgm",
                        }
                        values = (
                            [int(v) for v in per_s[:, g]]
                            if ints
                            else [round(float(v), 6) for v in per_s[:, g]]
                        )
                        yield (
                            json.dumps(
                                {
                                    "metric": labels,
                                    "values": values,
                                    "timestamps": [(t0 + s) * 1000 for s in range(seconds)],
                                }
                            )
                            + "\n"
                        ).encode()

        httpx.post(f"http://127.0.0.1:{port}/api/v1/import", content=lines(), timeout=600).raise_for_status()
        merged = vm_wait_merged(
            f"http://127.0.0.1:{port}", tmp / "data", datetime.fromtimestamp(t0, UTC).strftime("%Y_%m")
        )
        gpu_samples = nodes * GPUS_PER_NODE * seconds
        stored = {
            part: sum(p.stat().st_size for p in (tmp / "data" / part).rglob("*") if p.is_file())
            for part in ("data", "indexdb")
        }
        return {
            "bytes_per_gpu_sample": merged["bytes"] / gpu_samples,
            "data_bytes_per_gpu_sample": stored["data"] / gpu_samples,
            "index_bytes_per_gpu_sample": stored["indexdb"] / gpu_samples,
            "hours": hours,
            "nodes": nodes,
            "force_merge_s": merged["merge_s"],
        }
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------
# gpufleet side


def gpufleet_timescale_bytes(server: str, nodes: int = 1, hours: float = 2.0) -> dict[str, float]:
    """Bytes per GPU-sample of the same ``hours`` of ``nodes`` nodes stored by
    gpufleet on TimescaleDB and compressed, the counterpart of
    :func:`prometheus_block_bytes`: the values the agents send (the same
    value model, one 10-s batch a node), stored through the collector's own
    storing step, every chunk compressed with the project's settings."""
    from gpufleet.catalog import GPU_BY_NAME
    from gpufleet.collector.batch_store import write_batches
    from gpufleet.config import load_settings
    from gpufleet.db import migrate
    from gpufleet.db.scratch import scratch_database
    from gpufleet.wire import KIND_DTYPE, TYPED_DTYPES, validate

    model = storage_model(nodes, int(hours * 3600))
    names = list(GPUFLEET_FIELDS)
    dtypes = {n: KIND_DTYPE[GPU_BY_NAME[n].kind] for n in names}
    seconds = int(hours * 3600)
    t0 = (int(time.time()) // 86400 - 3) * 86400 + 3600
    gpu_col = np.tile(np.arange(GPUS_PER_NODE, dtype="<i2"), SHIP_EVERY_S)
    with scratch_database(server, "gpufleet_vsprom_ts") as url:
        migrate.upgrade(url, load_settings())
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT remove_compression_policy('gpu_samples', if_exists => true)")
            for start in range(0, seconds, 600):
                batches = []
                for i in range(nodes):
                    k = i % TEMPLATES
                    series = {n: stored_series(model, n, k, np.arange(seconds)) for n in names}
                    for b in range(start, min(start + 600, seconds), SHIP_EVERY_S):
                        secs = np.arange(b, b + SHIP_EVERY_S)
                        cols: dict[str, Any] = {
                            "time": {
                                "dtype": "f8",
                                "data": np.repeat((t0 + secs).astype("<f8"), GPUS_PER_NODE).tobytes(),
                            },
                            "gpu": {"dtype": "i2", "data": gpu_col.tobytes()},
                            "uuid": [
                                f"GPU-{k:02x}{g:02x}9c8d-69c4-b61d-e0bc-{i:05d}{g:07d}"
                                for _ in secs
                                for g in range(GPUS_PER_NODE)
                            ],
                        }
                        for n in names:
                            v = series[n][b : b + SHIP_EVERY_S].reshape(-1)
                            cols[n] = {
                                "dtype": dtypes[n],
                                "data": v.astype(TYPED_DTYPES[dtypes[n]]).tobytes(),
                            }
                        batches.append(
                            validate({"batch_id": f"ts:{i}:{b}", "node": f"gpu-node-{i:05d}", "gpu": cols})
                        )
                with conn.transaction():
                    write_batches(conn, batches)
            rows = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
            conn.execute(
                "SELECT compress_chunk(c, if_not_compressed => true) FROM show_chunks('gpu_samples') c"
            )
            size = conn.execute(
                "SELECT sum(total_bytes) FROM hypertable_detailed_size('gpu_samples')"
            ).fetchone()[0]  # type: ignore[index]
    return {
        "bytes_per_gpu_sample": float(size) / max(int(rows), 1),
        "samples": float(rows),
        "hours": hours,
        "nodes": nodes,
    }


def gpufleet_bodies(
    model: dict[str, np.ndarray], nodes: int, tokens: list[str], first_tick: int, ticks: int
) -> dict[int, list[tuple[int, bytes, dict[str, str]]]]:
    """Per tick (second): the batches due then, each node once every SHIP_EVERY_S."""
    cctx = zstandard.ZstdCompressor(level=3)
    names = list(GPUFLEET_FIELDS)
    from gpufleet.catalog import GPU_BY_NAME
    from gpufleet.wire import KIND_DTYPE, TYPED_DTYPES

    dtypes = {n: KIND_DTYPE[GPU_BY_NAME[n].kind] for n in names}
    due: dict[int, list[tuple[int, bytes, dict[str, str]]]] = {}
    gpu_col = np.tile(np.arange(GPUS_PER_NODE, dtype="<i2"), SHIP_EVERY_S)
    for tick in range(first_tick, first_tick + ticks):
        for i in range(tick % SHIP_EVERY_S, nodes, SHIP_EVERY_S):
            k = i % TEMPLATES
            secs = np.arange(tick - SHIP_EVERY_S, tick)
            t = np.repeat(secs.astype("<f8"), GPUS_PER_NODE)
            idx = secs % VARIANTS
            cols: dict[str, Any] = {
                "time": {"dtype": "f8", "data": t.tobytes()},
                "gpu": {"dtype": "i2", "data": gpu_col.tobytes()},
                "uuid": [
                    f"GPU-{k:02x}{g:02x}9c8d-69c4-b61d-e0bc-{i:05d}{g:07d}"
                    for _ in secs
                    for g in range(GPUS_PER_NODE)
                ],
            }
            for n in names:
                v = model[n][k, idx].reshape(-1)
                cols[n] = {"dtype": dtypes[n], "data": v.astype(TYPED_DTYPES[dtypes[n]]).tobytes()}
            doc = {
                "batch_id": f"vsprom-{i:05d}:{tick}",
                "node": f"gpu-node-{i:05d}",
                "gpu": cols,
                "agent": {"id": f"vsprom-{i:05d}", "version": __version__},
            }
            body = cctx.compress(msgpack.packb(doc, use_bin_type=True))
            headers = {
                "Content-Type": "application/msgpack",
                "Content-Encoding": "zstd",
                "Authorization": f"Bearer {tokens[i]}",
            }
            due.setdefault(tick, []).append((i, body, headers))
    return due


async def drive_paced(
    ports: list[int], due: dict[int, list[tuple[int, bytes, dict[str, str]]]], window: tuple[int, int]
) -> dict[str, Any]:
    """Every node sends its batches at their wall-clock second over a connection
    of its own, kept alive between shipments, as an agent's HTTP client does: a
    connection the collector closed while idle is opened again for the next
    batch.  Node i ships to ``ports[i % len(ports)]`` (replicas behind a
    balancer).  Latency counts from the due time."""
    from testsupport.loadgen import Request, _send

    lat: list[float] = []
    ok_in_window = [0]
    statuses: dict[int, int] = {}
    opened_in_window = [0]
    per_node: dict[int, list[tuple[float, int, bytes, dict[str, str]]]] = {}
    for tick, items in due.items():
        for i, body, headers in items:
            # Agents' clocks are not aligned: each node ships at its own offset in
            # the second (as Prometheus spreads its scrapes over the interval).
            per_node.setdefault(i, []).append((tick + (i * 0.6180339887) % 1.0, tick, body, headers))
    end = max(due) + 4.0

    async def agent(port: int, items: list[tuple[float, int, bytes, dict[str, str]]]) -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            for when, tick, body, headers in sorted(items, key=lambda x: x[0]):
                delay = when - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                req = Request(body, headers, SHIP_EVERY_S * GPUS_PER_NODE)
                while time.time() < end:
                    if writer is None or reader is None or reader.at_eof():
                        if writer is not None:
                            writer.close()
                        reader, writer = await asyncio.open_connection("127.0.0.1", port)
                        if window[0] <= tick < window[1]:
                            opened_in_window[0] += 1
                    try:
                        status, _ = await _send(reader, writer, f"127.0.0.1:{port}", req)
                    except (ConnectionError, asyncio.IncompleteReadError):
                        writer.close()
                        writer = None
                        continue
                    statuses[status] = statuses.get(status, 0) + 1
                    if 200 <= status < 300:
                        if window[0] <= tick < window[1]:
                            ok_in_window[0] += 1
                            lat.append(time.time() - when)
                        break
                    await asyncio.sleep(0.05)
        finally:
            if writer is not None:
                writer.close()

    await asyncio.gather(*(agent(ports[i % len(ports)], items) for i, items in per_node.items()))
    return {
        "latencies": lat,
        "ok_in_window": ok_in_window[0],
        "statuses": statuses,
        "connections_opened_in_window": opened_in_window[0],
    }


def gc_collections(ports: list[int]) -> list[int] | None:
    """Garbage collections so far, per generation, summed over the collectors on ``ports``
    (their ``python_gc_collections_total``); None when a collector too busy to
    answer its ``/metrics`` within 10 s (past its capacity) leaves it unknown."""
    from prometheus_client.parser import text_string_to_metric_families

    out = [0, 0, 0]
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        except httpx.HTTPError:
            return None
        for fam in text_string_to_metric_families(text):
            if fam.name == "python_gc_collections":
                for smp in fam.samples:
                    out[int(smp.labels["generation"])] += int(smp.value)
    return out


def postgres_pids(url: str, dbname: str) -> list[int]:
    """The backends serving ``dbname`` and the shared WAL writer, checkpointer and background writer."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "OR backend_type IN ('walwriter', 'checkpointer', 'background writer')",
            (dbname,),
        ).fetchall()
    return [r[0] for r in rows]


#: How long before its window a step starts reading the collectors' GC count: their
#: /metrics answered in up to 6 s near a collector's limit (docs/capacity.md).
GC_READ_LEAD_S = 8.0


def gpufleet_step(gpus: int, server: str, warm_s: float, window_s: float, collectors: int = 1) -> Step:
    from bench import ingest as ingest_bench
    from gpufleet.config import load_settings
    from gpufleet.db import migrate
    from gpufleet.db.scratch import scratch_database

    nodes = gpus // GPUS_PER_NODE
    step = Step(gpus)
    model = value_model()
    with scratch_database(server, "gpufleet_vsprom") as url:
        migrate.upgrade(url, load_settings())
        names = [f"gpu-node-{i:05d}" for i in range(nodes)]
        tokens = ingest_bench.make_tokens(url, names)
        ports: list[int] = []
        procs = []
        for _ in range(collectors):
            ports.append(free_port())
            procs.append(ingest_bench.start_collector(url, ports[-1], leader=False))
        try:
            start = int(time.time()) + 2
            ticks = int(warm_s + window_s) + 1
            due = gpufleet_bodies(model, nodes, tokens, start + 2, ticks)
            first = min(due)
            window = (first + int(warm_s), first + int(warm_s) + int(window_s))
            dbname = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
            me = os.getpid()
            readings: dict[str, Any] = {}

            def sample() -> None:
                # On a thread of its own: the load driver's event loop runs late when the
                # machine is saturated, and a reading taken late measures a shorter span
                # than the batches counted in the window.  The collector's /metrics (read
                # for its GC count) costs it and the database a tenth of a second or more,
                # and answers in seconds when the collector is saturated: it is read on yet
                # another thread, started well before the window, so it delays no reading,
                # and the step says whether it was done before the window opened.
                def read_gc0() -> None:
                    try:
                        readings["gc0"] = gc_collections(ports)
                    except Exception as e:  # noqa: BLE001 - reported, not lost on this thread
                        print(f"warning: reading the collectors' GC count failed: {e!r}", file=sys.stderr)
                    readings["gc0_done"] = time.time()

                readings["gc0"] = None
                gc_reader = threading.Thread(target=read_gc0, daemon=True)
                time.sleep(max(0.0, window[0] - GC_READ_LEAD_S - time.time()))
                gc_reader.start()
                pids = postgres_pids(url, dbname)
                time.sleep(max(0.0, window[0] - time.time()))
                readings["k0"], readings["p0"] = sum(cpu_s(c.pid) for c in procs), sum(cpu_s(p) for p in pids)
                readings["c0"] = readings["k0"] + readings["p0"]
                readings["d0"], readings["t0"], readings["pids"] = cpu_s(me), time.time(), pids
                time.sleep(max(0.0, window[1] - time.time()))
                readings["k1"], readings["p1"] = sum(cpu_s(c.pid) for c in procs), sum(cpu_s(p) for p in pids)
                readings["c1"] = readings["k1"] + readings["p1"]
                readings["d1"], readings["t1"] = cpu_s(me), time.time()
                gc_reader.join()
                readings["gc1"] = gc_collections(ports)
                readings["gc1_done"] = time.time()
                readings["rss"] = sum(rss_bytes(c.pid) for c in procs)
                readings["pss"] = sum(pss_bytes(p) for p in pids)

            async def run() -> dict[str, Any]:
                sampler = asyncio.create_task(asyncio.to_thread(sample))
                out = await drive_paced(ports, due, window)
                await sampler
                return out

            out = asyncio.run(run())
        finally:
            for c in procs:
                c.send_signal(signal.SIGTERM)
            for c in procs:
                c.wait(60)
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
            hyper = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'timescaledb'").fetchone()
            size = conn.execute(  # a hypertable's rows live in its chunks
                "SELECT COALESCE(sum(total_bytes), 0) FROM hypertable_detailed_size('gpu_samples')"
                if hyper
                else "SELECT pg_total_relation_size('gpu_samples')"
            ).fetchone()[0]  # type: ignore[index]
            size = float(size)
    elapsed = readings["t1"] - readings["t0"]
    due_in_window = sum(len(v) for t, v in due.items() if window[0] <= t < window[1])
    step.done_frac = out["ok_in_window"] / max(due_in_window, 1)
    lat = np.array(out["latencies"]) if out["latencies"] else np.array([np.inf])
    step.p99_s = float(np.quantile(lat, 0.99))
    step.kept_up = step.done_frac >= 0.99 and step.p99_s < 0.5
    gpu_samples = out["ok_in_window"] * SHIP_EVERY_S * GPUS_PER_NODE
    cpu = readings["c1"] - readings["c0"]
    step.cpu_cores = cpu / elapsed
    step.cpu_us_per_gpu_sample = per_sample(cpu, gpu_samples) * 1e6
    step.rss_mib = (readings["rss"] + readings["pss"]) / 2**20
    step.helper_cores = (readings["d1"] - readings["d0"]) / elapsed
    step.bytes_per_gpu_sample = per_sample(size, rows)
    step.detail = {
        "collector_cpu_us_per_gpu_sample": none_if_nan(
            per_sample(readings["k1"] - readings["k0"], gpu_samples) * 1e6, 2
        ),
        "postgres_cpu_us_per_gpu_sample": none_if_nan(
            per_sample(readings["p1"] - readings["p0"], gpu_samples) * 1e6, 2
        ),
        "collector_rss_mib": round(readings["rss"] / 2**20, 1),
        "postgres_pss_mib": round(readings["pss"] / 2**20, 1),
        "batches_due": due_in_window,
        "batches_stored": out["ok_in_window"],
        "statuses": out["statuses"],
        "rows_stored": rows,
        "connections_opened_in_window": out["connections_opened_in_window"],
        # between the two GC reads, which span the window and more (gc_read_span_s)
        "gc_collections_in_window": None
        if readings["gc0"] is None or readings["gc1"] is None
        else [b - a for a, b in zip(readings["gc0"], readings["gc1"], strict=True)],
        "gc_read_span_s": round(readings["gc1_done"] - readings["gc0_done"], 1),
        "collectors": collectors,
        # False: the GC read ran into the window (its cost counted in it, its count short)
        "gc_read_before_window": readings["gc0_done"] <= window[0],
        # how late the window's CPU readings were taken (seconds): near 0 unless the host is saturated
        "readings_late_s": [round(readings["t0"] - window[0], 3), round(readings["t1"] - window[1], 3)],
    }
    return step


def http_floor_step(gpus: int, warm_s: float, window_s: float, server: str = "uvicorn") -> dict[str, Any]:
    """CPU of the HTTP server alone under the gpufleet side's load: uvicorn as the
    collector runs it (loopback, no access log) serving an ASGI app that reads
    each body and answers a stored-like JSON, storing nothing.  What one
    process pays per request before any ingest work, the floor under
    gpufleet's collector figure at this batch size."""
    nodes = gpus // GPUS_PER_NODE
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-null", str(port), "--null-server", server])
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (
                    httpx.post(f"http://127.0.0.1:{port}/v1/ingest", content=b"x", timeout=2).status_code
                    == 200
                ):
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the null HTTP server did not start")
            time.sleep(0.2)
        start = int(time.time()) + 2
        due = gpufleet_bodies(value_model(), nodes, ["null"] * nodes, start + 2, int(warm_s + window_s) + 1)
        first = min(due)
        window = (first + int(warm_s), first + int(warm_s) + int(window_s))
        readings: dict[str, float] = {}

        async def run() -> dict[str, Any]:
            async def sample() -> None:
                await asyncio.sleep(max(0.0, window[0] - time.time()))
                readings["c0"], readings["t0"] = cpu_s(proc.pid), time.time()
                await asyncio.sleep(max(0.0, window[1] - time.time()))
                readings["c1"], readings["t1"] = cpu_s(proc.pid), time.time()

            sampler = asyncio.create_task(sample())
            out = await drive_paced([port], due, window)
            await sampler
            return out

        out = asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(10)
    n = max(out["ok_in_window"], 1)
    cpu = readings["c1"] - readings["c0"]
    return {
        "server": server,
        "gpus": gpus,
        "requests": out["ok_in_window"],
        "cpu_us_per_request": round(cpu / n * 1e6, 1),
        "cpu_us_per_gpu_sample": round(cpu / (n * SHIP_EVERY_S * GPUS_PER_NODE) * 1e6, 2),
        "cpu_cores": round(cpu / (readings["t1"] - readings["t0"]), 3),
        "connections_opened_in_window": out["connections_opened_in_window"],
    }


def serve_protocol(port: int) -> None:
    """The same answers from a bare asyncio protocol on uvloop with httptools' parser (what
    uvicorn itself parses with), nothing per request but parsing and one write: what a Python
    HTTP front end at its leanest costs, the baseline for uvicorn's figure."""
    import httptools
    import uvloop

    answer = json.dumps(
        {
            "batch_id": "x",
            "status": "stored",
            "gpu_rows": SHIP_EVERY_S * GPUS_PER_NODE,
            "host_rows": 0,
            "rejected_skew": 0,
        }
    ).encode()
    reply = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(answer)).encode()
        + b"\r\n\r\n"
        + answer
    )

    class Null(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_message_complete(self) -> None:
            self.transport.write(reply)  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Null, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


def serve_null(port: int) -> None:
    import uvicorn

    from gpufleet.collector.service import server_options
    from gpufleet.config import Settings

    answer = json.dumps(
        {
            "batch_id": "x",
            "status": "stored",
            "gpu_rows": SHIP_EVERY_S * GPUS_PER_NODE,
            "host_rows": 0,
            "rejected_skew": 0,
        }
    ).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        **server_options(Settings()),
    )


# ----------------------------------------------------------------------------


def per_sample(total: float, samples: float) -> float:
    """``total`` per sample; NaN when no sample landed (printed "n/a", null in the JSON),
    where dividing by one instead once printed 15,920,000 us per GPU-sample."""
    return total / samples if samples > 0 else math.nan


def none_if_nan(v: float, digits: int) -> float | None:
    return None if math.isnan(v) else round(v, digits)


def ladder_edge(steps: list[Step]) -> tuple[int, int | None]:
    """The largest size a side kept up with (0: none), and the smallest above it that it
    fell behind at (None: none tried)."""
    kept = max((s.gpus for s in steps if s.kept_up), default=0)
    fell = min((s.gpus for s in steps if not s.kept_up and s.gpus > kept), default=None)
    return kept, fell


def fleet_bounds(prom: list[Step], fleet: list[Step]) -> tuple[float | None, float | None]:
    """The fleet ratio's bounds between the sizes tried: each side's edge lies between
    the largest size it kept up with and the next it fell behind at, so the ratio lies
    between (gpufleet kept) / (Prometheus fell) and (gpufleet fell) / (Prometheus kept);
    None where that side's edge was not found (it kept up with every size, or none)."""
    (pk, pf), (fk, ff) = ladder_edge(prom), ladder_edge(fleet)
    low = fk / pf if pf and fk else None
    high = ff / pk if ff and pk else None
    return low, high


def show(side: str, s: Step) -> None:
    print(
        f"  {side:10s} {s.gpus:6d} GPUs: {'keeps up' if s.kept_up else 'FALLS BEHIND':12s} "
        f"done {s.done_frac * 100:5.1f} %, p99 {s.p99_s * 1000:7.1f} ms; CPU {_fig(s.cpu_us_per_gpu_sample)} us "
        f"per GPU-sample ({s.cpu_cores:.2f} cores); memory {s.rss_mib:7.1f} MiB; "
        f"{_fig(s.bytes_per_gpu_sample)} B stored per GPU-sample this run; helper {s.helper_cores:.2f} cores",
        flush=True,
    )
    if "not_measured" in s.detail:
        print(f"  {'':10s} {s.gpus:6d} GPUs: not measured: {s.detail['not_measured']}", flush=True)


def _fig(v: float) -> str:
    return "   n/a" if math.isnan(v) else f"{v:6.1f}"


def _processes(collectors: int) -> str:
    return "one collector process" if collectors == 1 else f"{collectors} collector processes"


def ramp(side: str, fleets: list[int], fn: Any) -> list[Step]:
    steps: list[Step] = []
    for gpus in fleets:
        s = fn(gpus)
        show(side, s)
        steps.append(s)
        if not s.kept_up:
            break
    return steps


def main() -> None:
    global SHIP_EVERY_S  # --ship-interval sets it for the whole run
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--fleets",
        default="1000,4000,8000,16000,32000",
        help="GPU counts to try, smallest first; each side stops at its first failure",
    )
    ap.add_argument("--window", type=float, default=12.0, help="steady seconds measured at each size")
    ap.add_argument("--warm", type=float, default=5.0, help="seconds before measuring at each size")
    ap.add_argument("--quick", action="store_true", help="1000, 4000, 8000 and 16000 GPUs, 8-s windows")
    ap.add_argument(
        "--only", choices=("prometheus", "victoria-metrics", "gpufleet"), help="run one side (no ratios)"
    )
    ap.add_argument(
        "--no-victoria-metrics",
        action="store_true",
        help="leave VictoriaMetrics out (two sides, as before it was compared)",
    )
    ap.add_argument(
        "--collectors",
        type=int,
        default=1,
        help="gpufleet collector processes (replicas; nodes spread over them), all counted",
    )
    ap.add_argument(
        "--ship-interval",
        type=int,
        default=SHIP_EVERY_S,
        help="seconds of samples in each node's batch (default: the agents' ship_interval_s, "
        "%(default)s); what a longer interval saves per GPU-sample",
    )
    ap.add_argument(
        "--timescale",
        action="store_true",
        help="store gpufleet's side on the TimescaleDB server GPUFLEET_TEST_TIMESCALE_URL names "
        "(the production layout) instead of plain PostgreSQL",
    )
    ap.add_argument(
        "--http-floor",
        action="store_true",
        help="only the HTTP server's own CPU under the gpufleet side's load (uvicorn, an app that "
        "stores nothing): the floor under the collector's figure",
    )
    ap.add_argument("--serve-exporter", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-null", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--null-server", default="uvicorn", choices=["uvicorn", "protocol"], help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.ship_interval <= 0:
        ap.error(f"--ship-interval must be a positive number of seconds, not {args.ship_interval}")
    SHIP_EVERY_S = args.ship_interval
    if args.serve_exporter:
        serve_exporter(args.serve_exporter)
        return
    if args.serve_null:
        (serve_protocol if args.null_server == "protocol" else serve_null)(args.serve_null)
        return
    if shutil.which("prometheus") is None:
        sys.exit("prometheus is not installed (apt-get install prometheus)")
    fleets = [1000, 4000, 8000, 16000] if args.quick else [int(x) for x in args.fleets.split(",")]
    window, warm = (8.0, 5.0) if args.quick else (args.window, args.warm)
    if warm < SHIP_EVERY_S + 1:  # else nodes' first shipments, and their new connections, fall in the window
        warm = float(SHIP_EVERY_S + 1)
        print(f"warm-up raised to {warm:g} s: every node ships once before the window", flush=True)
    from testsupport.pg import server_url

    started = time.monotonic()
    if args.http_floor:
        floor = []
        for gpus in fleets:
            for kind in ("uvicorn", "protocol"):
                step = http_floor_step(gpus, warm, window, kind)
                print(
                    f"  http floor, {kind:8s} {gpus:6d} GPUs: {step['cpu_us_per_request']:.0f} us per request, "
                    f"{step['cpu_us_per_gpu_sample']:.2f} us per GPU-sample ({step['cpu_cores']:.2f} cores, "
                    f"{step['connections_opened_in_window']} connections opened)",
                    flush=True,
                )
                floor.append(step)
        last = {s["server"]: s for s in floor if s["gpus"] == fleets[-1]}
        print(
            json.dumps(
                {
                    "name": "vs_prometheus_http_floor",
                    "value": last["uvicorn"]["cpu_us_per_gpu_sample"],
                    "unit": "us per GPU-sample",
                    "gpus": fleets[-1],
                    "baseline_bare_protocol": last["protocol"]["cpu_us_per_gpu_sample"],
                    "http_floor": floor,
                }
            )
        )
        return
    from testsupport.pg import timescale_server_url

    ts_server = timescale_server_url()
    if args.timescale and ts_server is None:
        sys.exit(
            "--timescale: set GPUFLEET_TEST_TIMESCALE_URL to a TimescaleDB 2.x server "
            "(tools/timescale-server.sh builds and starts one)"
        )
    server = ts_server if args.timescale and ts_server else server_url()
    db_name = "TimescaleDB" if args.timescale else "PostgreSQL"
    if args.only == "gpufleet":
        print(
            f"gpufleet (agents' {SHIP_EVERY_S}-s batches, {_processes(args.collectors)}, {db_name}):",
            flush=True,
        )
        fleet = ramp("gpufleet", fleets, lambda g: gpufleet_step(g, server, warm, window, args.collectors))
        print(
            json.dumps(
                {
                    "name": "vs_prometheus_gpufleet_only",
                    "ship_interval_s": SHIP_EVERY_S,
                    "gpufleet_database": db_name,
                    "gpufleet": [asdict(s) for s in fleet],
                }
            )
        )
        return
    with_vm = not args.no_victoria_metrics and args.only in (None, "victoria-metrics")
    if with_vm and shutil.which("victoria-metrics") is None:
        sys.exit(
            "victoria-metrics is not installed (apt-get install victoria-metrics, or --no-victoria-metrics)"
        )
    clock = datetime.now(UTC)
    if clock.hour == 23 or clock.hour == 0:
        print(
            "note: run between 23:00 and 01:00 UTC: VictoriaMetrics does extra index work around the day's "
            "boundary, which its figures below include",
            flush=True,
        )
    loads: dict[str, list[float]] = {}

    def load_note(side: str) -> None:
        loads.setdefault(side, []).append(round(os.getloadavg()[0], 2))

    exporter_port = free_port()
    exporter = subprocess.Popen([sys.executable, __file__, "--serve-exporter", str(exporter_port)])
    prom: list[Step] = []
    vm: list[Step] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{exporter_port}/n/1/metrics", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("exporter simulator did not start")
            time.sleep(0.2)
        sample = httpx.get(f"http://127.0.0.1:{exporter_port}/n/1/metrics").text
        series = sum(1 for line in sample.splitlines() if line.startswith("DCGM_"))
        print(
            f"exporter: {series} series per node ({series // GPUS_PER_NODE} per GPU), "
            f"{len(sample)} bytes per scrape",
            flush=True,
        )

        def with_load(side: str, fn: Any) -> Any:
            def step(g: int) -> Step:
                load_note(side)
                out: Step = fn(g)
                out.detail["load_avg_1m"] = loads[side][-1]
                return out

            return step

        if args.only in (None, "prometheus"):
            print("Prometheus (scraping at 1 s):", flush=True)
            prom = ramp(
                "prometheus",
                fleets,
                with_load(
                    "prometheus", lambda g: prometheus_step(g, exporter_port, exporter.pid, warm, window)
                ),
            )
        if with_vm:
            print("VictoriaMetrics (scraping at 1 s, -promscrape.config):", flush=True)
            vm = ramp(
                "victoria-metrics",
                fleets,
                with_load(
                    "victoria-metrics", lambda g: vm_step(g, exporter_port, exporter.pid, warm, window)
                ),
            )
    finally:
        exporter.terminate()
        exporter.wait(10)
    if args.only == "prometheus":
        print(json.dumps({"name": "vs_prometheus_prometheus_only", "prometheus": [asdict(s) for s in prom]}))
        return
    hours = 1.0 if args.quick else 2.0
    block_nodes = 4
    vm_block = vm_block_bytes(block_nodes, hours) if with_vm else None
    if vm_block is not None:
        print(
            f"VictoriaMetrics storage ({hours:g} h of {block_nodes} nodes imported, force-merged): "
            f"{vm_block['bytes_per_gpu_sample']:.1f} B per GPU-sample (data {vm_block['data_bytes_per_gpu_sample']:.1f}, "
            f"index {vm_block['index_bytes_per_gpu_sample']:.1f}); load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    if args.only == "victoria-metrics":
        print(
            json.dumps(
                {
                    "name": "vs_prometheus_victoria_metrics_only",
                    "victoria_metrics": [asdict(s) for s in vm],
                    "victoria_metrics_block": vm_block,
                }
            )
        )
        return
    block = prometheus_block_bytes(block_nodes, hours)
    print(
        f"Prometheus block storage ({hours:g} h of {block_nodes} nodes backfilled by promtool): "
        f"{block['bytes_per_gpu_sample']:.1f} B per GPU-sample (chunks {block['chunk_bytes_per_gpu_sample']:.1f}, "
        f"index {block['index_bytes_per_gpu_sample']:.1f}); the runs' head snapshots above hold seconds "
        "per series and overstate it",
        flush=True,
    )
    ts_block = None if ts_server is None else gpufleet_timescale_bytes(ts_server, block_nodes, hours)
    if ts_block is not None:
        print(
            f"gpufleet TimescaleDB storage (the same {hours:g} h of {block_nodes} nodes, compressed): "
            f"{ts_block['bytes_per_gpu_sample']:.1f} B per GPU-sample",
            flush=True,
        )
    print(
        f"gpufleet (agents' {SHIP_EVERY_S}-s batches, {_processes(args.collectors)}, {db_name}):", flush=True
    )
    fleet = ramp(
        "gpufleet",
        fleets,
        with_load("gpufleet", lambda g: gpufleet_step(g, server, warm, window, args.collectors)),
    )

    def versus(other: list[Step], other_block: float | None, name: str) -> dict[str, Any]:
        """Ratios (other / gpufleet) at the largest fleet both kept up with, and of the largest fleets."""
        both = [
            g
            for g in fleets
            if any(s.gpus == g and s.kept_up for s in other) and any(s.gpus == g and s.kept_up for s in fleet)
        ]
        ref = max(both) if both else None
        ratios: dict[str, float | None] = {"cpu": None, "memory": None, "storage": None}
        if ref is not None:
            o = next(s for s in other if s.gpus == ref)
            f = next(s for s in fleet if s.gpus == ref)
            ratios = {
                "cpu": o.cpu_us_per_gpu_sample / f.cpu_us_per_gpu_sample,
                "memory": o.rss_mib / f.rss_mib,
                "storage": None if other_block is None else other_block / f.bytes_per_gpu_sample,
            }
        lo, lf = ladder_edge(other)[0], ladder_edge(fleet)[0]
        capped = lf == max(fleets)
        fleet_ratio = lf / lo if lo else None
        print(
            f"at {ref} GPUs (largest both keep up with), {name} / gpufleet: "
            + (", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None) if ref else "n/a")
        )
        print(
            f"largest fleet kept up with at 1 Hz: {name} {lo}, gpufleet {lf}"
            f"{' (the largest tried)' if capped else ''}"
            + (f"; ratio {fleet_ratio:.2f}{' or more' if capped else ''}" if fleet_ratio else "")
        )
        bounds = fleet_bounds(other, fleet)
        low = (
            f"without a lower bound ({name} fell behind at none)"
            if bounds[0] is None
            else f"at {bounds[0]:.2f} or more"
        )
        high = (
            "without an upper bound (gpufleet fell behind at none)"
            if bounds[1] is None
            else f"at {bounds[1]:.2f} or less"
        )
        print(
            f"  each side's edge lies between the sizes tried, which puts the fleet ratio {low} and {high}; "
            "sizes closer to both edges narrow it"
        )
        ts = (
            None
            if ts_block is None or other_block is None
            else other_block / ts_block["bytes_per_gpu_sample"]
        )
        if ts is not None:
            print(f"storage, {name} / gpufleet on TimescaleDB (same hours, same values): {ts:.2f}x")
        return {
            "reference_gpus": ref,
            "cpu_ratio": None if ratios["cpu"] is None else round(ratios["cpu"], 2),
            "memory_ratio": None if ratios["memory"] is None else round(ratios["memory"], 2),
            "storage_ratio_plain_postgres": None
            if ratios["storage"] is None
            else round(ratios["storage"], 3),
            "storage_ratio_timescale": None if ts is None else round(ts, 2),
            "largest_fleet": lo,
            "largest_fleet_gpufleet": lf,
            "gpufleet_capped_by_ramp": capped,
            "fleet_ratio": None if fleet_ratio is None else round(fleet_ratio, 2),
            "fleet_ratio_bounds": [None if b is None else round(b, 2) for b in bounds],
        }

    vs_prom = versus(prom, block["bytes_per_gpu_sample"], "Prometheus")
    vs_vm = (
        versus(vm, None if vm_block is None else vm_block["bytes_per_gpu_sample"], "VictoriaMetrics")
        if with_vm
        else None
    )
    if ts_block is None:
        print(
            "storage: gpufleet's figure is plain PostgreSQL (heap and indexes, uncompressed); set "
            "GPUFLEET_TEST_TIMESCALE_URL to a TimescaleDB 2.x server to compare compressed storage"
        )
    print(f"load average (1 min) at each size, by side: {json.dumps(loads)}")

    def rounded(s: Step) -> dict[str, Any]:
        return {
            "gpus": s.gpus,
            "kept_up": s.kept_up,
            "done_frac": none_if_nan(s.done_frac, 4),
            "p99_ms": none_if_nan(s.p99_s * 1000, 1),
            "cpu_us_per_gpu_sample": none_if_nan(s.cpu_us_per_gpu_sample, 2),
            "cpu_cores": round(s.cpu_cores, 3),
            "memory_mib": round(s.rss_mib, 1),
            "stored_bytes_per_gpu_sample_this_run": none_if_nan(s.bytes_per_gpu_sample, 1),
            "helper_cores": round(s.helper_cores, 3),
            **s.detail,
        }

    print(
        json.dumps(
            {
                "name": "vs_prometheus",
                "value": vs_prom["cpu_ratio"],
                "unit": "prometheus_cpu_per_gpu_sample_over_gpufleet",
                **vs_prom,
                "largest_fleet_prometheus": vs_prom["largest_fleet"],
                "gpufleet_bytes_per_gpu_sample_timescale": None
                if ts_block is None
                else round(ts_block["bytes_per_gpu_sample"], 2),
                "prometheus_block_bytes_per_gpu_sample": round(block["bytes_per_gpu_sample"], 2),
                "victoria_metrics_bytes_per_gpu_sample": None
                if vm_block is None
                else round(vm_block["bytes_per_gpu_sample"], 2),
                "gpufleet_bytes_per_gpu_sample_plain_postgres": None
                if vs_prom["reference_gpus"] is None
                else round(
                    next(s for s in fleet if s.gpus == vs_prom["reference_gpus"]).bytes_per_gpu_sample, 1
                ),
                "versus_victoria_metrics": vs_vm,
                "victoria_metrics_block": vm_block,
                "prometheus": [rounded(s) for s in prom],
                "victoria_metrics": [rounded(s) for s in vm],
                "gpufleet": [rounded(s) for s in fleet],
                "load_avg_1m": loads,
                "ship_interval_s": SHIP_EVERY_S,
                "gpufleet_database": db_name,
                "window_s": window,
                "quick": args.quick,
                "seconds": round(time.monotonic() - started, 1),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        )
    )


if __name__ == "__main__":
    random.seed(1)
    main()
