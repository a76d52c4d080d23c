"""From energy per tariff segment to facility energy, CO2e and cost.

Facility energy of a segment = its IT energy (GPU + host share) × the site's
PUE; CO2e and energy cost apply the intensity and price in force at the
segment's start (a segment has one of each by construction).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.accounting.energy import Sums
from gpufleet.accounting.tariffs import Tariff
from gpufleet.timeparse import iso

J_PER_KWH = 3.6e6


@dataclass
class Bill:
    gpu_kwh: float = 0.0
    host_kwh: float = 0.0
    covered_gpu_s: float = 0.0
    facility_kwh: float = 0.0
    #: CO2e of the facility energy whose intensity is known, kg
    co2e_kg: float = 0.0
    #: facility energy with no known carbon intensity, kWh
    co2e_unknown_kwh: float = 0.0
    energy_cost: float = 0.0
    segments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def it_kwh(self) -> float:
        return self.gpu_kwh + self.host_kwh


def bill(tariff: Tariff, edges: Sequence[datetime], by_segment: Mapping[int, Sums],
         with_segments: bool = False) -> Bill:
    """Sum a group's segments at ``tariff``; ``edges`` are the edges the segments index (1-based)."""
    out = Bill()
    last = len(edges) - 1
    for seg in sorted(set(by_segment) | set(range(1, last + 1))):
        s = by_segment.get(seg, Sums())
        k = min(max(seg, 1), last)  # energy is never dropped, even if a bucket sat on an edge
        start = edges[k - 1]
        gpu_kwh, host_kwh = s.gpu_j / J_PER_KWH, s.host_j / J_PER_KWH
        facility_kwh = (gpu_kwh + host_kwh) * tariff.pue
        g_per_kwh = tariff.carbon_g_per_kwh.at(start)
        price = tariff.price_per_kwh.at(start) or 0.0
        out.gpu_kwh += gpu_kwh
        out.host_kwh += host_kwh
        out.covered_gpu_s += s.gpu_covered_s
        out.facility_kwh += facility_kwh
        out.energy_cost += facility_kwh * price
        if g_per_kwh is None:
            out.co2e_unknown_kwh += facility_kwh
        else:
            out.co2e_kg += facility_kwh * g_per_kwh / 1000.0
        if with_segments:
            out.segments.append({
                "start": iso(start), "end": iso(edges[k]), "gpu_kwh": gpu_kwh, "host_kwh": host_kwh,
                "facility_kwh": facility_kwh, "g_co2e_per_kwh": g_per_kwh, "price_per_kwh": price,
                "co2e_kg": None if g_per_kwh is None else facility_kwh * g_per_kwh / 1000.0,
                "energy_cost": facility_kwh * price,
            })
    return out
