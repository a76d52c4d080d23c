"""Throwaway databases: replay's default target, and every test's and benchmark's own.

A database is created under a unique name on the given server and dropped
afterwards, so nothing else on that server is touched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

import psycopg
from psycopg import sql

from gpufleet.db.connect import with_database


@contextlib.contextmanager
def scratch_database(server: str, prefix: str = "gpufleet_test") -> Iterator[str]:
    """Create a uniquely named database, yield its URL, drop it afterwards."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
