
CREATE FUNCTION gpufleet_site_periods(p_site text, p_lo timestamptz, p_hi timestamptz)
RETURNS TABLE (t0 timestamptz, t1 timestamptz, pue double precision, price_per_kwh double precision,
               gpu_hour_price double precision, carbon_region text, carbon_g_per_kwh double precision)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH t AS (
  SELECT p_lo AS t WHERE p_lo < p_hi
  UNION
  SELECT s.valid_from FROM site_settings s
  WHERE s.site = p_site AND s.gpu_model = '' AND s.valid_from > p_lo AND s.valid_from < p_hi
)
SELECT b.t0, b.t1,
  coalesce((SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'pue' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1), 1.0),
  coalesce((SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'price_per_kwh' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1), 0.0),
  coalesce((SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1), 0.0),
  (SELECT s.txt FROM site_settings s WHERE s.site = p_site AND s.setting = 'carbon_region' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1),
  (SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'carbon_g_per_kwh' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1)
FROM (SELECT t.t AS t0, coalesce(lead(t.t) OVER (ORDER BY t.t), p_hi) AS t1 FROM t) b;
END
$fn$
