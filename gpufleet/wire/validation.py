"""Validation: one checked path from a parsed document to typed columns.

Columns are checked as whole numpy arrays: one type scan, one conversion, one
range comparison per column.  Only when something is wrong does a slow pass
look for the first offending sample, to name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from gpufleet.catalog import GPU_ALIASES, GPU_BY_NAME, HOST_BY_NAME, INT_RANGES, Field
from gpufleet.facts import FactsError, check_facts, plain_json
from gpufleet.wire.encoding import TYPED_DTYPES
from gpufleet.wire.types import (
    BATCH_ID_RE,
    MAX_TEXT,
    NODE_RE,
    TOP_LEVEL,
    Batch,
    Column,
    Columns,
    WireError,
    WrongNode,
)

_NONE = type(None)
_NUMERIC_TYPES = frozenset({int, float, _NONE})
_NP_INT = {"smallint": np.int64, "integer": np.int64, "bigint": np.int64}


def _columns(
    obj: Any, section: str, known: dict[str, Field], key: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """Normalise a section (columns or rows) to columns, checking names and lengths; a
    column sent under an older catalog name (``catalog.GPU_ALIASES``) takes its current one."""
    cols, n = _raw_columns(obj, section, known, key)
    if section == "gpu":
        for old, new in GPU_ALIASES.items():
            if old in cols:
                if new in cols:
                    raise WireError(f"also sent as {new!r}: give one of the two names", (section, old))
                cols[new] = cols.pop(old)
    return cols, n


def _raw_columns(
    obj: Any, section: str, known: dict[str, Field], key: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    if obj is None:
        return {}, 0
    if section == "gpu":
        known = {**known, **{old: known[new] for old, new in GPU_ALIASES.items()}}
    if isinstance(obj, list):
        cols: dict[str, list[Any]] = {}
        n = len(obj)
        for i, row in enumerate(obj):
            if not isinstance(row, dict):
                raise WireError("must be an object of field values", (section, i))
            for name in row:
                if name not in known and name not in key and name != "node":
                    raise WireError("unknown field", (section, i, name))
                if name not in cols:
                    cols[name] = [None] * n
            for name, v in row.items():
                cols[name][i] = v
        return cols, n
    if isinstance(obj, dict):
        n = -1
        out: dict[str, Any] = {}
        for name, col in obj.items():
            if not isinstance(name, str) or (name not in known and name not in key and name != "node"):
                raise WireError("unknown field", (section, name))
            if isinstance(col, dict):
                col = _typed(section, name, col)
            elif not isinstance(col, list):
                raise WireError("column must be a list or a typed array", (section, name))
            if n == -1:
                n = len(col)
            elif len(col) != n:
                raise WireError(f"column has {len(col)} values, others have {n}", (section, name))
            out[name] = col
        return out, max(n, 0)
    raise WireError("must be a list of samples or an object of columns", (section,))


class Typed:
    """A decoded typed-array column: values (float64 or int64) and NULL mask."""

    __slots__ = ("null", "values")

    def __init__(self, values: np.ndarray, null: np.ndarray | None) -> None:
        self.values = values
        self.null = null

    def __len__(self) -> int:
        return len(self.values)

    def tolist(self) -> list[Any]:
        vals: list[Any] = self.values.tolist()
        if self.null is not None:
            for i in np.flatnonzero(self.null).tolist():
                vals[i] = None
        return vals


def _typed(section: str, name: str, col: dict[str, Any]) -> Typed:
    extra = set(col) - {"dtype", "data", "nulls"}
    if extra:
        raise WireError(f"typed array has unknown keys {sorted(extra)}", (section, name))
    dt = col.get("dtype")
    dtype = TYPED_DTYPES.get(dt) if isinstance(dt, str) else None
    data = col.get("data")
    if dtype is None:
        raise WireError(f"typed array dtype must be one of {', '.join(TYPED_DTYPES)}", (section, name))
    if not isinstance(data, bytes) or len(data) % np.dtype(dtype).itemsize:
        raise WireError(
            f"typed array data must be bytes, a multiple of {np.dtype(dtype).itemsize}", (section, name)
        )
    values = np.frombuffer(data, dtype=dtype)
    null = None
    nulls = col.get("nulls")
    if nulls is not None:
        if not isinstance(nulls, bytes) or len(nulls) != (len(values) + 7) // 8:
            raise WireError("typed array nulls must be a bitmap of one bit per value", (section, name))
        null = np.unpackbits(np.frombuffer(nulls, dtype=np.uint8), count=len(values)).astype(bool)
        if not null.any():
            null = None
    return Typed(values, null)


#: The largest finite float4: a larger value in a ``real`` column would be stored as infinity.
FLOAT4_MAX = float(np.finfo(np.float32).max)


def _real_bounds(kind: str, lo: float | None, hi: float | None) -> tuple[float | None, float | None]:
    """``real`` columns also bound by float4's finite range (1e300 must not become inf)."""
    if kind != "real":
        return lo, hi
    return (-FLOAT4_MAX if lo is None else max(lo, -FLOAT4_MAX)), (
        FLOAT4_MAX if hi is None else min(hi, FLOAT4_MAX)
    )


