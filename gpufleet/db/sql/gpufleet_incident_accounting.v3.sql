
CREATE OR REPLACE FUNCTION gpufleet_incident_accounting(
  p_keys text[], p_run_ids text[], p_nodes text[], p_gpus integer[], p_los timestamptz[], p_his timestamptz[],
  p_weights double precision[], p_now timestamptz DEFAULT now(), p_max_gap_s double precision DEFAULT 60,
  p_source text DEFAULT 'auto')
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
DECLARE
  p_from timestamptz := NULL;
  p_to timestamptz := NULL;
  p_fleet boolean := false;
  p_detail text := 'line';
  p_step interval := NULL;
BEGIN
RETURN QUERY

WITH
win AS (
  SELECT p_from AS f, greatest(p_from, least(coalesce(p_to, 'infinity'), p_now)) AS t
),
ic AS MATERIALIZED (
  SELECT x.key, x.run_id, x.node, x.gpu, greatest(x.lo, r.start) AS lo,
         least(x.hi, coalesce(r."end", p_now), p_now) AS hi, x.weight, r.site
  FROM unnest(p_keys, p_run_ids, p_nodes, p_gpus, p_los, p_his, p_weights) x(key, run_id, node, gpu, lo, hi, weight)
  JOIN runs r ON r.run_id = x.run_id
  WHERE x.weight >= 0 AND greatest(x.lo, r.start) < least(x.hi, coalesce(r."end", p_now), p_now)
),
run_w AS MATERIALIZED (
  SELECT c.key AS run_id, min(c.site) AS site, coalesce(min(c.site), '') AS sk, min(c.lo) AS lo, max(c.hi) AS hi
  FROM ic c GROUP BY c.key
),
alloc AS MATERIALIZED (
  SELECT c.key AS run_id, c.site, coalesce(c.site, '') AS sk, c.lo, c.hi, a.node, a.gpu::integer AS gpu,
         a.share * least(c.weight, 1.0) AS share
  FROM ic c JOIN run_allocations a ON a.run_id = c.run_id AND a.node = c.node AND a.gpu = c.gpu
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
    SELECT 'run'::text AS line, a.run_id, a.sk, a.node, a.gpu, a.lo, a.hi, a.share, ARRAY(SELECT x FROM unnest(e.edges) x WHERE x > a.lo AND x < a.hi) AS edges
    FROM alloc a JOIN run_edges e ON e.run_id = a.run_id
    UNION ALL
    SELECT 'run', h.run_id, h.sk, h.node, NULL::integer, h.lo, h.hi, h.held / greatest(n.reported, h.held), ARRAY(SELECT x FROM unnest(e.edges) x WHERE x > h.lo AND x < h.hi)
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
  FROM measured m JOIN bounds b ON b.sk = m.sk JOIN rates r ON r.sk = m.sk AND r.ix = width_bucket(m.seg_start, b.b)
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
  CROSS JOIN LATERAL gpufleet_gpu_hour_prices(m.site, m.model, m.lo, m.hi, p_step) gp
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
         (SELECT count(*) FROM alloc a WHERE a.run_id = w.run_id)::integer AS gpu_count,
         (SELECT coalesce(sum(a.share), 0) FROM alloc a WHERE a.run_id = w.run_id) AS gpu_equivalents,
         coalesce(cl.gpu_s, CASE WHEN p_detail = 'line' THEN 0.0 END) AS gpu_s, coalesce(el.cs, 0) AS cs,
         el.gpu_kwh, el.host_kwh, el.fac, el.co2e, el.unknown, el.ecost, el.csrc, el.one_price, el.one_g, el.prices,
         el.st, coalesce(cl.ccost, CASE WHEN p_detail = 'segment' THEN NULL ELSE 0.0 END) AS ccost, w.lo, rp.cur
  FROM run_w w
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
END
$fn$
