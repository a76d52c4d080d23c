"""Render the SQL the migrations and the rollup worker run into ``gpufleet/db/sql``, from its Python builders.

The accounting's functions are assembled from shared fragments (``gpufleet.db.accounting_sql`` and the
modules that derive later texts from it), so the text a database runs is not written anywhere a
reviewer can read it.  This script writes each statement once to a file of its own
(``gpufleet.db.sql_files`` says how files are named and read); the migrations execute those files,
so a builder's change reaches a database only through a file whose diff shows what changed, and a
migration that installs it.  ``tests/test_sql_files.py`` fails while a file differs from what this
renders.

    python tools/render_sql.py           # rewrite the files that differ, remove files no builder renders
    python tools/render_sql.py --check   # exit 1, with a summary of the differences, when any differs
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from gpufleet.db import accounting_fleet_sql as V5
from gpufleet.db import accounting_joins_sql as J
from gpufleet.db import accounting_members_sql as V7
from gpufleet.db import accounting_sets_sql as V6
from gpufleet.db import accounting_sql as A
from gpufleet.db import claim_energy_sql as C
from gpufleet.db import fleet_hours_sql as H
from gpufleet.db import ledger_sql as L
from gpufleet.db import priced_store_sql as P
from gpufleet.db import stats_sql as S
from gpufleet.store import fact_history as F

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "gpufleet" / "db" / "sql"

_FUNCTION = re.compile(r"\ACREATE (?:OR REPLACE )?FUNCTION (\w+)\(")


def _replacing(stmt: str) -> str:
    """A function first installed with ``CREATE`` as a later migration executes it again."""
    return stmt.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _drops(stmts: tuple[str, ...]) -> tuple[str, ...]:
    """The DROPs a migration step runs before it creates (the leading ones of ``stmts``)."""
    out = []
    for s in stmts:
        if not s.startswith("DROP "):
            break
        out.append(s)
    return tuple(out)


def _aggregate(name: str, select: str) -> str:
    """Migration 0001's continuous aggregate of the per-minute statistics (TimescaleDB)."""
    return (
        f"CREATE MATERIALIZED VIEW {name} "
        "WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS " + select + " WITH NO DATA"
    )


def _functions(stmts: tuple[str, ...]) -> dict[str, str]:
    """The functions among a migration's ``stmts`` by file name (first version): the pricing bump and
    each mark trigger's function."""
    out = {}
    for stmt in stmts:
        m = _FUNCTION.match(stmt.lstrip("\n"))
        if m:
            out[f"{m.group(1)}.v1"] = stmt
    return out


def statements() -> dict[str, str | tuple[str, ...]]:
    """Every file by name (without ``.sql``): one statement, or a migration step's one-line statements."""
    stats = "time_bucket(INTERVAL '1 minute', time)"
    return {
        # 0001: the per-minute statistics, as plain tables or as continuous aggregates
        "gpu_stats_1m.v1": S.gpu_stats_table_ddl(),
        "host_stats_1m.v1": S.host_stats_table_ddl(),
        "gpu_stats_1m.timescale.v1": _aggregate("gpu_stats_1m", S.gpu_stats_select(stats)),
        "host_stats_1m.timescale.v1": _aggregate("host_stats_1m", S.host_stats_select(stats)),
        # 0004: accounting V1
        "gpufleet_claim.v1": A.TYPES_V1,
        "gpufleet_minor_units.v1": A.MINOR_UNITS_V1,
        "gpufleet_claim_energy.v1": A.CLAIM_ENERGY_V1,
        "gpufleet_site_periods.v1": A.SITE_PERIODS_V1,
        "gpufleet_energy_rates.v1": A.ENERGY_RATES_V1,
        "gpufleet_gpu_hour_prices.v1": A.GPU_HOUR_PRICES_V1,
        "gpufleet_accounting.v1": A.ACCOUNTING_V1,
        "0004_finance_accounting.downgrade": A.DROP_V1,
        # 0010: incident accounting
        "gpufleet_incident_accounting.v1": A.INCIDENT_ACCOUNTING_V1,
        "0010_incident_accounting.downgrade": A.DROP_INCIDENTS_V1,
        # 0013: dated node facts
        "gpufleet_priced_facts.v1": F.PRICED_FACTS_FN,
        "gpufleet_node_facts_at.v1": F.FACTS_AT_FN,
        "node_facts_history.seed.v1": F.SEED_SQL,
        # 0014: accounting V2
        "0014_accounting_v2.upgrade": _drops(A.INSTALL_V2),
        "0014_accounting_v2.downgrade": _drops(A.DROP_V2),
        "gpufleet_site_periods.v2": A.SITE_PERIODS_V2,
        "gpufleet_energy_rates.v2": A.ENERGY_RATES_V2,
        "gpufleet_gpu_hour_prices.v2": A.GPU_HOUR_PRICES_V2,
        "gpufleet_accounting.v2": A.ACCOUNTING_V2,
        "gpufleet_incident_accounting.v2": A.INCIDENT_ACCOUNTING_V2,
        # 0018: the ledger
        "gpufleet_ledger_pieces.v1": L.LEDGER_PIECES_V1,
        "gpufleet_ledger.v1": L.LEDGER_V1,
        "0018_ledger.downgrade": L.DROP_LEDGER_V1,
        # 0020: claim energy's second text
        "gpufleet_claim_energy.v2": C.CLAIM_ENERGY_V2,
        # 0021: accounting V3 (only ever installed over V2)
        "gpufleet_accounting.v3": _replacing(A.ACCOUNTING_V3),
        "gpufleet_incident_accounting.v3": _replacing(A.INCIDENT_ACCOUNTING_V3),
        # 0022: accounting V4, claim energy's third text
        "gpufleet_claim_energy.v3": J.CLAIM_ENERGY_V3,
        "gpufleet_accounting.v4": J.ACCOUNTING_V4,
        "gpufleet_incident_accounting.v4": J.INCIDENT_ACCOUNTING_V4,
        # 0023: the pricing marks
        **_functions(P.INSTALL_V1),
        "0023_priced_pieces.upgrade": tuple(s for s in P.INSTALL_V1 if s.startswith("CREATE TRIGGER ")),
        "0023_priced_pieces.downgrade": P.DROP_V1,
        # 0024: accounting V5 (fleet GPU-seconds priced by the rate index)
        "gpufleet_accounting.v5": V5.ACCOUNTING_V5,
        # 0026: the incidents' mark, for kept claims
        **_functions(P.INSTALL_V2),
        "0026_kept_claims.upgrade": tuple(s for s in P.INSTALL_V2 if s.startswith("CREATE TRIGGER ")),
        "0026_kept_claims.downgrade": P.DROP_V2,
        # 0027: accounting V6 (the fleet path's holds joined, not scanned per GPU)
        "gpufleet_accounting.v6": V6.ACCOUNTING_V6,
        # 0028: the progress reports' mark, for the power-cap advisor's kept points
        **_functions(P.INSTALL_V3),
        "0028_kept_power_points.upgrade": tuple(s for s in P.INSTALL_V3 if s.startswith("CREATE TRIGGER ")),
        "0028_kept_power_points.downgrade": P.DROP_V3,
        # 0030: the fleet's kept hours, their marks, and accounting V7 that reads them
        "gpufleet_fleet_hour_scopes.v1": H.HOUR_SCOPES_V1,
        **dict(H.TRIGGER_FUNCTIONS),
        "0030_fleet_hours.upgrade": H.TRIGGERS_V1,
        "0030_fleet_hours.downgrade": H.DROP_V1,
        "rollup_pricing_marks.v2": H.BUMP_REBUILT_V2,
        "gpufleet_fleet_parts.v1": H.FLEET_PARTS_V1,
        "gpufleet_accounting_kept.v1": H.KEPT_V1,
        "gpufleet_accounting.v7": V7.ACCOUNTING_V7,
        # 0031: a mark moved once per transaction, allocations marked once per statement
        "gpufleet_pricing_bump.v2": P.BUMP_V2,
        "gpufleet_fleet_hours_mark_allocations.v1": H.ALLOCATIONS_V2,
        "0031_statement_marks.upgrade": H.ALLOCATION_TRIGGERS_V2,
        "0031_statement_marks.downgrade": H.DROP_ALLOCATIONS_V2,
    }


