"""Run detail: one run's GPUs and hosts, its incidents, and what it has cost so far.

Everything is scoped to the run's allocated GPUs (``run_allocations``) and
their nodes; the ``node`` variable narrows to some of them.
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.model import (
    Board,
    Panel,
    heatmap,
    query_variable,
    sql_annotation,
    stat,
    table,
    text,
    timeseries,
)
from gpufleet.dashboards.sql import (
    RANGE_FROM,
    RANGE_TO,
    accounting,
    all_or,
    per_gpu_series,
    per_node_series,
    weighted,
)

UID = "gpufleet-run"
RUN = "${run:sqlstring}"

RUN_VAR = query_variable(
    "run",
    "Run",
    f"""SELECT r.run_id AS __value, r.run_id || coalesce(' (' || r.name || ')', '') AS __text
FROM runs r
WHERE r.start < {RANGE_TO} AND coalesce(r."end", 'infinity') > {RANGE_FROM}
ORDER BY r.start DESC, r.run_id""",
    multi=False,
    description="Runs active at some point of the range, newest first.",
)
NODE_VAR = query_variable(
    "node",
    "Node",
    f"SELECT DISTINCT node FROM run_allocations WHERE run_id = {RUN} ORDER BY 1",
    refresh=2,
    description="Nodes of the run's allocation.",
)

#: ``@`` is the table alias; the GPU must be one of the run's and on a selected node.
GPU_WHERE = (
    f"(@.node, @.gpu) IN (SELECT node, gpu FROM run_allocations WHERE run_id = {RUN}) "
    f"AND {all_or('node', '@.node')}"
)
HOST_WHERE = (
    f"@.node IN (SELECT node FROM run_allocations WHERE run_id = {RUN}) AND {all_or('node', '@.node')}"
)

SUMMARY = f"""
SELECT r.run_id AS "Run", coalesce(r.name, '') AS "Name", coalesce(r.team, '') AS "Team",
       coalesce(r.site, '') AS "Site",
       CASE WHEN r."end" IS NOT NULL AND r."end" <= {RANGE_TO} THEN 'ended' ELSE 'running' END AS "State",
       (SELECT count(*) FROM run_allocations a WHERE a.run_id = r.run_id) AS "GPUs",
       extract(epoch FROM least(coalesce(r."end", 'infinity'), {RANGE_TO}) - r.start) AS "Duration"
FROM runs r WHERE r.run_id = {RUN}
"""

ACCOUNTING = f"""
SELECT a.gpu_hours AS "GPU-hours", a.it_kwh AS "IT energy", a.facility_kwh AS "Facility energy",
       a.total_cost AS "Total cost", coalesce(a.currency, '') AS "Currency",
       CASE WHEN a.carbon_source = 'none' THEN NULL ELSE a.co2e_kg END AS "CO2e"
FROM {accounting(runs=f"ARRAY[{RUN}]", since="NULL")} a WHERE a.line = 'run'
"""

ACCOUNTING_NOTE = (
    "Energy, cost and CO2e from the run's start to the end of the range (or now), exactly as "
    "`GET /v1/runs/<run>/accounting?to=` on the gpufleet API reports them: the same database function."
)

UTIL = per_gpu_series("avg(s.util_pct)", weighted("util_pct"), GPU_WHERE)
SM_ACTIVE = per_gpu_series("avg(s.sm_active) * 100", weighted("sm_active") + " * 100", GPU_WHERE)
TENSOR_ACTIVE = per_gpu_series("avg(s.tensor_active) * 100", weighted("tensor_active") + " * 100", GPU_WHERE)
POWER = per_gpu_series("avg(s.power_w)", weighted("power_w"), GPU_WHERE)
SM_CLOCK = per_gpu_series("avg(s.sm_clock_mhz)", weighted("sm_clock_mhz"), GPU_WHERE)
TEMP = per_gpu_series("max(s.temp_c)", "max(r.temp_c_max)", GPU_WHERE)
MEM_USED = per_gpu_series("max(s.mem_used_mib) * 1048576", "max(r.mem_used_mib) * 1048576", GPU_WHERE)

GPU_STATE = f"""
SELECT DISTINCT ON (s.node, s.gpu)
       s.node AS "Node", s.gpu AS "GPU", s.time AS "Last sample",
       s.pcie_gen AS "PCIe gen", s.pcie_gen_max AS "max gen", s.pcie_width AS "PCIe width",
       s.pcie_width_max AS "max width", s.power_limit_w AS "Power limit",
       s.sm_clock_mhz AS "SM clock", s.sm_clock_max_mhz AS "max SM clock",
       '0x' || to_hex(coalesce(s.throttle_reasons, 0)) AS "Throttle reasons",
       s.xid AS "Last XID", s.ecc_dbe_vol AS "ECC DBE"
