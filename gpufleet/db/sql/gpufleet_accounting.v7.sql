
CREATE OR REPLACE FUNCTION gpufleet_accounting(
  p_from timestamptz, p_to timestamptz, p_now timestamptz DEFAULT now(), p_runs text[] DEFAULT NULL,
  p_fleet boolean DEFAULT true, p_max_gap_s double precision DEFAULT 60, p_source text DEFAULT 'auto',
  p_detail text DEFAULT 'line', p_step interval DEFAULT NULL,
  p_gone_after_s double precision DEFAULT 86400.0)
RETURNS TABLE (
  line text, run_id text, site text, part_start timestamptz, part_end timestamptz,
  gpu_count integer, gpu_equivalents double precision, gpu_s double precision, covered_s double precision,
  gpu_hours numeric, covered_hours numeric, coverage double precision, gpu_kwh numeric, host_kwh numeric, it_kwh numeric,
  facility_kwh numeric, pue numeric,
  co2e_kg numeric, co2e_unknown_kwh numeric, carbon_source text, g_co2e_per_kwh double precision,
  price_source text, price_per_kwh double precision, currency text, minor_units integer,
  energy_cost numeric, compute_cost numeric, total_cost numeric, stale boolean)
LANGUAGE plpgsql STABLE SET jit = off AS $fn$
#variable_conflict use_column
BEGIN
IF p_fleet AND p_detail = 'line' AND p_runs IS NULL AND p_from IS NOT NULL THEN
RETURN QUERY SELECT * FROM gpufleet_accounting_kept(p_from, p_to, p_now, p_max_gap_s, p_source,
                                                    p_gone_after_s);
ELSIF p_fleet THEN
RETURN QUERY

