"""What the fleet's GPUs did, per node and minute and per node and hour (``node_activity_1m``/``_1h``).

The fleet board's time series (GPU states, power by site, fleet activity,
GPU-Util by node) summed one row per GPU per sample or minute: on 10,000 GPUs
that is 14 million rows for a day, tens of seconds a panel
(``bench/read_side.py``).  A node's eight GPUs fold into one row here, and
an hour into one row of the hourly table, so a fleet-wide panel reads a
node's minute once.

Every column is a sum over the GPU-minutes of the node (a GPU-minute is one
GPU's samples of one minute), so an hour is the sum of its minutes and any
bucket of a panel is the sum of its rows:

* ``minutes``: minutes with samples (1 in the minute table); the node's
  average over a bucket is a sum divided by the sum of ``minutes``;
* ``gpu_minutes`` and ``busy_minutes``: GPU-minutes reporting, and those at
  or above :data:`~gpufleet.store.gpu_states.BUSY_UTIL_PCT` by the minute's
  average GPU-Util (the one definition of busy);
* ``util_*``, ``sm_*``, ``tensor_*``: sums and counts of the samples'
  values (NULLs not counted), for sample-weighted averages;
* ``power_w``: the sum of each GPU-minute's average board power, so a
  minute's row holds the node's GPU power and ``power_w / minutes`` is its
  average over any bucket.

The collector's rollup worker rebuilds a node's minutes from its raw samples
as they arrive and the hours above them, on both backends (on TimescaleDB
``gpu_stats_1m`` is refreshed by its own policy, later, so the worker never
reads it).
"""

from __future__ import annotations

from gpufleet.db import energy_sql as E
from gpufleet.db.rollup_ranges import rebuild_scope
from gpufleet.store.gpu_states import BUSY_UTIL_PCT

#: (column, SQL type); the key is (node, bucket).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("minutes", "integer"),
    ("gpu_minutes", "integer"),
    ("busy_minutes", "integer"),
    ("util_samples", "integer"),
    ("util_sum", "double precision"),
    ("sm_samples", "integer"),
    ("sm_sum", "double precision"),
    ("tensor_samples", "integer"),
    ("tensor_sum", "double precision"),
    ("power_w", "double precision"),
)

NAMES = ", ".join(c for c, _ in COLUMNS)


def _gpu_minutes(where: str) -> str:
    """Each GPU-minute of the samples ``where`` selects (alias ``gpu_samples``)."""
    return f"""SELECT {E.minute("time")} AS bucket, node, gpu, avg(util_pct) AS util,
  count(util_pct) AS util_n, sum(util_pct::float8) AS util_s, count(sm_active) AS sm_n, sum(sm_active::float8) AS sm_s,
  count(tensor_active) AS tensor_n, sum(tensor_active::float8) AS tensor_s, avg(power_w) AS power
FROM gpu_samples WHERE mig_instance IS NULL AND ({where})
GROUP BY 1, node, gpu"""


def minute_select(where: str) -> str:
    """``node_activity_1m`` rows (bucket, node, columns) of the samples ``where`` selects."""
    return f"""SELECT g.bucket, g.node, 1, count(*), count(*) FILTER (WHERE coalesce(g.util, 0) >= {BUSY_UTIL_PCT}),
  sum(g.util_n), coalesce(sum(g.util_s), 0), sum(g.sm_n), coalesce(sum(g.sm_s), 0),
  sum(g.tensor_n), coalesce(sum(g.tensor_s), 0), coalesce(sum(g.power), 0)
FROM ({_gpu_minutes(where)}) g
GROUP BY g.bucket, g.node"""


def rebuild_minutes_sql() -> tuple[str, str]:
    """(delete, insert) of the minutes of the claimed ranges, from raw samples."""
    delete, where = rebuild_scope("node_activity_1m", "minute", "gpu_samples.time")
    return delete, f"INSERT INTO node_activity_1m (bucket, node, {NAMES})\n{minute_select(where)}"


def hour_select(minutes_where: str) -> str:
    """``node_activity_1h`` rows summed from the ``node_activity_1m`` rows (alias m) ``minutes_where`` selects."""
    sums = ", ".join(f"sum(m.{c})" for c, _ in COLUMNS)
    return (
        f"SELECT {E.hour('m.bucket')}, m.node, {sums}\nFROM node_activity_1m m WHERE {minutes_where}\n"
        "GROUP BY 1, m.node"
    )


def rebuild_hours_sql() -> tuple[str, str]:
    """(delete, insert) of the hours of the claimed ranges, from the minutes just rebuilt."""
    delete, where = rebuild_scope("node_activity_1h", "hour", "m.bucket")
    return delete, f"INSERT INTO node_activity_1h (bucket, node, {NAMES})\n{hour_select(where)}"