FROM gpu_samples s
WHERE s.time BETWEEN {RANGE_TO} - interval '2 minutes' AND {RANGE_TO} AND s.mig_instance IS NULL
  AND {GPU_WHERE.replace("@", "s")}
ORDER BY s.node, s.gpu, s.time DESC
"""

#: NVLink traffic per GPU (transmit and receive averaged).  From raw samples on both backends:
#: the minute rollups carry no NVLink columns, so a long range reads more rows here.
NVLINK = f"""
SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu AS metric,
       avg((coalesce(s.nvlink_tx_bytes_s, s.nvlink_rx_bytes_s) + coalesce(s.nvlink_rx_bytes_s, s.nvlink_tx_bytes_s))
           / 2.0) AS value
FROM gpu_samples s
WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {GPU_WHERE.replace("@", "s")}
  AND (s.nvlink_tx_bytes_s IS NOT NULL OR s.nvlink_rx_bytes_s IS NOT NULL)
GROUP BY 1, 2
ORDER BY 1, 2
"""

#: Per GPU over the range: NVLink links, and how much each error counter rose (a counter that
#: restarted, after a driver reload, counts from its restart).
HEALTH = f"""
WITH s AS (
  SELECT s.node, s.gpu, s.time, s.nvlink_links_up, s.nvlink_links_max, s.remapped_rows_pending,
         s.remapped_rows_failed,
         s.nvlink_crc_errors + coalesce(s.nvlink_replay_errors, 0) AS nvl_err, s.ecc_sbe_vol, s.ecc_dbe_vol,
         s.pcie_replay_count
  FROM gpu_samples s
  WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {GPU_WHERE.replace("@", "s")}
), d AS (
  SELECT s.*, nvl_err - lag(nvl_err) OVER w AS d_nvl, ecc_sbe_vol - lag(ecc_sbe_vol) OVER w AS d_sbe,
         ecc_dbe_vol - lag(ecc_dbe_vol) OVER w AS d_dbe, pcie_replay_count - lag(pcie_replay_count) OVER w AS d_rep
  FROM s WINDOW w AS (PARTITION BY node, gpu ORDER BY time)
)
SELECT node AS "Node", gpu AS "GPU",
       min(nvlink_links_up) AS "NVLink links up (min)", max(nvlink_links_max) AS "NVLink links",
       coalesce(sum(d_nvl) FILTER (WHERE d_nvl > 0), 0) AS "NVLink CRC+replay errors",
       coalesce(sum(d_sbe) FILTER (WHERE d_sbe > 0), 0) AS "ECC single-bit",
       coalesce(sum(d_dbe) FILTER (WHERE d_dbe > 0), 0) AS "ECC double-bit",
       coalesce(max(remapped_rows_pending), 0) AS "Remap pending",
       coalesce(max(remapped_rows_failed), 0) AS "Remap failed",
       coalesce(sum(d_rep) FILTER (WHERE d_rep > 0), 0) AS "PCIe replays"
