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
ROLLUP_TABLES = (
    "gpu_energy_1m",
    "host_energy_1m",
    "gpu_energy_1h",
    "host_energy_1h",
    "node_activity_1m",
    "node_activity_1h",
)
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
                "SELECT add_retention_policy(%s::regclass, make_interval(days => %s))",
                (table, st.retention_days),
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
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET {} = {}").format(
            sql.Identifier(db), sql.SQL(BATCH_GUC), sql.Literal(rows)
        )
    )
    conn.execute(sql.SQL("SET {} = {}").format(sql.SQL(BATCH_GUC), sql.Literal(rows)))
    return True


def enforce_retention(conn: psycopg.Connection, settings: Settings, plain: bool) -> dict[str, int]:
    """What the leader runs every hour; returns the rows deleted per table.

    On plain PostgreSQL there are no retention jobs, so the collector also
    deletes old raw samples and rollups.  On both layouts it prunes the
    ordinary tables that grow with ingest, which TimescaleDB's policies
    (hypertables and continuous aggregates only) never reach:
    :func:`enforce_table_retention`."""
    deleted = enforce_raw_retention_plain(conn, settings) if plain else {}
    deleted.update(enforce_table_retention(conn, settings))
    return deleted


def enforce_raw_retention_plain(conn: psycopg.Connection, settings: Settings) -> dict[str, int]:
    """Raw samples past ``retention_days`` and rollups past ``rollup_retention_days`` (plain PostgreSQL)."""
    st = settings.storage
    deleted = {}
    for table in RAW_TABLES:
        deleted[table] = conn.execute(
            f"DELETE FROM {table} WHERE time < now() - make_interval(days => %s)", (st.retention_days,)
        ).rowcount
    for rel in (*ROLLUP_TABLES, *CAGGS):
        deleted[rel] = conn.execute(
            f"DELETE FROM {rel} WHERE bucket < now() - make_interval(days => %s)", (st.rollup_retention_days,)
        ).rowcount
    return deleted


#: Rows one statement of :func:`enforce_table_retention` deletes at most: a fleet of 10,000 GPUs
#: registers about 900,000 batches an hour, and one statement deleting them all would hold the
#: leader (and its rollups and sweeps) for seconds.
DELETE_CHUNK_ROWS = 50_000

#: Sightings in these states are settled: nothing reads them again once their run has ended.
SETTLED_SIGHTINGS = ("allocated", "explicit", "conflict", "yielded", "invalid")


def enforce_table_retention(conn: psycopg.Connection, settings: Settings) -> dict[str, int]:
    """Prune the ordinary tables that grow with ingest, on both layouts; returns the rows deleted.

    * ``ingest_batches``: batch ids are remembered ``ingest.dedup_days`` for
      de-duplication, then forgotten (one row per shipment: the largest of them);
    * ``gpu_energy_spans``: kept as long as the rollups;
    * ``run_sightings``: settled ones whose last sample is older than the raw
      retention (their samples are gone; a pending or moved one waits for the
      leader, whatever its age);
    * ``priced_pieces``, ``kept_claims``, ``kept_power_points``: kept prices, claims and power-cap
      points of spans retention reaches, never read again (:data:`gpufleet.db.priced_store_sql.HORIZON`);
    * ``fleet_hours_kept`` (and its lines): the fleet's kept hours retention reaches, which the live
      query would now price from what is left;
    * ``kept_power_minutes``: a running run's kept hours, once retention reaches the run or it is no
      longer running (an ended run's points are kept whole, ``kept_power_points``)."""
    st = settings.storage
    deleted = {
        "ingest_batches": _delete_in_chunks(
            conn,
            "ingest_batches",
            "received_at < now() - make_interval(secs => %s)",
            (settings.ingest.dedup_days * 86400,),
        ),
        "gpu_energy_spans": _delete_in_chunks(
            conn, "gpu_energy_spans", "t1 < now() - make_interval(days => %s)", (st.rollup_retention_days,)
        ),
        "run_sightings": _delete_in_chunks(
            conn,
            "run_sightings",
            "last_seen < now() - make_interval(days => %s) AND status = ANY(%s)",
            (st.retention_days, list(SETTLED_SIGHTINGS)),
        ),
        "priced_pieces": _delete_in_chunks(
            conn,
            "priced_pieces",
            "lo < now() - make_interval(days => %s) + INTERVAL '1 day'",
            (min(st.retention_days, st.rollup_retention_days),),
        ),
        "kept_claims": _delete_in_chunks(
            conn,
            "kept_claims",
            "lo < now() - make_interval(days => %s) + INTERVAL '1 day'",
            (min(st.retention_days, st.rollup_retention_days),),
        ),
        "kept_power_points": _delete_in_chunks(
            conn,
            "kept_power_points",
            "lo < now() - make_interval(days => %s) + INTERVAL '1 day'",
            (min(st.retention_days, st.rollup_retention_days),),
        ),
        "kept_power_minutes": _delete_in_chunks(
            conn,
            "kept_power_minutes",
            "lo < now() - make_interval(days => %s) + INTERVAL '1 day' OR NOT EXISTS (SELECT 1 FROM runs r "
            'WHERE r.run_id = kept_power_minutes.run_id AND r."end" IS NULL)',
            (min(st.retention_days, st.rollup_retention_days),),
        ),
        "fleet_hours_kept": _delete_in_chunks(
            conn,
            "fleet_hours_kept",
            "hour < now() - make_interval(days => %s) + INTERVAL '1 day'",
            (min(st.retention_days, st.rollup_retention_days),),
        ),
    }
    return deleted


def _delete_in_chunks(conn: psycopg.Connection, table: str, where: str, params: tuple[object, ...]) -> int:
    """DELETE ... WHERE ``where``, at most :data:`DELETE_CHUNK_ROWS` rows a statement, until none is left."""
    total = 0
    while True:
        n = conn.execute(
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {where} LIMIT {DELETE_CHUNK_ROWS}))",
            params,
        ).rowcount
        total += n
        if n < DELETE_CHUNK_ROWS:
            return total
