"""Detector sweep over a large fleet: 10,000 GPUs, last 10 minutes at 1 Hz.

    python bench/sweep.py [--gpus 10000] [--minutes 10]

Fills a scratch database with ``--gpus`` GPUs (8 per node, in synchronous
runs of 64 GPUs, a few with injected faults) for ``--minutes`` at 1 Hz, plus
host samples, written with binary COPY.

Every sweep runs on a thread of its own, as the collector's leader runs its
sweeps (``gpufleet-leader``): glibc serves a thread from an arena of its own,
and sweeps on the main thread's heap ran slower every other sweep (see
"Detection" in docs/capacity.md); ``--main-thread`` measures them there.
The process settles Python's garbage collector before the fill, as the
collector does once built (:func:`gpufleet.collector.cyclegc.settle`);
``--gc-defaults`` leaves it as Python starts it.

Then, in the same run:

* ``select_s``: a plain ``SELECT`` of the window's detector columns through
  psycopg (the baseline);
* ``first_sweep_s``: the first sweep of the first leader, with no persisted
  window (load the whole window from the sample tables, run every detector,
  store incidents; then persist the window's segments, ``first_save_s``);
* ``sweep_s``: the median of ``--steady`` steady-state sweeps, each after 5
  more seconds of data arrived as ingest batches (fetch what is new, run
  every detector, store incidents, persist the segment that aged), with
  ``sweep_first_s`` (the first after the load, whose memory was handed back)
  and ``sweep_max_s``; ``sweep_stages_s``, the median sweep's seconds by
  stage and detector (the collector's ``gpufleet_sweep_stage_seconds``);
  ``sweep_trim_each_s``, the median of as many more with freed memory
  handed back to the OS after every sweep (the former policy, measured in
  the same run); ``sweep_gc_unpaused_s``, as many more with Python's cyclic
  garbage collector left on during each sweep (the former behaviour),
  ``sweep_no_incident_marks_s``, as many more with the incidents'
  pricing-mark triggers disabled (what they add to a sweep, with
  ``store_s`` / ``store_no_incident_marks_s``, the median seconds of the
  sweep's storing of incidents with and without them), with
  ``gc_s`` and ``gc_unpaused_s``, the seconds per sweep spent collecting
  inside the sweep, and ``gc_all_s`` / ``gc_unpaused_all_s``, the same with
  the collections between sweeps; ``refresh_read_s``, the refresh's read
  of the GPU samples as the window cache sends it (never prepared), and
  ``refresh_read_prepared_s``, the same read prepared by the driver's
  default after five (the baseline), and ``refresh_read_unsummarized_s``,
  the same read with the time index's ranges written since the fill left
  unsummarized, as they were before the window cache summarized them (the
  baseline; :mod:`gpufleet.collector.brin_tail`); ``rss_steady_mb`` and
  ``rss_trim_each_mb``, the process's
  resident memory after each of the two blocks;
* ``cold_sweep_s``: the first sweep of a new leader taking over at that
  moment (restore the persisted window, read the raw tail, run every
  detector, store incidents); its findings are checked equal to the warm
  leader's at the same instant; ``cold_raw_s`` is the same takeover without
  a persisted window (the whole window from the sample tables), measured
  in the same run as the baseline;
* ``cold_fresh_s``: the same takeover in a process of its own, as a
  replica that becomes the owner runs it (its code loaded, the window never
  held: every restored buffer is fresh memory); its findings are checked
  equal too.

The last line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import subprocess
import sys
import time
import unittest.mock
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg
from psycopg import sql

from gpufleet.collector import cyclegc
from gpufleet.collector.batch_store import GPU_SPECS, HOST_SPECS, REGISTER_SQL, register_params
from gpufleet.collector.copy_binary import HEADER, TRAILER, concat_parts, encode_rows
from gpufleet.collector.detectors.registry import run_detectors
from gpufleet.collector.heap import release_free_memory
from gpufleet.collector.incident_store import clean_json
from gpufleet.collector.leader import REPLICA_APP, Leader
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.shards import SHARD_LOCK_BASE
from gpufleet.collector.sweep import Sweeper
from gpufleet.collector.window_cache import (
    GPU_COLUMNS,
    execute_read,
    held_columns,
    held_select,
    load_facts,
    load_runs,
    raw_cursor,
)
from gpufleet.config import Settings, load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.wire import Column
from testsupport.pg import server_url

#: The thread every sweep runs on, as the collector's leader thread runs them (None: ``--main-thread``).
_LEADER: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="gpufleet-leader")


def on_leader(
    sweep: Callable[[psycopg.Connection, float], None], conn: psycopg.Connection, now: float
) -> None:
    """Run one sweep on the leader's thread and wait for it."""
    if _LEADER is None:
        sweep(conn, now)
    else:
        _LEADER.submit(sweep, conn, now).result()


