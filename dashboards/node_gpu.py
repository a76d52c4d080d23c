"""Node and GPUs: one node's GPUs as dcgm-exporter's board shows them, from gpufleet's own database.

No run needed: utilisation, power against the enforced limit, temperatures,
SM clocks against their maximum, framebuffer in percent, clocks-event
(throttle) reasons, XIDs with what they mean, PCIe and NVLink traffic and
link health, and the memory's error counters, for the node picked and the
GPUs picked on it.  Like the other boards it reads raw samples below a
one-minute query interval and the minute rollups (``gpu_stats_1m``) above it,
where the rollups carry the figure; NVLink, memory clocks and the error
counters are not rolled up and are read from the node's raw samples at any
interval (one node: the ``(node, gpu, time)`` index bounds the read).
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.model import Board, query_variable, stat, table, timeseries
from gpufleet.dashboards.sql import RANGE_FROM, RANGE_TO, all_or, per_gpu_series, raw_or_rollup, weighted
from gpufleet.xid import XIDS

UID = "gpufleet-node"
NODE = "${node:sqlstring}"

NODE_VAR = query_variable(
    "node",
    "Node",
    f"""SELECT n.node FROM nodes n
WHERE EXISTS (SELECT 1 FROM gpu_samples s WHERE s.node = n.node AND s.time >= {RANGE_FROM} - interval '1 day'
              AND s.time <= {RANGE_TO})
ORDER BY 1""",
    multi=False,
    refresh=2,
    description="Nodes with GPU samples in the range (or the day before it).",
)
GPU_VAR = query_variable(
    "gpu",
    "GPU",
    f"""SELECT DISTINCT s.gpu::text AS __value, 'GPU ' || s.gpu AS __text FROM gpu_samples s
WHERE s.node = {NODE} AND s.time >= {RANGE_FROM} - interval '1 day' AND s.time <= {RANGE_TO}
  AND s.mig_instance IS NULL
ORDER BY 1""",
    description="GPUs of the node (whole GPUs; MIG instances are counted on their GPU).",
)

#: ``@`` is the table alias: the node picked, the GPUs picked on it.
WHERE = f"@.node = {NODE} AND {all_or('gpu', '@.gpu::text')}"

#: The clocks-event reasons worth a line (NVML bits; docs/contracts.md section 1).
REASONS = (
    ("power cap", 0x4),
    ("HW slowdown", 0x8),
    ("SW thermal", 0x20),
    ("HW thermal", 0x40),
    ("power brake", 0x80),
)

#: XID codes and their names, as gpufleet.xid explains them.
XID_NAMES = (
    "(VALUES "
    + ", ".join(
        f"({x.code}, '{x.name.replace(chr(39), chr(39) * 2)}')"
        for x in sorted(XIDS.values(), key=lambda x: x.code)
    )
    + ") AS xn(code, name)"
)

NOW = f"""
SELECT count(DISTINCT s.gpu) AS "GPUs reporting",
       avg(s.util_pct) AS "Utilisation",
       sum(s.power_w) AS "Power",
       max(s.temp_c) AS "Hottest GPU",
       count(DISTINCT s.gpu) FILTER (WHERE s.throttle_reasons & {sum(b for _, b in REASONS)} <> 0) AS "Throttled"
FROM gpu_samples s
JOIN (SELECT gpu, max(time) AS t FROM gpu_samples
      WHERE node = {NODE} AND time > {RANGE_TO} - interval '2 minutes' AND time <= {RANGE_TO} AND mig_instance IS NULL
      GROUP BY gpu) last ON last.gpu = s.gpu AND last.t = s.time
WHERE {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
"""

XIDS_IN_RANGE = f"""
SELECT count(*) FILTER (WHERE s.xid > 0) AS "XIDs in range"
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
"""

UTIL = per_gpu_series("avg(s.util_pct)", weighted("util_pct"), WHERE)
POWER = per_gpu_series("avg(s.power_w)", weighted("power_w"), WHERE)
POWER_LIMIT = f"""
SELECT $__timeGroupAlias(s.time, $__interval), 'limit' AS metric, max(s.power_limit_w) AS value
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1, 2 ORDER BY 1
"""
TEMP = per_gpu_series("max(s.temp_c)", "max(r.temp_c_max)", WHERE)
MEM_TEMP = per_gpu_series("max(s.mem_temp_c)", "max(r.mem_temp_c_max)", WHERE)
SM_CLOCK = per_gpu_series("avg(s.sm_clock_mhz)", weighted("sm_clock_mhz"), WHERE)

#: Framebuffer used in percent of the total; the rollups keep the minute's most used, the total comes from
#: the GPU's raw samples (it does not change while a GPU runs).
MEM_PCT = (
    raw_or_rollup(
        f"""SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu AS metric,
       100.0 * max(s.mem_used_mib) / nullif(max(s.mem_total_mib), 0) AS value
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1, 2""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || '/' || r.gpu AS metric,
       100.0 * max(r.mem_used_mib) / nullif(max(t.total), 0) AS value
FROM gpu_stats_1m r
JOIN (SELECT gpu, max(mem_total_mib) AS total FROM gpu_samples
      WHERE node = {NODE} AND time >= {RANGE_FROM} AND time <= {RANGE_TO} AND mig_instance IS NULL
      GROUP BY gpu) t ON t.gpu = r.gpu
WHERE $__timeFilter(r.bucket) AND {WHERE.replace("@", "r")}
GROUP BY 1, 2""",
    )
    + "\nORDER BY 1, 2"
)


def _reasons(col: str, alias: str) -> str:
    return ",\n       ".join(
        f'count(DISTINCT {alias}.gpu) FILTER (WHERE {alias}.{col} & {bit} <> 0) AS "{name}"'
        for name, bit in REASONS
    )


#: How many of the node's GPUs had each reason active in each interval (wide format: one column a reason).
THROTTLE = (
    raw_or_rollup(
        f"""SELECT $__timeGroupAlias(s.time, $__interval),
       {_reasons("throttle_reasons", "s")}
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval),
       {_reasons("throttle_reasons", "r")}
