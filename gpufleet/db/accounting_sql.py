"""Accounting as SQL functions in the database: the one definition the API, the CLI, replay,
the web view and the Grafana energy board all read (contracts.md section 3).

Migration 0004 installs these functions on both backends (they read only
ordinary relations: samples, the energy rollups and long counter intervals
(``gpu_energy_spans``, migration 0009), runs, allocations, sites and their
dated settings, carbon series).  Python never re-computes a
figure: ``gpufleet.accounting`` calls :data:`ACCOUNTING` and formats what it
returns, and the dashboards select from the same function, so the two
cannot disagree.  Versioned names keep migrations frozen: a change adds a
``_V2`` text and a migration that replaces the functions with it.  The
migrations execute these texts as rendered into ``gpufleet/db/sql`` by
``tools/render_sql.py`` (one file per function and version), so a new text
needs its file rendered and the migration reading it.

The functions, bottom up:

``gpufleet_claim_energy(claims, max_gap_s, source)``
    Energy of *claims*: time ranges [lo, hi) of one GPU (``gpu`` set) or one
    host (``gpu`` NULL), each weighted by ``share``, split at ``edges``
    (sorted, strictly inside the range).  Returns one row per (claim,
    1-based segment of ``lo || edges``).  Intervals follow the contract (and
    ``gpufleet.db.energy_sql``, the rollups' own text): counter differences,
    else trapezoidal power within ``max_gap_s``, spread evenly over the
    interval.  ``source``: ``raw`` reads samples only; ``rollup`` reads whole
    hours and minutes from the energy rollups, with the share of every long
    counter interval (``gpu_energy_spans``) inside them, and samples for
    partial minutes; ``auto`` is ``rollup`` up to where a pending rollup-queue row can
    still change the rollups, raw samples from there (``stale`` says so).
    An edge on the hour grid cuts no bucket; any other edge cuts the range
    into pieces whose partial minutes come from samples.

``gpufleet_site_periods(site, lo, hi)``
    The site's dated settings (``site_settings``) as periods of constant PUE,
    energy price, default GPU-hour price, carbon region and carbon constant.

``gpufleet_energy_rates(site, lo, hi, step)``
    Those periods cut further at the carbon series' steps of the region in
    force (and at multiples of ``step``), each with the intensity in force:
    the region's last point at or before it, else the site's constant, else
    the region's first point carried back.

``gpufleet_gpu_hour_prices(site, model, lo, hi, step)``
    GPU-hour price periods for a GPU model: the longest model key of the
    site contained in the model name (case-insensitive) while it has a
    value, else the site's default price.

``gpufleet_accounting(from, to, now, runs, fleet, max_gap_s, source, detail, step, gone_after_s)``
    Lines: one per run overlapping [from, to) (clipped to it, and to now),
    and with ``fleet`` the GPU time no run held (``unallocated``: the share
    of each GPU and host no run held, priced at the node's site) and every
    GPU and host of the fleet (``total``: measured over the whole period,
    priced at the site of whoever held each share of it, node's site when
    idle).  Money is returned to 1e-9 of the currency (V1: rounded to its
    minor units) and energies to 1e-9 kWh, so sums of lines are exact wherever
    they are made; each line is priced in one currency (V2).
    ``detail``: ``line`` (one row per line and pricing site), ``segment``
    (per tariff segment, energy only) or ``step`` (per ``step`` bucket from
    2000-01-01 UTC, e.g. a day, for charts).  A fleet GPU counts from when it joined until it was
    silent for ``gone_after_s`` (V2, :func:`_membership`).

``gpufleet_incident_accounting(keys, run_ids, nodes, gpus, los, his, weights, now, max_gap_s, source)``
    The run accounting of ``gpufleet_accounting`` over pieces of runs' GPU-time instead of whole runs:
    piece *i* is GPU (``nodes[i]``, ``gpus[i]``) of run ``run_ids[i]`` over [``los[i]``, ``his[i]``)
    (clipped to the run's window and to ``now``), weighted by ``weights[i]`` (0-1, times the
    allocation's share).  One line per key (``run_id`` holds the key), priced at the run's site
    exactly as the run's own line is: GPU energy, host share, PUE, carbon, energy and GPU-hour prices
    in force, money as the run's line has it.  A key's pieces must belong to one run; pieces of one
    key should not overlap (the caller takes their union: ``gpufleet.accounting.incidents``); migration 0010.
"""

from __future__ import annotations

from gpufleet.db import energy_sql as E
from gpufleet.store.fact_history import dated_pricing

ORIGIN = E.ORIGIN


def _floor(t: str, unit: str) -> str:
    return f"date_bin(INTERVAL '1 {unit}', {t}, {ORIGIN})"


def _ceil(t: str, unit: str) -> str:
    return f"(date_bin(INTERVAL '1 {unit}', {t} - INTERVAL '1 microsecond', {ORIGIN}) + INTERVAL '1 {unit}')"


TYPES_V1 = """
CREATE TYPE gpufleet_claim AS (k integer, grp integer, node text, gpu integer, lo timestamptz, hi timestamptz,
                               share double precision, edges timestamptz[])
"""

MINOR_UNITS_V1 = """
CREATE FUNCTION gpufleet_minor_units(p_currency text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT CASE
    WHEN upper(p_currency) IN ('BIF', 'CLP', 'DJF', 'GNF', 'ISK', 'JPY', 'KMF', 'KRW', 'PYG', 'RWF', 'UGX', 'UYI',
                               'VND', 'VUV', 'XAF', 'XOF', 'XPF') THEN 0
    WHEN upper(p_currency) IN ('BHD', 'IQD', 'JOD', 'KWD', 'LYD', 'OMR', 'TND') THEN 3
    WHEN upper(p_currency) IN ('CLF', 'UYW') THEN 4
    ELSE 2 END
$fn$
"""


def _gpu_probe(where: str, order: str = "", limit: str = "") -> str:
    return (
        f"(SELECT s.time, s.energy_mj, s.power_w FROM gpu_samples s WHERE s.node = rp.node AND s.gpu = rp.gpu "
        f"AND s.mig_instance IS NULL AND {where}{order}{limit})"
    )


def _host_probe(where: str, order: str = "", limit: str = "") -> str:
    return f"(SELECT s.time, s.host_power_w FROM host_samples s WHERE s.node = rp.node AND {where}{order}{limit})"


def _span(kind: str) -> str:
    """Energy of each span ``rs`` read from samples (a stale tail, or a claim in raw mode): its intervals
    cut at its segment edges ``rs.pe``, by segment; one interval sequence per span."""
    if kind == "gpu":
        probes = " UNION ALL ".join(
            [
                _gpu_probe("s.time <= rp.lo", " ORDER BY s.time DESC", " LIMIT 1"),
                _gpu_probe("s.time > rp.lo AND s.time < rp.hi"),
                _gpu_probe("s.time >= rp.hi", " ORDER BY s.time", " LIMIT 1"),
            ]
        )
        samples = f"(SELECT rp.node AS node, rp.gpu AS gpu, s.* FROM ({probes}) s) smp"
        intervals = E.gpu_interval_select(samples, "p_max_gap_s")
    else:
        probes = " UNION ALL ".join(
            [
                _host_probe("s.time <= rp.lo", " ORDER BY s.time DESC", " LIMIT 1"),
                _host_probe("s.time > rp.lo AND s.time < rp.hi"),
                _host_probe("s.time >= rp.hi", " ORDER BY s.time", " LIMIT 1"),
            ]
        )
        samples = f"(SELECT rp.node AS node, s.* FROM ({probes}) s) smp"
        intervals = E.host_interval_select(samples, "p_max_gap_s")
    part_s = "extract(epoch FROM least(i.t1, rp.pe[x + 1]) - greatest(i.t0, rp.pe[x]))::float8"
    gj, gs, hj = (
        (f"i.j * {part_s} / i.dt", part_s, "0::float8")
        if kind == "gpu"
        else ("0::float8", "0::float8", f"i.j * {part_s} / i.dt")
    )
    cond = "rp.gpu IS NOT NULL" if kind == "gpu" else "rp.gpu IS NULL"
    return f"""
  SELECT rp.grp, rp.segs[width_bucket(greatest(i.t0, rp.pe[x]), rp.segs)] AS seg_start,
         rp.share * {gj} AS gj, rp.share * {gs} AS gs, rp.share * {hj} AS hj
  FROM spans rp CROSS JOIN LATERAL ({intervals}) i
  CROSS JOIN LATERAL generate_series(greatest(width_bucket(i.t0, rp.pe), 1),
                                     least(width_bucket(i.t1 - INTERVAL '1 microsecond', rp.pe),
                                           cardinality(rp.pe) - 1)) AS x
  WHERE {cond} AND i.j IS NOT NULL"""