def _check_typed(
    section: str, name: str, col: Typed, kind: str, lo: float | None, hi: float | None, required: bool
) -> Column:
    lo, hi = _real_bounds(kind, lo, hi)
    v, null = col.values.astype(np.float64 if col.values.dtype.kind == "f" else np.int64), col.null
    if required and null is not None:
        raise WireError("is required", (section, int(np.flatnonzero(null)[0]), name))
    valid = np.ones(len(v), dtype=bool) if null is None else ~null
    if kind in INT_RANGES:
        ilo, ihi = INT_RANGES[kind]
        lo = ilo if lo is None else max(lo, ilo)
        hi = ihi if hi is None else min(hi, ihi)
        if v.dtype.kind == "f":
            bad = valid & ~(np.isfinite(v) & (v == np.round(v)))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise WireError(f"must be an integer, got {v[i]!r}", (section, i, name))
            v = v.astype(np.int64)
    elif v.dtype.kind != "f":
        v = v.astype(np.float64)
    else:
        bad = valid & ~np.isfinite(v)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise WireError(f"{v[i]!r} is not allowed (use null for a missing value)", (section, i, name))
    with np.errstate(invalid="ignore"):
        out = valid & (((v < lo) if lo is not None else False) | ((v > hi) if hi is not None else False))
    if np.any(out):
        i = int(np.flatnonzero(out)[0])
        raise WireError(f"{v[i]} is outside [{lo}, {hi}]", (section, i, name))
    if null is not None:
        v = v.copy()
        v[null] = 0
    return Column(v, null)


def _first(col: list[Any], pred: Any) -> int:
    for i, v in enumerate(col):
        if pred(v):
            return i
    return -1


def _numeric(
    section: str, name: str, col: list[Any], kind: str, lo: float | None, hi: float | None, required: bool
) -> Column:
    lo, hi = _real_bounds(kind, lo, hi)
    types = set(map(type, col))
    if not types <= _NUMERIC_TYPES:
        i = _first(col, lambda v: type(v) not in _NUMERIC_TYPES)
        raise WireError(f"must be a number or null, got {type(col[i]).__name__}", (section, i, name))
    has_none = _NONE in types
    if required and has_none:
        raise WireError("is required", (section, col.index(None), name))
    if kind in INT_RANGES:
        ilo, ihi = INT_RANGES[kind]
        lo = ilo if lo is None else max(lo, ilo)
        hi = ihi if hi is None else min(hi, ihi)
        if float in types:
            i = _first(col, lambda v: type(v) is float and (not math.isfinite(v) or v != int(v)))
            if i >= 0:
                raise WireError(f"must be an integer, got {col[i]!r}", (section, i, name))
        null = None
        src = col
        if has_none:
            null = np.fromiter((v is None for v in col), dtype=bool, count=len(col))
            src = [0 if v is None else v for v in col]
        try:
            arr = (
                np.array(src, dtype=np.int64)
                if float not in types
                else np.array(src, dtype=np.float64).astype(np.int64)
            )
        except OverflowError:
            arr = None
        if arr is None or (len(arr) and (arr.min() < lo or arr.max() > hi)):

            def out(v: Any) -> bool:
                return v is not None and not (lo <= v <= hi)

            i = _first(col, out)
            raise WireError(f"{col[i]} is outside [{lo}, {hi}]", (section, i, name))
        if null is not None and null.any() and len(arr):
            arr[null] = 0
        return Column(arr, null if (null is not None and null.any()) else None)
    arr = np.array(col, dtype=np.float64)  # None -> NaN
    finite = np.isfinite(arr)
    nones = col.count(None) if has_none else 0
    if len(arr) - int(finite.sum()) != nones:
        i = _first(col, lambda v: type(v) is float and not math.isfinite(v))
        raise WireError(f"{col[i]!r} is not allowed (use null for a missing value)", (section, i, name))
    if lo is not None or hi is not None:
        bad = np.zeros(len(arr), dtype=bool)
        with np.errstate(invalid="ignore"):
            if lo is not None:
                bad |= arr < lo
            if hi is not None:
                bad |= arr > hi
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise WireError(f"{col[i]} is outside [{lo}, {hi}]", (section, i, name))
    return Column(arr, ~finite if nones else None)


