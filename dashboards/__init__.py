"""Grafana dashboards for gpufleet, over the PostgreSQL schema.

- ``*.json``: the dashboards Grafana loads (written by :mod:`gpufleet.dashboards.build`
  from the definitions in ``fleet_overview``, ``run_detail``, ``starvation``
  and ``energy_cost``).
- :mod:`gpufleet.dashboards.macros`: Grafana's expansion of variables and macros, so
  the queries can be run and checked without a Grafana (:mod:`gpufleet.dashboards.dryrun`).
- :mod:`gpufleet.dashboards.validate`: structural checks of the JSON.
- :mod:`gpufleet.dashboards.provision`: push the data source and dashboards to a
  Grafana through its HTTP API (``gpufleet dashboards push``).
"""
