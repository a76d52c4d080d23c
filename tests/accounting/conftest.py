from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest

from gpufleet.accounting import incidents, run_accounting
from tests.accounting.builders import approx, drain

Account = Callable[..., dict[str, Any]]


@pytest.fixture
def account(conn: psycopg.Connection) -> Account:
    """Account a run from raw samples, then from pending data (auto), then from built rollups,
    check that the three agree, and return the raw answer."""

    def go(run_id: str, now: datetime, **kw: Any) -> dict[str, Any]:
        raw = run_accounting(conn, run_id, now=now, source="raw", **kw)
        pending = run_accounting(conn, run_id, now=now, source="auto", **kw)
        drain(conn, kw.get("max_gap_s") or 60.0)
        rolled = run_accounting(conn, run_id, now=now, source="auto", **kw)
        assert raw["source"] == "raw" and rolled["source"] == "rollup"
        for other in (pending, rolled):
            for k in ("gpu_kwh", "host_kwh", "facility_kwh", "co2e_kg", "energy_cost", "coverage"):
                if raw[k] is None:
                    assert other[k] is None, k
                else:
                    assert approx(other[k], raw[k], rel=1e-9, abs_=1e-12), (
                        k,
                        other[k],
                        raw[k],
                        other["source"],
                    )
        return raw

    return go


# The API on loopback with a token per role, shared with tests/api.
from tests.api.conftest import api  # noqa: E402, F401


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many keys each call of the SQL pricing computed (none: every key was kept)."""
    seen: list[int] = []
    real = incidents._priced_rows

    def counted(conn: psycopg.Connection, keyed: Any, *a: Any) -> Any:
        seen.append(len(keyed))
        return real(conn, keyed, *a)

    monkeypatch.setattr(incidents, "_priced_rows", counted)
    return seen
