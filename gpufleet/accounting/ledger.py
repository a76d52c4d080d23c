"""Where every GPU-hour of a run went: the ledger of mutually exclusive states (contracts.md section 3).

A run's accounted GPU-time is split into the states of :data:`gpufleet.waste.STATES`
(``productive``, ``idle``, ``hung``, ``starved``, ``checkpoint``, ``straggler_wait``,
``throttled``), each with its GPU-hours, GPU and facility energy, CO2e and money, so a
reader sees what the idle GPUs or the hung collective cost, not only that they happened.

The split is the incidents' claims (:mod:`gpufleet.accounting.incidents`: GPU-time with a
lost share) arbitrated by the one rule of :mod:`gpufleet.waste`: on each GPU at each
instant, of the incidents claiming lost time there (a positive share), the one whose state
comes first in :data:`~gpufleet.waste.PRECEDENCE` explains it and takes its lost share (the
largest, when several of that state overlap); ``idle`` and ``hung`` take all of it.  The
rest of that GPU-time is ``productive``.  So a second is never counted in two states, and a
weaker explanation never takes time a stronger one holds.

Pricing is the database's: each lost state's pieces go through
``gpufleet_incident_accounting`` (the run's own accounting over pieces of its GPU-time),
and ``productive`` is the run's own line less the lost states, field by field in
:class:`~decimal.Decimal`, so the states add up to the run's figures exactly.  Where the
lost states' independent rounding overshoots the run's figure by a rounding residue, the
residue is taken from the largest lost state, so no state is ever negative.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from itertools import pairwise
from typing import Any

import psycopg

from gpufleet.accounting import kept_claims, priced_store
from gpufleet.accounting.incidents import (
    Piece,
    figures,
    kept_lines,
    lost_pieces,
    price,
    settled,
    window_claims,
)
from gpufleet.accounting.lines import ZERO, Line, Source, combine
from gpufleet.accounting.money import number
from gpufleet.store.run_model import Run
from gpufleet.waste import PRECEDENCE, STATES, state_of

#: The figures of each state, as the contract lists them.
FIELDS = ("gpu_hours", "gpu_kwh", "facility_kwh", "co2e_kg", "total_cost")

_RANK = {state: i for i, state in enumerate(PRECEDENCE)}
#: Keys and pieces priced per call of ``gpufleet_incident_accounting``: the query reads a key's
#: allocations by scanning every key's, so its time grows faster than the keys; whole runs go in
#: batches of about this many (bench/accounting.py).
PRICE_BATCH_KEYS = 200
PRICE_BATCH_PIECES = 20_000


@dataclass(frozen=True)
class Cell:
    """The figures of one state of one run (or of a group of runs): summable decimals."""

    gpu_hours: Decimal = ZERO
    gpu_kwh: Decimal = ZERO
    facility_kwh: Decimal = ZERO
    co2e_kg: Decimal = ZERO
    total_cost: Decimal = ZERO

    # field by field, not over FIELDS: a month's fleet report adds some 200,000 cells
    def __add__(self, other: Cell) -> Cell:
        return Cell(
            self.gpu_hours + other.gpu_hours,
            self.gpu_kwh + other.gpu_kwh,
            self.facility_kwh + other.facility_kwh,
            self.co2e_kg + other.co2e_kg,
            self.total_cost + other.total_cost,
        )

    def __sub__(self, other: Cell) -> Cell:
        return Cell(
            self.gpu_hours - other.gpu_hours,
            self.gpu_kwh - other.gpu_kwh,
            self.facility_kwh - other.facility_kwh,
            self.co2e_kg - other.co2e_kg,
            self.total_cost - other.total_cost,
        )


assert tuple(f.name for f in fields(Cell)) == FIELDS

#: A run's ledger: every state of :data:`~gpufleet.waste.STATES`, in that order.
Ledger = dict[str, Cell]


def cell(line: Line | None) -> Cell:
    """The figures of an accounting line (zeros without one)."""
    if line is None:
        return Cell()
    return Cell(line.gpu_hours or ZERO, line.gpu_kwh, line.facility_kwh, line.co2e_kg, line.total_cost)


def explain(claims: Iterable[tuple[str, Piece]]) -> list[tuple[str, Piece]]:
    """(state, piece) covering what the (state, piece) ``claims`` claim, one state per GPU per instant.

    On each GPU at each instant the claim whose state comes first in :data:`~gpufleet.waste.PRECEDENCE`
    wins, with the largest lost share among that state's claims there; claims of no lost share (an
    incident whose loss is not estimated) claim nothing.  Adjacent pieces of one state and share merge.
    """
    by_gpu: dict[tuple[str, str, int], list[tuple[int, str, Piece]]] = {}
    for state, p in claims:
        if p.lo < p.hi and p.weight > 0:
            by_gpu.setdefault((p.run_id, p.node, p.gpu), []).append((_RANK[state], state, p))
    out: list[tuple[str, Piece]] = []
    for (run_id, node, gpu), ps in sorted(by_gpu.items()):
        events = sorted(ps, key=lambda e: e[2].lo)
        cuts = sorted({t for _, _, p in ps for t in (p.lo, p.hi)})
        active: list[tuple[int, float, int, datetime]] = []  # (rank, -weight, index, hi): a heap, best first
        nxt = 0
        cur: tuple[str, Piece] | None = None
        for t0, t1 in pairwise(cuts):
            while nxt < len(events) and events[nxt][2].lo <= t0:
                r, _, p = events[nxt]
                heapq.heappush(active, (r, -p.weight, nxt, p.hi))
                nxt += 1
            while (
                active and active[0][3] <= t0
            ):  # the best has ended; ended ones further down wait their turn
                heapq.heappop(active)
            if not active:
                if cur is not None:
                    out.append(cur)
                    cur = None
                continue
            r, neg_w, i, _ = active[0]
            state, w = events[i][1], -neg_w
            if cur is not None and cur[0] == state and cur[1].weight == w and cur[1].hi == t0:
                cur = (state, Piece(run_id, node, gpu, cur[1].lo, t1, w))
            else:
                if cur is not None:
                    out.append(cur)
                cur = (state, Piece(run_id, node, gpu, t0, t1, w))
        if cur is not None:
            out.append(cur)
    return out


def ledger_of(run_line: Line, lost: Mapping[str, Line | None]) -> Ledger:
    """The ledger of a run from its own accounting line and the priced pieces of each lost state:
    ``productive`` is what the lost states leave, so the states add up to the run exactly."""
    cells = {state: cell(lost.get(state)) for state in PRECEDENCE}
    whole = cell(run_line)
    left = whole
    for c in cells.values():
        left = left - c
    values = {f: getattr(left, f) for f in FIELDS}
    for f in FIELDS:
        if values[f] < 0:
            # a rounding residue of the lost states (each priced and rounded on its own): the largest
            # absorbs it, so the sum stays the run's and no state goes below zero
            big = max(PRECEDENCE, key=lambda s: getattr(cells[s], f))
            have = getattr(cells[big], f)
            if have + values[f] >= 0:
                cells[big] = Cell(**{**_as_dict(cells[big]), f: have + values[f]})
                values[f] = ZERO
    out: Ledger = {"productive": Cell(**values)}
    out.update(cells)
    return {state: out[state] for state in STATES}


def _as_dict(c: Cell) -> dict[str, Decimal]:
    return {f: getattr(c, f) for f in FIELDS}


def ledger_body(ledger: Mapping[str, Cell], carbon_known: bool) -> dict[str, dict[str, float | None]]:
    """The ``ledger`` object of a run's accounting (CO2e null where the run's is unknown)."""
    return {
        state: {
            "gpu_hours": number(c.gpu_hours) or 0.0,
            "gpu_kwh": number(c.gpu_kwh),
            "facility_kwh": number(c.facility_kwh),
            "co2e_kg": number(c.co2e_kg) if carbon_known else None,
            "total_cost": number(c.total_cost),
        }
        for state, c in ledger.items()
    }


def waste(ledger: Mapping[str, Cell]) -> Cell:
    """Everything but ``productive``."""
    total = Cell()
    for state in PRECEDENCE:
        total = total + ledger.get(state, Cell())
    return total


def from_body(body: Mapping[str, Mapping[str, Any]]) -> Ledger:
    """A ledger read back from its JSON object (its numbers are the decimals' shortest forms)."""

    def dec(v: Any) -> Decimal:
        return ZERO if v is None else Decimal(repr(float(v)))

    out: Ledger = {}
    for state in STATES:
        c = body.get(state) or {}
        out[state] = Cell(
            dec(c.get("gpu_hours")),
            dec(c.get("gpu_kwh")),
            dec(c.get("facility_kwh")),
            dec(c.get("co2e_kg")),
            dec(c.get("total_cost")),
        )
    return out


def _key(state: str, run_id: str) -> str:
    return f"S{state}:{run_id}"


def losses(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    windows: Mapping[str, tuple[datetime, datetime]],
    run_lines: Mapping[str | None, Line],
    *,
    now: datetime,
    max_gap_s: float,
    source: Source,
    with_ledger: bool = True,
) -> tuple[dict[str, dict[str, Any]], dict[str, Ledger]]:
    """Each run's ``lost_to_incidents`` line and (``with_ledger``) its ledger over its accounted window,
    from one read of the runs' incidents and one pricing call; an ended run's claims kept by an earlier
    reader (:mod:`gpufleet.accounting.kept_claims`) are read back with their priced lines instead."""
    keys = {
        r.run_id: kept_claims.key(r.run_id, *windows[r.run_id], max_gap_s, source)
        for r in runs
        if priced_store.whole_window(r, windows[r.run_id], now)
    }
    priced, incidents = _kept(conn, keys)
    live = [r for r in runs if r.run_id not in incidents]
    marks = kept_claims.marks(conn, [r.run_id for r in live if r.run_id in keys]) if with_ledger else {}
    claims = window_claims(conn, live, windows, now=now)
    keyed: dict[str, list[Piece]] = {}
    stable: set[str] = set()
    fills: list[kept_claims.Fill] = []
    pieces = 0
    for run in live:
        mine = claims.get(run.run_id, [])
        incidents[run.run_id] = len(mine)
        names = ["L" + run.run_id]
        keyed[names[0]] = lost_pieces(mine)
        pieces += len(keyed[names[0]])
        if with_ledger:
            stated = [(s, p) for kind, ps in mine if (s := state_of(kind)) is not None for p in ps]
            for state, p in explain(stated):
                names.append(_key(state, run.run_id))
                keyed.setdefault(names[-1], []).append(p)
                pieces += 1
        if settled((p for _, ps in mine for p in ps), run, *windows[run.run_id]):
            stable.add("L" + run.run_id)
            stable.update(_key(state, run.run_id) for state in PRECEDENCE)
            if run.run_id in marks:
                digests = {
                    k: priced_store.digest(keyed[k], max_gap_s, source)
                    for k in dict.fromkeys(names)
                    if keyed[k]
                }
                kept = kept_claims.Kept(len(mine), digests)
                fills.append(kept_claims.Fill(run, keys[run.run_id], marks[run.run_id], kept))
        if len(keyed) >= PRICE_BATCH_KEYS or pieces >= PRICE_BATCH_PIECES:
            priced.update(price(conn, keyed, now, max_gap_s=max_gap_s, source=source, settled=stable))
            keyed, pieces = {}, 0
    priced.update(price(conn, keyed, now, max_gap_s=max_gap_s, source=source, settled=stable))
    kept_claims.keep(conn, fills)
    lost = {
        run.run_id: {"incidents": incidents[run.run_id], **figures(priced.get("L" + run.run_id))}
        for run in runs
    }
    ledgers = (
        {
            run.run_id: ledger_of(
                run_lines[run.run_id], {s: priced.get(_key(s, run.run_id)) for s in PRECEDENCE}
            )
            for run in runs
        }
        if with_ledger
        else {}
    )
    return lost, ledgers


def _kept(conn: psycopg.Connection, keys: Mapping[str, bytes]) -> tuple[dict[str, Line], dict[str, int]]:
    """The priced keys of the runs whose claims and every priced line of them are kept, and the runs'
    incident counts (a run missing any is claimed and priced live)."""
    kept = kept_claims.lookup(conn, keys)
    have = priced_store.lookup(conn, {d for k in kept.values() for d in k.pieces.values()})
    priced: dict[str, Line] = {}
    incidents: dict[str, int] = {}
    for rid, k in kept.items():
        if not all(d in have for d in k.pieces.values()):
            continue
        incidents[rid] = k.incidents
        for name, d in k.pieces.items():
            if got := kept_lines(name, have[d]):
                priced[name] = combine(got)
    return priced, incidents


@dataclass
class LedgerSum:
    """Ledgers of several runs added up (a site, a team, the fleet): per state the GPU-hours, energies
    and CO2e, and the money per currency (a sum never mixes currencies)."""

    runs: int = 0
    cells: dict[str, Cell] = field(default_factory=lambda: {s: Cell() for s in STATES})
    costs: dict[str, dict[str, Decimal]] = field(default_factory=dict)  # currency -> state -> total_cost

    def add(self, ledger: Mapping[str, Cell], currency: str | None) -> None:
        self.runs += 1
        for state in STATES:
            c = ledger.get(state, Cell())
            self.cells[state] = self.cells[state] + Cell(
                c.gpu_hours, c.gpu_kwh, c.facility_kwh, c.co2e_kg, ZERO
            )
            if currency is not None:
                by_state = self.costs.setdefault(currency, {s: ZERO for s in STATES})
                by_state[state] += c.total_cost

    def merge(self, other: LedgerSum) -> None:
        self.runs += other.runs
        for state in STATES:
            self.cells[state] = self.cells[state] + other.cells[state]
        for cur, by_state in other.costs.items():
            mine = self.costs.setdefault(cur, {s: ZERO for s in STATES})
            for state, v in by_state.items():
                mine[state] += v

    def cost(self, state: str | None, currency: str | None) -> Decimal | None:
        """Money of ``state`` (None: the waste, every state but productive) in ``currency``: zero without a
        currency (runs without a site), None when the sum mixes currencies and none is named."""
        if currency is None:
            if len(self.costs) > 1:
                return None
            if not self.costs:
                return ZERO
            currency = next(iter(self.costs))
        by_state = self.costs.get(currency)
        if by_state is None:
            return ZERO
        return sum((by_state[s] for s in PRECEDENCE), ZERO) if state is None else by_state[state]

    def waste(self) -> Cell:
        return waste(self.cells)

    def body(self) -> dict[str, Any]:
        """``ledger`` (per state) and ``waste`` of a block of ``GET /v1/accounting``."""

        def money(state: str | None) -> dict[str, Any]:
            return {
                "total_cost": number(self.cost(state, None)),
                "costs_by_currency": {cur: number(self.cost(state, cur)) for cur in sorted(self.costs)},
            }

        def figures_of(c: Cell) -> dict[str, Any]:
            return {
                "gpu_hours": number(c.gpu_hours) or 0.0,
                "gpu_kwh": number(c.gpu_kwh),
                "facility_kwh": number(c.facility_kwh),
                "co2e_kg": number(c.co2e_kg),
            }

        hours = sum((c.gpu_hours for c in self.cells.values()), ZERO)
        lost = self.waste()
        return {
            "ledger": {s: {**figures_of(self.cells[s]), **money(s)} for s in STATES},
            "waste": {
                **figures_of(lost),
                **money(None),
                "share": float(lost.gpu_hours / hours) if hours > 0 else 0.0,
            },
        }
