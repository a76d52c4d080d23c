"""Accounting V6: the fleet path joins each GPU and node to the allocations that hold it, instead of
scanning every allocation once per GPU.

V5 cut each GPU's time at its allocations' edges with a lateral subquery over ``held`` (the period's
allocations, a CTE, so without an index), summed each node's held share with a correlated subquery
over ``held`` per host piece, and each GPU piece's held share with one over ``gpu_hold`` per piece:
three scans of a whole CTE per GPU or piece, so the fleet path grew with GPUs x allocations.  On
10,000 GPUs with 15,176 allocations in a day (``bench/read_side.py``'s fleet) they were 32 of the 52 s
of one day's fleet accounting.  V6 writes the same sets as joins, which the planner hashes: the cuts
as one ``UNION`` over every GPU (each GPU's cuts are its own rows, as before), the held shares as
grouped outer joins.

Nothing else changes: the same lines and money.  Claims may be numbered in another order, so
double-precision sums over them may differ in their last bits (the rounded figures do not: the tests
compare V6 with V5 line by line).  Migration 0027 installs this text.
"""

from __future__ import annotations

from gpufleet.db.accounting_fleet_sql import ACCOUNTING_V5, swapped

_SWAPS: tuple[tuple[str, str], ...] = (
    (
        "gpu_cuts AS (\n"
        "  SELECT g.node, g.gpu, c.t FROM fleet_gpu g  CROSS JOIN LATERAL (\n"
        "    SELECT g.a AS t UNION SELECT g.b\n"
        "    UNION SELECT v.x FROM held h CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x)\n"
        "    WHERE h.node = g.node AND h.gpu = g.gpu AND v.x > g.a AND v.x < g.b) c\n"
        "),",
        "gpu_cuts AS (\n"
        "  SELECT g.node, g.gpu, g.a AS t FROM fleet_gpu g\n"
        "  UNION SELECT g.node, g.gpu, g.b FROM fleet_gpu g\n"
        "  UNION SELECT g.node, g.gpu, v.x FROM fleet_gpu g JOIN held h ON h.node = g.node AND h.gpu = g.gpu\n"
        "    CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x) WHERE v.x > g.a AND v.x < g.b\n"
        "),",
    ),
    (
        "host_cuts AS (\n"
        "  SELECT n.node, c.t FROM node_info n CROSS JOIN win CROSS JOIN LATERAL (\n"
        "    SELECT win.f AS t UNION SELECT win.t\n"
        "    UNION SELECT v.x FROM held h CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x)\n"
        "    WHERE h.node = n.node AND v.x > win.f AND v.x < win.t) c\n"
        "  WHERE p_fleet AND win.f < win.t\n"
        "),",
        "host_cuts AS (\n"
        "  SELECT n.node, win.f AS t FROM node_info n CROSS JOIN win WHERE p_fleet AND win.f < win.t\n"
        "  UNION SELECT n.node, win.t FROM node_info n CROSS JOIN win WHERE p_fleet AND win.f < win.t\n"
        "  UNION SELECT n.node, v.x FROM node_info n CROSS JOIN win JOIN held h ON h.node = n.node\n"
        "    CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x)\n"
        "    WHERE p_fleet AND win.f < win.t AND v.x > win.f AND v.x < win.t\n"
        "),",
    ),
    (
        "  SELECT s.node, s.a, s.b, n.reported, n.sk,\n"
        "         coalesce((SELECT sum(h.share) FROM held h WHERE h.node = s.node AND h.lo <= s.a AND h.hi >= s.b), 0) AS held\n"
        "  FROM (SELECT host_cuts.node, host_cuts.t AS a,\n"
        "               lead(host_cuts.t) OVER (PARTITION BY host_cuts.node ORDER BY host_cuts.t) AS b FROM host_cuts) s\n"
        "  JOIN node_info n ON n.node = s.node WHERE s.b IS NOT NULL\n",
        "  SELECT s.node, s.a, s.b, n.reported, n.sk, coalesce(sum(h.share), 0) AS held\n"
        "  FROM (SELECT host_cuts.node, host_cuts.t AS a,\n"
        "               lead(host_cuts.t) OVER (PARTITION BY host_cuts.node ORDER BY host_cuts.t) AS b FROM host_cuts) s\n"
        "  JOIN node_info n ON n.node = s.node\n"
        "  LEFT JOIN held h ON h.node = s.node AND h.lo <= s.a AND h.hi >= s.b\n"
        "  WHERE s.b IS NOT NULL GROUP BY s.node, s.a, s.b, n.reported, n.sk\n",
    ),
    (
        "           greatest(1.0 - coalesce((SELECT sum(g.w) FROM gpu_hold g\n"
        "                                    WHERE g.node = s.node AND g.gpu = s.gpu AND g.a = s.a), 0), 0.0),\n"
        "           ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)\n"
        "    FROM gpu_sub s JOIN node_info n ON n.node = s.node CROSS JOIN all_bounds ab\n",
        "           greatest(1.0 - coalesce(gh.w, 0), 0.0),\n"
        "           ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)\n"
        "    FROM gpu_sub s JOIN node_info n ON n.node = s.node CROSS JOIN all_bounds ab\n"
        "    LEFT JOIN (SELECT g.node, g.gpu, g.a, sum(g.w) AS w FROM gpu_hold g GROUP BY 1, 2, 3) gh\n"
        "      ON gh.node = s.node AND gh.gpu = s.gpu AND gh.a = s.a\n",
    ),
)


ACCOUNTING_V6 = swapped(ACCOUNTING_V5, _SWAPS)
