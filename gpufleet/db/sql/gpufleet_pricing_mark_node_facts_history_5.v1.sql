
CREATE FUNCTION gpufleet_pricing_mark_node_facts_history_5() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump(ARRAY['f:' || r.node]); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump(ARRAY['f:' || r.node]); END IF;
  RETURN NULL;
END
$fn$
