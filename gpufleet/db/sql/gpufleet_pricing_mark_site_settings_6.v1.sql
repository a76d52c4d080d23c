
CREATE FUNCTION gpufleet_pricing_mark_site_settings_6() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump(ARRAY['s:' || r.site]); END IF;
  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump(ARRAY['s:' || r.site]); END IF;
  RETURN NULL;
END
$fn$
