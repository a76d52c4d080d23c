
CREATE FUNCTION gpufleet_pricing_mark_run_progress_10() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump(ARRAY['p:' || r.run_id]); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump(ARRAY['p:' || r.run_id]); END IF;
  RETURN NULL;
END
$fn$