FROM gpu_stats_1m r WHERE $__timeFilter(r.bucket) AND {WHERE.replace("@", "r")}
GROUP BY 1""",
    )
    + "\nORDER BY 1"
)

#: Every GPU picked, with the XIDs of the range (0 when none) and the last one, named.
XID_TABLE = f"""
SELECT g.gpu AS "GPU", g.uuid AS "UUID", g.xids AS "XIDs",
       CASE WHEN g.last_xid IS NULL THEN '' ELSE g.last_xid || ' ' || coalesce(xn.name, '(not in the table)') END
         AS "Last XID",
       g.last_at AS "Last XID at"
FROM (
  SELECT s.gpu, max(s.uuid) AS uuid, count(*) FILTER (WHERE s.xid > 0) AS xids,
         (array_agg(s.xid ORDER BY s.time DESC) FILTER (WHERE s.xid > 0))[1] AS last_xid,
         max(s.time) FILTER (WHERE s.xid > 0) AS last_at
  FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
  GROUP BY s.gpu
) g LEFT JOIN {XID_NAMES} ON xn.code = g.last_xid
ORDER BY g.gpu
"""


def _raw_pair(tx: str, rx: str) -> str:
    """TX and RX of each GPU as two series, from raw samples at any interval."""
    return f"""SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu || ' tx' AS metric, avg(s.{tx}) AS value
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1, 2
UNION ALL
SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu || ' rx' AS metric, avg(s.{rx}) AS value
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1, 2
ORDER BY 1, 2"""


PCIE = (
    raw_or_rollup(
        f"""SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu || ' tx' AS metric,
       avg(s.pcie_tx_bytes_s) AS value
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1, 2
UNION ALL
SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu || ' rx' AS metric,
       avg(s.pcie_rx_bytes_s) AS value
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY 1, 2""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || '/' || r.gpu || ' tx' AS metric,
       {weighted("pcie_tx_bytes_s")} AS value
FROM gpu_stats_1m r WHERE $__timeFilter(r.bucket) AND {WHERE.replace("@", "r")}
GROUP BY 1, 2
UNION ALL
SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || '/' || r.gpu || ' rx' AS metric,
       {weighted("pcie_rx_bytes_s")} AS value
FROM gpu_stats_1m r WHERE $__timeFilter(r.bucket) AND {WHERE.replace("@", "r")}
GROUP BY 1, 2""",
    )
    + "\nORDER BY 1, 2"
)

NVLINK = _raw_pair("nvlink_tx_bytes_s", "nvlink_rx_bytes_s")

#: Per GPU: its links now against their maximum, and how the error counters grew over the range.
LINKS = f"""
SELECT s.gpu AS "GPU",
       (array_agg(s.pcie_gen ORDER BY s.time DESC) FILTER (WHERE s.pcie_gen IS NOT NULL))[1] || '/' ||
       coalesce((array_agg(s.pcie_gen_max ORDER BY s.time DESC) FILTER (WHERE s.pcie_gen_max IS NOT NULL))[1]::text, '?')
         AS "PCIe gen (now/max)",
       (array_agg(s.pcie_width ORDER BY s.time DESC) FILTER (WHERE s.pcie_width IS NOT NULL))[1] || '/' ||
       coalesce((array_agg(s.pcie_width_max ORDER BY s.time DESC) FILTER (WHERE s.pcie_width_max IS NOT NULL))[1]::text,
                '?') AS "PCIe width (now/max)",
       max(s.pcie_replay_count) - min(s.pcie_replay_count) AS "PCIe replays",
       (array_agg(s.nvlink_links_up ORDER BY s.time DESC) FILTER (WHERE s.nvlink_links_up IS NOT NULL))[1] || '/' ||
       coalesce((array_agg(s.nvlink_links_max ORDER BY s.time DESC)
                 FILTER (WHERE s.nvlink_links_max IS NOT NULL))[1]::text, '?') AS "NVLink links up",
       max(s.nvlink_crc_errors) - min(s.nvlink_crc_errors) AS "NVLink CRC errors",
       max(s.nvlink_replay_errors) - min(s.nvlink_replay_errors) AS "NVLink replays",
       max(s.nvlink_recovery_errors) - min(s.nvlink_recovery_errors) AS "NVLink recoveries"
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY s.gpu ORDER BY s.gpu
"""

#: Per GPU: what it is and the state of its memory.
HEALTH = f"""
SELECT s.gpu AS "GPU", max(s.uuid) AS "UUID",
       max(s.mem_total_mib) AS "Memory",
       max(s.ecc_dbe_vol) - min(s.ecc_dbe_vol) AS "Uncorrected ECC (range)",
       max(s.ecc_sbe_vol) - min(s.ecc_sbe_vol) AS "Corrected ECC (range)",
       max(s.remapped_rows_uncorrectable) AS "Rows remapped (uncorrectable)",
       max(s.remapped_rows_pending) AS "Remap pending",
       max(s.remapped_rows_failed) AS "Remap failed",
       max(s.sm_clock_max_mhz) AS "Max SM clock",
       max(s.power_limit_w) AS "Power limit"
