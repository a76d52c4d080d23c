
CREATE FUNCTION gpufleet_fleet_hour_scopes(p_lo timestamptz, p_hi timestamptz) RETURNS text[]
LANGUAGE sql STABLE AS $fn$
  SELECT CASE
    WHEN p_lo IS NULL OR p_hi IS NULL OR p_lo = '-infinity' OR p_hi = 'infinity' THEN ARRAY['h']
    WHEN p_hi < p_lo THEN gpufleet_fleet_hour_scopes(p_hi, p_lo)
    WHEN p_hi - p_lo > INTERVAL '1000 hours' THEN ARRAY['h']
    ELSE ARRAY(SELECT 'h:' || to_char(h AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24')
               FROM generate_series(date_bin(INTERVAL '1 hour', p_lo, TIMESTAMPTZ '2000-01-01 00:00:00+00'), p_hi, INTERVAL '1 hour') h)
  END
$fn$