def _partial(kind: str) -> str:
    """Energy of the partial minutes ``rp`` (no edge lies inside one): every piece's samples by three
    probes, one interval sequence per piece (numbered ``rk``), each interval's share inside its piece.
    The pieces' attributes are read from the arrays of ``rpa`` by number (no join)."""
    if kind == "gpu":
        probes = " UNION ALL ".join(
            [
                _gpu_probe("s.time <= rp.lo", " ORDER BY s.time DESC", " LIMIT 1"),
                _gpu_probe("s.time > rp.lo AND s.time < rp.hi"),
                _gpu_probe("s.time >= rp.hi", " ORDER BY s.time", " LIMIT 1"),
            ]
        )
        samples = (
            f"(SELECT rp.rk AS node, 0 AS gpu, s.* FROM rp CROSS JOIN LATERAL ({probes}) s "
            "WHERE rp.gpu IS NOT NULL) smp"
        )
        intervals = E.gpu_interval_select(samples, "p_max_gap_s")
    else:
        probes = " UNION ALL ".join(
            [
                _host_probe("s.time <= rp.lo", " ORDER BY s.time DESC", " LIMIT 1"),
                _host_probe("s.time > rp.lo AND s.time < rp.hi"),
                _host_probe("s.time >= rp.hi", " ORDER BY s.time", " LIMIT 1"),
            ]
        )
        samples = (
            f"(SELECT rp.rk AS node, s.* FROM rp CROSS JOIN LATERAL ({probes}) s WHERE rp.gpu IS NULL) smp"
        )
        intervals = E.host_interval_select(samples, "p_max_gap_s")
    part_s = "extract(epoch FROM least(i.t1, a.hi[i.node]) - greatest(i.t0, a.lo[i.node]))::float8"
    gj, gs, hj = (
        (f"i.j * {part_s} / i.dt", part_s, "0::float8")
        if kind == "gpu"
        else ("0::float8", "0::float8", f"i.j * {part_s} / i.dt")
    )
    return f"""
  SELECT a.grp[i.node], a.seg0[i.node], a.share[i.node] * {gj}, a.share[i.node] * {gs}, a.share[i.node] * {hj}
  FROM ({intervals}) i CROSS JOIN rpa a
  WHERE i.j IS NOT NULL AND i.t1 > a.lo[i.node] AND i.t0 < a.hi[i.node]"""


def _buckets(table: str, kind: str, host: bool) -> str:
    if host:
        cols, match = "e.bucket, e.energy_j", "e.node = p.node"
        sums = "0::float8 AS gj, 0::float8 AS gs, p.sign * p.share * e.energy_j AS hj"
        cond = "p.gpu IS NULL"
    else:
        cols, match = "e.bucket, e.energy_j, e.covered_s", "e.node = p.node AND e.gpu = p.gpu"
        sums = "p.sign * p.share * e.energy_j AS gj, p.sign * p.share * e.covered_s AS gs, 0::float8 AS hj"
        cond = "p.gpu IS NOT NULL"
    return f"""
  SELECT p.grp, p.segs[width_bucket(coalesce(p.seg_at, e.bucket), p.segs)] AS seg_start, {sums}
  FROM cp p CROSS JOIN LATERAL (SELECT {cols} FROM {table} e
                                WHERE {match} AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
  WHERE p.kind = '{kind}' AND {cond}"""


def _long_intervals() -> str:
    """Energy of the long counter intervals (``gpu_energy_spans``: intervals longer than the gap rule,
    which the rollup worker stores as one row instead of spreading them over minutes) inside each
    claim's rollup pieces ``cp``: each span's share, spread evenly over it as its minute buckets would
    have held it.  A piece with ``seg_at`` belongs to that one segment (no edge lies inside it);
    otherwise its edges lie on its bucket boundaries, so cutting the span at them gives each segment
    what its buckets would have held.  Covered seconds count as the buckets' ``covered_s`` would."""
    part_s = "extract(epoch FROM least(sp.b, coalesce(p.segs[k + 1], 'infinity')) - greatest(sp.a, p.segs[k]))::float8"
    return f"""
  SELECT p.grp, x.seg_start, p.sign * p.share * sp.energy_j * x.part_s / sp.dt AS gj,
         p.sign * p.share * x.part_s AS gs, 0::float8 AS hj
  FROM cp p CROSS JOIN LATERAL (
    SELECT greatest(e.t0, p.lo) AS a, least(e.t1, p.hi) AS b, e.energy_j,
           extract(epoch FROM e.t1 - e.t0)::float8 AS dt
    FROM gpu_energy_spans e WHERE e.node = p.node AND e.gpu = p.gpu AND e.t0 < p.hi AND e.t1 > p.lo OFFSET 0) sp
  CROSS JOIN LATERAL (
    SELECT p.segs[k] AS seg_start, {part_s} AS part_s
    FROM generate_series(width_bucket(sp.a, p.segs), width_bucket(sp.b - INTERVAL '1 microsecond', p.segs)) k
    WHERE p.seg_at IS NULL
    UNION ALL
    SELECT p.segs[width_bucket(p.seg_at, p.segs)], extract(epoch FROM sp.b - sp.a)::float8 WHERE p.seg_at IS NOT NULL
  ) x
  WHERE p.gpu IS NOT NULL"""


_PREV_GPU = (
    "coalesce((SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu "
    "AND s.mig_instance IS NULL AND s.time < q.t ORDER BY s.time DESC LIMIT 1), q.t)"
)
_PREV_HOST = (
    "coalesce((SELECT s.time FROM host_samples s WHERE s.node = q.node AND s.time < q.t "
    "ORDER BY s.time DESC LIMIT 1), q.t)"
)

CLAIM_ENERGY_V1 = f"""
CREATE FUNCTION gpufleet_claim_energy(p_claims gpufleet_claim[], p_max_gap_s double precision DEFAULT 60,
                                      p_source text DEFAULT 'auto')
RETURNS TABLE (grp integer, seg_start timestamptz, gpu_j double precision, covered_s double precision,
               host_j double precision, stale boolean)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH c AS MATERIALIZED (
  SELECT x.k, x.grp, x.node, x.gpu, x.lo, x.hi, x.share, ARRAY[x.lo] || coalesce(x.edges, '{{}}') AS segs
  FROM unnest(p_claims) x WHERE x.lo < x.hi AND x.share > 0
),
q AS MATERIALIZED (
  SELECT r.node, min(r.t_min) AS t FROM rollup_queue r
  WHERE p_source = 'auto' AND r.node = ANY(ARRAY(SELECT DISTINCT c.node FROM c)) GROUP BY r.node
),
stale AS MATERIALIZED (
  SELECT g.node, g.gpu, {E.minute(_PREV_GPU)} AS t
  FROM (SELECT DISTINCT c.node, c.gpu FROM c WHERE c.gpu IS NOT NULL) g JOIN q ON q.node = g.node
  UNION ALL
  SELECT q.node, NULL, {E.minute(_PREV_HOST)} FROM q
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
  SELECT x.w, x.segs, s.a, s.b, s.m0, s.m1, {_ceil("s.m0", "hour")} AS h0, {_floor("s.m1", "hour")} AS h1
  FROM wk x CROSS JOIN LATERAL (
    SELECT y.a, y.b, {_ceil("y.a", "minute")} AS m0, {_floor("y.b", "minute")} AS m1
    FROM (SELECT t.t AS a, lead(t.t) OVER (ORDER BY t.t) AS b FROM (
            SELECT x.lo AS t UNION SELECT x.cut
            UNION SELECT e FROM unnest(x.segs[2:]) e WHERE e < x.cut AND {_floor("e", "hour")} <> e) t) y
    WHERE y.b IS NOT NULL) s
  WHERE x.lo < x.cut
),
-- whole minutes [mx, my) inside one hour: read directly, or as the hour less its other minutes when
-- that reads fewer rows; all of it belongs to the segment of mx (no edge lies inside)
minute_runs AS (
  SELECT x.w, x.segs, r.mx, r.my, {_floor("r.mx", "hour")} AS h,
         extract(epoch FROM r.my - r.mx) / 60 AS direct,
         1 + extract(epoch FROM r.mx - {_floor("r.mx", "hour")}) / 60
           + extract(epoch FROM {_floor("r.mx", "hour")} + INTERVAL '1 hour' - r.my) / 60 AS complement
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
  {_buckets("gpu_energy_1h", "1h", False)}
  UNION ALL {_buckets("gpu_energy_1m", "1m", False)}
  UNION ALL {_buckets("host_energy_1h", "1h", True)}
  UNION ALL {_buckets("host_energy_1m", "1m", True)}
  UNION ALL {_long_intervals()}
  UNION ALL {_partial("gpu")}
  UNION ALL {_partial("host")}
  UNION ALL {_span("gpu")}
  UNION ALL {_span("host")}
)
SELECT p.grp, p.seg_start, sum(p.gj), sum(p.gs), sum(p.hj),
       coalesce((SELECT bool_or(x.cut < x.hi) FROM cc x WHERE x.grp = p.grp), false) AND p_source = 'auto'
FROM parts p
GROUP BY p.grp, p.seg_start;
END
$fn$
"""


