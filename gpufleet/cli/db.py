"""``gpufleet db``: the schema's migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, database, fail, password_from, psycopg, settings_from

app = typer.Typer(help="Database schema.", no_args_is_help=True)


@app.command("upgrade")
def db_upgrade(
    config: ConfigOpt = None,
    db: DbOpt = None,
    revision: Annotated[str, typer.Option(help="target revision")] = "head",
) -> None:
    """Create or upgrade the schema (TimescaleDB layout when the server can load it)."""
    from gpufleet.db import migrate

    s = settings_from(config, db)
    url = database(s)
    try:
        ts = migrate.upgrade(url, s, revision)
    except (RuntimeError, psycopg.Error) as e:
        fail(f"migration failed: {e}")
    typer.echo(f"schema at {migrate.current(url)} ({'TimescaleDB' if ts else 'plain PostgreSQL'})")


@app.command("downgrade")
def db_downgrade(
    config: ConfigOpt = None,
    db: DbOpt = None,
    revision: Annotated[str, typer.Option(help="target revision")] = "base",
) -> None:
    """Downgrade the schema (``base`` drops every gpufleet table)."""
    from gpufleet.db import migrate

    s = settings_from(config, db)
    migrate.downgrade(database(s), revision)
    typer.echo(f"schema at {migrate.current(database(s)) or 'base'}")


@app.command("reader")
def db_reader(
    role: Annotated[str, typer.Argument(help="name of the role Grafana's data source logs in as")],
    password_file: Annotated[
        Path | None,
        typer.Option(help="file holding the role's password (else its password is left as it is)"),
    ] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Create or update the read-only role for Grafana: it reads every table and writes nothing, and its
    sessions run without JIT compilation (what the panels are measured with)."""
    from gpufleet.db.reader import SETTINGS, ensure_reader

    password = None if password_file is None else password_from(password_file, "--password-file")
    s = settings_from(config, db)
    try:
        ensure_reader(database(s), role, password)
    except psycopg.Error as e:
        fail(f"role {role!r} not set up: {str(e).strip()}")
    settings = ", ".join(f"{k} = {v}" for k, v in SETTINGS)
    typer.echo(f"role {role} reads every table ({settings}){'; password set' if password else ''}")
