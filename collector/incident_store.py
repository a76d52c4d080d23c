"""Incidents in the database: applies the lifecycle's plans transactionally.

The lifecycle (``collector.incidents``) decides; this module only stores.
A partial unique index allows one open incident per scope, so even two
sweepers racing (a leadership hand-over) cannot open a scope twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from gpufleet.collector.detectors.window import Finding
from gpufleet.collector.incidents import OPEN, Incident, Plan, plan_sweep
from gpufleet.timeparse import at


def clean_json(obj: Any) -> Any:
    """Evidence as strict JSON: numpy scalars to Python, NaN/inf to null."""
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def load_open(conn: psycopg.Connection) -> list[Incident]:
    rows = conn.execute(
        "SELECT id, kind, scope_key, cause, severity, extract(epoch FROM start)::float8, "
        "extract(epoch FROM last_seen)::float8, evidence, run_id, node, gpu, "
        "extract(epoch FROM last_active)::float8, hold_s FROM incidents WHERE state = 'open'"
    ).fetchall()
    return [
        Incident(
            id=r[0],
            kind=r[1],
            scope_key=r[2],
            cause=r[3],
            severity=r[4],
            start=r[5],
            last_seen=r[6],
            evidence=r[7],
            run_id=r[8],
            node=r[9],
            gpu=r[10],
            last_active=r[11],
            hold_s=r[12],
            state=OPEN,
        )
        for r in rows
    ]


def last_ends(conn: psycopg.Connection, scope_keys: Iterable[str]) -> dict[str, float]:
    keys = sorted(set(scope_keys))
    if not keys:
        return {}
    rows = conn.execute(
        'SELECT scope_key, extract(epoch FROM max("end"))::float8 FROM incidents '
        "WHERE state = 'resolved' AND scope_key = ANY(%s) GROUP BY scope_key",
        (keys,),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def apply(conn: psycopg.Connection, plan: Plan) -> None:
    """Apply resolves, updates, then opens (the order the plan asks for)."""
    for r in plan.resolves:
        conn.execute(
            "UPDATE incidents SET state = 'resolved', \"end\" = %s WHERE scope_key = %s AND state = 'open'",
            (at(r.end), r.scope_key),
        )
    for u in plan.updates:
        conn.execute(
            "UPDATE incidents SET cause = %s, severity = %s, evidence = %s, last_seen = %s, last_active = %s, "
            "start = %s, hold_s = %s, node = CASE WHEN %s THEN %s ELSE node END "
            "WHERE scope_key = %s AND state = 'open'",
            (
                u.cause,
                u.severity,
                Jsonb(clean_json(u.evidence)),
                at(u.last_seen),
                at(u.last_active),
                at(u.start),
                u.hold_s,
                u.renode,
                u.node,
                u.scope_key,
            ),
        )
    for o in plan.opens:
        i = o.incident
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, run_id, node, gpu, cause, severity, state, start, last_seen, "
            "last_active, hold_s, evidence) VALUES (%s, %s, %s, %s, %s, %s, %s, 'open', %s, %s, %s, %s, %s) "
            "ON CONFLICT (scope_key) WHERE state = 'open' DO NOTHING",
            (
                i.kind,
                i.scope_key,
                i.run_id,
                i.node,
                i.gpu,
                i.cause,
                i.severity,
                at(i.start),
                at(i.last_seen),
                at(i.last_active),
                i.hold_s,
                Jsonb(clean_json(i.evidence)),
            ),
        )


def sweep(
    conn: psycopg.Connection,
    findings: list[Finding],
    now: float,
    resolve_after_s: float,
    owns: Callable[[Incident], bool] | None = None,
) -> Plan:
    """Plan against the stored state and apply, in one transaction.

    ``owns``: the open incidents this sweep answers for (a sweep shard's);
    the others are neither updated nor resolved.  None: all of them."""
    with conn.transaction():
        current = load_open(conn)
        if owns is not None:
            current = [i for i in current if owns(i)]
        plan = plan_sweep(
            current, findings, now, resolve_after_s, last_ends(conn, (f.scope_key for f in findings))
        )
        apply(conn, plan)
    return plan


def store_all(conn: psycopg.Connection, incidents: Iterable[Incident]) -> int:
    """Write incidents that a lifecycle kept elsewhere (replay's memory store), open and resolved.

    Replay then reads them as the live collector reads its own: per-run
    accounting takes the time starvation and checkpoint stalls lost from
    ``incidents`` (goodput), whatever store decided them.
    """
    n = 0
    for i in incidents:
        conn.execute(
            'INSERT INTO incidents (kind, scope_key, run_id, node, gpu, cause, severity, state, start, "end", '
            "last_seen, last_active, hold_s, evidence) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                i.kind,
                i.scope_key,
                i.run_id,
                i.node,
                i.gpu,
                i.cause,
                i.severity,
                i.state,
                at(i.start),
                at(i.end),
                at(i.last_seen),
                at(i.last_active),
                i.hold_s,
                Jsonb(clean_json(i.evidence)),
            ),
        )
        n += 1
    return n
