"""An independent computation of accounting, written from docs/contracts.md section 3 alone.

It reads the database's tables (samples, runs, allocations, nodes, sites, dated
site settings, carbon series) and integrates in plain Python, in its own way:
every interval of every GPU is walked and cut at every time where something
changes (a run's start or end, a setting's change, a carbon step).  It shares
no code with ``gpufleet.accounting`` or the database functions, so tests can
hold the product to it, field by field.

The rules it follows are the contract's and the documented extensions:

- an interval is a pair of consecutive whole-GPU samples; its energy is the
  ``energy_mj`` counter difference when both ends have one and it neither went
  backwards nor jumped further than a GPU can draw over the interval (10 kW,
  a glitch), else trapezoidal ``power_w`` when the interval is at most
  ``max_gap_s``; otherwise it is not counted (coverage); energy is spread
  evenly over the interval;
- host energy: trapezoidal ``host_power_w`` (same gap rule) times the share of
  the node's GPUs the run held (shares held ÷ GPUs the node reports, at most 1);
- facility energy = IT energy × the PUE in force; CO2e = facility energy × the
  intensity in force (the region's last point at or before, else the site's
  constant, else the region's first point); energy cost = facility energy × the
  energy price in force; compute cost = GPU-hours × the GPU-hour price in force
  (the longest model key of the site contained in the GPU's model name while it
  has a value, else the site's default); a run without a site: PUE 1, prices 0,
  CO2e unknown;
- money is exact (the product carries it to 1e-9; rounding to minor units is
  presentation, which this module does not model);
- the fleet counts a GPU from when it joined (its node's registration, its
  first sample, the first run that held it) until it left: a day after the
  last of those (its last sample, the end of the last run that held it, up to
  now) once that day has passed;
- with declared sharing a GPU's energy and hours count with the run's share;
  the fleet total prices each share at the site of whoever held it (the node's
  site for the part no run held).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg

J_PER_KWH = 3.6e6
#: The most one GPU can draw, W (contracts.md section 3: a counter jump above it over an interval is a glitch).
GPU_CEILING_W = 10_000.0
INF = datetime.max.replace(tzinfo=UTC)
NEG_INF = datetime.min.replace(tzinfo=UTC)
DEFAULTS = {
    "pue": 1.0,
    "price_per_kwh": 0.0,
    "gpu_hour_price": 0.0,
    "carbon_region": None,
    "carbon_g_per_kwh": None,
}


def cents(x: float, places: int = 2) -> float:
    return float(Decimal(repr(x)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))


@dataclass
class Interval:
    t0: datetime
    t1: datetime
    joules: float | None  # None: not counted

    @property
    def dt(self) -> float:
        return (self.t1 - self.t0).total_seconds()


@dataclass
class Figures:
    gpu_s: float = 0.0
    covered_s: float = 0.0
    gpu_j: float = 0.0
    host_j: float = 0.0
    facility_kwh: float = 0.0
    co2e_kg: float = 0.0
    co2e_known: bool = False
    energy_cost: float = 0.0
    compute_cost: float = 0.0
    by_site_energy_cost: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def gpu_kwh(self) -> float:
        return self.gpu_j / J_PER_KWH

    @property
    def host_kwh(self) -> float:
        return self.host_j / J_PER_KWH


def _intervals(
    samples: list[tuple[datetime, float | None, float | None]], max_gap_s: float
) -> list[Interval]:
    """Consecutive sample pairs with their energy by the contract (counter first, else power within the gap)."""
    out = []
    for (t0, e0, p0), (t1, e1, p1) in itertools.pairwise(samples):
        if t1 <= t0:
            continue
        dt = (t1 - t0).total_seconds()
        j: float | None = None
        if e0 is not None and e1 is not None and e1 >= e0 and (e1 - e0) / 1000.0 <= GPU_CEILING_W * dt:
            j = (e1 - e0) / 1000.0
        elif p0 is not None and p1 is not None and dt <= max_gap_s:
            j = (p0 + p1) / 2.0 * dt
        out.append(Interval(t0, t1, j))
    return out


class Fleet:
    """Everything in the database, read once."""

    def __init__(self, conn: psycopg.Connection, max_gap_s: float = 60.0) -> None:
        self.max_gap_s = max_gap_s
        gpu_rows: dict[tuple[str, int], list[tuple[datetime, float | None, float | None]]] = defaultdict(list)
        for node, gpu, t, e, p in conn.execute(
            "SELECT node, gpu, time, energy_mj, power_w FROM gpu_samples WHERE mig_instance IS NULL "
            "ORDER BY node, gpu, time"
        ):
            gpu_rows[(node, int(gpu))].append(
                (t, None if e is None else float(e), None if p is None else float(p))
            )
        self.gpu_intervals = {k: _intervals(v, max_gap_s) for k, v in gpu_rows.items()}
        host_rows: dict[str, list[tuple[datetime, float | None, float | None]]] = defaultdict(list)
        for node, t, p in conn.execute(
            "SELECT node, time, host_power_w FROM host_samples ORDER BY node, time"
        ):
            host_rows[node].append((t, None, None if p is None else float(p)))
        self.host_intervals = {k: _intervals(v, max_gap_s) for k, v in host_rows.items()}
        self.runs = {
            r[0]: {"site": r[1], "start": r[2], "end": r[3]}
            for r in conn.execute('SELECT run_id, site, start, "end" FROM runs')
        }
        self.allocations: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
        for run_id, node, gpu, share in conn.execute("SELECT run_id, node, gpu, share FROM run_allocations"):
            self.allocations[run_id].append((node, int(gpu), float(share)))
        self.nodes = {
            n: {"site": s, "gpu_count": c, "facts": f or {}, "first_seen": fs}
            for n, s, c, f, fs in conn.execute("SELECT node, site, gpu_count, facts, first_seen FROM nodes")
        }
        self.sample_times: dict[tuple[str, int], tuple[datetime, datetime]] = {}
        for node, gpu, t0, t1 in conn.execute(
            "SELECT node, gpu, min(time), max(time) FROM gpu_samples GROUP BY node, gpu"
        ):
            self.sample_times[(node, int(gpu))] = (t0, t1)
        self.currency = dict(conn.execute("SELECT site, currency FROM sites").fetchall())
        self.settings: dict[tuple[str, str, str], list[tuple[datetime, Any]]] = defaultdict(list)
        self._times: dict[Any, list[datetime]] = {}
        for site, setting, model, vf_inf, vf, num, txt in conn.execute(
            "SELECT site, setting, gpu_model, valid_from = '-infinity', CASE WHEN valid_from > '-infinity' "
            "THEN valid_from END, num, txt FROM site_settings ORDER BY site, setting, gpu_model, valid_from"
        ):
            self.settings[(site, setting, model)].append(
                (NEG_INF if vf_inf else vf, txt if setting == "carbon_region" else num)
            )
        self.carbon: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
        for region, t, g in conn.execute(
            "SELECT region, time, g_co2e_per_kwh FROM carbon_intensity ORDER BY 1, 2"
        ):
            self.carbon[region].append((t, float(g)))

    # ------------------------------------------------------------------ what is in force

    def setting(self, site: str | None, name: str, t: datetime, model: str = "") -> Any:
        if site is None:
            return DEFAULTS[name]
        points = self.settings.get((site, name, model), [])
        i = bisect.bisect_right(self._times_of((site, name, model), points), t) - 1
        if i < 0:
            return DEFAULTS[name] if not model else None
        return points[i][1]

    def intensity(self, site: str | None, t: datetime) -> float | None:
        if site is None:
            return None
        region = self.setting(site, "carbon_region", t)
        constant = self.setting(site, "carbon_g_per_kwh", t)
        points = self.carbon.get(region or "", [])
        i = bisect.bisect_right(self._times_of(("carbon", region), points), t) - 1
        if i >= 0:
            return points[i][1]
        if constant is not None:
            return constant
        return points[0][1] if points else None

    def _times_of(self, key: Any, points: list[tuple[datetime, Any]]) -> list[datetime]:
        if key not in self._times:
            self._times[key] = [p[0] for p in points]
        return self._times[key]

    def model_of(self, node: str, gpu: int) -> str | None:
        facts = self.nodes.get(node, {}).get("facts") or {}
        name = None
        for e in facts.get("gpus") or []:
            if isinstance(e, dict) and str(e.get("gpu", e.get("index"))) == str(gpu) and e.get("name"):
                name = e["name"]
        return name or facts.get("gpu_model") or None

    def gpu_hour_price(self, site: str | None, model: str | None, t: datetime) -> float:
        if site is None:
            return 0.0
        keys = sorted(
            {m for (s, n, m) in self.settings if s == site and n == "gpu_hour_price" and m},
            key=lambda k: (-len(k), k),
        )
        key = next((k for k in keys if model and k.lower() in model.lower()), None)
        if key is not None:
            v = self.setting(site, "gpu_hour_price", t, key)
            if v is not None:
                return float(v)
        return float(self.setting(site, "gpu_hour_price", t) or 0.0)

    def breakpoints(self, sites: Iterable[str | None]) -> list[datetime]:
        """Every time a price, PUE, region, constant or carbon step changes at these sites."""
        out: set[datetime] = set()
        for site in sites:
            if site is None:
                continue
            for (s, _, _), points in self.settings.items():
                if s == site:
                    out.update(t for t, _ in points if t != NEG_INF)
            for region_points in self.carbon.values():
                out.update(t for t, _ in region_points)
        return sorted(out)

    def reported(self, node: str, lo: datetime, hi: datetime) -> int:
        count = self.nodes.get(node, {}).get("gpu_count")
        if count:
            return int(count)
        return len(
            {
                g
                for (n, g), iv in self.gpu_intervals.items()
                if n == node and any(i.t1 > lo and i.t0 < hi for i in iv)
            }
        )

    # ------------------------------------------------------------------ integration

    def _energy(
        self, intervals: list[Interval], lo: datetime, hi: datetime, cuts: list[datetime]
    ) -> list[tuple[datetime, float, float]]:
        """(part start, joules, covered seconds) of every counted interval's part in [lo, hi), cut at ``cuts``."""
        out = []
        for iv in intervals:
            a, b = max(iv.t0, lo), min(iv.t1, hi)
            if b <= a or iv.joules is None:
                continue
            edges = [a, *cuts[bisect.bisect_right(cuts, a) : bisect.bisect_left(cuts, b)], b]
            for x, y in itertools.pairwise(edges):
                s = (y - x).total_seconds()
                out.append((x, iv.joules * s / iv.dt, s))
        return out

    def _price(self, f: Figures, site: str | None, t: datetime, it_j: float, weight: float) -> None:
        pue = float(self.setting(site, "pue", t))
        fac = it_j * weight / J_PER_KWH * pue
        f.facility_kwh += fac
        price = float(self.setting(site, "price_per_kwh", t) or 0.0)
        f.energy_cost += fac * price
        f.by_site_energy_cost[site] += fac * price
        g = self.intensity(site, t)
        if g is not None:
            f.co2e_kg += fac * g / 1000.0
            f.co2e_known = True

    def run_window(
        self, run_id: str, now: datetime, since: datetime | None = None, until: datetime | None = None
    ) -> tuple[datetime, datetime]:
        r = self.runs[run_id]
        lo = max(r["start"], since) if since else r["start"]
        hi = min(r["end"] or now, now, until or INF)
        return lo, max(lo, hi)

    def run(
        self, run_id: str, now: datetime, since: datetime | None = None, until: datetime | None = None
    ) -> Figures:
        """One run's figures over its window clipped to [since, until) and now."""
        lo, hi = self.run_window(run_id, now, since, until)
        site = self.runs[run_id]["site"]
        f = Figures()
        # no energy at a site of known intensity: 0 kg, known (null only where the intensity is unknown)
        f.co2e_known = self.intensity(site, lo) is not None
        if hi <= lo:
            return f
        cuts = self.breakpoints([site])
        held: dict[str, float] = defaultdict(float)
        for node, gpu, share in self.allocations[run_id]:
            held[node] += share
            f.gpu_s += share * (hi - lo).total_seconds()
            for t, j, s in self._energy(self.gpu_intervals.get((node, gpu), []), lo, hi, cuts):
                f.gpu_j += share * j
                f.covered_s += share * s
                self._price(f, site, t, j, share)
            model = self.model_of(node, gpu)
            price_cuts = [lo, *[c for c in cuts if lo < c < hi], hi]
            for x, y in itertools.pairwise(price_cuts):
                f.compute_cost += (
                    share * (y - x).total_seconds() / 3600.0 * self.gpu_hour_price(site, model, x)
                )
        for node, h in held.items():
            w = h / max(self.reported(node, lo, hi), h)
            for t, j, _ in self._energy(self.host_intervals.get(node, []), lo, hi, cuts):
                f.host_j += w * j
                self._price(f, site, t, j, w)
        return f

    def membership(
        self, node: str, gpu: int, now: datetime, gone_after_s: float = 86400.0
    ) -> tuple[datetime, datetime] | None:
        """[joined, left) of a GPU in the fleet (left: INF while it has not)."""
        joined: list[datetime] = []
        last: list[datetime] = []
        first_seen = self.nodes.get(node, {}).get("first_seen")
        if first_seen is not None:
            joined.append(first_seen)
            last.append(first_seen)
        if (node, gpu) in self.sample_times:
            a, b = self.sample_times[(node, gpu)]
            joined.append(a)
            last.append(b)
        for run_id, allocs in self.allocations.items():
            if any(n == node and g == gpu for n, g, _ in allocs):
                r = self.runs[run_id]
                joined.append(r["start"])
                last.append(max(r["start"], min(r["end"] or now, now)))
        if not joined:
            return None
        gone = max(last) + timedelta(seconds=gone_after_s)
        return min(joined), (gone if gone < now else INF)

    def fleet(self, lo: datetime, hi: datetime, now: datetime) -> Figures:
        """Every GPU and host over [lo, min(hi, now)), each share priced at the site of whoever held it."""
        hi = max(lo, min(hi, now))
        f = Figures()
        runs = {
            r: self.run_window(r, now, lo, hi)
            for r, v in self.runs.items()
            if v["start"] < hi and (v["end"] is None or v["end"] > lo)
        }
        holders: dict[tuple[str, int], list[tuple[datetime, datetime, float, str | None]]] = defaultdict(list)
        for r, (a, b) in runs.items():
            if a < b:
                for node, gpu, share in self.allocations[r]:
                    holders[(node, gpu)].append((a, b, share, self.runs[r]["site"]))
        gpus = set(holders)
        for node, info in self.nodes.items():
            gpus.update((node, g) for g in range(info["gpu_count"] or 0))
        gpus.update(k for k, iv in self.gpu_intervals.items() if any(i.t1 > lo and i.t0 < hi for i in iv))
        nodes = {n for n, _ in gpus} | {
            n for n, iv in self.host_intervals.items() if any(i.t1 > lo and i.t0 < hi for i in iv)
        }
        all_sites = {v["site"] for v in self.runs.values()} | {v["site"] for v in self.nodes.values()}
        cuts = self.breakpoints(all_sites)
        for node, gpu in gpus:
            member = self.membership(node, gpu, now)
            if member is not None:
                f.gpu_s += max((min(hi, member[1]) - max(lo, member[0])).total_seconds(), 0.0)
            hs = holders.get((node, gpu), [])
            node_site = self.nodes.get(node, {}).get("site")
            for t, j, s in self._energy(
                self.gpu_intervals.get((node, gpu), []),
                lo,
                hi,
                sorted({*cuts, *(x for a, b, _, _ in hs for x in (a, b))}),
            ):
                f.gpu_j += j
                f.covered_s += s
                mix = [(share, site) for a, b, share, site in hs if a <= t < b]
                held = sum(w for w, _ in mix)
                for w, site in mix:
                    self._price(f, site, t, j, w / max(1.0, held))
                if held < 1.0:
                    self._price(f, node_site, t, j, 1.0 - held)
        for node in nodes:
            node_site = self.nodes.get(node, {}).get("site")
            hs = [
                (a, b, share, site, g)
                for (n, g), lst in holders.items()
                if n == node
                for a, b, share, site in lst
            ]
            reported = self.reported(node, lo, hi)
            for t, j, _ in self._energy(
                self.host_intervals.get(node, []),
                lo,
                hi,
                sorted({*cuts, *(x for a, b, _, _, _ in hs for x in (a, b))}),
            ):
                f.host_j += j
                mix: dict[str | None, float] = defaultdict(float)
                for a, b, share, site, _ in hs:
                    if a <= t < b:
                        mix[site] += share
                held = sum(mix.values())
                total = max(reported, held)
                for site, h in mix.items():
                    self._price(f, site, t, j, h / total)
                free = 1.0 if total == 0 else (total - held) / total
                if free > 0:
                    self._price(f, node_site, t, j, free)
        for r in runs:
            f.compute_cost += self.run(r, now, lo, hi).compute_cost
        return f


def money_of(f: Figures) -> float:
    """A run's total cost: energy and compute, exact."""
    return f.energy_cost + f.compute_cost


def near(a: float, b: float, rel: float, abs_: float = 1e-9) -> bool:
    return abs(a - b) <= max(rel * abs(b), abs_)


__all__ = ["Figures", "Fleet", "cents", "money_of", "near", "timedelta"]
