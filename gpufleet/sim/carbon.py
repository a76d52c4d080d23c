"""Hourly carbon-intensity series for the scenario's regions.

A grid's intensity swings daily (solar at noon, gas in the evening peak);
a step function per hour with that shape and some noise is enough to make
per-run CO2e depend on *when* a run used its energy, which is what the
accounting must get right.
"""

from __future__ import annotations

import math

from gpufleet.sim.ranges import stream
from gpufleet.sim.scenario import CarbonSpec, Scenario

HOUR_S = 3600.0


def hourly_series(spec: CarbonSpec, seed: int, start: float, end: float) -> list[tuple[float, float]]:
    """``(hour start, g CO2e/kWh)`` from the hour containing ``start`` to the first hour at or after ``end``.

    The value after ``end`` closes the step function, so every hour the trace
    touches has an explicit end.
    """
    rng = stream(seed, "carbon", spec.region)
    first = math.floor(start / HOUR_S) * HOUR_S
    out: list[tuple[float, float]] = []
    t = first
    while True:
        hour = (t / HOUR_S) % 24.0
        daily = math.cos(2.0 * math.pi * (hour - spec.peak_hour_utc) / 24.0)
        noise = float(rng.normal(0.0, spec.noise))
        out.append((t, round(max(1.0, spec.mean_g_per_kwh * (1.0 + spec.daily_swing * daily + noise)), 1)))
        if t >= end:
            return out
        t += HOUR_S


def scenario_series(
    sc: Scenario, seed: int, start: float, end: float
) -> dict[str, list[tuple[float, float]]]:
    return {c.region: hourly_series(c, seed, start, end) for c in sc.carbon}
