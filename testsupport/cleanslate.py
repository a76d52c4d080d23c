"""Empty a test database's data tables between tests, paying only for the tables a test wrote.

``TRUNCATE`` of every data table gives each table and index a new file and
costs about 0.5 s on a small machine whether the tables hold anything or not;
over the suite's tests that was most of its database time.  Here one query
finds the tables that hold rows, and only those are emptied: by ``DELETE``
with triggers and foreign-key checks off (``session_replication_role =
replica``, which needs a superuser) or else by ``TRUNCATE ... CASCADE``; a table
with a BRIN index is always truncated, as tests of the index read the physical
layout of a fresh table (rows written after a ``DELETE`` refill old block ranges
whose summaries survive).  The
set emptied is the same as a ``TRUNCATE ... CASCADE`` of the named tables
would empty (the named tables and every table referencing them, transitively),
and every sequence those tables own starts again, as ``RESTART IDENTITY`` did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

#: The tables referencing a table by foreign key, transitively: what TRUNCATE ... CASCADE would also empty.
_CLOSURE = """
WITH RECURSIVE reach(oid) AS (
    SELECT c.oid FROM pg_class c
     WHERE c.relnamespace = 'public'::regnamespace AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')
    UNION
    SELECT con.conrelid FROM pg_constraint con JOIN reach ON con.confrelid = reach.oid WHERE con.contype = 'f'
)
SELECT c.relname FROM reach JOIN pg_class c ON c.oid = reach.oid ORDER BY c.relname
"""

#: Tables with a BRIN index, whose block ranges a test may count.
_BRIN = """
SELECT DISTINCT t.relname FROM pg_index i
  JOIN pg_class t ON t.oid = i.indrelid JOIN pg_class x ON x.oid = i.indexrelid JOIN pg_am am ON am.oid = x.relam
 WHERE am.amname = 'brin' AND t.relname = ANY(%s) AND t.relnamespace = 'public'::regnamespace
"""

#: Sequences owned by columns of the given tables, with the value they start at.
_SEQUENCES = """
SELECT s.relname, q.start_value FROM pg_depend d
  JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
  JOIN pg_class t ON t.oid = d.refobjid
  JOIN pg_sequences q ON q.schemaname = 'public' AND q.sequencename = s.relname
 WHERE t.relname = ANY(%s) AND t.relnamespace = 'public'::regnamespace AND d.deptype IN ('a', 'i')
"""


@dataclass(frozen=True)
class Slate:
    """What to empty in one database, found once per test session."""

    tables: tuple[str, ...]
    sequences: tuple[tuple[str, int], ...]
    superuser: bool
    brin: frozenset[str]

    @classmethod
    def of(cls, conn: psycopg.Connection, tables: Sequence[str]) -> Slate:
        reach = tuple(r[0] for r in conn.execute(_CLOSURE, (list(tables),)))
        seqs = tuple((r[0], int(r[1])) for r in conn.execute(_SEQUENCES, (list(reach),)))
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        brin = frozenset(r[0] for r in conn.execute(_BRIN, (list(reach),)))
        return cls(reach, seqs, bool(row and row[0]), brin)

    def holding_rows(self, conn: psycopg.Connection) -> list[str]:
        """The tables that hold at least one row (one round trip)."""
        probe = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {} WHERE EXISTS (SELECT 1 FROM {})").format(sql.Literal(t), sql.Identifier(t))
            for t in self.tables
        )
        return [r[0] for r in conn.execute(probe)]

    def empty(self, conn: psycopg.Connection) -> list[str]:
        """Empty every table of the slate that holds rows; restart its sequences. Returns the tables emptied.

        The tables are locked against writes first (reads go on), as ``TRUNCATE`` locked them: a server a
        module's tests share keeps writing between tests (a late batch, the leader's rollups and pricing),
        and a sequence restarted under a row written after the check hands out its id again."""
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '60s'")  # a session a test left open: fail, not hang
            conn.execute(
                sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                    sql.SQL(", ").join(sql.Identifier(t) for t in self.tables)
                )
            )
            full = self.holding_rows(conn)
            truncate = [t for t in full if t in self.brin or not self.superuser]
            delete = [t for t in full if t not in truncate]
            if truncate:
                conn.execute(
                    sql.SQL("TRUNCATE {} CASCADE").format(
                        sql.SQL(", ").join(sql.Identifier(t) for t in truncate)
                    )
                )
            if delete:
                conn.execute("SET LOCAL session_replication_role = replica")
                for t in delete:
                    conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(t)))
            for name, start in self.sequences:
                conn.execute("SELECT setval(%s::regclass, %s, false)", (name, start))
        return full
