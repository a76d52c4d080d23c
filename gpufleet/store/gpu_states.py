"""What a GPU is doing — busy, idle or starved — defined once, in SQL.

The web view's fleet summary, the terminal of the demo and the Grafana fleet
board all count GPUs by this definition, so they never disagree: a GPU is
*starved* while a run holding it has a starvation incident open, else *busy*
at or above :data:`BUSY_UTIL_PCT` GPU-Util, else *idle*.  Only a GPU whose
newest sample is within ``fresh`` of the moment asked about is counted.

The SQL is written with its moment, freshness and node filter as parameters,
so the web view binds them as query parameters and a dashboard writes its
time macros (``$__timeTo()``) in their place.
"""

from __future__ import annotations

from datetime import timedelta

#: GPU-Util at or above which a GPU counts as busy.
BUSY_UTIL_PCT = 10.0
#: A GPU's newest sample must be this recent (before the moment asked about) to count as reporting.
FRESH = timedelta(minutes=2)


def starvation_open_at(at: str) -> str:
    """``(node, gpu)`` held by a run with a starvation incident open at ``at`` (a SQL expression)."""
    return (
        "SELECT DISTINCT a.node, a.gpu FROM incidents i JOIN run_allocations a ON a.run_id = i.run_id "
        f'WHERE i.kind = \'starvation\' AND i.start <= {at} AND (i."end" IS NULL OR i."end" > {at})'
    )


def gpu_state(util: str, starved: str) -> str:
    """The state of a GPU whose GPU-Util is ``util`` and whose starvation is ``starved`` (SQL expressions)."""
    return (
        f"CASE WHEN {starved} THEN 'starved' WHEN coalesce({util}, 0) >= {BUSY_UTIL_PCT} THEN 'busy' "
        "ELSE 'idle' END"
    )


def gpu_states_at(at: str, fresh: str, node_filter: str = "TRUE") -> str:
    """One row per reporting GPU at ``at``: node, gpu, state, util_pct, power_w (a SQL query).

    ``fresh`` is an interval expression; ``node_filter`` a condition on ``s.node``.
    """
    return f"""
WITH latest AS (
  SELECT DISTINCT ON (s.node, s.gpu) s.node, s.gpu, s.util_pct, s.power_w
  FROM gpu_samples s
  WHERE s.time BETWEEN {at} - {fresh} AND {at} AND s.mig_instance IS NULL AND {node_filter}
  ORDER BY s.node, s.gpu, s.time DESC
), starved AS ({starvation_open_at(at)})
SELECT l.node, l.gpu, {gpu_state("l.util_pct", "st.node IS NOT NULL")} AS state, l.util_pct, l.power_w
FROM latest l LEFT JOIN starved st ON st.node = l.node AND st.gpu = l.gpu"""