WITH
win AS (
  SELECT p_from AS f, greatest(p_from, least(coalesce(p_to, 'infinity'), p_now)) AS t
),
run_w AS MATERIALIZED (
  SELECT r.run_id, r.site, coalesce(r.site, '') AS sk, l.lo,
         greatest(l.lo, least(coalesce(r."end", p_now), p_now, coalesce(p_to, 'infinity'))) AS hi
  FROM runs r CROSS JOIN LATERAL (SELECT greatest(r.start, coalesce(p_from, r.start)) AS lo) l
  WHERE (p_runs IS NULL OR r.run_id = ANY(p_runs))
    AND (p_runs IS NOT NULL OR (r.start < coalesce(p_to, 'infinity')
                                AND (p_from IS NULL OR r."end" IS NULL OR r."end" > p_from)))
),
alloc AS MATERIALIZED (
  SELECT w.run_id, w.site, w.sk, w.lo, w.hi, a.node, a.gpu::integer AS gpu, a.share
  FROM run_w w JOIN run_allocations a ON a.run_id = w.run_id
),
span AS MATERIALIZED (
  SELECT least((SELECT min(lo) FROM run_w), CASE WHEN p_fleet THEN (SELECT f FROM win) END) AS lo,
         greatest((SELECT max(hi) FROM run_w), CASE WHEN p_fleet THEN (SELECT t FROM win) END) AS hi
),
fleet_gpu AS MATERIALIZED (
  SELECT g.node, g.gpu, m.a, m.b FROM (SELECT DISTINCT x.node, x.gpu FROM (
    SELECT n.node, g.g AS gpu FROM nodes n CROSS JOIN LATERAL generate_series(0, coalesce(n.gpu_count, 0) - 1) g(g)
    UNION ALL SELECT alloc.node, alloc.gpu FROM alloc
    UNION ALL SELECT e.node, e.gpu FROM gpu_energy_1h e, win
      WHERE e.bucket >= date_bin(INTERVAL '1 hour', win.f, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND e.bucket < win.t
    -- a GPU whose only energy in the period is a long counter interval has no rollup bucket there
    UNION ALL SELECT e.node, e.gpu FROM gpu_energy_spans e, win WHERE e.t0 < win.t AND e.t1 > win.f
    UNION ALL SELECT s.node, s.gpu FROM gpu_samples s, win
      WHERE p_source = 'raw' AND s.time >= win.f AND s.time < win.t AND s.mig_instance IS NULL
  ) x WHERE p_fleet AND (SELECT f < t FROM win)) g CROSS JOIN win
  LEFT JOIN nodes nd ON nd.node = g.node
  -- in the fleet over the whole period, known from two values: registered by its start and heard from
  -- within gone_after_s of its end (most GPUs); the others are probed in full
  CROSS JOIN LATERAL (
    SELECT coalesce(nd.first_seen <= win.f AND greatest(nd.first_seen,
             (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time DESC LIMIT 1))
             + make_interval(secs => p_gone_after_s) >= win.t, false) AS whole
    OFFSET 0
  ) q
  LEFT JOIN LATERAL (
    SELECT least(nd.first_seen, CASE WHEN o.s0 IS NULL OR o.h0 + INTERVAL '1 hour' <= o.s0 THEN o.h0 ELSE o.s0 END,
                 o.t0, o.r0) AS joined,
           greatest(nd.first_seen, coalesce(o.s1, o.h1), o.t1, o.r1) AS last
    FROM (
      SELECT (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time LIMIT 1) AS s0, (SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time DESC LIMIT 1) AS s1,
             eh.h0, eh.h1, es.t0, es.t1, rh.r0, rh.r1
      FROM (SELECT min(e.bucket) AS h0, max(e.bucket) + INTERVAL '1 hour' AS h1
            FROM gpu_energy_1h e WHERE e.node = g.node AND e.gpu = g.gpu) eh,
           (SELECT min(e.t0) AS t0, max(e.t1) AS t1 FROM gpu_energy_spans e WHERE e.node = g.node AND e.gpu = g.gpu) es,
           (SELECT min(r.start) AS r0, max(greatest(r.start, least(coalesce(r."end", p_now), p_now))) AS r1
            FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE a.node = g.node AND a.gpu = g.gpu) rh
      WHERE NOT q.whole  -- inside the subquery: a gate before its probes, not a filter after them
      OFFSET 0
    ) o
  ) k ON true
  CROSS JOIN LATERAL (
    SELECT CASE WHEN q.whole THEN win.f ELSE greatest(win.f, k.joined) END AS a,
           CASE WHEN q.whole THEN win.t ELSE least(win.t, CASE WHEN k.last + make_interval(secs => p_gone_after_s) < p_now THEN k.last + make_interval(secs => p_gone_after_s)
                                                            ELSE 'infinity'::timestamptz END) END AS b,
           q.whole OR k.joined IS NOT NULL AS joined
  ) m
  WHERE m.joined AND m.a < m.b
),
node_info AS MATERIALIZED (
  SELECT x.node, coalesce(nd.site, '') AS sk,
    coalesce(nd.gpu_count::integer,
      (SELECT nullif(count(DISTINCT g.gpu), 0)::integer FROM (
         SELECT e.gpu FROM gpu_energy_1h e, span
         WHERE e.node = x.node AND e.bucket >= date_bin(INTERVAL '1 hour', span.lo, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND e.bucket < span.hi
         UNION SELECT e.gpu FROM gpu_energy_spans e, span WHERE e.node = x.node AND e.t0 < span.hi AND e.t1 > span.lo
       ) g),
      (SELECT nullif(count(DISTINCT s.gpu), 0)::integer FROM gpu_samples s, span
       WHERE s.node = x.node AND s.time >= span.lo AND s.time <= span.hi AND s.mig_instance IS NULL), 0) AS reported
  FROM (SELECT DISTINCT alloc.node FROM alloc
        UNION SELECT fleet_gpu.node FROM fleet_gpu
        UNION SELECT e.node FROM host_energy_1h e, win
        WHERE p_fleet AND e.bucket >= date_bin(INTERVAL '1 hour', win.f, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND e.bucket < win.t
        ) x
  LEFT JOIN nodes nd ON nd.node = x.node
),
rates AS MATERIALIZED (
  SELECT s.sk, r.t0, r.t1, r.pue, r.price_per_kwh, r.g_co2e_per_kwh, r.carbon_source, r.currency,
         row_number() OVER (PARTITION BY s.sk ORDER BY r.t0)::integer AS ix
  FROM (SELECT DISTINCT run_w.sk FROM run_w
        UNION SELECT node_info.sk FROM node_info WHERE p_fleet
       ) s
  CROSS JOIN span CROSS JOIN LATERAL gpufleet_energy_rates(nullif(s.sk, ''), span.lo, span.hi, p_step) r
),
bounds AS MATERIALIZED (SELECT rates.sk, array_agg(rates.t0 ORDER BY rates.t0) AS b FROM rates GROUP BY rates.sk),
all_bounds AS MATERIALIZED (SELECT coalesce(array_agg(DISTINCT rates.t0 ORDER BY rates.t0), '{}') AS b FROM rates),
run_edges AS (
  SELECT w.run_id, ARRAY(SELECT e FROM unnest(b.b) e WHERE e > w.lo AND e < w.hi) AS edges
  FROM run_w w JOIN bounds b ON b.sk = w.sk WHERE w.lo < w.hi
),
held AS MATERIALIZED (SELECT alloc.* FROM alloc WHERE p_fleet AND alloc.lo < alloc.hi),
gpu_cuts AS (
  SELECT g.node, g.gpu, g.a AS t FROM fleet_gpu g
  UNION SELECT g.node, g.gpu, g.b FROM fleet_gpu g
  UNION SELECT g.node, g.gpu, v.x FROM fleet_gpu g JOIN held h ON h.node = g.node AND h.gpu = g.gpu
    CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x) WHERE v.x > g.a AND v.x < g.b
),
gpu_sub AS MATERIALIZED (
  SELECT s.node, s.gpu, s.a, s.b FROM (
    SELECT gpu_cuts.node, gpu_cuts.gpu, gpu_cuts.t AS a,
           lead(gpu_cuts.t) OVER (PARTITION BY gpu_cuts.node, gpu_cuts.gpu ORDER BY gpu_cuts.t) AS b
    FROM gpu_cuts) s WHERE s.b IS NOT NULL
),
gpu_hold AS (
  SELECT s.node, s.gpu, s.a, s.b, h.sk, sum(h.share) AS w
  FROM gpu_sub s JOIN held h ON h.node = s.node AND h.gpu = s.gpu AND h.lo <= s.a AND h.hi >= s.b
  GROUP BY 1, 2, 3, 4, 5
),
host_cuts AS (
  SELECT n.node, win.f AS t FROM node_info n CROSS JOIN win WHERE p_fleet AND win.f < win.t
  UNION SELECT n.node, win.t FROM node_info n CROSS JOIN win WHERE p_fleet AND win.f < win.t
  UNION SELECT n.node, v.x FROM node_info n CROSS JOIN win JOIN held h ON h.node = n.node
    CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x)
    WHERE p_fleet AND win.f < win.t AND v.x > win.f AND v.x < win.t
),
host_sub AS MATERIALIZED (
  SELECT s.node, s.a, s.b, n.reported, n.sk, coalesce(sum(h.share), 0) AS held
  FROM (SELECT host_cuts.node, host_cuts.t AS a,
               lead(host_cuts.t) OVER (PARTITION BY host_cuts.node ORDER BY host_cuts.t) AS b FROM host_cuts) s
  JOIN node_info n ON n.node = s.node
  LEFT JOIN held h ON h.node = s.node AND h.lo <= s.a AND h.hi >= s.b
  WHERE s.b IS NOT NULL GROUP BY s.node, s.a, s.b, n.reported, n.sk
),
host_hold AS (
  SELECT s.node, s.a, s.b, h.sk, sum(h.share) / greatest(s.reported, s.held) AS w
  FROM host_sub s JOIN held h ON h.node = s.node AND h.lo <= s.a AND h.hi >= s.b
  GROUP BY 1, 2, 3, 4, s.reported, s.held
),
claims AS MATERIALIZED (
  SELECT row_number() OVER ()::integer AS k, x.* FROM (
    SELECT 'run'::text AS line, a.run_id, a.sk, a.node, a.gpu, a.lo, a.hi, a.share, e.edges
    FROM alloc a JOIN run_edges e ON e.run_id = a.run_id
    UNION ALL
    SELECT 'run', h.run_id, h.sk, h.node, NULL::integer, h.lo, h.hi, h.held / greatest(n.reported, h.held), e.edges
    FROM (SELECT alloc.run_id, alloc.sk, alloc.lo, alloc.hi, alloc.node, sum(alloc.share) AS held
          FROM alloc GROUP BY 1, 2, 3, 4, 5) h
    JOIN node_info n ON n.node = h.node JOIN run_edges e ON e.run_id = h.run_id
    UNION ALL
    SELECT 'unallocated', NULL, n.sk, s.node, s.gpu, s.a, s.b,
           greatest(1.0 - coalesce(gh.w, 0), 0.0),
           ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM gpu_sub s JOIN node_info n ON n.node = s.node CROSS JOIN all_bounds ab
    LEFT JOIN (SELECT g.node, g.gpu, g.a, sum(g.w) AS w FROM gpu_hold g GROUP BY 1, 2, 3) gh
      ON gh.node = s.node AND gh.gpu = s.gpu AND gh.a = s.a
    UNION ALL
    SELECT 'total', NULL, NULL, s.node, s.gpu, s.a, s.b, 1.0, ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM gpu_sub s CROSS JOIN all_bounds ab
    UNION ALL
    SELECT 'unallocated', NULL, s.sk, s.node, NULL, s.a, s.b,
           CASE WHEN greatest(s.reported, s.held) = 0 THEN 1.0
                ELSE (greatest(s.reported, s.held) - s.held) / greatest(s.reported, s.held) END,
           ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM host_sub s CROSS JOIN all_bounds ab
    UNION ALL
    SELECT 'total', NULL, NULL, s.node, NULL, s.a, s.b, 1.0, ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM host_sub s CROSS JOIN all_bounds ab
  ) x
),
-- who pays for each share of a total claim: the runs holding it at their sites, the rest the node's site
-- (normalised to the whole: GPU time held twice, which the database refuses, still counts once here)
claimants AS MATERIALIZED (
  SELECT y.k, y.sk, sum(y.w) AS w FROM (
  SELECT x.k, x.sk, x.w / greatest(1.0, sum(x.w) OVER (PARTITION BY x.k)) AS w FROM (
    SELECT c.k, g.sk, g.w FROM claims c JOIN gpu_hold g ON g.node = c.node AND g.gpu = c.gpu AND g.a = c.lo
    WHERE c.line = 'total' AND c.gpu IS NOT NULL
    UNION ALL
    SELECT c.k, u.sk, u.share FROM claims c JOIN claims u ON u.line = 'unallocated' AND u.node = c.node
      AND u.gpu IS NOT DISTINCT FROM c.gpu AND u.lo = c.lo
    WHERE c.line = 'total'
    UNION ALL
    SELECT c.k, h.sk, h.w FROM claims c JOIN host_hold h ON h.node = c.node AND h.a = c.lo
    WHERE c.line = 'total' AND c.gpu IS NULL
  ) x) y GROUP BY y.k, y.sk
),
mix AS (
  SELECT claimants.k, string_agg(claimants.sk || '=' || claimants.w::text, ',' ORDER BY claimants.sk, claimants.w)
           AS sig
  FROM claimants GROUP BY claimants.k
),
-- claims summed together: a run's, the unallocated ones of one site, the total ones paid for alike
grouped AS MATERIALIZED (
  SELECT c.*, dense_rank() OVER (ORDER BY CASE c.line WHEN 'run' THEN 'r' || c.run_id
                                                      WHEN 'unallocated' THEN 'u' || c.sk
                                                      WHEN 'total' THEN 't' || coalesce(m.sig, '')
                                                      END)::integer AS grp
  FROM claims c
  LEFT JOIN mix m ON m.k = c.k
),
group_of AS (SELECT DISTINCT g.grp, g.line, g.run_id, g.sk FROM grouped g WHERE g.line <> 'total'),
total_mix AS (
  SELECT DISTINCT g.grp, cl.sk, cl.w FROM grouped g JOIN claimants cl ON cl.k = g.k WHERE g.line = 'total'
),
en AS MATERIALIZED (
  SELECT * FROM gpufleet_claim_energy(
    (SELECT array_agg(ROW(g.k, g.grp, g.node, g.gpu, g.lo, g.hi, g.share, g.edges)::gpufleet_claim) FROM grouped g),
    p_max_gap_s, p_source)
),
measured AS (
  SELECT go.line, go.run_id, go.sk, en.seg_start, sum(en.gpu_j) AS gj, sum(en.covered_s) AS cs,
         sum(en.host_j) AS hj, bool_or(en.stale) AS st
  FROM en JOIN group_of go ON go.grp = en.grp GROUP BY 1, 2, 3, 4
  UNION ALL
  SELECT 'total', NULL, tm.sk, en.seg_start, sum(en.gpu_j * tm.w), sum(en.covered_s * tm.w), sum(en.host_j * tm.w),
         bool_or(en.stale)
  FROM en JOIN total_mix tm ON tm.grp = en.grp GROUP BY 3, 4
),
priced AS (
  SELECT m.*, r.t1 AS seg_end, r.pue AS rpue, r.price_per_kwh AS price, r.g_co2e_per_kwh AS g, r.carbon_source, r.currency AS cur,
         (m.gj + m.hj) / 3.6e6 * r.pue AS fac, CASE p_detail WHEN 'segment' THEN m.seg_start WHEN 'step' THEN date_bin(p_step, m.seg_start, TIMESTAMPTZ '2000-01-01 00:00:00+00') END AS part
  FROM (SELECT m0.*, width_bucket(m0.seg_start, b.b) AS ix FROM measured m0 JOIN bounds b ON b.sk = m0.sk) m
  JOIN rates r ON r.sk = m.sk AND r.ix = m.ix
),
energy_lines AS (
  SELECT p.line, p.run_id, p.sk, p.part, p.cur, min(p.seg_end) AS part_end, sum(p.gj) / 3.6e6 AS gpu_kwh,
         sum(p.hj) / 3.6e6 AS host_kwh, sum(p.fac) AS fac, sum(p.fac::numeric * p.g::numeric) / 1000 AS co2e,
         coalesce(sum(p.fac) FILTER (WHERE p.g IS NULL), 0) AS unknown, sum(p.fac::numeric * p.price::numeric) AS ecost,
         sum(p.cs) AS cs, bool_or(p.st) AS st,
         CASE WHEN count(DISTINCT p.carbon_source) = 1 THEN min(p.carbon_source) ELSE 'mixed' END AS csrc,
         CASE WHEN count(DISTINCT p.price) = 1 THEN min(p.price) END AS one_price,
         CASE WHEN count(DISTINCT p.g) = 1 THEN min(p.g) END AS one_g,
         count(DISTINCT p.price) AS prices
  FROM priced p GROUP BY 1, 2, 3, 4, 5
),
-- GPU-seconds of the fleet lines, from the claims themselves (energy or not)
fleet_time AS (
  SELECT c.line, c.k, c.sk, c.share AS w, seg.a, seg.b
  FROM claims c CROSS JOIN LATERAL (
    SELECT z.a, coalesce(lead(z.a) OVER (ORDER BY z.a), c.hi) AS b FROM unnest(ARRAY[c.lo] || c.edges) z(a)) seg
  WHERE c.line <> 'run' AND c.gpu IS NOT NULL
),
fleet_s AS (
  SELECT t.line, t.sk, CASE p_detail WHEN 'segment' THEN t.a WHEN 'step' THEN date_bin(p_step, t.a, TIMESTAMPTZ '2000-01-01 00:00:00+00') END AS part, r.currency AS cur, sum(t.w * extract(epoch FROM t.b - t.a)::float8) AS gpu_s
  FROM fleet_time t LEFT JOIN bounds b ON b.sk = t.sk
  LEFT JOIN rates r ON r.sk = t.sk AND r.ix = width_bucket(t.a, b.b)
  WHERE t.line = 'unallocated' GROUP BY 1, 2, 3, 4
  UNION ALL
  SELECT 'total', cl.sk, CASE p_detail WHEN 'segment' THEN t.a WHEN 'step' THEN date_bin(p_step, t.a, TIMESTAMPTZ '2000-01-01 00:00:00+00') END, r.currency, sum(cl.w * extract(epoch FROM t.b - t.a)::float8)
  FROM fleet_time t JOIN claimants cl ON cl.k = t.k LEFT JOIN bounds b ON b.sk = cl.sk
  LEFT JOIN rates r ON r.sk = cl.sk AND r.ix = width_bucket(t.a, b.b)
  WHERE t.line = 'total' GROUP BY 2, 3, 4
),
gpu_keys AS (
  SELECT a.run_id, a.site, a.sk, a.lo, a.hi, a.share,
         CASE WHEN EXISTS (SELECT 1 FROM site_settings s WHERE s.site = a.site AND s.setting = 'gpu_hour_price'
                           AND s.gpu_model <> '') THEN coalesce(
  (SELECT x.e ->> 'name' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(nd.facts -> 'gpus') = 'array'
                                                         THEN nd.facts -> 'gpus' ELSE '[]'::jsonb END)
                              WITH ORDINALITY AS x(e, i)
   WHERE jsonb_typeof(x.e) = 'object' AND coalesce(x.e ->> 'gpu', x.e ->> 'index') = a.gpu::text
     AND jsonb_typeof(x.e -> 'name') = 'string' AND x.e ->> 'name' <> ''
   ORDER BY x.i DESC LIMIT 1),
  CASE WHEN jsonb_typeof(nd.facts -> 'gpu_model') = 'string' THEN nullif(nd.facts ->> 'gpu_model', '') END) END AS model
  FROM alloc a CROSS JOIN LATERAL (SELECT gpufleet_node_facts_at(a.node, a.lo) AS facts) nd
),
compute_lines AS (
  SELECT m.run_id, m.sk, CASE p_detail WHEN 'segment' THEN greatest(gp.t0, m.lo) WHEN 'step' THEN date_bin(p_step, greatest(gp.t0, m.lo), TIMESTAMPTZ '2000-01-01 00:00:00+00') END AS part, gp.currency AS cur,
         sum(m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8) AS gpu_s,
         sum((m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8 / 3600.0)::numeric * gp.price::numeric)
           AS ccost
  FROM (SELECT gk.run_id, gk.site, gk.sk, gk.lo, gk.hi, gk.model, sum(gk.share) AS w
        FROM gpu_keys gk WHERE gk.lo < gk.hi GROUP BY 1, 2, 3, 4, 5, 6) m
  JOIN (SELECT k.site IS NULL AS sn, coalesce(k.site, '') AS ks, k.model IS NULL AS mn,
               coalesce(k.model, '') AS km, x.*
        FROM (SELECT DISTINCT gk.site, gk.model FROM gpu_keys gk WHERE gk.lo < gk.hi) k
        CROSS JOIN span CROSS JOIN LATERAL gpufleet_gpu_hour_prices(k.site, k.model, span.lo, span.hi, p_step) x
       ) gp ON gp.sn = (m.site IS NULL) AND gp.ks = coalesce(m.site, '') AND gp.mn = (m.model IS NULL)
           AND gp.km = coalesce(m.model, '') AND gp.t1 > m.lo AND gp.t0 < m.hi
  WHERE p_detail <> 'segment'
  GROUP BY 1, 2, 3, 4
),
run_parts AS (
  SELECT energy_lines.run_id, energy_lines.part, energy_lines.cur FROM energy_lines WHERE energy_lines.line = 'run'
  UNION SELECT compute_lines.run_id, compute_lines.part, compute_lines.cur FROM compute_lines
),
run_lines AS (
  SELECT 'run'::text AS line, w.run_id, w.sk, rp.part,
         CASE WHEN p_detail = 'line' THEN w.lo ELSE greatest(rp.part, w.lo) END AS part_start,
         CASE WHEN p_detail = 'line' THEN w.hi WHEN p_detail = 'segment' THEN least(el.part_end, w.hi)
              ELSE least(rp.part + p_step, w.hi) END AS part_end,
         coalesce(ac.n, 0)::integer AS gpu_count, coalesce(ac.shares, 0) AS gpu_equivalents,
         coalesce(cl.gpu_s, CASE WHEN p_detail = 'line' THEN 0.0 END) AS gpu_s, coalesce(el.cs, 0) AS cs,
         el.gpu_kwh, el.host_kwh, el.fac, el.co2e, el.unknown, el.ecost, el.csrc, el.one_price, el.one_g, el.prices,
         el.st, coalesce(cl.ccost, CASE WHEN p_detail = 'segment' THEN NULL ELSE 0.0 END) AS ccost, w.lo, rp.cur
  FROM run_w w
  LEFT JOIN (SELECT a.run_id, count(*) AS n, sum(a.share) AS shares FROM alloc a GROUP BY a.run_id) ac
    ON ac.run_id = w.run_id
  LEFT JOIN run_parts rp ON rp.run_id = w.run_id
  LEFT JOIN energy_lines el ON el.line = 'run' AND el.run_id = w.run_id AND el.part IS NOT DISTINCT FROM rp.part AND el.cur IS NOT DISTINCT FROM rp.cur
  LEFT JOIN compute_lines cl ON cl.run_id = w.run_id AND cl.part IS NOT DISTINCT FROM rp.part AND cl.cur IS NOT DISTINCT FROM rp.cur
),
fleet_lines AS (
  SELECT coalesce(el.line, fs.line) AS line, NULL::text AS run_id, coalesce(el.sk, fs.sk) AS sk,
         coalesce(el.part, fs.part) AS part,
         CASE WHEN p_detail = 'line' THEN (SELECT f FROM win) ELSE coalesce(el.part, fs.part) END AS part_start,
         CASE WHEN p_detail = 'line' THEN (SELECT t FROM win) WHEN p_detail = 'segment' THEN el.part_end
              ELSE least(coalesce(el.part, fs.part) + p_step, (SELECT t FROM win)) END AS part_end,
         NULL::integer AS gpu_count, NULL::float8 AS gpu_equivalents, coalesce(fs.gpu_s, 0) AS gpu_s,
         coalesce(el.cs, 0) AS cs, el.gpu_kwh, el.host_kwh, el.fac, el.co2e, el.unknown, el.ecost, el.csrc,
         el.one_price, el.one_g, el.prices, el.st,
         CASE WHEN coalesce(el.line, fs.line) = 'total' THEN
           (SELECT coalesce(sum(c.ccost), 0) FROM compute_lines c
            WHERE c.sk = coalesce(el.sk, fs.sk) AND c.part IS NOT DISTINCT FROM coalesce(el.part, fs.part)
              AND c.cur IS NOT DISTINCT FROM coalesce(el.cur, fs.cur))
         ELSE 0.0 END AS ccost, (SELECT f FROM win) AS lo, coalesce(el.cur, fs.cur) AS cur
  FROM (SELECT * FROM energy_lines WHERE energy_lines.line <> 'run') el
  FULL JOIN fleet_s fs ON fs.line = el.line AND fs.sk = el.sk AND fs.part IS NOT DISTINCT FROM el.part AND fs.cur IS NOT DISTINCT FROM el.cur
),
lines_out AS (
  SELECT l.*, c.currency, gpufleet_minor_units(c.currency) AS mu,
    coalesce(l.gpu_kwh, 0) + coalesce(l.host_kwh, 0) AS it
  FROM (SELECT * FROM run_lines
        UNION ALL SELECT * FROM fleet_lines
       ) l
  CROSS JOIN LATERAL (SELECT coalesce(l.cur, (SELECT sp.currency FROM gpufleet_site_periods(
    nullif(l.sk, ''), l.part_start, l.part_start + INTERVAL '1 microsecond') sp)) AS currency) c
)
SELECT o.line, o.run_id, nullif(o.sk, ''), o.part_start, o.part_end, o.gpu_count, o.gpu_equivalents,
  o.gpu_s, o.cs, round((o.gpu_s / 3600.0)::numeric, 9), round((least(o.cs, o.gpu_s) / 3600.0)::numeric, 9),
  CASE WHEN o.gpu_s > 0 THEN least(o.cs / o.gpu_s, 1.0) ELSE 0.0 END,
  round(coalesce(o.gpu_kwh, 0)::numeric, 9), round(coalesce(o.host_kwh, 0)::numeric, 9),
  round(o.it::numeric, 9), round(coalesce(o.fac, 0)::numeric, 9),
  round((CASE WHEN o.it > 0 THEN o.fac / o.it
              ELSE (SELECT sp.pue FROM gpufleet_site_periods(nullif(o.sk, ''), o.part_start,
                                                             o.part_start + INTERVAL '1 microsecond') sp) END)::numeric, 6),
  round(coalesce(o.co2e, 0)::numeric, 9), round(coalesce(o.unknown, 0)::numeric, 9),
  coalesce(o.csrc, (SELECT er.carbon_source FROM gpufleet_energy_rates(nullif(o.sk, ''), o.part_start,
                                                  o.part_start + INTERVAL '1 microsecond') er LIMIT 1), 'none'),
  o.one_g,
  CASE WHEN o.sk = '' THEN 'none' WHEN coalesce(o.prices, 1) <= 1 THEN 'flat' ELSE 'time_of_use' END, o.one_price,
  o.currency, o.mu,
  round(coalesce(o.ecost, 0)::numeric, 9), round(o.ccost::numeric, 9),
  round(coalesce(o.ecost, 0)::numeric, 9) + round(coalesce(o.ccost, 0)::numeric, 9),
  coalesce(o.st, false)
