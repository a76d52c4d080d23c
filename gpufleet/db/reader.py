"""The read-only role Grafana's data source logs in as, set up as the panels are built and measured.

Grafana runs each panel's SQL as written, outside the API, so what the API sets per snapshot (a
read-only transaction, JIT off: :mod:`gpufleet.accounting.snapshot`) has to live on the role:

* ``default_transaction_read_only``: a panel, or anyone holding the data source's password, can
  read and never write;
* ``jit = off``: PostgreSQL compiles a statement whose estimated cost passes ``jit_above_cost``
  (100,000).  The fleet board's panels estimate hundreds of thousands to millions (every GPU-minute
  of their range, of which the indexes read a part), so each refresh compiled code it did not need:
  128 ms of the "GPU states" panel's 2.1 s at 24 h on 10,000 GPUs, 15 ms of the node heatmap's 0.9 s
  (``EXPLAIN ANALYZE`` with JIT on and off; ``docs/capacity.md``).  ``bench/read_side.py`` times the
  panels as this role.

``gpufleet db reader NAME`` and the demo's reader (:mod:`gpufleet.sim.demo`) call
:func:`ensure_reader`.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

#: What the role's sessions start with (``ALTER ROLE ... SET``): the settings above.
SETTINGS: tuple[tuple[str, str], ...] = (("default_transaction_read_only", "on"), ("jit", "off"))


def ensure_reader(url: str, role: str, password: str | None = None) -> None:
    """Create login role ``role`` if missing (with ``password``, when given), give it :data:`SETTINGS`,
    and let it read every table of the database at ``url``, present and future, and nothing more."""
    with psycopg.connect(url, autocommit=True) as conn:
        dbname = conn.info.dbname
        name = sql.Identifier(role)
        conn.execute(
            sql.SQL(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {}) THEN "
                "CREATE ROLE {} LOGIN; END IF; END $$"
            ).format(sql.Literal(role), name)
        )
        if password is not None:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(name, sql.Literal(password)))
        for setting, value in SETTINGS:
            conn.execute(
                sql.SQL("ALTER ROLE {} SET {} = {}").format(name, sql.Identifier(setting), sql.Literal(value))
            )
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(dbname), name))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(name))
        conn.execute(
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {}").format(name)
        )
