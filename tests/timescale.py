"""The TimescaleDB server the TimescaleDB-layout tests need, or their skip saying why there is none."""

from __future__ import annotations

import pytest

from testsupport.pg import timescale_server_url

WHY = (
    "no TimescaleDB server: the extension is not on PyPI or Debian, so the TimescaleDB layout is checked "
    "where GPUFLEET_TEST_TIMESCALE_URL names a TimescaleDB 2.x server (tools/timescale-server.sh builds and "
    "starts one from a TimescaleDB source tree); the plain-PostgreSQL layout is tested everywhere"
)


def timescale_server() -> str:
    """The server's URL; skips the calling test when there is none."""
    server = timescale_server_url()
    if server is None:
        pytest.skip(WHY)
    return server
