"""The CLI as its users type it, over the simulated fleet: versions, runs, incidents and tokens to read (as tables
and as JSON), option combinations that cannot work, and messages that name the actual problem."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from gpufleet import __version__
from gpufleet.cli import app
from tests.surfaces.fleetdb import FilledFleet

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.output


def test_version() -> None:
    code, out = cli("--version")
    assert code == 0 and out.strip() == f"gpufleet {__version__}"


def test_runs_list_and_show(fleet: FilledFleet) -> None:
    code, out = cli("runs", "list", "--db", fleet.url)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["run", "name", "team", "site", "state"]
    assert {line.split()[0] for line in lines[1:]} == set(fleet.runs)
    code, out = cli("runs", "list", "--db", fleet.url, "--json")
    assert code == 0, out
    body = json.loads(out)
    assert {r["run_id"] for r in body} == set(fleet.runs)
    vision = next(r for r in body if r["run_id"] == "demo-vision")
    assert vision["team"] == "vision" and "starvation" in vision["open_incidents"]
    code, out = cli("runs", "show", "demo-vision", "--db", fleet.url)
    assert code == 0, out
    assert "team vision" in out and "EUR" in out and "Input starvation: CPU-bound" in out
    code, out = cli("runs", "show", "demo-vision", "--db", fleet.url, "--json")
    shown = json.loads(out)
    assert (
        shown["run_id"] == "demo-vision" and shown["accounting"]["currency"] == "EUR" and shown["incidents"]
    )
    code, out = cli("runs", "show", "nope", "--db", fleet.url)
    assert code == 2 and "run 'nope' not found" in out
    code, out = cli("runs", "list", "--state", "sleeping", "--db", fleet.url)
    assert code == 2 and "--state" in out


def test_incidents_list_and_show_say_why(fleet: FilledFleet) -> None:
    with psycopg.connect(fleet.url) as conn:
        (iid,) = conn.execute(
            "SELECT id FROM incidents WHERE kind = 'starvation' AND run_id = 'demo-vision' "
            "ORDER BY id LIMIT 1"
        ).fetchone()  # type: ignore[misc]
    code, out = cli("incidents", "list", "--db", fleet.url, "--run", "demo-vision")
    assert code == 0, out
    assert "wait for input" in out and "demo-vision" in out
    code, out = cli("incidents", "list", "--db", fleet.url, "--json", "--kind", "starvation")
    rows = json.loads(out)
    assert rows and all(r["kind"] == "starvation" for r in rows) and all(r["cause_text"] for r in rows)
    code, out = cli("incidents", "show", str(iid), "--db", fleet.url)
    assert code == 0, out
    assert "Input starvation: CPU-bound" in out and "GPU-hours" in out and "job CPU used" in out
    code, out = cli("incidents", "show", str(iid), "--db", fleet.url, "--json")
    got = json.loads(out)
    assert got["id"] == iid and got["lost"]["currency"] == "EUR" and "wait for input" in got["cause_text"]
    code, out = cli("incidents", "show", "999999", "--db", fleet.url)
    assert code == 2 and "no incident 999999" in out


def test_tokens_list_and_revoke(fleet: FilledFleet) -> None:
    code, out = cli("tokens", "create", "cli-list-test", "--role", "sre", "--db", fleet.url)
    assert code == 0 and out.startswith("gpf_")
    secret = out.strip()
    code, out = cli("tokens", "list", "--db", fleet.url)
    assert code == 0 and "cli-list-test" in out and secret not in out
    code, out = cli("tokens", "list", "--db", fleet.url, "--json")
    entry = next(t for t in json.loads(out) if t["name"] == "cli-list-test")
    assert entry["role"] == "sre" and entry["revoked_at"] is None and secret not in out
    code, out = cli("tokens", "revoke", "cli-list-test", "--db", fleet.url)
    assert code == 0, out
    code, out = cli("tokens", "list", "--db", fleet.url)
    assert "cli-list-test" not in out
    code, out = cli("tokens", "list", "--all", "--db", fleet.url, "--json")
    assert next(t for t in json.loads(out) if t["name"] == "cli-list-test")["revoked_at"] is not None


def test_report_refuses_runs_with_group_by(fleet: FilledFleet) -> None:
    code, out = cli(
        "report",
        "--from",
        "2026-12-01",
        "--to",
        "2026-12-02",
        "--runs",
        "--group-by",
        "team",
        "--db",
        fleet.url,
    )
    assert code == 2 and "--runs and --group-by cannot go together" in out
    code, out = cli("report", "--from", "2026-12-01", "--to", "2026-12-02", "--runs", "--db", fleet.url)
    assert code == 0, out


def test_a_stopped_database_is_not_a_missing_migration(fleet: FilledFleet) -> None:
    code, out = cli(
        "runs", "list", "--db", "postgresql://postgres@/gpufleet_demo?host=/nonexistent-socket-dir"
    )
    assert code == 2 and "does not answer: is it running?" in out and "db upgrade" not in out


@pytest.fixture
def empty_db(fleet: FilledFleet) -> Iterator[str]:
    from gpufleet.db.connect import with_database

    name = "gpufleet_cli_empty"
    admin = with_database(fleet.url, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield with_database(fleet.url, name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_an_empty_database_beside_a_gpufleet_one_points_at_it(empty_db: str) -> None:
    code, out = cli("runs", "list", "--db", empty_db)
    assert code == 2 and "hold gpufleet data" in out and "give --db postgresql://" in out, out
    assert len(out.strip().splitlines()) == 1


def test_a_port_left_in_time_wait_counts_as_free_and_one_in_use_does_not() -> None:
    """`gpufleet demo` restarted at once finds its port in TIME-WAIT; the servers bind it (SO_REUSEADDR), so it
    is reused rather than swapped for a random one."""
    import socket

    from gpufleet.cli import port_free

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    assert not port_free(port)  # listening: in use
    served.close()  # the server side closes first, so its end of the connection waits in TIME-WAIT
    client.recv(1)
    client.close()
    listener.close()
    with socket.socket() as plain:
        try:
            plain.bind(("127.0.0.1", port))
            in_time_wait = False
        except OSError:
            in_time_wait = True
    assert in_time_wait, "the connection should have left the port in TIME-WAIT"
    assert port_free(port)
