"""Where people wait: every API read route, web page and Grafana panel on a large fleet, timed.

    python bench/read_side.py [--gpus 10000] [--days 30] [--minute-days 29] [--raw-hours 24]
                              [--raw-interval-s 10] [--repeat 5] [--quick] [--keep] [--database URL]

Synthesises a fleet in a scratch database, through the product's own storing
step (:func:`gpufleet.collector.batch_store.write_batches`, the collector's
COPY encoder) and its own rollups (:func:`gpufleet.collector.rollup.rebuild`):

* ``--gpus`` GPUs, 8 a node, on two sites (one priced in EUR, one in USD), each
  with dated settings and an hourly carbon series over the whole history;
* ``--days`` days of runs: groups of 8 nodes run 64-GPU jobs back to back (one
  group in four runs one job per node instead), 30 to 60 hours each, with
  teams, model labels and hourly progress reports; most groups have a run
  going now;
* their incidents, resolved and open: checkpoint stalls, starvation, idle
  allocations (run-scoped), throttling and stragglers (one GPU each);
* samples: the last ``--raw-hours`` hours at ``--raw-interval-s`` (raw rows
  kept), and before them ``--minute-days`` days at one sample per GPU a minute,
  rolled up day by day (per-minute stats and energy, hourly energy) with the
  raw rows of each day removed once its rollups are built, as retention would.
  By default the minute history reaches back the whole ``--days``; a machine
  without the disk for it says so before starting, and the line
  ``synthesised:`` says exactly what was made.

Then, against an API served by uvicorn on loopback (the product's app, its
pool and middleware), it times every API read route, every web page and
every Grafana panel (every board at 6 h, 24 h, 7 d and 30 d; panel SQL
expanded as Grafana would, :mod:`gpufleet.dashboards.dryrun`): **cold** (the
first request on a freshly started API, whose pool opens new connections;
PostgreSQL's buffers and the OS page cache are not dropped, the server is
shared) and **warm** (``--repeat`` more, p50 and p95).  Beside each, the
**baseline**: a plain ``SELECT`` of the rows the read needs (its run's energy
rows, its table's rows in its range and scope...), timed in the same run.
Reads over the targets (a route's p95 over 500 ms, a panel's over 1 s) are
listed at the end.  The last line is JSON.

What the collector's leader keeps as runs end and the synthesis has no leader
to keep, it keeps before timing: every ended run's power-cap points (incident
costs and ledgers are not priced ahead: their first readers price them).

``--match REGEX`` times only the reads whose name matches.  ``--keep`` leaves the synthesised database in place and prints its URL;
``--database URL`` times an existing one (made by ``--keep``), first topping
its samples up to now through the same storing step, so a change (an index,
a query) can be timed again without synthesising again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.common import say
from gpufleet.collector import rollup
from gpufleet.collector.batch_store import write_batches
from gpufleet.config import Settings, load_settings
from gpufleet.db import migrate
from gpufleet.db.connect import with_database
from gpufleet.db.reader import ensure_reader
from gpufleet.sim.demo import READER_ROLE
from gpufleet.wire import Batch, Column
from testsupport.pg import server_url

GPUS_PER_NODE = 8
GROUP_NODES = 8  # a 64-GPU job's nodes
SITES = (("site-eu", "EUR", "EU-GRID", 1.18, 0.21, 2.40), ("site-us", "USD", "US-GRID", 1.32, 0.09, 2.10))
TEAMS = 8
MODEL = "NVIDIA H100 80GB HBM3"
#: Stored bytes per GPU-minute of history (gpu_stats_1m 198 B, gpu_energy_1m 104 B, host rows 25 B per GPU,
#: measured on PostgreSQL 15 with this script's samples), and per raw GPU-sample kept (162 B).
HISTORY_BYTES_PER_GPU_MINUTE = 330
RAW_BYTES_PER_GPU_SAMPLE = 165
#: Targets of the read side (docs/capacity.md).
ROUTE_TARGET_MS = 500.0
PANEL_TARGET_MS = 1000.0
#: Board ranges timed.
RANGES = (("6h", 6 * 3600), ("24h", 86_400), ("7d", 7 * 86_400), ("30d", 30 * 86_400))


# ---------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    gpus: int
    days: float
    minute_days: float
    raw_hours: float
    raw_interval_s: float
    seed: int = 7

    @property
    def nodes(self) -> list[str]:
        return [f"gpu-{i:05d}" for i in range(self.gpus // GPUS_PER_NODE)]

    def bytes_needed(self) -> int:
        minutes = self.gpus * self.minute_days * 1440 + self.gpus * self.raw_hours * 60
        raw = self.gpus * self.raw_hours * 3600 / self.raw_interval_s
        return int(
            minutes * HISTORY_BYTES_PER_GPU_MINUTE
            + raw * RAW_BYTES_PER_GPU_SAMPLE
            + self.gpus * 1440 * HISTORY_BYTES_PER_GPU_MINUTE
        )  # one day of raw history in flight


@dataclass
class RunRow:
    run_id: str
    site: str
    team: str
    start: float
    end: float | None
    nodes: list[str]
    model: str


@dataclass
class Fleet:
    """What was synthesised (or found), and the ids the routes are asked about."""

    plan: Plan
    end: float  # epoch seconds the samples reach
    runs: list[RunRow] = field(default_factory=list)
    incidents: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def site_of(plan: Plan, node_index: int) -> str:
    return SITES[0][0] if node_index < len(plan.nodes) // 2 else SITES[1][0]


def schedule(plan: Plan, end: float) -> list[RunRow]:
    """Back-to-back runs on every group of nodes over ``plan.days``; most groups have one going at ``end``."""
    rng = np.random.default_rng(plan.seed)
    nodes = plan.nodes
    out: list[RunRow] = []
    begin = end - plan.days * 86_400
    groups = [nodes[i : i + GROUP_NODES] for i in range(0, len(nodes), GROUP_NODES)]
    for g, members in enumerate(groups):
        lanes = [[n] for n in members] if g % 4 == 3 else [members]
        site = site_of(plan, g * GROUP_NODES)
        for lane_no, lane in enumerate(lanes):
            t = begin - rng.uniform(0, 86_400)
            k = 0
            while t < end:
                dur = rng.uniform(30, 60) * 3600
                stop: float | None = t + dur
                if stop is not None and stop >= end:
                    # Groups 10, 20, ... are idle now: their last run ended an hour ago.
                    stop = end - 3600 if g % 10 == 0 and t < end - 7200 else None
                if stop is None or stop > t:
                    out.append(
                        RunRow(
                            f"job-{g:04d}-{lane_no}-{k:03d}",
                            site,
                            f"team-{(g + lane_no) % TEAMS}",
                            round(t, 3),
                            None if stop is None else round(stop, 3),
                            lane,
                            ("llama-70b", "mixtral-8x22b", "vit-h")[(g + k) % 3],
                        )
                    )
                if stop is None:
                    break
                t = stop + rng.uniform(300, 7200)
                k += 1
    return out


def busy_mask(runs: list[RunRow], nodes: list[str], t: np.ndarray) -> dict[str, np.ndarray]:
    """Per node: whether a run holds it at each of ``t``."""
    out = {n: np.zeros(len(t), dtype=bool) for n in nodes}
    for r in runs:
        if r.start >= t[-1] or (r.end is not None and r.end <= t[0]):
            continue
        sel = (t >= r.start) & (t < (r.end if r.end is not None else math.inf))
        for n in r.nodes:
            if n in out:
                out[n] |= sel
    return out


def gpu_columns(
    t: np.ndarray, busy: np.ndarray, energy0: np.ndarray, rng: np.random.Generator
) -> tuple[dict[str, Column], np.ndarray]:
    """8 GPUs x len(t) samples (time-major, as agents send them) and each GPU's energy counter after them."""
    n, g = len(t), GPUS_PER_NODE
    load = np.where(
        busy[:, None],
        np.clip(0.88 + 0.05 * rng.standard_normal((n, g)), 0, 1),
        np.clip(0.01 * rng.random((n, g)), 0, 1),
    )
    power = np.where(busy[:, None], 110 + 560 * load, 68 + 4 * rng.random((n, g)))
    dt = np.diff(t, prepend=t[0] - (t[1] - t[0] if n > 1 else 60.0))
    energy = energy0[None, :] + np.cumsum(power * dt[:, None] * 1000.0, axis=0)
    flat = {
        "time": np.repeat(t, g),
        "gpu": np.tile(np.arange(g, dtype=np.int64), n),
        "util_pct": np.minimum(100.0, load * 104).ravel(),
        "sm_active": load.ravel(),
        "tensor_active": (load * 0.62).ravel(),
        "dram_active": (load * 0.41).ravel(),
        "power_w": power.ravel(),
        "power_limit_w": np.full(n * g, 700.0),
        "energy_mj": np.round(energy).astype(np.int64).ravel(),
        "sm_clock_mhz": np.where(load > 0.5, 1980, 345).astype(np.int64).ravel(),
        "sm_clock_max_mhz": np.full(n * g, 1980, dtype=np.int64),
        "mem_clock_mhz": np.full(n * g, 2619, dtype=np.int64),
        "temp_c": (38 + 34 * load).astype(np.int64).ravel(),
        "mem_temp_c": (42 + 30 * load).astype(np.int64).ravel(),
        "mem_used_mib": np.where(busy[:, None], 71_000.0, 512.0).repeat(g, axis=1).ravel()
        if n
        else np.zeros(0),
        "mem_total_mib": np.full(n * g, 81_559.0),
        "throttle_reasons": np.zeros(n * g, dtype=np.int64),
        "pcie_gen": np.full(n * g, 5, dtype=np.int64),
        "pcie_width": np.full(n * g, 16, dtype=np.int64),
        "pcie_gen_max": np.full(n * g, 5, dtype=np.int64),
        "pcie_width_max": np.full(n * g, 16, dtype=np.int64),
        "pcie_tx_bytes_s": (2.1e9 * load).ravel(),
        "pcie_rx_bytes_s": (3.4e9 * load).ravel(),
        "xid": np.zeros(n * g, dtype=np.int64),
    }
    return (
        {
            k: Column(v.astype(np.float64) if v.dtype.kind == "f" else v.astype(np.int64))
            for k, v in flat.items()
        },
        energy[-1] if n else energy0,
    )


