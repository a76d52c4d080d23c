
CREATE FUNCTION gpufleet_fleet_hours_mark_node_facts_history() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(CASE WHEN EXISTS (SELECT 1 FROM node_facts_history h
      WHERE h.node = r.node AND h.valid_from < r.valid_from) THEN r.valid_from
    ELSE least(r.valid_from, (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),
               (SELECT min(w.start) FROM run_allocations a JOIN runs w ON w.run_id = a.run_id
                WHERE a.node = r.node)) END, now())); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(CASE WHEN EXISTS (SELECT 1 FROM node_facts_history h
      WHERE h.node = r.node AND h.valid_from < r.valid_from) THEN r.valid_from
    ELSE least(r.valid_from, (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),
               (SELECT min(w.start) FROM run_allocations a JOIN runs w ON w.run_id = a.run_id
                WHERE a.node = r.node)) END, now())); END IF;
  RETURN NULL;
END
$fn$
