"""Fleet view: runs grouped by site, team or run, the GPUs no run held, and the fleet total.

Three independent computations over one period [since, until) (clipped to
now): the runs (each run's own accounting clipped to the period, as in the
finance report), the unallocated part (each GPU's time outside every run
that held it, and each node's host energy times the share of its GPUs no run
held), and the fleet total (every GPU and host over the whole period).  They
agree, runs + unallocated = total, when no GPU is held by two runs at once
and no node has more GPUs held than it reports; the test suite checks it.

Runs are priced at their own site; unallocated and total energy at the site
of the node (``nodes.site``).  Costs are kept per currency: a block whose
parts use more than one currency reports its costs in ``costs_by_currency``
only (the single-currency fields are then null).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any, Literal

import psycopg

from gpufleet.accounting.bill import Bill, bill
from gpufleet.accounting.energy import GpuClaim, HostClaim, Source, measure
from gpufleet.accounting.nodes import node_gpu_counts
from gpufleet.accounting.run import account_runs, load_runs, run_window
from gpufleet.accounting.snapshot import snapshot
from gpufleet.accounting.tariffs import Tariff, load_tariff
from gpufleet.accounting.timegrid import HOUR_US, floor_to
from gpufleet.config import AccountingSettings
from gpufleet.timeparse import iso

GroupBy = Literal["site", "team", "run"]
GROUP_BY: tuple[GroupBy, ...] = ("site", "team", "run")


@dataclass
class Block:
    """Summable totals of a set of runs or GPUs."""

    runs: int = 0
    gpu_s: float = 0.0
    covered_gpu_s: float = 0.0
    gpu_kwh: float = 0.0
    host_kwh: float = 0.0
    facility_kwh: float = 0.0
    co2e_kg: float = 0.0
    co2e_unknown_kwh: float = 0.0
    costs: dict[str, list[float]] = field(default_factory=dict)  # currency -> [energy, compute]

    def add_cost(self, currency: str | None, energy: float, compute: float) -> None:
        if currency is None:
            return  # no site: prices are 0
        c = self.costs.setdefault(currency, [0.0, 0.0])
        c[0] += energy
        c[1] += compute

    def add_bill(self, b: Bill, tariff: Tariff, gpu_s: float) -> None:
        self.gpu_s += gpu_s
        self.covered_gpu_s += b.covered_gpu_s
        self.gpu_kwh += b.gpu_kwh
        self.host_kwh += b.host_kwh
        self.facility_kwh += b.facility_kwh
        self.co2e_kg += b.co2e_kg
        self.co2e_unknown_kwh += b.co2e_unknown_kwh
        self.add_cost(tariff.currency, b.energy_cost, 0.0)

    def add_run(self, body: Mapping[str, Any]) -> None:
        gpu_s = body["gpu_hours"] * 3600.0
        self.runs += 1
        self.gpu_s += gpu_s
        self.covered_gpu_s += body["coverage"] * gpu_s
        self.gpu_kwh += body["gpu_kwh"]
        self.host_kwh += body["host_kwh"]
        self.facility_kwh += body["facility_kwh"]
        if body["co2e_kg"] is None:
            self.co2e_unknown_kwh += body["facility_kwh"]
        else:
            self.co2e_kg += body["co2e_kg"]
        self.add_cost(body["currency"], body["energy_cost"], body["compute_cost"])

    def merge(self, other: Block) -> None:
        for name in ("runs", "gpu_s", "covered_gpu_s", "gpu_kwh", "host_kwh", "facility_kwh", "co2e_kg",
                     "co2e_unknown_kwh"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for cur, (e, c) in other.costs.items():
            self.add_cost(cur, e, c)

    def body(self) -> dict[str, Any]:
        single = next(iter(self.costs)) if len(self.costs) == 1 else None
        energy, compute = self.costs[single] if single else (0.0, 0.0) if not self.costs else (None, None)
        return {
            "runs": self.runs,
            "gpu_hours": self.gpu_s / 3600.0,
            "gpu_kwh": self.gpu_kwh,
            "host_kwh": self.host_kwh,
            "it_kwh": self.gpu_kwh + self.host_kwh,
            "facility_kwh": self.facility_kwh,
            "co2e_kg": self.co2e_kg,
            "co2e_unknown_kwh": self.co2e_unknown_kwh,
            "energy_cost": energy,
            "compute_cost": compute,
            "total_cost": None if energy is None or compute is None else energy + compute,
            "currency": single,
            "costs_by_currency": {cur: {"energy_cost": e, "compute_cost": c, "total_cost": e + c}
                                  for cur, (e, c) in sorted(self.costs.items())},
            "coverage": min(self.covered_gpu_s / self.gpu_s, 1.0) if self.gpu_s > 0 else 0.0,
        }


def _complement(lo: datetime, hi: datetime, held: Iterable[tuple[datetime, datetime]]
                ) -> list[tuple[datetime, datetime]]:
    """Parts of [lo, hi) outside every held range."""
    out, t = [], lo
    for a, b in sorted(held):
        if a > t:
            out.append((t, min(a, hi)))
        t = max(t, b)
        if t >= hi:
            break
    if t < hi:
        out.append((t, hi))
    return [(a, b) for a, b in out if a < b]


def _fleet_gpus(conn: psycopg.Connection, lo: datetime, hi: datetime, source: Source,
                allocations: Iterable[tuple[str, int]]) -> tuple[set[tuple[str, int]], dict[str, str | None]]:
    """Every GPU of the fleet in the period (reported counts, allocations, rollups; raw samples
    when answering from raw) and every node's site."""
    sites: dict[str, str | None] = {}
    gpus: set[tuple[str, int]] = set(allocations)
    for node, site, count in conn.execute("SELECT node, site, gpu_count FROM nodes").fetchall():
        sites[node] = site
        gpus.update((node, g) for g in range(count or 0))
    sql = "SELECT DISTINCT node, gpu FROM gpu_energy_1h WHERE bucket >= %s AND bucket < %s"
    gpus.update((n, int(g)) for n, g in conn.execute(sql, (floor_to(lo, HOUR_US), hi)).fetchall())
    # a GPU whose only energy in the period is a long counter interval has no rollup bucket there
    sql = "SELECT DISTINCT node, gpu FROM gpu_energy_spans WHERE t0 < %s AND t1 > %s"
    gpus.update((n, int(g)) for n, g in conn.execute(sql, (hi, lo)).fetchall())
    if source == "raw":
        sql = "SELECT DISTINCT node, gpu FROM gpu_samples WHERE time >= %s AND time < %s AND mig_instance IS NULL"
        gpus.update((n, int(g)) for n, g in conn.execute(sql, (lo, hi)).fetchall())
    hosts = "SELECT DISTINCT node FROM host_energy_1h WHERE bucket >= %s AND bucket < %s"
    nodes = {n for n, _ in gpus} | {n for (n,) in conn.execute(hosts, (floor_to(lo, HOUR_US), hi)).fetchall()}
    for n in nodes:
        sites.setdefault(n, None)
    return gpus, sites


