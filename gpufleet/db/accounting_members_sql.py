"""Accounting V7: fleet-wide lines read the fleet's kept hours; the membership probes each GPU once.

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
period (``bench/read_side.py``'s fleet).  V7 evaluates each probe once per GPU (``OFFSET 0`` keeps a
lateral select from being flattened), reads each table's first and last in one probe, and takes
every GPU's first and last run from one grouped pass over the allocations (``held_by``), which the
planner hashes, instead of an index probe of every allocation of every GPU.  That pass reads every
allocation ever made, so it grows with the history of runs, as the probes did.

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

_NEW_PROBES = (
    "  LEFT JOIN held_by hb ON hb.node = g.node AND hb.gpu = g.gpu\n"
    "  CROSS JOIN LATERAL (\n"
    "    SELECT (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time LIMIT 1) AS s0,"
    " (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time DESC LIMIT 1) AS s1,\n"
    "           eh.h0, eh.h1, es.t0, es.t1\n"
    "    FROM (SELECT min(e.bucket) AS h0, max(e.bucket) + INTERVAL '1 hour' AS h1\n"
    "          FROM gpu_energy_1h e WHERE e.node = g.node AND e.gpu = g.gpu) eh,\n"
    "         (SELECT min(e.t0) AS t0, max(e.t1) AS t1 FROM gpu_energy_spans e WHERE e.node = g.node AND e.gpu = g.gpu) es\n"
    "    OFFSET 0\n"
    "  ) o\n"
    "  CROSS JOIN LATERAL (\n"
    "    SELECT least(nd.first_seen, CASE WHEN o.s0 IS NULL OR o.h0 + INTERVAL '1 hour' <= o.s0 THEN o.h0 ELSE o.s0 END,\n"
    "                 o.t0, hb.r0) AS joined,\n"
    "           greatest(nd.first_seen, coalesce(o.s1, o.h1), o.t1, hb.r1) AS last\n"
    "    OFFSET 0\n"
    "  ) k\n"
)

_SWAPS: tuple[tuple[str, str], ...] = (
    (_OLD_PROBES, _NEW_PROBES),
    (
        "fleet_gpu AS MATERIALIZED (\n",
        "-- every GPU's first and last run (its start, and its end up to now), for the membership below\n"
        "held_by AS MATERIALIZED (\n"
        "  SELECT a.node, a.gpu::integer AS gpu, min(r.start) AS r0,\n"
        '         max(greatest(r.start, least(coalesce(r."end", p_now), p_now))) AS r1\n'
        "  FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE p_fleet GROUP BY 1, 2\n"
        "),\n"
        "fleet_gpu AS MATERIALIZED (\n",
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
