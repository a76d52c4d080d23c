"""The leader's hourly retention: ordinary tables that grow with ingest are pruned on both layouts."""

from __future__ import annotations

import psycopg
import pytest

from gpufleet.config import Settings
from gpufleet.db import policies


def _fill(conn: psycopg.Connection) -> None:
    # 7 batches received 30 days ago (past the 21-day de-duplication), 2 an hour ago.
    conn.execute(
        "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, received_at) "
        "SELECT 'old-' || i, 'n1', 8, 1, now() - interval '30 days' FROM generate_series(1, 7) i"
    )
    conn.execute(
        "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, received_at) "
        "SELECT 'new-' || i, 'n1', 8, 1, now() - interval '1 hour' FROM generate_series(1, 2) i"
    )
    conn.execute(
        "INSERT INTO run_sightings (run_id, node, gpu, first_seen, last_seen, status) VALUES "
        "('r-old', 'n1', 0, now() - interval '200 days', now() - interval '100 days', 'allocated'), "
        "('r-old', 'n1', 1, now() - interval '200 days', now() - interval '100 days', 'conflict'), "
        "('r-stuck', 'n1', 2, now() - interval '200 days', now() - interval '100 days', 'pending'), "
        "('r-moved', 'n1', 3, now() - interval '200 days', now() - interval '100 days', 'moved'), "
        "('r-new', 'n1', 4, now() - interval '2 days', now() - interval '1 day', 'allocated')"
    )
    conn.execute(
        "INSERT INTO gpu_energy_spans (node, gpu, t0, t1, energy_j) VALUES "
        "('n1', 0, now() - interval '1200 days', now() - interval '1199 days', 5), "
        "('n1', 0, now() - interval '2 days', now() - interval '1 day', 5)"
    )
    conn.execute(
        "INSERT INTO kept_claims (digest, run_id, lo, hi, scopes, versions, incidents, keys, pieces) VALUES "
        "('\\x01', 'r-old', now() - interval '1200 days', now() - interval '1199 days', '{}', '{}', 0, '{}', '{}'), "
        "('\\x02', 'r-new', now() - interval '2 days', now() - interval '1 day', '{}', '{}', 0, '{}', '{}')"
    )
    conn.execute(
        "INSERT INTO kept_power_points (digest, run_id, lo, hi, scopes, versions, points, excluded) VALUES "
        "('\\x01', 'r-old', now() - interval '1200 days', now() - interval '1199 days', '{}', '{}', '[]', '{}'), "
        "('\\x02', 'r-new', now() - interval '2 days', now() - interval '1 day', '{}', '{}', '[]', '{}')"
    )
    # a running run's kept hours: kept while it runs and retention does not reach it
    conn.execute(
        'INSERT INTO runs (run_id, start, "end") VALUES '
        "('r-running', now() - interval '2 days', NULL), ('r-ended', now() - interval '2 days', now()), "
        "('r-ancient', now() - interval '1200 days', NULL)"
    )
    conn.execute(
        "INSERT INTO kept_power_minutes (digest, hour, run_id, lo, run_mark, whole_mark, hour_mark, minutes) "
        "SELECT decode(md5(r), 'hex'), date_trunc('hour', now()) - make_interval(hours => h), r, s, 0, 0, 0, '' "
        "FROM (VALUES ('r-running', now() - interval '2 days'), ('r-ended', now() - interval '2 days'), "
        "('r-gone', now() - interval '2 days'), ('r-ancient', now() - interval '1200 days')) v(r, s), "
        "generate_series(1, 2) h"
    )
    # kept fleet hours: one retention reaches (its lines go with it), one it does not
    for days in (1200, 2):
        hour = f"date_trunc('hour', now()) - interval '{days} days'"
        conn.execute(
            "INSERT INTO fleet_hours_kept (max_gap_s, source, gone_after_s, hour, whole_mark, hour_mark) "
            f"VALUES (60, 'auto', 86400, {hour}, 0, 0)"
        )
        conn.execute(
            "INSERT INTO fleet_hour_lines (max_gap_s, source, gone_after_s, hour, line_no, line, sk, stale, has_energy) "
            f"VALUES (60, 'auto', 86400, {hour}, 0, 'total', 'eu', false, true)"
        )


@pytest.mark.parametrize("layout", ["own", "timescaledb"])
def test_ordinary_tables_are_pruned_on_both_layouts(
    conn: psycopg.Connection, settings: Settings, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TimescaleDB's policies reach only hypertables and continuous aggregates: batch ids, energy
    spans and settled sightings are pruned by the leader whatever the layout (batch ids were
    pruned on plain PostgreSQL only, so a TimescaleDB fleet kept one row per shipment for good),
    in bounded statements.  ``own``: as the leader calls it on the database's layout; ``timescaledb``:
    as it calls it on TimescaleDB, where the policies delete raw samples (on a plain database too)."""
    plain = layout == "own" and policies.backend_of(conn) != "timescaledb"
    monkeypatch.setattr(policies, "DELETE_CHUNK_ROWS", 3)
    _fill(conn)
    deleted = policies.enforce_retention(conn, settings, plain)
    assert (
        deleted["ingest_batches"] == 7 and deleted["gpu_energy_spans"] == 1 and deleted["run_sightings"] == 2
    )
    assert ("gpu_samples" in deleted) is plain
    left = [r[0] for r in conn.execute("SELECT batch_id FROM ingest_batches ORDER BY 1")]
    assert left == ["new-1", "new-2"]
    kept = conn.execute("SELECT run_id, status FROM run_sightings ORDER BY gpu").fetchall()
    assert kept == [("r-stuck", "pending"), ("r-moved", "moved"), ("r-new", "allocated")]
    assert conn.execute("SELECT count(*) FROM gpu_energy_spans").fetchone() == (1,)
    assert deleted["kept_claims"] == 1
    assert conn.execute("SELECT run_id FROM kept_claims").fetchall() == [("r-new",)]
    assert deleted["kept_power_points"] == 1
    assert conn.execute("SELECT run_id FROM kept_power_points").fetchall() == [("r-new",)]
    assert deleted["fleet_hours_kept"] == 1
    assert deleted["kept_power_minutes"] == 6  # the ended run's, the removed run's, the ancient run's
    assert conn.execute("SELECT DISTINCT run_id FROM kept_power_minutes").fetchall() == [("r-running",)]
    assert conn.execute(
        "SELECT count(*), min(now() - hour) > interval '1 day' FROM fleet_hour_lines"
    ).fetchone() == (1, True)
    # Nothing left to prune: a second pass deletes nothing.
    again = policies.enforce_retention(conn, settings, plain)
    assert not any(again.values())
