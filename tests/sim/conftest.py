"""Shared, cached simulations: each scenario is simulated once per test session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpufleet.sim import Fleet, Trace, record

_CACHE: dict[tuple[str, float | None, int | None], Trace] = {}


@pytest.fixture(scope="session")
def trace() -> Callable[..., Trace]:
    """``trace(name, duration_s=None, seed=None)``: the recorded scenario, simulated once."""

    def get(name: str, duration_s: float | None = None, seed: int | None = None) -> Trace:
        key = (name, duration_s, seed)
        if key not in _CACHE:
            _CACHE[key] = record(Fleet.from_scenario(name, seed=seed), duration_s)
        return _CACHE[key]

    return get