def gpu_block(node_idx: int, t: np.ndarray, rng: np.random.Generator, fault: str | None) -> dict[str, Column]:
    """8 GPUs x len(t) samples of a healthy (or faulty) synchronous training job."""
    n = len(t) * 8
    tt = np.repeat(t, 8)
    gpu = np.tile(np.arange(8), len(t))
    busy = np.clip(0.9 + 0.03 * rng.standard_normal(n), 0, 1)
    clock = np.full(n, 1980.0)
    power = 120 + 560 * busy
    limit = np.full(n, 700.0)
    throttle = np.zeros(n)
    if fault == "straggler":
        sel = gpu == 3
        limit[sel], power[sel], clock[sel], throttle[sel] = 350.0, 345.0, 1300.0, 4
        busy[~sel] *= 0.6
    elif fault == "starvation":
        phase = (tt % 30) < 12
        busy = np.where(phase, 0.05, busy)
        power = 120 + 560 * busy
    cols = {
        "time": tt,
        "gpu": gpu.astype(np.int64),
        "util_pct": np.minimum(100, busy * 105),
        "sm_active": busy,
        "tensor_active": busy * 0.7,
        "dram_active": busy * 0.4,
        "power_w": power,
        "power_limit_w": limit,
        "sm_clock_mhz": clock.astype(np.int64),
        "sm_clock_max_mhz": np.full(n, 1980, dtype=np.int64),
        "temp_c": (55 + 20 * busy).astype(np.int64),
        "throttle_reasons": throttle.astype(np.int64),
        "pcie_gen": np.full(n, 5, dtype=np.int64),
        "pcie_gen_max": np.full(n, 5, dtype=np.int64),
        "pcie_width": np.full(n, 16, dtype=np.int64),
        "pcie_width_max": np.full(n, 16, dtype=np.int64),
        "energy_mj": (1e9 + np.cumsum(power) * 1000).astype(np.int64),
        "xid": np.zeros(n, dtype=np.int64),
    }
    return {k: Column(v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in cols.items()}


def host_block(t: np.ndarray, rng: np.random.Generator) -> dict[str, Column]:
    m = len(t)
    return {
        "time": Column(t.astype(np.float64)),
        "cpu_user_pct": Column(20 + 5 * rng.random(m)),
        "cpu_system_pct": Column(3 + rng.random(m)),
        "cpu_iowait_pct": Column(rng.random(m)),
        "cpu_idle_pct": Column(70 + 5 * rng.random(m)),
        "cpu_count": Column(np.full(m, 192, dtype=np.int64)),
        "disk_write_bytes_s": Column(1e7 * rng.random(m)),
        "disk_util_pct": Column(10 * rng.random(m)),
        "net_tx_bytes_s": Column(1e8 * rng.random(m)),
        "host_power_w": Column(900 + 50 * rng.random(m)),
    }


def write(
    conn: psycopg.Connection,
    nodes: list[str],
    t: np.ndarray,
    faults: dict[int, str],
    seed: int,
    batches: bool,
) -> None:
    rng = np.random.default_rng(seed)
    gparts, hparts = [], []
    for i, node in enumerate(nodes):
        g, h = gpu_block(i, t, rng, faults.get(i)), host_block(t, rng)
        gparts.append((node, g, len(t) * 8))
        hparts.append((node, h, len(t)))
    with conn.transaction():
        for table, specs, parts in (("gpu_samples", GPU_SPECS, gparts), ("host_samples", HOST_SPECS, hparts)):
            present = [sp for sp in specs if sp.name in ("time", "node", "gpu") or sp.name in parts[0][1]]
            names = ", ".join(sp.name for sp in present)
            for k in range(0, len(parts), 50):
                merged, n = concat_parts(present, parts[k : k + 50])
                with conn.cursor().copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.write(HEADER + encode_rows(present, merged, n) + TRAILER)
        if batches:
            rows = [
                (f"bench:{node}:{int(t[0])}", node, len(t) * 8, len(t), float(t[0]), float(t[-1]))
                for node in nodes
            ]
            conn.execute(REGISTER_SQL, register_params(rows))


class GcClock:
    """Seconds Python's cyclic collector spends while ``on`` (set around each sweep), and in all."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self.total = 0.0
        self._t0 = 0.0

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        self.total += took
        if self.on:
            self.seconds += took

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)


@contextlib.contextmanager
def incident_marks_disabled(conn: psycopg.Connection) -> Iterator[None]:
    """The incidents' pricing-mark triggers off for the block (the cost they add, measured beside)."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'incidents'::regclass "
            "AND tgname LIKE 'gpufleet_pricing_mark_incidents%' ORDER BY tgname"
        )
    ]
    if not names:
        raise SystemExit("bench/sweep.py: the incidents' pricing-mark triggers are missing (migration 0026)")
    for n in names:
        conn.execute(sql.SQL("ALTER TABLE incidents DISABLE TRIGGER {}").format(sql.Identifier(n)))
    try:
        yield
    finally:
        for n in names:
            conn.execute(sql.SQL("ALTER TABLE incidents ENABLE TRIGGER {}").format(sql.Identifier(n)))