def host_columns(t: np.ndarray, busy: np.ndarray, rng: np.random.Generator) -> dict[str, Column]:
    m = len(t)
    cpu = np.where(busy, 28.0, 2.0) + 4 * rng.random(m)
    return {
        "time": Column(t.astype(np.float64)),
        "cpu_user_pct": Column(cpu),
        "cpu_system_pct": Column(3 + rng.random(m)),
        "cpu_iowait_pct": Column(rng.random(m)),
        "cpu_idle_pct": Column(95 - cpu),
        "cpu_count": Column(np.full(m, 192, dtype=np.int64)),
        "disk_read_bytes_s": Column(2e8 * rng.random(m)),
        "disk_write_bytes_s": Column(1e7 * rng.random(m)),
        "disk_util_pct": Column(10 * rng.random(m)),
        "net_rx_bytes_s": Column(1e9 * rng.random(m)),
        "net_tx_bytes_s": Column(1e8 * rng.random(m)),
        "host_power_w": Column(900 + 50 * rng.random(m)),
    }


# ---------------------------------------------------------------------------- synthesis


def register(conn: psycopg.Connection, plan: Plan, runs: list[RunRow], end: float) -> int:
    """Sites, settings, carbon, nodes, runs, allocations, progress and incidents."""
    begin = end - plan.days * 86_400 - 2 * 86_400
    t0 = datetime.fromtimestamp(begin, UTC)
    for site, currency, region, pue, price, gpu_hour in SITES:
        conn.execute("INSERT INTO sites (site, currency) VALUES (%s, %s)", (site, currency))
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num, txt) VALUES "
            "(%(s)s, 'pue', '-infinity', %(pue)s, NULL), (%(s)s, 'price_per_kwh', '-infinity', %(p)s, NULL), "
            "(%(s)s, 'gpu_hour_price', '-infinity', %(g)s, NULL), "
            "(%(s)s, 'carbon_region', '-infinity', NULL, %(r)s)",
            {"s": site, "pue": pue, "p": price, "g": gpu_hour, "r": region},
        )
        # A price change half way through the history, a model price of its own.
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num) VALUES (%s, 'price_per_kwh', %s, %s), "
            "(%s, 'gpu_hour_price', %s, %s)",
            (
                site,
                datetime.fromtimestamp(end - plan.days * 43_200 + 7.25, UTC),
                price * 1.15,
                site,
                datetime.fromtimestamp(end - plan.days * 28_800, UTC),
                gpu_hour * 0.9,
            ),
        )
        conn.execute(
            "INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) SELECT %s, "
            "date_trunc('hour', %s::timestamptz) + make_interval(hours => h), 250 + 150 * sin(h / 4.0) "
            "FROM generate_series(0, %s) h",
            (region, t0, int((end - begin) // 3600) + 2),
        )
    with conn.cursor().copy("COPY nodes (node, site, gpu_count, facts, first_seen) FROM STDIN") as cp:
        for i, node in enumerate(plan.nodes):
            cp.write_row(
                (node, site_of(plan, i), GPUS_PER_NODE, json.dumps({"gpu_model": MODEL, "gpu_count": 8}), t0)
            )
    with conn.cursor().copy(
        'COPY runs (run_id, name, site, team, start, "end", params, labels) FROM STDIN'
    ) as cp:
        for r in runs:
            cp.write_row(
                (
                    r.run_id,
                    f"{r.model} pretraining",
                    r.site,
                    r.team,
                    datetime.fromtimestamp(r.start, UTC),
                    None if r.end is None else datetime.fromtimestamp(r.end, UTC),
                    70_000_000_000,
                    json.dumps({"model": r.model}),
                )
            )
    with conn.cursor().copy("COPY run_allocations (run_id, node, gpu) FROM STDIN") as cp:
        for r in runs:
            for n in r.nodes:
                for g in range(GPUS_PER_NODE):
                    cp.write_row((r.run_id, n, g))
    with conn.cursor().copy("COPY run_progress (run_id, time, tokens, steps) FROM STDIN") as cp:
        for r in runs:
            stop = min(r.end if r.end is not None else end, end)
            gpus = len(r.nodes) * GPUS_PER_NODE
            for k, t in enumerate(np.arange(r.start + 600, stop, 3600.0)):
                cp.write_row(
                    (r.run_id, datetime.fromtimestamp(float(t), UTC), 2.2e3 * gpus * (t - r.start), k * 900)
                )
    return add_incidents(conn, runs, end)


#: Per run: (kind, every s, first at s, lasting s, GPU-scoped, cause, evidence).
INCIDENTS: tuple[tuple[str, float, float, float, bool, str | None, dict[str, Any]], ...] = (
    ("checkpoint_stall", 12 * 3600, 5_400, 180, False, None, {"run_time_lost_share": 0.3, "period_s": 1800}),
    ("starvation", 86_400, 20_000, 2_700, False, "io", {"duty_cycle": 0.6, "period_s": 30}),
    ("throttling", 86_400, 40_000, 1_800, True, "thermal", {"throttled_share": 0.9, "clock_ratio": 0.7}),
    (
        "straggler",
        2 * 86_400,
        60_000,
        3_600,
        True,
        "power_cap",
        {"activity": 0.7, "peer_activity": 0.9, "z": 4.2},
    ),
    ("idle_allocation", 3 * 86_400, 70_000, 1_800, False, None, {"idle_share": 1.0}),
)


def add_incidents(conn: psycopg.Connection, runs: list[RunRow], end: float) -> int:
    """Every run's incidents; a run going now has its newest starvation or throttling open, one in three."""
    n = 0
    cols = 'kind, scope_key, run_id, node, gpu, cause, severity, state, start, "end", last_seen, evidence'
    with conn.cursor().copy(f"COPY incidents ({cols}) FROM STDIN") as cp:
        for i, r in enumerate(runs):
            stop = min(r.end if r.end is not None else end, end)
            listed = [{"node": nd, "gpu": g} for nd in r.nodes for g in range(GPUS_PER_NODE)]
            for kind, every, first, dur, per_gpu, cause, ev in INCIDENTS:
                t = r.start + first
                k = 0
                while t < stop:
                    node = r.nodes[k % len(r.nodes)] if per_gpu else None
                    gpu = (k * 3) % GPUS_PER_NODE if per_gpu else None
                    evidence = dict(ev)
                    if kind == "throttling":
                        evidence["gpus"] = [{"node": node, "gpu": gpu, **ev}]
                    elif kind == "idle_allocation":
                        evidence["gpus"] = listed[:8]
                    b = min(t + dur, stop)
                    is_open = (
                        r.end is None and b >= stop and kind in ("starvation", "throttling") and i % 3 == 0
                    )
                    scope = f"{kind}|{r.run_id}|{node or ''}|{gpu if gpu is not None else ''}"
                    cp.write_row(
                        (
                            kind,
                            scope if is_open else f"{scope}|{k}",
                            r.run_id,
                            node,
                            gpu,
                            cause,
                            "critical" if kind == "straggler" else "warning",
                            "open" if is_open else "resolved",
                            datetime.fromtimestamp(t, UTC),
                            None if is_open else datetime.fromtimestamp(b, UTC),
                            datetime.fromtimestamp(b, UTC),
                            json.dumps(evidence),
                        )
                    )
                    n += 1
                    t += every
                    k += 1
    return n


def write_span(
    conn: psycopg.Connection,
    plan: Plan,
    runs: list[RunRow],
    lo: float,
    hi: float,
    step: float,
    energy: dict[str, np.ndarray],
    tag: str,
    say: Callable[[str], None],
) -> int:
    """Samples of every node over [lo, hi) every ``step`` s, stored by write_batches, then rolled up."""
    rng = np.random.default_rng(int(lo) % (2**31) + plan.seed)
    nodes = plan.nodes
    chunk_s = 3600.0 if step < 60 else 6 * 3600.0
    rows = 0
    for a in np.arange(lo, hi, chunk_s):
        t = np.arange(a, min(a + chunk_s, hi), step)
        if not len(t):
            continue
        busy = busy_mask(runs, nodes, t)
        for k in range(0, len(nodes), 50):
            batches = []
            for node in nodes[k : k + 50]:
                gcols, energy[node] = gpu_columns(t, busy[node], energy[node], rng)
                batches.append(
                    Batch(
                        f"{tag}:{node}:{int(a)}",
                        node,
                        gpu=gcols,
                        host=host_columns(t, busy[node], rng),
                        n_gpu=len(t) * GPUS_PER_NODE,
                        n_host=len(t),
                    )
                )
            with conn.transaction():
                write_batches(conn, batches)
            rows += sum(b.n_gpu for b in batches)
    return rows


def analyze(conn: psycopg.Connection) -> None:
    """Statistics of what was just written, as autovacuum would gather them (the rollups' plans need them)."""
    for t in (
        "gpu_samples",
        "host_samples",
        "gpu_stats_1m",
        "host_stats_1m",
        "gpu_energy_1m",
        "gpu_energy_1h",
    ):
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(t)))


