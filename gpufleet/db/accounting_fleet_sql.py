"""Accounting V5: the fleet lines' GPU-seconds take their currency by the rate index, as energy does.

A fleet-wide accounting over a month (``/v1/accounting``, the finance and FOCUS reports, the waste
view) splits every GPU's unallocated and total time at every edge of its site's rates: an hourly
carbon series makes 720 pieces per GPU and month.  V4 found each piece's currency with a subquery
that scanned the query's ``rates`` for the last period starting by the piece's start, once per piece
and twice over (the unallocated and the total lines): on 64 GPUs with two days of history, half the
time of a 30-day call (``bench/read_side.py --quick``).  The energy of the same pieces already finds
its rate by ``width_bucket`` over the site's sorted period starts (``bounds``) and joins on the index;
the GPU-seconds now do the same.  A piece before its site's first period has no currency, as before
(the outer joins keep it).

Nothing else changes: the same lines, the same money; GPU-seconds are summed in another order, so a
double-precision sum may differ in its last bits (the rounded ``gpu_hours`` does not).  Migration 0024
installs this text.
"""

from __future__ import annotations

from gpufleet.db.accounting_joins_sql import ACCOUNTING_V4

_SWAPS: tuple[tuple[str, str], ...] = (
    (
        "(SELECT r.currency FROM rates r WHERE r.sk = t.sk AND r.t0 <= t.a ORDER BY r.t0 DESC LIMIT 1) AS cur,",
        "r.currency AS cur,",
    ),
    (
        "(SELECT r.currency FROM rates r WHERE r.sk = cl.sk AND r.t0 <= t.a ORDER BY r.t0 DESC LIMIT 1),",
        "r.currency,",
    ),
    (
        "  FROM fleet_time t WHERE t.line = 'unallocated' GROUP BY 1, 2, 3, 4",
        "  FROM fleet_time t LEFT JOIN bounds b ON b.sk = t.sk\n"
        "  LEFT JOIN rates r ON r.sk = t.sk AND r.ix = width_bucket(t.a, b.b)\n"
        "  WHERE t.line = 'unallocated' GROUP BY 1, 2, 3, 4",
    ),
    (
        "  FROM fleet_time t JOIN claimants cl ON cl.k = t.k WHERE t.line = 'total' GROUP BY 2, 3, 4",
        "  FROM fleet_time t JOIN claimants cl ON cl.k = t.k LEFT JOIN bounds b ON b.sk = cl.sk\n"
        "  LEFT JOIN rates r ON r.sk = cl.sk AND r.ix = width_bucket(t.a, b.b)\n"
        "  WHERE t.line = 'total' GROUP BY 2, 3, 4",
    ),
)


def swapped(text: str, swaps: tuple[tuple[str, str], ...]) -> str:
    """``text`` with each ``(old, new)`` of ``swaps`` replaced, each ``old`` found exactly once (a later
    text is an earlier one with named changes: an earlier text that moved fails loudly, not silently)."""
    for old, new in swaps:
        if text.count(old) != 1:
            raise AssertionError(f"the accounting query changed: {old[:60]!r}")
        text = text.replace(old, new)
    return text


ACCOUNTING_V5 = swapped(ACCOUNTING_V4, _SWAPS)
