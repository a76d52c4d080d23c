"""What incidents cost: the GPU-hours a run-scoped incident lost, and their kWh, CO2e and money.

contracts.md section 3.2 is the definition; in short:

* an incident's **claim** is GPU-time of its run: the incident's GPUs over the
  incident's span ([start, end), an open incident up to ``now``, clipped to the
  run's window), each GPU with a **lost share** (0-1) the kind's loss model
  gives (:func:`loss_model`);
* the incident's **lost GPU-hours** are Σ lost share × allocation share × hours
  of its claim, and its kWh, CO2e and money are the run's own accounting over
  the claim: ``gpufleet_incident_accounting`` is ``gpufleet_accounting``'s run
  query over those weighted pieces (same energy integration, host share, PUE,
  carbon, energy and GPU-hour prices in force, money as computed);
* a run's **lost_to_incidents** is the same over the *union* of its incidents'
  claims: on each GPU at each instant the largest lost share of the incidents
  covering it, never their sum, so overlapping incidents count once.

Nothing here prices anything: Python only decides which GPU-time an incident
covers and with what weight; the database does the accounting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import pairwise
from typing import Any

import psycopg

from gpufleet.accounting import priced_store
from gpufleet.accounting.efficiency import LOST_TIME_KINDS, _lost_share
from gpufleet.accounting.lines import Line, Source, combine
from gpufleet.accounting.money import number
from gpufleet.evidence import StoredThrottledGpu, StoredThrottling, read_as, read_evidence, read_lost_time
from gpufleet.store.run_model import Run, load_runs

#: Kinds whose incident holds back every GPU of the run: a synchronous job waits for its slowest rank, and a
#: collective that hangs stops every rank in it (the rank that died as much as the ones spinning on it).
JOB_WIDE_KINDS = frozenset({"straggler", "hung_collective"})
#: Kinds whose GPUs do no work at all over the incident: all of their time is lost.
WHOLLY_LOST_KINDS = frozenset({"idle_allocation", "hung_collective"})

_SQL = "SELECT * FROM gpufleet_incident_accounting(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


@dataclass(frozen=True)
class Piece:
    """GPU (node, gpu) of run ``run_id`` over [lo, hi), of which ``weight`` is lost."""

    run_id: str
    node: str
    gpu: int
    lo: datetime
    hi: datetime
    weight: float


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _clip01(v: float) -> float:
    return min(max(v, 0.0), 1.0)


def _throttle_loss(ev: StoredThrottling | StoredThrottledGpu) -> tuple[float, str]:
    share, ratio = ev.get("throttled_share"), ev.get("clock_ratio")
    if share is None or ratio is None:
        return 0.0, "not_estimated"
    return _clip01(share) * _clip01(1.0 - ratio), "throttled_share*(1-clock_ratio)"


def loss_model(kind: str, evidence: Mapping[str, Any]) -> tuple[float, str]:
    """(lost share, basis) of an incident of ``kind`` with ``evidence`` (per GPU for throttling)."""
    if kind in WHOLLY_LOST_KINDS:
        return 1.0, "whole_span"
    if kind in LOST_TIME_KINDS:
        lost = read_lost_time(evidence)
        if lost.get("gpu_time_lost_share") is not None:
            return _lost_share(evidence), "gpu_time_lost_share"
        if lost.get("run_time_lost_share") is not None:
            return _lost_share(evidence), "run_time_lost_share"
        if lost.get("duty_cycle") is not None:
            return _lost_share(evidence), "1-duty_cycle"
        return 1.0, "whole_span"
    if kind == "throttling":
        return _throttle_loss(read_evidence("throttling", evidence))
    if kind == "straggler":
        ev = read_evidence("straggler", evidence)
        a, pa = ev.get("activity"), ev.get("peer_activity")
        if a is not None and pa is not None and max(a, pa) > 0:
            return _clip01(1.0 - min(a, pa) / max(a, pa)), "activity_gap"
        return 0.0, "not_estimated"
    # a kind without a loss model of its own (one added later): the share its evidence reports, if any
    v = _num(evidence.get("gpu_time_lost_share"))
    if v is not None:
        return _clip01(v), "gpu_time_lost_share"
    return 0.0, "not_estimated"


def _listed_gpus(evidence: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]] | None:
    gpus = evidence.get("gpus")
    if not isinstance(gpus, list):
        return None
    out = []
    for g in gpus:
        if isinstance(g, Mapping) and isinstance(g.get("node"), str) and isinstance(g.get("gpu"), int):
            out.append((g["node"], int(g["gpu"]), g))
    return out


def _throttled_gpu(entry: Mapping[str, Any]) -> StoredThrottledGpu:
    """An entry of a throttling incident's ``evidence.gpus``, read as stored."""
    got: StoredThrottledGpu = read_as(StoredThrottledGpu, entry)
    return got


