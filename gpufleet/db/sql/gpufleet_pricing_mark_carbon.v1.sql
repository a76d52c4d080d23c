
CREATE FUNCTION gpufleet_pricing_mark_carbon() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record; nxt timestamptz;
BEGIN
  FOR r IN SELECT x.region, x.time FROM (SELECT OLD.region, OLD.time WHERE TG_OP <> 'INSERT'
                                         UNION ALL SELECT NEW.region, NEW.time WHERE TG_OP <> 'DELETE') x(region, time)
  LOOP
    nxt := (SELECT min(ci.time) FROM carbon_intensity ci WHERE ci.region = r.region AND ci.time > r.time);
    PERFORM gpufleet_pricing_bump(ARRAY(SELECT CASE WHEN (coalesce(nxt, r.time)) - (r.time) > INTERVAL '400 days' THEN 'c:' || r.region ELSE 'c:' || r.region || ':' || to_char(d AT TIME ZONE 'UTC', 'YYYY-MM-DD') END FROM generate_series(date_bin(INTERVAL '1 day', r.time, TIMESTAMPTZ '2000-01-01 00:00:00+00'), CASE WHEN (coalesce(nxt, r.time)) - (r.time) > INTERVAL '400 days' THEN r.time ELSE coalesce(nxt, r.time) END, INTERVAL '1 day') d)
      || CASE WHEN nxt IS NULL THEN ARRAY['c:' || r.region || ':' || 'tail'] ELSE '{}'::text[] END
      || CASE WHEN NOT EXISTS (SELECT 1 FROM carbon_intensity ci WHERE ci.region = r.region AND ci.time < r.time)
              THEN ARRAY['c:' || r.region || ':' || 'head'] ELSE '{}'::text[] END);
  END LOOP;
  RETURN NULL;
END
$fn$
