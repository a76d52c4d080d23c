"""Make merged rows acceptable to the collector before they are spooled.

The collector refuses a whole batch (422, dead-lettered) when one value breaks
the catalog: a NaN, a value outside the column's bounds, an unknown field.
One bad reading must not cost five seconds of every GPU's data, so the agent
applies the same rules per value, once, at the spool's door: an unusable value
becomes ``None`` (NULL: a gap, never a made-up number) and is counted; an
unknown field is left out.  The checks mirror ``gpufleet.wire`` and read the
same catalog.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME, INT_RANGES, Field
from gpufleet.wire import MAX_TEXT

_FLOAT_KINDS = frozenset({"real", "double"})


def _ok(f: Field, v: Any) -> Any:
    """The value as the column takes it, or None when it cannot be stored."""
    if f.kind == "text":
        if not isinstance(v, str):
            return None
        return v if len(v) <= MAX_TEXT and "\x00" not in v else None
    if isinstance(v, bool):
        v = int(v)
    if not isinstance(v, int | float):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if f.kind in INT_RANGES:
        if isinstance(v, float):
            if v != int(v):
                return None
            v = int(v)
        lo, hi = INT_RANGES[f.kind]
        if not lo <= v <= hi:
            return None
    if (f.lo is not None and v < f.lo) or (f.hi is not None and v > f.hi):
        return None
    return v


class Sanitizer:
    """Cleans GPU and host rows in place; ``nulled`` counts values replaced, by field."""

    def __init__(self) -> None:
        self.nulled: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()

    def _clean(self, row: dict[str, Any], known: dict[str, Field], keep: tuple[str, ...]) -> None:
        for name in list(row):
            if name in keep:
                continue
            f = known.get(name)
            if f is None:
                del row[name]
                self.unknown[name] += 1
                continue
            v = row[name]
            if v is None:
                continue
            good = _ok(f, v)
            if good is None:
                self.nulled[name] += 1
            row[name] = good

    def gpu(self, row: dict[str, Any]) -> dict[str, Any]:
        self._clean(row, GPU_BY_NAME, ("gpu",))
        return row

    def host(self, row: dict[str, Any]) -> dict[str, Any]:
        self._clean(row, HOST_BY_NAME, ())
        return row
