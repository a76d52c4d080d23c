
CREATE FUNCTION gpufleet_ledger(p_from timestamptz, p_to timestamptz, p_now timestamptz DEFAULT now(),
                                p_runs text[] DEFAULT NULL, p_max_gap_s double precision DEFAULT 60,
                                p_source text DEFAULT 'auto')
RETURNS TABLE (run_id text, site text, state text, gpu_hours numeric, gpu_kwh numeric, facility_kwh numeric,
               co2e_kg numeric, total_cost numeric, currency text)
LANGUAGE sql STABLE AS $fn$
WITH states(state, ord, rank) AS (VALUES ('productive', 0, NULL), ('idle', 1, 0), ('hung', 2, 1), ('starved', 3, 3), ('checkpoint', 4, 2), ('straggler_wait', 5, 4), ('throttled', 6, 5)),
p AS MATERIALIZED (SELECT * FROM gpufleet_ledger_pieces(p_from, p_to, p_now, p_runs)),
lost AS MATERIALIZED (
  SELECT l.* FROM (
    SELECT coalesce(array_agg(p.state || ':' || p.run_id), '{}') AS k, coalesce(array_agg(p.run_id), '{}') AS r,
           coalesce(array_agg(p.node), '{}') AS n, coalesce(array_agg(p.gpu), '{}') AS g,
           coalesce(array_agg(p.lo), '{}') AS lo, coalesce(array_agg(p.hi), '{}') AS hi,
           coalesce(array_agg(p.weight), '{}') AS wt
    FROM p) a
  CROSS JOIN LATERAL gpufleet_incident_accounting(a.k, a.r, a.n, a.g, a.lo, a.hi, a.wt, p_now, p_max_gap_s,
                                                   p_source) l
),
runl AS MATERIALIZED (
  SELECT a.* FROM gpufleet_accounting(p_from, p_to, p_now, p_runs, false, p_max_gap_s, p_source, 'line', NULL) a
  WHERE a.line = 'run'
),
cells AS (
  SELECT r.run_id, r.site, r.currency, r.carbon_source, s.state, s.ord,
         coalesce(l.gpu_hours, 0) AS gpu_hours, l.gpu_kwh, l.facility_kwh, l.co2e_kg, l.total_cost
  FROM runl r CROSS JOIN states s
  LEFT JOIN lost l ON s.rank IS NOT NULL AND l.run_id = s.state || ':' || r.run_id
),
x AS (
  SELECT c.run_id, c.site, c.currency, c.carbon_source, c.state, c.ord,
         coalesce(c.gpu_hours, 0) AS gpu_hours, coalesce(c.gpu_kwh, 0) AS gpu_kwh, coalesce(c.facility_kwh, 0) AS facility_kwh, coalesce(c.co2e_kg, 0) AS co2e_kg, coalesce(c.total_cost, 0) AS total_cost,
         r.gpu_hours - sum(coalesce(c.gpu_hours, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS resid_gpu_hours, r.gpu_kwh - sum(coalesce(c.gpu_kwh, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS resid_gpu_kwh, r.facility_kwh - sum(coalesce(c.facility_kwh, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS resid_facility_kwh, r.co2e_kg - sum(coalesce(c.co2e_kg, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS resid_co2e_kg, r.total_cost - sum(coalesce(c.total_cost, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS resid_total_cost,
         max(coalesce(c.gpu_hours, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS big_gpu_hours, max(coalesce(c.gpu_kwh, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS big_gpu_kwh, max(coalesce(c.facility_kwh, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS big_facility_kwh, max(coalesce(c.co2e_kg, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS big_co2e_kg, max(coalesce(c.total_cost, 0)) FILTER (WHERE c.state <> 'productive') OVER (PARTITION BY c.run_id) AS big_total_cost,
         row_number() OVER (PARTITION BY c.run_id, c.state = 'productive' ORDER BY coalesce(c.gpu_hours, 0) DESC, c.ord) AS rank_gpu_hours, row_number() OVER (PARTITION BY c.run_id, c.state = 'productive' ORDER BY coalesce(c.gpu_kwh, 0) DESC, c.ord) AS rank_gpu_kwh, row_number() OVER (PARTITION BY c.run_id, c.state = 'productive' ORDER BY coalesce(c.facility_kwh, 0) DESC, c.ord) AS rank_facility_kwh, row_number() OVER (PARTITION BY c.run_id, c.state = 'productive' ORDER BY coalesce(c.co2e_kg, 0) DESC, c.ord) AS rank_co2e_kg, row_number() OVER (PARTITION BY c.run_id, c.state = 'productive' ORDER BY coalesce(c.total_cost, 0) DESC, c.ord) AS rank_total_cost
  FROM cells c JOIN runl r ON r.run_id = c.run_id
)
SELECT x.run_id, x.site, x.state, CASE WHEN x.state = 'productive' THEN
              CASE WHEN x.resid_gpu_hours < 0 AND x.big_gpu_hours + x.resid_gpu_hours >= 0 THEN 0 ELSE x.resid_gpu_hours END
            WHEN x.resid_gpu_hours < 0 AND x.rank_gpu_hours = 1 AND x.gpu_hours + x.resid_gpu_hours >= 0 THEN x.gpu_hours + x.resid_gpu_hours
            ELSE x.gpu_hours END, CASE WHEN x.state = 'productive' THEN
              CASE WHEN x.resid_gpu_kwh < 0 AND x.big_gpu_kwh + x.resid_gpu_kwh >= 0 THEN 0 ELSE x.resid_gpu_kwh END
            WHEN x.resid_gpu_kwh < 0 AND x.rank_gpu_kwh = 1 AND x.gpu_kwh + x.resid_gpu_kwh >= 0 THEN x.gpu_kwh + x.resid_gpu_kwh
            ELSE x.gpu_kwh END, CASE WHEN x.state = 'productive' THEN
              CASE WHEN x.resid_facility_kwh < 0 AND x.big_facility_kwh + x.resid_facility_kwh >= 0 THEN 0 ELSE x.resid_facility_kwh END
            WHEN x.resid_facility_kwh < 0 AND x.rank_facility_kwh = 1 AND x.facility_kwh + x.resid_facility_kwh >= 0 THEN x.facility_kwh + x.resid_facility_kwh
            ELSE x.facility_kwh END,
       CASE WHEN x.carbon_source = 'none' THEN NULL ELSE CASE WHEN x.state = 'productive' THEN
              CASE WHEN x.resid_co2e_kg < 0 AND x.big_co2e_kg + x.resid_co2e_kg >= 0 THEN 0 ELSE x.resid_co2e_kg END
            WHEN x.resid_co2e_kg < 0 AND x.rank_co2e_kg = 1 AND x.co2e_kg + x.resid_co2e_kg >= 0 THEN x.co2e_kg + x.resid_co2e_kg
            ELSE x.co2e_kg END END, CASE WHEN x.state = 'productive' THEN
              CASE WHEN x.resid_total_cost < 0 AND x.big_total_cost + x.resid_total_cost >= 0 THEN 0 ELSE x.resid_total_cost END
            WHEN x.resid_total_cost < 0 AND x.rank_total_cost = 1 AND x.total_cost + x.resid_total_cost >= 0 THEN x.total_cost + x.resid_total_cost
            ELSE x.total_cost END, x.currency
FROM x
ORDER BY x.run_id, x.ord
$fn$