def read_plans(
    url: str, sweeper: Sweeper, nodes: list[str], end: float, since_block: int
) -> dict[str, float]:
    """A steady refresh's read of the GPU samples (the last 5 s, the columns the window stores), sent
    eight times on a connection of its own: ``unprepared``, as the window cache sends it; ``prepared``,
    as the driver sends a statement by default, prepared from the sixth time on (PostgreSQL may then
    plan it once for any parameters); ``unsummarized``, unprepared but with the time index's ranges
    from ``since_block`` on left unsummarized, as they were before the window cache summarized them
    (every range written since the fill's VACUUM: what a read scanned until autovacuum came by).
    The median of the last three of each, seconds."""
    held = held_columns(sweeper.cache.gpus)
    assert held is not None
    q = held_select(
        "gpu_samples",
        GPU_COLUMNS,
        True,
        "s.time >= %(lo)s AND s.time <= %(hi)s AND s.node = ANY(%(nodes)s)",
        held,
    )
    p = {"lo": datetime.fromtimestamp(end - 5, UTC), "hi": datetime.fromtimestamp(end, UTC), "nodes": nodes}
    out: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as c:
        for how in ("unprepared", "prepared", "unsummarized"):
            if how == "unsummarized":
                c.execute(
                    "SELECT brin_desummarize_range('gpu_samples_time_brin', b) FROM generate_series(%s::bigint, "
                    "pg_relation_size('gpu_samples') / current_setting('block_size')::bigint - 1, 32) b",
                    (since_block,),
                )
            took = []
            for _ in range(8):
                with raw_cursor(c) as cur:
                    t0 = time.perf_counter()
                    if how == "prepared":
                        cur.execute(q, p)  # the driver's default
                    else:
                        execute_read(cur, q, p)
                    cur.fetchall()
                    took.append(time.perf_counter() - t0)
            out[how] = float(np.median(took[-3:]))
        c.execute("SELECT brin_summarize_new_values('gpu_samples_time_brin')")
    return out


