"""Incident costs, ended runs' ledgers and power-cap points priced as they settle, before anyone asks.

The priced store (:mod:`gpufleet.accounting.priced_store`) keeps what a reader priced, so every read
after the first is cheap; the first still prices the pieces from the samples, and that first reader is
a person: the SRE opening the incident that just paged, finance opening the run that just ended.  The
collector's leader does that first read instead, once an incident has closed or a run has ended: it
asks what those readers ask (an incident's ``lost`` block, a run's accounting with its ledger, the
run's points for the power-cap advisor), with the settings they use, so the lines it stores are the
ones they look up.  Then it keeps the running runs' closed hours of power-cap minutes
(:mod:`gpufleet.advisor.kept_minutes`) and the fleet's closed hours (:mod:`gpufleet.accounting.fleet_hours`).

Each pass looks at what settled in the last :data:`RECENT_S` seconds and remembers what it priced, so
an incident or a run is priced once (again only if its end moves).  A pass prices oldest first, in
chunks of :data:`CHUNK` incidents and then one run at a time, and after its first starts no chunk once it has
spent ``budget_s``, so the leader's rollups and sweeps never wait long behind it (a 512-GPU week-long run
with its ledger takes seconds to price); the rest go in the next pass.  What could not be kept (samples of the span
still queued for the rollup worker: the leader drains the queue just before, so only a late sample does
that) is priced by its first reader, as before.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.accounting import fleet_hours
from gpufleet.accounting.incidents import incident_costs
from gpufleet.accounting.lines import Source
from gpufleet.accounting.run import account_runs
from gpufleet.advisor.power_cap import keep_running_hours
from gpufleet.advisor.run_cap import keep_points_for_readers
from gpufleet.store.run_model import load_runs

log = logging.getLogger(__name__)

#: How far back a pass looks for incidents that closed and runs that ended.
RECENT_S = 3600.0
#: Incidents priced in one call; a pass checks its budget between calls.
CHUNK = 50
#: Seconds a pass may start new pricing for (a chunk under way finishes).
BUDGET_S = 2.0

_CLOSED_SQL = """
SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents
WHERE run_id IS NOT NULL AND "end" > %s AND "end" <= %s ORDER BY "end", id"""

_ENDED_SQL = """SELECT run_id, "end" FROM runs WHERE "end" > %s AND "end" <= %s ORDER BY "end", run_id"""
_OF_RUNS_SQL = """SELECT run_id, "end" FROM runs WHERE run_id = ANY(%s) AND "end" <= %s ORDER BY run_id"""


@dataclass
class PriceAhead:
    """What settled recently, priced once per pass of the leader (:meth:`run`)."""

    max_gap_s: float
    source: Source = "auto"
    recent_s: float = RECENT_S
    budget_s: float = BUDGET_S
    #: ("i", incident id, end) and ("r", run id, end) priced, until they leave the window.
    done: dict[tuple[str, Any, datetime], datetime] = field(default_factory=dict)
    #: Ended runs whose incidents changed after they were priced, still to price again.
    owed: set[str] = field(default_factory=set)
    #: The fleet's closed hours to keep (gpufleet.accounting.fleet_hours), after what settled; at least
    #: one call of them a pass, so they are never starved by a stream of incidents.
    fleet: fleet_hours.Keeping | None = None
    #: Keep the running runs' closed hours of power-cap minutes (gpufleet.advisor.kept_minutes), one
    #: statement a pass at least, so the advisor's first reader finds them.
    running_hours: bool = True

    def run(self, conn: psycopg.Connection, now: datetime) -> tuple[int, int]:
        """One pass: how many incidents and runs it priced (each stored for the readers that follow)."""
        since = now - timedelta(seconds=self.recent_s)
        self.done = {k: end for k, end in self.done.items() if end > since}
        deadline = time.monotonic() + self.budget_s
        with conn.cursor(row_factory=dict_row) as cur:
            closed = [
                r
                for r in cur.execute(_CLOSED_SQL, (since, now)).fetchall()
                if ("i", r["id"], r["end"]) not in self.done
            ]
        ended = [
            (rid, end)
            for rid, end in conn.execute(_ENDED_SQL, (since, now)).fetchall()
            if ("r", rid, end) not in self.done
        ]
        priced_incidents = priced_runs = 0

        def spent() -> bool:
            return (priced_incidents or priced_runs) > 0 and time.monotonic() >= deadline

        for i in range(0, len(closed), CHUNK):
            if spent():
                break
            chunk = closed[i : i + CHUNK]
            incident_costs(conn, chunk, now=now, max_gap_s=self.max_gap_s, source=self.source)
            self.done.update({("i", r["id"], r["end"]): r["end"] for r in chunk})
            self.owed.update(r["run_id"] for r in chunk)
            priced_incidents += len(chunk)
        # an incident that changed after its run ended changes the run's ledger too (a running run's
        # ledger is priced when it ends)
        listed = {rid for rid, _ in ended}
        again = conn.execute(_OF_RUNS_SQL, (sorted(self.owed - listed), now)).fetchall() if self.owed else []
        self.owed = {rid for rid, _ in again} | (self.owed & listed)
        for rid, end in ended + again:
            if spent():
                break
            account_runs(conn, load_runs(conn, [rid]), now=now, max_gap_s=self.max_gap_s, source=self.source)
            keep_points_for_readers(conn, [rid])
            self.done[("r", rid, end)] = end
            self.owed.discard(rid)
            priced_runs += 1
        if priced_incidents or priced_runs:
            log.debug("priced ahead: %d incidents, %d runs", priced_incidents, priced_runs)
        if self.running_hours:
            kept = keep_running_hours(conn, now, deadline)
            if kept:
                log.debug("kept %d hours of running runs' power-cap minutes", kept)
        if self.fleet is not None:
            fleet_hours.keep(conn, self.fleet, now, max(0.0, deadline - time.monotonic()))
        return priced_incidents, priced_runs