def roll(conn: psycopg.Connection, nodes: list[str], lo: float, hi: float, max_gap_s: float) -> None:
    """The rollups of [lo, hi] for every node, 25 nodes a transaction (as the worker claims ranges)."""
    a, b = datetime.fromtimestamp(lo, UTC), datetime.fromtimestamp(hi, UTC)
    for k in range(0, len(nodes), 25):
        with conn.transaction():
            rollup.rebuild(conn, {n: (a, b) for n in nodes[k : k + 25]}, max_gap_s, plain_stats=True)


def synthesise(url: str, plan: Plan, settings: Settings, say: Callable[[str], None]) -> Fleet:
    end = float(int(time.time()) // 60 * 60)
    fleet = Fleet(plan, end)
    fleet.runs = schedule(plan, end)
    max_gap = settings.accounting.max_gap_s
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        fleet.incidents = register(conn, plan, fleet.runs, end)
        fleet.seconds["register"] = time.perf_counter() - t0
        say(
            f"registered {len(plan.nodes)} nodes, {len(fleet.runs)} runs, {fleet.incidents} incidents "
            f"({fleet.seconds['register']:.0f} s)"
        )
        energy = {n: 4e9 + 1e8 * np.arange(GPUS_PER_NODE, dtype=np.float64) for n in plan.nodes}
        raw_lo = end - plan.raw_hours * 3600
        hist_lo = raw_lo - plan.minute_days * 86_400
        t0 = time.perf_counter()
        hist_rows = 0
        day = hist_lo
        while day < raw_lo:
            nxt = min(day + 86_400, raw_lo)
            hist_rows += write_span(conn, plan, fleet.runs, day, nxt, 60.0, energy, "hist", say)
            analyze(conn)
            roll(conn, plan.nodes, day, nxt, max_gap)
            # The day before is no longer needed (this day's first minute has its previous sample): removed,
            # and its space reused by the next day, as retention would.
            conn.execute("DELETE FROM gpu_samples WHERE time < %s", (datetime.fromtimestamp(day, UTC),))
            conn.execute("DELETE FROM host_samples WHERE time < %s", (datetime.fromtimestamp(day, UTC),))
            conn.execute("VACUUM gpu_samples")
            conn.execute("VACUUM host_samples")
            say(
                f"  history day {(day - hist_lo) / 86_400 + 1:.0f} of {plan.minute_days:g}: "
                f"{hist_rows:,} GPU-minutes so far ({time.perf_counter() - t0:.0f} s)"
            )
            day = nxt
        fleet.seconds["history"] = time.perf_counter() - t0
        # The raw part starts on an empty sample table, so its rows lie in time order as a live
        # collector's do; the one interval per GPU between the history and it is not counted.
        conn.execute("TRUNCATE gpu_samples, host_samples")
        t0 = time.perf_counter()
        raw_rows = 0
        for a in np.arange(raw_lo, end, 6 * 3600.0):
            b = min(a + 6 * 3600.0, end)
            raw_rows += write_span(conn, plan, fleet.runs, a, b, plan.raw_interval_s, energy, "raw", say)
            analyze(conn)
            roll(conn, plan.nodes, a, b, max_gap)
            say(f"  raw: {raw_rows:,} GPU-samples so far ({time.perf_counter() - t0:.0f} s)")
        fleet.seconds["raw"] = time.perf_counter() - t0
        conn.execute("TRUNCATE rollup_queue")  # everything queued was rolled up above
        t0 = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        fleet.seconds["vacuum"] = time.perf_counter() - t0
        conn.execute("CREATE TABLE bench_read_side (plan jsonb NOT NULL, end_s float8 NOT NULL)")
        conn.execute("INSERT INTO bench_read_side VALUES (%s, %s)", (json.dumps(plan.__dict__), end))
        fleet.counts = table_counts(conn)
        fleet.counts["history_gpu_minutes"] = hist_rows
        fleet.counts["raw_gpu_samples_written"] = raw_rows
    return fleet


def top_up(url: str, settings: Settings, say: Callable[[str], None]) -> Fleet:
    """An existing database's plan, its samples carried from where they end up to now (same storing step)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT plan, end_s FROM bench_read_side").fetchone()
        if row is None:
            raise SystemExit(f"{url}: not a database this script synthesised (no bench_read_side row)")
        plan = Plan(**row[0])
        fleet = Fleet(plan, float(row[1]))
        fleet.runs = schedule(plan, fleet.end)
        # The running runs' schedule is the one they were made with; runs ending past the old end keep going.
        newest = {
            n: np.asarray(v, dtype=np.float64)
            for n, v in conn.execute(
                "SELECT node, array_agg(energy_mj ORDER BY gpu) FROM (SELECT DISTINCT ON (node, gpu) node, gpu, energy_mj "
                "FROM gpu_samples WHERE time > %s ORDER BY node, gpu, time DESC) s GROUP BY node",
                (datetime.fromtimestamp(fleet.end - 3 * plan.raw_interval_s, UTC),),
            ).fetchall()
        }
        now = float(int(time.time()) // 60 * 60)
        if now > fleet.end:
            energy = {n: newest.get(n, np.full(GPUS_PER_NODE, 4e9)) for n in plan.nodes}
            t0 = time.perf_counter()
            rows = write_span(
                conn, plan, fleet.runs, fleet.end, now, plan.raw_interval_s, energy, "topup", say
            )
            roll(conn, plan.nodes, fleet.end - plan.raw_interval_s, now, settings.accounting.max_gap_s)
            conn.execute("TRUNCATE rollup_queue")
            conn.execute("ANALYZE")
            say(
                f"topped up {rows:,} GPU-samples from {datetime.fromtimestamp(fleet.end, UTC):%H:%M} to now "
                f"({time.perf_counter() - t0:.0f} s)"
            )
            conn.execute("UPDATE bench_read_side SET end_s = %s", (now,))
            fleet.end = now
        fleet.incidents = int(conn.execute("SELECT count(*) FROM incidents").fetchone()[0])  # type: ignore[index]
        fleet.counts = table_counts(conn)
    return fleet


def settle(url: str, settings: Settings) -> tuple[int, int, int]:
    """What the collector's leader keeps as runs end and hours close, which the synthesis has no leader to
    do: every ended run's power-cap points as both advisors read them
    (:func:`gpufleet.advisor.run_cap.keep_points_for_readers`), the running
    runs' closed hours of power-cap minutes (:func:`gpufleet.advisor.power_cap.keep_running_hours`) and
    the fleet's closed hours (:func:`gpufleet.accounting.fleet_hours.keep`); (ended runs looked at,
    running runs' hours kept, fleet hours kept)."""
    from gpufleet.accounting import fleet_hours
    from gpufleet.advisor.power_cap import keep_running_hours
    from gpufleet.advisor.run_cap import keep_points_for_readers

    looked = 0
    with psycopg.connect(url, autocommit=True) as conn:
        ended = [r for (r,) in conn.execute('SELECT run_id FROM runs WHERE "end" IS NOT NULL ORDER BY "end"')]
        for i in range(0, len(ended), 256):
            looked += keep_points_for_readers(conn, ended[i : i + 256])
        running = keep_running_hours(conn, datetime.now(UTC), math.inf)
        hours = fleet_hours.keep(conn, fleet_hours.keeping_of(settings), datetime.now(UTC), budget_s=math.inf)
    return looked, running, hours


def table_counts(conn: psycopg.Connection) -> dict[str, int]:
    out = {}
    for t in (
        "gpu_samples",
        "host_samples",
        "gpu_stats_1m",
        "host_stats_1m",
        "gpu_energy_1m",
        "gpu_energy_1h",
        "gpu_energy_spans",
        "runs",
        "run_allocations",
        "incidents",
        "run_progress",
        "ingest_batches",
        "nodes",
    ):
        out[t] = int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))).fetchone()[0])  # type: ignore[index]
    out["database_bytes"] = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])  # type: ignore[index]
    return out


