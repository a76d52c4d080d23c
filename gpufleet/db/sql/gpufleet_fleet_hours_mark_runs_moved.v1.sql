
CREATE FUNCTION gpufleet_fleet_hours_mark_runs_moved() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF OLD.site IS DISTINCT FROM NEW.site OR OLD.run_id IS DISTINCT FROM NEW.run_id THEN
    PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(least(OLD.start, NEW.start), now()));
  ELSE
    IF OLD.start IS DISTINCT FROM NEW.start THEN
      PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(OLD.start, NEW.start));
    END IF;
    IF OLD."end" IS DISTINCT FROM NEW."end" THEN
      PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(
        least(coalesce(OLD."end", now()), coalesce(NEW."end", now())), now()));
    END IF;
  END IF;
  RETURN NULL;
END
$fn$
