"""``gpufleet carbon``: carbon-intensity series, from a file or a provider."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import (
    ConfigOpt,
    DbOpt,
    connect,
    fail,
    parse_query_time,
    read_series_csv,
    settings_from,
)

app = typer.Typer(help="Carbon-intensity series.", no_args_is_help=True)


@app.command("load")
def carbon_load(
    region: str,
    file: Path,
    method: Annotated[
        str | None,
        typer.Option(
            help="average (the grid mix's intensity) or marginal (the generator answering a change in "
            "demand); recorded for the region and shown in reports (a first series without it: "
            "average)"
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="readable name of the region for reports, e.g. Germany")
    ] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Load a carbon-intensity CSV (time, g_co2e_per_kwh) for REGION."""
    from gpufleet.store.sites import SiteError, parse_carbon_csv, set_carbon

    if method is not None and method not in ("average", "marginal"):
        fail(f"--method: must be average or marginal, not {method!r}")
    points = read_series_csv(file, lambda f: parse_carbon_csv(f, region))
    with connect(settings_from(config, db)) as conn:
        try:
            n = set_carbon(conn, region, points, method=method, name=name, provider="file")
        except SiteError as e:
            fail(f"--{e.field}: {e}")
    typer.echo(f"loaded {n} points for {region}")


@app.command("fetch")
def carbon_fetch(
    region: str,
    provider: Annotated[str, typer.Option(help="electricitymaps | watttime")],
    token_file: Annotated[Path, typer.Option(help="file with the API token (watttime: user:password)")],
    zone: Annotated[str | None, typer.Option(help="the provider's zone or region (default: REGION)")] = None,
    since: Annotated[str | None, typer.Option("--from", help="start (default: 2 days ago)")] = None,
    until: Annotated[str | None, typer.Option("--to", help="end (default: now)")] = None,
    base_url: Annotated[str | None, typer.Option(help="the service's base URL")] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Fetch carbon intensity for REGION from Electricity Maps or WattTime into its step series."""
    from datetime import timedelta

    from gpufleet.carbon import CarbonFetchError, fetch_into, make_provider

    end = parse_query_time(until, "to") if until else datetime.now(UTC)
    start = parse_query_time(since, "from") if since else end - timedelta(days=2)
    if end <= start:
        fail("--to: must be after --from")
    try:
        p = make_provider(provider, token_file, base_url)
    except CarbonFetchError as e:
        fail(str(e))
    with connect(settings_from(config, db)) as conn:
        try:
            n = fetch_into(conn, p, zone or region, region, start, end)
        except CarbonFetchError as e:
            fail(str(e))
    typer.echo(f"stored {n} points for {region} from {provider}")
