
CREATE FUNCTION gpufleet_fleet_hours_mark_site_settings() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(r.valid_from, now())); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(r.valid_from, now())); END IF;
  RETURN NULL;
END
$fn$
