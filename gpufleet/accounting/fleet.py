"""Fleet view: runs grouped by site, team or run, the GPU time no run held, and the fleet total.

One call of the database's ``gpufleet_accounting`` gives three independent
measurements over the period [since, until) (clipped to now): the runs
(each run's own accounting clipped to the period, as in the finance
report), the unallocated part (each GPU's time outside every run and the
share no run held, each node's host energy times the share of its GPUs no
run held), and the total (every GPU and host over the whole period).  They
agree, runs + unallocated = total, because no GPU is held beyond its whole
at any instant (the database refuses it) and nothing is counted twice; the
test suite checks it field by field after random sequences of operations.

GPU time no run held is split by telemetry: ``unallocated`` is the part
inside counted sample intervals (so its coverage is 1), ``no_telemetry`` the
part no sample covers (no energy, coverage 0).  So ``gpu_hours``: runs +
unallocated + no_telemetry = total.

Runs are priced at their own site; unallocated energy at the node's site;
the total at the site of whoever held each share of each GPU.  Money of a
block is the sum of its lines' money, each rounded to the currency's minor
units, so figures add up to the cent (the total's money is runs +
unallocated).  Costs are kept per currency: a block that mixes currencies
reports them in ``costs_by_currency`` only (the single-currency fields are
then null).

Blocks of runs (the groups and ``runs``) also carry their runs' ledgers added
up (:class:`gpufleet.accounting.ledger.LedgerSum`): GPU-hours, energy and money
per state, and the waste, everything but ``productive``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import psycopg

from gpufleet.accounting.ledger import LedgerSum, from_body
from gpufleet.accounting.lines import ZERO, Line, Source, lines
from gpufleet.accounting.money import number
from gpufleet.accounting.result import AccountingBody, group_value
from gpufleet.accounting.run import bodies as run_bodies
from gpufleet.accounting.run import load_runs, used_source
from gpufleet.accounting.snapshot import snapshot
from gpufleet.config import AccountingSettings
from gpufleet.timeparse import iso

GroupBy = Literal["site", "team", "run"]
GROUP_BY: tuple[GroupBy, ...] = ("site", "team", "run")


@dataclass
class Block:
    """Summable totals of a set of runs or GPU time (hours, energies and money as the lines round them)."""

    runs: int = 0
    gpu_hours: Decimal = ZERO
    gpu_s: float = 0.0
    covered_s: float = 0.0
    gpu_kwh: Decimal = ZERO
    host_kwh: Decimal = ZERO
    it_kwh: Decimal = ZERO
    facility_kwh: Decimal = ZERO
    co2e_kg: Decimal = ZERO
    co2e_unknown_kwh: Decimal = ZERO
    costs: dict[str, list[Decimal]] = field(default_factory=dict)  # currency -> [energy, compute]
    #: the runs' ledgers added up (blocks of runs only)
    ledger: LedgerSum | None = None

    def add_cost(self, currency: str | None, energy: Decimal, compute: Decimal) -> None:
        if currency is None:
            return  # no site: prices are 0
        c = self.costs.setdefault(currency, [ZERO, ZERO])
        c[0] += energy
        c[1] += compute

    def add_energy(self, ln: Line) -> None:
        self.gpu_kwh += ln.gpu_kwh
        self.host_kwh += ln.host_kwh
        self.it_kwh += ln.it_kwh
        self.facility_kwh += ln.facility_kwh
        self.co2e_kg += ln.co2e_kg
        self.co2e_unknown_kwh += ln.co2e_unknown_kwh

    def add_time(self, hours: Decimal, gpu_s: float, covered_s: float) -> None:
        self.gpu_hours += hours
        self.gpu_s += gpu_s
        self.covered_s += covered_s

    def merge(self, other: Block) -> None:
        self.runs += other.runs
        self.gpu_hours += other.gpu_hours
        self.gpu_s += other.gpu_s
        self.covered_s += other.covered_s
        for name in ("gpu_kwh", "host_kwh", "it_kwh", "facility_kwh", "co2e_kg", "co2e_unknown_kwh"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for cur, (e, c) in other.costs.items():
            self.add_cost(cur, e, c)
        if other.ledger is not None:
            if self.ledger is None:
                self.ledger = LedgerSum()
            self.ledger.merge(other.ledger)

    def money(self) -> tuple[Decimal | None, Decimal | None, str | None]:
        """(energy cost, compute cost, currency): zeros without a currency, None when currencies mix."""
        if not self.costs:
            return ZERO, ZERO, None
        if len(self.costs) == 1:
            cur, (e, c) = next(iter(self.costs.items()))
            return e, c, cur
        return None, None, None

    def body(self) -> dict[str, Any]:
        energy, compute, single = self.money()
        extra = self.ledger.body() if self.ledger is not None else {}
        return {
            "runs": self.runs,
            "gpu_hours": number(self.gpu_hours),
            "gpu_kwh": number(self.gpu_kwh),
            "host_kwh": number(self.host_kwh),
            "it_kwh": number(self.it_kwh),
            "facility_kwh": number(self.facility_kwh),
            "co2e_kg": number(self.co2e_kg),
            "co2e_unknown_kwh": number(self.co2e_unknown_kwh),
            "energy_cost": number(energy),
            "compute_cost": number(compute),
            "total_cost": None if energy is None or compute is None else number(energy + compute),
            "currency": single,
            "costs_by_currency": {cur: {"energy_cost": number(e), "compute_cost": number(c),
                                        "total_cost": number(e + c)}
                                  for cur, (e, c) in sorted(self.costs.items())},
            "coverage": min(self.covered_s / self.gpu_s, 1.0) if self.gpu_s > 0 else 0.0,
            **extra,
        }


def run_block(ln: Line, body: AccountingBody | None = None) -> Block:
    """A run's line as a block, with its ledger when ``body`` has one."""
    b = Block(runs=1)
    if body is not None and "ledger" in body:
        b.ledger = LedgerSum()
        b.ledger.add(from_body(body["ledger"]), ln.currency)
    gpu_s = ln.gpu_s or 0.0
    b.add_time(ln.gpu_hours or ZERO, gpu_s, min(ln.covered_s, gpu_s))
    b.add_energy(ln)
    b.add_cost(ln.currency, ln.energy_cost, ln.compute_cost or ZERO)
    return b


