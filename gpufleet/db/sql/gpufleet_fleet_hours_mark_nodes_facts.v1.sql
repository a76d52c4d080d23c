
CREATE FUNCTION gpufleet_fleet_hours_mark_nodes_facts() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  -- the node's facts price its runs only while it has no dated ones (gpufleet_node_facts_at)
  IF NOT EXISTS (SELECT 1 FROM node_facts_history h WHERE h.node = NEW.node) THEN
    PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(least(NEW.first_seen,
      (SELECT min(w.start) FROM run_allocations a JOIN runs w ON w.run_id = a.run_id WHERE a.node = NEW.node)),
      now()));
  END IF;
  RETURN NULL;
END
$fn$
