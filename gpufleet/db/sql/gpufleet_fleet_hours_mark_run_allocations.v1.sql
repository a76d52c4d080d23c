
CREATE FUNCTION gpufleet_fleet_hours_mark_run_allocations() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump((SELECT gpufleet_fleet_hour_scopes(least(w.start, coalesce(greatest(
      (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),
      (SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = r.gpu AND s.time < w.start
       ORDER BY s.time DESC LIMIT 1),
      (SELECT max(e.bucket) FROM gpu_energy_1h e WHERE e.node = r.node AND e.gpu = r.gpu AND e.bucket < w.start),
      (SELECT max(coalesce(o."end", now())) FROM run_allocations a JOIN runs o ON o.run_id = a.run_id
       WHERE a.node = r.node AND a.gpu = r.gpu AND o.start < w.start)), w.start)), now())
     FROM runs w WHERE w.run_id = r.run_id)); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump((SELECT gpufleet_fleet_hour_scopes(least(w.start, coalesce(greatest(
      (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),
      (SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = r.gpu AND s.time < w.start
       ORDER BY s.time DESC LIMIT 1),
      (SELECT max(e.bucket) FROM gpu_energy_1h e WHERE e.node = r.node AND e.gpu = r.gpu AND e.bucket < w.start),
      (SELECT max(coalesce(o."end", now())) FROM run_allocations a JOIN runs o ON o.run_id = a.run_id
       WHERE a.node = r.node AND a.gpu = r.gpu AND o.start < w.start)), w.start)), now())
     FROM runs w WHERE w.run_id = r.run_id)); END IF;
  RETURN NULL;
END
$fn$