FROM gpu_samples s WHERE $__timeFilter(s.time) AND {WHERE.replace("@", "s")} AND s.mig_instance IS NULL
GROUP BY s.gpu ORDER BY s.gpu
"""


def build() -> dict[str, Any]:
    b = Board(
        UID,
        "gpufleet: node and GPUs",
        "One node's GPUs, no run needed: utilisation, power, temperature, clocks, memory, throttle reasons, "
        "XIDs, PCIe and NVLink (the figures dcgm-exporter's board shows, from gpufleet's database).",
        time_from="now-3h",
        refresh="1m",
    )
    b.variables += [NODE_VAR, GPU_VAR]
    b.add(
        stat(
            "Now",
            NOW,
            "At the end of the range: GPUs reporting in its last two minutes, their mean utilisation, "
            "summed power, the hottest GPU and how many have a throttle reason active.",
            w=18,
        ),
        stat(
            "XIDs in range",
            XIDS_IN_RANGE,
            "Samples that reported an XID, over the range (see the table).",
            w=6,
            thresholds=[(None, "green"), (1, "red")],
        ),
    )
    b.row("Activity and power")
    b.add(
        timeseries("GPU utilisation", UTIL, "GPU-Util per GPU (share of time a kernel ran), %.", "percent"),
        timeseries("Power", POWER, "Board power per GPU, W (see the enforced limit beside it).", "watt"),
        timeseries(
            "Enforced power limit",
            POWER_LIMIT,
            "The highest enforced limit among the GPUs picked, W.",
            "watt",
            w=8,
            h=6,
        ),
        timeseries(
            "SM clock",
            SM_CLOCK,
            "SM clock per GPU, MHz: below the maximum under power or thermal limits.",
            "rotmhz",
            w=8,
            h=6,
        ),
        timeseries(
            "Framebuffer used", MEM_PCT, "Framebuffer in use per GPU, % of its total.", "percent", w=8, h=6
        ),
    )
    b.row("Temperature and throttling")
    b.add(
        timeseries("GPU temperature", TEMP, "Hottest reading per GPU in each interval, °C.", "celsius", w=8),
        timeseries("Memory temperature", MEM_TEMP, "HBM temperature per GPU, °C.", "celsius", w=8),
        timeseries(
            "Clocks-event reasons",
            THROTTLE,
            "GPUs with each throttle reason active in the interval (power cap, slowdowns, thermal limits, "
            "power brake): the cause of clocks below the maximum.",
            "none",
            w=8,
        ),
    )
    b.row("Errors")
    b.add(
        table(
            "XIDs",
            XID_TABLE,
            "XIDs each GPU reported in the range (0 when none) and the last one, with what it means.",
            h=7,
        )
    )
    b.row("PCIe and NVLink")
    b.add(
        timeseries("PCIe traffic", PCIE, "PCIe bytes/s per GPU and direction.", "Bps"),
        timeseries("NVLink traffic", NVLINK, "NVLink bytes/s per GPU and direction (all links).", "Bps"),
        table(
            "Links",
            LINKS,
            "PCIe link now against its maximum and the replays in the range; NVLink links up and "
            "their error counters' growth in the range.",
            h=7,
        ),
    )
    b.row("GPUs")
    b.add(
        table(
            "Health",
            HEALTH,
            "Per GPU: memory, ECC errors in the range, remapped rows and limits.",
            h=7,
            units={"Memory": "mbytes", "Max SM clock": "rotmhz", "Power limit": "watt"},
        )
    )
    return b.to_json()