def _setting(name: str, col: str, at: str, site: str = "p_site", model: str = "''") -> str:
    return (
        f"(SELECT s.{col} FROM site_settings s WHERE s.site = {site} AND s.setting = '{name}' "
        f"AND s.gpu_model = {model} AND s.valid_from <= {at} ORDER BY s.valid_from DESC LIMIT 1)"
    )


def _site_periods(v2: bool) -> str:
    """``gpufleet_site_periods``; V2 adds the currency in force (a dated ``currency`` setting, else the
    site's own) and so is cut where it changes too."""
    cur_col = ", currency text" if v2 else ""
    cur_val = (
        (
            f",\n  coalesce({_setting('currency', 'txt', 'b.t0')}, "
            "(SELECT st.currency FROM sites st WHERE st.site = p_site))"
        )
        if v2
        else ""
    )
    return f"""
CREATE FUNCTION gpufleet_site_periods(p_site text, p_lo timestamptz, p_hi timestamptz)
RETURNS TABLE (t0 timestamptz, t1 timestamptz, pue double precision, price_per_kwh double precision,
               gpu_hour_price double precision, carbon_region text, carbon_g_per_kwh double precision{cur_col})
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH t AS (
  SELECT p_lo AS t WHERE p_lo < p_hi
  UNION
  SELECT s.valid_from FROM site_settings s
  WHERE s.site = p_site AND s.gpu_model = '' AND s.valid_from > p_lo AND s.valid_from < p_hi
)
SELECT b.t0, b.t1,
  coalesce({_setting("pue", "num", "b.t0")}, 1.0),
  coalesce({_setting("price_per_kwh", "num", "b.t0")}, 0.0),
  coalesce({_setting("gpu_hour_price", "num", "b.t0")}, 0.0),
  {_setting("carbon_region", "txt", "b.t0")},
  {_setting("carbon_g_per_kwh", "num", "b.t0")}{cur_val}
FROM (SELECT t.t AS t0, coalesce(lead(t.t) OVER (ORDER BY t.t), p_hi) AS t1 FROM t) b;
END
$fn$
"""


SITE_PERIODS_V1 = _site_periods(False)
SITE_PERIODS_V2 = _site_periods(True)


def _negligible(expr: str) -> str:
    """A rate below 1e-9 (g/kWh or money per kWh) priced as zero.

    PostgreSQL refuses a float product that underflows to zero ("value out of
    range: underflow"), so one stored intensity of 5e-324 would make every
    report over its region fail; no real rate is that small.
    """
    return f"(CASE WHEN abs({expr}) < 1e-9 THEN 0.0 ELSE {expr} END)"


def _steps(lo: str, hi: str) -> str:
    """Multiples of p_step (from the origin) strictly inside (lo, hi); none without a step."""
    return (
        f"SELECT g FROM generate_series(date_bin(p_step, {lo}, {ORIGIN}) + p_step, {hi}, p_step) g "
        f"WHERE p_step IS NOT NULL AND g > {lo} AND g < {hi}"
    )


def _energy_rates(v2: bool) -> str:
    """``gpufleet_energy_rates``; V2 carries the currency of each period on."""
    cur_col, cur_x, cur_val = (
        (", currency text", ",\n         cut.currency", ", x.currency") if v2 else ("", "", "")
    )
    return f"""
CREATE FUNCTION gpufleet_energy_rates(p_site text, p_lo timestamptz, p_hi timestamptz, p_step interval DEFAULT NULL)
RETURNS TABLE (t0 timestamptz, t1 timestamptz, pue double precision, price_per_kwh double precision,
               carbon_region text, g_co2e_per_kwh double precision, carbon_source text{cur_col})
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH p AS MATERIALIZED (SELECT * FROM gpufleet_site_periods(p_site, p_lo, p_hi)),
cut AS (
  SELECT p.t0 AS t, p.* FROM p
  UNION ALL
  SELECT ci.time, p.* FROM p JOIN carbon_intensity ci
    ON ci.region = p.carbon_region AND ci.time > p.t0 AND ci.time < p.t1
  UNION ALL
  SELECT st.g, p.* FROM p CROSS JOIN LATERAL ({_steps("p.t0", "p.t1")}) st
),
x AS (
  SELECT DISTINCT ON (cut.t) cut.t, cut.t1 AS period_end, cut.pue, cut.price_per_kwh, cut.carbon_region,
         cut.carbon_g_per_kwh{cur_x}
  FROM cut ORDER BY cut.t
)
SELECT x.t, coalesce(lead(x.t) OVER (ORDER BY x.t), p_hi), x.pue, {_negligible("x.price_per_kwh")}, x.carbon_region,
  {_negligible("coalesce(lp.g, x.carbon_g_per_kwh, fp.g)")},
  CASE WHEN lp.g IS NOT NULL THEN 'series' WHEN x.carbon_g_per_kwh IS NOT NULL THEN 'site_constant'
       WHEN fp.g IS NOT NULL THEN 'series' ELSE 'none' END{cur_val}
FROM x
LEFT JOIN LATERAL (SELECT ci.g_co2e_per_kwh AS g FROM carbon_intensity ci
                   WHERE ci.region = x.carbon_region AND ci.time <= x.t ORDER BY ci.time DESC LIMIT 1) lp ON true
LEFT JOIN LATERAL (SELECT ci.g_co2e_per_kwh AS g FROM carbon_intensity ci
                   WHERE ci.region = x.carbon_region ORDER BY ci.time LIMIT 1) fp ON lp.g IS NULL;
END
$fn$
"""


ENERGY_RATES_V1 = _energy_rates(False)
ENERGY_RATES_V2 = _energy_rates(True)

_GPU_HOUR_PRICE = _negligible(
    f"coalesce(CASE WHEN key.k <> '' THEN {_setting('gpu_hour_price', 'num', 'b.t0', model='key.k')} END, "
    f"{_setting('gpu_hour_price', 'num', 'b.t0')}, 0.0)"
)


def _gpu_hour_prices(v2: bool) -> str:
    """``gpufleet_gpu_hour_prices``; V2 adds the currency in force and is cut where it changes."""
    cur_col = ", currency text" if v2 else ""
    cur_cut = (
        (
            "\n     OR (s.site = p_site AND s.setting = 'currency' AND s.gpu_model = ''\n"
            "         AND s.valid_from > p_lo AND s.valid_from < p_hi)"
        )
        if v2
        else ""
    )
    cur_val = (
        (
            f",\n  coalesce({_setting('currency', 'txt', 'b.t0')}, "
            "(SELECT st.currency FROM sites st WHERE st.site = p_site))"
        )
        if v2
        else ""
    )
    return f"""
CREATE FUNCTION gpufleet_gpu_hour_prices(p_site text, p_model text, p_lo timestamptz, p_hi timestamptz,
                                         p_step interval DEFAULT NULL)
RETURNS TABLE (t0 timestamptz, t1 timestamptz, gpu_model_key text, price double precision{cur_col})
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH key AS MATERIALIZED (
  SELECT coalesce((SELECT s.gpu_model FROM site_settings s
                   WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model <> ''
                     AND p_model IS NOT NULL AND strpos(lower(p_model), lower(s.gpu_model)) > 0
                   ORDER BY length(s.gpu_model) DESC, s.gpu_model LIMIT 1), '') AS k
),
t AS (
  SELECT p_lo AS t WHERE p_lo < p_hi
  UNION
  SELECT s.valid_from FROM site_settings s, key
  WHERE s.site = p_site AND s.setting = 'gpu_hour_price' AND s.gpu_model IN ('', key.k)
    AND s.valid_from > p_lo AND s.valid_from < p_hi{cur_cut}
  UNION
  {_steps("p_lo", "p_hi")}
)
SELECT b.t0, b.t1, key.k, {_GPU_HOUR_PRICE}{cur_val}
FROM (SELECT t.t AS t0, coalesce(lead(t.t) OVER (ORDER BY t.t), p_hi) AS t1 FROM t) b, key;
END
$fn$
"""


GPU_HOUR_PRICES_V1 = _gpu_hour_prices(False)
GPU_HOUR_PRICES_V2 = _gpu_hour_prices(True)

