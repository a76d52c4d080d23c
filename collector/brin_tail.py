"""Keep the sample tables' time BRIN indexes summarized up to the newest rows (plain PostgreSQL).

On plain PostgreSQL the window's reads find the last few seconds of samples
through a BRIN index on ``time``.  Rows appended to the table land in new
page ranges, and PostgreSQL leaves a new range unsummarized until a VACUUM
gets to it; a scan treats every unsummarized range as a match.  Autovacuum
visits an insert-only table after inserts of a fifth of its size, so a
steady refresh read every row written since the last visit: at 10,000 GPUs
the read grew by 50,000 rows each sweep, and on a table of a day at 1 Hz it
could reach hours of samples.  Summarizing the ranges the table grew by
since the last sweep keeps each read to its own few seconds.

Summarizing takes a lock that conflicts only with VACUUM, ANALYZE, index
builds and other summarizations, never with ingest.  It waits for that lock
for :data:`LOCK_WAIT_MS` at most: when a VACUUM holds it, the VACUUM is
summarizing the same ranges, so this sweep goes on and the next one tries
again.  The first call summarizes every range left unsummarized
(``brin_summarize_new_values``, a pass over the whole index); later ones
only the ranges from the last one on (``brin_summarize_range``), so the
cost stays with what arrived, not with the table's size.  On TimescaleDB
the tables have no such indexes and this does nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import psycopg
from psycopg import errors, pq

log = logging.getLogger(__name__)

#: The time BRIN index of each sample table (the plain-PostgreSQL layout's, migration 0001).
INDEXES = {"gpu_samples": "gpu_samples_time_brin", "host_samples": "host_samples_time_brin"}

#: Longest wait for the summarizing lock, in milliseconds.
LOCK_WAIT_MS = 50

_FIND_SQL = """
SELECT t.relname, i.relname, coalesce(
    (SELECT split_part(o, '=', 2)::bigint FROM unnest(i.reloptions) o WHERE o LIKE 'pages_per_range=%%'), 128)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_am a ON a.oid = i.relam
WHERE a.amname = 'brin' AND i.relname = ANY(%s) AND pg_table_is_visible(i.oid)
ORDER BY t.relname"""

_TAIL_SQL = """
WITH n AS (SELECT pg_relation_filenode(%(tbl)s::regclass) AS file,
                  pg_relation_size(%(tbl)s::regclass) / current_setting('block_size')::bigint AS blocks)
SELECT n.file, n.blocks, CASE WHEN %(whole)s THEN brin_summarize_new_values(%(idx)s::regclass)
  ELSE (SELECT coalesce(sum(brin_summarize_range(%(idx)s::regclass, b)), 0)::int
        FROM generate_series(%(lo)s::bigint, n.blocks - 1, %(step)s::bigint) b) END
FROM n"""


@dataclass
class _Index:
    table: str
    name: str
    pages_per_range: int
    #: The table's storage when last summarized (a TRUNCATE or VACUUM FULL makes a new one).
    file: int | None = None
    #: First block of the first range that may be unsummarized.
    next_block: int = 0


@dataclass
class BrinTail:
    """Which time BRIN indexes exist (looked up once), and how far each is summarized."""

    indexes: list[_Index] | None = None
    #: Ranges summarized by this object, in all (what the tests check).
    summarized: int = 0
    _disabled: bool = field(default=False, repr=False)

    def catch_up(self, conn: psycopg.Connection) -> bool:
        """Summarize the ranges the sample tables grew by; False when skipped this time (a lock
        held elsewhere, inside a transaction, or not allowed).  ``conn`` is in autocommit mode."""
        if self._disabled or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return False
        if self.indexes is None:
            rows = conn.execute(_FIND_SQL, (list(INDEXES.values()),)).fetchall()
            self.indexes = [_Index(t, i, int(p)) for t, i, p in rows if INDEXES.get(t) == i]
        done = True
        for ix in self.indexes:
            if self._disabled:
                return False
            done = self._one(conn, ix) and done
        return done

    def _one(self, conn: psycopg.Connection, ix: _Index) -> bool:
        step = ix.pages_per_range
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'")
                row = conn.execute(
                    _TAIL_SQL,
                    {
                        "tbl": ix.table,
                        "idx": ix.name,
                        "whole": ix.file is None,
                        "lo": ix.next_block,
                        "step": step,
                    },
                ).fetchone()
        except errors.LockNotAvailable:
            return False  # a VACUUM (or another replica) is summarizing: try again next sweep
        except errors.InsufficientPrivilege:
            log.warning(
                "cannot summarize %s (only the owner of %s may); time-range reads of the sample "
                "tables scan every row written since the last VACUUM",
                ix.name,
                ix.table,
            )
            self._disabled = True
            return False
        assert row is not None
        file, blocks, count = int(row[0]), int(row[1]), int(row[2] or 0)
        if ix.file is not None and file != ix.file:
            # Rewritten since (TRUNCATE, VACUUM FULL): any range may be new; summarize them all.
            ix.file, ix.next_block = None, 0
            return self._one(conn, ix)
        self.summarized += count
        ix.file = file
        # The last range may still be filling: summarized now, inserts keep it up to date, but look at
        # it again next time (cheap when it is summarized) and at every range after it.
        ix.next_block = max(0, (blocks - 1) // step * step)
        return True
