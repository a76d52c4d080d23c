"""``gpufleet_claim_energy``, second text: whether a group's energy is stale is read once per group.

The first text (:data:`gpufleet.db.accounting_sql.CLAIM_ENERGY_V1`, migration 0004) answered it with
a subquery per output row (group and segment) that scanned every claim: quadratic in the claims.  A
run's accounting has a few claims per group and never felt it; pricing incidents and the ledger has
one group per run and state over thousands of pieces, and there it took most of the time (4 of 5 s
for 3,000 pieces of 64 runs, ``bench/accounting.py``).  The text is otherwise the first's, so every
figure is unchanged; migration 0020 replaces the function with it.
"""

from __future__ import annotations

from gpufleet.db.accounting_sql import CLAIM_ENERGY_V1

_OLD_HEAD = "CREATE FUNCTION gpufleet_claim_energy("
_OLD_TAIL = """SELECT p.grp, p.seg_start, sum(p.gj), sum(p.gs), sum(p.hj),
       coalesce((SELECT bool_or(x.cut < x.hi) FROM cc x WHERE x.grp = p.grp), false) AND p_source = 'auto'
FROM parts p
GROUP BY p.grp, p.seg_start;"""
_NEW_TAIL = """SELECT p.grp, p.seg_start, sum(p.gj), sum(p.gs), sum(p.hj),
       coalesce(bool_or(s.stale), false) AND p_source = 'auto'
FROM parts p LEFT JOIN (SELECT x.grp, bool_or(x.cut < x.hi) AS stale FROM cc x GROUP BY x.grp) s ON s.grp = p.grp
GROUP BY p.grp, p.seg_start;"""


def _second(text: str) -> str:
    for old in (_OLD_HEAD, _OLD_TAIL):
        if text.count(old) != 1:
            raise AssertionError(f"gpufleet_claim_energy's first text changed: {old[:60]!r}")
    return text.replace(_OLD_HEAD, "CREATE OR REPLACE FUNCTION gpufleet_claim_energy(").replace(
        _OLD_TAIL, _NEW_TAIL
    )


CLAIM_ENERGY_V2 = _second(CLAIM_ENERGY_V1)
#: The first text, as ``CREATE OR REPLACE``: migration 0020's downgrade.
CLAIM_ENERGY_V1_REPLACE = CLAIM_ENERGY_V1.replace(
    _OLD_HEAD, "CREATE OR REPLACE FUNCTION gpufleet_claim_energy("
)