def claim(
    incident: Mapping[str, Any],
    run: Run,
    now: datetime,
    lo: datetime | None = None,
    hi: datetime | None = None,
) -> tuple[list[Piece], dict[str, Any]]:
    """The pieces of GPU-time ``incident`` lost in ``run`` (a :func:`~gpufleet.accounting.run.load_runs` row),
    within [lo, hi) when given, and what they rest on (``gpus``, ``span_s``, ``lost_share``, ``basis``)."""
    ev: Mapping[str, Any] = incident.get("evidence") or {}
    kind = incident["kind"]
    alloc: Sequence[tuple[str, int]] = run.allocations
    a = max(incident["start"], run.start, *([lo] if lo is not None else []))
    end = incident.get("end") or now
    b = min(end, now, run.end or now, *([hi] if hi is not None else []))
    listed = _listed_gpus(ev)
    weights: dict[tuple[str, int], float] = {}
    share, basis = loss_model(kind, ev)
    if kind in JOB_WIDE_KINDS:
        gpus = list(alloc)
    elif listed is not None:
        held = set(alloc)
        # a GPU listed twice is claimed once, at the largest share its entries give (as the SQL ledger does)
        gpus = list(dict.fromkeys((n, g) for n, g, _ in listed if (n, g) in held))
        if kind == "throttling":
            for n, g, per in listed:
                w, basis_g = (
                    _throttle_loss(_throttled_gpu(per)) if "throttled_share" in per else (share, basis)
                )
                weights[(n, g)] = max(w, weights.get((n, g), w))
                basis = basis_g if basis_g != "not_estimated" else basis
    elif incident.get("gpu") is not None:
        gpus = [k for k in alloc if k == (incident["node"], incident["gpu"])]
    elif incident.get("node") is not None:
        gpus = [k for k in alloc if k[0] == incident["node"]]
    else:
        gpus = list(alloc)
    pieces = [Piece(run.run_id, n, g, a, b, weights.get((n, g), share)) for n, g in gpus] if a < b else []
    span_s = max((b - a).total_seconds(), 0.0)
    lost = (sum(p.weight for p in pieces) / len(pieces)) if pieces else 0.0
    return pieces, {"gpus": len(gpus), "span_s": span_s, "lost_share": lost, "basis": basis}


def union(pieces: Iterable[Piece]) -> list[Piece]:
    """Pieces covering what ``pieces`` cover, on each GPU at each instant with the largest weight among
    those covering it (so overlapping incidents count once); adjacent pieces of equal weight merged.

    One sweep per GPU over its pieces' edges, with the weights of the pieces open at each edge counted:
    a run of a week has hundreds of incidents on each GPU, and testing every piece against every span
    between edges made the union most of the time of a warm accounting."""
    by_gpu: dict[tuple[str, str, int], list[Piece]] = {}
    for p in pieces:
        if p.lo < p.hi:
            by_gpu.setdefault((p.run_id, p.node, p.gpu), []).append(p)
    out: list[Piece] = []
    for (run_id, node, gpu), ps in sorted(by_gpu.items()):
        changes: dict[datetime, list[tuple[float, int]]] = {}
        for p in ps:
            changes.setdefault(p.lo, []).append((p.weight, 1))
            changes.setdefault(p.hi, []).append((p.weight, -1))
        cuts = sorted(changes)
        open_weights: Counter[float] = Counter()
        cur: Piece | None = None
        for t0, t1 in pairwise(cuts):
            for w, d in changes[t0]:
                open_weights[w] += d
                if open_weights[w] == 0:
                    del open_weights[w]
            if not open_weights:
                if cur is not None:
                    out.append(cur)
                    cur = None
                continue
            w = max(open_weights)
            if cur is not None and cur.weight == w and cur.hi == t0:
                cur = Piece(run_id, node, gpu, cur.lo, t1, w)
            else:
                if cur is not None:
                    out.append(cur)
                cur = Piece(run_id, node, gpu, t0, t1, w)
        if cur is not None:
            out.append(cur)
    return out


