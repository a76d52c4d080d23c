"""Feed a simulated fleet into a database through the collector's writer.

The live path without HTTP: batches as agents would ship them (a few
seconds per node), written by the group-commit writer, so sweeps, rollups
and accounting can be exercised against realistic data quickly.
"""

from __future__ import annotations

from typing import Any

import psycopg

from gpufleet.collector.batch_store import NodeTouch, write_batches
from gpufleet.collector.sightings import SightingCache
from gpufleet.sim import Fleet
from gpufleet.wire import validate


class SimFeed:
    def __init__(
        self, conn: psycopg.Connection, fleet: Fleet, ship_every_s: float = 5.0, send_facts: bool = False
    ) -> None:
        self.conn = conn
        self.fleet = fleet
        self.ship_every_s = ship_every_s
        self._sightings = SightingCache()
        self._touch = NodeTouch(10.0)
        self._pending: dict[str, dict[str, list[dict[str, Any]]]] = {
            n: {"gpu": [], "host": []} for n in fleet.nodes
        }
        self._seq = 0
        self._last_ship = fleet.t
        self._started = False
        #: Nodes whose facts still go with their next batch (agents send them with the first).
        self._facts_due = set(fleet.nodes) if send_facts else set()

    def run_until(self, t: float) -> None:
        """Tick the fleet to ``t``, shipping a batch per node every ``ship_every_s``."""
        if not self._started:
            # An agent's first tick reads the state it starts in, as a bundle's first row does.
            self._started = True
            self._record(self.fleet.t)
        while self.fleet.t < t:
            now = self.fleet.step()
            self._record(now)
            if now - self._last_ship >= self.ship_every_s:
                self.ship()
                self._last_ship = now

    def _record(self, now: float) -> None:
        for node in self.fleet.nodes:
            if not self.fleet.node_up(node):
                continue
            for row in self.fleet.gpu_rows(node):
                self._pending[node]["gpu"].append({**row, "time": now})
            host = self.fleet.host_row(node)
            if host is not None:
                self._pending[node]["host"].append({**host, "time": now})

    def ship(self) -> None:
        items = []
        for node, rows in self._pending.items():
            if not rows["gpu"] and not rows["host"]:
                continue
            self._seq += 1
            doc: dict[str, Any] = {
                "batch_id": f"sim:{node}:{self._seq}",
                "node": node,
                "gpu": rows["gpu"] or None,
                "host": rows["host"] or None,
            }
            if node in self._facts_due:
                doc["facts"] = self.fleet.facts(node)
                self._facts_due.discard(node)
            b = validate(doc)
            items.append(b)
            rows["gpu"], rows["host"] = [], []
        if items:
            with self.conn.transaction():
                done = write_batches(self.conn, items, sightings_cache=self._sightings, touch=self._touch)
            self._sightings.stored(done.sightings)

    def close(self) -> None:
        """Nothing to release: the connection is the caller's."""