# ---------------------------------------------------------------------------- what is timed


@dataclass
class Read:
    """One read: an HTTP route (``path``) or a panel (``panel_sql``), and its baseline SELECT."""

    kind: str  # api | web | panel
    name: str
    path: str = ""
    role: str = "admin"
    baseline: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    panel_sql: str = ""
    board: str = ""
    range_name: str = ""
    cold_ms: float = math.nan
    warm_ms: list[float] = field(default_factory=list)
    base_ms: list[float] = field(default_factory=list)
    status: int | None = None
    error: str | None = None
    rows: int = 0
    base_rows: int = 0

    def p(self, q: float) -> float:
        return float(np.percentile(self.warm_ms, q)) if self.warm_ms else math.nan

    @property
    def target_ms(self) -> float:
        return PANEL_TARGET_MS if self.kind == "panel" else ROUTE_TARGET_MS

    def over(self) -> bool:
        worst = max(self.p(95), self.cold_ms if self.kind == "panel" else 0.0)
        return self.error is not None or not worst < self.target_ms


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: Rows of the energy rollups a set of runs' accounting reads: whole hours from the hourly rollup,
#: the partial hours at the windows' edges from the per-minute one.
ENERGY_ROWS = """
SELECT e.node, e.gpu, e.bucket, e.energy_j, e.covered_s FROM gpu_energy_1h e
JOIN run_allocations a ON a.node = e.node AND a.gpu = e.gpu JOIN runs r ON r.run_id = a.run_id
WHERE {runs} AND e.bucket >= date_trunc('hour', greatest(r.start, %(lo)s)) AND e.bucket < least(coalesce(r."end", now()), %(hi)s)
UNION ALL
SELECT e.node, e.gpu, e.bucket, e.energy_j, e.covered_s FROM gpu_energy_1m e
JOIN run_allocations a ON a.node = e.node AND a.gpu = e.gpu JOIN runs r ON r.run_id = a.run_id
WHERE {runs} AND ((e.bucket >= greatest(r.start, %(lo)s) AND e.bucket < date_trunc('hour', greatest(r.start, %(lo)s))
                     + interval '1 hour')
              OR (e.bucket >= date_trunc('hour', least(coalesce(r."end", now()), %(hi)s))
                  AND e.bucket < least(coalesce(r."end", now()), %(hi)s)))"""

FLEET_ENERGY_ROWS = "SELECT node, gpu, bucket, energy_j, covered_s FROM gpu_energy_1h WHERE bucket >= %(lo)s AND bucket < %(hi)s"


