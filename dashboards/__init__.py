"""Grafana dashboards for gpufleet, over the PostgreSQL schema.

- ``*.json``: the dashboards Grafana loads (written by :mod:`dashboards.build`
  from the definitions in ``fleet_overview``, ``run_detail``, ``starvation``
  and ``energy_cost``).
- :mod:`dashboards.macros`: Grafana's expansion of variables and macros, so
  the queries can be run and checked without a Grafana (:mod:`dashboards.dryrun`).
- :mod:`dashboards.validate`: structural checks of the JSON.
- :mod:`dashboards.provision`: push the data source and dashboards to a
  Grafana through its HTTP API (``gpufleet dashboards push``).
"""
