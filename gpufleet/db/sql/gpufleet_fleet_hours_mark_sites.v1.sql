
CREATE FUNCTION gpufleet_fleet_hours_mark_sites() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  PERFORM gpufleet_pricing_bump(ARRAY['h']);
  RETURN NULL;
END
$fn$
