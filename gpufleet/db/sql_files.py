"""The SQL the migrations and the rollup worker run, read from the checked-in files of ``gpufleet/db/sql``.

The accounting's functions, the pricing marks' triggers and the per-minute statistics' DDL are
built by Python (``accounting_sql``, ``claim_energy_sql``, ``accounting_joins_sql``, ``ledger_sql``,
``priced_store_sql``, ``stats_sql``) from shared fragments, so the text a database runs could only be
read by executing them.  ``tools/render_sql.py`` renders each statement once into a file, and what
runs is that file: a reviewer reads the exact text, and a change to a builder shows up as a diff of
the file it renders (``tests/test_sql_files.py`` fails while a file differs from its builder).

Two forms of file:

``<object>[.<form>].v<N>.sql``
    One statement (a function, a type, a table or view), byte for byte as it is executed.
``<revision>_<migration>.<upgrade|downgrade>.sql``
    The one-line statements of one migration step (DROPs, CREATE TRIGGERs), one per line, each ended
    by ``;``, in the order the step runs them.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

_CREATE = "CREATE FUNCTION"


def _folder() -> Traversable:
    return resources.files(__package__ or "gpufleet.db") / "sql"


@cache
def _read(name: str) -> str:
    # bytes, decoded without newline translation: the text is exactly the file's
    return (_folder() / f"{name}.sql").read_bytes().decode("utf-8")


def text(name: str) -> str:
    """The statement of file ``name`` (without ``.sql``), exactly as it is executed."""
    return _read(name)


def replacing(name: str) -> str:
    """The function of file ``name`` as ``CREATE OR REPLACE``: how a later migration's downgrade (or a
    re-install) puts back a text first installed with ``CREATE``; the body is the file's."""
    body = _read(name)
    if body.count(_CREATE) < 1:
        raise ValueError(f"{name}.sql creates no function")
    return body.replace(_CREATE, "CREATE OR REPLACE FUNCTION", 1)


def statements(name: str) -> tuple[str, ...]:
    """The one-line statements of a migration step's file ``name``, in order, without their ``;``."""
    lines = _read(name).splitlines()
    if not lines or not all(line.endswith(";") for line in lines):
        raise ValueError(f"{name}.sql is not one statement per line, each ended by ';'")
    return tuple(line[:-1] for line in lines)


def names() -> list[str]:
    """Every file of the folder, by name without ``.sql``, sorted."""
    return sorted(p.name[: -len(".sql")] for p in _folder().iterdir() if p.name.endswith(".sql"))
