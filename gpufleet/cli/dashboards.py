"""``gpufleet dashboards``: push the Grafana dashboards, or run their queries against the database."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, connect, fail, password_from, settings_from

app = typer.Typer(
    help="Grafana dashboards: push them to a Grafana, check them against the database.", no_args_is_help=True
)


@app.command("push")
def dashboards_push(
    grafana_url: Annotated[
        str,
        typer.Option(
            "--grafana-url", envvar="GRAFANA_URL", help="Grafana base URL, e.g. https://grafana.example.org"
        ),
    ],
    token: Annotated[
        str,
        typer.Option(
            "--token",
            envvar="GRAFANA_TOKEN",
            show_default=False,
            help="Grafana service-account token (Editor or Admin)",
        ),
    ],
    datasource_url: Annotated[
        str | None,
        typer.Option(
            help="postgresql://user@host:port/database as Grafana reaches it (default: the configured standby, "
            "database.read_url, else the configured database)"
        ),
    ] = None,
    datasource_password_file: Annotated[
        Path | None, typer.Option(help="file holding the data source password (else the URL's)")
    ] = None,
    sslmode: Annotated[
        str | None,
        typer.Option(
            help="disable | require | verify-ca | verify-full (default: require; disable for a loopback "
            "address, which never leaves the machine)"
        ),
    ] = None,
    timescaledb: Annotated[bool, typer.Option(help="turn on Grafana's TimescaleDB option")] = False,
    folder: Annotated[str, typer.Option(help="uid of the Grafana folder (created if missing)")] = "gpufleet",
    config: ConfigOpt = None,
) -> None:
    """Create or update the gpufleet data source and import every dashboard, overwriting older copies.

    Without --datasource-url: the configured hot standby (``database.read_url``: panels never load the
    primary), else the configured database, else a running demo's (its read-only role on loopback TCP).
    """
    from urllib.parse import urlsplit

    from gpufleet.dashboards.loader import load_all
    from gpufleet.dashboards.provision import DataSource, ProvisionError, connect, push
    from gpufleet.demofile import demo_reader

    s = settings_from(config)
    url = datasource_url or s.database.read_url or s.database_url or demo_reader(s)
    if not url:
        fail(
            "--datasource-url is needed: no database_url is configured and no demo is running "
            "(`gpufleet demo` serves its database to Grafana on loopback TCP)"
        )
    if sslmode is None:
        sslmode = "disable" if urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1") else "require"
    password = (
        None
        if datasource_password_file is None
        else password_from(datasource_password_file, "--datasource-password-file")
    )
    try:
        ds = DataSource.from_url(url, password, sslmode=sslmode, timescaledb=timescaledb)
        result = push(connect(grafana_url, token), ds, load_all().values(), folder_uid=folder)
    except ProvisionError as e:
        fail(str(e))
    typer.echo(
        f"data source {ds.uid} {result.datasource}; folder {folder} {result.folder}; "
        f"dashboards imported: {', '.join(result.dashboards)}"
    )


@app.command("check")
def dashboards_check(
    config: ConfigOpt = None,
    db: DbOpt = None,
    hours: Annotated[float, typer.Option(help="length of the range, ending now")] = 6.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Validate the dashboards and run every query against the database, as Grafana would expand it."""
    from datetime import timedelta

    from gpufleet.dashboards.dryrun import run_dashboard, shape_problems
    from gpufleet.dashboards.loader import load_all
    from gpufleet.dashboards.macros import TimeRange
    from gpufleet.dashboards.validate import validate_all

    boards = load_all()
    problems = validate_all(boards)
    end = datetime.now(UTC)
    queries = 0
    with connect(settings_from(config, db)) as conn:
        for d in boards.values():
            for r in run_dashboard(conn, d, TimeRange(end - timedelta(hours=hours), end)):
                queries += 1
                problems += shape_problems(r)
    if as_json:
        typer.echo(
            json.dumps(
                {"dashboards": len(boards), "queries": queries, "problems": [str(p) for p in problems]},
                indent=1,
            )
        )
    else:
        for p in problems:
            typer.echo(p, err=True)
        typer.echo(f"{len(boards)} dashboards, {queries} queries, {len(problems)} problems")
    if problems:
        raise typer.Exit(1)