def _node_claims(lo: datetime, hi: datetime, gpus: set[tuple[str, int]], held: Mapping[tuple[str, int], list],
                 reported: Mapping[str, int], nodes: Iterable[str]
                 ) -> tuple[list[GpuClaim], list[HostClaim], float]:
    """Claims of the unallocated and total groups, and the unallocated GPU-seconds."""
    gpu_claims: list[GpuClaim] = []
    host_claims: list[HostClaim] = []
    idle_s = 0.0
    for node, gpu in sorted(gpus):
        gpu_claims.append(GpuClaim("total", node, gpu, lo, hi))
        for a, b in _complement(lo, hi, held.get((node, gpu), [])):
            gpu_claims.append(GpuClaim("unallocated", node, gpu, a, b))
            idle_s += (b - a).total_seconds()
    by_node: dict[str, list[tuple[int, datetime, datetime]]] = defaultdict(list)
    for (n, g), rs in held.items():
        by_node[n] += [(g, a, b) for a, b in rs]
    for node in sorted(nodes):
        host_claims.append(HostClaim("total", node, lo, hi, 1.0))
        ranges = by_node.get(node, [])
        cuts = sorted({lo, hi} | {t for _, a, b in ranges for t in (a, b) if lo < t < hi})
        for a, b in pairwise(cuts):
            n_held = len({g for g, ra, rb in ranges if ra <= a and rb >= b})
            total = max(reported.get(node, 0), n_held)
            share = 1.0 if total == 0 else (total - n_held) / total
            host_claims.append(HostClaim("unallocated", node, a, b, share))
    return gpu_claims, host_claims, idle_s