def _text(section: str, name: str, col: list[Any]) -> Column:
    types = set(map(type, col))
    if not types <= {str, _NONE}:
        i = _first(col, lambda v: v is not None and type(v) is not str)
        raise WireError(f"must be a string or null, got {type(col[i]).__name__}", (section, i, name))
    present = col if _NONE not in types else [v for v in col if v is not None]
    if present and (max(map(len, present)) > MAX_TEXT or "\x00" in "".join(present)):
        i = _first(col, lambda v: v is not None and (len(v) > MAX_TEXT or "\x00" in v))
        raise WireError(f"must be at most {MAX_TEXT} characters without NUL", (section, i, name))
    null = None
    if _NONE in types:
        null = np.fromiter((v is None for v in col), dtype=bool, count=len(col))
    return Column(col, null)


_FLOAT_KINDS = frozenset({"real", "double"})


def _typed_group(
    names: list[str], cols: dict[str, Any], known: dict[str, Field], as_int: bool
) -> dict[str, Column] | None:
    """Typed columns without NULLs, checked as one 2-D array (None: look closer)."""
    if not names:
        return {}
    m = np.vstack([cols[n].values for n in names]).astype(np.int64 if as_int else np.float64, copy=False)
    lo, hi = _bounds(tuple(names), known, as_int)
    ok = ((m >= lo) & (m <= hi)).all() if as_int else (np.isfinite(m) & (m >= lo) & (m <= hi)).all()
    if not ok:
        return None
    return {n: Column(m[i]) for i, n in enumerate(names)}


def _fast_group(
    section: str, names: list[str], cols: dict[str, list[Any]], known: dict[str, Field], as_int: bool
) -> dict[str, Column] | None:
    """Validate same-kind columns without NULLs as one 2-D array.

    Returns None when anything is unusual (a type, a bound, an overflow); the
    caller then checks column by column, which names the offending sample.
    """
    if not names:
        return {}
    lists = [cols[n] for n in names]
    types = set(map(type, chain.from_iterable(lists)))
    if not types <= ({int} if as_int else {int, float}):
        return None
    try:
        m = np.array(lists, dtype=np.int64 if as_int else np.float64)
    except (OverflowError, ValueError):
        return None
    lo, hi = _bounds(tuple(names), known, as_int)
    if as_int:
        ok = bool(((m >= lo) & (m <= hi)).all())
    else:
        ok = bool((np.isfinite(m) & (m >= lo) & (m <= hi)).all())
    if not ok:
        return None
    return {n: Column(m[i]) for i, n in enumerate(names)}


_BOUNDS: dict[tuple[tuple[str, ...], bool], tuple[np.ndarray, np.ndarray]] = {}


