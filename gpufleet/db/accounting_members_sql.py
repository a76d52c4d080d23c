"""Accounting V7: fleet-wide lines read the fleet's kept hours; the membership probes most GPUs once.

A fleet-wide call of line detail (every fleet-wide read: the boards, ``/v1/accounting``, the reports)
is answered by ``gpufleet_accounting_kept`` (:mod:`gpufleet.db.fleet_hours_sql`): the hours the
collector's leader kept, the rest priced live an hour at a time.  Other calls (a run's, segments,
steps) are priced as before.

Whether a GPU is in the fleet over the period (when it joined, when it left: ``_membership`` of
:mod:`gpufleet.db.accounting_sql`) is decided from its first and last sample, energy hour and long
counter interval, and the first and last run that held it.  V6 wrote those as scalar subqueries in
lateral selects the planner flattens into the query, so each was planned once per place its result is
named: the run probes five times, the sample probes three.  On 10,000 GPUs that was 2.7 of the
2.8 s of one closed hour's fleet accounting, and the same on every fleet-wide read whatever its
period (``bench/read_side.py``'s fleet).  V7 first asks what decides most GPUs: a GPU whose node
registered by the period's start and that was heard from within ``gone_after_s`` of its end is in the
fleet over all of it (its join is no later than the registration, its leave no earlier than the
last sample plus ``gone_after_s``), known from the node's row and one probe of its last sample.  Only
the others (new nodes, silent GPUs) are probed in full, each probe once (``OFFSET 0`` keeps a lateral
select from being flattened), each table's first and last in one probe.

The membership is the same, so the lines are; from the kept hours, the same to the rounding of
their sums.  Migration 0030 installs this text.
"""

from __future__ import annotations

from gpufleet.db.accounting_fleet_sql import swapped
from gpufleet.db.accounting_sets_sql import ACCOUNTING_V6

_OLD_PROBES = (
    "  CROSS JOIN LATERAL (\n"
    "    SELECT (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time LIMIT 1) AS s0,"
    " (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time DESC LIMIT 1) AS s1,\n"
    "           (SELECT min(e.bucket) FROM gpu_energy_1h e WHERE e.node = g.node AND e.gpu = g.gpu) AS h0,"
    " (SELECT max(e.bucket) + INTERVAL '1 hour' FROM gpu_energy_1h e WHERE e.node = g.node AND e.gpu = g.gpu) AS h1\n"
    "  ) o\n"
    "  CROSS JOIN LATERAL (\n"
    "    SELECT least(nd.first_seen, CASE WHEN o.s0 IS NULL OR o.h0 + INTERVAL '1 hour' <= o.s0 THEN o.h0 ELSE o.s0 END,\n"
    "                 (SELECT min(e.t0) FROM gpu_energy_spans e WHERE e.node = g.node AND e.gpu = g.gpu),"
    " (SELECT min(r.start) FROM run_allocations a JOIN runs r ON r.run_id = a.run_id"
    " WHERE a.node = g.node AND a.gpu = g.gpu)) AS joined,\n"
    "           greatest(nd.first_seen, coalesce(o.s1, o.h1),"
    " (SELECT max(e.t1) FROM gpu_energy_spans e WHERE e.node = g.node AND e.gpu = g.gpu),\n"
    '                    (SELECT max(greatest(r.start, least(coalesce(r."end", p_now), p_now)))'
    " FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE a.node = g.node AND a.gpu = g.gpu)) AS last\n"
    "  ) k\n"
)

_G = "make_interval(secs => p_gone_after_s)"
_NEW_PROBES = (
    "  -- in the fleet over the whole period, known from two values: registered by its start and heard from\n"
    "  -- within gone_after_s of its end (most GPUs); the others are probed in full\n"
    "  CROSS JOIN LATERAL (\n"
    "    SELECT coalesce(nd.first_seen <= win.f AND greatest(nd.first_seen,\n"
    "             (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time DESC LIMIT 1))\n"
    f"             + {_G} >= win.t, false) AS whole\n"
    "    OFFSET 0\n"
    "  ) q\n"
    "  LEFT JOIN LATERAL (\n"
    "    SELECT least(nd.first_seen, CASE WHEN o.s0 IS NULL OR o.h0 + INTERVAL '1 hour' <= o.s0 THEN o.h0 ELSE o.s0 END,\n"
    "                 o.t0, o.r0) AS joined,\n"
    "           greatest(nd.first_seen, coalesce(o.s1, o.h1), o.t1, o.r1) AS last\n"
    "    FROM (\n"
    "      SELECT (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time LIMIT 1) AS s0,"
    " (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time DESC LIMIT 1) AS s1,\n"
    "             eh.h0, eh.h1, es.t0, es.t1, rh.r0, rh.r1\n"
    "      FROM (SELECT min(e.bucket) AS h0, max(e.bucket) + INTERVAL '1 hour' AS h1\n"
    "            FROM gpu_energy_1h e WHERE e.node = g.node AND e.gpu = g.gpu) eh,\n"
    "           (SELECT min(e.t0) AS t0, max(e.t1) AS t1 FROM gpu_energy_spans e WHERE e.node = g.node AND e.gpu = g.gpu) es,\n"
    '           (SELECT min(r.start) AS r0, max(greatest(r.start, least(coalesce(r."end", p_now), p_now))) AS r1\n'
    "            FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE a.node = g.node AND a.gpu = g.gpu) rh\n"
    "      WHERE NOT q.whole  -- inside the subquery: a gate before its probes, not a filter after them\n"
    "      OFFSET 0\n"
    "    ) o\n"
    "  ) k ON true\n"
)

_SWAPS: tuple[tuple[str, str], ...] = (
    (_OLD_PROBES, _NEW_PROBES),
    (
        "  CROSS JOIN LATERAL (\n"
        f"    SELECT k.joined, CASE WHEN k.last + {_G} < p_now THEN k.last + {_G}\n"
        "                          ELSE 'infinity'::timestamptz END AS gone\n"
        "  ) m\n"
        "  WHERE m.joined IS NOT NULL AND greatest(win.f, m.joined) < least(win.t, m.gone)\n",
        "  CROSS JOIN LATERAL (\n"
        "    SELECT CASE WHEN q.whole THEN win.f ELSE greatest(win.f, k.joined) END AS a,\n"
        f"           CASE WHEN q.whole THEN win.t ELSE least(win.t, CASE WHEN k.last + {_G} < p_now THEN k.last + {_G}\n"
        "                                                            ELSE 'infinity'::timestamptz END) END AS b,\n"
        "           q.whole OR k.joined IS NOT NULL AS joined\n"
        "  ) m\n"
        "  WHERE m.joined AND m.a < m.b\n",
    ),
    (
        "  SELECT g.node, g.gpu, greatest(win.f, m.joined) AS a, least(win.t, m.gone) AS b FROM (SELECT DISTINCT",
        "  SELECT g.node, g.gpu, m.a, m.b FROM (SELECT DISTINCT",
    ),
    (
        "BEGIN\nIF p_fleet THEN\nRETURN QUERY\n",
        "BEGIN\nIF p_fleet AND p_detail = 'line' AND p_runs IS NULL AND p_from IS NOT NULL THEN\n"
        "RETURN QUERY SELECT * FROM gpufleet_accounting_kept(p_from, p_to, p_now, p_max_gap_s, p_source,\n"
        "                                                    p_gone_after_s);\n"
        "ELSIF p_fleet THEN\nRETURN QUERY\n",
    ),
)

ACCOUNTING_V7 = swapped(ACCOUNTING_V6, _SWAPS)
