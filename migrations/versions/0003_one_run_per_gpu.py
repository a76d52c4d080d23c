"""a GPU belongs to at most one run at any instant

Two runs whose [start, end) windows overlap may not hold the same (node, GPU):
that GPU's hours and energy would be billed twice and runs + unallocated
would exceed the fleet total (issue 15).  The rule is enforced in the
database, so every writer (API, CLI, replay, plain SQL) is held to it:

* ``run_allocations`` AFTER INSERT OR UPDATE: the new row's GPU must not be
  held by another run whose window overlaps this run's;
* ``runs`` AFTER UPDATE OF start, end: moving a run's start or end (a PATCH
  extending ``end``) must not make its window overlap another run that holds
  one of its GPUs.

Both checks first take one transaction-scoped advisory lock
(``ALLOCATION_LOCK``), so concurrent writers are serialized and the check of
one sees every allocation the other committed (READ COMMITTED: each statement
of the trigger function takes a fresh snapshot after the lock is granted).
Allocation changes are rare (a job start or end), so one lock for the whole
fleet costs nothing measurable.  A refusal is SQLSTATE 23P01
(exclusion_violation) whose message names the other run, the node and the
GPU.  The same triggers exist on plain PostgreSQL and TimescaleDB: they only
touch ``runs`` and ``run_allocations``, which are ordinary tables on both.

An exclusion constraint (btree_gist over tstzrange) would need the run's
window copied into ``run_allocations``; the triggers keep the existing
tables unchanged.

Upgrading a database that already holds overlapping allocations fails with
the list of them: which of the two runs keeps the GPU is an operator's
decision, not the migration's.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: pg_advisory_xact_lock key serializing allocation checks ('gpuf' 'allo' as ASCII).
ALLOCATION_LOCK = 0x67707566616C6C6F

_TS = """to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"""

OVERLAPS = """
SELECT a.run_id, a.node, a.gpu, b.run_id, ra.start, ra."end", rb.start, rb."end"
FROM run_allocations a
JOIN runs ra ON ra.run_id = a.run_id
JOIN run_allocations b ON b.node = a.node AND b.gpu = a.gpu AND b.run_id > a.run_id
JOIN runs rb ON rb.run_id = b.run_id
WHERE tstzrange(ra.start, ra."end", '[)') && tstzrange(rb.start, rb."end", '[)')
ORDER BY a.node, a.gpu, a.run_id, b.run_id
LIMIT 21
"""

FUNCTIONS = f"""
CREATE FUNCTION gpufleet_allocation_conflict(p_run text, p_node text, p_gpu integer, p_start timestamptz,
                                             p_end timestamptz) RETURNS text
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  o record;
BEGIN
  SELECT r.run_id, r.start, r."end" INTO o
  FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
  WHERE a.node = p_node AND a.gpu = p_gpu AND a.run_id <> p_run
    AND tstzrange(r.start, r."end", '[)') && tstzrange(p_start, p_end, '[)')
  ORDER BY r.start, r.run_id LIMIT 1;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN format('GPU %s:%s is held by run %s from %s %s; run %s from %s %s would overlap it',
                p_node, p_gpu, quote_literal(o.run_id), {_TS.format("o.start")},
                CASE WHEN o."end" IS NULL THEN '(still running)' ELSE 'to ' || {_TS.format('o."end"')} END,
                quote_literal(p_run), {_TS.format("p_start")},
                CASE WHEN p_end IS NULL THEN '(open-ended)' ELSE 'to ' || {_TS.format("p_end")} END);
END
$fn$;

CREATE FUNCTION gpufleet_check_allocation() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  msg text;
BEGIN
  PERFORM pg_advisory_xact_lock({ALLOCATION_LOCK});
  SELECT start, "end" INTO r FROM runs WHERE run_id = NEW.run_id;
  msg := gpufleet_allocation_conflict(NEW.run_id, NEW.node, NEW.gpu, r.start, r."end");
  IF msg IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'exclusion_violation', MESSAGE = msg;
  END IF;
  RETURN NULL;
END
$fn$;

CREATE FUNCTION gpufleet_check_run_window() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  a record;
  msg text;
BEGIN
  PERFORM pg_advisory_xact_lock({ALLOCATION_LOCK});
  FOR a IN SELECT node, gpu FROM run_allocations WHERE run_id = NEW.run_id ORDER BY node, gpu LOOP
    msg := gpufleet_allocation_conflict(NEW.run_id, a.node, a.gpu, NEW.start, NEW."end");
    IF msg IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'exclusion_violation', MESSAGE = msg;
    END IF;
  END LOOP;
  RETURN NULL;
END
$fn$;

CREATE TRIGGER run_allocations_one_run_per_gpu AFTER INSERT OR UPDATE ON run_allocations
  FOR EACH ROW EXECUTE FUNCTION gpufleet_check_allocation();

CREATE TRIGGER runs_window_one_run_per_gpu AFTER UPDATE OF start, "end" ON runs
  FOR EACH ROW WHEN (OLD.start IS DISTINCT FROM NEW.start OR OLD."end" IS DISTINCT FROM NEW."end")
  EXECUTE FUNCTION gpufleet_check_run_window();
"""


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(text(OVERLAPS)).fetchall()
    if rows:
        lines = [
            f"  {n}:{g} held by {a!r} [{sa_}, {ea or 'running'}) and {b!r} [{sb}, {eb or 'running'})"
            for a, n, g, b, sa_, ea, sb, eb in rows[:20]
        ]
        more = "\n  ..." if len(rows) > 20 else ""
        raise RuntimeError(
            "cannot enforce one run per GPU: these allocations overlap (each GPU-hour is billed twice); "
            "end one of the runs earlier or delete the allocation (DELETE FROM run_allocations WHERE ...), "
            "then run the upgrade again:\n" + "\n".join(lines) + more
        )
    for stmt in _statements(FUNCTIONS):
        op.execute(stmt)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS runs_window_one_run_per_gpu ON runs")
    op.execute("DROP TRIGGER IF EXISTS run_allocations_one_run_per_gpu ON run_allocations")
    op.execute("DROP FUNCTION IF EXISTS gpufleet_check_run_window()")
    op.execute("DROP FUNCTION IF EXISTS gpufleet_check_allocation()")
    op.execute(
        "DROP FUNCTION IF EXISTS gpufleet_allocation_conflict(text, text, integer, timestamptz, timestamptz)"
    )


def _statements(sql: str) -> list[str]:
    """Split on the blank-line-separated CREATE statements (function bodies contain ';')."""
    out: list[str] = []
    cur: list[str] = []
    for line in sql.strip().splitlines():
        if line.startswith("CREATE ") and cur:
            out.append("\n".join(cur).strip())
            cur = []
        cur.append(line)
    if cur:
        out.append("\n".join(cur).strip())
    return out
