"""What every command group shares: settings from ``--config`` and ``--db``, one-line failures, the
database connection with its diagnosis of a wrong database, and the parsing of times and CSV files."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from gpufleet.config import ConfigError, Settings, load_settings


class _OnUse(ModuleType):
    """A module imported when one of its names is first read, so that ``gpufleet agent`` runs where it is absent."""

    def __getattr__(self, name: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self.__name__), name)


if TYPE_CHECKING:
    import psycopg
else:
    psycopg = _OnUse("psycopg")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML settings file", envvar="GPUFLEET_CONFIG")
]
DbOpt = Annotated[str | None, typer.Option("--db", help="PostgreSQL URL (default: settings, else embedded)")]


def fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(f"gpufleet: {msg}", err=True)
    raise typer.Exit(code)


def password_from(path: Path, option: str) -> str:
    """The password a file holds (its first line's end trimmed); a missing, unreadable or empty file
    fails naming ``option``."""
    try:
        password = path.read_text().rstrip("\r\n")
    except OSError as e:
        fail(f"{option}: {path}: {e.strerror}")
    if not password:
        fail(f"{option}: {path} is empty")
    return password


def settings_from(config: Path | None, db: str | None = None, **overrides: Any) -> Settings:
    try:
        if db:
            overrides["database_url"] = db
        return load_settings(config, **overrides)
    except ConfigError as e:
        fail(str(e))


def setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def database(settings: Settings) -> str:
    from gpufleet.db.connect import database_url
    from gpufleet.demofile import demo_database

    if not settings.database_url:
        demo = demo_database(settings)
        if demo:
            typer.echo(
                f"gpufleet: using the running demo's database ({demo}); set GPUFLEET_DATABASE_URL or --db "
                "for another",
                err=True,
            )
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
        fail(
            f"the database at {redacted(url)} does not answer: is it running? ({str(e).strip().splitlines()[0]}). "
            "A demo's database stops with the demo: start `gpufleet demo` again, or give --db another server"
        )
    problem = schema_problem(conn)
    if problem:
        elsewhere = gpufleet_databases(conn, url)
        name = conn.info.dbname
        conn.close()
        if elsewhere and "has no gpufleet schema" in problem:
            demo = "gpufleet_demo" in elsewhere
            target = "gpufleet_demo" if demo else elsewhere[0]
            more = f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else ""
            found = (
                "the demo's database 'gpufleet_demo' is on this server, but the demo is not running"
                if demo
                else f"{', '.join(repr(d) for d in elsewhere[:3])}{more} on this server hold gpufleet data"
            )
            fail(
                f"database {name!r} has no gpufleet schema: {found}; give --db {redacted(with_db(url, target))}, "
                f"or, to use {name!r}, {UPGRADE}"
            )
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

    names = [
        r[0]
        for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate AND datname <> current_database() "
            "ORDER BY datname = 'gpufleet_demo' DESC, datname LIMIT %s",
            (most,),
        ).fetchall()
    ]
    found = []
    for name in names:
        try:
            with psycopg.connect(with_db(url, name), autocommit=True, connect_timeout=5) as other:
                if other.execute(sql.SQL("SELECT to_regclass('alembic_version') IS NOT NULL")).fetchone() == (
                    True,
                ):
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


def read_series_csv(
    file: Path, parse: Callable[[Path], list[tuple[datetime, float]]]
) -> list[tuple[datetime, float]]:
    """A step series from a CSV file, or one line saying the file is missing or which rows are wrong."""
    from gpufleet.store.sites import CsvError

    try:
        return parse(file)
    except FileNotFoundError:
        fail(f"{file}: no such file")
    except CsvError as e:
        fail(str(e))
