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

A GPU counts from when it joined the fleet (its first sample, its first
rollup, the first run that held it, its node's registration) until it left
(silent for ``accounting.gone_after_s``, a day by default), so a growing
fleet is not charged GPU time without telemetry from before its GPUs existed.

Runs are priced at their own site; unallocated energy at the node's site;
the total at the site of whoever held each share of each GPU.  Money of a
block is the sum of its lines' money, as the accounting computes it (to 1e-9),
so figures add up exactly (the total's money is runs + unallocated).  Costs
are kept per currency: a block that mixes currencies reports them in
``costs_by_currency`` only (the single-currency fields are then null).  A line
whose money cannot be computed (a stored price outside its bounds) leaves its
currency's money of every block it is in null, and ``errors`` says why.

Blocks of runs (the groups and ``runs``) also carry their runs' ledgers added
up (:class:`gpufleet.accounting.ledger.LedgerSum`): GPU-hours, energy and money
per state, and the waste, everything but ``productive``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import psycopg

from gpufleet.accounting.ledger import LedgerSum, from_body
from gpufleet.accounting.line_errors import messages, problems
from gpufleet.accounting.lines import ZERO, Line, Source, lines, per_run
from gpufleet.accounting.money import number
from gpufleet.accounting.result import AccountingBody, LedgerSummary, group_value
from gpufleet.accounting.run import ledger_summaries, load_runs, used_source
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
    #: currencies whose money a line in the block could not compute (its money is then unknown)
    broken: set[str] = field(default_factory=set)
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
        self.broken |= other.broken
        if other.ledger is not None:
            if self.ledger is None:
                self.ledger = LedgerSum()
            self.ledger.merge(other.ledger)

    def money(self) -> tuple[Decimal | None, Decimal | None, str | None]:
        """(energy cost, compute cost, currency): zeros without a currency, None when currencies mix or a
        line's money is unknown."""
        if not self.costs:
            return ZERO, ZERO, None
        if len(self.costs) == 1:
            cur, (e, c) = next(iter(self.costs.items()))
            return (None, None, cur) if cur in self.broken else (e, c, cur)
        return None, None, None

    def cost_of(self, currency: str) -> tuple[Decimal, Decimal] | None:
        """(energy, compute) in ``currency``; None when a line of it could not be computed."""
        if currency in self.broken:
            return None
        e, c = self.costs.get(currency, [ZERO, ZERO])
        return e, c

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
            "costs_by_currency": {
                cur: {
                    "energy_cost": None if cur in self.broken else number(e),
                    "compute_cost": None if cur in self.broken else number(c),
                    "total_cost": None if cur in self.broken else number(e + c),
                }
                for cur, (e, c) in sorted(self.costs.items())
            },
            "coverage": min(self.covered_s / self.gpu_s, 1.0) if self.gpu_s > 0 else 0.0,
            **extra,
        }


def run_block(parts: Sequence[Line], body: AccountingBody | LedgerSummary | None = None) -> Block:
    """A run's lines (one per currency) as a block, with its ledger when ``body`` has one."""
    b = Block(runs=1)
    currencies = {ln.currency for ln in parts}
    if body is not None and "ledger" in body:
        b.ledger = LedgerSum()
        b.ledger.add(from_body(body["ledger"]), currencies.pop() if len(currencies) == 1 else None)
    for ln in parts:
        gpu_s = ln.gpu_s or 0.0
        b.add_time(ln.gpu_hours or ZERO, gpu_s, min(ln.covered_s, gpu_s))
        b.add_energy(ln)
        b.add_cost(ln.currency, ln.energy_cost, ln.compute_cost or ZERO)
        if ln.currency is not None and problems([ln]).keys() & {"energy_cost", "compute_cost"}:
            b.broken.add(ln.currency)
    return b


@dataclass
class FleetBlocks:
    """The fleet view's blocks before they are written out."""

    groups: dict[str | None, Block]
    runs: Block
    unallocated: Block
    no_telemetry: Block
    total: Block
    #: each run's ledger, currency, team and site
    summaries: list[LedgerSummary]
    sources: set[str]
    #: what could not be computed, line by line
    errors: list[str] = field(default_factory=list)


def fleet_blocks(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    group_by: GroupBy = "site",
    now: datetime,
    max_gap_s: float,
    source: Source = "auto",
    gone_after_s: float | None = None,
) -> FleetBlocks:
    gone = AccountingSettings().gone_after_s if gone_after_s is None else gone_after_s
    with snapshot(conn):
        rows = lines(
            conn, since, until, now, fleet=True, max_gap_s=max_gap_s, source=source, gone_after_s=gone
        )
        parts = per_run(rows)
        runs = load_runs(conn, sorted(parts))
        summaries = ledger_summaries(
            conn, runs, parts, now=now, max_gap_s=max_gap_s, source=source, since=since, until=until
        )
        errors = [e for summary in summaries for e in summary["errors"]]
        groups: dict[str | None, Block] = defaultdict(Block)
        allocated, idle, dark, total = Block(), Block(), Block(), Block()
        for summary in summaries:
            blk = run_block(parts[summary["run_id"]], summary)
            groups[group_value(summary, group_by)].merge(blk)
            allocated.merge(blk)
        total.runs = allocated.runs
        for ln in rows:
            if ln.line == "unallocated":
                gpu_s = ln.gpu_s or 0.0
                covered = min(ln.covered_s, gpu_s)
                idle.add_time(ln.covered_hours or ZERO, covered, covered)
                idle.add_energy(ln)
                idle.add_cost(ln.currency, ln.energy_cost, ZERO)
                found = problems([ln])
                if "energy_cost" in found and ln.currency is not None:
                    idle.broken.add(ln.currency)
                errors += messages(conn, ln.site, found, "GPU time no run held")
                dark.add_time((ln.gpu_hours or ZERO) - (ln.covered_hours or ZERO), gpu_s - covered, 0.0)
            elif ln.line == "total":
                total.add_time(ln.gpu_hours or ZERO, ln.gpu_s or 0.0, ln.covered_s)
                total.add_energy(ln)
    # the total's money is the sum of the lines above it, exactly
    for part in (allocated, idle):
        for cur, (e, c) in part.costs.items():
            total.add_cost(cur, e, c)
        total.broken |= part.broken
    sources = {used_source(source, ln.stale) for ln in rows} or {used_source(source, False)}
    return FleetBlocks(groups, allocated, idle, dark, total, summaries, sources, errors)


def fleet_accounting(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    group_by: GroupBy = "site",
    now: datetime | None = None,
    max_gap_s: float | None = None,
    source: Source = "auto",
    gone_after_s: float | None = None,
) -> dict[str, Any]:
    """The body of ``GET /v1/accounting``."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    f = fleet_blocks(
        conn,
        since,
        until,
        group_by=group_by,
        now=now,
        max_gap_s=gap,
        source=source,
        gone_after_s=gone_after_s,
    )
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
        "errors": f.errors,
    }


def _ordered(keys: Iterable[str | None]) -> list[str | None]:
    return sorted(keys, key=lambda k: (k is None, k or ""))
