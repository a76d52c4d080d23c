"""One consistent view of samples, rollups and the rollup queue for one answer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg.pq import TransactionStatus

from gpufleet.accounting import priced_store


@contextlib.contextmanager
def snapshot(conn: psycopg.Connection) -> Iterator[None]:
    """A read-only REPEATABLE READ transaction when ``conn`` is idle in autocommit.

    The rollup worker deletes queue rows and rewrites rollups in one
    transaction; reading both in one snapshot means a range is either still
    queued (answered from raw samples) or already rebuilt, never neither.
    A caller already in a transaction keeps its own.

    JIT is off inside it: the raw-sample fallbacks inflate cost estimates
    past ``jit_above_cost`` and compiling then costs more than the
    millisecond queries it would speed up.

    Priced pieces the answer computed are stored once the snapshot has ended (it cannot write):
    :func:`gpufleet.accounting.priced_store.flush`.
    """
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        yield
        return
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL jit = off")
        yield
    priced_store.flush(conn)
