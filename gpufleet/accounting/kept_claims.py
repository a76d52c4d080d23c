"""What an ended run's incidents claim, kept between readers: the keys its accounting prices.

Once incident lines are kept (:mod:`gpufleet.accounting.priced_store`), a warm accounting of many runs
with their ledgers spends its time deciding again which GPU-time each incident claims: reading every
incident of every run with its evidence, checking the evidence, the union of the claims and the
ledger's arbitration of states (about 5 of the 7 s of 512 one-GPU runs over a week with 170,496
incidents, ``bench/accounting.py``).  Over an ended run's whole window those claims depend only on the
run (its window and allocations: the mark ``r:<run>``), on its incidents (``i:<run>``, moved by
triggers on ``incidents``, migration 0026) and on the rules that read them, this package's code
(:func:`_rules`).  So the first reader keeps, per run and window, gap rule and source, the number of
incidents and each priced key's digest of pieces; the next reads the priced lines of those digests
from the priced store directly.  A run whose marks moved, or one of whose keys' lines is no longer
kept, is claimed live again.

Kept only for the whole window of an ended run, with its ledger computed (every key known), when every
piece is settled (cut by no period's edge) and the snapshot's run is the caller's (a run changed since
the caller loaded it was claimed over a window or allocations its marks do not describe).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path

import psycopg

from gpufleet.accounting import priced_store
from gpufleet.db import priced_store_sql as S
from gpufleet.store.run_model import Run, load_runs

#: The modules whose code decides a run's claims and the keys they are priced under.
_RULES = (
    "gpufleet.accounting.incidents",
    "gpufleet.accounting.efficiency",
    "gpufleet.accounting.ledger",
    "gpufleet.accounting.kept_claims",
    "gpufleet.evidence",
    "gpufleet.evidence_stored",
    "gpufleet.waste",
    "gpufleet.store.run_model",
)


@cache
def _rules() -> bytes:
    """A digest of the code that claims: claims kept by another release are never read."""
    h = hashlib.sha256(b"kept claims\n")
    for name in _RULES:
        source = importlib.import_module(name).__file__
        assert source is not None
        h.update(Path(source).read_bytes())
    return h.digest()


def key(run_id: str, lo: datetime, hi: datetime, max_gap_s: float, source: str) -> bytes:
    """The key of run ``run_id``'s claims over [lo, hi), priced with ``max_gap_s`` and ``source``."""
    h = hashlib.sha256(_rules())
    h.update(f"{max_gap_s!r}|{source}\n{run_id}\t{lo.isoformat()}\t{hi.isoformat()}\n".encode())
    return h.digest()


#: Bytes of a digest of pieces (SHA-256): a run's are stored end to end, in the order of its keys.
_DIGEST = 32


@dataclass(frozen=True)
class Kept:
    """A run's kept claims: its incidents with GPU-time in the window, and each priced key's digest."""

    incidents: int
    pieces: dict[str, bytes]


def lookup(conn: psycopg.Connection, keys: Mapping[str, bytes]) -> dict[str, Kept]:
    """The kept claims of each run of ``keys`` (run id -> :func:`key`) whose marks are all current."""
    if not keys:
        return {}
    run_of = {k: rid for rid, k in keys.items()}
    out: dict[str, Kept] = {}
    for digest, n, names, pieces in conn.execute(S.CLAIMS_LOOKUP_SQL, {"keys": list(keys.values())}):
        cut = [bytes(pieces[i : i + _DIGEST]) for i in range(0, len(pieces), _DIGEST)]
        out[run_of[bytes(digest)]] = Kept(int(n), dict(zip(names, cut, strict=True)))
    return out


def marks(conn: psycopg.Connection, run_ids: Collection[str]) -> dict[str, priced_store.Marks]:
    """The current marks of the runs' incidents and of the runs, read before they are claimed."""
    if not run_ids:
        return {}
    return priced_store.marks_of(conn, {rid: (f"i:{rid}", f"r:{rid}") for rid in run_ids})


@dataclass(frozen=True)
class Fill:
    """One run's claims to keep."""

    run: Run
    key: bytes
    marks: priced_store.Marks
    kept: Kept


def keep(conn: psycopg.Connection, fills: Sequence[Fill]) -> None:
    """Store ``fills`` whose run in the snapshot is the run they were claimed over, now or when the
    caller's read-only snapshot ends."""
    if not fills:
        return
    same = {r.run_id: r for r in load_runs(conn, [f.run.run_id for f in fills])}
    values = [
        (
            f.key,
            f.run.run_id,
            f.run.start,
            f.run.end,
            list(f.marks.scopes),
            list(f.marks.versions),
            f.kept.incidents,
            list(f.kept.pieces),
            b"".join(f.kept.pieces.values()),
            f.run.start,
        )
        for f in fills
        if same.get(f.run.run_id) == f.run
    ]
    priced_store.keep_rows(conn, S.CLAIMS_INSERT_SQL, values)
