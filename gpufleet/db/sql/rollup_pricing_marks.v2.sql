
WITH x AS MATERIALIZED (
  SELECT node, min(a) AS a, max(z) AS z FROM _rollup_gpu GROUP BY node
  UNION ALL SELECT node, min(a), max(z) FROM _rollup_host GROUP BY node
)
SELECT gpufleet_pricing_bump(ARRAY(
  SELECT DISTINCT CASE WHEN (x.z) - (x.a) > INTERVAL '400 days' THEN 'e:' || x.node ELSE 'e:' || x.node || ':' || to_char(d AT TIME ZONE 'UTC', 'YYYY-MM-DD') END
  FROM x CROSS JOIN LATERAL generate_series(date_bin(INTERVAL '1 day', x.a, TIMESTAMPTZ '2000-01-01 00:00:00+00'), CASE WHEN (x.z) - (x.a) > INTERVAL '400 days' THEN x.a ELSE x.z END, INTERVAL '1 day') d)
  || ARRAY(SELECT DISTINCT s FROM x CROSS JOIN LATERAL unnest(gpufleet_fleet_hour_scopes(x.a, greatest(x.z, now()))) s))
WHERE EXISTS (SELECT 1 FROM x)