"""Figures a line cannot give, and why: the line's own error instead of a failed report.

A stored value outside the bounds of :mod:`gpufleet.accounting.bounds` (a price
of 1e300 per GPU-hour stored before the bounds existed) makes every line priced
with it meaningless, but only those lines: the run at that site says its money
cannot be computed and names the stored value, and every other run, the
fleet view, the CSVs and the finance page go on.  A total that would include
such a line has no money either, and says which lines it lacks.
"""

from __future__ import annotations

import psycopg

from gpufleet.accounting.bounds import CARBON_G_PER_KWH, GPU_HOUR_PRICE, PRICE_PER_KWH, line_problems
from gpufleet.accounting.lines import ZERO, Line

#: Fields each problem leaves unknown.
NULLED: dict[str, tuple[str, ...]] = {
    "energy_cost": ("energy_cost", "total_cost"),
    "compute_cost": ("compute_cost", "total_cost"),
    "co2e_kg": ("co2e_kg", "g_co2e_per_kwh"),
}

_STORED = f"""
SELECT setting, nullif(gpu_model, ''), CASE WHEN valid_from > '-infinity' THEN valid_from END, num
FROM site_settings WHERE site = %s AND num IS NOT NULL
  AND ((setting = 'price_per_kwh' AND num > {PRICE_PER_KWH.hi}) OR (setting = 'gpu_hour_price' AND num > {GPU_HOUR_PRICE.hi}))
ORDER BY setting, valid_from"""

_STORED_CARBON = f"""
SELECT ci.region, count(*), max(ci.g_co2e_per_kwh) FROM carbon_intensity ci
WHERE ci.g_co2e_per_kwh > {CARBON_G_PER_KWH.hi}
  AND ci.region IN (SELECT s.txt FROM site_settings s WHERE s.site = %s AND s.setting = 'carbon_region')
GROUP BY ci.region ORDER BY ci.region"""


def problems(parts: list[Line]) -> dict[str, str]:
    """field -> what is wrong, over the lines of one run (or one fleet line)."""
    out: dict[str, str] = {}
    for ln in parts:
        found = line_problems(
            ln.facility_kwh,
            ln.energy_cost,
            ln.gpu_hours or ZERO,
            ln.compute_cost,
            ln.co2e_kg,
            ln.facility_kwh - ln.co2e_unknown_kwh,
        )
        for k, v in found.items():
            out.setdefault(k, v)
    return out


def _stored(conn: psycopg.Connection, site: str | None) -> str:
    """The stored values of ``site`` outside the bounds, as a reader finds and fixes them."""
    if site is None:
        return ""
    names = []
    for setting, model, valid_from, num in conn.execute(_STORED, (site,)).fetchall():
        since = "from the beginning" if valid_from is None else f"from {valid_from.isoformat()}"
        names.append(f"{setting}{f' of {model}' if model else ''} = {num:g} {since}")
    for region, n, worst in conn.execute(_STORED_CARBON, (site,)).fetchall():
        names.append(f"{n} point(s) of carbon region {region!r} up to {worst:g} g/kWh")
    return "; stored: " + ", ".join(names) if names else ""


def messages(conn: psycopg.Connection, site: str | None, found: dict[str, str], what: str) -> list[str]:
    """One sentence per problem of ``what`` (e.g. "run 'r1'"), naming the site's stored values."""
    if not found:
        return []
    stored = _stored(conn, site)
    where = f" at site {site!r}" if site else ""
    out = []
    for field, why in sorted(found.items()):
        fields = " and ".join(NULLED[field])
        out.append(
            f"{what}: {fields} not computed: {why}{where}{stored}. Correct the value for the time it "
            f"was in force (PUT /v1/sites/{site or '<site>'} with ?from=, or gpufleet site set --from)."
        )
    return out
