"""One database filled by a simulated fleet, shared by the dashboard and web-view tests.

It is a database of its own on the test server (not the ``db`` fixture's,
which other tests truncate), filled once per session: 15 minutes of the
"demo" scenario ending about now, so "live" views (newest readings, open
runs' accounting up to now) behave as on a running deployment.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from tests.surfaces.fleetdb import FilledFleet, fill
from tests.timescale import timescale_server

FLEET_SECONDS = 900.0


@pytest.fixture(scope="session")
def fleet(pg_server: str, settings: Settings) -> Iterator[FilledFleet]:
    with scratch_database(pg_server, "gpufleet_surfaces") as url:
        migrate.upgrade(url, settings)
        start = math.floor((time.time() - FLEET_SECONDS) / 60.0) * 60.0
        yield fill(url, settings, "demo", FLEET_SECONDS, start_time=start)


@pytest.fixture(scope="session")
def timescale_fleet(settings: Settings) -> Iterator[FilledFleet]:
    """The same fleet on TimescaleDB (hypertables, continuous aggregates), where a server can load it."""
    server = timescale_server()
    with scratch_database(server, "gpufleet_surfaces_ts") as url:
        migrate.upgrade(url, settings)
        start = math.floor((time.time() - FLEET_SECONDS) / 60.0) * 60.0
        filled = fill(url, settings, "demo", FLEET_SECONDS, start_time=start)
        assert filled.backend == "timescaledb"
        yield filled
