"""Migrations: upgrade from empty, downgrade to base, and agreement with the model."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from gpufleet.catalog import gpu_columns, host_columns
from gpufleet.collector import rollup
from gpufleet.config import Settings
from gpufleet.db import activity_sql, migrate, stats_sql
from gpufleet.db import energy_sql as E
from gpufleet.db.connect import sqlalchemy_url
from gpufleet.db.policies import BATCH_GUC
from gpufleet.db.schema import BACKEND_INDEXES, STATS_RELATIONS, metadata
from gpufleet.db.scratch import scratch_database
from gpufleet.db.stats_sql import GPU_STATS_V1, HOST_STATS_V1
from tests.timescale import timescale_server

#: The newest revision in migrations/versions (read, so a new revision needs no edit here).
HEAD = ScriptDirectory.from_config(migrate.alembic_config("", False)).get_current_head()


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND relkind IN ('r', 'v', 'm', 'p')"
        ).fetchall()
    return {r[0] for r in rows}


def _columns(url: str, table: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum",
            (table,),
        ).fetchall()
    return [r[0] for r in rows]


def test_upgrade_downgrade_roundtrip_plain(pg_server: str, settings: Settings) -> None:
    plain = settings.model_copy(update={"storage": settings.storage.model_copy(update={"timescale": "off"})})
    with scratch_database(pg_server) as url:
        assert migrate.current(url) is None
        assert migrate.upgrade(url, plain) is False
        assert migrate.current(url) == HEAD
        tables = _tables(url)
        assert set(metadata.tables) <= tables
        assert set(STATS_RELATIONS) <= tables
        assert _columns(url, "gpu_samples") == list(gpu_columns())
        assert _columns(url, "host_samples") == list(host_columns())
        assert _columns(url, "gpu_stats_1m") == ["bucket", "node", "gpu", *[c for c, _, _ in GPU_STATS_V1]]
        assert _columns(url, "host_stats_1m") == ["bucket", "node", *[c for c, _, _ in HOST_STATS_V1]]
        migrate.downgrade(url)
        assert migrate.current(url) is None
        assert _tables(url) == {"alembic_version"}
        # and up again from base
        migrate.upgrade(url, plain)
        assert migrate.current(url) == HEAD


def test_migrations_match_model(db_url: str) -> None:
    """Autogenerate finds nothing to change: migrations and model agree."""
    engine = create_engine(sqlalchemy_url(db_url), poolclass=pool.NullPool)
    with engine.connect() as conn:

        def include(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
            if type_ == "table":
                return name not in STATS_RELATIONS and not (name or "").startswith("_")
            if type_ == "index":
                return name not in BACKEND_INDEXES
            return True

        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": include})
        diff = compare_metadata(ctx, metadata)
    engine.dispose()
    diff = [
        d
        for d in diff
        if not (isinstance(d, tuple) and d[0] == "remove_table" and d[1].name == "alembic_version")
    ]
    assert diff == []


def test_timescale_layout(settings: Settings) -> None:
    """On a TimescaleDB server: hypertables, compression policies, continuous aggregates."""
    server = timescale_server()
    with scratch_database(server) as url:
        assert migrate.upgrade(url, settings) is True
        with psycopg.connect(url) as conn:
            hyper = {
                r[0] for r in conn.execute("SELECT hypertable_name FROM timescaledb_information.hypertables")
            }
            assert {"gpu_samples", "host_samples", "node_activity_1m", "node_activity_1h"} <= hyper
            jobs = conn.execute(
                "SELECT proc_name, hypertable_name FROM timescaledb_information.jobs WHERE hypertable_name IS NOT NULL"
            ).fetchall()
            assert ("policy_compression", "gpu_samples") in jobs
            assert ("policy_compression", "host_samples") in jobs
            assert ("policy_retention", "gpu_samples") in jobs
            caggs = {
                r[0]
                for r in conn.execute("SELECT view_name FROM timescaledb_information.continuous_aggregates")
            }
            assert {"gpu_stats_1m", "host_stats_1m"} <= caggs
            # the compression policy runs as a background job: the batch size must be the database's own
            # setting, seen by every new session (TimescaleDB 2.20 and later have it)
            if conn.execute("SELECT 1 FROM pg_settings WHERE name = %s", (BATCH_GUC,)).fetchone() is not None:
                (rows,) = conn.execute(f"SHOW {BATCH_GUC}").fetchone()  # type: ignore[misc]
                assert int(rows) == settings.storage.compress_batch_rows
        with psycopg.connect(url) as conn:
            if conn.execute("SELECT 1 FROM pg_settings WHERE name = %s", (BATCH_GUC,)).fetchone() is not None:
                conn.execute("SELECT remove_compression_policy('gpu_samples')")
                t0 = 1_700_000_000.0
                conn.execute(
                    "INSERT INTO gpu_samples (time, node, gpu, power_w) "
                    "SELECT to_timestamp(%s + i), 'n', 0, 300 + i %% 7 FROM generate_series(0, 4999) i",
                    (t0,),
                )
                conn.execute("SELECT compress_chunk(c) FROM show_chunks('gpu_samples') c")
                conn.commit()
                chunks = conn.execute(
                    "SELECT format('%I.%I', cc.schema_name, cc.table_name) FROM _timescaledb_catalog.chunk c "
                    "JOIN _timescaledb_catalog.chunk cc ON cc.id = c.compressed_chunk_id"
                ).fetchall()
                batches = sum(
                    conn.execute(f"SELECT count(*) FROM {c}").fetchone()[0]  # type: ignore[index]
                    for (c,) in chunks
                )
                assert batches == 1, "5,000 rows of one GPU in one chunk are one compressed batch"
        migrate.downgrade(url)
        assert migrate.current(url) is None


def test_node_activity_is_filled_from_the_minutes_already_rolled_up(
    pg_server: str, settings: Settings
) -> None:
    """Migration 0029 fills ``node_activity_1m``/``_1h`` from ``gpu_stats_1m``: with every value present
    (the one case where a minute's sample count is each column's), the rows equal the rollup worker's."""
    plain = settings.model_copy(update={"storage": settings.storage.model_copy(update={"timescale": "off"})})
    with scratch_database(pg_server) as url:
        migrate.upgrade(url, plain, "0028")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO gpu_samples (time, node, gpu, util_pct, sm_active, tensor_active, power_w) "
                "SELECT timestamptz '2026-12-01 10:40:00+00' + make_interval(secs => i * 7), 'n' || (i % 3), "
                "(i / 3) % 4, (i * 37) % 101 / 4.0, ((i * 13) % 10) / 10.0, ((i * 7) % 10) / 10.0, 100 + (i * 11) % 500 "
                "FROM generate_series(0, 2999) i"
            )
            conn.execute(f"INSERT INTO gpu_stats_1m {stats_sql.gpu_stats_select(E.minute('time'))}")
        migrate.upgrade(url, plain)
        with psycopg.connect(url, autocommit=True) as conn:
            filled = {t: _activity(conn, t) for t in ("node_activity_1m", "node_activity_1h")}
            assert len(filled["node_activity_1h"]) == 3 * 7 and len(filled["node_activity_1m"]) == 3 * 350
            conn.execute("TRUNCATE node_activity_1m, node_activity_1h")
            conn.execute(
                "INSERT INTO rollup_queue (node, t_min, t_max) SELECT node, min(time), max(time) "
                "FROM gpu_samples GROUP BY node"
            )
            rollup.drain(conn, 60.0, plain_stats=True)
            for table, rows in filled.items():
                rebuilt = _activity(conn, table)
                assert sorted(rebuilt) == sorted(rows)
                for key, values in rows.items():
                    assert rebuilt[key] == pytest.approx(values, rel=1e-9), (table, key)