def routes(fleet: Fleet) -> list[Read]:
    """Every API read route and web page, with the ids a user would ask about, and each one's baseline."""
    end = fleet.end
    running = [r for r in fleet.runs if r.end is None and len(r.nodes) == GROUP_NODES]
    big = running[0] if running else fleet.runs[-1]
    ended = next(
        (r for r in reversed(fleet.runs) if r.end is not None and len(r.nodes) == GROUP_NODES), fleet.runs[0]
    )
    node = big.nodes[0]
    lo30, lo1 = iso(end - 30 * 86_400), iso(end - 86_400)
    hi = iso(end + 60)
    one = "r.run_id = %(run)s"
    fleet_runs = 'r.start < %(hi)s AND (r."end" IS NULL OR r."end" > %(lo)s)'
    p_big = {
        "run": big.run_id,
        "lo": datetime.fromtimestamp(big.start, UTC),
        "hi": datetime.fromtimestamp(end + 60, UTC),
    }
    p_ended = {
        "run": ended.run_id,
        "lo": datetime.fromtimestamp(ended.start, UTC),
        "hi": datetime.fromtimestamp(end + 60, UTC),
    }
    p30 = {"lo": datetime.fromtimestamp(end - 30 * 86_400, UTC), "hi": datetime.fromtimestamp(end + 60, UTC)}
    p1 = {"lo": datetime.fromtimestamp(end - 86_400, UTC), "hi": datetime.fromtimestamp(end + 60, UTC)}
    q_runs = "SELECT * FROM runs ORDER BY start DESC, run_id LIMIT 100"
    q_open = "SELECT * FROM incidents WHERE state = 'open' ORDER BY start DESC LIMIT 100"
    q_run_inc = "SELECT * FROM incidents WHERE run_id = %(run)s"
    q_latest = (
        "SELECT DISTINCT ON (node, gpu) node, gpu, util_pct, power_w FROM gpu_samples "
        "WHERE time > %(t)s - interval '2 minutes' ORDER BY node, gpu, time DESC"
    )
    p_latest = {"t": datetime.fromtimestamp(end, UTC)}
    e_big = ENERGY_ROWS.format(runs=one)
    e_fleet30 = ENERGY_ROWS.format(runs=fleet_runs)
    region = SITES[0][2]
    out = [
        Read("api", "GET /v1/runs", "/v1/runs", baseline=q_runs),
        Read(
            "api",
            "GET /v1/runs?state=running",
            "/v1/runs?state=running&limit=1000",
            baseline='SELECT * FROM runs WHERE "end" IS NULL OR "end" > now() ORDER BY start DESC LIMIT 1000',
        ),
        Read(
            "api",
            "GET /v1/runs/{id}",
            f"/v1/runs/{quote(big.run_id)}",
            baseline="SELECT * FROM run_allocations WHERE run_id = %(run)s",
            params={"run": big.run_id},
        ),
        Read(
            "api",
            "GET /v1/runs/{id}/accounting (running, 64 GPUs)",
            f"/v1/runs/{quote(big.run_id)}/accounting",
            role="finance",
            baseline=e_big,
            params=p_big,
        ),
        Read(
            "api",
            "GET /v1/runs/{id}/accounting (ended, 64 GPUs)",
            f"/v1/runs/{quote(ended.run_id)}/accounting",
            role="finance",
            baseline=e_big,
            params=p_ended,
        ),
        Read(
            "api",
            "GET /v1/runs/{id}/incidents",
            f"/v1/runs/{quote(big.run_id)}/incidents?state=all",
            baseline=q_run_inc,
            params={"run": big.run_id},
        ),
        Read("api", "GET /v1/incidents (open)", "/v1/incidents?state=open", baseline=q_open),
        Read(
            "api",
            "GET /v1/incidents (all, 100)",
            "/v1/incidents?state=all&limit=100",
            baseline="SELECT * FROM incidents ORDER BY start DESC LIMIT 100",
        ),
        Read(
            "api",
            "GET /v1/incidents?run_id=",
            f"/v1/incidents?state=all&run_id={quote(big.run_id)}",
            baseline=q_run_inc,
            params={"run": big.run_id},
        ),
        Read(
            "api",
            "GET /v1/incidents/{id}",
            "/v1/incidents/{open_incident}",
            baseline="SELECT * FROM incidents WHERE id = %(id)s",
        ),
        Read(
            "api",
            "GET /v1/accounting (30 d, by site)",
            f"/v1/accounting?from={lo30}&to={hi}&group_by=site",
            role="finance",
            baseline=FLEET_ENERGY_ROWS,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/accounting (30 d, by team)",
            f"/v1/accounting?from={lo30}&to={hi}&group_by=team",
            role="finance",
            baseline=FLEET_ENERGY_ROWS,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/accounting (30 d, by run)",
            f"/v1/accounting?from={lo30}&to={hi}&group_by=run",
            role="finance",
            baseline=e_fleet30,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/accounting (1 d, by run)",
            f"/v1/accounting?from={lo1}&to={hi}&group_by=run",
            role="finance",
            baseline=ENERGY_ROWS.format(runs=fleet_runs),
            params=p1,
        ),
        Read(
            "api",
            "GET /v1/reports/runs.csv (30 d)",
            f"/v1/reports/runs.csv?from={lo30}&to={hi}",
            role="finance",
            baseline=e_fleet30,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/reports/finance.csv (30 d)",
            f"/v1/reports/finance.csv?from={lo30}&to={hi}",
            role="finance",
            baseline=FLEET_ENERGY_ROWS,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/reports/finance.json (30 d)",
            f"/v1/reports/finance.json?from={lo30}&to={hi}",
            role="finance",
            baseline=FLEET_ENERGY_ROWS,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/reports/focus.csv (30 d)",
            f"/v1/reports/focus.csv?from={lo30}&to={hi}",
            role="finance",
            baseline=FLEET_ENERGY_ROWS,
            params=p30,
        ),
        Read(
            "api",
            "GET /v1/sites",
            "/v1/sites",
            role="finance",
            baseline="SELECT site, setting, gpu_model, num, txt FROM site_settings",
        ),
        Read(
            "api",
            "GET /v1/sites/{site}",
            f"/v1/sites/{SITES[0][0]}",
            role="finance",
            baseline="SELECT site, setting, gpu_model, num, txt FROM site_settings WHERE site = %(s)s",
            params={"s": SITES[0][0]},
        ),
        Read(
            "api",
            "GET /v1/sites/{site}/history",
            f"/v1/sites/{SITES[0][0]}/history",
            role="finance",
            baseline="SELECT site, setting, gpu_model, num, txt FROM site_settings WHERE site = %(s)s",
            params={"s": SITES[0][0]},
        ),
        Read(
            "api",
            "GET /v1/carbon/{region} (30 d)",
            f"/v1/carbon/{region}?from={lo30}&to={hi}",
            role="finance",
            baseline="SELECT * FROM carbon_intensity WHERE region = %(r)s AND time >= %(lo)s AND time < %(hi)s",
            params={"r": region, **p30},
        ),
        Read("api", "GET /v1/nodes", "/v1/nodes", baseline="SELECT * FROM nodes"),
        Read("api", "GET /v1/tokens", "/v1/tokens", baseline="SELECT id, name, role, node FROM agent_tokens"),
        Read(
            "api",
            "GET /v1/advisor/power-cap",
            f"/v1/advisor/power-cap?gpu_model={quote(MODEL)}",
            baseline="SELECT * FROM runs WHERE start > now() - interval '30 days'",
        ),
        Read(
            "api",
            "GET /v1/runs/{id}/power-cap",
            f"/v1/runs/{quote(big.run_id)}/power-cap",
            baseline="SELECT * FROM run_allocations WHERE run_id = %(run)s",
            params={"run": big.run_id},
        ),
        Read(
            "api",
            "GET /v1/nodes/{node}/power-caps",
            f"/v1/nodes/{node}/power-caps",
            baseline="SELECT * FROM nodes WHERE node = %(n)s",
            params={"n": node},
        ),
        Read("api", "GET /readyz", "/readyz", baseline="SELECT 1"),
        Read("web", "/ (fleet)", "/", role="sre", baseline=q_latest, params=p_latest),
        Read(
            "web",
            "/runs",
            "/runs",
            role="sre",
            baseline=e_fleet30.replace(
                fleet_runs, "r.run_id IN (SELECT run_id FROM runs ORDER BY start DESC, run_id LIMIT 100)"
            ),
            params=p30,
        ),
        Read(
            "web",
            "/runs/{id} (1 h)",
            f"/runs/{quote(big.run_id)}?hours=1",
            role="sre",
            baseline=(
                "SELECT s.time, s.node, s.gpu, s.util_pct, s.power_w FROM gpu_samples s JOIN run_allocations a "
                "ON a.node = s.node AND a.gpu = s.gpu WHERE a.run_id = %(run)s AND s.time > %(t)s - interval "
                "'1 hour'"
            ),
            params={"run": big.run_id, **p_latest},
        ),
        Read(
            "web",
            "/runs/{id} (24 h)",
            f"/runs/{quote(big.run_id)}?hours=24",
            role="sre",
            baseline=(
                "SELECT r.bucket, r.node, r.gpu, r.util_pct, r.power_w FROM gpu_stats_1m r JOIN run_allocations a "
                "ON a.node = r.node AND a.gpu = r.gpu WHERE a.run_id = %(run)s AND r.bucket > %(t)s - interval "
                "'24 hours'"
            ),
            params={"run": big.run_id, **p_latest},
        ),
        Read(
            "web",
            "/runs/{id} (whole run)",
            f"/runs/{quote(big.run_id)}?hours=all",
            role="sre",
            baseline=(
                "SELECT r.bucket, r.node, r.gpu, r.util_pct, r.power_w FROM gpu_stats_1m r JOIN run_allocations a "
                "ON a.node = r.node AND a.gpu = r.gpu WHERE a.run_id = %(run)s AND r.bucket >= %(lo)s"
            ),
            params=p_big,
        ),
        Read(
            "web",
            "/accounting",
            "/accounting",
            role="finance",
            baseline=e_fleet30.replace(
                fleet_runs, "r.run_id IN (SELECT run_id FROM runs ORDER BY start DESC, run_id LIMIT 100)"
            ),
            params=p30,
        ),
        Read("web", "/finance", "/finance", role="finance", baseline=FLEET_ENERGY_ROWS, params=p30),
        Read("web", "/incidents", "/incidents", role="sre", baseline=q_open),
        Read(
            "web",
            "/incidents?state=all",
            "/incidents?state=all",
            role="sre",
            baseline="SELECT * FROM incidents ORDER BY start DESC LIMIT 200",
        ),
        Read(
            "web",
            "/incidents/{id}",
            "/incidents/{open_incident}",
            role="sre",
            baseline="SELECT * FROM incidents WHERE id = %(id)s",
        ),
        Read(
            "web",
            "/nodes/{node}",
            f"/nodes/{node}",
            role="sre",
            baseline=(
                "SELECT r.bucket, r.gpu, r.util_pct, r.power_w FROM gpu_stats_1m r WHERE r.node = %(n)s "
                "AND r.bucket > %(t)s - interval '24 hours'"
            ),
            params={"n": node, **p_latest},
        ),
        Read(
            "web",
            "/waste?period=day",
            "/waste?period=day",
            role="sre",
            baseline=ENERGY_ROWS.format(runs=fleet_runs),
            params=p1,
        ),
        Read(
            "web",
            "/waste?period=week",
            "/waste?period=week",
            role="sre",
            baseline=ENERGY_ROWS.format(runs=fleet_runs),
            params={"lo": datetime.fromtimestamp(end - 7 * 86_400, UTC), "hi": p30["hi"]},
        ),
        Read("web", "/waste?period=month", "/waste?period=month", role="sre", baseline=e_fleet30, params=p30),
        Read("web", "/runbooks", "/runbooks", role="sre", baseline="SELECT 1"),
    ]
    return out


# ---------------------------------------------------------------------------- panels


def panel_reads(conn: psycopg.Connection, fleet: Fleet) -> list[tuple[Read, dict[str, Any], Any]]:
    """Every panel of every board at each range, expanded as Grafana would (run once to expand)."""
    from gpufleet.dashboards.dryrun import run_dashboard  # noqa: F401 - the expansion the tests trust
    from gpufleet.dashboards.loader import load_all

    running = [r for r in fleet.runs if r.end is None and len(r.nodes) == GROUP_NODES]
    big = running[0] if running else fleet.runs[-1]
    picks = {"gpufleet-run": {"run": big.run_id}, "gpufleet-node": {"node": big.nodes[0]}}
    out = []
    for uid, board in sorted(load_all().items()):
        for rname, span in RANGES:
            out.append(
                (
                    Read("panel", f"{uid} {rname}", board=uid, range_name=rname),
                    board,
                    (span, picks.get(uid, {})),
                )
            )
    return out


def scope_of(uid: str, fleet: Fleet) -> tuple[str, dict[str, Any]]:
    """The rows a board's panels draw from: a run's GPUs, a node, or the fleet."""
    running = [r for r in fleet.runs if r.end is None and len(r.nodes) == GROUP_NODES]
    big = running[0] if running else fleet.runs[-1]
    if uid == "gpufleet-run":
        return (
            "JOIN run_allocations a ON a.node = t.node AND a.gpu = t.gpu AND a.run_id = %(run)s",
            {"run": big.run_id},
        )
    if uid == "gpufleet-node":
        return ("AND t.node = %(node)s", {"node": big.nodes[0]})
    return ("", {})


