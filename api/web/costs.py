"""Per-run accounting for the pages, from the accounting module (the API's own numbers).

The web view never computes energy or cost itself: it shows what
``GET /v1/runs/{id}/accounting`` would answer, so the two cannot disagree.
Where the module is not part of the build, or fails, the page says so in
words instead of showing zeros.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg

from gpufleet.accounting.result import AccountingBody

log = logging.getLogger(__name__)


@dataclass
class Costs:
    by_run: dict[str, AccountingBody] = field(default_factory=dict)
    #: Why there are no figures, for the reader (None when there are).
    note: str | None = None


def run_costs(
    conn: psycopg.Connection, run_ids: Sequence[str], max_gap_s: float, now: datetime | None = None
) -> Costs:
    if not run_ids:
        return Costs()
    try:
        from gpufleet.accounting import account_runs, load_runs
    except ImportError:
        return Costs(
            note="Per-run accounting is not available in this build (module gpufleet.accounting "
            "is missing); energy, cost and CO2e are not shown."
        )
    try:
        rows = account_runs(
            conn, load_runs(conn, list(run_ids)), now=now or datetime.now(UTC), max_gap_s=max_gap_s
        )
    except psycopg.Error as e:
        log.warning("accounting for the web view failed: %s", type(e).__name__)
        return Costs(note=f"Accounting could not be computed just now ({type(e).__name__}); try again.")
    return Costs(by_run={r["run_id"]: r for r in rows})
