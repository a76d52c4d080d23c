"""The buckets a rollup pass rebuilds, and the source rows that rebuild them, written once.

The rollup worker claims (node, lo, hi) ranges and rebuilds every bucket
they touch: the plain-PostgreSQL stats from raw samples, node activity from
raw samples and its hours from its minutes.  Each needs the same two
statements' pieces, bound to the ranges as arrays (``nodes``, ``lo``, ``hi``).
"""

from __future__ import annotations

from gpufleet.db import energy_sql as E

#: The ranges a rebuild covers: node, lo, hi (bound as arrays).
RANGES = "unnest(%(nodes)s::text[], %(lo)s::timestamptz[], %(hi)s::timestamptz[]) AS r(node, lo, hi)"


def rebuild_scope(target: str, unit: str, source_time: str) -> tuple[str, str]:
    """The delete of ``target``'s buckets (of one ``unit``, minute or hour) that ``RANGES`` touch, and the
    condition on the source rows (``alias.node``, ``source_time``) that rebuild them.

    The nodes and the whole span of the ranges are named beside the EXISTS, which alone no index can
    answer, so the source rows are found by index, not by a scan of the table
    (``tests/db/test_rollup_stats_by_index.py``)."""
    to_bin = E.minute if unit == "minute" else E.hour
    step = f"INTERVAL '1 {unit}'"
    lo, hi = to_bin("r.lo"), f"{to_bin('r.hi')} + {step}"
    alias = source_time.split(".")[0]
    delete = f"DELETE FROM {target} t USING {RANGES} WHERE t.node = r.node AND t.bucket >= {lo} AND t.bucket < {hi}"
    where = (
        f"{alias}.node = ANY(%(nodes)s::text[]) "
        f"AND {source_time} >= {to_bin('(SELECT min(x) FROM unnest(%(lo)s::timestamptz[]) x)')} "
        f"AND {source_time} < {to_bin('(SELECT max(x) FROM unnest(%(hi)s::timestamptz[]) x)')} + {step} "
        f"AND EXISTS (SELECT 1 FROM {RANGES} WHERE {alias}.node = r.node "
        f"AND {source_time} >= {lo} AND {source_time} < {hi})"
    )
    return delete, where