def panel_baseline(
    sql_text: str, interval_ms: int, uid: str, fleet: Fleet, lo: datetime, hi: datetime
) -> tuple[str, dict[str, Any]]:
    """A plain SELECT of the rows the panel reads: its main table's rows in its range and scope."""
    text = sql_text.lower()
    raw = interval_ms < 60_000
    if "gpufleet_accounting" in text or "gpufleet_ledger" in text:
        table, tcol, cols = "gpu_energy_1h", "bucket", "t.node, t.gpu, t.bucket, t.energy_j, t.covered_s"
    elif "gpu_samples" in text or "gpu_stats_1m" in text:
        table, tcol = ("gpu_samples", "time") if raw and "gpu_samples" in text else ("gpu_stats_1m", "bucket")
        cols = f"t.{tcol}, t.node, t.gpu, t.util_pct, t.power_w"
    elif "host_samples" in text or "host_stats_1m" in text:
        table, tcol = (
            ("host_samples", "time") if raw and "host_samples" in text else ("host_stats_1m", "bucket")
        )
        cols = f"t.{tcol}, t.node, t.cpu_user_pct, t.cpu_iowait_pct"
    elif "incidents" in text:
        return (
            "SELECT * FROM incidents WHERE start < %(hi)s AND coalesce(\"end\", 'infinity') > %(lo)s",
            {"lo": lo, "hi": hi},
        )
    elif "run_progress" in text:
        return ("SELECT * FROM run_progress WHERE time >= %(lo)s AND time < %(hi)s", {"lo": lo, "hi": hi})
    else:
        return ("SELECT * FROM runs WHERE start < %(hi)s", {"lo": lo, "hi": hi})
    scope, params = scope_of(uid, fleet)
    join, where = (scope, "") if scope.startswith("JOIN") else ("", scope)
    if table.startswith("host") and join:
        join = "JOIN (SELECT DISTINCT node FROM run_allocations WHERE run_id = %(run)s) a ON a.node = t.node"
    if table == "gpu_energy_1h" and uid == "gpufleet-energy":
        join, where = "", ""
    return (
        f"SELECT {cols} FROM {table} t {join} WHERE t.{tcol} >= %(lo)s AND t.{tcol} <= %(hi)s {where}",
        {"lo": lo, "hi": hi, **params},
    )


# ---------------------------------------------------------------------------- timing


def timed_sql(conn: psycopg.Connection, query: str, params: dict[str, Any] | None) -> tuple[float, int]:
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        cur.execute(query.encode() if params is None else query, params)
        n = len(cur.fetchall()) if cur.description else 0
    return (time.perf_counter() - t0) * 1000, n


#: What the cold reads keep for the warm ones (priced pieces, claims, power-cap points, the marks).
READERS_KEEP = ("priced_pieces", "kept_claims", "kept_power_points", "kept_power_minutes", "pricing_marks")


def _analyze_what_readers_kept(conn: psycopg.Connection, say: Callable[[str], None]) -> None:
    """Statistics of what the cold reads kept, where no autovacuum gathers them: without them the lookup
    of 41,000 kept pieces was planned for an empty table and took 14.4 s instead of 0.9 s, a figure no
    server with autovacuum (the default) shows."""
    row = conn.execute("SHOW autovacuum").fetchone()
    if row is not None and row[0] == "off":
        conn.execute(sql.SQL("ANALYZE {}").format(sql.SQL(", ").join(map(sql.Identifier, READERS_KEEP))))
        say(f"autovacuum is off here: analysed {', '.join(READERS_KEEP)} after the cold reads")


def time_http(
    reads: list[Read],
    api_url: str,
    tokens: dict[str, str],
    repeat: int,
    budget_s: float,
    url: str,
    say: Callable[[str], None],
) -> None:
    clients = {
        role: httpx.Client(base_url=api_url, timeout=300, headers={"Authorization": f"Bearer {tok}"})
        for role, tok in tokens.items()
    }
    with contextlib.ExitStack() as stack:
        for c in clients.values():
            stack.enter_context(c)
        base = stack.enter_context(psycopg.connect(url, autocommit=True))
        for r in reads:  # cold: every route once, on the freshly started API
            t0 = time.perf_counter()
            try:
                resp = clients[r.role].get(r.path)
                r.status = resp.status_code
                r.rows = len(resp.content)
                if resp.status_code >= 400:
                    r.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            except httpx.HTTPError as e:
                r.error = f"{type(e).__name__}: {e}"
            r.cold_ms = (time.perf_counter() - t0) * 1000
        _analyze_what_readers_kept(base, say)
        for r in reads:
            spent = r.cold_ms / 1000
            for _ in range(repeat):
                if r.error is not None or spent > budget_s:
                    break
                t0 = time.perf_counter()
                clients[r.role].get(r.path)
                r.warm_ms.append((time.perf_counter() - t0) * 1000)
                spent += r.warm_ms[-1] / 1000
                ms, r.base_rows = timed_sql(base, r.baseline, r.params or None)
                r.base_ms.append(ms)
            say(line(r))


def time_panels(
    items: list[tuple[Read, dict[str, Any], Any]],
    url: str,
    fleet: Fleet,
    repeat: int,
    budget_s: float,
    say: Callable[[str], None],
) -> list[Read]:
    """Each board at each range: cold (a new connection's first run of every panel, as
    :func:`gpufleet.dashboards.dryrun.run_dashboard` expands and runs them), then each panel's
    expanded SQL ``repeat`` more times (fewer once it took ``budget_s``), its baseline beside it."""
    from gpufleet.dashboards.dryrun import run_dashboard
    from gpufleet.dashboards.macros import TimeRange

    end = datetime.fromtimestamp(fleet.end, UTC)
    out: list[Read] = []
    for proto, board, (span, picks) in items:
        rng = TimeRange(end - timedelta(seconds=span), end)
        with psycopg.connect(url, autocommit=True) as conn:
            first = run_dashboard(conn, board, rng, picks)
        panels: list[Read] = []
        for q in first:
            if q.kind == "variable":
                continue
            r = Read(
                "panel",
                f"{proto.board} {proto.range_name} #{q.panel_id} {q.title}",
                board=proto.board,
                range_name=proto.range_name,
                panel_sql=q.sql,
            )
            r.cold_ms, r.rows, r.error = q.seconds * 1000, len(q.rows), q.error
            r.baseline, r.params = panel_baseline(
                q.sql, q.interval_ms, proto.board, fleet, rng.start, rng.end
            )
            panels.append(r)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET statement_timeout = '120s'")
            for r in panels:
                spent = r.cold_ms / 1000
                for _ in range(repeat):
                    if r.error is not None or spent > budget_s:
                        break
                    ms, _n = timed_sql(conn, r.panel_sql, None)
                    r.warm_ms.append(ms)
                    ms_b, r.base_rows = timed_sql(conn, r.baseline, r.params)
                    r.base_ms.append(ms_b)
                    spent += (ms + ms_b) / 1000
                say(line(r))
        out.extend(panels)
    return out


def line(r: Read) -> str:
    base = float(np.median(r.base_ms)) if r.base_ms else math.nan
    mark = " OVER" if r.over() else ""
    err = f"  ERROR {r.error}" if r.error else ""
    return (
        f"  {r.kind:5s} {r.name[:78]:78s} cold {r.cold_ms:8.1f}  p50 {r.p(50):8.1f}  p95 {r.p(95):8.1f}  "
        f"baseline {base:8.1f} ms ({r.base_rows} rows){mark}{err}"
    )


def summary(r: Read) -> dict[str, Any]:
    base = float(np.median(r.base_ms)) if r.base_ms else math.nan

    def rnd(v: float) -> float | None:
        return None if math.isnan(v) else round(v, 1)

    return {
        "kind": r.kind,
        "name": r.name,
        "cold_ms": rnd(r.cold_ms),
        "p50_ms": rnd(r.p(50)),
        "p95_ms": rnd(r.p(95)),
        "n": len(r.warm_ms),
        "baseline_ms": rnd(base),
        "over_target": r.over(),
        "error": r.error,
    }


@contextlib.contextmanager
def served_api(url: str, settings: Settings) -> Iterator[str]:
    from gpufleet.api.app import create_app
    from gpufleet.serverthread import serve

    with serve(create_app(url, settings)) as srv:
        yield srv.url


def make_tokens(url: str) -> dict[str, str]:
    from gpufleet.auth import create_token

    suffix = os.urandom(3).hex()
    with psycopg.connect(url, autocommit=True) as conn:
        return {
            role: create_token(conn, f"bench-read-{role}-{suffix}", role)
            for role in ("admin", "sre", "finance")
        }


# ---------------------------------------------------------------------------- a standby under ingest


STANDBY_READS = (
    ("GET /v1/runs", "/v1/runs", "admin"),
    ("GET /v1/incidents (open)", "/v1/incidents?state=open", "admin"),
    ("/ (fleet)", "/", "sre"),
    ("/runs/{id} (1 h)", "/runs/{run}?hours=1", "sre"),
    ("/nodes/{node}", "/nodes/{node}", "sre"),
)


