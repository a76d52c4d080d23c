
CREATE FUNCTION gpufleet_energy_rates(p_site text, p_lo timestamptz, p_hi timestamptz, p_step interval DEFAULT NULL)
RETURNS TABLE (t0 timestamptz, t1 timestamptz, pue double precision, price_per_kwh double precision,
               carbon_region text, g_co2e_per_kwh double precision, carbon_source text, currency text)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH p AS MATERIALIZED (SELECT * FROM gpufleet_site_periods(p_site, p_lo, p_hi)),
cut AS (
  SELECT p.t0 AS t, p.* FROM p
  UNION ALL
  SELECT ci.time, p.* FROM p JOIN carbon_intensity ci
    ON ci.region = p.carbon_region AND ci.time > p.t0 AND ci.time < p.t1
  UNION ALL
  SELECT st.g, p.* FROM p CROSS JOIN LATERAL (SELECT g FROM generate_series(date_bin(p_step, p.t0, TIMESTAMPTZ '2000-01-01 00:00:00+00') + p_step, p.t1, p_step) g WHERE p_step IS NOT NULL AND g > p.t0 AND g < p.t1) st
),
x AS (
  SELECT DISTINCT ON (cut.t) cut.t, cut.t1 AS period_end, cut.pue, cut.price_per_kwh, cut.carbon_region,
         cut.carbon_g_per_kwh,
         cut.currency
  FROM cut ORDER BY cut.t
)
SELECT x.t, coalesce(lead(x.t) OVER (ORDER BY x.t), p_hi), x.pue, (CASE WHEN abs(x.price_per_kwh) < 1e-9 THEN 0.0 ELSE x.price_per_kwh END), x.carbon_region,
  (CASE WHEN abs(coalesce(lp.g, x.carbon_g_per_kwh, fp.g)) < 1e-9 THEN 0.0 ELSE coalesce(lp.g, x.carbon_g_per_kwh, fp.g) END),
  CASE WHEN lp.g IS NOT NULL THEN 'series' WHEN x.carbon_g_per_kwh IS NOT NULL THEN 'site_constant'
       WHEN fp.g IS NOT NULL THEN 'series' ELSE 'none' END, x.currency
FROM x
LEFT JOIN LATERAL (SELECT ci.g_co2e_per_kwh AS g FROM carbon_intensity ci
                   WHERE ci.region = x.carbon_region AND ci.time <= x.t ORDER BY ci.time DESC LIMIT 1) lp ON true
LEFT JOIN LATERAL (SELECT ci.g_co2e_per_kwh AS g FROM carbon_intensity ci
                   WHERE ci.region = x.carbon_region ORDER BY ci.time LIMIT 1) fp ON lp.g IS NULL;
END
$fn$
