"""Alembic environment: runs on the connection ``gpufleet.db.migrate`` hands in."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from gpufleet.db.schema import BACKEND_INDEXES, STATS_RELATIONS, metadata

config = context.config


def _include(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    # Per-backend relations (continuous aggregates / their plain twins) and
    # TimescaleDB's own objects are not part of the shared metadata.
    # Backend-specific indexes (BRIN on plain PostgreSQL, time indexes of
    # hypertables) are created by the migration, not by the metadata.
    name = name or ""
    if type_ == "table":
        return not (name in STATS_RELATIONS or name.startswith("_"))
    if type_ == "index":
        return name not in BACKEND_INDEXES
    return True


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=pool.NullPool)
        with engine.connect() as connection:
            _run(connection)
    else:
        _run(connection)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_object=_include,
        compare_type=True,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("gpufleet migrations run online only (they inspect the server for TimescaleDB)")
run_migrations_online()