def ingest_second(
    conn: psycopg.Connection,
    nodes: list[str],
    tick: int,
    ship_s: int,
    energy: dict[str, np.ndarray],
    rng: np.random.Generator,
    runs: list[RunRow],
) -> int:
    """The batches due at ``tick`` (each node ships its last ``ship_s`` seconds every ``ship_s``), one commit."""
    due = nodes[tick % ship_s :: ship_s]
    t = np.arange(tick - ship_s, tick, 1.0)
    busy = busy_mask(runs, due, t)
    batches = []
    for node in due:
        gcols, energy[node] = gpu_columns(t, busy[node], energy[node], rng)
        batches.append(
            Batch(
                f"live:{node}:{tick}",
                node,
                gpu=gcols,
                host=host_columns(t, busy[node], rng),
                n_gpu=len(t) * GPUS_PER_NODE,
                n_host=len(t),
            )
        )
    with conn.transaction():
        write_batches(conn, batches)
    return sum(b.n_gpu for b in batches)


def standby_bench(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """A primary and a hot standby of this script's own: the fleet ingesting at 1 Hz on the primary while the
    API reads from the standby; then the primary written as fast as one connection can and the standby's
    replay timed."""
    from gpufleet.api.app import create_app
    from gpufleet.serverthread import serve
    from testsupport import replication

    why = replication.available()
    if why is not None:
        sys.exit(f"--standby: {why}")
    plan = Plan(args.gpus, 1.0, 0.0, 1.0, 1.0)
    ship_s = 10
    out: dict[str, Any] = {"gpus": args.gpus, "seconds": args.standby_seconds, "ship_interval_s": ship_s}
    with replication.primary_and_standby() as pair:
        with psycopg.connect(pair.primary.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE gpufleet")
        url = pair.primary.url("gpufleet")
        migrate.upgrade(url, load_settings(database_url=url))
        now = float(int(time.time()))
        runs = schedule(plan, now)
        with psycopg.connect(url, autocommit=True) as conn:
            register(conn, plan, runs, now)
        tokens = make_tokens(url)
        pair.wait_replayed("gpufleet")
        settings = load_settings(
            database_url=url,
            database={
                "read_url": pair.standby.url("gpufleet"),
                "max_read_lag_s": args.max_read_lag_s,
                "lag_check_s": 0.2,
            },
        )
        running = [r for r in runs if r.end is None]
        paths = [
            (n, p.replace("{run}", quote(running[0].run_id)).replace("{node}", running[0].nodes[0]), role)
            for n, p, role in STANDBY_READS
        ]
        app = create_app(url, settings)
        router = app.state.api.pool.router
        energy = {n: 4e9 + 1e8 * np.arange(GPUS_PER_NODE, dtype=np.float64) for n in plan.nodes}
        rng = np.random.default_rng(3)
        lags: list[float] = []
        lat: dict[str, dict[str, list[float]]] = {n: {"standby": [], "primary": []} for n, _, _ in paths}
        written = 0
        with (
            serve(app) as srv,
            contextlib.ExitStack() as stack,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            clients = {
                role: stack.enter_context(
                    httpx.Client(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {tok}"})
                )
                for role, tok in tokens.items()
            }
            start = int(time.time()) + 1
            say(
                f"standby: {args.gpus} GPUs ingesting at 1 Hz on the primary ({ship_s}-s batches, one commit a "
                f"second) for {args.standby_seconds:g} s while the API reads from the standby"
            )
            t_ingest = 0.0
            for tick in range(start, start + int(args.standby_seconds)):
                time.sleep(max(0.0, tick - time.time()))
                t0 = time.perf_counter()
                written += ingest_second(conn, plan.nodes, tick, ship_s, energy, rng, runs)
                t_ingest += time.perf_counter() - t0
                lag = router.lag.seconds() if router.lag is not None else None
                lags.append(math.nan if lag is None else lag)
                for (
                    name,
                    path,
                    role,
                ) in paths:  # each read once from where the router sends it, once from the primary
                    for where, headers in (("standby", {}), ("primary", {"Cache-Control": "no-cache"})):
                        if name.startswith("/") and where == "primary":
                            continue  # pages have no such header: their primary figure is not taken here
                        t0 = time.perf_counter()
                        r = clients[role].get(path, headers=headers)
                        if r.status_code >= 400:
                            raise SystemExit(f"{name}: HTTP {r.status_code}: {r.text[:200]}")
                        lat[name][where].append((time.perf_counter() - t0) * 1000)
            served = dict(router.reads)
            fell = dict(router.fallbacks)
        finite = np.array([x for x in lags if not math.isnan(x)])
        out["paced"] = {
            "gpu_samples_written": written,
            "ingest_s": round(t_ingest, 1),
            "lag_p50_s": round(float(np.percentile(finite, 50)), 3) if len(finite) else None,
            "lag_p95_s": round(float(np.percentile(finite, 95)), 3) if len(finite) else None,
            "lag_max_s": round(float(finite.max()), 3) if len(finite) else None,
            "lag_unknown": int(len(lags) - len(finite)),
            "reads_routed": served,
            "fallbacks": fell,
            "reads_ms": {
                n: {w: round(float(np.percentile(v, 50)), 1) for w, v in d.items() if v}
                for n, d in lat.items()
            },
            "load_avg": round(os.getloadavg()[0], 2),
        }
        say(
            f"  lag while ingesting: p50 {out['paced']['lag_p50_s']} s, p95 {out['paced']['lag_p95_s']} s, max "
            f"{out['paced']['lag_max_s']} s; reads sent to the standby {served['standby']}, to the primary "
            f"{served['primary']} ({fell or 'no fallback'}); load {out['paced']['load_avg']}"
        )
        for n, d in out["paced"]["reads_ms"].items():
            say(
                f"    {n:28s} p50 {d.get('standby', math.nan):7.1f} ms on the standby"
                + (f", {d['primary']:7.1f} ms on the primary" if "primary" in d else "")
            )
        # The replay ceiling: the primary written as fast as one connection can, the standby's replay timed.
        with psycopg.connect(url, autocommit=True) as conn:
            lsn0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
            t0 = time.perf_counter()
            burst = 0
            tick = int(time.time()) + 10_000
            while time.perf_counter() - t0 < args.standby_burst_s:
                for _ in range(ship_s):
                    burst += ingest_second(conn, plan.nodes, tick, ship_s, energy, rng, runs)
                    tick += 1
            write_s = time.perf_counter() - t0
            lsn1, wal = conn.execute(
                "SELECT pg_current_wal_lsn(), pg_current_wal_lsn() - %s::pg_lsn", (lsn0,)
            ).fetchone()  # type: ignore[misc]
        with psycopg.connect(pair.standby.url("gpufleet"), autocommit=True) as sconn:
            while not sconn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn1,)).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.05)
        replay_s = time.perf_counter() - t0
        out["burst"] = {
            "gpu_samples": burst,
            "write_s": round(write_s, 2),
            "replayed_s": round(replay_s, 2),
            "wal_bytes": int(wal),
            "wal_bytes_per_gpu_sample": round(int(wal) / max(burst, 1), 1),
            "primary_gpu_samples_per_s": round(burst / write_s),
            "standby_replayed_gpu_samples_per_s_at_least": round(burst / replay_s),
            "load_avg": round(os.getloadavg()[0], 2),
        }
        say(
            f"  burst: {burst:,} GPU-samples written in {write_s:.1f} s ({burst / write_s:,.0f}/s, "
            f"{int(wal) / max(burst, 1):.0f} B of WAL each); the standby had replayed them all {replay_s:.1f} s after "
            f"the burst began ({burst / replay_s:,.0f}/s at least); load {out['burst']['load_avg']}"
        )
    return out


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--days", type=float, default=30.0, help="days of runs and incidents")
    ap.add_argument(
        "--minute-days",
        type=float,
        default=None,
        help="days of per-minute history before the raw part (default: --days less the raw part)",
    )
    ap.add_argument("--raw-hours", type=float, default=24.0)
    ap.add_argument("--raw-interval-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5, help="warm repetitions of each read")
    ap.add_argument(
        "--budget-s", type=float, default=20.0, help="warm repetitions stop once a read took this long"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="64 GPUs, 2 days (1 of minute history), 2 raw hours at 30 s, 2 repetitions: a check",
    )
    ap.add_argument("--keep", action="store_true", help="keep the synthesised database and print its URL")
    ap.add_argument("--database", help="time this database (made with --keep) instead of synthesising one")
    ap.add_argument("--only", choices=("api", "web", "panel"), action="append", help="time only these kinds")
    ap.add_argument(
        "--match",
        help="time only the reads whose name matches this regular expression (a panel's: its board uid and "
        "range, e.g. 'gpufleet-fleet 6h')",
    )
    ap.add_argument(
        "--panel-role",
        default=READER_ROLE,
        help="run the panels as this role, set up as `gpufleet db reader` sets up Grafana's (read-only, JIT off; "
        "default: %(default)s); '' runs them on the script's own connection, with the server's JIT setting",
    )
    ap.add_argument("--server", default=None, help="maintenance-database URL (default: the test server)")
    ap.add_argument(
        "--standby",
        action="store_true",
        help="instead: a primary and a hot standby of the script's own (PostgreSQL 15 on loopback), "
        "--gpus ingesting at 1 Hz while the API reads from the standby; the lag, the reads "
        "on both, and the standby's replay of the primary written flat out",
    )
    ap.add_argument("--standby-seconds", type=float, default=60.0, help="--standby: seconds of paced ingest")
    ap.add_argument(
        "--standby-burst-s", type=float, default=20.0, help="--standby: seconds of writing flat out"
    )
    ap.add_argument("--max-read-lag-s", type=float, default=10.0, help="--standby: database.max_read_lag_s")
    args = ap.parse_args()
    if args.quick:
        args.gpus, args.days, args.minute_days, args.raw_hours, args.raw_interval_s = 64, 2.0, 1.0, 2.0, 30.0
        args.repeat = min(args.repeat, 2)
    minute_days = (
        args.minute_days if args.minute_days is not None else max(args.days - args.raw_hours / 24, 0.0)
    )
    if args.gpus < GPUS_PER_NODE or args.gpus % GPUS_PER_NODE:
        ap.error(f"--gpus must be a positive multiple of {GPUS_PER_NODE}, not {args.gpus}")
    if not 0 < args.raw_interval_s <= 60 or args.raw_hours <= 0 or minute_days < 0 or args.days <= 0:
        ap.error("--raw-interval-s must be in (0, 60], --raw-hours and --days positive, --minute-days >= 0")
    plan = Plan(args.gpus, args.days, minute_days, args.raw_hours, args.raw_interval_s)
    started = time.perf_counter()

    if args.standby:
        got = standby_bench(args, say)
        print(
            json.dumps(
                {
                    "name": "read_side_standby",
                    "value": got["paced"]["lag_p95_s"],
                    "unit": "s (lag p95)",
                    "baseline": got["paced"]["reads_ms"],
                    **got,
                    "seconds": round(time.perf_counter() - started, 1),
                    "when": datetime.now(UTC).isoformat(timespec="seconds"),
                }
            )
        )
        return

    settings = load_settings()
    server = args.server or server_url()
    with contextlib.ExitStack() as stack:
        if args.database:
            url = args.database
            migrate.upgrade(url, load_settings(database_url=url))
            fleet = top_up(url, settings, say)
            plan = fleet.plan  # the database's, not the arguments'
        else:
            with psycopg.connect(server, autocommit=True) as conn:
                where = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
            while not Path(where).exists():
                where = str(Path(where).parent)
            free = shutil.disk_usage(where).free
            need = plan.bytes_needed()
            if free < need * 1.5 + (4 << 30):
                sys.exit(
                    f"bench/read_side.py: {free / 1e9:.1f} GB free at {where}, about {need / 1e9:.1f} GB "
                    f"needed (plus room to spare); scale down with --minute-days, --raw-interval-s or --gpus"
                )
            say(
                f"plan: {plan.gpus} GPUs, {plan.days:g} days of runs, {plan.minute_days:g} days of one-minute history, "
                f"{plan.raw_hours:g} h raw at {plan.raw_interval_s:g} s; about {need / 1e9:.1f} GB "
                f"({free / 1e9:.0f} GB free at {where})"
            )
            if args.keep:
                name = f"gpufleet_read_side_{os.getpid()}"
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                url = with_database(server, name)
            else:
                from gpufleet.db.scratch import scratch_database

                url = stack.enter_context(scratch_database(server, "gpufleet_read_side"))
            migrate.upgrade(url, load_settings(database_url=url))
            fleet = synthesise(url, plan, settings, say)
            if args.keep:
                say(f"kept: {url}")
        t0 = time.perf_counter()
        looked, running, hours = settle(url, settings)
        fleet.seconds["leader_points"] = time.perf_counter() - t0
        say(
            f"what the leader keeps: the power-cap points of {looked} ended runs with progress, {running} "
            f"closed hours of running runs' power-cap minutes and {hours} closed hours of the fleet's "
            f"accounting ({fleet.seconds['leader_points']:.0f} s; none computed again where kept)"
        )
        c = fleet.counts
        say(
            f"synthesised: {plan.gpus} GPUs on {len(plan.nodes)} nodes; {c['runs']} runs over {plan.days:g} days "
            f"({sum(1 for r in fleet.runs if r.end is None)} running), {c['incidents']} incidents; "
            f"one-minute history {plan.minute_days:g} days ("
            + (f"{c['history_gpu_minutes']:,} GPU-minutes, " if "history_gpu_minutes" in c else "")
            + f"rolled up and their raw rows removed); raw samples {plan.raw_hours:g} h at {plan.raw_interval_s:g} s "
            f"({c['gpu_samples']:,} GPU rows, {c['host_samples']:,} host rows kept); gpu_stats_1m {c['gpu_stats_1m']:,}, "
            f"gpu_energy_1m {c['gpu_energy_1m']:,}, gpu_energy_1h {c['gpu_energy_1h']:,} rows; database "
            f"{c['database_bytes'] / 1e9:.1f} GB"
        )
        kinds = set(args.only or ("api", "web", "panel"))
        tokens = make_tokens(url)
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT id FROM incidents WHERE state = 'open' ORDER BY id LIMIT 1").fetchone()
        open_id = int(row[0]) if row else 1
        wanted = re.compile(args.match) if args.match else None
        http = [r for r in routes(fleet) if r.kind in kinds and (wanted is None or wanted.search(r.name))]
        for r in http:
            r.path = r.path.replace("{open_incident}", str(open_id))
            if "%(id)s" in r.baseline:
                r.params = {"id": open_id}
        if http:
            say(
                f"API and web view (uvicorn on loopback; cold = first request on a fresh API; then {args.repeat} warm):"
            )
            with served_api(url, settings) as api_url:
                time_http(http, api_url, tokens, args.repeat, args.budget_s, url, say)
        panels: list[Read] = []
        if "panel" in kinds:
            say(
                f"Grafana panels (expanded as Grafana would; cold = a new connection's first run; then "
                f"{args.repeat} warm):"
            )
            with psycopg.connect(url, autocommit=True) as conn:
                items = [i for i in panel_reads(conn, fleet) if wanted is None or wanted.search(i[0].name)]
            panel_url = url
            if args.panel_role:
                ensure_reader(url, args.panel_role)
                panel_url = make_conninfo(url, user=args.panel_role)
            with psycopg.connect(panel_url, autocommit=True) as conn:
                jit = conn.execute("SHOW jit").fetchone()
            who = args.panel_role or "the script's own connection"
            say(f"  as {who}: jit = {jit[0] if jit else '?'}")
            panels = time_panels(items, panel_url, fleet, args.repeat, args.budget_s, say)
    every = http + panels
    over = [r for r in every if r.over()]
    say(
        f"over target ({ROUTE_TARGET_MS:g} ms p95 for routes and pages, {PANEL_TARGET_MS:g} ms for panels, cold "
        f"or warm): {len(over)} of {len(every)}"
    )
    for r in sorted(over, key=lambda r: -max(r.p(95) if r.warm_ms else 0, r.cold_ms)):
        say(line(r))
    # a read that timed out or failed has no warm repetitions: its cold time stands for it (it was left out,
    # and a run whose every fleet-wide read hit the statement limit reported its fastest routes as the worst)
    worst_route = max((r.p(95) if r.warm_ms else r.cold_ms for r in http), default=math.nan)
    worst_panel = max((max(r.p(95) if r.warm_ms else 0.0, r.cold_ms) for r in panels), default=math.nan)
    print(
        json.dumps(
            {
                "name": "read_side",
                "value": None if math.isnan(worst_route) else round(worst_route, 1),
                "unit": "ms (worst route or page p95)",
                "worst_panel_ms": None if math.isnan(worst_panel) else round(worst_panel, 1),
                "over_target": len(over),
                "reads": len(every),
                "plan": plan.__dict__,
                "counts": fleet.counts,
                "synthesis_s": {k: round(v, 1) for k, v in fleet.seconds.items()},
                "load_avg": os.getloadavg()[0],
                "seconds": round(time.perf_counter() - started, 1),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "quick": args.quick,
                "reads_timed": [summary(r) for r in every],
            }
        )
    )


if __name__ == "__main__":
    main()