FROM d
GROUP BY 1, 2
ORDER BY 3 NULLS LAST, 5 DESC, 7 DESC, 1, 2
"""

CPU = per_node_series(
    {
        "user": ("avg(s.cpu_user_pct)", weighted("cpu_user_pct")),
        "system": ("avg(s.cpu_system_pct)", weighted("cpu_system_pct")),
        "iowait": ("avg(s.cpu_iowait_pct)", weighted("cpu_iowait_pct")),
    },
    HOST_WHERE,
)
DISK = per_node_series(
    {
        "read": ("avg(s.disk_read_bytes_s)", weighted("disk_read_bytes_s")),
        "write": ("avg(s.disk_write_bytes_s)", weighted("disk_write_bytes_s")),
    },
    HOST_WHERE,
)
DISK_UTIL = per_node_series(
    {
        "busiest disk %util": ("max(s.disk_util_pct)", "max(r.disk_util_pct_max)"),
    },
    HOST_WHERE,
)
NET = per_node_series(
    {
        "rx": ("avg(s.net_rx_bytes_s)", weighted("net_rx_bytes_s")),
        "tx": ("avg(s.net_tx_bytes_s)", weighted("net_tx_bytes_s")),
    },
    HOST_WHERE,
)

INCIDENTS = f"""
SELECT i.kind AS "Kind", i.cause AS "Cause", i.severity AS "Severity", i.state AS "State",
       i.node AS "Node", i.gpu AS "GPU", i.start AS "Start", i."end" AS "End",
       extract(epoch FROM coalesce(i."end", {RANGE_TO}) - i.start) AS "Duration",
       i.evidence::text AS "Evidence"
FROM incidents i
WHERE i.run_id = {RUN} AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
ORDER BY i.start
"""

INCIDENT_ANNOTATIONS = f"""
SELECT i.start AS "time", coalesce(i."end", i.last_seen) AS "timeend",
       i.kind || coalesce(' (' || i.cause || ')', '') || coalesce(' on ' || i.node || '/' || i.gpu, '') AS "text",
       i.kind || ',' || i.severity AS "tags"
FROM incidents i
WHERE i.run_id = {RUN} AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
ORDER BY 1
"""

TOKENS_PER_S = f"""
SELECT p.time AS "time",
       (p.tokens - lag(p.tokens) OVER w) / nullif(extract(epoch FROM p.time - lag(p.time) OVER w), 0) AS "tokens/s"
FROM run_progress p
WHERE p.run_id = {RUN} AND p.time BETWEEN {RANGE_FROM} - interval '10 minutes' AND {RANGE_TO}
WINDOW w AS (ORDER BY p.time)
ORDER BY 1
"""

TOKENS_PER_JOULE = f"""
WITH p AS (
  SELECT p.time, p.tokens - lag(p.tokens) OVER (ORDER BY p.time) AS d_tokens
  FROM run_progress p
  WHERE p.run_id = {RUN} AND p.time BETWEEN {RANGE_FROM} - interval '10 minutes' AND {RANGE_TO}
), tok AS (
  SELECT date_trunc('minute', p.time) AS minute, sum(greatest(p.d_tokens, 0)) AS tokens
  FROM p WHERE p.d_tokens IS NOT NULL GROUP BY 1
), en AS (
  SELECT e.bucket AS minute, sum(e.energy_j) AS joules
  FROM gpu_energy_1m e JOIN run_allocations a ON a.node = e.node AND a.gpu = e.gpu
  WHERE a.run_id = {RUN} AND $__timeFilter(e.bucket)
  GROUP BY 1
)
SELECT $__timeGroupAlias(en.minute, $__interval),
       sum(coalesce(tok.tokens, 0)) / nullif(sum(en.joules), 0) AS "tokens per joule (GPU)"
