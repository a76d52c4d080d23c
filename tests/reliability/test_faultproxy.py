"""The fault proxy in a process of its own (what the soak uses): forwards, refuses, forwards again."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from testsupport.faultproxy import proxy_process


def test_proxy_process_forwards_and_switches_modes(pg_server: str) -> None:
    parts = urlsplit(pg_server)
    with proxy_process(parts.port or 5432) as proxy:
        via = urlunsplit(
            (parts.scheme, f"{parts.username}@127.0.0.1:{proxy.port}", parts.path, parts.query, "")
        )
        conn = psycopg.connect(via, connect_timeout=5, autocommit=True)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.set_mode("refuse")  # resets the open connection too
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(via, connect_timeout=2)
        proxy.set_mode("pass")
        with psycopg.connect(via, connect_timeout=5, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert proxy.reset_all() == 1