def _bounds(names: tuple[str, ...], known: dict[str, Field], as_int: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-column (lo, hi) as column vectors, cached per column set."""
    hit = _BOUNDS.get((names, as_int))
    if hit is None:
        dt = np.int64 if as_int else np.float64
        hit = (
            np.array([_lo(known[n]) for n in names], dtype=dt)[:, None],
            np.array([_hi(known[n]) for n in names], dtype=dt)[:, None],
        )
        if len(_BOUNDS) < 4096:
            _BOUNDS[(names, as_int)] = hit
    return hit


def _lo(f: Field) -> float:
    base = INT_RANGES[f.kind][0] if f.kind in INT_RANGES else -FLOAT4_MAX if f.kind == "real" else -np.inf
    return base if f.lo is None else max(f.lo, base)


def _hi(f: Field) -> float:
    base = INT_RANGES[f.kind][1] if f.kind in INT_RANGES else FLOAT4_MAX if f.kind == "real" else np.inf
    return base if f.hi is None else min(f.hi, base)


_TIME = Field("time", "double", "s", "sample time", lo=0, hi=4102444800.0)
_GPU = Field("gpu", "smallint", "", "GPU index", lo=0)


def _check_section(
    section: str, cols: dict[str, Any], n: int, node: str, known: dict[str, Field], key: tuple[str, ...]
) -> dict[str, Column]:
    if n == 0:
        return {}
    for k in key:
        if k not in cols:
            raise WireError("is required", (section, 0, k))
    node_col = cols.pop("node", None)
    if isinstance(node_col, Typed):
        raise WireError("a text column cannot be a typed array", (section, "node"))
    if node_col is not None:
        i = _first(node_col, lambda v: v != node)
        if i >= 0:
            raise WrongNode(f"sample names node {node_col[i]!r}, batch is for {node!r}", (section, i, "node"))
    fields = {"time": _TIME, **({"gpu": _GPU} if "gpu" in key else {})}
    for name in cols:
        if name not in fields:
            fields[name] = known[name]
    out: dict[str, Column] = {}
    floats, ints = [], []
    typed_floats: list[str] = []
    typed_ints: list[str] = []
    for name, f in fields.items():
        col = cols[name]
        if isinstance(col, Typed):
            if f.kind == "text":
                raise WireError("a text column cannot be a typed array", (section, name))
            if col.null is None and f.kind in _FLOAT_KINDS:
                typed_floats.append(name)
            elif col.null is None and col.values.dtype.kind != "f":
                typed_ints.append(name)
            else:
                out[name] = _check_typed(section, name, col, f.kind, f.lo, f.hi, name in key)
            continue
        if f.kind == "text":
            out[name] = _text(section, name, col)
            continue
        nulls = col.count(None)
        if nulls == n and name not in key:
            out[name] = Column(
                np.zeros(n, dtype=np.float64 if f.kind in _FLOAT_KINDS else np.int64), np.ones(n, dtype=bool)
            )
        elif nulls:
            out[name] = _numeric(section, name, col, f.kind, f.lo, f.hi, name in key)
        elif f.kind in _FLOAT_KINDS:
            floats.append(name)
        else:
            ints.append(name)
    for group, as_int in ((typed_floats, False), (typed_ints, True)):
        checked = _typed_group(group, cols, fields, as_int)
        if checked is None:
            checked = {
                n: _check_typed(section, n, cols[n], fields[n].kind, fields[n].lo, fields[n].hi, n in key)
                for n in group
            }
        out.update(checked)
    for group, as_int in ((floats, False), (ints, True)):
        fast = _fast_group(section, group, cols, fields, as_int)
        if fast is None:
            fast = {
                n: _numeric(section, n, cols[n], fields[n].kind, fields[n].lo, fields[n].hi, n in key)
                for n in group
            }
        out.update(fast)
    return out


def validate(doc: Any) -> Batch:
    """Check a parsed batch against the catalog; raise WireError naming the spot."""
    if not isinstance(doc, dict):
        raise WireError("batch must be an object", ("body",))
    for k in doc:
        if k not in TOP_LEVEL:
            raise WireError("unknown field", (k,))
    batch_id = doc.get("batch_id")
    if not isinstance(batch_id, str) or not BATCH_ID_RE.fullmatch(batch_id):
        raise WireError("is required: 1-128 characters of [A-Za-z0-9._:-]", ("batch_id",))
    node = doc.get("node")
    if not isinstance(node, str) or not NODE_RE.fullmatch(node):
        raise WireError("is required: a host name of [A-Za-z0-9._-]", ("node",))
    facts = doc.get("facts")
    if facts is not None:
        try:
            check_facts(facts)
        except FactsError as e:
            raise WireError(e.msg, e.loc) from None
    _check_agent(doc.get("agent"))
    gpu, ng = _section(doc.get("gpu"), "gpu", node, GPU_BY_NAME, ("time", "gpu"))
    host, nh = _section(doc.get("host"), "host", node, HOST_BY_NAME, ("time",))
    return Batch(batch_id=batch_id, node=node, gpu=gpu, host=host, facts=facts, n_gpu=ng, n_host=nh)


def _section(
    obj: Any, section: str, node: str, known: dict[str, Field], key: tuple[str, ...]
) -> tuple[dict[str, Column], int]:
    fast = _typed_section_fast(section, obj, known, key)
    if fast is not None:
        return fast
    cols, n = _columns(obj, section, known, key)
    return _check_section(section, cols, n, node, known, key), n


def _check_agent(agent: Any) -> None:
    """``agent`` (the sender's own counters) is not stored, but is bounded like facts."""
    if agent is None:
        return
    if not isinstance(agent, dict):
        raise WireError("must be an object", ("agent",))
    try:
        plain_json(agent, "agent")
    except FactsError as e:
        raise WireError(e.msg, e.loc) from None


def drop_skewed(batch: Batch, now: float, future_s: float, past_s: float) -> Batch:
    """Remove samples outside [now - past_s, now + future_s]; count them.

    Every sample's time is read here anyway, so the range of those kept is noted
    on the batch (:attr:`Batch.span`) for the writer, which needs it twice."""
    lo, hi = now - past_s, now + future_s
    rejected = 0
    spans = []
    for section in ("gpu", "host"):
        cols: dict[str, Column] = getattr(batch, section)
        if not cols:
            continue
        t = cols["time"].values
        first, last = float(t.min()), float(t.max())
        if lo <= first and last <= hi:
            spans.append((first, last))
            continue
        keep = (t >= lo) & (t <= hi)
        rejected += int((~keep).sum())
        idx = np.flatnonzero(keep)
        setattr(batch, section, {k: c.take(idx) for k, c in cols.items()} if len(idx) else {})
        setattr(batch, f"n_{section}", len(idx))
        if len(idx):
            spans.append((float(t[idx].min()), float(t[idx].max())))
    batch.rejected_skew = rejected
    batch.span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    return batch


# ----------------------------------------------------------------------------
# The agents' form, checked a section at a time
#
# An agent sends every numeric column as a typed array, the same columns batch
# after batch.  What a set of column names means (their catalog fields, which
# are floats and which integers, their bounds) is worked out once per set and
# kept; a batch then costs one ``frombuffer`` and one range comparison per
# dtype, not per column.  Anything unusual (a NULL bitmap in a key column, an
# integer column sent as floats, a list where a typed array was expected, a
# bound crossed) leaves the section to the column-by-column path above, which
# names the offending sample exactly as before.


@dataclass(frozen=True)
class _Plan:
    """What a section's column names mean: per wire name, (wire name, output
    name, field, kind code: 0 float, 1 integer, 2 text; is it a key column)."""

    items: tuple[tuple[str, str, Field, int, bool], ...]
    #: Per tuple of wire dtypes (None: a column checked on its own), where its columns go
    #: (None: not this path's to check).
    layouts: dict[tuple[Any, ...], _Layout | None] = field(default_factory=dict, compare=False, hash=False)


_PLANS: dict[tuple[str, tuple[str, ...]], _Plan | None] = {}


def _plan(
    section: str, names: tuple[str, ...], known: dict[str, Field], key: tuple[str, ...]
) -> _Plan | None:
    hit = _PLANS.get((section, names), False)
    if hit is not False:
        return hit  # type: ignore[return-value]
    plan: _Plan | None = None
    aliases = GPU_ALIASES if section == "gpu" else {}
    outs = tuple(aliases.get(n, n) for n in names)
    base = {"time": _TIME, **({"gpu": _GPU} if "gpu" in key else {})}
    if (
        all(k in names for k in key)
        and "node" not in names
        and len(set(outs)) == len(outs)
        and all(isinstance(n, str) and (n in base or aliases.get(n, n) in known) for n in names)
    ):
        items = []
        for n, o in zip(names, outs, strict=True):
            f = base[n] if n in base else known[o]
            code = 2 if f.kind == "text" else 0 if f.kind in _FLOAT_KINDS else 1
            items.append((n, o, f, code, n in key))
        plan = _Plan(tuple(items))
    if len(_PLANS) < 4096:
        _PLANS[(section, names)] = plan
    return plan


def _typed_section_fast(
    section: str, obj: Any, known: dict[str, Field], key: tuple[str, ...]
) -> tuple[dict[str, Column], int] | None:
    """The section's validated columns and length, or None: check it the slow way."""
    if type(obj) is not dict or not obj:
        return None
    plan = _plan(section, tuple(obj), known, key)
    if plan is None:
        return None
    cols = list(obj.values())  # in the plan's order: the plan is keyed by these names
    # A typed column is a dict of exactly dtype and data; anything else (text, a
    # column with NULLs, a malformed one) is checked on its own below.
    dts = tuple([c.get("dtype") if type(c) is dict and len(c) == 2 else None for c in cols])
    try:
        lay = plan.layouts[dts]
    except KeyError:
        lay = _layout(plan, dts, key)
    except TypeError:
        return None  # a dtype that is not even hashable (a list, a map): the slow path names it
    if lay is None:
        return None
    datas = [cols[i].get("data") for i in lay.typed]
    if datas:
        if not all([type(d) is bytes for d in datas]):
            return None
        n, rest = divmod(len(datas[0]), lay.itemsizes[0])
        if rest or list(map(len, datas)) != [n * size for size in lay.itemsizes]:
            return None
    else:
        n = -1
    own: dict[str, Column] = {}
    for i in lay.own:
        name, oname, f, code, is_key = plan.items[i]
        col = cols[i]
        try:
            if type(col) is list and code == 2:
                checked = _text(section, name, col)
            elif type(col) is dict and "nulls" in col and code != 2 and not is_key:
                checked = _check_typed(section, oname, _typed(section, name, col), f.kind, f.lo, f.hi, False)
            else:
                return None
        except WireError:
            return None  # the slow path names it, in its own order
        if n != -1 and len(checked) != n:
            return None
        n = len(checked)
        own[oname] = checked
    if n <= 0:
        return None
    floats = np.empty((lay.n_float, n), dtype=np.float64)
    ints = np.empty((lay.n_int, n), dtype=np.int64)
    for dtype, idx, as_int, a, b in lay.groups:
        buf = b"".join([datas[j] for j in idx])
        (ints if as_int else floats)[a:b] = np.frombuffer(buf, dtype=dtype).reshape(b - a, n)
    # Bounds of unbounded floats are the largest finite double, so one pair of
    # comparisons also refuses NaN and the infinities, as isfinite would.
    if lay.n_float and not bool(((floats >= lay.float_lo) & (floats <= lay.float_hi)).all()):
        return None
    if lay.n_int and not bool(((ints >= lay.int_lo) & (ints <= lay.int_hi)).all()):
        return None
    rows = (list(floats), list(ints))
    out = {oname: own[oname] if row < 0 else Column(rows[as_int][row]) for oname, as_int, row in lay.order}
    return Columns(out, ((floats, lay.float_names), (ints, lay.int_names))), n


@dataclass(frozen=True)
class _Layout:
    """Where a section's columns go, for one plan and one tuple of wire dtypes:
    typed float columns become rows of one float64 matrix, typed integer columns
    rows of one int64 matrix, each dtype's columns adjacent so they are copied
    in one step; the other columns are checked one by one."""

    #: Plan positions of the typed columns, and each one's bytes per value.
    typed: tuple[int, ...]
    itemsizes: tuple[int, ...]
    #: Plan positions of the columns checked on their own.
    own: tuple[int, ...]
    #: (numpy dtype, positions in ``typed``, into the integer matrix?, first row, end row)
    groups: tuple[tuple[str, tuple[int, ...], int, int, int], ...]
    n_float: int
    n_int: int
    float_lo: np.ndarray
    float_hi: np.ndarray
    int_lo: np.ndarray
    int_hi: np.ndarray
    #: (output name, 1: the integer matrix, 0: the float one; row, -1 for a column checked on its own)
    order: tuple[tuple[str, int, int], ...]
    #: The output name of each row of the float matrix, and of the integer one.
    float_names: tuple[str, ...]
    int_names: tuple[str, ...]


_DOUBLE_MAX = float(np.finfo(np.float64).max)


def _layout(plan: _Plan, dts: tuple[Any, ...], key: tuple[str, ...]) -> _Layout | None:
    """The layout for these dtypes, or None when one is unknown or wrong for its
    column (an integer field sent as floats): the slow path names it."""
    lay: _Layout | None = None
    typed = [i for i, dt in enumerate(dts) if dt is not None]
    if all(
        type(dts[i]) is str
        and dts[i] in TYPED_DTYPES
        and plan.items[i][3] != 2
        and not (plan.items[i][3] == 1 and dts[i][0] == "f")
        for i in typed
    ):
        by_group: dict[tuple[str, bool], list[int]] = {}
        for j, i in enumerate(typed):
            by_group.setdefault((dts[i], plan.items[i][3] == 1), []).append(j)
        groups = []
        rows: dict[int, tuple[int, int]] = {}
        bounds: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
        for (dt, as_int), idx in by_group.items():
            lo, hi = bounds[as_int]
            a = len(lo)
            for j in idx:
                f = plan.items[typed[j]][2]
                rows[typed[j]] = (int(as_int), len(lo))
                lo.append(_lo(f) if as_int else max(_lo(f), -_DOUBLE_MAX))
                hi.append(_hi(f) if as_int else min(_hi(f), _DOUBLE_MAX))
            groups.append((TYPED_DTYPES[dt], tuple(idx), int(as_int), a, len(lo)))
        wire_names = [item[0] for item in plan.items]
        order = [
            *(wire_names.index(k) for k in key),
            *(i for i, item in enumerate(plan.items) if not item[4]),
        ]
        lay = _Layout(
            typed=tuple(typed),
            itemsizes=tuple(_ITEMSIZE[dts[i]] for i in typed),
            own=tuple(i for i, dt in enumerate(dts) if dt is None),
            groups=tuple(groups),
            n_float=len(bounds[False][0]),
            n_int=len(bounds[True][0]),
            float_lo=np.array(bounds[False][0], dtype=np.float64)[:, None],
            float_hi=np.array(bounds[False][1], dtype=np.float64)[:, None],
            int_lo=np.array(bounds[True][0], dtype=np.int64)[:, None],
            int_hi=np.array(bounds[True][1], dtype=np.int64)[:, None],
            order=tuple((plan.items[i][1], *rows.get(i, (0, -1))) for i in order),
            float_names=_row_names(plan, rows, 0),
            int_names=_row_names(plan, rows, 1),
        )
    if len(plan.layouts) < 64:
        plan.layouts[dts] = lay
    return lay


_ITEMSIZE = {k: np.dtype(v).itemsize for k, v in TYPED_DTYPES.items()}


def _row_names(plan: _Plan, rows: dict[int, tuple[int, int]], as_int: int) -> tuple[str, ...]:
    """Which output column each row of one matrix is."""
    placed = sorted((row, plan.items[i][1]) for i, (which, row) in rows.items() if which == as_int)
    return tuple(name for _, name in placed)


def as_lists(doc: dict[str, Any]) -> dict[str, Any]:
    """A decoded batch document with its typed arrays turned back into plain lists.

    For readers that want the batch as a document (tests, debugging a spool
    segment); the collector never needs it, it validates typed arrays directly.
    """
    out = dict(doc)
    for section in ("gpu", "host"):
        cols = doc.get(section)
        if isinstance(cols, dict):
            out[section] = {name: column_list(section, name, col) for name, col in cols.items()}
    return out


def column_list(section: str, name: str, col: Any) -> list[Any]:
    """One wire column as a list, whether it travelled as a list or as a typed array."""
    return _typed(section, name, col).tolist() if isinstance(col, dict) else list(col)
