"""Array parameters written as PostgreSQL array literals.

A run of 512 GPUs sends a few thousand values per query; psycopg adapts a
Python list element by element (several microseconds per timestamp), which
cost more than the queries themselves.  A literal is one string, parsed by
the server with the cast the query puts on it (``%(x)s::timestamptz[]``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text_array(values: Iterable[str]) -> str:
    return "{" + ",".join(_quoted(v) for v in values) + "}"


def int_array(values: Iterable[int]) -> str:
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def float_array(values: Iterable[float]) -> str:
    """Exact: ``repr`` of a float reads back as the same float."""
    return "{" + ",".join(repr(float(v)) for v in values) + "}"


def time_array(values: Iterable[datetime]) -> str:
    """Aware datetimes only (ISO 8601 with offset, microseconds kept)."""
    out = []
    for v in values:
        if v.tzinfo is None:
            raise ValueError("naive datetime in a timestamptz array")
        out.append('"' + v.isoformat() + '"')
    return "{" + ",".join(out) + "}"
