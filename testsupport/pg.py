"""Find a real PostgreSQL for tests and benchmarks, and make throwaway databases.

Order: ``GPUFLEET_TEST_DATABASE_URL``; the machine's server on
127.0.0.1:5432 when it answers; else the embedded server in a data directory
of its own.  Each caller gets a database of its own, created here and dropped
afterwards (:func:`gpufleet.db.scratch.scratch_database`), so no other
database on the server is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def server_url(embedded_dir: Path | None = None) -> str:
    """A maintenance-database URL of a reachable server."""
    env = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if env:
        return env
    if _answers(LOCAL_URL):
        return LOCAL_URL
    from gpufleet.db.embedded import start_embedded

    return start_embedded(embedded_dir or Path(os.environ.get("GPUFLEET_TEST_PGDATA", ".gpufleet/test-pg")))


def timescale_server_url() -> str | None:
    """A server that can load TimescaleDB, if one is configured or the main one can."""
    env = os.environ.get("GPUFLEET_TEST_TIMESCALE_URL")
    if env:
        return env if _answers(env) else None
    url = server_url()
    from gpufleet.db.connect import timescale_available

    with psycopg.connect(url, autocommit=True) as conn:
        return url if timescale_available(conn) else None
