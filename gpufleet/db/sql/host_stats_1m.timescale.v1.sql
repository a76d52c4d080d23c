CREATE MATERIALIZED VIEW host_stats_1m WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS SELECT time_bucket(INTERVAL '1 minute', time) AS bucket, node,
  count(*) AS samples,
  avg(cpu_user_pct) AS cpu_user_pct,
  avg(cpu_system_pct) AS cpu_system_pct,
  avg(cpu_iowait_pct) AS cpu_iowait_pct,
  avg(cpu_idle_pct) AS cpu_idle_pct,
  avg(disk_read_bytes_s) AS disk_read_bytes_s,
  avg(disk_write_bytes_s) AS disk_write_bytes_s,
  avg(disk_util_pct) AS disk_util_pct,
  max(disk_util_pct) AS disk_util_pct_max,
  avg(disk_await_ms) AS disk_await_ms,
  avg(net_rx_bytes_s) AS net_rx_bytes_s,
  avg(net_tx_bytes_s) AS net_tx_bytes_s,
  avg(host_power_w) AS host_power_w
FROM host_samples WHERE (TRUE)
GROUP BY 1, node WITH NO DATA