def price(
    conn: psycopg.Connection,
    keyed: Mapping[str, Sequence[Piece]],
    now: datetime,
    *,
    max_gap_s: float = 60.0,
    source: Source = "auto",
    kept: bool = True,
    settled: Collection[str] | None = None,
) -> dict[str, Line]:
    """The accounting line of each key's pieces (``gpufleet_incident_accounting``); keys without a piece
    inside their run's window get none.  A key's pieces must belong to one run.

    ``kept``: read what an earlier reader priced and stored while its inputs are unchanged, and store
    what this one prices (:mod:`gpufleet.accounting.priced_store`); the figures are the same either way.
    Stored are the keys whose pieces all end before ``now`` (an open one grows) and are in ``settled``
    (None: every key): pieces another reader will price again, not ones a period's edge cut.
    """
    keyed = {k: ps for k, ps in keyed.items() if ps}
    if not keyed:
        return {}
    if not kept:
        return {
            k: combine([Line(*r) for r in v])
            for k, v in _priced_rows(conn, keyed, now, max_gap_s, source).items()
        }
    digests = {k: priced_store.digest(ps, max_gap_s, source) for k, ps in keyed.items()}
    have = priced_store.lookup(conn, set(digests.values()))
    out: dict[str, list[Line]] = {}
    todo: dict[str, Sequence[Piece]] = {}
    for k, ps in keyed.items():
        rows = have.get(digests[k])
        if rows is None:
            todo[k] = ps
        else:
            out[k] = kept_lines(k, rows)
    closed = {
        k: ps for k, ps in todo.items() if max(p.hi for p in ps) < now and (settled is None or k in settled)
    }
    fills = priced_store.plan(conn, closed, digests)
    got = _priced_rows(conn, todo, now, max_gap_s, source) if todo else {}
    keep = []
    for k in todo:
        rows = got.get(k, [])
        out[k] = [Line(*r) for r in rows]
        if k in fills and not any(r[-1] for r in rows):
            keep.append(replace(fills[k], rows=tuple(rows) or (_NO_LINE,)))
    priced_store.keep(conn, keep)
    return {k: combine(v) for k, v in out.items() if v}


def kept_lines(key: str, rows: Sequence[priced_store.Row]) -> list[Line]:
    """The lines of ``key`` from the rows the priced store kept for its pieces (none: no line)."""
    return [Line(r[0], key, *r[2:]) for r in rows if r[1] is not None]


#: What is kept for a key whose pieces price to no line (all outside the run's window): one row with no
#: run, so the key is answered (with no line) instead of priced again.
_NO_LINE: tuple[Any, ...] = ("run", None, *([None] * 26), False)