#: A node's model from its facts ``nd.facts``, where no ``gpus[]`` entry names the GPU.
_FACTS_MODEL = (
    "CASE WHEN jsonb_typeof(nd.facts -> 'gpu_model') = 'string' THEN nullif(nd.facts ->> 'gpu_model', '') END"
)

#: The GPU model of allocation ``a`` from its node's facts ``nd.facts`` (as gpufleet.facts reads them):
#: the last ``gpus[]`` entry whose ``gpu`` (else ``index``) is the GPU, else ``gpu_model``.
GPU_MODEL_EXPR = f"""coalesce(
  (SELECT x.e ->> 'name' FROM jsonb_array_elements(CASE WHEN jsonb_typeof(nd.facts -> 'gpus') = 'array'
                                                         THEN nd.facts -> 'gpus' ELSE '[]'::jsonb END)
                              WITH ORDINALITY AS x(e, i)
   WHERE jsonb_typeof(x.e) = 'object' AND coalesce(x.e ->> 'gpu', x.e ->> 'index') = a.gpu::text
     AND jsonb_typeof(x.e -> 'name') = 'string' AND x.e ->> 'name' <> ''
   ORDER BY x.i DESC LIMIT 1),
  {_FACTS_MODEL})"""

#: The same rule as :data:`GPU_MODEL_EXPR` in two steps, for reads of many allocations: each node's facts
#: ``nd.facts`` to a JSON object of GPU (as text, as the expression compares it) to the name its last
#: ``gpus[]`` entry gives, once per node and time; then :func:`gpu_model_of_names` per allocation, a key
#: lookup.  Expanding the facts once per allocation took 2.6 s of 164,680 allocations.
GPU_NAMES_EXPR = """(SELECT jsonb_object_agg(n.gpu, n.name) FROM (
  SELECT DISTINCT ON (1) coalesce(x.e ->> 'gpu', x.e ->> 'index') AS gpu, x.e ->> 'name' AS name
  FROM jsonb_array_elements(CASE WHEN jsonb_typeof(nd.facts -> 'gpus') = 'array'
                                 THEN nd.facts -> 'gpus' ELSE '[]'::jsonb END) WITH ORDINALITY AS x(e, i)
  WHERE jsonb_typeof(x.e) = 'object' AND coalesce(x.e ->> 'gpu', x.e ->> 'index') IS NOT NULL
    AND jsonb_typeof(x.e -> 'name') = 'string' AND x.e ->> 'name' <> ''
  ORDER BY 1, x.i DESC) n)"""


def gpu_model_of_names(names: str, gpu: str) -> str:
    """The model of GPU ``gpu`` (an integer expression) from ``names`` (:data:`GPU_NAMES_EXPR`'s value) and
    the node's facts ``nd.facts``: :data:`GPU_MODEL_EXPR`'s answer."""
    return f"coalesce({names} ->> ({gpu})::text, {_FACTS_MODEL})"


_PART = "CASE p_detail WHEN 'segment' THEN {t} WHEN 'step' THEN date_bin(p_step, {t}, " + ORIGIN + ") END"

#: Decimal places of money in V2's lines (V1 rounded to the currency's minor units): far below any
#: minor unit, and sums of lines stay exact in ``numeric`` / :class:`~decimal.Decimal`.
MONEY_PLACES = 9

#: How long a GPU may stay silent before it has left the fleet (``p_gone_after_s``' default), seconds.
GONE_AFTER_S = 86400.0


def _membership() -> str:
    """When each fleet GPU ``g`` joined and left, and the part of the period ``win`` in between.

    Joined: the earliest of its node's registration (``nodes.first_seen``), its first sample (its first
    hour of energy rollups where retention took the samples of that hour), its first long counter
    interval, and the start of the first run that held it (a GPU with none of them, a count in a node's facts
    that never reported, has not joined).  Left: ``p_gone_after_s`` after the last of
    those (its last sample, the end of the last run that held it, up to now), once that is in the past;
    a GPU heard from since is still in the fleet.  Silence shorter than that is GPU time without
    telemetry; longer, the GPU is gone (retired, moved, a node taken down) and counts nowhere.  Every
    probe is one index lookup.
    """
    held = "FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE a.node = g.node AND a.gpu = g.gpu"
    smp = "FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu ORDER BY s.time"
    e1h = "FROM gpu_energy_1h e WHERE e.node = g.node AND e.gpu = g.gpu"
    spn = "FROM gpu_energy_spans e WHERE e.node = g.node AND e.gpu = g.gpu"
    horizon = "make_interval(secs => p_gone_after_s)"
    return f"""  LEFT JOIN nodes nd ON nd.node = g.node
  CROSS JOIN LATERAL (
    SELECT (SELECT s.time {smp} LIMIT 1) AS s0, (SELECT s.time {smp} DESC LIMIT 1) AS s1,
           (SELECT min(e.bucket) {e1h}) AS h0, (SELECT max(e.bucket) + INTERVAL '1 hour' {e1h}) AS h1
  ) o
  CROSS JOIN LATERAL (
    SELECT least(nd.first_seen, CASE WHEN o.s0 IS NULL OR o.h0 + INTERVAL '1 hour' <= o.s0 THEN o.h0 ELSE o.s0 END,
                 (SELECT min(e.t0) {spn}), (SELECT min(r.start) {held})) AS joined,
           greatest(nd.first_seen, coalesce(o.s1, o.h1), (SELECT max(e.t1) {spn}),
                    (SELECT max(greatest(r.start, least(coalesce(r."end", p_now), p_now))) {held})) AS last
  ) k
  CROSS JOIN LATERAL (
    SELECT k.joined, CASE WHEN k.last + {horizon} < p_now THEN k.last + {horizon}
                          ELSE 'infinity'::timestamptz END AS gone
  ) m
  WHERE m.joined IS NOT NULL AND greatest(win.f, m.joined) < least(win.t, m.gone)"""


def _currency_at(sk: str, t: str) -> str:
    """The currency in force at ``t`` for pricing site key ``sk``, from the ``rates`` of the query."""
    return f"(SELECT r.currency FROM rates r WHERE r.sk = {sk} AND r.t0 <= {t} ORDER BY r.t0 DESC LIMIT 1)"


