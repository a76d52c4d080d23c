
CREATE FUNCTION gpufleet_ledger_pieces(p_from timestamptz, p_to timestamptz, p_now timestamptz DEFAULT now(),
                                       p_runs text[] DEFAULT NULL)
RETURNS TABLE (run_id text, state text, node text, gpu integer, lo timestamptz, hi timestamptz,
               weight double precision)
LANGUAGE sql STABLE AS $fn$
WITH kinds(kind, state, rank, job_wide, wholly) AS (VALUES
    ('checkpoint_stall', 'checkpoint', 2, false, false),
    ('hung_collective', 'hung', 1, true, true),
    ('idle_allocation', 'idle', 0, false, true),
    ('starvation', 'starved', 3, false, false),
    ('straggler', 'straggler_wait', 4, true, false),
    ('throttling', 'throttled', 5, false, false)
),
-- the runs' accounted windows, as gpufleet_accounting's run_w has them
w AS MATERIALIZED (
  SELECT r.run_id, l.lo, greatest(l.lo, least(coalesce(r."end", p_now), p_now, coalesce(p_to, 'infinity'))) AS hi
  FROM runs r CROSS JOIN LATERAL (SELECT greatest(r.start, coalesce(p_from, r.start)) AS lo) l
  WHERE (p_runs IS NULL OR r.run_id = ANY(p_runs))
    AND (p_runs IS NOT NULL OR (r.start < coalesce(p_to, 'infinity')
                                AND (p_from IS NULL OR r."end" IS NULL OR r."end" > p_from)))
),
-- each incident's span in its run's window
c AS MATERIALIZED (
  SELECT i.id, i.kind, i.run_id, i.node, i.gpu, coalesce(i.evidence, '{}'::jsonb) AS ev, k.state, k.rank,
         k.job_wide, k.wholly, greatest(i.start, w.lo) AS a, least(coalesce(i."end", p_now), p_now, w.hi) AS b
  FROM incidents i JOIN w ON w.run_id = i.run_id JOIN kinds k ON k.kind = i.kind
  WHERE i.start < w.hi AND greatest(i.start, w.lo) < least(coalesce(i."end", p_now), p_now, w.hi)
),
-- the GPUs an incident names in evidence.gpus ({"node": text, "gpu": integer, ...})
listed AS (
  SELECT c.id, e->>'node' AS node, (e->>'gpu')::integer AS gpu, e AS entry
  FROM c CROSS JOIN LATERAL jsonb_array_elements(c.ev->'gpus') e
  WHERE jsonb_typeof(c.ev->'gpus') = 'array' AND jsonb_typeof(e) = 'object' AND jsonb_typeof(e->'node') = 'string'
    AND jsonb_typeof(e->'gpu') = 'number' AND (e->>'gpu') ~ '^-?[0-9]{1,9}$'
),
-- each claimed GPU of the run with its lost share: job-wide kinds every GPU; else those evidence.gpus
-- lists; else its GPU; else the run's GPUs on its node; else every GPU of the run
cw AS MATERIALIZED (
  SELECT c.run_id, a.node, a.gpu::integer AS gpu, c.a, c.b, c.state, c.rank, CASE
      WHEN c.wholly THEN 1.0
      WHEN c.kind IN ('starvation', 'checkpoint_stall') THEN coalesce(
        (CASE WHEN ((CASE WHEN jsonb_typeof(c.ev->'gpu_time_lost_share') = 'number' THEN (c.ev->'gpu_time_lost_share')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest((CASE WHEN jsonb_typeof(c.ev->'gpu_time_lost_share') = 'number' THEN (c.ev->'gpu_time_lost_share')::text::float8 END), 0.0), 1.0) END), (CASE WHEN ((CASE WHEN jsonb_typeof(c.ev->'run_time_lost_share') = 'number' THEN (c.ev->'run_time_lost_share')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest((CASE WHEN jsonb_typeof(c.ev->'run_time_lost_share') = 'number' THEN (c.ev->'run_time_lost_share')::text::float8 END), 0.0), 1.0) END),
        (CASE WHEN (1.0 - (CASE WHEN jsonb_typeof(c.ev->'duty_cycle') = 'number' THEN (c.ev->'duty_cycle')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest(1.0 - (CASE WHEN jsonb_typeof(c.ev->'duty_cycle') = 'number' THEN (c.ev->'duty_cycle')::text::float8 END), 0.0), 1.0) END), 1.0)
      WHEN c.kind = 'throttling' THEN
        CASE WHEN l.entry ? 'throttled_share' THEN coalesce((CASE WHEN ((CASE WHEN jsonb_typeof(l.entry->'throttled_share') = 'number' THEN (l.entry->'throttled_share')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest((CASE WHEN jsonb_typeof(l.entry->'throttled_share') = 'number' THEN (l.entry->'throttled_share')::text::float8 END), 0.0), 1.0) END) * (CASE WHEN (1.0 - (CASE WHEN jsonb_typeof(l.entry->'clock_ratio') = 'number' THEN (l.entry->'clock_ratio')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest(1.0 - (CASE WHEN jsonb_typeof(l.entry->'clock_ratio') = 'number' THEN (l.entry->'clock_ratio')::text::float8 END), 0.0), 1.0) END), 0.0) ELSE coalesce((CASE WHEN ((CASE WHEN jsonb_typeof(c.ev->'throttled_share') = 'number' THEN (c.ev->'throttled_share')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest((CASE WHEN jsonb_typeof(c.ev->'throttled_share') = 'number' THEN (c.ev->'throttled_share')::text::float8 END), 0.0), 1.0) END) * (CASE WHEN (1.0 - (CASE WHEN jsonb_typeof(c.ev->'clock_ratio') = 'number' THEN (c.ev->'clock_ratio')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest(1.0 - (CASE WHEN jsonb_typeof(c.ev->'clock_ratio') = 'number' THEN (c.ev->'clock_ratio')::text::float8 END), 0.0), 1.0) END), 0.0) END
      WHEN c.kind = 'straggler' THEN (CASE WHEN (CASE WHEN jsonb_typeof(c.ev->'activity') = 'number' THEN (c.ev->'activity')::text::float8 END) IS NOT NULL AND (CASE WHEN jsonb_typeof(c.ev->'peer_activity') = 'number' THEN (c.ev->'peer_activity')::text::float8 END) IS NOT NULL AND greatest((CASE WHEN jsonb_typeof(c.ev->'activity') = 'number' THEN (c.ev->'activity')::text::float8 END), (CASE WHEN jsonb_typeof(c.ev->'peer_activity') = 'number' THEN (c.ev->'peer_activity')::text::float8 END)) > 0 THEN (CASE WHEN (1.0 - least((CASE WHEN jsonb_typeof(c.ev->'activity') = 'number' THEN (c.ev->'activity')::text::float8 END), (CASE WHEN jsonb_typeof(c.ev->'peer_activity') = 'number' THEN (c.ev->'peer_activity')::text::float8 END)) / greatest((CASE WHEN jsonb_typeof(c.ev->'activity') = 'number' THEN (c.ev->'activity')::text::float8 END), (CASE WHEN jsonb_typeof(c.ev->'peer_activity') = 'number' THEN (c.ev->'peer_activity')::text::float8 END))) IS NULL THEN NULL ELSE least(greatest(1.0 - least((CASE WHEN jsonb_typeof(c.ev->'activity') = 'number' THEN (c.ev->'activity')::text::float8 END), (CASE WHEN jsonb_typeof(c.ev->'peer_activity') = 'number' THEN (c.ev->'peer_activity')::text::float8 END)) / greatest((CASE WHEN jsonb_typeof(c.ev->'activity') = 'number' THEN (c.ev->'activity')::text::float8 END), (CASE WHEN jsonb_typeof(c.ev->'peer_activity') = 'number' THEN (c.ev->'peer_activity')::text::float8 END)), 0.0), 1.0) END) ELSE 0.0 END)
      ELSE coalesce((CASE WHEN ((CASE WHEN jsonb_typeof(c.ev->'gpu_time_lost_share') = 'number' THEN (c.ev->'gpu_time_lost_share')::text::float8 END)) IS NULL THEN NULL ELSE least(greatest((CASE WHEN jsonb_typeof(c.ev->'gpu_time_lost_share') = 'number' THEN (c.ev->'gpu_time_lost_share')::text::float8 END), 0.0), 1.0) END), 0.0)
    END AS w
  FROM c JOIN run_allocations a ON a.run_id = c.run_id
  LEFT JOIN listed l ON NOT c.job_wide AND l.id = c.id AND l.node = a.node AND l.gpu = a.gpu
  WHERE CASE WHEN c.job_wide THEN true
             WHEN jsonb_typeof(c.ev->'gpus') = 'array' THEN l.id IS NOT NULL
             WHEN c.gpu IS NOT NULL THEN a.node = c.node AND a.gpu = c.gpu
             WHEN c.node IS NOT NULL THEN a.node = c.node
             ELSE true END
),
claims AS MATERIALIZED (SELECT * FROM cw WHERE cw.w > 0),
-- each GPU's time cut at every claim's ends; each stretch goes to the first state claiming it, with
-- that state's largest share
cuts AS (
  SELECT x.run_id, x.node, x.gpu, x.t, lead(x.t) OVER (PARTITION BY x.run_id, x.node, x.gpu ORDER BY x.t) AS t1
  FROM (SELECT k.run_id, k.node, k.gpu, k.a AS t FROM claims k UNION SELECT k.run_id, k.node, k.gpu, k.b FROM claims k) x
),
best AS (
  SELECT DISTINCT ON (s.run_id, s.node, s.gpu, s.t) s.run_id, s.node, s.gpu, s.t AS t0, s.t1, k.state, k.w
  FROM cuts s JOIN claims k ON k.run_id = s.run_id AND k.node = s.node AND k.gpu = s.gpu AND k.a <= s.t AND k.b >= s.t1
  WHERE s.t1 IS NOT NULL
  ORDER BY s.run_id, s.node, s.gpu, s.t, k.rank, k.w DESC
),
-- adjacent stretches of one state and share merged
marked AS (
  SELECT b.*, CASE WHEN lag(b.t1) OVER g = b.t0 AND lag(b.state) OVER g = b.state AND lag(b.w) OVER g = b.w
                   THEN 0 ELSE 1 END AS brk
  FROM best b WINDOW g AS (PARTITION BY b.run_id, b.node, b.gpu ORDER BY b.t0)
),
grouped AS (
  SELECT m.*, sum(m.brk) OVER (PARTITION BY m.run_id, m.node, m.gpu ORDER BY m.t0) AS grp FROM marked m
)
SELECT g.run_id, g.state, g.node, g.gpu, min(g.t0), max(g.t1), g.w
FROM grouped g
GROUP BY g.run_id, g.node, g.gpu, g.grp, g.state, g.w
ORDER BY 1, 3, 4, 5
$fn$
