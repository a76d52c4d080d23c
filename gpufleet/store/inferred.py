"""Runs registered from attribution: what agents saw on the GPUs becomes runs and allocations.

The writer keeps ``run_sightings`` (:mod:`gpufleet.collector.sightings`):
per (run, node, GPU), the first and last sample whose ``run_id`` named that
run.  :class:`Inferrer` runs on the collector's leader each sweep interval:

* a run id seen for the first time becomes a run with ``source = 'inferred'``,
  starting at the first sample that showed it, at its first node's site,
  with the name, team and labels the agent reported in its node facts
  (``facts["runs"][run_id]``: a Kubernetes job's name, namespace and team;
  never a label the server owns, such as :data:`ENDED_BY`); each (node, GPU)
  that showed it becomes an allocation;
* a run only grows forward (:mod:`gpufleet.store.authority`): its start never
  moves, and a GPU becomes one of its allocations only when samples showed it
  from within ``SIGHTING_JOIN_WINDOW`` of that start (allocations hold for the
  run's whole window).  Another node's old samples naming a running job, or a
  GPU that turns up hours later, are ``refused`` with the reason, counted and
  logged; a new run starts where most of its GPUs' first samples agree;
* an inferred run ends at its last sample once no GPU has shown it for
  ``grace_s``; samples shipped late that continue it (none of its GPUs
  silent longer than the grace after its end) move the end, or reopen it
  while still recent; samples after a longer gap (pods back hours later, an
  old spool) leave a closed run's window and bill as they were;
* a running inferred run registered before its node's facts arrived takes
  their name, team and labels when they do.

Changing an inferred run's ``end`` through the API (an admin's PATCH) makes
it a registered run: from then on whoever changed it ends it.

Explicit registrations win.  A run id that an API call, the CLI, a Slurm
hook or a bundle registered is never touched (its sightings are marked
``explicit``).  When a registered run takes a GPU that an inferred run holds
over the same time (:func:`yield_to`, called by :mod:`gpufleet.store.runs`),
the inferred run ends where the registered one begins, or, if it began
later, gives that GPU up; it is never extended again (label
:data:`ENDED_BY`).  Registering an inferred run's own id adopts it.

Every write goes through the database's one-run-per-GPU rule (migration
0003).  A refused allocation or window change never reaches ingest (the
samples are already stored): the sighting is marked ``conflict`` with the
database's message naming the other run, logged and counted.  Such a
conflict is final for that (run, node, GPU), so one clash is reported once,
not once a sweep.  Allocations are of whole physical GPUs for a run's whole
duration (``sharing = 'exclusive'``: sharing is declared only by a
registration), so MIG instances or time-sliced replicas of one GPU used by
two runs at once are such a conflict: the first run keeps the GPU.  A
registered run that declares sharing of a GPU an inferred run holds takes
it as any registration does (:func:`yield_to`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from gpufleet.store.authority import densest_start, is_server_label, sighting_refusal

log = logging.getLogger(__name__)

#: Label of an inferred run that gave way to a registered one: that run's id.
ENDED_BY = "gpufleet.ended_by"
#: Label: how the agent attributed the run (``kubernetes``, ``environment``, ``job_file``, ``process``...).
INFERRED_FROM = "gpufleet.inferred_from"
#: Longest text taken from node facts into a run's name, team or a label.
MAX_META = 256


@dataclass
class InferResult:
    """What one pass changed."""

    created: list[str] = field(default_factory=list)
    allocated: int = 0
    #: The database's messages for refused allocations or window changes.
    conflicts: list[str] = field(default_factory=list)
    explicit: int = 0
    invalid: int = 0
    #: Sightings refused: a GPU shown on an existing run from before it began, or long after.
    refused: int = 0
    ended: list[str] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)


def _text(v: Any) -> str | None:
    return v[:MAX_META] if isinstance(v, str) and v else None


def run_meta(conn: psycopg.Connection, run_id: str, nodes: Sequence[str]) -> dict[str, Any]:
    """Name, team and labels the agents of ``nodes`` reported for ``run_id`` (first node that has them)."""
    rows = conn.execute(
        "SELECT node, facts->'runs'->%s FROM nodes WHERE node = ANY(%s)", (run_id, list(nodes))
    ).fetchall()
    by_node = {r[0]: r[1] for r in rows if isinstance(r[1], Mapping)}
    meta = next((by_node[n] for n in nodes if n in by_node), {})
    labels = (
        {
            str(k)[:MAX_META]: v[:MAX_META]
            for k, v in (meta.get("labels") or {}).items()
            if isinstance(v, str) and not is_server_label(str(k))
        }
        if isinstance(meta.get("labels"), Mapping)
        else {}
    )
    source = _text(meta.get("source"))
    if source:
        labels[INFERRED_FROM] = source
    return {"name": _text(meta.get("name")), "team": _text(meta.get("team")), "labels": labels}


#: Ingest stores a sighting's ``last_seen`` again only once it moved this far (collector.sightings).
SIGHTING_LAG = timedelta(seconds=60)


def last_sample(conn: psycopg.Connection, run_id: str, last_seen: datetime) -> datetime:
    """The exact time of the run's last GPU sample: ``last_seen`` of its sightings lags by up to the
    writers' step, so the samples just after it are read (index on node, GPU, time)."""
    row = conn.execute(
        "SELECT max(t) FROM run_sightings s CROSS JOIN LATERAL (SELECT max(g.time) AS t FROM gpu_samples g "
        "WHERE g.node = s.node AND g.gpu = s.gpu AND g.run_id = s.run_id AND g.time >= s.last_seen "
        "AND g.time < s.last_seen + %s) m WHERE s.run_id = %s AND s.status IN ('allocated', 'moved')",
        (SIGHTING_LAG, run_id),
    ).fetchone()
    return max(last_seen, row[0]) if row and row[0] is not None else last_seen


