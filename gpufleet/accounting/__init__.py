"""Per-run and fleet energy, cost and CO2e accounting (contracts.md section 3).

The figures are computed by the database itself: migration 0004 installs
``gpufleet_accounting`` and the functions under it
(:mod:`gpufleet.db.accounting_sql` documents the definition), which the
Grafana energy board reads too; this package calls it
(:mod:`~gpufleet.accounting.lines`), adds facts and efficiency, and writes
bodies, blocks and the finance report.

Entry points:

- :func:`run_accounting` — one run, exactly the body of
  ``GET /v1/runs/{run_id}/accounting`` (``gpufleet replay`` writes a list of these),
  with its ledger (:mod:`~gpufleet.accounting.ledger`: where every GPU-hour went);
- :func:`account_runs` / :func:`load_runs` — many runs at once;
- :func:`fleet_accounting` — ``GET /v1/accounting``: runs grouped by site,
  team or run, the GPU time no run held (with and without telemetry), and
  the fleet total;
- :func:`finance_report` / :func:`finance_csv` — the finance report (rows per run, site or team and
  currency, the GPU time no run held, totals); :func:`runs_report` / :func:`report_csv` — runs.csv.

Where the contract is silent, this package decides (each module says why):

- window: [start, end), up to ``now`` while the run is running (no end, or
  an end in the future); ``end`` stays the run's own (null while running) and
  ``window_start``/``window_end`` say what was accounted.  Periods (the
  report, the fleet view, ``from``/``to``) clip it, so consecutive periods
  add up to the whole run; a run counts in a period when its window
  overlaps it;
- site settings are step series (``site_settings``): PUE, energy price,
  GPU-hour price (per GPU model where given) and carbon region each hold from
  their ``valid_from`` until the next change; a segment is priced with the
  values in force at its start, and ``rates`` lists them per period;
- a run is priced at its own site; a run without one has PUE 1, prices 0,
  currency null and CO2e null (unknown, not zero);
- carbon: the region's last point at or before a time, else the site's
  constant, else the region's first point carried back;
- ``pue`` of a window is its facility ÷ IT energy (the PUE in force at its
  start when it has no energy); ``g_co2e_per_kwh`` its CO2e ÷ facility
  energy of known intensity;
- host share = shares held ÷ GPUs the node reports (``nodes.gpu_count``,
  else the whole GPUs seen in its rollups, else in its samples), at most 1;
- declared sharing (time-slicing, MPS, MIG instances) splits a GPU's energy
  and GPU-hours by share; at no instant do the shares exceed the GPU (the
  database refuses it), so nothing is counted twice;
- MIG rows (``mig_instance`` set) never count as energy; only whole-GPU rows
  do (a MIG instance gets its share of the board);
- tokens per joule / kWh are against IT energy (GPU + host share).
"""

from gpufleet.accounting.fleet import fleet_accounting
from gpufleet.accounting.report import CSV_COLUMNS, finance_csv, finance_report, report_csv, runs_report
from gpufleet.accounting.run import CONTRACT_FIELDS, account_runs, load_runs, run_accounting

__all__ = [
    "CONTRACT_FIELDS",
    "CSV_COLUMNS",
    "account_runs",
    "finance_csv",
    "finance_report",
    "fleet_accounting",
    "load_runs",
    "report_csv",
    "run_accounting",
    "runs_report",
]
