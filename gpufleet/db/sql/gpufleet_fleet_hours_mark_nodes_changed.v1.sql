
CREATE FUNCTION gpufleet_fleet_hours_mark_nodes_changed() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  PERFORM gpufleet_pricing_bump(ARRAY['h']);
  RETURN NULL;
END
$fn$
