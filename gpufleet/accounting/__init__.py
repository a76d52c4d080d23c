"""Per-run and fleet energy, cost and CO2e accounting (contracts.md section 3).

Entry points:

- :func:`run_accounting` — one run, exactly the body of
  ``GET /v1/runs/{run_id}/accounting`` (``gpufleet replay`` writes a list of these);
- :func:`account_runs` / :func:`load_runs` — many runs at once;
- :func:`fleet_accounting` — ``GET /v1/accounting``: runs grouped by site,
  team or run, the GPUs no run held, and the fleet total;
- :func:`runs_report` / :func:`report_csv` — the finance export.
"""

from gpufleet.accounting.fleet import fleet_accounting
from gpufleet.accounting.report import CSV_COLUMNS, report_csv, runs_report
from gpufleet.accounting.run import CONTRACT_FIELDS, account_runs, load_runs, run_accounting

__all__ = [
    "CONTRACT_FIELDS", "CSV_COLUMNS", "account_runs", "fleet_accounting", "load_runs", "report_csv",
    "run_accounting", "runs_report",
]