def _activity(conn: psycopg.Connection, table: str) -> dict[tuple[object, str], tuple[float, ...]]:
    rows = conn.execute(f"SELECT bucket, node, {activity_sql.NAMES} FROM {table}").fetchall()
    return {(r[0], r[1]): tuple(float(x) for x in r[2:]) for r in rows}


#: The revisions written before the chain followed the file numbers (kept as they shipped).
OUT_OF_ORDER_UNTIL = "0011"


def test_the_revision_chain_follows_the_file_numbers_from_here_on() -> None:
    """Each migration after 0011 names its file's number as its revision and the previous file's as
    its ``down_revision``: the order a reader sees is the order they run."""
    script = ScriptDirectory.from_config(migrate.alembic_config("", False))
    revs = {r.revision: r for r in script.walk_revisions()}
    files = sorted(p.name for p in Path(script.versions).glob("[0-9][0-9][0-9][0-9]_*.py"))
    numbers = [name[:4] for name in files]
    assert sorted(revs) == sorted(numbers), "every file is a revision and every revision a file"
    later = [n for n in numbers if n > OUT_OF_ORDER_UNTIL]
    for prev, n in zip([OUT_OF_ORDER_UNTIL, *later], later, strict=False):
        assert revs[n].down_revision == prev, f"{n} follows {revs[n].down_revision}, not {prev}"
    assert (later[-1] if later else OUT_OF_ORDER_UNTIL) == HEAD
