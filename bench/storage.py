"""Where the stored bytes of a GPU-sample go, column by column.

    python bench/storage.py [--minutes 60]

Loads the simulator's mixed fleet (80 GPUs at 1 Hz, the hour bench/ingest.py
compresses) into a scratch database and prints, for every ``gpu_samples``
column: how often it is NULL, how often a GPU's value differs from its
previous sample (a column that seldom changes costs almost nothing once
TimescaleDB compresses it; one that changes every second is what the bytes
are spent on) and how many distinct values it takes.  The baseline beside it
is the table's stored bytes per GPU-sample on this server.

On plain PostgreSQL (``GPUFLEET_TEST_DATABASE_URL`` or the default server)
the stored figure is heap plus indexes.  With ``GPUFLEET_TEST_TIMESCALE_URL``
set, the hour is also loaded into TimescaleDB, compressed, and each column's
compressed bytes per GPU-sample are read from the compressed chunks
(TimescaleDB 2.x catalog), beside the total.  The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from testsupport.pg import server_url, timescale_server_url


def load_hour(url: str, minutes: float, timescale: bool) -> int:
    from gpufleet.sim import Fleet
    from testsupport.simfeed import SimFeed

    with psycopg.connect(url, autocommit=True) as conn:
        if timescale:
            conn.execute("SELECT remove_compression_policy('gpu_samples', if_exists => true)")
        day = float(int(time.time() // 86400 - 3) * 86400)
        fleet = Fleet.from_scenario("mixed_fleet", seed=1, start_time=day + 3600)
        feed = SimFeed(conn, fleet, ship_every_s=60)
        feed.run_until(fleet.t0 + minutes * 60)
        feed.ship()
        feed.close()
        return int(conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0])  # type: ignore[index]


def column_stats(url: str) -> tuple[dict[str, dict[str, float]], int]:
    with psycopg.connect(url) as conn:
        cols = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'gpu_samples'::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum"
            ).fetchall()
        ]
        cur = conn.execute(
            sql.SQL("SELECT {} FROM gpu_samples ORDER BY node, gpu, time").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in cols)
            )
        )
        rows = cur.fetchall()
    n = len(rows)
    key = [(r[cols.index("node")], r[cols.index("gpu")]) for r in rows]
    same_gpu = np.array([key[i] == key[i - 1] for i in range(1, n)], dtype=bool)
    out: dict[str, dict[str, float]] = {}
    for j, c in enumerate(cols):
        vals = [r[j] for r in rows]
        nulls = sum(v is None for v in vals)
        changed = sum(1 for i in range(1, n) if same_gpu[i - 1] and vals[i] != vals[i - 1])
        out[c] = {
            "null_frac": nulls / max(n, 1),
            "change_frac": changed / max(int(same_gpu.sum()), 1),
            "distinct": len(set(vals)),
        }
    return out, n


def plain_bytes(url: str, n: int) -> float:
    with psycopg.connect(url) as conn:
        size = conn.execute("SELECT pg_total_relation_size('gpu_samples')").fetchone()[0]  # type: ignore[index]
    return float(size) / max(n, 1)


def timescale_columns(url: str, n: int, cols: list[str]) -> tuple[float, dict[str, float]]:
    """Compress every chunk, then sum each column's stored size over the compressed chunks."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT compress_chunk(c, if_not_compressed => true) FROM show_chunks('gpu_samples') c")
        total = conn.execute(
            "SELECT sum(total_bytes) FROM hypertable_detailed_size('gpu_samples')"
        ).fetchone()[0]  # type: ignore[index]
        chunks = conn.execute(
            "SELECT format('%I.%I', cc.schema_name, cc.table_name) FROM _timescaledb_catalog.chunk c "
            "JOIN _timescaledb_catalog.chunk cc ON cc.id = c.compressed_chunk_id "
            "JOIN _timescaledb_catalog.hypertable h ON h.id = c.hypertable_id "
            "WHERE h.table_name = 'gpu_samples'"
        ).fetchall()
        per: dict[str, float] = dict.fromkeys(cols, 0.0)
        for (chunk,) in chunks:
            have = {
                r[0]
                for r in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0", (chunk,)
                ).fetchall()
            }
            for c in cols:
                if c in have:
                    v = conn.execute(
                        sql.SQL("SELECT coalesce(sum(pg_column_size({})), 0) FROM {}").format(
                            sql.Identifier(c), sql.SQL(chunk)
                        )
                    ).fetchone()[0]  # type: ignore[index]
                    per[c] += float(v)
    return float(total) / max(n, 1), {c: v / max(n, 1) for c, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    args = ap.parse_args()
    settings = load_settings()
    with scratch_database(server_url(), "gpufleet_storage") as url:
        migrate.upgrade(url, settings)
        n = load_hour(url, args.minutes, timescale=False)
        plain = plain_bytes(url, n)
        stats, _ = column_stats(url)
    ts_total: float | None = None
    ts_cols: dict[str, float] = {}
    ts_server = timescale_server_url()
    if ts_server is not None:
        with scratch_database(ts_server, "gpufleet_storage") as url:
            migrate.upgrade(url, settings)
            n_ts = load_hour(url, args.minutes, timescale=True)
            ts_total, ts_cols = timescale_columns(url, n_ts, list(stats))
    moving = sorted(
        (c for c, s in stats.items() if s["change_frac"] > 0.5), key=lambda c: -stats[c]["change_frac"]
    )
    print(f"{n} GPU-samples ({args.minutes:g} min of the simulator's mixed fleet)")
    print(
        f"{'column':28s} {'null':>6s} {'changes':>8s} {'distinct':>9s}"
        + ("  compressed B" if ts_cols else "")
    )
    for c, s in stats.items():
        extra = f"  {ts_cols.get(c, 0.0):12.2f}" if ts_cols else ""
        print(f"{c:28s} {s['null_frac']:6.2f} {s['change_frac']:8.2f} {int(s['distinct']):9d}{extra}")
    print(f"stored bytes per GPU-sample, plain PostgreSQL (heap and indexes): {plain:.1f}")
    print(f"columns changing in more than half the samples: {len(moving)} ({', '.join(moving)})")
    if ts_total is not None:
        print(f"stored bytes per GPU-sample, TimescaleDB compressed: {ts_total:.1f} (target 20)")
    else:
        print("TimescaleDB: not measured (set GPUFLEET_TEST_TIMESCALE_URL)")
    result: dict[str, Any] = {
        "name": "storage",
        "value": round(ts_total if ts_total is not None else plain, 1),
        "unit": "bytes_per_gpu_sample",
        "bytes_per_gpu_sample_plain": round(plain, 1),
        "bytes_per_gpu_sample_timescale_compressed": None if ts_total is None else round(ts_total, 1),
        "samples": n,
        "moving_columns": moving,
        "columns": {
            c: {k: round(v, 4) for k, v in s.items()}
            | ({"compressed_bytes": round(ts_cols[c], 3)} if c in ts_cols else {})
            for c, s in stats.items()
        },
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
