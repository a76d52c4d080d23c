
CREATE FUNCTION gpufleet_gpu_hour_prices(p_site text, p_model text, p_lo timestamptz, p_hi timestamptz,
                                         p_step interval DEFAULT NULL)
RETURNS TABLE (t0 timestamptz, t1 timestamptz, gpu_model_key text, price double precision, currency text)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH key AS MATERIALIZED (
  SELECT coalesce((SELECT s.gpu_model FROM site_settings s
                   WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model <> ''
                     AND p_model IS NOT NULL AND strpos(lower(p_model), lower(s.gpu_model)) > 0
                   ORDER BY length(s.gpu_model) DESC, s.gpu_model LIMIT 1), '') AS k
),
t AS (
  SELECT p_lo AS t WHERE p_lo < p_hi
  UNION
  SELECT s.valid_from FROM site_settings s, key
  WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model IN ('', key.k)
    AND s.valid_from > p_lo AND s.valid_from < p_hi
     OR (s.site = p_site AND s.setting = 'currency' AND s.gpu_model = ''
         AND s.valid_from > p_lo AND s.valid_from < p_hi)
  UNION
  SELECT g FROM generate_series(date_bin(p_step, p_lo, TIMESTAMPTZ '2000-01-01 00:00:00+00') + p_step, p_hi, p_step) g WHERE p_step IS NOT NULL AND g > p_lo AND g < p_hi
)
SELECT b.t0, b.t1, key.k, (CASE WHEN abs(coalesce(CASE WHEN key.k <> '' THEN (SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model = key.k AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1) END, (SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1), 0.0)) < 1e-9 THEN 0.0 ELSE coalesce(CASE WHEN key.k <> '' THEN (SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model = key.k AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1) END, (SELECT s.num FROM site_settings s WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1), 0.0) END),
  coalesce((SELECT s.txt FROM site_settings s WHERE s.site = p_site AND s.setting = 'currency' AND s.gpu_model = '' AND s.valid_from <= b.t0 ORDER BY s.valid_from DESC LIMIT 1), (SELECT st.currency FROM sites st WHERE st.site = p_site))
FROM (SELECT t.t AS t0, coalesce(lead(t.t) OVER (ORDER BY t.t), p_hi) AS t1 FROM t) b, key;
END
$fn$