FROM en LEFT JOIN tok ON tok.minute = en.minute
GROUP BY 1
ORDER BY 1
"""


def _gpu_ts(title: str, sql: str, description: str, unit: str) -> Panel:
    return timeseries(title, sql, description, unit, max_points=500, fill=0)


def build() -> dict[str, Any]:
    b = Board(
        UID,
        "gpufleet / Run detail",
        "One run: per-GPU activity, power, clocks and temperature; host CPU, disk and network; incidents; "
        "energy, cost and CO2e so far.",
        time_from="now-3h",
        refresh="30s",
    )
    b.variables += [RUN_VAR, NODE_VAR]
    b.annotations.append(sql_annotation("Run incidents", INCIDENT_ANNOTATIONS, "orange"))
    b.row("Run")
    b.add(
        stat(
            "Run",
            SUMMARY,
            "The run's registration; duration up to the end of the range.",
            w=12,
            color_mode="none",
        ),
        stat("So far", ACCOUNTING, ACCOUNTING_NOTE, w=12, decimals=2, color_mode="none"),
    )
    b.panels[-1]["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        for name, unit in (
            ("IT energy", "kwatth"),
            ("Facility energy", "kwatth"),
            ("CO2e", "masskg"),
            ("GPU-hours", "none"),
            ("Total cost", "none"),
        )
    ]
    b.add(text("Accounting", ACCOUNTING_NOTE, h=2))
    b.row("GPUs")
    b.add(
        _gpu_ts("GPU-Util per GPU", UTIL, "NVML GPU-Util: share of time a kernel was running.", "percent"),
        _gpu_ts(
            "SM active per GPU", SM_ACTIVE, "DCGM SM activity (share of SMs busy, time-averaged).", "percent"
        ),
        _gpu_ts("Tensor pipe active per GPU", TENSOR_ACTIVE, "DCGM tensor pipe activity.", "percent"),
        _gpu_ts("Power per GPU", POWER, "Board power draw.", "watt"),
        _gpu_ts(
            "SM clock per GPU", SM_CLOCK, "SM clock; drops under power caps and thermal throttling.", "rothz"
        ),
        _gpu_ts("Framebuffer used per GPU", MEM_USED, "Largest framebuffer use in the interval.", "bytes"),
        heatmap(
            "GPU temperature",
            TEMP,
            "Hottest reading of each GPU in the interval, one row per GPU.",
            "celsius",
            w=24,
        ),
    )
    b.add(
        table(
            "GPU links and health now",
            GPU_STATE,
            "Latest sample of each GPU (last 2 minutes of the range): PCIe link against its maximum, "
            "power limit, clocks, throttle-reason bitmask, last XID.",
            h=8,
            units={"Last sample": "dateTimeAsIso", "Power limit": "watt", "SM clock": "rothz"},
        )
    )
    b.add(
        _gpu_ts(
            "NVLink traffic per GPU",
            NVLINK,
            "NVLink bytes/s per GPU, transmit and receive averaged. Healthy data-parallel training shows "
            "tens of GB/s on every GPU of a node; one GPU near zero while its PCIe traffic rises, or every "
            "GPU near zero with NVLink present, is the nvlink_degraded detector's pcie_fallback.",
            "Bps",
        ),
        table(
            "NVLink and memory health",
            HEALTH,
            "Per GPU over the range: NVLink links up against the links it has, and what the error "
            "counters added (NVLink CRC and replay errors, ECC single- and double-bit errors, PCIe "
            "replays); remap pending or failed flags. GPUs with links down or errors first.",
            w=12,
            h=8,
        ),
    )
    b.row("Hosts")
    b.add(
        timeseries("CPU", CPU, "All-CPU user, system and iowait per node (mpstat 'all').", "percent", fill=0),
        timeseries("Disk throughput", DISK, "Read and write rates summed over block devices.", "Bps", fill=0),
        timeseries(
            "Busiest disk utilisation", DISK_UTIL, "iostat -x %util of the busiest device.", "percent", fill=0
        ),
        timeseries("Network", NET, "Receive and transmit over physical interfaces.", "Bps", fill=0),
    )
    b.row("Incidents and progress")
    b.add(
        table(
            "Incidents",
            INCIDENTS,
            "The run's incidents overlapping the range, with the detector's evidence.",
            h=8,
            units={"Duration": "s", "Start": "dateTimeAsIso", "End": "dateTimeAsIso"},
        ),
        timeseries("Tokens per second", TOKENS_PER_S, "From the run's progress reports.", "short", fill=0),
        timeseries(
            "Tokens per joule",
            TOKENS_PER_JOULE,
            "Tokens processed per joule of GPU energy, per minute of progress.",
            "short",
            fill=0,
        ),
    )
    return b.to_json()
