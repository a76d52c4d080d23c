"""The power-cap advisor's reads of a run's minutes, and its running runs' kept hours (migration 0032)."""

from __future__ import annotations

from gpufleet.db import fleet_hours_sql as H
from gpufleet.db.priced_store_sql import HORIZON

#: Per range %(runs)s[i] over [%(los)s[i], %(his)s[i]) (i from 1) and minute: the least and greatest
#: enforced limit over the run's GPUs, the GPUs reporting, their exact energy and its coverage.
RANGES_MINUTES_SQL = """
SELECT w.i, m.*
FROM unnest(%(runs)s::text[], %(los)s::timestamptz[], %(his)s::timestamptz[]) WITH ORDINALITY w(run_id, lo, hi, i)
CROSS JOIN LATERAL (  -- a range at a time, a GPU at a time: both rollups' buckets by their indexes
  SELECT extract(epoch FROM x.bucket)::float8, min(x.power_limit_w)::float8, max(x.power_limit_w)::float8,
         count(*), coalesce(sum(x.energy_j), 0)::float8, coalesce(sum(x.covered_s), 0)::float8
  FROM run_allocations a
  CROSS JOIN LATERAL (
    SELECT st.bucket, st.power_limit_w, e.energy_j, e.covered_s
    FROM (SELECT bucket, power_limit_w FROM gpu_stats_1m
          WHERE node = a.node AND gpu = a.gpu AND bucket >= w.lo AND bucket < w.hi) st
    LEFT JOIN (SELECT bucket, energy_j, covered_s FROM gpu_energy_1m
               WHERE node = a.node AND gpu = a.gpu AND bucket >= w.lo AND bucket < w.hi) e ON e.bucket = st.bucket
  ) x
  WHERE a.run_id = w.run_id
  GROUP BY x.bucket
) m
ORDER BY w.i, 2
"""

#: The kept hours ending by %(cut)s of the keys %(keys)s whose run, whole and hour marks still hold.
LOOKUP_MINUTES_SQL = f"""
SELECT k.digest, k.hour, k.minutes FROM kept_power_minutes k
WHERE k.digest = ANY(%(keys)s) AND k.hour + INTERVAL '1 hour' <= %(cut)s AND k.lo >= {HORIZON}
  AND k.run_mark = coalesce((SELECT m.version FROM pricing_marks m WHERE m.scope = 'r:' || k.run_id), 0)
  AND {H.holds("k", "k.hour")}"""

#: The hours ending by %(cut)s kept under the keys %(keys)s that still hold (without their minutes).
KEPT_HOURS_SQL = LOOKUP_MINUTES_SQL.replace("k.digest, k.hour, k.minutes", "k.digest, k.hour", 1)

#: Stores one kept hour (digest, hour, run_id, lo, run_mark, whole_mark, hour_mark, minutes; ``lo``
#: again last) unless retention reaches the run.
KEEP_MINUTES_SQL = (
    "INSERT INTO kept_power_minutes (digest, hour, run_id, lo, run_mark, whole_mark, hour_mark, minutes) "
    f"SELECT %s, %s, %s, %s, %s, %s, %s, %s WHERE %s >= {HORIZON} "
    "ON CONFLICT (digest, hour) DO UPDATE SET run_id = EXCLUDED.run_id, lo = EXCLUDED.lo, "
    "run_mark = EXCLUDED.run_mark, whole_mark = EXCLUDED.whole_mark, hour_mark = EXCLUDED.hour_mark, "
    "minutes = EXCLUDED.minutes, stored_at = now()"
)