def _query(v2: bool) -> str:
    """The text of ``gpufleet_accounting``: V1 (frozen, migrations 0004 and 0010) or V2 (migration 0012).

    V2 differs from V1 in four places, each for a reason readers of the figures meet:

    * money is computed in ``numeric`` and returned to :data:`MONEY_PLACES` decimals instead of the
      currency's minor units: a product of stored rates can no longer overflow a float and fail every
      report, and rounding for people is the presentation's job (docs/contracts.md section 3);
    * each line is priced in the currency in force (``site_settings`` ``currency``, else the site's own),
      so a currency change is dated like every other setting; a run across a change has one line per
      currency;
    * a fleet GPU counts from when it joined to when it left (:func:`_membership`), not over the
      whole period, so GPU time with no telemetry is not invented for a fleet that grows;
    * ``p_gone_after_s`` is the silence after which a GPU has left.
    """
    if v2:
        fleet_gpu_head = (
            "SELECT g.node, g.gpu, greatest(win.f, m.joined) AS a, least(win.t, m.gone) AS b FROM ("
        )
        gone = ") g CROSS JOIN win\n" + _membership()
        gpu_win, gpu_a, gpu_b = "", "g.a", "g.b"
        rates_cur, priced_cur = " r.currency,", " r.currency AS cur,"
        el_cur, el_group = "p.cur, ", "1, 2, 3, 4, 5"
        el_co2e = "sum(p.fac::numeric * p.g::numeric) / 1000"
        el_ecost = "sum(p.fac::numeric * p.price::numeric)"
        fs_cur_u, fs_group_u = " " + _currency_at("t.sk", "t.a") + " AS cur,", "1, 2, 3, 4"
        fs_cur_t, fs_group_t = " " + _currency_at("cl.sk", "t.a") + ",", "2, 3, 4"
        cl_cur, cl_group = " gp.currency AS cur,", "1, 2, 3, 4"
        cl_ccost = (
            "sum((m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8 / 3600.0)::numeric"
            " * gp.price::numeric)"
        )
        rp_el_cur, rp_cl_cur = ", energy_lines.cur", ", compute_lines.cur"
        rl_cur = ", rp.cur"
        rl_el_on, rl_cl_on = (
            " AND el.cur IS NOT DISTINCT FROM rp.cur",
            " AND cl.cur IS NOT DISTINCT FROM rp.cur",
        )
        fl_cc_on = "\n              AND c.cur IS NOT DISTINCT FROM coalesce(el.cur, fs.cur)"
        fl_cur = ", coalesce(el.cur, fs.cur) AS cur"
        fl_on = " AND fs.cur IS NOT DISTINCT FROM el.cur"
        lo_cur = "c"
        lo_join = (
            "CROSS JOIN LATERAL (SELECT coalesce(l.cur, (SELECT sp.currency FROM gpufleet_site_periods(\n"
            "    nullif(l.sk, ''), l.part_start, l.part_start + INTERVAL '1 microsecond') sp)) AS currency) c"
        )
        mp = str(MONEY_PLACES)
    else:
        fleet_gpu_head = gone = gpu_win = ""
        gpu_win, gpu_a, gpu_b = "CROSS JOIN win", "win.f", "win.t"
        rates_cur = priced_cur = el_cur = ""
        el_group = "1, 2, 3, 4"
        el_co2e, el_ecost = "sum(p.fac * p.g / 1000.0)", "sum(p.fac * p.price)"
        fs_cur_u = fs_cur_t = ""
        fs_group_u, fs_group_t = "1, 2, 3", "2, 3"
        cl_cur, cl_group = "", "1, 2, 3"
        cl_ccost = "sum(m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8 / 3600.0 * gp.price)"
        rp_el_cur = rp_cl_cur = rl_cur = rl_el_on = rl_cl_on = fl_cc_on = fl_cur = fl_on = ""
        lo_cur, lo_join = "st", "LEFT JOIN sites st ON st.site = nullif(l.sk, '')"
        mp = "o.mu"
    return f"""
WITH
win AS (
  SELECT p_from AS f, greatest(p_from, least(coalesce(p_to, 'infinity'), p_now)) AS t
),
run_w AS MATERIALIZED (
  SELECT r.run_id, r.site, coalesce(r.site, '') AS sk, l.lo,
         greatest(l.lo, least(coalesce(r."end", p_now), p_now, coalesce(p_to, 'infinity'))) AS hi
  FROM runs r CROSS JOIN LATERAL (SELECT greatest(r.start, coalesce(p_from, r.start)) AS lo) l
  WHERE (p_runs IS NULL OR r.run_id = ANY(p_runs))
    AND (p_runs IS NOT NULL OR (r.start < coalesce(p_to, 'infinity')
                                AND (p_from IS NULL OR r."end" IS NULL OR r."end" > p_from)))
),
alloc AS MATERIALIZED (
  SELECT w.run_id, w.site, w.sk, w.lo, w.hi, a.node, a.gpu::integer AS gpu, a.share
  FROM run_w w JOIN run_allocations a ON a.run_id = w.run_id
),
span AS MATERIALIZED (
  SELECT least((SELECT min(lo) FROM run_w), CASE WHEN p_fleet THEN (SELECT f FROM win) END) AS lo,
         greatest((SELECT max(hi) FROM run_w), CASE WHEN p_fleet THEN (SELECT t FROM win) END) AS hi
),
-- <fleet>
fleet_gpu AS MATERIALIZED (
  {fleet_gpu_head}SELECT DISTINCT x.node, x.gpu FROM (
    SELECT n.node, g.g AS gpu FROM nodes n CROSS JOIN LATERAL generate_series(0, coalesce(n.gpu_count, 0) - 1) g(g)
    UNION ALL SELECT alloc.node, alloc.gpu FROM alloc
    UNION ALL SELECT e.node, e.gpu FROM gpu_energy_1h e, win
      WHERE e.bucket >= {_floor("win.f", "hour")} AND e.bucket < win.t
    -- a GPU whose only energy in the period is a long counter interval has no rollup bucket there
    UNION ALL SELECT e.node, e.gpu FROM gpu_energy_spans e, win WHERE e.t0 < win.t AND e.t1 > win.f
    UNION ALL SELECT s.node, s.gpu FROM gpu_samples s, win
      WHERE p_source = 'raw' AND s.time >= win.f AND s.time < win.t AND s.mig_instance IS NULL
  ) x WHERE p_fleet AND (SELECT f < t FROM win){gone}
),
-- </fleet>
node_info AS MATERIALIZED (
  SELECT x.node, coalesce(nd.site, '') AS sk,
    coalesce(nd.gpu_count::integer,
      (SELECT nullif(count(DISTINCT g.gpu), 0)::integer FROM (
         SELECT e.gpu FROM gpu_energy_1h e, span
         WHERE e.node = x.node AND e.bucket >= {_floor("span.lo", "hour")} AND e.bucket < span.hi
         UNION SELECT e.gpu FROM gpu_energy_spans e, span WHERE e.node = x.node AND e.t0 < span.hi AND e.t1 > span.lo
       ) g),
      (SELECT nullif(count(DISTINCT s.gpu), 0)::integer FROM gpu_samples s, span
       WHERE s.node = x.node AND s.time >= span.lo AND s.time <= span.hi AND s.mig_instance IS NULL), 0) AS reported
  FROM (SELECT DISTINCT alloc.node FROM alloc
-- <fleet>
        UNION SELECT fleet_gpu.node FROM fleet_gpu
        UNION SELECT e.node FROM host_energy_1h e, win
        WHERE p_fleet AND e.bucket >= {_floor("win.f", "hour")} AND e.bucket < win.t
-- </fleet>
        ) x
  LEFT JOIN nodes nd ON nd.node = x.node
),
rates AS MATERIALIZED (
  SELECT s.sk, r.t0, r.t1, r.pue, r.price_per_kwh, r.g_co2e_per_kwh, r.carbon_source,{rates_cur}
         row_number() OVER (PARTITION BY s.sk ORDER BY r.t0)::integer AS ix
  FROM (SELECT DISTINCT run_w.sk FROM run_w
-- <fleet>
        UNION SELECT node_info.sk FROM node_info WHERE p_fleet
-- </fleet>
       ) s
  CROSS JOIN span CROSS JOIN LATERAL gpufleet_energy_rates(nullif(s.sk, ''), span.lo, span.hi, p_step) r
),
bounds AS MATERIALIZED (SELECT rates.sk, array_agg(rates.t0 ORDER BY rates.t0) AS b FROM rates GROUP BY rates.sk),
-- <fleet>
all_bounds AS MATERIALIZED (SELECT coalesce(array_agg(DISTINCT rates.t0 ORDER BY rates.t0), '{{}}') AS b FROM rates),
-- </fleet>
run_edges AS (
  SELECT w.run_id, ARRAY(SELECT e FROM unnest(b.b) e WHERE e > w.lo AND e < w.hi) AS edges
  FROM run_w w JOIN bounds b ON b.sk = w.sk WHERE w.lo < w.hi
),
-- <fleet>
held AS MATERIALIZED (SELECT alloc.* FROM alloc WHERE p_fleet AND alloc.lo < alloc.hi),
gpu_cuts AS (
  SELECT g.node, g.gpu, c.t FROM fleet_gpu g {gpu_win} CROSS JOIN LATERAL (
    SELECT {gpu_a} AS t UNION SELECT {gpu_b}
    UNION SELECT v.x FROM held h CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x)
    WHERE h.node = g.node AND h.gpu = g.gpu AND v.x > {gpu_a} AND v.x < {gpu_b}) c
),
gpu_sub AS MATERIALIZED (
  SELECT s.node, s.gpu, s.a, s.b FROM (
    SELECT gpu_cuts.node, gpu_cuts.gpu, gpu_cuts.t AS a,
           lead(gpu_cuts.t) OVER (PARTITION BY gpu_cuts.node, gpu_cuts.gpu ORDER BY gpu_cuts.t) AS b
    FROM gpu_cuts) s WHERE s.b IS NOT NULL
),
gpu_hold AS (
  SELECT s.node, s.gpu, s.a, s.b, h.sk, sum(h.share) AS w
  FROM gpu_sub s JOIN held h ON h.node = s.node AND h.gpu = s.gpu AND h.lo <= s.a AND h.hi >= s.b
  GROUP BY 1, 2, 3, 4, 5
),
host_cuts AS (
  SELECT n.node, c.t FROM node_info n CROSS JOIN win CROSS JOIN LATERAL (
    SELECT win.f AS t UNION SELECT win.t
    UNION SELECT v.x FROM held h CROSS JOIN LATERAL (VALUES (h.lo), (h.hi)) v(x)
    WHERE h.node = n.node AND v.x > win.f AND v.x < win.t) c
  WHERE p_fleet AND win.f < win.t
),
host_sub AS MATERIALIZED (
  SELECT s.node, s.a, s.b, n.reported, n.sk,
         coalesce((SELECT sum(h.share) FROM held h WHERE h.node = s.node AND h.lo <= s.a AND h.hi >= s.b), 0) AS held
  FROM (SELECT host_cuts.node, host_cuts.t AS a,
               lead(host_cuts.t) OVER (PARTITION BY host_cuts.node ORDER BY host_cuts.t) AS b FROM host_cuts) s
  JOIN node_info n ON n.node = s.node WHERE s.b IS NOT NULL
),
host_hold AS (
  SELECT s.node, s.a, s.b, h.sk, sum(h.share) / greatest(s.reported, s.held) AS w
  FROM host_sub s JOIN held h ON h.node = s.node AND h.lo <= s.a AND h.hi >= s.b
  GROUP BY 1, 2, 3, 4, s.reported, s.held
),
-- </fleet>
claims AS MATERIALIZED (
  SELECT row_number() OVER ()::integer AS k, x.* FROM (
    SELECT 'run'::text AS line, a.run_id, a.sk, a.node, a.gpu, a.lo, a.hi, a.share, e.edges
    FROM alloc a JOIN run_edges e ON e.run_id = a.run_id
    UNION ALL
    SELECT 'run', h.run_id, h.sk, h.node, NULL::integer, h.lo, h.hi, h.held / greatest(n.reported, h.held), e.edges
    FROM (SELECT alloc.run_id, alloc.sk, alloc.lo, alloc.hi, alloc.node, sum(alloc.share) AS held
          FROM alloc GROUP BY 1, 2, 3, 4, 5) h
    JOIN node_info n ON n.node = h.node JOIN run_edges e ON e.run_id = h.run_id
-- <fleet>
    UNION ALL
    SELECT 'unallocated', NULL, n.sk, s.node, s.gpu, s.a, s.b,
           greatest(1.0 - coalesce((SELECT sum(g.w) FROM gpu_hold g
                                    WHERE g.node = s.node AND g.gpu = s.gpu AND g.a = s.a), 0), 0.0),
           ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM gpu_sub s JOIN node_info n ON n.node = s.node CROSS JOIN all_bounds ab
    UNION ALL
    SELECT 'total', NULL, NULL, s.node, s.gpu, s.a, s.b, 1.0, ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM gpu_sub s CROSS JOIN all_bounds ab
    UNION ALL
    SELECT 'unallocated', NULL, s.sk, s.node, NULL, s.a, s.b,
           CASE WHEN greatest(s.reported, s.held) = 0 THEN 1.0
                ELSE (greatest(s.reported, s.held) - s.held) / greatest(s.reported, s.held) END,
           ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM host_sub s CROSS JOIN all_bounds ab
    UNION ALL
    SELECT 'total', NULL, NULL, s.node, NULL, s.a, s.b, 1.0, ARRAY(SELECT e FROM unnest(ab.b) e WHERE e > s.a AND e < s.b)
    FROM host_sub s CROSS JOIN all_bounds ab
-- </fleet>
  ) x
),
-- <fleet>
-- who pays for each share of a total claim: the runs holding it at their sites, the rest the node's site
-- (normalised to the whole: GPU time held twice, which the database refuses, still counts once here)
claimants AS MATERIALIZED (
  SELECT y.k, y.sk, sum(y.w) AS w FROM (
  SELECT x.k, x.sk, x.w / greatest(1.0, sum(x.w) OVER (PARTITION BY x.k)) AS w FROM (
    SELECT c.k, g.sk, g.w FROM claims c JOIN gpu_hold g ON g.node = c.node AND g.gpu = c.gpu AND g.a = c.lo
    WHERE c.line = 'total' AND c.gpu IS NOT NULL
    UNION ALL
    SELECT c.k, u.sk, u.share FROM claims c JOIN claims u ON u.line = 'unallocated' AND u.node = c.node
      AND u.gpu IS NOT DISTINCT FROM c.gpu AND u.lo = c.lo
    WHERE c.line = 'total'
    UNION ALL
    SELECT c.k, h.sk, h.w FROM claims c JOIN host_hold h ON h.node = c.node AND h.a = c.lo
    WHERE c.line = 'total' AND c.gpu IS NULL
  ) x) y GROUP BY y.k, y.sk
),
mix AS (
  SELECT claimants.k, string_agg(claimants.sk || '=' || claimants.w::text, ',' ORDER BY claimants.sk, claimants.w)
           AS sig
  FROM claimants GROUP BY claimants.k
),
-- </fleet>
-- claims summed together: a run's, the unallocated ones of one site, the total ones paid for alike
grouped AS MATERIALIZED (
  SELECT c.*, dense_rank() OVER (ORDER BY CASE c.line WHEN 'run' THEN 'r' || c.run_id
                                                      WHEN 'unallocated' THEN 'u' || c.sk
-- <fleet>
                                                      WHEN 'total' THEN 't' || coalesce(m.sig, '')
-- </fleet>
                                                      END)::integer AS grp
  FROM claims c
-- <fleet>
  LEFT JOIN mix m ON m.k = c.k
-- </fleet>
),
group_of AS (SELECT DISTINCT g.grp, g.line, g.run_id, g.sk FROM grouped g WHERE g.line <> 'total'),
-- <fleet>
total_mix AS (
  SELECT DISTINCT g.grp, cl.sk, cl.w FROM grouped g JOIN claimants cl ON cl.k = g.k WHERE g.line = 'total'
),
-- </fleet>
en AS MATERIALIZED (
  SELECT * FROM gpufleet_claim_energy(
    (SELECT array_agg(ROW(g.k, g.grp, g.node, g.gpu, g.lo, g.hi, g.share, g.edges)::gpufleet_claim) FROM grouped g),
    p_max_gap_s, p_source)
),
measured AS (
  SELECT go.line, go.run_id, go.sk, en.seg_start, sum(en.gpu_j) AS gj, sum(en.covered_s) AS cs,
         sum(en.host_j) AS hj, bool_or(en.stale) AS st
  FROM en JOIN group_of go ON go.grp = en.grp GROUP BY 1, 2, 3, 4
-- <fleet>
  UNION ALL
  SELECT 'total', NULL, tm.sk, en.seg_start, sum(en.gpu_j * tm.w), sum(en.covered_s * tm.w), sum(en.host_j * tm.w),
         bool_or(en.stale)
  FROM en JOIN total_mix tm ON tm.grp = en.grp GROUP BY 3, 4
-- </fleet>
),
priced AS (
  SELECT m.*, r.t1 AS seg_end, r.pue AS rpue, r.price_per_kwh AS price, r.g_co2e_per_kwh AS g, r.carbon_source,{priced_cur}
         (m.gj + m.hj) / 3.6e6 * r.pue AS fac, {_PART.format(t="m.seg_start")} AS part
  FROM measured m JOIN bounds b ON b.sk = m.sk JOIN rates r ON r.sk = m.sk AND r.ix = width_bucket(m.seg_start, b.b)
),
energy_lines AS (
  SELECT p.line, p.run_id, p.sk, p.part, {el_cur}min(p.seg_end) AS part_end, sum(p.gj) / 3.6e6 AS gpu_kwh,
         sum(p.hj) / 3.6e6 AS host_kwh, sum(p.fac) AS fac, {el_co2e} AS co2e,
         coalesce(sum(p.fac) FILTER (WHERE p.g IS NULL), 0) AS unknown, {el_ecost} AS ecost,
         sum(p.cs) AS cs, bool_or(p.st) AS st,
         CASE WHEN count(DISTINCT p.carbon_source) = 1 THEN min(p.carbon_source) ELSE 'mixed' END AS csrc,
         CASE WHEN count(DISTINCT p.price) = 1 THEN min(p.price) END AS one_price,
         CASE WHEN count(DISTINCT p.g) = 1 THEN min(p.g) END AS one_g,
         count(DISTINCT p.price) AS prices
  FROM priced p GROUP BY {el_group}
),
-- <fleet>
-- GPU-seconds of the fleet lines, from the claims themselves (energy or not)
fleet_time AS (
  SELECT c.line, c.k, c.sk, c.share AS w, seg.a, seg.b
  FROM claims c CROSS JOIN LATERAL (
    SELECT z.a, coalesce(lead(z.a) OVER (ORDER BY z.a), c.hi) AS b FROM unnest(ARRAY[c.lo] || c.edges) z(a)) seg
  WHERE c.line <> 'run' AND c.gpu IS NOT NULL
),
fleet_s AS (
  SELECT t.line, t.sk, {_PART.format(t="t.a")} AS part,{fs_cur_u} sum(t.w * extract(epoch FROM t.b - t.a)::float8) AS gpu_s
  FROM fleet_time t WHERE t.line = 'unallocated' GROUP BY {fs_group_u}
  UNION ALL
  SELECT 'total', cl.sk, {_PART.format(t="t.a")},{fs_cur_t} sum(cl.w * extract(epoch FROM t.b - t.a)::float8)
  FROM fleet_time t JOIN claimants cl ON cl.k = t.k WHERE t.line = 'total' GROUP BY {fs_group_t}
),
-- </fleet>
gpu_keys AS (
  SELECT a.run_id, a.site, a.sk, a.lo, a.hi, a.share,
         CASE WHEN EXISTS (SELECT 1 FROM site_settings s WHERE s.site = a.site AND s.setting = 'gpu_hour_price'
                           AND s.gpu_model <> '') THEN {GPU_MODEL_EXPR} END AS model
  FROM alloc a LEFT JOIN nodes nd ON nd.node = a.node
),
compute_lines AS (
  SELECT m.run_id, m.sk, {_PART.format(t="greatest(gp.t0, m.lo)")} AS part,{cl_cur}
         sum(m.w * extract(epoch FROM least(gp.t1, m.hi) - greatest(gp.t0, m.lo))::float8) AS gpu_s,
         {cl_ccost}
           AS ccost
  FROM (SELECT gk.run_id, gk.site, gk.sk, gk.lo, gk.hi, gk.model, sum(gk.share) AS w
        FROM gpu_keys gk WHERE gk.lo < gk.hi GROUP BY 1, 2, 3, 4, 5, 6) m
  CROSS JOIN LATERAL gpufleet_gpu_hour_prices(m.site, m.model, m.lo, m.hi, p_step) gp
  WHERE p_detail <> 'segment'
  GROUP BY {cl_group}
),
run_parts AS (
  SELECT energy_lines.run_id, energy_lines.part{rp_el_cur} FROM energy_lines WHERE energy_lines.line = 'run'
  UNION SELECT compute_lines.run_id, compute_lines.part{rp_cl_cur} FROM compute_lines
),
run_lines AS (
  SELECT 'run'::text AS line, w.run_id, w.sk, rp.part,
         CASE WHEN p_detail = 'line' THEN w.lo ELSE greatest(rp.part, w.lo) END AS part_start,
         CASE WHEN p_detail = 'line' THEN w.hi WHEN p_detail = 'segment' THEN least(el.part_end, w.hi)
              ELSE least(rp.part + p_step, w.hi) END AS part_end,
         (SELECT count(*) FROM alloc a WHERE a.run_id = w.run_id)::integer AS gpu_count,
         (SELECT coalesce(sum(a.share), 0) FROM alloc a WHERE a.run_id = w.run_id) AS gpu_equivalents,
         coalesce(cl.gpu_s, CASE WHEN p_detail = 'line' THEN 0.0 END) AS gpu_s, coalesce(el.cs, 0) AS cs,
         el.gpu_kwh, el.host_kwh, el.fac, el.co2e, el.unknown, el.ecost, el.csrc, el.one_price, el.one_g, el.prices,
         el.st, coalesce(cl.ccost, CASE WHEN p_detail = 'segment' THEN NULL ELSE 0.0 END) AS ccost, w.lo{rl_cur}
  FROM run_w w
  LEFT JOIN run_parts rp ON rp.run_id = w.run_id
  LEFT JOIN energy_lines el ON el.line = 'run' AND el.run_id = w.run_id AND el.part IS NOT DISTINCT FROM rp.part{rl_el_on}
  LEFT JOIN compute_lines cl ON cl.run_id = w.run_id AND cl.part IS NOT DISTINCT FROM rp.part{rl_cl_on}
),
-- <fleet>
fleet_lines AS (
  SELECT coalesce(el.line, fs.line) AS line, NULL::text AS run_id, coalesce(el.sk, fs.sk) AS sk,
         coalesce(el.part, fs.part) AS part,
         CASE WHEN p_detail = 'line' THEN (SELECT f FROM win) ELSE coalesce(el.part, fs.part) END AS part_start,
         CASE WHEN p_detail = 'line' THEN (SELECT t FROM win) WHEN p_detail = 'segment' THEN el.part_end
              ELSE least(coalesce(el.part, fs.part) + p_step, (SELECT t FROM win)) END AS part_end,
         NULL::integer AS gpu_count, NULL::float8 AS gpu_equivalents, coalesce(fs.gpu_s, 0) AS gpu_s,
         coalesce(el.cs, 0) AS cs, el.gpu_kwh, el.host_kwh, el.fac, el.co2e, el.unknown, el.ecost, el.csrc,
         el.one_price, el.one_g, el.prices, el.st,
         CASE WHEN coalesce(el.line, fs.line) = 'total' THEN
           (SELECT coalesce(sum(c.ccost), 0) FROM compute_lines c
            WHERE c.sk = coalesce(el.sk, fs.sk) AND c.part IS NOT DISTINCT FROM coalesce(el.part, fs.part){fl_cc_on})
         ELSE 0.0 END AS ccost, (SELECT f FROM win) AS lo{fl_cur}
  FROM (SELECT * FROM energy_lines WHERE energy_lines.line <> 'run') el
  FULL JOIN fleet_s fs ON fs.line = el.line AND fs.sk = el.sk AND fs.part IS NOT DISTINCT FROM el.part{fl_on}
),
-- </fleet>
lines_out AS (
  SELECT l.*, {lo_cur}.currency, gpufleet_minor_units({lo_cur}.currency) AS mu,
    coalesce(l.gpu_kwh, 0) + coalesce(l.host_kwh, 0) AS it
  FROM (SELECT * FROM run_lines
-- <fleet>
        UNION ALL SELECT * FROM fleet_lines
-- </fleet>
       ) l
  {lo_join}
)
SELECT o.line, o.run_id, nullif(o.sk, ''), o.part_start, o.part_end, o.gpu_count, o.gpu_equivalents,
  o.gpu_s, o.cs, round((o.gpu_s / 3600.0)::numeric, 9), round((least(o.cs, o.gpu_s) / 3600.0)::numeric, 9),
  CASE WHEN o.gpu_s > 0 THEN least(o.cs / o.gpu_s, 1.0) ELSE 0.0 END,
  round(coalesce(o.gpu_kwh, 0)::numeric, 9), round(coalesce(o.host_kwh, 0)::numeric, 9),
  round(o.it::numeric, 9), round(coalesce(o.fac, 0)::numeric, 9),
  round((CASE WHEN o.it > 0 THEN o.fac / o.it
              ELSE (SELECT sp.pue FROM gpufleet_site_periods(nullif(o.sk, ''), o.part_start,
                                                             o.part_start + INTERVAL '1 microsecond') sp) END)::numeric, 6),
  round(coalesce(o.co2e, 0)::numeric, 9), round(coalesce(o.unknown, 0)::numeric, 9),
  coalesce(o.csrc, (SELECT er.carbon_source FROM gpufleet_energy_rates(nullif(o.sk, ''), o.part_start,
                                                  o.part_start + INTERVAL '1 microsecond') er LIMIT 1), 'none'),
  o.one_g,
  CASE WHEN o.sk = '' THEN 'none' WHEN coalesce(o.prices, 1) <= 1 THEN 'flat' ELSE 'time_of_use' END, o.one_price,
  o.currency, o.mu,
  round(coalesce(o.ecost, 0)::numeric, {mp}), round(o.ccost::numeric, {mp}),
  round(coalesce(o.ecost, 0)::numeric, {mp}) + round(coalesce(o.ccost, 0)::numeric, {mp}),
  coalesce(o.st, false)
FROM lines_out o
ORDER BY o.line DESC, o.run_id, o.sk, o.part_start"""