FROM lines_out o
ORDER BY o.line DESC, o.run_id, o.sk, o.part_start;
ELSE
RETURN QUERY

WITH
win AS (
  SELECT p_from AS f, greatest(p_from, least(coalesce(p_to, 'infinity'), p_now)) AS t
),
run_w AS MATERIALIZED (
  SELECT r.run_id, r.site, coalesce(r.site, '') AS sk, l.lo,
         greatest(l.lo, least(coalesce(r."end", p_now), p_now, coalesce(p_to, 'infinity'))) AS hi
  FROM runs r CROSS JOIN LATERAL (SELECT greatest(r.start, coalesce(p_from, r.start)) AS lo) l
  WHERE (p_runs IS NULL OR r.run_id = ANY(p_runs))
    AND (p_runs IS NOT NULL OR (r.start < coalesce(p_to, 'infinity')
                                AND (p_from IS NULL OR r."end" IS NULL OR r."end" > p_from)))
),
alloc AS MATERIALIZED (
  SELECT w.run_id, w.site, w.sk, w.lo, w.hi, a.node, a.gpu::integer AS gpu, a.share
  FROM run_w w JOIN run_allocations a ON a.run_id = w.run_id
),
span AS MATERIALIZED (
  SELECT least((SELECT min(lo) FROM run_w), CASE WHEN p_fleet THEN (SELECT f FROM win) END) AS lo,
         greatest((SELECT max(hi) FROM run_w), CASE WHEN p_fleet THEN (SELECT t FROM win) END) AS hi
),
node_info AS MATERIALIZED (
  SELECT x.node, coalesce(nd.site, '') AS sk,
    coalesce(nd.gpu_count::integer,
      (SELECT nullif(count(DISTINCT g.gpu), 0)::integer FROM (
         SELECT e.gpu FROM gpu_energy_1h e, span
         WHERE e.node = x.node AND e.bucket >= date_bin(INTERVAL '1 hour', span.lo, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND e.bucket < span.hi
         UNION SELECT e.gpu FROM gpu_energy_spans e, span WHERE e.node = x.node AND e.t0 < span.hi AND e.t1 > span.lo
       ) g),
      (SELECT nullif(count(DISTINCT s.gpu), 0)::integer FROM gpu_samples s, span
       WHERE s.node = x.node AND s.time >= span.lo AND s.time <= span.hi AND s.mig_instance IS NULL), 0) AS reported
  FROM (SELECT DISTINCT alloc.node FROM alloc
        ) x
  LEFT JOIN nodes nd ON nd.node = x.node
),
rates AS MATERIALIZED (
  SELECT s.sk, r.t0, r.t1, r.pue, r.price_per_kwh, r.g_co2e_per_kwh, r.carbon_source, r.currency,
         row_number() OVER (PARTITION BY s.sk ORDER BY r.t0)::integer AS ix
  FROM (SELECT DISTINCT run_w.sk FROM run_w
       ) s
  CROSS JOIN span CROSS JOIN LATERAL gpufleet_energy_rates(nullif(s.sk, ''), span.lo, span.hi, p_step) r
),
bounds AS MATERIALIZED (SELECT rates.sk, array_agg(rates.t0 ORDER BY rates.t0) AS b FROM rates GROUP BY rates.sk),
run_edges AS (
  SELECT w.run_id, ARRAY(SELECT e FROM unnest(b.b) e WHERE e > w.lo AND e < w.hi) AS edges
  FROM run_w w JOIN bounds b ON b.sk = w.sk WHERE w.lo < w.hi
),
claims AS MATERIALIZED (
  SELECT row_number() OVER ()::integer AS k, x.* FROM (
    SELECT 'run'::text AS line, a.run_id, a.sk, a.node, a.gpu, a.lo, a.hi, a.share, e.edges
    FROM alloc a JOIN run_edges e ON e.run_id = a.run_id
    UNION ALL
    SELECT 'run', h.run_id, h.sk, h.node, NULL::integer, h.lo, h.hi, h.held / greatest(n.reported, h.held), e.edges
    FROM (SELECT alloc.run_id, alloc.sk, alloc.lo, alloc.hi, alloc.node, sum(alloc.share) AS held
          FROM alloc GROUP BY 1, 2, 3, 4, 5) h
    JOIN node_info n ON n.node = h.node JOIN run_edges e ON e.run_id = h.run_id
  ) x
),
-- claims summed together: a run's, the unallocated ones of one site, the total ones paid for alike
grouped AS MATERIALIZED (
  SELECT c.*, dense_rank() OVER (ORDER BY CASE c.line WHEN 'run' THEN 'r' || c.run_id
                                                      WHEN 'unallocated' THEN 'u' || c.sk
                                                      END)::integer AS grp
  FROM claims c
),
group_of AS (SELECT DISTINCT g.grp, g.line, g.run_id, g.sk FROM grouped g WHERE g.line <> 'total'),
en AS MATERIALIZED (
  SELECT * FROM gpufleet_claim_energy(
    (SELECT array_agg(ROW(g.k, g.grp, g.node, g.gpu, g.lo, g.hi, g.share, g.edges)::gpufleet_claim) FROM grouped g),
    p_max_gap_s, p_source)
),
measured AS (
  SELECT go.line, go.run_id, go.sk, en.seg_start, sum(en.gpu_j) AS gj, sum(en.covered_s) AS cs,
         sum(en.host_j) AS hj, bool_or(en.stale) AS st
  FROM en JOIN group_of go ON go.grp = en.grp GROUP BY 1, 2, 3, 4
),
priced AS (
  SELECT m.*, r.t1 AS seg_end, r.pue AS rpue, r.price_per_kwh AS price, r.g_co2e_per_kwh AS g, r.carbon_source, r.currency AS cur,
         (m.gj + m.hj) / 3.6e6 * r.pue AS fac, CASE p_detail WHEN 'segment' THEN m.seg_start WHEN 'step' THEN date_bin(p_step, m.seg_start, TIMESTAMPTZ '2000-01-01 00:00:00+00') END AS part
  FROM (SELECT m0.*, width_bucket(m0.seg_start, b.b) AS ix FROM measured m0 JOIN bounds b ON b.sk = m0.sk) m
  JOIN rates r ON r.sk = m.sk AND r.ix = m.ix
),
energy_lines AS (
  SELECT p.line, p.run_id, p.sk, p.part, p.cur, min(p.seg_end) AS part_end, sum(p.gj) / 3.6e6 AS gpu_kwh,
         sum(p.hj) / 3.6e6 AS host_kwh, sum(p.fac) AS fac, sum(p.fac::numeric * p.g::numeric) / 1000 AS co2e,
         coalesce(sum(p.fac) FILTER (WHERE p.g IS NULL), 0) AS unknown, sum(p.fac::numeric * p.price::numeric) AS ecost,
         sum(p.cs) AS cs, bool_or(p.st) AS st,
         CASE WHEN count(DISTINCT p.carbon_source) = 1 THEN min(p.carbon_source) ELSE 'mixed' END AS csrc,
         CASE WHEN count(DISTINCT p.price) = 1 THEN min(p.price) END AS one_price,
         CASE WHEN count(DISTINCT p.g) = 1 THEN min(p.g) END AS one_g,
         count(DISTINCT p.price) AS prices
  FROM priced p GROUP BY 1, 2, 3, 4, 5
),
gpu_keys AS (
  SELECT a.run_id, a.site, a.sk, a.lo, a.hi, a.share,
         CASE WHEN EXISTS (SELECT 1 FROM site_settings s WHERE s.site = a.site AND s.setting = 'gpu_hour_price'
                           AND s.gpu_model <> '') THEN coalesce(
  (SELECT x.e ->> 'name' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(nd.facts -> 'gpus') = 'array'
                                                         THEN nd.facts -> 'gpus' ELSE '[]'::jsonb END)
                              WITH ORDINALITY AS x(e, i)
   WHERE jsonb_typeof(x.e) = 'object' AND coalesce(x.e ->> 'gpu', x.e ->> 'index') = a.gpu::text
     AND jsonb_typeof(x.e -> 'name') = 'string' AND x.e ->> 'name' <> ''
   ORDER BY x.i DESC LIMIT 1),
  CASE WHEN jsonb_typeof(nd.facts -> 'gpu_model') = 'string' THEN nullif(nd.facts ->> 'gpu_model', '') END) END AS model
  FROM alloc a CROSS JOIN LATERAL (SELECT gpufleet_node_facts_at(a.node, a.lo) AS facts) nd
),
compute_lines AS (
  SELECT m.run_id, m.sk, CASE p_detail WHEN 'segment' THEN greatest(gp.t0, m.lo) WHEN 'step' THEN date_bin(p_step, greatest(gp.t0, m.lo), TIMESTAMPTZ '2000-01-01 00:00:00+00') END AS part, gp.currency AS cur,
         sum(m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8) AS gpu_s,
         sum((m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8 / 3600.0)::numeric * gp.price::numeric)
           AS ccost
  FROM (SELECT gk.run_id, gk.site, gk.sk, gk.lo, gk.hi, gk.model, sum(gk.share) AS w
        FROM gpu_keys gk WHERE gk.lo < gk.hi GROUP BY 1, 2, 3, 4, 5, 6) m
  JOIN (SELECT k.site IS NULL AS sn, coalesce(k.site, '') AS ks, k.model IS NULL AS mn,
               coalesce(k.model, '') AS km, x.*
        FROM (SELECT DISTINCT gk.site, gk.model FROM gpu_keys gk WHERE gk.lo < gk.hi) k
        CROSS JOIN span CROSS JOIN LATERAL gpufleet_gpu_hour_prices(k.site, k.model, span.lo, span.hi, p_step) x
       ) gp ON gp.sn = (m.site IS NULL) AND gp.ks = coalesce(m.site, '') AND gp.mn = (m.model IS NULL)
           AND gp.km = coalesce(m.model, '') AND gp.t1 > m.lo AND gp.t0 < m.hi
  WHERE p_detail <> 'segment'
  GROUP BY 1, 2, 3, 4
),
run_parts AS (
  SELECT energy_lines.run_id, energy_lines.part, energy_lines.cur FROM energy_lines WHERE energy_lines.line = 'run'
  UNION SELECT compute_lines.run_id, compute_lines.part, compute_lines.cur FROM compute_lines
),
run_lines AS (
  SELECT 'run'::text AS line, w.run_id, w.sk, rp.part,
         CASE WHEN p_detail = 'line' THEN w.lo ELSE greatest(rp.part, w.lo) END AS part_start,
         CASE WHEN p_detail = 'line' THEN w.hi WHEN p_detail = 'segment' THEN least(el.part_end, w.hi)
              ELSE least(rp.part + p_step, w.hi) END AS part_end,
         coalesce(ac.n, 0)::integer AS gpu_count, coalesce(ac.shares, 0) AS gpu_equivalents,
         coalesce(cl.gpu_s, CASE WHEN p_detail = 'line' THEN 0.0 END) AS gpu_s, coalesce(el.cs, 0) AS cs,
         el.gpu_kwh, el.host_kwh, el.fac, el.co2e, el.unknown, el.ecost, el.csrc, el.one_price, el.one_g, el.prices,
         el.st, coalesce(cl.ccost, CASE WHEN p_detail = 'segment' THEN NULL ELSE 0.0 END) AS ccost, w.lo, rp.cur
  FROM run_w w
  LEFT JOIN (SELECT a.run_id, count(*) AS n, sum(a.share) AS shares FROM alloc a GROUP BY a.run_id) ac
    ON ac.run_id = w.run_id
  LEFT JOIN run_parts rp ON rp.run_id = w.run_id
  LEFT JOIN energy_lines el ON el.line = 'run' AND el.run_id = w.run_id AND el.part IS NOT DISTINCT FROM rp.part AND el.cur IS NOT DISTINCT FROM rp.cur
  LEFT JOIN compute_lines cl ON cl.run_id = w.run_id AND cl.part IS NOT DISTINCT FROM rp.part AND cl.cur IS NOT DISTINCT FROM rp.cur
),
lines_out AS (
  SELECT l.*, c.currency, gpufleet_minor_units(c.currency) AS mu,
    coalesce(l.gpu_kwh, 0) + coalesce(l.host_kwh, 0) AS it
  FROM (SELECT * FROM run_lines
       ) l
  CROSS JOIN LATERAL (SELECT coalesce(l.cur, (SELECT sp.currency FROM gpufleet_site_periods(
    nullif(l.sk, ''), l.part_start, l.part_start + INTERVAL '1 microsecond') sp)) AS currency) c
)
SELECT o.line, o.run_id, nullif(o.sk, ''), o.part_start, o.part_end, o.gpu_count, o.gpu_equivalents,
  o.gpu_s, o.cs, round((o.gpu_s / 3600.0)::numeric, 9), round((least(o.cs, o.gpu_s) / 3600.0)::numeric, 9),
  CASE WHEN o.gpu_s > 0 THEN least(o.cs / o.gpu_s, 1.0) ELSE 0.0 END,
  round(coalesce(o.gpu_kwh, 0)::numeric, 9), round(coalesce(o.host_kwh, 0)::numeric, 9),
  round(o.it::numeric, 9), round(coalesce(o.fac, 0)::numeric, 9),
  round((CASE WHEN o.it > 0 THEN o.fac / o.it
              ELSE (SELECT sp.pue FROM gpufleet_site_periods(nullif(o.sk, ''), o.part_start,
                                                             o.part_start + INTERVAL '1 microsecond') sp) END)::numeric, 6),
  round(coalesce(o.co2e, 0)::numeric, 9), round(coalesce(o.unknown, 0)::numeric, 9),
  coalesce(o.csrc, (SELECT er.carbon_source FROM gpufleet_energy_rates(nullif(o.sk, ''), o.part_start,
                                                  o.part_start + INTERVAL '1 microsecond') er LIMIT 1), 'none'),
  o.one_g,
  CASE WHEN o.sk = '' THEN 'none' WHEN coalesce(o.prices, 1) <= 1 THEN 'flat' ELSE 'time_of_use' END, o.one_price,
  o.currency, o.mu,
  round(coalesce(o.ecost, 0)::numeric, 9), round(o.ccost::numeric, 9),
  round(coalesce(o.ecost, 0)::numeric, 9) + round(coalesce(o.ccost, 0)::numeric, 9),
  coalesce(o.st, false)
FROM lines_out o
ORDER BY o.line DESC, o.run_id, o.sk, o.part_start;
END IF;
END
$fn$
