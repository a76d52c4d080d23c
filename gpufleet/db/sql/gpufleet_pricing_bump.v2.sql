
CREATE OR REPLACE FUNCTION gpufleet_pricing_bump(p_scopes text[]) RETURNS void
LANGUAGE sql VOLATILE AS $fn$
  INSERT INTO pricing_marks (scope, version)
  SELECT DISTINCT s, pg_current_xact_id()::text::bigint FROM unnest(p_scopes) s WHERE s IS NOT NULL
  ON CONFLICT (scope) DO UPDATE SET version = EXCLUDED.version
  WHERE pricing_marks.version IS DISTINCT FROM EXCLUDED.version
$fn$