_QUERY = _query(False)
_QUERY_V2 = _query(True)


def _variant(query: str, fleet: bool) -> str:
    """The query with (``fleet``) or without the parts between ``-- <fleet>`` and ``-- </fleet>``."""
    out, keep = [], True
    for line in query.splitlines():
        if line == "-- <fleet>":
            keep = fleet
        elif line == "-- </fleet>":
            keep = True
        elif keep:
            out.append(line)
    return "\n".join(out)


#: The rows every accounting function returns (one line per run, unallocated, no-telemetry, total; or parts).
_LINE_TABLE = """RETURNS TABLE (
  line text, run_id text, site text, part_start timestamptz, part_end timestamptz,
  gpu_count integer, gpu_equivalents double precision, gpu_s double precision, covered_s double precision,
  gpu_hours numeric, covered_hours numeric, coverage double precision, gpu_kwh numeric, host_kwh numeric, it_kwh numeric,
  facility_kwh numeric, pue numeric,
  co2e_kg numeric, co2e_unknown_kwh numeric, carbon_source text, g_co2e_per_kwh double precision,
  price_source text, price_per_kwh double precision, currency text, minor_units integer,
  energy_cost numeric, compute_cost numeric, total_cost numeric, stale boolean)"""


def _accounting(v2: bool) -> str:
    """``gpufleet_accounting``; V2 takes ``p_gone_after_s`` (:func:`_membership`) last, with a default, so
    callers of V1's nine arguments (the Grafana boards) read V2 unchanged."""
    gone = f",\n  p_gone_after_s double precision DEFAULT {GONE_AFTER_S}" if v2 else ""
    q = _query(v2)
    return f"""
CREATE FUNCTION gpufleet_accounting(
  p_from timestamptz, p_to timestamptz, p_now timestamptz DEFAULT now(), p_runs text[] DEFAULT NULL,
  p_fleet boolean DEFAULT true, p_max_gap_s double precision DEFAULT 60, p_source text DEFAULT 'auto',
  p_detail text DEFAULT 'line', p_step interval DEFAULT NULL{gone})
{_LINE_TABLE}
LANGUAGE plpgsql STABLE SET jit = off AS $fn$
#variable_conflict use_column
BEGIN
IF p_fleet THEN
RETURN QUERY
{_variant(q, True)};
ELSE
RETURN QUERY
{_variant(q, False)};
END IF;
END
$fn$
"""


