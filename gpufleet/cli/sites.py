"""``gpufleet site``: a site's PUE, prices and carbon region, dated from when they hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.common import (
    ConfigOpt,
    DbOpt,
    connect,
    fail,
    iso_text,
    parse_query_time,
    read_series_csv,
    settings_from,
)

app = typer.Typer(help="Sites: PUE, prices, carbon region.", no_args_is_help=True)


def _model_prices(values: list[str] | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for v in values or []:
        model, sep, price = v.partition("=")
        if not sep or not model.strip():
            fail(f"--gpu-model-price {v!r}: expected MODEL=PRICE (e.g. H100=3.1) or MODEL= to end it")
        try:
            out[model.strip()] = None if price.strip() == "" else float(price)
        except ValueError:
            fail(f"--gpu-model-price {v!r}: {price!r} is not a number")
    return out


def _site_flag(field: str) -> str:
    """The ``site set`` option of a site setting."""
    return "--gpu-model-price" if field == "gpu_hour_prices" else "--" + field.replace("_", "-")


@app.command("set")
def site_set(
    site: str,
    pue: Annotated[float | None, typer.Option(help="power usage effectiveness (>= 1)")] = None,
    price_per_kwh: Annotated[float | None, typer.Option(help="energy price per kWh")] = None,
    gpu_hour_price: Annotated[float | None, typer.Option(help="default price per GPU-hour")] = None,
    gpu_model_price: Annotated[
        list[str] | None,
        typer.Option(
            help="GPU-hour price of GPUs whose model contains MODEL: MODEL=PRICE (repeatable; MODEL= ends it)"
        ),
    ] = None,
    currency: Annotated[
        str | None,
        typer.Option(
            help="ISO 4217 code of the site's prices (required once it has a price); a change holds from "
            "--from like the others and needs the prices in force given again in the new currency"
        ),
    ] = None,
    carbon_region: Annotated[str | None, typer.Option(help="carbon series region ('' clears it)")] = None,
    carbon_g_per_kwh: Annotated[float | None, typer.Option(help="constant fallback g/kWh")] = None,
    clear_carbon_g_per_kwh: Annotated[bool, typer.Option(help="remove the constant fallback")] = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="when the change takes effect (default now; a new site: from the beginning); "
            "a past time dates it back on purpose",
        ),
    ] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Create a site, or change only the settings given, from a time (default now).

    Accounting before that time keeps the values that were in force.  A new site
    takes pue 1.0, prices 0 and no carbon region for what is not given; a site with
    a price needs --currency (there is no default currency).
    """
    from pydantic import ValidationError

    from gpufleet.api.schemas import SiteUpdate
    from gpufleet.store.runs import Conflict
    from gpufleet.store.sites import SiteError, patch_site

    given: dict[str, Any] = {
        k: v
        for k, v in (
            ("pue", pue),
            ("price_per_kwh", price_per_kwh),
            ("gpu_hour_price", gpu_hour_price),
            ("currency", currency),
            ("carbon_region", carbon_region),
            ("carbon_g_per_kwh", carbon_g_per_kwh),
        )
        if v is not None
    }
    if given.get("carbon_region") == "":
        given["carbon_region"] = None
    if clear_carbon_g_per_kwh:
        if carbon_g_per_kwh is not None:
            fail("give --carbon-g-per-kwh or --clear-carbon-g-per-kwh, not both")
        given["carbon_g_per_kwh"] = None
    models = _model_prices(gpu_model_price)
    if models:
        given["gpu_hour_prices"] = models
    try:
        changes = SiteUpdate.model_validate(given).model_dump(exclude_unset=True)
    except ValidationError as e:
        fail("; ".join(f"{_site_flag(str(err['loc'][0]))}: {err['msg']}" for err in e.errors()))
    changes.pop("gpu_hour_prices", None)
    when = parse_query_time(since, "from") if since is not None else None
    with connect(settings_from(config, db)) as conn:
        try:
            w = patch_site(conn, site, changes, valid_from=when, gpu_hour_prices=models, create=True)
        except Conflict as e:
            fail(str(e))
        except SiteError as e:
            fail(f"{_site_flag(e.field)}: {e}")
    if not w.created and not changes and not models:
        typer.echo(f"gpufleet: nothing to change for site {site!r} (give an option)", err=True)
    elif not w.created:
        typer.echo(
            f"gpufleet: site {site!r} changed from {'now' if when is None else iso_text(when)}; "
            "accounting before that keeps the values in force then",
            err=True,
        )
    typer.echo(json.dumps(w.site, default=str))


@app.command("show")
def site_show(
    site: str,
    at: Annotated[str | None, typer.Option(help="values in force at (default now)")] = None,
    history: Annotated[bool, typer.Option(help="every dated value instead")] = False,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """A site's settings in force (or with --history, every dated change)."""
    from gpufleet.store.runs import NotFound
    from gpufleet.store.sites import get_site, site_history

    with connect(settings_from(config, db)) as conn:
        try:
            out: Any = (
                site_history(conn, site)
                if history
                else get_site(conn, site, parse_query_time(at, "at") if at else None)
            )
        except NotFound as e:
            fail(str(e))
    typer.echo(json.dumps(out, default=str))


@app.command("pue-load")
def site_pue_load(site: str, file: Path, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Load measured or monthly PUE for SITE from a CSV (time, pue): each value holds until the next."""
    from gpufleet.store.runs import NotFound
    from gpufleet.store.sites import parse_pue_csv, set_series

    points = read_series_csv(file, parse_pue_csv)
    with connect(settings_from(config, db)) as conn:
        try:
            n = set_series(conn, site, "pue", points)
        except NotFound as e:
            fail(str(e))
    typer.echo(f"loaded {n} PUE points for {site}")
