"""Shared fixtures: a real PostgreSQL database per test session, migrated.

No database is mocked.  ``db_url`` is migrated once per session; ``db`` gives
a test a clean slate by emptying the data tables it wrote (much faster than
re-migrating or truncating every table), keeping the schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gpufleet.config import Settings, load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from testsupport.cleanslate import Slate
from testsupport.pg import server_url

REALDATA = Path(__file__).resolve().parent / "fixtures" / "realdata"

DATA_TABLES = (
    "gpu_samples",
    "host_samples",
    "gpu_energy_1m",
    "gpu_energy_1h",
    "gpu_energy_spans",
    "host_energy_1m",
    "host_energy_1h",
    "node_activity_1m",
    "node_activity_1h",
    "ingest_batches",
    "rollup_queue",
    "incidents",
    "run_progress",
    "run_allocations",
    "run_sightings",
    "runs",
    "nodes",
    "site_settings",
    "sites",
    "carbon_intensity",
    "carbon_regions",
    "agent_tokens",
    "sweep_snapshots",
    "sweep_snapshot_state",
    "remote_write_parts",
    "run_metrics_snapshot",
    "node_quarantine",
    "quarantine_log",
    "priced_pieces",
    "kept_claims",
    "kept_power_points",
    "kept_power_minutes",
    "fleet_hour_lines",
    "fleet_hours_kept",
    "pricing_marks",
)


#: Shared fixtures each worker makes cheaply for itself: a database of its own, settings, a cache.
PER_WORKER = frozenset({"pg_server", "settings", "db_url", "trace"})
_WIDTH = {"session": 3, "package": 2, "module": 1}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests sharing a costly module- or session-wide fixture run on one worker (``--dist loadgroup``).

    Parallel workers each make their own copy of a shared fixture; for a filled fleet or a module's
    simulated bundles that is minutes of work repeated, so such tests are grouped by the widest such
    fixture they use and one worker makes it once.  A fixture named with a leading underscore is a
    module's setup or report hook, not a shared result, and groups nothing.
    """
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = [
            (-_WIDTH[d[-1].scope], f"{d[-1].baseid}::{name}")
            for name, d in info.name2fixturedefs.items()
            if d
            and d[-1].scope in _WIDTH
            and name not in PER_WORKER
            and not name.startswith("_")
            and str(d[-1].baseid).startswith("tests")
        ]
        if shared:
            item.add_marker(pytest.mark.xdist_group(min(shared)[1]))


def realdata(*parts: str) -> Path:
    """Path of a real capture committed under tests/fixtures/realdata (provenance in its SOURCES.md).

    A missing file fails the test: a capture that is not there is a broken
    checkout, never a reason to run fewer checks.
    """
    path = REALDATA.joinpath(*parts)
    assert path.exists(), f"real capture missing: {path} (see tests/fixtures/realdata/SOURCES.md)"
    return path


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> str:
    return server_url(tmp_path_factory.mktemp("pg") / "data")


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return load_settings(data_dir=tmp_path_factory.mktemp("gpufleet"))


@pytest.fixture(scope="session")
def db_url(pg_server: str, settings: Settings) -> Iterator[str]:
    with scratch_database(pg_server) as url:
        migrate.upgrade(url, settings)
        yield url


#: Per-minute stats: plain tables on PostgreSQL, continuous aggregates (not emptied here) on TimescaleDB.
STATS_TABLES = ("gpu_stats_1m", "host_stats_1m")

_SLATES: dict[str, Slate] = {}


def truncate_all(url: str) -> None:
    """Empty the data tables (and every table referencing them) and restart their sequences."""
    with psycopg.connect(url, autocommit=True) as conn:
        slate = _SLATES.get(url)
        if slate is None:
            slate = _SLATES[url] = Slate.of(conn, DATA_TABLES + STATS_TABLES)
        slate.empty(conn)


@pytest.fixture
def db(db_url: str) -> str:
    """A migrated database with empty data tables."""
    truncate_all(db_url)
    return db_url


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as c:
        yield c