def render(stmt: str | tuple[str, ...]) -> str:
    """A file's text: the statement itself, or one statement per line ended by ``;``."""
    if isinstance(stmt, str):
        return stmt
    for s in stmt:
        if "\n" in s or ";" in s or not s:
            raise ValueError(f"not a one-line statement: {s[:80]!r}")
    return "".join(f"{s};\n" for s in stmt)


def rendered() -> dict[str, str]:
    """Every file's name (with ``.sql``) and text, as the builders render them now."""
    return {f"{name}.sql": render(stmt) for name, stmt in statements().items()}


def differences(folder: Path = FOLDER) -> list[str]:
    """A line per file that differs from what renders now (missing, changed, or rendered by nothing)."""
    want = rendered()
    have = {p.name for p in folder.glob("*.sql")} if folder.is_dir() else set()
    out = []
    for name in sorted(want.keys() | have):
        if name not in have:
            out.append(f"missing: {name}")
        elif name not in want:
            out.append(f"rendered by nothing: {name}")
        else:
            text = (folder / name).read_bytes().decode("utf-8")
            if text != want[name]:
                diff = list(
                    difflib.unified_diff(
                        text.splitlines(),
                        want[name].splitlines(),
                        f"{name} (checked in)",
                        f"{name} (rendered)",
                        lineterm="",
                    )
                )
                changed = sum(1 for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---")))
                out.append(f"differs: {name} ({changed} lines)")
                out.extend(f"    {d}" for d in diff[:40])
                if len(diff) > 40:
                    out.append(f"    ... {len(diff) - 40} more diff lines")
    return out


def write(folder: Path = FOLDER) -> list[str]:
    """Rewrite the files that differ and remove those no builder renders; the names touched."""
    folder.mkdir(parents=True, exist_ok=True)
    want = rendered()
    touched = []
    for name, text in want.items():
        path = folder / name
        data = text.encode("utf-8")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
            touched.append(name)
    for path in sorted(folder.glob("*.sql")):
        if path.name not in want:
            path.unlink()
            touched.append(path.name)
    return touched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render the SQL of gpufleet/db/*_sql.py into gpufleet/db/sql/, one file per statement "
        "(or per migration step's one-line statements); the migrations execute those files."
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a summary of the differences when a checked-in file differs",
    )
    args = parser.parse_args(argv)
    if args.check:
        diffs = differences()
        if diffs:
            print("\n".join(diffs))
            print(
                f"gpufleet/db/sql differs from its builders ({sum(1 for d in diffs if not d.startswith(' '))} "
                "files): run python tools/render_sql.py",
                file=sys.stderr,
            )
            return 1
        print(f"gpufleet/db/sql: {len(rendered())} files, all as rendered")
        return 0
    touched = write()
    for name in touched:
        print(f"wrote {name}")
    print(f"gpufleet/db/sql: {len(rendered())} files, {len(touched)} written or removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
