"""Node facts that price or classify, dated: what a closed period was billed with stays what it was.

A node's facts (``nodes.facts``) are whatever its agent said last.  Some of
them decide money: the GPU model of each GPU picks the site's per-model
GPU-hour price, and the MIG layout, the GPU count and the site the agent
reports classify its GPUs.  Read from the current facts, one batch naming an
H100 a Tesla T4 would re-price every closed run on that GPU.

So those facts are kept as a history, ``node_facts_history``: one row per
change of the priced subset (:data:`PRICED_FACTS_FN`), valid from the time
the collector received it (``now()`` of the writing transaction, never a
time the node names, so a node cannot date a change back).  Accounting reads
the facts in force at a time with ``gpufleet_node_facts_at(node, at)``: the
last row valid at ``at``, else the node's first row (a run before the node's
first facts report), else ``nodes.facts`` (a node that has no history, such as
one written by hand).  Migration 0013 installs both functions and seeds each
node's history with its current facts, valid from ``-infinity``: what was
read before is what is read after.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

#: The priced subset of a facts object: GPU model, per-GPU names and MIG layout, GPU count, site.
#: Only values of the types :class:`gpufleet.facts.NodeFacts` accepts are kept.
PRICED_FACTS_FN = """
CREATE OR REPLACE FUNCTION gpufleet_priced_facts(p jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT jsonb_strip_nulls(jsonb_build_object(
    'gpu_model', CASE WHEN jsonb_typeof(p -> 'gpu_model') = 'string' THEN p -> 'gpu_model' END,
    'gpu_count', CASE WHEN jsonb_typeof(p -> 'gpu_count') = 'number' THEN p -> 'gpu_count' END,
    'site', CASE WHEN jsonb_typeof(p -> 'site') = 'string' THEN p -> 'site' END,
    'gpus', (SELECT jsonb_agg(jsonb_build_object('gpu', x.e -> 'gpu', 'index', x.e -> 'index', 'name', x.e -> 'name',
                                                 'mig_enabled', x.e -> 'mig_enabled',
                                                 'mig_instances', x.e -> 'mig_instances') ORDER BY x.i)
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p -> 'gpus') = 'array' THEN p -> 'gpus'
                                            ELSE '[]'::jsonb END) WITH ORDINALITY AS x(e, i)
             WHERE jsonb_typeof(x.e) = 'object'),
    'dcgm_mig_instances', CASE WHEN jsonb_typeof(p -> 'dcgm_mig_instances') = 'array'
                               THEN p -> 'dcgm_mig_instances' END))
$fn$"""

#: The priced facts of a node in force at a time (module docstring).
FACTS_AT_FN = """
CREATE OR REPLACE FUNCTION gpufleet_node_facts_at(p_node text, p_at timestamptz) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
  SELECT coalesce(
    (SELECT h.facts FROM node_facts_history h WHERE h.node = p_node AND h.valid_from <= p_at
     ORDER BY h.valid_from DESC LIMIT 1),
    (SELECT h.facts FROM node_facts_history h WHERE h.node = p_node ORDER BY h.valid_from LIMIT 1),
    (SELECT n.facts FROM nodes n WHERE n.node = p_node))
$fn$"""

#: Records the priced facts of nodes that sent facts (``%s``: node names, facts objects), in the
#: ingest transaction, only where they differ from the node's latest row.
RECORD_SQL = """
INSERT INTO node_facts_history AS h (node, valid_from, facts)
SELECT u.node, now(), gpufleet_priced_facts(u.facts)
FROM unnest(%s::text[], %s::jsonb[]) AS u(node, facts)
WHERE u.facts IS NOT NULL
  AND gpufleet_priced_facts(u.facts) IS DISTINCT FROM
      (SELECT l.facts FROM node_facts_history l WHERE l.node = u.node ORDER BY l.valid_from DESC LIMIT 1)
ON CONFLICT (node, valid_from) DO UPDATE SET facts = EXCLUDED.facts"""

#: Migration 0013 seeds each node's history with what it reads today, valid since always.
SEED_SQL = """
INSERT INTO node_facts_history (node, valid_from, facts)
SELECT node, '-infinity'::timestamptz, gpufleet_priced_facts(facts) FROM nodes WHERE facts <> '{}'::jsonb"""


#: How the accounting query reads an allocation's node facts: current, and in force when its priced piece
#: begins (``gpufleet.db.accounting_sql``, V3 of ``gpufleet_accounting``; migration 0021).
CURRENT_FACTS_JOIN = "FROM alloc a LEFT JOIN nodes nd ON nd.node = a.node"
DATED_FACTS_JOIN = "FROM alloc a CROSS JOIN LATERAL (SELECT gpufleet_node_facts_at(a.node, a.lo) AS facts) nd"


def dated_pricing(text: str) -> str:
    """An accounting function's text reading the GPU model from the facts in force, not the current ones."""
    if CURRENT_FACTS_JOIN not in text:
        raise AssertionError("the accounting query no longer reads node facts where dated pricing expects")
    return text.replace(CURRENT_FACTS_JOIN, DATED_FACTS_JOIN)


def facts_at(conn: psycopg.Connection, node: str, at: datetime) -> dict[str, Any]:
    """The priced facts of ``node`` in force at ``at`` ({} when the node has none)."""
    row = conn.execute("SELECT gpufleet_node_facts_at(%s, %s)", (node, at)).fetchone()
    return dict(row[0]) if row and isinstance(row[0], dict) else {}


def history(conn: psycopg.Connection, node: str) -> list[tuple[datetime, dict[str, Any]]]:
    """Every dated row of ``node``, oldest first."""
    rows = conn.execute(
        "SELECT valid_from, facts FROM node_facts_history WHERE node = %s ORDER BY valid_from", (node,)
    ).fetchall()
    return [(r[0], r[1]) for r in rows]
