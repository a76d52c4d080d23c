"""``gpufleet demo``: the live demo on a simulated fleet, the one command that loads the simulator."""

from __future__ import annotations

import subprocess
from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, database, fail, psycopg, settings_from, setup_logging


def demo(
    config: ConfigOpt = None,
    db: DbOpt = None,
    scenario: Annotated[str, typer.Option(help="simulator scenario (name or YAML path)")] = "demo",
    seed: Annotated[int | None, typer.Option(help="scenario seed")] = None,
    backfill_minutes: Annotated[float, typer.Option(help="telemetry to back-fill before going live")] = 15.0,
    duration: Annotated[
        float | None, typer.Option(help="stop after this many seconds (default: Ctrl-C)")
    ] = None,
    api_port: Annotated[int, typer.Option(help="API port (0: any free port)")] = 8420,
    collector_port: Annotated[int, typer.Option(help="collector port (0: any free port)")] = 8410,
    database_name: Annotated[
        str, typer.Option(help="demo database (dropped and recreated)")
    ] = "gpufleet_demo",
    db_port: Annotated[
        int, typer.Option(help="loopback TCP port of the embedded database, for Grafana (0: any free port)")
    ] = 8432,
) -> None:
    """The live demo: database, collector, API and agents on a simulated fleet.

    Everything it starts stops with it: Ctrl-C, SIGTERM, or the end of --duration stop it in order, and
    the embedded database's watchdog stops the database even when the demo is killed.
    """
    import signal
    import threading

    from gpufleet.db.connect import with_database
    from gpufleet.serverthread import free_port
    from gpufleet.sim.demo import DemoOptions, run_demo

    s = settings_from(config, db, log_level="WARNING")
    setup_logging(s)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def port(p: int, what: str) -> int:
        if p == 0:
            return free_port()
        if not port_free(p):
            typer.echo(
                f"gpufleet: the {what} port {p} is in use by another program; using a free one", err=True
            )
            return free_port()
        return p

    if s.database_url:
        server = with_database(database(s), "postgres")
        reader = reader_url(server)
    else:
        from gpufleet.db.embedded import start_embedded

        tcp = port(db_port, "database")
        try:
            server = start_embedded(s.data_dir / "pg", tcp_port=tcp)
        except (OSError, RuntimeError, AssertionError, subprocess.SubprocessError) as e:
            fail(f"cannot start the embedded database: {e}")
        reader = reader_url(server, tcp)
    opts = DemoOptions(
        scenario=scenario,
        seed=seed,
        backfill_s=backfill_minutes * 60,
        duration_s=duration,
        api_port=port(api_port, "API"),
        collector_port=port(collector_port, "collector"),
        database=database_name,
        reader_url=reader,
    )
    try:
        run_demo(s, server, opts, lambda m: typer.echo(m), stop)
    except FileNotFoundError as e:
        fail(str(e))
    except psycopg.OperationalError as e:
        fail(f"database: {str(e).strip().splitlines()[0]}")
    typer.echo("demo stopped")


def port_free(p: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``p`` now.  With SO_REUSEADDR, as the servers bind, so a port
    whose last connections linger in TIME-WAIT (the demo's own, restarted) counts as free."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", p))
        except OSError:
            return False
    return True


def reader_url(server: str, tcp_port: int | None = None) -> str | None:
    """Where Grafana reaches the demo's server over TCP, as the demo's read-only role (None: only over a
    Unix socket)."""
    from urllib.parse import parse_qs, urlsplit

    from gpufleet.sim.demo import READER_ROLE

    if tcp_port:
        return f"postgresql://{READER_ROLE}@127.0.0.1:{tcp_port}/postgres"
    parts = urlsplit(server)
    socket_host = (parse_qs(parts.query).get("host") or [""])[0].startswith("/")
    if not parts.hostname or socket_host:
        return None
    return f"postgresql://{READER_ROLE}@{parts.hostname}:{parts.port or 5432}/postgres"
