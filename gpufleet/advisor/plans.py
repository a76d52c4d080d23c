"""Power-cap plans: one limit for every GPU of a run, and what its nodes' agents made of it.

A plan is set with the admin role (``PUT /v1/runs/{id}/power-cap``), with
the advisor's proposed limit or one of the operator's.  The agents of the
run's nodes (``agent.power_caps``, off by default) read the plans for their
node (:func:`plans_for_node`) and report in their node facts
(``power_caps.<run_id>``: ``applied``, ``failed`` with the reason,
``restored``).  A plan is handed out only while it is active, its run is
running, and no node has reported a failure at its revision: a node that
cannot apply it withdraws it from every node of the run at their next poll
(every GPU of the run or none), until a new revision (a new ``PUT``)
retries.  When the run ends it is no longer handed out and the agents put
the previous limits back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.timeparse import iso

#: Highest limit accepted, W (far above any board; the agent checks the board's own range).
MAX_LIMIT_W = 10_000.0

PLAN_SQL = """
SELECT p.run_id, p.limit_w::float8, p.revision, p.state, p.reason, p.created_by, p.created_at, p.updated_at
FROM power_cap_plans p WHERE p.run_id = %s
"""

#: Reports of the run's nodes (their facts' ``power_caps.<run_id>``).
REPORTS_SQL = """
SELECT n.node, n.facts->'power_caps'->%s
FROM nodes n
WHERE n.node IN (SELECT node FROM run_allocations WHERE run_id = %s) AND n.facts->'power_caps' ? %s
ORDER BY n.node
"""

#: Active plans of running runs holding GPUs on a node, with those GPUs.
NODE_PLANS_SQL = """
SELECT p.run_id, p.limit_w::float8, p.revision, array_agg(a.gpu ORDER BY a.gpu)
FROM power_cap_plans p
JOIN runs r ON r.run_id = p.run_id
JOIN run_allocations a ON a.run_id = p.run_id AND a.node = %s
WHERE p.state = 'active' AND r.start <= %s AND (r."end" IS NULL OR r."end" > %s)
GROUP BY p.run_id, p.limit_w, p.revision
ORDER BY p.run_id
"""


class PlanError(ValueError):
    """A plan that cannot be set; the message says why (the API answers 409 or 404)."""

    def __init__(self, msg: str, status: int = 409) -> None:
        super().__init__(msg)
        self.status = status


def reports(conn: psycopg.Connection, run_id: str) -> dict[str, dict[str, Any]]:
    """Each node's last report about the run's plan."""
    return {
        node: rep
        for node, rep in conn.execute(REPORTS_SQL, (run_id, run_id, run_id)).fetchall()
        if isinstance(rep, dict)
    }


def get_plan(conn: psycopg.Connection, run_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(PLAN_SQL, (run_id,)).fetchone()
    if row is None:
        return None
    nodes = reports(conn, run_id)
    failed = {
        n: r.get("detail")
        for n, r in nodes.items()
        if r.get("state") == "failed" and r.get("revision") == row["revision"]
    }
    state = row["state"] if not failed or row["state"] != "active" else "failed"
    return {
        **row,
        "state": state,
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "nodes": nodes,
        "failed_on": failed,
    }


def set_plan(
    conn: psycopg.Connection,
    run_id: str,
    limit_w: float,
    by: str | None,
    reason: str | None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Make ``limit_w`` the run's plan (a new revision); PlanError when the run is unknown or not running."""
    t = now or datetime.now(UTC)
    if not 0 < limit_w <= MAX_LIMIT_W:
        raise PlanError(f"limit_w must be above 0 and at most {MAX_LIMIT_W:g} W, not {limit_w:g}", 422)
    run = conn.execute('SELECT start, "end" FROM runs WHERE run_id = %s', (run_id,)).fetchone()
    if run is None:
        raise PlanError(f"run {run_id!r} not found", 404)
    if run[1] is not None and run[1] <= t:
        raise PlanError(f"run {run_id!r} has ended: there is nothing to cap")
    if conn.execute("SELECT 1 FROM run_allocations WHERE run_id = %s LIMIT 1", (run_id,)).fetchone() is None:
        raise PlanError(f"run {run_id!r} holds no GPU")
    conn.execute(
        """INSERT INTO power_cap_plans (run_id, limit_w, revision, state, reason, created_by, created_at, updated_at)
           VALUES (%s, %s, 1, 'active', %s, %s, %s, %s)
           ON CONFLICT (run_id) DO UPDATE SET limit_w = EXCLUDED.limit_w,
             revision = power_cap_plans.revision + 1, state = 'active', reason = EXCLUDED.reason,
             created_by = EXCLUDED.created_by, updated_at = EXCLUDED.updated_at""",
        (run_id, limit_w, reason, by, t, t),
    )
    plan = get_plan(conn, run_id)
    assert plan is not None
    return plan


def withdraw_plan(
    conn: psycopg.Connection, run_id: str, by: str | None, now: datetime | None = None
) -> dict[str, Any]:
    t = now or datetime.now(UTC)
    n = conn.execute(
        "UPDATE power_cap_plans SET state = 'withdrawn', revision = revision + 1, updated_at = %s, "
        "created_by = %s WHERE run_id = %s",
        (t, by, run_id),
    ).rowcount
    if not n:
        raise PlanError(f"run {run_id!r} has no power-cap plan", 404)
    plan = get_plan(conn, run_id)
    assert plan is not None
    return plan


def plans_for_node(conn: psycopg.Connection, node: str, now: datetime | None = None) -> list[dict[str, Any]]:
    """What the node's agent must apply: active plans of running runs on it, less those any node failed."""
    t = now or datetime.now(UTC)
    out = []
    for run_id, limit_w, revision, gpus in conn.execute(NODE_PLANS_SQL, (node, t, t)).fetchall():
        failed = [
            n
            for n, r in reports(conn, run_id).items()
            if r.get("state") == "failed" and r.get("revision") == revision
        ]
        if failed:
            continue  # every GPU of the run or none: withdrawn everywhere until a new revision
        out.append({"run_id": run_id, "limit_w": limit_w, "revision": revision, "gpus": list(gpus)})
    return out