def continues(conn: psycopg.Connection, run_id: str, end: datetime, grace: timedelta) -> bool:
    """Whether the run's own GPUs showed it again within ``grace`` of its ``end``: late samples that
    continue the run, not a return after a gap (its allocated GPUs' samples, by the samples' index)."""
    row = conn.execute(
        "SELECT min(t) FROM run_sightings s CROSS JOIN LATERAL (SELECT min(g.time) AS t FROM gpu_samples g "
        "WHERE g.node = s.node AND g.gpu = s.gpu AND g.run_id = s.run_id AND g.time > %s "
        "AND g.time <= %s) m WHERE s.run_id = %s AND s.status IN ('allocated', 'moved')",
        (end, end + grace, run_id),
    ).fetchone()
    return bool(row and row[0] is not None)


def _conflict_message(e: psycopg.Error) -> str:
    diag = getattr(e, "diag", None)
    return (getattr(diag, "message_primary", None) or str(e)).strip()


class Inferrer:
    """Registers, allocates and ends inferred runs from ``run_sightings`` (one instance per leader)."""

    def __init__(self, grace_s: float) -> None:
        self.grace = timedelta(seconds=grace_s)
        #: (run, wanted end) window changes the database refused: not tried (nor reported) again.
        self._refused: set[tuple[str, datetime | None]] = set()

    def run_once(self, conn: psycopg.Connection, now: datetime) -> InferResult:
        """One pass at time ``now`` (``conn`` in autocommit; each run in a transaction of its own)."""
        out = InferResult()
        pending = conn.execute(
            "SELECT run_id, node, gpu, first_seen, last_seen FROM run_sightings WHERE status = 'pending' "
            "ORDER BY run_id, node, gpu"
        ).fetchall()
        groups = [(run_id, list(rows)) for run_id, rows in groupby(pending, key=lambda r: r[0])]
        # Earliest first: a backlog of several runs on one GPU is registered in time order.
        groups.sort(key=lambda g: (min(r[3] for r in g[1]), g[0]))
        for run_id, rows in groups:
            try:
                self._register(conn, run_id, rows, now, out)
            except psycopg.OperationalError:
                raise
            except psycopg.Error as e:  # one run's trouble must not stop the others
                log.error("inferred runs: registering %r failed: %s", run_id, _conflict_message(e))
        self._end_or_extend(conn, now, out)
        self._late_meta(conn)
        return out

    def _late_meta(self, conn: psycopg.Connection) -> None:
        """Name, team and labels of running inferred runs registered before their node's facts came."""
        rows = conn.execute(
            "SELECT r.run_id, array_agg(DISTINCT a.node) FROM runs r JOIN run_allocations a ON a.run_id = r.run_id "
            "WHERE r.source = 'inferred' AND r.name IS NULL AND r.\"end\" IS NULL GROUP BY r.run_id"
        ).fetchall()
        for run_id, nodes in rows:
            meta = run_meta(conn, run_id, sorted(nodes))
            if meta["name"] is None:
                continue
            conn.execute(
                "UPDATE runs SET name = %s, team = COALESCE(team, %s), labels = %s || labels "
                "WHERE run_id = %s AND name IS NULL",
                (meta["name"], meta["team"], Jsonb(meta["labels"]), run_id),
            )

    # -- registration ------------------------------------------------------------------

    def _mark(
        self,
        conn: psycopg.Connection,
        run_id: str,
        keys: Sequence[tuple[str, int]],
        status: str,
        detail: str | None = None,
    ) -> None:
        conn.execute(
            "UPDATE run_sightings SET status = %s, detail = %s WHERE run_id = %s AND (node, gpu) IN "
            "(SELECT * FROM unnest(%s::text[], %s::int2[]))",
            (status, detail, run_id, [k[0] for k in keys], [k[1] for k in keys]),
        )

    def _register(
        self,
        conn: psycopg.Connection,
        run_id: str,
        rows: list[tuple[Any, ...]],
        now: datetime,
        out: InferResult,
    ) -> None:
        from gpufleet.store.runs import RUN_ID_RE

        keys = [(r[1], int(r[2])) for r in rows]
        with conn.transaction():
            if not RUN_ID_RE.fullmatch(run_id):
                self._mark(
                    conn, run_id, keys, "invalid", f"not a run id the API accepts ({RUN_ID_RE.pattern})"
                )
                out.invalid += len(keys)
                log.warning(
                    "inferred runs: GPU samples name run %r, which is not a valid run id; not registered",
                    run_id,
                )
                return
            run = conn.execute(
                'SELECT source, start, "end", labels FROM runs WHERE run_id = %s FOR UPDATE', (run_id,)
            ).fetchone()
            created = False
            # Samples only ever add GPUs shown from the run's start (an existing run's, or for a new run
            # the start most of its GPUs agree on); the others are refused, with the reason.
            start = run[1] if run is not None else densest_start([r[3] for r in rows])
            ended = run[2] if run is not None else None
            refused = [(r, why) for r in rows if (why := sighting_refusal(start, r[3], ended)) is not None]
            if refused and (run is None or run[0] == "inferred") and not (run and ENDED_BY in (run[3] or {})):
                for r, why in refused:
                    self._mark(conn, run_id, [(r[1], int(r[2]))], "refused", why)
                    log.warning("inferred run %r: node %r GPU %s not allocated: %s", run_id, r[1], r[2], why)
                out.refused += len(refused)
                gone = {(r[1], int(r[2])) for r, _ in refused}
                rows = [r for r in rows if (r[1], int(r[2])) not in gone]
                keys = [k for k in keys if k not in gone]
                if not rows:
                    return
            first = min(r[3] for r in rows)
            last = max(r[4] for r in rows)
            if run is None:
                nodes = list(dict.fromkeys(k[0] for k in keys))
                meta = run_meta(conn, run_id, nodes)
                site_row = conn.execute("SELECT site FROM nodes WHERE node = %s", (nodes[0],)).fetchone()
                end = None if now - last <= self.grace else last
                conn.execute(
                    'INSERT INTO runs (run_id, name, site, team, start, "end", labels, source) '
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, 'inferred')",
                    (
                        run_id,
                        meta["name"],
                        site_row[0] if site_row else None,
                        meta["team"],
                        first,
                        end,
                        Jsonb(meta["labels"]),
                    ),
                )
                created = True
            elif run[0] != "inferred":
                self._mark(conn, run_id, keys, "explicit", "the run is registered; its registration wins")
                out.explicit += len(keys)
                return
            elif ENDED_BY in (run[3] or {}):
                self._mark(conn, run_id, keys, "yielded", f"gave way to registered run {run[3][ENDED_BY]!r}")
                return
            ok = 0
            for node, gpu in keys:
                try:
                    with conn.transaction():
                        conn.execute(
                            "INSERT INTO run_allocations (run_id, node, gpu) VALUES (%s, %s, %s) "
                            "ON CONFLICT DO NOTHING",
                            (run_id, node, gpu),
                        )
                        self._mark(conn, run_id, [(node, gpu)], "allocated")
                    ok += 1
                except psycopg.errors.ExclusionViolation as e:
                    self._mark(conn, run_id, [(node, gpu)], "conflict", _conflict_message(e))
                    self._conflict(out, run_id, e)
            out.allocated += ok
            if created and ok and now - last > self.grace:
                # Registered after the fact (a backlog): it ended at its last sample, exactly.
                ended_at = last_sample(conn, run_id, last)
                if ended_at != last:
                    try:
                        with conn.transaction():
                            conn.execute('UPDATE runs SET "end" = %s WHERE run_id = %s', (ended_at, run_id))
                    except psycopg.errors.ExclusionViolation as e:
                        self._conflict(out, run_id, e)
            if created and ok == 0:
                # Every GPU it showed on belongs to another run then: no run of its own.
                conn.execute("DELETE FROM runs WHERE run_id = %s", (run_id,))
            elif created:
                out.created.append(run_id)
                log.info(
                    "inferred run %r registered from GPU samples: %d GPUs from %s",
                    run_id,
                    ok,
                    first.isoformat(),
                )

    def _conflict(self, out: InferResult, run_id: str, e: psycopg.Error) -> None:
        msg = _conflict_message(e)
        out.conflicts.append(msg)
        log.warning(
            "inferred run %r not registered on a GPU: %s (the samples are stored; an admin can fix the "
            "runs with PATCH /v1/runs)",
            run_id,
            msg,
        )

    # -- ends --------------------------------------------------------------------------

    def _end_or_extend(self, conn: psycopg.Connection, now: datetime, out: InferResult) -> None:
        """Running inferred runs (few, by a partial index) and ended ones whose sightings moved since
        (ingest marks them ``moved``): never a scan of every run ever inferred."""
        rows = conn.execute(
            'SELECT r.run_id, r."end", max(s.last_seen) FROM runs r '
            "JOIN run_sightings s ON s.run_id = r.run_id AND s.status IN ('allocated', 'moved') "
            'WHERE r.source = \'inferred\' AND r."end" IS NULL AND NOT r.labels ? %s GROUP BY r.run_id, r."end" '
            "UNION ALL "
            'SELECT r.run_id, r."end", m.last FROM (SELECT run_id, max(last_seen) AS last FROM run_sightings '
            "WHERE status = 'moved' GROUP BY run_id) m JOIN runs r ON r.run_id = m.run_id "
            "WHERE r.source = 'inferred' AND r.\"end\" IS NOT NULL AND NOT r.labels ? %s",
            (ENDED_BY, ENDED_BY),
        ).fetchall()
        conn.execute(
            "UPDATE run_sightings SET status = 'allocated' WHERE status = 'moved' AND run_id = ANY(%s)",
            ([r[0] for r in rows],),
        )
        for run_id, end, last in rows:
            if end is not None and not continues(conn, run_id, end, self.grace):
                continue  # samples after a gap: a closed run's window and bill stand
            if now - last <= self.grace:
                want = None  # shown now, and never silent longer than the grace: still running
            elif end is not None and end >= last:
                continue  # ended at (or after) the last sighting already
            else:
                want = last_sample(conn, run_id, last)
            if want == end or (run_id, want) in self._refused:
                continue
            try:
                with conn.transaction():
                    conn.execute(
                        "UPDATE runs SET \"end\" = %s WHERE run_id = %s AND source = 'inferred'",
                        (want, run_id),
                    )
            except psycopg.errors.ExclusionViolation as e:
                self._refused.add((run_id, want))
                self._conflict(out, run_id, e)
                continue
            if want is None:
                out.reopened.append(run_id)
            elif end is None:
                out.ended.append(run_id)
                log.info("inferred run %r ended: no GPU showed it after %s", run_id, want.isoformat())