def _priced_rows(
    conn: psycopg.Connection,
    keyed: Mapping[str, Sequence[Piece]],
    now: datetime,
    max_gap_s: float,
    source: Source,
) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of ``gpufleet_incident_accounting`` per key (one per currency: pieces across a change of
    the site's currency)."""
    rows = [(k, p) for k, ps in keyed.items() for p in ps]
    if not rows:
        return {}
    cols = (
        [k for k, _ in rows],
        [p.run_id for _, p in rows],
        [p.node for _, p in rows],
        [p.gpu for _, p in rows],
        [p.lo for _, p in rows],
        [p.hi for _, p in rows],
        [p.weight for _, p in rows],
    )
    by_key: dict[str, list[tuple[Any, ...]]] = {}
    for r in conn.execute(_SQL, (*cols, now, max_gap_s, source)).fetchall():
        by_key.setdefault(r[1], []).append(tuple(r))
    return by_key


def settled(pieces: Iterable[Piece], run: Run, lo: datetime, hi: datetime) -> bool:
    """Whether ``pieces`` of ``run``, claimed in its accounted window [lo, hi), are what any window claims:
    none cut by the window's edges, only by the run's own start and end (a report's period cuts them
    anew at every period, and what it priced would never be read again)."""
    return all((p.lo > lo or lo == run.start) and (p.hi < hi or hi == run.end) for p in pieces)


def figures(line: Line | None) -> dict[str, Any]:
    """The cost block of a line (zeros without one): lost GPU-hours, energies, CO2e and money."""
    if line is None:
        return {
            "gpu_hours": 0.0,
            "gpu_kwh": 0.0,
            "host_kwh": 0.0,
            "it_kwh": 0.0,
            "facility_kwh": 0.0,
            "co2e_kg": None,
            "energy_cost": 0.0,
            "compute_cost": 0.0,
            "total_cost": 0.0,
            "currency": None,
            "minor_units": 2,
        }
    carbon_known = line.carbon_source not in (None, "none")
    return {
        "gpu_hours": number(line.gpu_hours) or 0.0,
        "gpu_kwh": number(line.gpu_kwh),
        "host_kwh": number(line.host_kwh),
        "it_kwh": number(line.it_kwh),
        "facility_kwh": number(line.facility_kwh),
        "co2e_kg": number(line.co2e_kg) if carbon_known else None,
        "energy_cost": None if line.mixed else number(line.energy_cost),
        "compute_cost": None if line.mixed else number(line.compute_cost) or 0.0,
        "total_cost": None if line.mixed else number(line.total_cost),
        "currency": line.currency,
        "minor_units": line.minor_units,
    }


def _runs(conn: psycopg.Connection, run_ids: Iterable[str]) -> dict[str, Run]:

    ids = sorted(set(run_ids))
    return {r.run_id: r for r in load_runs(conn, ids)} if ids else {}


def incident_costs(
    conn: psycopg.Connection,
    incidents: Sequence[Mapping[str, Any]],
    *,
    now: datetime,
    max_gap_s: float = 60.0,
    source: Source = "auto",
) -> dict[int, dict[str, Any] | None]:
    """The ``lost`` block of each incident (by id): None for one without a run."""
    runs = _runs(conn, (i["run_id"] for i in incidents if i.get("run_id")))
    claims: dict[int, tuple[list[Piece], dict[str, Any]]] = {}
    for inc in incidents:
        run = runs.get(inc.get("run_id") or "")
        if run is not None:
            claims[inc["id"]] = claim(inc, run, now)
    priced = price(
        conn, {str(i): ps for i, (ps, _) in claims.items()}, now, max_gap_s=max_gap_s, source=source
    )
    out: dict[int, dict[str, Any] | None] = {}
    for inc in incidents:
        if inc["id"] not in claims:
            out[inc["id"]] = None
            continue
        _, meta = claims[inc["id"]]
        out[inc["id"]] = {**meta, **figures(priced.get(str(inc["id"])))}
    return out


_RUN_INCIDENTS_SQL = """
SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents
WHERE run_id = ANY(%s) AND start < %s ORDER BY id"""


def window_claims(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    windows: Mapping[str, tuple[datetime, datetime]],
    *,
    now: datetime,
) -> dict[str, list[tuple[str, list[Piece]]]]:
    """(kind, pieces) of each incident of each run with GPU-time in the run's accounted window [lo, hi)."""
    if not runs:
        return {}
    hi_max = max(hi for _, hi in windows.values())
    by_run: dict[str, list[dict[str, Any]]] = {}
    cols = ("id", "kind", "run_id", "node", "gpu", "start", "end", "evidence")
    for r in conn.execute(_RUN_INCIDENTS_SQL, ([r.run_id for r in runs], hi_max)).fetchall():
        inc = dict(zip(cols, r, strict=True))
        by_run.setdefault(inc["run_id"], []).append(inc)
    out: dict[str, list[tuple[str, list[Piece]]]] = {}
    for run in runs:
        lo, hi = windows[run.run_id]
        got: list[tuple[str, list[Piece]]] = []
        for inc in by_run.get(run.run_id, []):
            ps, _ = claim(inc, run, now, lo, hi)
            if ps:
                got.append((inc["kind"], ps))
        out[run.run_id] = got
    return out


def lost_pieces(claims: Sequence[tuple[str, list[Piece]]]) -> list[Piece]:
    """The ``lost_to_incidents`` pieces of one run's claims: their union, overlaps counted once."""
    return union(p for _, ps in claims for p in ps)


def lost_to_incidents(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    windows: Mapping[str, tuple[datetime, datetime]],
    *,
    now: datetime,
    max_gap_s: float = 60.0,
    source: Source = "auto",
) -> dict[str, dict[str, Any]]:
    """The ``lost_to_incidents`` line of each run over its accounted window [lo, hi): the union of its
    incidents' claims (overlaps counted once), priced as the run's own line."""
    claims = window_claims(conn, runs, windows, now=now)
    keyed = {run.run_id: lost_pieces(claims[run.run_id]) for run in runs}
    stable = {run.run_id for run in runs if settled(keyed[run.run_id], run, *windows[run.run_id])}
    priced = price(conn, keyed, now, max_gap_s=max_gap_s, source=source, settled=stable)
    return {rid: {"incidents": len(claims[rid]), **figures(priced.get(rid))} for rid in keyed}