@dataclass
class FleetBlocks:
    """The fleet view's blocks before they are written out."""

    groups: dict[str | None, Block]
    runs: Block
    unallocated: Block
    no_telemetry: Block
    total: Block
    bodies: list[AccountingBody]
    sources: set[str]


def fleet_blocks(conn: psycopg.Connection, since: datetime, until: datetime, *, group_by: GroupBy = "site",
                 now: datetime, max_gap_s: float, source: Source = "auto") -> FleetBlocks:
    with snapshot(conn):
        rows = lines(conn, since, until, now, fleet=True, max_gap_s=max_gap_s, source=source)
        run_lines = {ln.run_id: ln for ln in rows if ln.line == "run"}
        runs = load_runs(conn, sorted(k for k in run_lines if k is not None))
        bodies = run_bodies(conn, runs, run_lines, now=now, max_gap_s=max_gap_s, source=source, since=since,
                            until=until)
    groups: dict[str | None, Block] = defaultdict(Block)
    allocated, idle, dark, total = Block(), Block(), Block(), Block()
    for body in bodies:
        blk = run_block(run_lines[body["run_id"]], body)
        groups[group_value(body, group_by)].merge(blk)
        allocated.merge(blk)
    total.runs = allocated.runs
    for ln in rows:
        if ln.line == "unallocated":
            gpu_s = ln.gpu_s or 0.0
            covered = min(ln.covered_s, gpu_s)
            idle.add_time(ln.covered_hours or ZERO, covered, covered)
            idle.add_energy(ln)
            idle.add_cost(ln.currency, ln.energy_cost, ZERO)
            dark.add_time((ln.gpu_hours or ZERO) - (ln.covered_hours or ZERO), gpu_s - covered, 0.0)
        elif ln.line == "total":
            total.add_time(ln.gpu_hours or ZERO, ln.gpu_s or 0.0, ln.covered_s)
            total.add_energy(ln)
    # the total's money is the sum of the lines above it, to the cent
    for part in (allocated, idle):
        for cur, (e, c) in part.costs.items():
            total.add_cost(cur, e, c)
    sources = {used_source(source, ln.stale) for ln in rows} or {used_source(source, False)}
    return FleetBlocks(groups, allocated, idle, dark, total, bodies, sources)


def fleet_accounting(conn: psycopg.Connection, since: datetime, until: datetime, *, group_by: GroupBy = "site",
                     now: datetime | None = None, max_gap_s: float | None = None,
                     source: Source = "auto") -> dict[str, Any]:
    """The body of ``GET /v1/accounting``."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    f = fleet_blocks(conn, since, until, group_by=group_by, now=now, max_gap_s=gap, source=source)
    hi = max(since, min(until, now))
    return {
        "from": iso(since),
        "to": iso(until),
        "window_end": iso(hi),
        "group_by": group_by,
        "source": f.sources.pop() if len(f.sources) == 1 else "mixed",
        "max_gap_s": gap,
        "groups": [{"key": k, **f.groups[k].body()} for k in _ordered(f.groups)],
        "runs": f.runs.body(),
        "unallocated": f.unallocated.body(),
        "no_telemetry": f.no_telemetry.body(),
        "total": f.total.body(),
    }


def _ordered(keys: Iterable[str | None]) -> list[str | None]:
    return sorted(keys, key=lambda k: (k is None, k or ""))
