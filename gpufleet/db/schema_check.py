"""Is the database's schema the one this gpufleet needs?  One line saying what to run when it is not.

The CLI, the API (503 body, ``/readyz``) and the collector's start-up log say the same thing, so an
operator pointed at an empty or old database learns the one command to run instead of meeting an
``UndefinedTable`` traceback.
"""

from __future__ import annotations

from functools import cache

import psycopg

UPGRADE = "run `gpufleet db upgrade` with the same database settings"


@cache
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from gpufleet.db.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config("", False)).get_current_head()
    assert head is not None
    return head


def schema_problem(conn: psycopg.Connection) -> str | None:
    """None when the schema is at this gpufleet's head revision; else one line naming the database."""
    name = conn.info.dbname
    if conn.execute("SELECT to_regclass('alembic_version')").fetchone() in (None, (None,)):
        return f"database {name!r} has no gpufleet schema: {UPGRADE}"
    row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    current = row[0] if row else None
    if current != head_revision():
        return (
            f"database {name!r} has gpufleet schema {current or 'none'}, this gpufleet needs "
            f"{head_revision()}: {UPGRADE}"
        )
    return None
