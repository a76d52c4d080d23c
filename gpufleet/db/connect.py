"""Resolve the database URL from settings and open connections.

One place decides between the configured server and the embedded default, so
every process of a deployment agrees on where the data is.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

from gpufleet.config import Settings
from gpufleet.db.embedded import start_embedded


def database_url(settings: Settings) -> str:
    """The URL to use: the configured one, else the embedded server's."""
    if settings.database_url:
        return settings.database_url
    return start_embedded(settings.data_dir / "pg")


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointed at another database (keeps ``?host=``)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def with_params(url: str, **params: str) -> str:
    parts = urlsplit(url)
    q = dict(parse_qsl(parts.query))
    q.update(params)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(q), parts.fragment))


def sqlalchemy_url(url: str) -> str:
    """psycopg 3 dialect URL for SQLAlchemy / Alembic."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    return "postgresql+psycopg://" + url.removeprefix("postgresql://")


def connect(url: str, **kw: object) -> psycopg.Connection:
    return psycopg.connect(url, **kw)  # type: ignore[arg-type]


def has_timescale(conn: psycopg.Connection) -> bool:
    """True when the TimescaleDB extension is installed in this database."""
    row = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'timescaledb'").fetchone()
    return row is not None


def timescale_available(conn: psycopg.Connection) -> bool:
    """True when the server could load TimescaleDB (installed and preloaded)."""
    row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'").fetchone()
    if row is None:
        return False
    preload = conn.execute("SHOW shared_preload_libraries").fetchone()
    return preload is not None and "timescaledb" in str(preload[0])
