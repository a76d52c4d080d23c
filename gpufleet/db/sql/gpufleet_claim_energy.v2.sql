
CREATE OR REPLACE FUNCTION gpufleet_claim_energy(p_claims gpufleet_claim[], p_max_gap_s double precision DEFAULT 60,
                                      p_source text DEFAULT 'auto')
RETURNS TABLE (grp integer, seg_start timestamptz, gpu_j double precision, covered_s double precision,
               host_j double precision, stale boolean)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH c AS MATERIALIZED (
  SELECT x.k, x.grp, x.node, x.gpu, x.lo, x.hi, x.share, ARRAY[x.lo] || coalesce(x.edges, '{}') AS segs
  FROM unnest(p_claims) x WHERE x.lo < x.hi AND x.share > 0
),
q AS MATERIALIZED (
  SELECT r.node, min(r.t_min) AS t FROM rollup_queue r
  WHERE p_source = 'auto' AND r.node = ANY(ARRAY(SELECT DISTINCT c.node FROM c)) GROUP BY r.node
),
stale AS MATERIALIZED (
  SELECT g.node, g.gpu, date_bin(INTERVAL '1 minute', coalesce((SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu AND s.mig_instance IS NULL AND s.time < q.t ORDER BY s.time DESC LIMIT 1), q.t), TIMESTAMPTZ '2000-01-01 00:00:00+00') AS t
  FROM (SELECT DISTINCT c.node, c.gpu FROM c WHERE c.gpu IS NOT NULL) g JOIN q ON q.node = g.node
  UNION ALL
  SELECT q.node, NULL, date_bin(INTERVAL '1 minute', coalesce((SELECT s.time FROM host_samples s WHERE s.node = q.node AND s.time < q.t ORDER BY s.time DESC LIMIT 1), q.t), TIMESTAMPTZ '2000-01-01 00:00:00+00') FROM q
),
cc AS MATERIALIZED (
  SELECT x.*, CASE WHEN p_source = 'raw' THEN x.lo
                   ELSE greatest(x.lo, least(x.hi, coalesce(
                     (SELECT st.t FROM stale st WHERE st.node = x.node AND st.gpu IS NOT DISTINCT FROM x.gpu), x.hi)))
              END AS cut
  FROM c x
),
-- the windows claims share (a run's GPUs have one): each is planned once
wk AS MATERIALIZED (
  SELECT row_number() OVER ()::integer AS w, d.lo, d.hi, d.cut, d.segs
  FROM (SELECT DISTINCT x.lo, x.hi, x.cut, x.segs FROM cc x) d
),
cw AS MATERIALIZED (
  SELECT x.grp, x.node, x.gpu, x.share, wk.w FROM cc x
  JOIN wk ON wk.lo = x.lo AND wk.hi = x.hi AND wk.cut = x.cut AND wk.segs = x.segs
),
-- [lo, cut) is cut at the edges off the hour grid: then no edge lies inside an hour of a sub-range
grid AS (
  SELECT x.w, x.segs, s.a, s.b, s.m0, s.m1, (date_bin(INTERVAL '1 hour', s.m0 - INTERVAL '1 microsecond', TIMESTAMPTZ '2000-01-01 00:00:00+00') + INTERVAL '1 hour') AS h0, date_bin(INTERVAL '1 hour', s.m1, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS h1
  FROM wk x CROSS JOIN LATERAL (
    SELECT y.a, y.b, (date_bin(INTERVAL '1 minute', y.a - INTERVAL '1 microsecond', TIMESTAMPTZ '2000-01-01 00:00:00+00') + INTERVAL '1 minute') AS m0, date_bin(INTERVAL '1 minute', y.b, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS m1
    FROM (SELECT t.t AS a, lead(t.t) OVER (ORDER BY t.t) AS b FROM (
            SELECT x.lo AS t UNION SELECT x.cut
            UNION SELECT e FROM unnest(x.segs[2:]) e WHERE e < x.cut AND date_bin(INTERVAL '1 hour', e, TIMESTAMPTZ '2000-01-01 00:00:00+00') <> e) t) y
    WHERE y.b IS NOT NULL) s
  WHERE x.lo < x.cut
),
-- whole minutes [mx, my) inside one hour: read directly, or as the hour less its other minutes when
-- that reads fewer rows; all of it belongs to the segment of mx (no edge lies inside)
minute_runs AS (
  SELECT x.w, x.segs, r.mx, r.my, date_bin(INTERVAL '1 hour', r.mx, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS h,
         extract(epoch FROM r.my - r.mx) / 60 AS direct,
         1 + extract(epoch FROM r.mx - date_bin(INTERVAL '1 hour', r.mx, TIMESTAMPTZ '2000-01-01 00:00:00+00')) / 60
           + extract(epoch FROM date_bin(INTERVAL '1 hour', r.mx, TIMESTAMPTZ '2000-01-01 00:00:00+00') + INTERVAL '1 hour' - r.my) / 60 AS complement
  FROM grid x CROSS JOIN LATERAL (
    SELECT x.m0 AS mx, x.h0 AS my WHERE x.m0 < x.m1 AND x.h0 <= x.h1 AND x.m0 < x.h0
    UNION ALL SELECT x.h1, x.m1 WHERE x.m0 < x.m1 AND x.h0 <= x.h1 AND x.h1 < x.m1
    UNION ALL SELECT x.m0, x.m1 WHERE x.m0 < x.m1 AND x.h0 > x.h1) r
),
pieces AS MATERIALIZED (
  SELECT x.w, x.segs, 'raw'::text AS kind, x.a AS lo, x.b AS hi, 1 AS sign, NULL::timestamptz AS seg_at
  FROM grid x WHERE x.m0 >= x.m1
  UNION ALL SELECT x.w, x.segs, 'raw', x.a, x.m0, 1, NULL FROM grid x WHERE x.m0 < x.m1 AND x.a < x.m0
  UNION ALL SELECT x.w, x.segs, 'raw', x.m1, x.b, 1, NULL FROM grid x WHERE x.m0 < x.m1 AND x.m1 < x.b
  UNION ALL SELECT x.w, x.segs, '1h', x.h0, x.h1, 1, NULL FROM grid x WHERE x.m0 < x.m1 AND x.h0 < x.h1
  UNION ALL SELECT x.w, x.segs, '1m', x.mx, x.my, 1, x.mx FROM minute_runs x WHERE x.complement >= x.direct
  UNION ALL SELECT x.w, x.segs, '1h', x.h, x.h + INTERVAL '1 hour', 1, x.mx FROM minute_runs x
    WHERE x.complement < x.direct
  UNION ALL SELECT x.w, x.segs, '1m', x.h, x.mx, -1, x.mx FROM minute_runs x
    WHERE x.complement < x.direct AND x.h < x.mx
  UNION ALL SELECT x.w, x.segs, '1m', x.my, x.h + INTERVAL '1 hour', -1, x.mx FROM minute_runs x
    WHERE x.complement < x.direct AND x.my < x.h + INTERVAL '1 hour'
),
-- each claim's rollup pieces
cp AS MATERIALIZED (
  SELECT c.grp, c.node, c.gpu, c.share, p.segs, p.kind, p.lo, p.hi, p.sign, p.seg_at
  FROM cw c JOIN pieces p ON p.w = c.w WHERE p.kind IN ('1h', '1m')
),
-- each claim's partial minutes, numbered; their attributes also as arrays indexed by that number
rp AS MATERIALIZED (
  SELECT row_number() OVER ()::integer AS rk, c.grp, c.share, c.node, c.gpu, p.lo, p.hi,
         p.segs[width_bucket(p.lo, p.segs)] AS seg0
  FROM cw c JOIN pieces p ON p.w = c.w WHERE p.kind = 'raw'
),
rpa AS MATERIALIZED (
  SELECT array_agg(rp.grp ORDER BY rp.rk) AS grp, array_agg(rp.share ORDER BY rp.rk) AS share,
         array_agg(rp.lo ORDER BY rp.rk) AS lo, array_agg(rp.hi ORDER BY rp.rk) AS hi,
         array_agg(rp.seg0 ORDER BY rp.rk) AS seg0
  FROM rp
),
-- from where rollups may still change (auto), or everything (raw): read from samples
spans AS MATERIALIZED (
  SELECT x.grp, x.share, x.node, x.gpu, x.cut AS lo, x.hi, x.segs,
         ARRAY[x.cut] || ARRAY(SELECT e FROM unnest(x.segs) e WHERE e > x.cut AND e < x.hi) || ARRAY[x.hi] AS pe
  FROM cc x WHERE x.cut < x.hi
),
parts AS (
  
  SELECT p.grp, p.segs[width_bucket(coalesce(p.seg_at, e.bucket), p.segs)] AS seg_start, p.sign * p.share * e.energy_j AS gj, p.sign * p.share * e.covered_s AS gs, 0::float8 AS hj
  FROM cp p CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j, e.covered_s FROM gpu_energy_1h e
                                WHERE e.node = p.node AND e.gpu = p.gpu AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
  WHERE p.kind = '1h' AND p.gpu IS NOT NULL
  UNION ALL 
  SELECT p.grp, p.segs[width_bucket(coalesce(p.seg_at, e.bucket), p.segs)] AS seg_start, p.sign * p.share * e.energy_j AS gj, p.sign * p.share * e.covered_s AS gs, 0::float8 AS hj
  FROM cp p CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j, e.covered_s FROM gpu_energy_1m e
                                WHERE e.node = p.node AND e.gpu = p.gpu AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
  WHERE p.kind = '1m' AND p.gpu IS NOT NULL
  UNION ALL 
  SELECT p.grp, p.segs[width_bucket(coalesce(p.seg_at, e.bucket), p.segs)] AS seg_start, 0::float8 AS gj, 0::float8 AS gs, p.sign * p.share * e.energy_j AS hj
  FROM cp p CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j FROM host_energy_1h e
                                WHERE e.node = p.node AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
  WHERE p.kind = '1h' AND p.gpu IS NULL
  UNION ALL 
  SELECT p.grp, p.segs[width_bucket(coalesce(p.seg_at, e.bucket), p.segs)] AS seg_start, 0::float8 AS gj, 0::float8 AS gs, p.sign * p.share * e.energy_j AS hj
  FROM cp p CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j FROM host_energy_1m e
                                WHERE e.node = p.node AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
  WHERE p.kind = '1m' AND p.gpu IS NULL
  UNION ALL 
  SELECT p.grp, x.seg_start, p.sign * p.share * sp.energy_j * x.part_s / sp.dt AS gj,
         p.sign * p.share * x.part_s AS gs, 0::float8 AS hj
  FROM cp p CROSS JOIN LATERAL (
    SELECT greatest(e.t0, p.lo) AS a, least(e.t1, p.hi) AS b, e.energy_j,
           extract(epoch FROM e.t1 - e.t0)::float8 AS dt
    FROM gpu_energy_spans e WHERE e.node = p.node AND e.gpu = p.gpu AND e.t0 < p.hi AND e.t1 > p.lo OFFSET 0) sp
  CROSS JOIN LATERAL (
    SELECT p.segs[k] AS seg_start, extract(epoch FROM least(sp.b, coalesce(p.segs[k + 1], 'infinity')) - greatest(sp.a, p.segs[k]))::float8 AS part_s
    FROM generate_series(width_bucket(sp.a, p.segs), width_bucket(sp.b - INTERVAL '1 microsecond', p.segs)) k
    WHERE p.seg_at IS NULL
    UNION ALL
    SELECT p.segs[width_bucket(p.seg_at, p.segs)], extract(epoch FROM sp.b - sp.a)::float8 WHERE p.seg_at IS NOT NULL
  ) x
  WHERE p.gpu IS NOT NULL
  UNION ALL 
  SELECT a.grp[i.node], a.seg0[i.node], a.share[i.node] * i.j * extract(epoch FROM least(i.t1, a.hi[i.node]) - greatest(i.t0, a.lo[i.node]))::float8 / i.dt, a.share[i.node] * extract(epoch FROM least(i.t1, a.hi[i.node]) - greatest(i.t0, a.lo[i.node]))::float8, a.share[i.node] * 0::float8
  FROM (
SELECT node, gpu, t0, t1, extract(epoch FROM t1 - t0)::float8 AS dt,
  CASE WHEN e0 IS NOT NULL AND e1 IS NOT NULL AND e1 >= e0
            AND e1 - e0 <= 10000000::float8 * extract(epoch FROM t1 - t0)::float8 THEN (e1 - e0) / 1000.0
       WHEN p0 IS NOT NULL AND p1 IS NOT NULL AND extract(epoch FROM t1 - t0) <= p_max_gap_s
         THEN (p0 + p1) / 2.0 * extract(epoch FROM t1 - t0)::float8
  END AS j
FROM (
  SELECT node, gpu, lag(time) OVER w AS t0, time AS t1,
         lag(energy_mj) OVER w AS e0, energy_mj AS e1,
         lag(power_w) OVER w AS p0, power_w AS p1
  FROM (SELECT rp.rk AS node, 0 AS gpu, s.* FROM rp CROSS JOIN LATERAL ((SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu AND s.mig_instance IS NULL AND s.time <= rp.lo ORDER BY s.time DESC LIMIT 1) UNION ALL (SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu AND s.mig_instance IS NULL AND s.time > rp.lo AND s.time < rp.hi) UNION ALL (SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu AND s.mig_instance IS NULL AND s.time >= rp.hi ORDER BY s.time LIMIT 1)) s WHERE rp.gpu IS NOT NULL) smp
  WINDOW w AS (PARTITION BY node, gpu ORDER BY time)
) pairs
WHERE t0 IS NOT NULL AND t1 > t0) i CROSS JOIN rpa a
  WHERE i.j IS NOT NULL AND i.t1 > a.lo[i.node] AND i.t0 < a.hi[i.node]
  UNION ALL 
  SELECT a.grp[i.node], a.seg0[i.node], a.share[i.node] * 0::float8, a.share[i.node] * 0::float8, a.share[i.node] * i.j * extract(epoch FROM least(i.t1, a.hi[i.node]) - greatest(i.t0, a.lo[i.node]))::float8 / i.dt
  FROM (
SELECT node, t0, t1, extract(epoch FROM t1 - t0)::float8 AS dt,
  CASE WHEN p0 IS NOT NULL AND p1 IS NOT NULL AND extract(epoch FROM t1 - t0) <= p_max_gap_s
       THEN (p0 + p1) / 2.0 * extract(epoch FROM t1 - t0)::float8 END AS j
FROM (
  SELECT node, lag(time) OVER w AS t0, time AS t1, lag(host_power_w) OVER w AS p0, host_power_w AS p1
  FROM (SELECT rp.rk AS node, s.* FROM rp CROSS JOIN LATERAL ((SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND s.time <= rp.lo ORDER BY s.time DESC LIMIT 1) UNION ALL (SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND s.time > rp.lo AND s.time < rp.hi) UNION ALL (SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND s.time >= rp.hi ORDER BY s.time LIMIT 1)) s WHERE rp.gpu IS NULL) smp
  WINDOW w AS (PARTITION BY node ORDER BY time)
) pairs
WHERE t0 IS NOT NULL AND t1 > t0) i CROSS JOIN rpa a
  WHERE i.j IS NOT NULL AND i.t1 > a.lo[i.node] AND i.t0 < a.hi[i.node]
  UNION ALL 
  SELECT rp.grp, rp.segs[width_bucket(greatest(i.t0, rp.pe[x]), rp.segs)] AS seg_start,
         rp.share * i.j * extract(epoch FROM least(i.t1, rp.pe[x + 1]) - greatest(i.t0, rp.pe[x]))::float8 / i.dt AS gj, rp.share * extract(epoch FROM least(i.t1, rp.pe[x + 1]) - greatest(i.t0, rp.pe[x]))::float8 AS gs, rp.share * 0::float8 AS hj
  FROM spans rp CROSS JOIN LATERAL (
SELECT node, gpu, t0, t1, extract(epoch FROM t1 - t0)::float8 AS dt,
  CASE WHEN e0 IS NOT NULL AND e1 IS NOT NULL AND e1 >= e0
            AND e1 - e0 <= 10000000::float8 * extract(epoch FROM t1 - t0)::float8 THEN (e1 - e0) / 1000.0
       WHEN p0 IS NOT NULL AND p1 IS NOT NULL AND extract(epoch FROM t1 - t0) <= p_max_gap_s
         THEN (p0 + p1) / 2.0 * extract(epoch FROM t1 - t0)::float8
  END AS j
FROM (
  SELECT node, gpu, lag(time) OVER w AS t0, time AS t1,
         lag(energy_mj) OVER w AS e0, energy_mj AS e1,
         lag(power_w) OVER w AS p0, power_w AS p1
  FROM (SELECT rp.node AS node, rp.gpu AS gpu, s.* FROM ((SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu AND s.mig_instance IS NULL AND s.time <= rp.lo ORDER BY s.time DESC LIMIT 1) UNION ALL (SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu AND s.mig_instance IS NULL AND s.time > rp.lo AND s.time < rp.hi) UNION ALL (SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu AND s.mig_instance IS NULL AND s.time >= rp.hi ORDER BY s.time LIMIT 1)) s) smp
  WINDOW w AS (PARTITION BY node, gpu ORDER BY time)
) pairs
WHERE t0 IS NOT NULL AND t1 > t0) i
  CROSS JOIN LATERAL generate_series(greatest(width_bucket(i.t0, rp.pe), 1),
                                     least(width_bucket(i.t1 - INTERVAL '1 microsecond', rp.pe),
                                           cardinality(rp.pe) - 1)) AS x
  WHERE rp.gpu IS NOT NULL AND i.j IS NOT NULL
  UNION ALL 
  SELECT rp.grp, rp.segs[width_bucket(greatest(i.t0, rp.pe[x]), rp.segs)] AS seg_start,
         rp.share * 0::float8 AS gj, rp.share * 0::float8 AS gs, rp.share * i.j * extract(epoch FROM least(i.t1, rp.pe[x + 1]) - greatest(i.t0, rp.pe[x]))::float8 / i.dt AS hj
  FROM spans rp CROSS JOIN LATERAL (
SELECT node, t0, t1, extract(epoch FROM t1 - t0)::float8 AS dt,
  CASE WHEN p0 IS NOT NULL AND p1 IS NOT NULL AND extract(epoch FROM t1 - t0) <= p_max_gap_s
       THEN (p0 + p1) / 2.0 * extract(epoch FROM t1 - t0)::float8 END AS j
FROM (
  SELECT node, lag(time) OVER w AS t0, time AS t1, lag(host_power_w) OVER w AS p0, host_power_w AS p1
  FROM (SELECT rp.node AS node, s.* FROM ((SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND s.time <= rp.lo ORDER BY s.time DESC LIMIT 1) UNION ALL (SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND s.time > rp.lo AND s.time < rp.hi) UNION ALL (SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND s.time >= rp.hi ORDER BY s.time LIMIT 1)) s) smp
  WINDOW w AS (PARTITION BY node ORDER BY time)
) pairs
WHERE t0 IS NOT NULL AND t1 > t0) i
  CROSS JOIN LATERAL generate_series(greatest(width_bucket(i.t0, rp.pe), 1),
                                     least(width_bucket(i.t1 - INTERVAL '1 microsecond', rp.pe),
                                           cardinality(rp.pe) - 1)) AS x
  WHERE rp.gpu IS NULL AND i.j IS NOT NULL
)
SELECT p.grp, p.seg_start, sum(p.gj), sum(p.gs), sum(p.hj),
       coalesce(bool_or(s.stale), false) AND p_source = 'auto'
FROM parts p LEFT JOIN (SELECT x.grp, bool_or(x.cut < x.hi) AS stale FROM cc x GROUP BY x.grp) s ON s.grp = p.grp
GROUP BY p.grp, p.seg_start;
END
$fn$
