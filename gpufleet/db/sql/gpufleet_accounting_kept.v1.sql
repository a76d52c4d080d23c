
CREATE FUNCTION gpufleet_accounting_kept(
  p_from timestamptz, p_to timestamptz, p_now timestamptz, p_max_gap_s double precision, p_source text,
  p_gone_after_s double precision)
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
  p_runs text[] := NULL;
  p_fleet boolean := true;
  p_detail text := 'line';
  p_step interval := NULL;
BEGIN
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
-- the period's whole hours, the first and last partial ones, and whether each is kept and holds
kept_span AS (
  SELECT min(k.hour) AS k0, max(k.hour) + INTERVAL '1 hour' AS k1 FROM fleet_hours_kept k
  WHERE k.max_gap_s = p_max_gap_s AND k.source = p_source AND k.gone_after_s = p_gone_after_s
),
-- whole hours only where hours are kept at all: a period of centuries is not walked an hour at a time
bounds AS (
  SELECT win.f, win.t, x.hf, greatest(x.hf, x.ht) AS ht,
         (SELECT min(q.t_min) FROM rollup_queue q) - make_interval(secs => p_max_gap_s + 60) AS queued
  FROM win CROSS JOIN kept_span ks
  CROSS JOIN LATERAL (
    SELECT least(win.t, date_bin(INTERVAL '1 hour', win.f - INTERVAL '1 microsecond', TIMESTAMPTZ '2000-01-01 00:00:00+00') + INTERVAL '1 hour') AS hf0,
           greatest(win.f, date_bin(INTERVAL '1 hour', win.t, TIMESTAMPTZ '2000-01-01 00:00:00+00')) AS ht0
  ) w
  CROSS JOIN LATERAL (
    SELECT CASE WHEN ks.k0 IS NULL THEN win.t ELSE least(win.t, greatest(ks.k0, w.hf0)) END AS hf,
           CASE WHEN ks.k0 IS NULL THEN win.t ELSE least(ks.k1, w.ht0) END AS ht
  ) x
),
pieces AS (
  SELECT b.f AS a, b.hf AS b, false AS kept FROM bounds b WHERE b.f < b.hf
  UNION ALL
  SELECT h, h + INTERVAL '1 hour', EXISTS (
    SELECT 1 FROM fleet_hours_kept k
    WHERE k.max_gap_s = p_max_gap_s AND k.source = p_source AND k.gone_after_s = p_gone_after_s AND k.hour = h
      AND (b.queued IS NULL OR h + INTERVAL '1 hour' <= b.queued)
      AND k.whole_mark = coalesce((SELECT m.version FROM pricing_marks m WHERE m.scope = 'h'), 0)
    AND k.hour_mark = coalesce((SELECT m.version FROM pricing_marks m WHERE m.scope = 'h:' || to_char(k.hour AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24')), 0))
  FROM bounds b CROSS JOIN LATERAL generate_series(b.hf, b.ht - INTERVAL '1 hour', INTERVAL '1 hour') h
  WHERE b.hf < b.ht
  UNION ALL
  SELECT greatest(b.ht, b.hf), b.t, false FROM bounds b WHERE greatest(b.ht, b.hf) < b.t
),
-- the pieces not kept, consecutive ones together: each one live call
gaps AS (
  SELECT min(x.a) AS a, max(x.b) AS b FROM (
    SELECT p.a, p.b, p.kept,
           row_number() OVER (ORDER BY p.a) - row_number() OVER (PARTITION BY p.kept ORDER BY p.a) AS grp
    FROM pieces p) x
  WHERE NOT x.kept GROUP BY x.grp
),
parts AS (
  SELECT l.line, l.run_id, l.sk, l.cur, l.gpu_s, l.covered_s, l.gpu_kwh, l.host_kwh, l.facility_kwh, l.co2e_kg,
         l.co2e_unknown_kwh, l.energy_cost, l.compute_cost, l.stale, l.has_energy, l.price_lo, l.price_hi,
         l.g_lo, l.g_hi, l.csrc_lo, l.csrc_hi
  FROM pieces p JOIN fleet_hour_lines l ON l.max_gap_s = p_max_gap_s AND l.source = p_source
    AND l.gone_after_s = p_gone_after_s AND l.hour = p.a
  WHERE p.kept
  UNION ALL
  SELECT x.line, x.run_id, x.sk, x.cur, x.gpu_s, x.covered_s, x.gpu_kwh, x.host_kwh, x.facility_kwh, x.co2e_kg,
         x.co2e_unknown_kwh, x.energy_cost, x.compute_cost, x.stale, x.has_energy, x.price_lo, x.price_hi,
         x.g_lo, x.g_hi, x.csrc_lo, x.csrc_hi
  FROM gaps g CROSS JOIN LATERAL gpufleet_fleet_parts(g.a, g.b, p_now, p_max_gap_s, p_source, p_gone_after_s, 'line') x
),
sums AS (
  SELECT p.line, p.run_id, p.sk, p.cur,
  sum(p.gpu_s) AS gpu_s, sum(p.covered_s) AS cs, sum(p.gpu_kwh) AS gpu_kwh, sum(p.host_kwh) AS host_kwh,
  sum(p.facility_kwh) AS fac, sum(p.co2e_kg) AS co2e, sum(p.co2e_unknown_kwh) AS unknown,
  sum(p.energy_cost) AS ecost, sum(p.compute_cost) AS ccost, bool_or(p.stale) AS st,
  CASE WHEN bool_or(p.has_energy) THEN CASE WHEN min(p.csrc_lo) = max(p.csrc_hi) THEN min(p.csrc_lo) ELSE 'mixed' END
  END AS csrc,
  CASE WHEN min(p.price_lo) = max(p.price_hi) THEN min(p.price_lo) END AS one_price,
  CASE WHEN min(p.g_lo) = max(p.g_hi) THEN min(p.g_lo) END AS one_g,
  CASE WHEN bool_or(p.has_energy) THEN CASE WHEN min(p.price_lo) IS NULL THEN 0
                                             WHEN min(p.price_lo) = max(p.price_hi) THEN 1 ELSE 2 END END AS prices
  FROM parts p GROUP BY 1, 2, 3, 4
),
run_lines AS (
  SELECT 'run'::text AS line, w.run_id, w.sk, NULL::timestamptz AS part, w.lo AS part_start, w.hi AS part_end,
         coalesce(ac.n, 0)::integer AS gpu_count, coalesce(ac.shares, 0) AS gpu_equivalents,
         coalesce(s.gpu_s, 0.0) AS gpu_s, coalesce(s.cs, 0) AS cs,
         s.gpu_kwh, s.host_kwh, s.fac, s.co2e, s.unknown, s.ecost, s.csrc, s.one_price, s.one_g, s.prices,
         s.st, coalesce(s.ccost, 0.0) AS ccost, w.lo, s.cur
  FROM run_w w
  LEFT JOIN (SELECT a.run_id, count(*) AS n, sum(a.share) AS shares FROM alloc a GROUP BY a.run_id) ac
    ON ac.run_id = w.run_id
  LEFT JOIN sums s ON s.line = 'run' AND s.run_id = w.run_id
),
fleet_lines AS (
  SELECT s.line, NULL::text AS run_id, s.sk, NULL::timestamptz AS part, win.f AS part_start, win.t AS part_end,
         NULL::integer AS gpu_count, NULL::float8 AS gpu_equivalents, coalesce(s.gpu_s, 0) AS gpu_s,
         coalesce(s.cs, 0) AS cs, s.gpu_kwh, s.host_kwh, s.fac, s.co2e, s.unknown, s.ecost, s.csrc,
         s.one_price, s.one_g, s.prices, s.st,
         CASE WHEN s.line = 'total' THEN coalesce(s.ccost, 0) ELSE 0.0 END AS ccost, win.f AS lo, s.cur
  FROM sums s CROSS JOIN win WHERE s.line <> 'run'
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
END
$fn$
