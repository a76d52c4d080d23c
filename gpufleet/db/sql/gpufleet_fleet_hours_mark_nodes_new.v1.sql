
CREATE FUNCTION gpufleet_fleet_hours_mark_nodes_new() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  r := NEW;
  PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(r.first_seen, now()));
  RETURN NULL;
END
$fn$
