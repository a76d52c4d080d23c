
CREATE FUNCTION gpufleet_fleet_hours_mark_allocations() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE v_run text[]; v_node text[]; v_gpu smallint[];
BEGIN
  -- each event sees only its own transition tables
  IF TG_OP = 'INSERT' THEN
    SELECT array_agg(run_id), array_agg(node), array_agg(gpu) INTO v_run, v_node, v_gpu FROM gpufleet_new;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT array_agg(run_id), array_agg(node), array_agg(gpu) INTO v_run, v_node, v_gpu FROM gpufleet_old;
  ELSIF TG_OP = 'UPDATE' THEN
    SELECT array_agg(run_id), array_agg(node), array_agg(gpu) INTO v_run, v_node, v_gpu FROM (SELECT run_id, node, gpu FROM gpufleet_old UNION ALL SELECT run_id, node, gpu FROM gpufleet_new) c;
  END IF;
  PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(
    CASE WHEN bool_and(x.lo IS NOT NULL) THEN min(x.lo) END, now()))
  FROM (SELECT (SELECT least(w.start, coalesce(greatest(
      (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),
      (SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = r.gpu AND s.time < w.start
       ORDER BY s.time DESC LIMIT 1),
      (SELECT max(e.bucket) FROM gpu_energy_1h e WHERE e.node = r.node AND e.gpu = r.gpu AND e.bucket < w.start),
      (SELECT max(coalesce(o."end", now())) FROM run_allocations a JOIN runs o ON o.run_id = a.run_id
       WHERE a.node = r.node AND a.gpu = r.gpu AND o.start < w.start)), w.start))
    FROM runs w WHERE w.run_id = r.run_id) AS lo
    FROM unnest(v_run, v_node, v_gpu) r(run_id, node, gpu)) x
  HAVING count(*) > 0;
  RETURN NULL;
END
$fn$