def yield_to(
    conn: psycopg.Connection,
    run_id: str,
    start: datetime,
    end: datetime | None,
    gpus: Sequence[tuple[str, int]],
    closed_before: datetime | None = None,
) -> list[str]:
    """Inferred runs holding any of ``gpus`` during [start, end) give way to the registered run ``run_id``.

    One that began earlier ends at ``start``; one that began at or after
    ``start`` gives those GPUs up (and is deleted when it holds no GPU any
    more).  Runs in the caller's transaction; returns the inferred runs changed.
    ``closed_before`` (a node's registration): runs that ended before it are
    closed and do not give way (the database then refuses the overlap).
    """
    if not gpus:
        return []
    rows = conn.execute(
        "SELECT r.run_id, r.start, a.node, a.gpu FROM run_allocations a JOIN runs r ON r.run_id = a.run_id "
        "WHERE r.source = 'inferred' AND r.run_id <> %s "
        "AND (a.node, a.gpu) IN (SELECT * FROM unnest(%s::text[], %s::int2[])) "
        "AND tstzrange(r.start, r.\"end\", '[)') && tstzrange(%s, %s, '[)') "
        'AND (%s::timestamptz IS NULL OR r."end" IS NULL OR r."end" >= %s) ORDER BY r.run_id, a.node, a.gpu',
        (run_id, [g[0] for g in gpus], [g[1] for g in gpus], start, end, closed_before, closed_before),
    ).fetchall()
    changed = []
    for other, items in groupby(rows, key=lambda r: r[0]):
        held = list(items)
        other_start = held[0][1]
        if other_start < start:
            conn.execute(
                'UPDATE runs SET "end" = %s, labels = labels || %s WHERE run_id = %s',
                (start, Jsonb({ENDED_BY: run_id}), other),
            )
        else:
            nodes, idx = [h[2] for h in held], [h[3] for h in held]
            conn.execute(
                "DELETE FROM run_allocations WHERE run_id = %s AND (node, gpu) IN "
                "(SELECT * FROM unnest(%s::text[], %s::int2[]))",
                (other, nodes, idx),
            )
            conn.execute(
                "UPDATE run_sightings SET status = 'yielded', detail = %s WHERE run_id = %s AND (node, gpu) "
                "IN (SELECT * FROM unnest(%s::text[], %s::int2[]))",
                (f"gave way to registered run {run_id!r}", other, nodes, idx),
            )
            if (
                conn.execute("SELECT 1 FROM run_allocations WHERE run_id = %s LIMIT 1", (other,)).fetchone()
                is None
            ):
                conn.execute("DELETE FROM runs WHERE run_id = %s", (other,))
        log.info("inferred run %r gave way to registered run %r", other, run_id)
        changed.append(other)
    return changed


def adopt(conn: psycopg.Connection, run_id: str, spec: Mapping[str, Any], labels: Mapping[str, Any]) -> None:
    """A registration of an inferred run's own id makes it a registered run (given fields win)."""
    sets = ["source = 'registered'", "labels = (labels - %s) || %s"]
    params: list[Any] = [ENDED_BY, Jsonb(dict(labels))]
    for col in ("name", "site", "team", "params", "start"):
        if spec.get(col) is not None:
            sets.append(f"{col} = %s")
            params.append(spec[col])
    if "end" in spec and spec["end"] is not None:
        sets.append('"end" = %s')
        params.append(spec["end"])
    conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = %s", [*params, run_id])
    conn.execute(
        "UPDATE run_sightings SET status = 'explicit', detail = 'the run is registered; its registration "
        "wins' WHERE run_id = %s AND status = 'pending'",
        (run_id,),
    )
