"""Per-run and fleet energy, cost and CO2e accounting (contracts.md section 3).

Entry points:

- :func:`run_accounting` — one run, exactly the body of
  ``GET /v1/runs/{run_id}/accounting`` (``gpufleet replay`` writes a list of these);
- :func:`account_runs` / :func:`load_runs` — many runs at once;
- :func:`fleet_accounting` — ``GET /v1/accounting``: runs grouped by site,
  team or run, the GPUs no run held, and the fleet total;
- :func:`runs_report` / :func:`report_csv` — the finance export.

Where the contract is silent, this package decides (each module says why):

- window: [start, end), up to ``now`` while the run is running (no end, or
  an end in the future); ``end`` stays the run's own (null while running) and
  ``window_start``/``window_end`` say what was accounted.  Periods (the
  report, the fleet view, ``since``/``until``) clip it, so consecutive
  periods add up to the whole run;
- a run is priced at its own site; a run without one has PUE 1, prices 0,
  currency null and CO2e null (unknown, not zero);
- before the first point of a price series the site's flat price applies;
  before the first carbon point the site's constant, else the first point;
- host share = GPUs held ÷ GPUs the node reports (``nodes.gpu_count``, else
  the whole GPUs seen in its rollups, else in its samples), at most 1;
- MIG rows (``mig_instance`` set) never count; only whole-GPU rows do;
- tokens per joule / kWh are against IT energy (GPU + host share);
- a GPU held by two runs at once is counted for both (an allocation error
  the data has to fix; coverage is capped at 1).
"""

from gpufleet.accounting.fleet import fleet_accounting
from gpufleet.accounting.report import CSV_COLUMNS, report_csv, runs_report
from gpufleet.accounting.run import CONTRACT_FIELDS, account_runs, load_runs, run_accounting

__all__ = [
    "CONTRACT_FIELDS", "CSV_COLUMNS", "account_runs", "fleet_accounting", "load_runs", "report_csv",
    "run_accounting", "runs_report",
]
