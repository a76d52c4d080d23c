"""Grafana's role (``gpufleet db reader``): it reads every table, writes nothing, and runs without JIT."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.db.reader import ensure_reader


@pytest.fixture
def role(db: str) -> Iterator[str]:
    """A role name of this test only (roles are the server's, not the database's), dropped after it."""
    name = f"gpufleet_reader_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(db, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _as(db: str, role: str) -> psycopg.Connection:
    info = psycopg.conninfo.conninfo_to_dict(db)
    return psycopg.connect(psycopg.conninfo.make_conninfo(**{**info, "user": role}), autocommit=True)


def test_the_reader_reads_and_writes_nothing_without_jit(db: str, role: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO nodes (node) VALUES ('r1')")
    ensure_reader(db, role)
    ensure_reader(db, role)  # again: nothing changes, nothing fails
    with _as(db, role) as conn:
        assert conn.execute("SHOW jit").fetchone() == ("off",)
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        assert conn.execute("SELECT node FROM nodes").fetchall() == [("r1",)]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO nodes (node) VALUES ('r2')")
        # a session can lift its read-only default; the grants still refuse a write
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM nodes")
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM nodes").fetchone() == (1,)


def test_the_command_sets_the_role_and_its_password(db: str, role: str, tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    r = CliRunner().invoke(app, ["db", "reader", role, "--db", db, "--password-file", str(secret)])
    assert r.exit_code == 0, r.output
    assert f"role {role} reads every table" in r.output and "jit = off" in r.output
    with psycopg.connect(db, autocommit=True) as conn:
        (stored,) = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()
        settings = conn.execute(
            "SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
            "WHERE r.rolname = %s ORDER BY 1",
            (role,),
        ).fetchall()
    assert stored is not None and "s3cret" not in stored  # stored hashed
    assert settings == [("default_transaction_read_only=on",), ("jit=off",)]


def test_the_command_names_a_bad_password_file(db: str, role: str, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["db", "reader", role, "--db", db, "--password-file", str(tmp_path / "none")])
    assert r.exit_code == 2 and "--password-file" in r.output
    (tmp_path / "empty").write_text("\n")
    r = CliRunner().invoke(
        app, ["db", "reader", role, "--db", db, "--password-file", str(tmp_path / "empty")]
    )
    assert r.exit_code == 2 and "is empty" in r.output
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None
