
CREATE FUNCTION gpufleet_fleet_hours_mark_carbon() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump(CASE WHEN NOT EXISTS (SELECT 1 FROM carbon_intensity c WHERE c.region = r.region AND c.time < r.time)
    THEN ARRAY['h']
    ELSE gpufleet_fleet_hour_scopes(r.time, coalesce((SELECT min(c.time) FROM carbon_intensity c
      WHERE c.region = r.region AND c.time > r.time), greatest(r.time, now()))) END); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump(CASE WHEN NOT EXISTS (SELECT 1 FROM carbon_intensity c WHERE c.region = r.region AND c.time < r.time)
    THEN ARRAY['h']
    ELSE gpufleet_fleet_hour_scopes(r.time, coalesce((SELECT min(c.time) FROM carbon_intensity c
      WHERE c.region = r.region AND c.time > r.time), greatest(r.time, now()))) END); END IF;
  RETURN NULL;
END
$fn$
