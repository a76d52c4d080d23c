"""The per-minute statistics dashboards read, defined once for both backends.

On TimescaleDB ``gpu_stats_1m`` / ``host_stats_1m`` are continuous aggregates
built from these select lists; on plain PostgreSQL they are tables with the
same columns, refreshed by the collector's rollup worker with the very same
select lists.  Versioned names keep migrations frozen: a change adds ``_V2``.
"""

from __future__ import annotations

#: (column, aggregate expression, SQL type of the plain-PostgreSQL table)
GPU_STATS_V1: tuple[tuple[str, str, str], ...] = (
    ("samples", "count(*)", "integer"),
    ("util_pct", "avg(util_pct)", "double precision"),
    ("sm_active", "avg(sm_active)", "double precision"),
    ("tensor_active", "avg(tensor_active)", "double precision"),
    ("dram_active", "avg(dram_active)", "double precision"),
    ("power_w", "avg(power_w)", "double precision"),
    ("power_w_max", "max(power_w)", "real"),
    ("power_limit_w", "min(power_limit_w)", "real"),
    ("sm_clock_mhz", "avg(sm_clock_mhz)", "double precision"),
    ("sm_clock_max_mhz", "max(sm_clock_max_mhz)", "integer"),
    ("temp_c_max", "max(temp_c)", "smallint"),
    ("mem_temp_c_max", "max(mem_temp_c)", "smallint"),
    ("mem_used_mib", "max(mem_used_mib)", "real"),
    ("throttle_reasons", "bit_or(throttle_reasons)", "bigint"),
    ("pcie_gen_min", "min(pcie_gen)", "smallint"),
    ("pcie_width_min", "min(pcie_width)", "smallint"),
    ("pcie_tx_bytes_s", "avg(pcie_tx_bytes_s)", "double precision"),
    ("pcie_rx_bytes_s", "avg(pcie_rx_bytes_s)", "double precision"),
    ("xid_max", "max(xid)", "integer"),
    # Approximate minute energy from the average power; exact energy (which
    # needs each GPU's previous sample) is in gpu_energy_1m.
    ("energy_j_approx", "avg(power_w) * 60.0", "double precision"),
)

HOST_STATS_V1: tuple[tuple[str, str, str], ...] = (
    ("samples", "count(*)", "integer"),
    ("cpu_user_pct", "avg(cpu_user_pct)", "double precision"),
    ("cpu_system_pct", "avg(cpu_system_pct)", "double precision"),
    ("cpu_iowait_pct", "avg(cpu_iowait_pct)", "double precision"),
    ("cpu_idle_pct", "avg(cpu_idle_pct)", "double precision"),
    ("disk_read_bytes_s", "avg(disk_read_bytes_s)", "double precision"),
    ("disk_write_bytes_s", "avg(disk_write_bytes_s)", "double precision"),
    ("disk_util_pct", "avg(disk_util_pct)", "double precision"),
    ("disk_util_pct_max", "max(disk_util_pct)", "real"),
    ("disk_await_ms", "avg(disk_await_ms)", "double precision"),
    ("net_rx_bytes_s", "avg(net_rx_bytes_s)", "double precision"),
    ("net_tx_bytes_s", "avg(net_tx_bytes_s)", "double precision"),
    ("host_power_w", "avg(host_power_w)", "double precision"),
)


def gpu_stats_select(bucket_expr: str, where: str = "TRUE") -> str:
    cols = ",\n  ".join(f"{expr} AS {name}" for name, expr, _ in GPU_STATS_V1)
    return (
        f"SELECT {bucket_expr} AS bucket, node, gpu,\n  {cols}\n"
        f"FROM gpu_samples WHERE mig_instance IS NULL AND ({where})\n"
        "GROUP BY 1, node, gpu"
    )


def host_stats_select(bucket_expr: str, where: str = "TRUE") -> str:
    cols = ",\n  ".join(f"{expr} AS {name}" for name, expr, _ in HOST_STATS_V1)
    return f"SELECT {bucket_expr} AS bucket, node,\n  {cols}\nFROM host_samples WHERE ({where})\nGROUP BY 1, node"


def gpu_stats_table_ddl() -> str:
    cols = ",\n  ".join(f"{name} {typ}" for name, _, typ in GPU_STATS_V1)
    return (
        "CREATE TABLE gpu_stats_1m (\n  bucket timestamptz NOT NULL, node text NOT NULL, gpu smallint NOT NULL,\n"
        f"  {cols},\n  PRIMARY KEY (node, gpu, bucket))"
    )


def host_stats_table_ddl() -> str:
    cols = ",\n  ".join(f"{name} {typ}" for name, _, typ in HOST_STATS_V1)
    return (
        "CREATE TABLE host_stats_1m (\n  bucket timestamptz NOT NULL, node text NOT NULL,\n"
        f"  {cols},\n  PRIMARY KEY (node, bucket))"
    )
