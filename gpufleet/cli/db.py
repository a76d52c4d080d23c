"""``gpufleet db``: the schema's migrations."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, database, fail, psycopg, settings_from

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
