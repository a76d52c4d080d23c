"""The per-test clean slate empties what a TRUNCATE ... RESTART IDENTITY CASCADE of the data tables would."""

from __future__ import annotations

import psycopg

from tests.conftest import _SLATES, truncate_all


def _insert_incident(conn: psycopg.Connection, scope: str = "k") -> int:
    row = conn.execute(
        "INSERT INTO incidents (kind, scope_key, run_id, node, cause, severity, start, last_seen, evidence) "
        "VALUES ('straggler', %s, 'r1', NULL, 'x', 'warning', now(), now(), '{}') RETURNING id",
        (scope,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_written_tables_are_emptied_and_their_sequences_restart(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, start) VALUES ('r1', now())")
        first = _insert_incident(conn)
        second = _insert_incident(conn, "k2")
        assert second == first + 1
        truncate_all(db)
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM incidents").fetchone() == (0,)
        conn.execute("INSERT INTO runs (run_id, start) VALUES ('r1', now())")
        assert _insert_incident(conn) == first


def test_tables_referencing_data_tables_are_emptied_too(db: str) -> None:
    """A table outside the named list that references one by foreign key is emptied, as CASCADE did."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS slate_probe (run_id text REFERENCES runs (run_id))")
        _SLATES.pop(db, None)  # the slate is found once per database; this table is new since
        try:
            conn.execute("INSERT INTO runs (run_id, start) VALUES ('r1', now())")
            conn.execute("INSERT INTO slate_probe VALUES ('r1')")
            truncate_all(db)
            assert conn.execute("SELECT count(*) FROM slate_probe").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        finally:
            conn.execute("DROP TABLE slate_probe")
            _SLATES.pop(db, None)