ACCOUNTING_V1 = _accounting(False)
ACCOUNTING_V2 = _accounting(True)

#: Every statement migration 0004 runs to install accounting, in order.
INSTALL_V1: tuple[str, ...] = (
    TYPES_V1,
    MINOR_UNITS_V1,
    CLAIM_ENERGY_V1,
    SITE_PERIODS_V1,
    ENERGY_RATES_V1,
    GPU_HOUR_PRICES_V1,
    ACCOUNTING_V1,
)

#: The V1 functions V2 replaces (their result tables or arguments change, so they are dropped, not replaced).
_DROP_PRICING_V1: tuple[str, ...] = (
    "DROP FUNCTION IF EXISTS gpufleet_accounting(timestamptz, timestamptz, timestamptz, text[], boolean, "
    "double precision, text, text, interval)",
    "DROP FUNCTION IF EXISTS gpufleet_gpu_hour_prices(text, text, timestamptz, timestamptz, interval)",
    "DROP FUNCTION IF EXISTS gpufleet_energy_rates(text, timestamptz, timestamptz, interval)",
    "DROP FUNCTION IF EXISTS gpufleet_site_periods(text, timestamptz, timestamptz)",
)

DROP_V1: tuple[str, ...] = (
    *_DROP_PRICING_V1,
    "DROP FUNCTION IF EXISTS gpufleet_claim_energy(gpufleet_claim[], double precision, text)",
    "DROP FUNCTION IF EXISTS gpufleet_minor_units(text)",
    "DROP TYPE IF EXISTS gpufleet_claim",
)


