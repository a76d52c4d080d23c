"""Retention and compression policies, applied from settings after migrating.

Kept out of the migrations because they are configuration: changing
``storage.retention_days`` and re-running ``gpufleet db upgrade`` replaces the
policy without a new schema revision.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from gpufleet.config import Settings

RAW_TABLES = ("gpu_samples", "host_samples")
ROLLUP_TABLES = ("gpu_energy_1m", "host_energy_1m", "gpu_energy_1h", "host_energy_1h")
CAGGS = ("gpu_stats_1m", "host_stats_1m")


def backend_of(conn: psycopg.Connection) -> str | None:
    """'timescaledb' or 'postgresql', as recorded by the migration (None before it)."""
    exists = conn.execute("SELECT to_regclass('gpufleet_meta')").fetchone()
    if not exists or exists[0] is None:
        return None
    row = conn.execute("SELECT value #>> '{}' FROM gpufleet_meta WHERE key = 'backend'").fetchone()
    return row[0] if row else None


def apply_policies(conn: psycopg.Connection, settings: Settings) -> None:
    """Make the server's policies match ``settings.storage`` (idempotent)."""
    st = settings.storage
    if backend_of(conn) == "timescaledb":
        for table in RAW_TABLES:
            conn.execute("SELECT remove_compression_policy(%s::regclass, if_exists => true)", (table,))
            conn.execute(
                "SELECT add_compression_policy(%s::regclass, make_interval(hours => %s))",
                (table, st.compress_after_hours),
            )
            conn.execute("SELECT remove_retention_policy(%s::regclass, if_exists => true)", (table,))
            conn.execute(
                "SELECT add_retention_policy(%s::regclass, make_interval(days => %s))", (table, st.retention_days)
            )
        _set_compress_batch_rows(conn, st.compress_batch_rows)
        for rel in ROLLUP_TABLES + CAGGS:
            conn.execute("SELECT remove_retention_policy(%s::regclass, if_exists => true)", (rel,))
            conn.execute(
                "SELECT add_retention_policy(%s::regclass, make_interval(days => %s))",
                (rel, st.rollup_retention_days),
            )
    conn.execute(
        "INSERT INTO gpufleet_meta (key, value) VALUES ('storage', %s::jsonb) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        (st.model_dump_json(),),
    )


BATCH_GUC = "timescaledb.compression_batch_size_limit"


def _set_compress_batch_rows(conn: psycopg.Connection, rows: int) -> bool:
    """Set the compressed batch size for every session of this database.

    TimescaleDB reads it in the session that compresses, which for the
    compression policy is a background job: only a database-level setting
    reaches it.  Before 2.20 the setting does not exist (batches stay at
    1,000 rows); returns whether it was set.
    """
    if conn.execute("SELECT 1 FROM pg_settings WHERE name = %s", (BATCH_GUC,)).fetchone() is None:
        return False
    db = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
    conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
        sql.Identifier(db), sql.SQL(BATCH_GUC), sql.Literal(rows)))
    conn.execute(sql.SQL("SET {} = {}").format(sql.SQL(BATCH_GUC), sql.Literal(rows)))
    return True


def enforce_retention_plain(conn: psycopg.Connection, settings: Settings) -> int:
    """Plain PostgreSQL has no retention jobs: the collector deletes old rows.

    Returns the number of raw rows deleted.
    """
    st = settings.storage
    deleted = 0
    for table in RAW_TABLES:
        cur = conn.execute(
            f"DELETE FROM {table} WHERE time < now() - make_interval(days => %s)", (st.retention_days,)
        )
        deleted += cur.rowcount
    for rel in (*ROLLUP_TABLES, *CAGGS):
        conn.execute(f"DELETE FROM {rel} WHERE bucket < now() - make_interval(days => %s)", (st.rollup_retention_days,))
    enforce_span_retention(conn, settings)
    conn.execute(
        "DELETE FROM ingest_batches WHERE received_at < now() - make_interval(secs => %s)",
        (settings.ingest.dedup_days * 86400,),
    )
    return deleted


def enforce_span_retention(conn: psycopg.Connection, settings: Settings) -> int:
    """Long counter intervals (``gpu_energy_spans``, an ordinary table on both layouts) are kept as
    long as the rollups; returns the rows deleted."""
    cur = conn.execute("DELETE FROM gpu_energy_spans WHERE t1 < now() - make_interval(days => %s)",
                       (settings.storage.rollup_retention_days,))
    return cur.rowcount