def fleet_accounting(conn: psycopg.Connection, since: datetime, until: datetime, *, group_by: GroupBy = "site",
                     now: datetime | None = None, max_gap_s: float | None = None,
                     source: Source = "auto") -> dict[str, Any]:
    """The body of ``GET /v1/accounting``."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    lo = since
    hi = max(lo, min(until, now))
    with snapshot(conn):
        runs = load_runs(conn, since=lo, until=hi)
        bodies = account_runs(conn, runs, now=now, max_gap_s=gap, source=source, since=lo, until=hi)
        held: dict[tuple[str, int], list[tuple[datetime, datetime]]] = defaultdict(list)
        for run in runs:
            rlo, rhi = run_window(run, now, lo, hi)
            for a in run["allocations"]:
                if rlo < rhi:
                    held[a].append((rlo, rhi))
        gpus, node_sites = _fleet_gpus(conn, lo, hi, source, held)
        reported = node_gpu_counts(conn, node_sites, lo, hi)
        gpu_claims, host_claims, idle_s = _node_claims(lo, hi, gpus, held, reported, node_sites)
        blocks = {"unallocated": Block(), "total": Block()}
        sources = {b["source"] for b in bodies}
        by_site: dict[str | None, tuple[list[GpuClaim], list[HostClaim]]] = defaultdict(lambda: ([], []))
        for c in gpu_claims:
            by_site[node_sites.get(c.node)][0].append(c)
        for h in host_claims:
            by_site[node_sites.get(h.node)][1].append(h)
        for site, (gc, hc) in sorted(by_site.items(), key=lambda kv: kv[0] or ""):
            tariff = load_tariff(conn, site, lo, hi)
            edges = tariff.edges(lo, hi)
            if hi <= lo:
                continue
            measured = measure(conn, edges, gc, hc, max_gap_s=gap, source=source)
            sources.add(measured.source)
            for group in blocks:
                segs = {seg: s for (g, seg), s in measured.sums.items() if g == group}
                blocks[group].add_bill(bill(tariff, edges, segs), tariff, 0.0)
    window_s = (hi - lo).total_seconds()
    blocks["unallocated"].gpu_s = idle_s
    blocks["total"].gpu_s = len(gpus) * window_s
    groups: dict[str | None, Block] = defaultdict(Block)
    allocated = Block()
    key = {"site": "site", "team": "team", "run": "run_id"}[group_by]
    for b in bodies:
        groups[b[key]].add_run(b)
        allocated.add_run(b)
    for b in bodies:
        blocks["total"].add_cost(b["currency"], 0.0, b["compute_cost"])
    return {
        "from": iso(since),
        "to": iso(until),
        "window_end": iso(hi),
        "group_by": group_by,
        "source": sources.pop() if len(sources) == 1 else ("mixed" if sources else "rollup"),
        "max_gap_s": gap,
        "groups": [{"key": k, **groups[k].body()} for k in sorted(groups, key=lambda k: (k is None, k or ""))],
        "runs": allocated.body(),
        "unallocated": blocks["unallocated"].body(),
        "total": blocks["total"].body(),
    }
