"""Feed a trace bundle into a database the way live agents would.

The live path without HTTP, for the very samples ``gpufleet replay`` reads:
runs registered up front (as the scheduler integration does), then each
node's samples shipped in time order as agent-sized batches (``ship_every_s``
of data per node), node facts with each node's first batch, written by the
collector's group-commit writer.  A test drives the clock: ship up to
``now``, sweep at ``now``, and compares what the live sweeps stored with
what replay found in the same bundle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg

from gpufleet.collector.batch_store import NodeTouch, write_batches
from gpufleet.collector.bundle import Bundle
from gpufleet.collector.replay import register_bundle
from gpufleet.collector.sightings import SightingCache
from gpufleet.wire import Batch, Column


def _take(col: Column, keep: np.ndarray) -> Column:
    values: Any = col.values
    if isinstance(values, list):
        values = [v for v, k in zip(values, keep.tolist(), strict=True) if k]
    else:
        values = values[keep]
    return Column(
        values,
        None if col.null is None else col.null[keep],
        None if col.lengths is None else col.lengths[keep],
    )


class BundleFeed:
    def __init__(
        self, conn: psycopg.Connection, bundle: Bundle, ship_every_s: float = 5.0, send_facts: bool = True
    ) -> None:
        self.conn = conn
        self.bundle = bundle
        self.ship_every_s = ship_every_s
        self._sightings = SightingCache()
        self._touch = NodeTouch(10.0)
        self._seq = 0
        #: Per node, its bundle batches with their time arrays (gpu and host sections).
        self._parts: dict[str, list[tuple[Batch, str, np.ndarray]]] = {}
        for b in bundle.batches:
            for section in ("gpu", "host"):
                cols = getattr(b, section)
                if cols:
                    self._parts.setdefault(b.node, []).append((b, section, np.asarray(cols["time"].values)))
        self._shipped = bundle.t_min - 1.0
        self._facts_due = set(bundle.facts) if send_facts else set()

    def register(self) -> None:
        """Sites, carbon and runs with their allocations, as an operator and the scheduler would declare them."""
        register_bundle(self.conn, self.bundle)

    def run_until(self, t: float) -> None:
        """Ship every sample stamped up to ``t``, ``ship_every_s`` of each node's data per batch."""
        while self._shipped < t:
            upto = min(t, self._shipped + self.ship_every_s)
            self._ship(self._shipped, upto)
            self._shipped = upto

    def _ship(self, after: float, upto: float) -> None:
        items = []
        for node, parts in sorted(self._parts.items()):
            cols: dict[str, dict[str, Column]] = {"gpu": {}, "host": {}}
            counts = {"gpu": 0, "host": 0}
            for b, section, t in parts:
                keep = (t > after) & (t <= upto)
                n = int(keep.sum())
                if n == 0:
                    continue
                if counts[section]:
                    # Two bundle batches of one node and section in one ship: send them separately.
                    items.extend(self._items(node, cols, counts))
                    cols, counts = {"gpu": {}, "host": {}}, {"gpu": 0, "host": 0}
                cols[section] = {name: _take(c, keep) for name, c in getattr(b, section).items()}
                counts[section] = n
            items.extend(self._items(node, cols, counts))
        if items:
            with self.conn.transaction():
                done = write_batches(self.conn, items, sightings_cache=self._sightings, touch=self._touch)
            self._sightings.stored(done.sightings)

    def _items(self, node: str, cols: dict[str, dict[str, Column]], counts: dict[str, int]) -> list[Batch]:
        if not counts["gpu"] and not counts["host"]:
            return []
        self._seq += 1
        facts = None
        if node in self._facts_due:
            facts = self.bundle.facts[node]
            self._facts_due.discard(node)
        b = Batch(
            batch_id=f"live:{node}:{self._seq}",
            node=node,
            gpu=cols["gpu"],
            host=cols["host"],
            facts=facts,
            n_gpu=counts["gpu"],
            n_host=counts["host"],
        )
        return [b]

    def close(self) -> None:
        """Nothing to release: the connection is the caller's."""
