"""The accounting functions in the database are exactly the text of gpufleet.db.accounting_sql.

Migrations 0004, 0010, 0013, 0014, 0020, 0021, 0022, 0024 and 0027 install them from that module (and
``gpufleet.db.claim_energy_sql``, ``gpufleet.db.accounting_joins_sql``, ``gpufleet.db.accounting_fleet_sql``, ``gpufleet.db.accounting_sets_sql``,
``gpufleet.db.accounting_members_sql``, ``gpufleet.db.fleet_hours_sql``); a change to the module without a
migration that replaces them would leave databases on the old definition while the code reads the new
one, so the installed bodies are compared with the module's current ones (``CURRENT``, with the claim
energy's and the accounting's later texts).
"""

from __future__ import annotations

import re

import psycopg

from gpufleet.db import (
    accounting_fleet_sql,
    accounting_joins_sql,
    accounting_members_sql,
    accounting_sets_sql,
    accounting_sql,
    claim_energy_sql,
    fleet_hours_sql,
    sql_files,
)
from gpufleet.store.fact_history import dated_pricing

FUNCTION = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION (\w+)\(.*?\$fn\$(.*)\$fn\$", re.S)


def test_installed_bodies_are_the_modules(conn: psycopg.Connection) -> None:
    want = {}
    for stmt in (
        *accounting_sql.CURRENT,
        claim_energy_sql.CLAIM_ENERGY_V2,
        *accounting_joins_sql.INSTALL,
        accounting_fleet_sql.ACCOUNTING_V5,
        accounting_sets_sql.ACCOUNTING_V6,
        accounting_members_sql.ACCOUNTING_V7,
        fleet_hours_sql.HOUR_SCOPES_V1,
        fleet_hours_sql.FLEET_PARTS_V1,
        fleet_hours_sql.KEPT_V1,
    ):
        m = FUNCTION.search(stmt)
        if m:
            want[m.group(1)] = m.group(2)  # the later text of a function wins (V7, claim energy's third)
    assert set(want) == {
        "gpufleet_minor_units",
        "gpufleet_claim_energy",
        "gpufleet_site_periods",
        "gpufleet_energy_rates",
        "gpufleet_gpu_hour_prices",
        "gpufleet_accounting",
        "gpufleet_incident_accounting",
        "gpufleet_fleet_hour_scopes",
        "gpufleet_fleet_parts",
        "gpufleet_accounting_kept",
    }
    got = dict(
        conn.execute("SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", (list(want),)).fetchall()
    )
    for name, body in want.items():
        assert got.get(name) == body, (
            f"{name}: the database's definition differs from accounting_sql (migrate)"
        )
    # claim energy's joins are hash joins only when it is planned without nested loops (migration 0022)
    config = conn.execute("SELECT proconfig FROM pg_proc WHERE proname = 'gpufleet_claim_energy'").fetchone()
    assert config is not None and "enable_nestloop=off" in config[0]


def test_installed_incident_accounting_is_the_modules(conn: psycopg.Connection) -> None:
    """The incident accounting is the module's text: the run query over incidents' pieces."""
    m = FUNCTION.search(accounting_joins_sql.INCIDENT_ACCOUNTING_V4)
    assert m and m.group(1) == "gpufleet_incident_accounting"
    got = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (m.group(1),)).fetchone()
    assert got is not None and got[0] == m.group(2), (
        "the database's definition differs from accounting_sql (migrate)"
    )
    # the priced part is the run query's own text, not a copy: everything from the claims on is shared
    run_q = accounting_joins_sql.set_based(
        dated_pricing(accounting_sql._variant(accounting_sql._QUERY_V2, False))
    )
    tail = run_q[run_q.index("-- claims summed together") :]
    assert tail in m.group(2)


def test_kept_lines_are_keyed_by_the_texts_installed_last() -> None:
    """Kept lines are keyed by the text that computed them: a migration installing a later text of the
    accounting or of claim energy must key by it too, or lines of the earlier text would be read back."""
    import inspect
    from pathlib import Path

    from gpufleet.accounting import priced_store

    folder = Path(sql_files.__file__).parent / "sql"

    def last(name: str) -> str:
        versions = [int(p.name.split(".v")[1].split(".")[0]) for p in folder.glob(f"{name}.v*.sql")]
        return f"{name}.v{max(versions)}"

    source = inspect.getsource(priced_store)
    for name in ("gpufleet_accounting", "gpufleet_incident_accounting", "gpufleet_claim_energy"):
        assert f'sql_files.text("{last(name)}")' in source, f"priced_store keys by an earlier {name}"
