"""Accounting V4 and claim energy's third text: the same figures, joined as sets instead of row by row.

Profiling the ledger's pricing (``bench/accounting.py``, 128 runs: 8,704 pieces in one call of
``gpufleet_incident_accounting``) showed three joins written correctly but planned as loops, because
the planner estimates one row for every CTE built from the caller's arrays:

* in ``gpufleet_claim_energy`` the claims are matched to their windows (``cw``) and to their
  windows' pieces (``cp``, ``rp``) by nested loops over every pair: 17,408 claims x 124 pieces, a
  third of the function's time.  The function's only reads of tables are lateral index lookups, which
  stay loops whatever the planner is told, so the function is planned without nested loops where it
  has a choice (``SET enable_nestloop = off``) and those joins become hash joins;
* ``priced`` joined each measured segment to its site's rates on the site alone and tested the rate's
  index in a filter: 526,848 rows for 10,752 segments.  The index is computed first and joined on;
* every run line counted its GPUs and summed their shares by scanning all allocations (a subquery
  per line): quadratic in the lines.  They are counted once per run and joined;
* the GPU-hour prices were read per allocation and window (``gpufleet_gpu_hour_prices`` once per piece:
  8,704 calls), though they depend on the site and model alone: they are read once per site and model
  over the whole span and each piece takes the periods it overlaps.  Periods start where a price,
  currency or step changes, none inside a piece's own periods, so the pieces and prices are the same.

Nothing else changes, so every figure is V3's; migration 0022 installs these texts.
"""

from __future__ import annotations

from gpufleet.db.accounting_sql import ACCOUNTING_V3, INCIDENT_ACCOUNTING_V3
from gpufleet.db.claim_energy_sql import CLAIM_ENERGY_V2

_SWAPS: tuple[tuple[str, str], ...] = (
    (
        "  FROM measured m JOIN bounds b ON b.sk = m.sk JOIN rates r ON r.sk = m.sk AND r.ix = width_bucket(m.seg_start, b.b)",
        "  FROM (SELECT m0.*, width_bucket(m0.seg_start, b.b) AS ix FROM measured m0 JOIN bounds b ON b.sk = m0.sk) m\n"
        "  JOIN rates r ON r.sk = m.sk AND r.ix = m.ix",
    ),
    (
        "         (SELECT count(*) FROM alloc a WHERE a.run_id = w.run_id)::integer AS gpu_count,\n"
        "         (SELECT coalesce(sum(a.share), 0) FROM alloc a WHERE a.run_id = w.run_id) AS gpu_equivalents,",
        "         coalesce(ac.n, 0)::integer AS gpu_count, coalesce(ac.shares, 0) AS gpu_equivalents,",
    ),
    (
        "  CROSS JOIN LATERAL gpufleet_gpu_hour_prices(m.site, m.model, m.lo, m.hi, p_step) gp\n",
        "  JOIN (SELECT k.site IS NULL AS sn, coalesce(k.site, '') AS ks, k.model IS NULL AS mn,\n"
        "               coalesce(k.model, '') AS km, x.*\n"
        "        FROM (SELECT DISTINCT gk.site, gk.model FROM gpu_keys gk WHERE gk.lo < gk.hi) k\n"
        "        CROSS JOIN span CROSS JOIN LATERAL gpufleet_gpu_hour_prices(k.site, k.model, span.lo, span.hi, p_step) x\n"
        "       ) gp ON gp.sn = (m.site IS NULL) AND gp.ks = coalesce(m.site, '') AND gp.mn = (m.model IS NULL)\n"
        "           AND gp.km = coalesce(m.model, '') AND gp.t1 > m.lo AND gp.t0 < m.hi\n",
    ),
    (
        "  FROM run_w w\n  LEFT JOIN run_parts rp ON rp.run_id = w.run_id",
        "  FROM run_w w\n"
        "  LEFT JOIN (SELECT a.run_id, count(*) AS n, sum(a.share) AS shares FROM alloc a GROUP BY a.run_id) ac\n"
        "    ON ac.run_id = w.run_id\n"
        "  LEFT JOIN run_parts rp ON rp.run_id = w.run_id",
    ),
)


def set_based(text: str) -> str:
    """``text`` (an accounting query, or a function of one) with its joins written as sets."""
    for old, new in _SWAPS:
        if text.count(old) < 1:
            raise AssertionError(f"the accounting query changed: {old[:60]!r}")
        text = text.replace(old, new)
    return text


def _replacing(text: str) -> str:
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


ACCOUNTING_V4 = _replacing(set_based(ACCOUNTING_V3))
INCIDENT_ACCOUNTING_V4 = _replacing(set_based(INCIDENT_ACCOUNTING_V3))

_NESTLOOP_FROM = "LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_generic_plan AS $fn$"
if CLAIM_ENERGY_V2.count(_NESTLOOP_FROM) != 1:
    raise AssertionError("gpufleet_claim_energy's second text changed")
CLAIM_ENERGY_V3 = CLAIM_ENERGY_V2.replace(
    _NESTLOOP_FROM, _NESTLOOP_FROM.replace(" AS $fn$", " SET enable_nestloop = off AS $fn$")
)

#: What migration 0022 runs, and its undoing (V3's texts, with claim energy's second).
INSTALL: tuple[str, ...] = (CLAIM_ENERGY_V3, ACCOUNTING_V4, INCIDENT_ACCOUNTING_V4)
UNDO: tuple[str, ...] = (
    CLAIM_ENERGY_V2,
    _replacing(ACCOUNTING_V3),
    _replacing(INCIDENT_ACCOUNTING_V3),
)
