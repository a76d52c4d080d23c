"""Run the Alembic migrations programmatically (``gpufleet db upgrade``).

The migrations decide per server whether to build the TimescaleDB layout
(hypertables, compression, continuous aggregates) or the plain-PostgreSQL one;
the choice is passed in the Alembic config and recorded in ``gpufleet_meta``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, pool

from gpufleet import migrations
from gpufleet.config import Settings
from gpufleet.db.connect import sqlalchemy_url, timescale_available

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config(url: str, timescale: bool) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    cfg.attributes["timescale"] = timescale
    return cfg


def want_timescale(url: str, mode: str) -> bool:
    """Resolve ``storage.timescale`` (auto/on/off) against the server."""
    if mode == "off":
        return False
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        available = timescale_available(conn)
    if mode == "on" and not available:
        raise RuntimeError(
            "storage.timescale is 'on' but the server cannot load TimescaleDB "
            "(extension missing or not in shared_preload_libraries)"
        )
    return available


def _run(url: str, timescale: bool, fn: Any, *args: str) -> None:
    cfg = alembic_config(url, timescale)
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        fn(cfg, *args)
        conn.commit()
    engine.dispose()


def upgrade(url: str, settings: Settings, revision: str = "head") -> bool:
    """Upgrade to ``revision``, then apply retention/compression policies.

    Returns True when the TimescaleDB layout is in use.
    """
    from gpufleet.db.policies import apply_policies, backend_of

    ts = want_timescale(url, settings.storage.timescale)
    _run(url, ts, command.upgrade, revision)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if backend_of(conn) is not None:
            apply_policies(conn, settings)
        return backend_of(conn) == "timescaledb"


def downgrade(url: str, revision: str = "base") -> None:
    _run(url, False, command.downgrade, revision)


def current(url: str) -> str | None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('alembic_version')").fetchone()
        if not exists or exists[0] is None:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return row[0] if row else None