# ---------------------------------------------------------------------------------------------------- incidents

#: The claims of ``gpufleet_incident_accounting``: GPU-time of runs' allocations, each weighted and keyed.
_INCIDENT_CLAIMS = """ic AS MATERIALIZED (
  SELECT x.key, x.run_id, x.node, x.gpu, greatest(x.lo, r.start) AS lo,
         least(x.hi, coalesce(r."end", p_now), p_now) AS hi, x.weight, r.site
  FROM unnest(p_keys, p_run_ids, p_nodes, p_gpus, p_los, p_his, p_weights) x(key, run_id, node, gpu, lo, hi, weight)
  JOIN runs r ON r.run_id = x.run_id
  WHERE x.weight >= 0 AND greatest(x.lo, r.start) < least(x.hi, coalesce(r."end", p_now), p_now)
),
run_w AS MATERIALIZED (
  SELECT c.key AS run_id, min(c.site) AS site, coalesce(min(c.site), '') AS sk, min(c.lo) AS lo, max(c.hi) AS hi
  FROM ic c GROUP BY c.key
),
alloc AS MATERIALIZED (
  SELECT c.key AS run_id, c.site, coalesce(c.site, '') AS sk, c.lo, c.hi, a.node, a.gpu::integer AS gpu,
         a.share * least(c.weight, 1.0) AS share
  FROM ic c JOIN run_allocations a ON a.run_id = c.run_id AND a.node = c.node AND a.gpu = c.gpu
),
"""


def _incident_query(v2: bool = False) -> str:
    """``_QUERY`` (without the fleet lines) over weighted claims instead of runs' whole allocations.

    Only the claims differ: the runs' windows and allocations (``run_w``, ``alloc``) become the
    caller's keyed pieces of GPU-time, and each claim keeps the tariff edges inside its own range
    (the run query's claims all span their run's window, so there every edge is inside).
    Energy, PUE, carbon, energy and GPU-hour prices and rounding are the run query's text.
    """
    q = _variant(_query(v2), False)
    i, j = q.index("run_w AS MATERIALIZED ("), q.index("span AS MATERIALIZED (")
    q = q[:i] + _INCIDENT_CLAIMS + q[j:]
    swaps = (
        (
            "a.share, e.edges\n    FROM alloc a JOIN run_edges e ON e.run_id = a.run_id",
            "a.share, ARRAY(SELECT x FROM unnest(e.edges) x WHERE x > a.lo AND x < a.hi) AS edges\n"
            "    FROM alloc a JOIN run_edges e ON e.run_id = a.run_id",
        ),
        (
            "h.held / greatest(n.reported, h.held), e.edges",
            "h.held / greatest(n.reported, h.held), ARRAY(SELECT x FROM unnest(e.edges) x WHERE x > h.lo AND x < h.hi)",
        ),
    )
    for old, new in swaps:
        if q.count(old) != 1:
            raise AssertionError(f"accounting query changed: {old!r}")
        q = q.replace(old, new)
    return q


def _incident_accounting(v2: bool) -> str:
    return f"""
CREATE FUNCTION gpufleet_incident_accounting(
  p_keys text[], p_run_ids text[], p_nodes text[], p_gpus integer[], p_los timestamptz[], p_his timestamptz[],
  p_weights double precision[], p_now timestamptz DEFAULT now(), p_max_gap_s double precision DEFAULT 60,
  p_source text DEFAULT 'auto')
{_LINE_TABLE}
LANGUAGE plpgsql STABLE SET jit = off AS $fn$
#variable_conflict use_column
DECLARE
  p_from timestamptz := NULL;
  p_to timestamptz := NULL;
  p_fleet boolean := false;
  p_detail text := 'line';
  p_step interval := NULL;
BEGIN
RETURN QUERY
{_incident_query(v2)};
END
$fn$
"""


INCIDENT_ACCOUNTING_V1 = _incident_accounting(False)
INCIDENT_ACCOUNTING_V2 = _incident_accounting(True)
#: What migration 0010 runs to install incident accounting (after INSTALL_V1), and its undoing.
INSTALL_INCIDENTS_V1: tuple[str, ...] = (INCIDENT_ACCOUNTING_V1,)
DROP_INCIDENTS_V1: tuple[str, ...] = (
    "DROP FUNCTION IF EXISTS gpufleet_incident_accounting(text[], text[], text[], integer[], timestamptz[], "
    "timestamptz[], double precision[], timestamptz, double precision, text)",
)


# ---------------------------------------------------------------------------------------------------- V2

#: What migration 0014 runs to move accounting to V2 (after INSTALL_V1 and INSTALL_INCIDENTS_V1): money
#: in ``numeric`` to :data:`MONEY_PLACES`, dated currencies, fleet GPUs from when they joined to when they left.
INSTALL_V2: tuple[str, ...] = (
    *_DROP_PRICING_V1,
    *DROP_INCIDENTS_V1,
    SITE_PERIODS_V2,
    ENERGY_RATES_V2,
    GPU_HOUR_PRICES_V2,
    ACCOUNTING_V2,
    INCIDENT_ACCOUNTING_V2,
)
#: Back to V1 (migration 0014's downgrade).
DROP_V2: tuple[str, ...] = (
    "DROP FUNCTION IF EXISTS gpufleet_accounting(timestamptz, timestamptz, timestamptz, text[], boolean, "
    "double precision, text, text, interval, double precision)",
    *DROP_INCIDENTS_V1,
    *_DROP_PRICING_V1[1:],
    SITE_PERIODS_V1,
    ENERGY_RATES_V1,
    GPU_HOUR_PRICES_V1,
    ACCOUNTING_V1,
    INCIDENT_ACCOUNTING_V1,
)
#: The functions as installed at the head revision: the bodies ``tests/accounting/test_sql_definition.py``
#: compares with the database's.
#: V3: V2 with each allocation's GPU model read from its node's facts in force when the priced piece
#: begins (gpufleet.store.fact_history), so a later batch naming another model never re-prices a closed
#: period (migration 0021).
ACCOUNTING_V3 = dated_pricing(ACCOUNTING_V2)
INCIDENT_ACCOUNTING_V3 = dated_pricing(INCIDENT_ACCOUNTING_V2)

CURRENT: tuple[str, ...] = (
    MINOR_UNITS_V1,
    CLAIM_ENERGY_V1,
    SITE_PERIODS_V2,
    ENERGY_RATES_V2,
    GPU_HOUR_PRICES_V2,
    ACCOUNTING_V3,
    INCIDENT_ACCOUNTING_V3,
)