def findings(sweeper: Sweeper, conn: psycopg.Connection, now: float) -> list[tuple[object, ...]]:
    """What every detector finds on the sweeper's window at ``now``, comparable across sweepers."""
    w = sweeper.cache.window(now, load_runs(conn, now - sweeper.cache.window_s, now), load_facts(conn))
    res = run_detectors(w, sweeper.config)
    return sorted(
        (f.scope_key, f.cause, f.severity, f.start, f.last_active, repr(clean_json(f.evidence)))
        for f in res.findings
    )


_FRESH = """
import json, sys, time
sys.path.insert(0, sys.argv[3])  # the checkout this script runs from, before any other on the path
import psycopg
from bench.sweep import findings, on_leader
from gpufleet.collector import cyclegc
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import load_settings
settings = load_settings()
cyclegc.settle(int(sys.argv[4]))  # as the collector settles before it serves
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    taker = Sweeper(settings)
    t0 = time.perf_counter()
    on_leader(taker, conn, float(sys.argv[2]))
    cold_s = time.perf_counter() - t0
    print(json.dumps({"cold_s": cold_s, "last": taker.last,
                      "findings": findings(taker, conn, float(sys.argv[2]))}, default=str))
"""


def fresh_takeover(url: str, now: float, gc_young_threshold: int) -> dict[str, Any]:
    """The takeover in a process of its own, as a replica that becomes the owner runs it: its code is
    loaded, but it never held the window, so every buffer it restores is fresh memory."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _FRESH,
            url,
            repr(now),
            str(Path(__file__).resolve().parents[1]),
            str(gc_young_threshold),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def fill(
    conn: psycopg.Connection, nodes: list[str], t: np.ndarray, faults: dict[int, str], now: float
) -> int:
    """The window's samples, the nodes, and synchronous runs of 64 GPUs (8 nodes each)."""
    start = time.perf_counter()
    for k in range(0, len(t), 60):
        write(conn, nodes, t[k : k + 60], faults, k, batches=False)
    conn.execute("INSERT INTO nodes (node, gpu_count) SELECT unnest(%s::text[]), 8", (nodes,))
    for r in range(0, len(nodes), 8):
        conn.execute(
            "INSERT INTO runs (run_id, start) VALUES (%s, to_timestamp(%s))", (f"run-{r}", now - 7200)
        )
        conn.execute(
            "INSERT INTO run_allocations SELECT %s, n, g FROM unnest(%s::text[]) n, generate_series(0, 7) g",
            (f"run-{r}", nodes[r : r + 8]),
        )
    conn.execute("VACUUM ANALYZE gpu_samples")
    conn.execute("VACUUM ANALYZE host_samples")
    rows = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
    print(
        f"loaded {rows:,} GPU samples of {len(nodes) * 8} GPUs in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return int(rows)


def replicas_bench(
    conn: psycopg.Connection,
    url: str,
    settings: Settings,
    nodes: list[str],
    faults: dict[int, str],
    now: float,
    args: argparse.Namespace,
    rows: int,
) -> None:
    """Sharded sweeps: each replica's steady sweep of its shards, and a dead replica's shards moving.

    Replica r holds shards r, r + N, ... (what balancing converges to).  On
    this two-core machine the replicas' sweeps run one after another in this
    process; each replica's figure is the time its own shards take, which is
    what must fit in the sweep interval on the replica's own cores.  The
    baseline, in the same run, is one unsharded sweep of the whole fleet."""
    n_rep, shards = args.replicas, args.shards or 2 * args.replicas
    interval = settings.detect.sweep_interval_s
    owners = {r: [k for k in range(shards) if k % n_rep == r] for r in range(n_rep)}
    sweepers = {k: Sweeper(settings, shard=k, shards=shards) for k in range(shards)}
    t0 = time.perf_counter()
    for sw in sweepers.values():
        on_leader(sw, conn, now)
    print(f"first sweep of every shard (no persisted window): {time.perf_counter() - t0:.1f} s", flush=True)
    one = Sweeper(settings, snapshots=False)
    t0 = time.perf_counter()
    on_leader(one, conn, now)
    print(f"first unsharded sweep: {time.perf_counter() - t0:.1f} s", flush=True)

    write(conn, nodes, np.arange(now, now + 5, 1.0), faults, 99, batches=True)
    t0 = time.perf_counter()
    on_leader(one, conn, now + 5)
    one_s = time.perf_counter() - t0
    print(f"unsharded steady sweep (baseline): {one_s:.2f} s; {one.last}", flush=True)
    per_shard: dict[int, float] = {}
    for k, sw in sweepers.items():
        t0 = time.perf_counter()
        on_leader(sw, conn, now + 5)
        per_shard[k] = time.perf_counter() - t0
    per_rep = {r: sum(per_shard[k] for k in ks) for r, ks in owners.items()}
    for r, ks in owners.items():
        gpus = sum(sweepers[k].last["gpus"] for k in ks)
        print(
            f"replica {r}: shards {ks}, {gpus} GPUs read, steady sweep {per_rep[r]:.2f} s "
            f"({'within' if per_rep[r] < interval else 'NOT within'} the {interval:g} s interval)",
            flush=True,
        )
    union = sorted(f.scope_key for sw in sweepers.values() for f in sw.findings)
    same = union == sorted(f.scope_key for f in one.findings)
    print(f"sharded findings equal to the unsharded sweep's: {same} ({len(union)} findings)", flush=True)
    del one

    # Replica 0 dies: its lock session ends; replica 1 (a real Leader's balancing) takes the shards on its
    # next tick and sweeps each once, restoring its window from the shard's snapshot.
    dead = psycopg.connect(url, autocommit=True, application_name=REPLICA_APP)
    for k in owners[0]:
        dead.execute("SELECT pg_advisory_lock(%s)", (SHARD_LOCK_BASE + k,))
    others = []
    for r in range(2, n_rep):
        c = psycopg.connect(url, autocommit=True, application_name=REPLICA_APP)
        for k in owners[r]:
            c.execute("SELECT pg_advisory_lock(%s)", (SHARD_LOCK_BASE + k,))
        others.append(c)
    tick = 1.0
    survivor = Leader(
        url,
        settings,
        CollectorMetrics(),
        shards=shards,
        balance_interval_s=tick,
        shard_sweep=lambda k: Sweeper(settings, shard=k, shards=shards),
    )
    with psycopg.connect(url, autocommit=True, application_name=REPLICA_APP) as lock_conn:
        for k in owners[1]:
            lock_conn.execute("SELECT pg_advisory_lock(%s)", (SHARD_LOCK_BASE + k,))
            survivor.held[k] = sweepers[k]
        for k in owners[0]:
            sweepers.pop(k)  # the dead replica's memory is gone
        # the survivor's balancing ticks run on their own clock: the first one after the death comes
        # at a random point of its tick
        first_tick = float(np.random.default_rng(int(now)).uniform(0, tick))
        killed = time.perf_counter()
        conn.execute("SELECT pg_terminate_backend(%s)", (dead.info.backend_pid,))
        time.sleep(first_tick)
        while not set(survivor.held) - set(owners[1]):
            survivor._balance(lock_conn)
            if not set(survivor.held) - set(owners[1]):
                time.sleep(tick)
        handover_s = time.perf_counter() - killed
        moved = sorted(set(survivor.held) - set(owners[1]))
        failover: dict[int, float] = {}
        for k in moved:
            on_leader(survivor.held[k], conn, now + 5)
            failover[k] = time.perf_counter() - killed
            moved_sweep = survivor.held[k]
            assert isinstance(moved_sweep, Sweeper)
            print(
                f"shard {k} moved: swept {failover[k]:.2f} s after its owner died; {moved_sweep.last}",
                flush=True,
            )
    for c in others:
        c.close()
    dead.close()
    worst = max(failover.values())
    print(
        f"failover: lock handover {handover_s:.2f} s (balancing tick {tick:g} s), "
        f"last moved shard swept {worst:.2f} s after the owner died"
    )
    print(
        json.dumps(
            {
                "name": "sweep_sharded",
                "value": round(max(per_rep.values()), 3),
                "unit": "s",
                "gpus": len(nodes) * 8,
                "replicas": n_rep,
                "shards": shards,
                "interval_s": interval,
                "replica_sweep_s": {str(r): round(v, 3) for r, v in per_rep.items()},
                "unsharded_sweep_s": round(one_s, 3),
                "findings_equal": same,
                "handover_s": round(handover_s, 3),
                "failover_s": round(worst, 3),
                "moved_shards": moved,
                "samples": rows,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--steady", type=int, default=6, help="steady sweeps measured (5 s of new data each)")
    ap.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="sweep sharded over this many replicas (each replica's sweep, a shard's failover)",
    )
    ap.add_argument("--shards", type=int, default=0, help="sweep shards (default: 2 per replica)")
    ap.add_argument(
        "--main-thread",
        action="store_true",
        help="sweep on the main thread, as this bench did before (the baseline of the leader's thread)",
    )
    ap.add_argument(
        "--gc-defaults",
        action="store_true",
        help="leave Python's garbage collector as it starts, not settled as the collector settles it "
        "(the baseline of gpufleet.collector.cyclegc.settle)",
    )
    args = ap.parse_args()
    if args.main_thread:
        global _LEADER
        _LEADER = None
    settings = load_settings()
    # The collector settles its garbage collector once built, before any data arrives.
    gc_threshold = 0 if args.gc_defaults else settings.gc_young_threshold
    cyclegc.settle(gc_threshold)
    nodes = [f"node-{i:05d}" for i in range(args.gpus // 8)]
    now = float(int(time.time()))
    window = args.minutes * 60
    t = np.arange(now - window, now, 1.0)
    # Faults per 64-GPU run (8 nodes): every 10th run input-starved on all
    # its nodes, every 10th (offset 5) with one power-capped straggler.
    faults: dict[int, str] = {}
    for r in range(0, len(nodes) // 8):
        if r % 10 == 0:
            faults.update({8 * r + k: "starvation" for k in range(8)})
        elif r % 10 == 5:
            faults[8 * r] = "straggler"
    with scratch_database(server_url(), "gpufleet_bench") as url:
        migrate.upgrade(url, settings)
        with psycopg.connect(url, autocommit=True) as conn:
            rows = fill(conn, nodes, t, faults, now)
            # Where the table ends after the fill's VACUUM: every range after it is written by the sweeps.
            since_block = int(
                conn.execute(
                    "SELECT pg_relation_size('gpu_samples') / "  # type: ignore[index]
                    "current_setting('block_size')::bigint"
                ).fetchone()[0]
            )
            if args.replicas:
                replicas_bench(conn, url, settings, nodes, faults, now, args, rows)
                return

            cols = ", ".join(GPU_COLUMNS)
            t0 = time.perf_counter()
            with conn.cursor() as cur:
                cur.execute(
                    f"SELECT time, node, gpu, {cols} FROM gpu_samples WHERE time > to_timestamp(%s) "
                    "AND time <= to_timestamp(%s)",
                    (now - window, now),
                )
                fetched = len(cur.fetchall())
            select_s = time.perf_counter() - t0
            print(f"plain SELECT of the window: {select_s:.2f} s ({fetched:,} rows)", flush=True)

            sweeper = Sweeper(settings)
            t0 = time.perf_counter()
            on_leader(sweeper, conn, now)
            first_s = time.perf_counter() - t0
            first_save_s = sweeper.last["snapshot_s"]
            print(
                f"first sweep (first leader, no persisted window): {first_s:.2f} s, of which persisting the "
                f"window {first_save_s:.2f} s; {sweeper.last}",
                flush=True,
            )

            # Steady sweeps, 5 s of new data before each, as the leader runs them (the sweeper
            # hands freed memory back after a load only); then as many more, each followed by
            # malloc_trim as the leader used to do after every sweep (the baseline).
            # The resident memory after each block is what the collector holds between sweeps.
            # A third block runs them with Python's cyclic collector left on during the sweep
            # (the baseline of the pause, gpufleet.collector.cyclegc).
            end = now
            # A fourth runs them with the incidents' pricing-mark triggers disabled (migration 0026:
            # each incident row a sweep inserts, deletes or changes moves its run's mark), their cost
            # on the sweep beside the steady block.
            runs: dict[str, list[float]] = {"steady": [], "trim_each": [], "gc_unpaused": [], "no_marks": []}
            rss_mb: dict[str, float] = {}
            gc_s: dict[str, float] = {}
            per_stage: list[dict[str, float]] = []
            store_s: dict[str, list[float]] = {p: [] for p in runs}
            for policy in runs:
                clock = GcClock()
                with clock, contextlib.ExitStack() as stack:
                    if policy == "gc_unpaused":
                        stack.enter_context(
                            unittest.mock.patch.object(cyclegc, "paused", contextlib.nullcontext)
                        )
                    if policy == "no_marks":
                        stack.enter_context(incident_marks_disabled(conn))
                    for _ in range(args.steady):
                        write(
                            conn,
                            nodes,
                            np.arange(end, end + 5, 1.0),
                            faults,
                            99 + int(end - now),
                            batches=True,
                        )
                        end += 5
                        t0 = time.perf_counter()
                        clock.on = True
                        on_leader(sweeper, conn, end)
                        clock.on = False
                        runs[policy].append(time.perf_counter() - t0)
                        store_s[policy].append(sweeper.stages.get("store", math.nan))
                        if policy == "trim_each":
                            release_free_memory()
                        elif policy == "steady":
                            per_stage.append(sweeper.stages)
                gc_s[policy] = clock.seconds / args.steady
                gc_s[policy + "_all"] = clock.total / args.steady
                rss_mb[policy] = psutil.Process().memory_info().rss / 1e6
            plans = read_plans(url, sweeper, nodes, end, since_block)
            print(
                f"  the refresh's read of the GPU samples: {plans['unprepared']:.3f} s unprepared (as sent), "
                f"{plans['prepared']:.3f} s prepared by the driver's default (the baseline), "
                f"{plans['unsummarized']:.3f} s with the time index's new ranges unsummarized (the baseline)",
                flush=True,
            )
            t0 = time.perf_counter()
            held = sweeper.cache.samples()
            count_ms = (time.perf_counter() - t0) * 1e3
            warm_s = float(np.median(runs["steady"]))
            trim_s = float(np.median(runs["trim_each"]))
            mid = int(np.argsort(runs["steady"])[len(runs["steady"]) // 2])
            stages = {k: round(v, 3) for k, v in per_stage[mid].items()}
            print(
                f"steady-state sweeps: median {warm_s:.2f} s, first after the load {runs['steady'][0]:.2f} s, "
                f"max {max(runs['steady']):.2f} s; {sweeper.last}",
                flush=True,
            )
            print(f"  by stage, the median sweep (s): {stages}", flush=True)
            print(
                f"  with freed memory handed back after every sweep (baseline): median {trim_s:.2f} s, "
                f"max {max(runs['trim_each']):.2f} s",
                flush=True,
            )
            gc_off_s = float(np.median(runs["gc_unpaused"]))
            print(
                f"  with cyclic garbage collection left on during the sweep (baseline): median {gc_off_s:.2f} s, "
                f"max {max(runs['gc_unpaused']):.2f} s; seconds collecting per sweep {gc_s['gc_unpaused']:.3f}, "
                f"against {gc_s['steady']:.3f} with the pause; in all, sweeps and ingest between them, "
                f"{gc_s['gc_unpaused_all']:.3f} against {gc_s['steady_all']:.3f}",
                flush=True,
            )
            no_marks_s = float(np.median(runs["no_marks"]))
            store_med = {p: float(np.median(v)) for p, v in store_s.items()}
            print(
                f"  with the incidents' pricing-mark triggers disabled (baseline): median {no_marks_s:.2f} s; "
                f"storing incidents {store_med['no_marks'] * 1e3:.1f} ms a sweep against "
                f"{store_med['steady'] * 1e3:.1f} ms with them",
                flush=True,
            )
            print(
                f"  resident memory between sweeps: {rss_mb['steady']:.0f} MB (scratch kept), "
                f"{rss_mb['trim_each']:.0f} MB (handed back after every sweep)",
                flush=True,
            )
            print(
                f"  counting the {held:,} samples held (whether a sweep was a load): {count_ms:.1f} ms",
                flush=True,
            )
            incidents = conn.execute(
                "SELECT kind, count(*) FROM incidents GROUP BY kind ORDER BY kind"
            ).fetchall()
            print(f"incidents: {incidents}")
            snap_mb = conn.execute("SELECT sum(octet_length(blob)) FROM sweep_snapshots").fetchone()[0] / 1e6  # type: ignore[index]

            expected = findings(sweeper, conn, end)
            raw = Sweeper(
                settings, snapshots=False
            )  # the baseline: a takeover reading the window's raw samples
            t0 = time.perf_counter()
            on_leader(raw, conn, end)
            cold_raw_s = time.perf_counter() - t0
            print(
                f"takeover without a persisted window (baseline): {cold_raw_s:.2f} s; {raw.last}", flush=True
            )
            same_raw = findings(raw, conn, end) == expected
            del raw
            taker = Sweeper(settings)
            t0 = time.perf_counter()
            on_leader(taker, conn, end)
            cold_s = time.perf_counter() - t0
            print(
                f"cold sweep (new leader restores the persisted window): {cold_s:.2f} s; {taker.last}",
                flush=True,
            )
            same = findings(taker, conn, end) == expected
            del taker
            fresh = fresh_takeover(url, end, gc_threshold)
            print(
                f"cold sweep in a process that never held the window: {fresh['cold_s']:.2f} s; {fresh['last']}",
                flush=True,
            )
            same_fresh = fresh["findings"] == [list(f) for f in expected]
            print(
                f"findings equal to the warm leader's: restored {same}, raw {same_raw} ({len(expected)} findings); "
                f"persisted window {snap_mb:.0f} MB",
                flush=True,
            )
            if not (same and same_raw and same_fresh):
                raise SystemExit("a takeover found something else than the warm leader")
    print(
        f"sweep / plain SELECT: {warm_s / select_s:.2f} (steady state), {cold_s / select_s:.2f} (cold); "
        f"cold takeover / without a persisted window: {cold_s / cold_raw_s:.3f}"
    )
    print(
        json.dumps(
            {
                "name": "sweep",
                "value": round(warm_s, 3),
                "unit": "s",
                "gpus": len(nodes) * 8,
                "sweep_s": round(warm_s, 3),
                "sweep_first_s": round(runs["steady"][0], 3),
                "sweep_max_s": round(max(runs["steady"]), 3),
                "sweep_trim_each_s": round(trim_s, 3),
                "sweep_gc_unpaused_s": round(gc_off_s, 3),
                "sweep_no_incident_marks_s": round(no_marks_s, 3),
                "store_s": round(store_med["steady"], 4),
                "store_no_incident_marks_s": round(store_med["no_marks"], 4),
                "gc_s": round(gc_s["steady"], 3),
                "gc_unpaused_s": round(gc_s["gc_unpaused"], 3),
                "gc_all_s": round(gc_s["steady_all"], 3),
                "gc_unpaused_all_s": round(gc_s["gc_unpaused_all"], 3),
                "rss_steady_mb": round(rss_mb["steady"]),
                "rss_trim_each_mb": round(rss_mb["trim_each"]),
                "count_samples_ms": round(count_ms, 2),
                "refresh_read_s": round(plans["unprepared"], 3),
                "refresh_read_prepared_s": round(plans["prepared"], 3),
                "refresh_read_unsummarized_s": round(plans["unsummarized"], 3),
                "sweep_stages_s": stages,
                "cold_sweep_s": round(cold_s, 3),
                "cold_fresh_s": round(fresh["cold_s"], 3),
                "cold_raw_s": round(cold_raw_s, 3),
                "first_sweep_s": round(first_s, 3),
                "first_save_s": round(first_save_s, 3),
                "snapshot_mb": round(snap_mb, 1),
                "select_s": round(select_s, 3),
                "ratio_to_select": round(warm_s / select_s, 3),
                "samples": rows,
                "gc_young_threshold": gc_threshold,
            }
        )
    )


if __name__ == "__main__":
    main()
