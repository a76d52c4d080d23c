"""The batch as both sides see it: its limits, its validated form and its errors.

Errors say *what kind* of wrong a body is (:attr:`WireError.kind`); the
collector maps kinds to HTTP statuses, so nothing here speaks HTTP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is the collector's; the agent imports this module from the light install
    import numpy as np

#: Matched with ``fullmatch``: ``$`` would let a trailing newline through.
BATCH_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,252}")
MAX_TEXT = 256
TOP_LEVEL = frozenset({"batch_id", "node", "gpu", "host", "facts", "agent"})

JSON = "application/json"
MSGPACK = "application/msgpack"


class WireError(ValueError):
    """A batch that does not validate.  ``loc`` names where (e.g. ("gpu", 17, "power_w"))."""

    #: What kind of wrong: ``invalid`` (well-formed, but not a valid batch), ``unreadable`` (not
    #: well-formed: corrupt compression, bad JSON or msgpack), ``too_large``, ``unsupported``
    #: (a content type or encoding not spoken).  The collector answers each with its own status.
    kind = "invalid"

    def __init__(self, msg: str, loc: tuple[Any, ...] = ()) -> None:
        super().__init__(msg)
        self.msg = msg
        self.loc = loc

    def detail(self) -> dict[str, Any]:
        where = ""
        if len(self.loc) >= 3 and isinstance(self.loc[1], int):
            where = f"{self.loc[0]} sample {self.loc[1]}, field '{self.loc[2]}': "
        elif len(self.loc) >= 2:
            where = f"{self.loc[0]} field '{self.loc[1]}': "
        elif self.loc:
            where = f"'{self.loc[0]}': "
        return {"loc": list(self.loc), "msg": where + self.msg}


class Unreadable(WireError):
    """The body is not well-formed: corrupt or truncated compression, invalid JSON or msgpack."""

    kind = "unreadable"


class Unsupported(WireError):
    """A Content-Type or Content-Encoding the collector does not speak."""

    kind = "unsupported"


class WrongNode(WireError):
    """A sample filed under another node than the batch (and its token) is for."""

    kind = "wrong_node"


class TooLarge(WireError):
    """Over a size or object-count bound."""

    kind = "too_large"

    def __init__(self, msg: str) -> None:
        super().__init__(msg, ())


@dataclass
class Batch:
    batch_id: str
    node: str
    #: Validated columns; every column has ``n_gpu``/``n_host`` values.
    gpu: dict[str, Column] = field(default_factory=dict)
    host: dict[str, Column] = field(default_factory=dict)
    facts: dict[str, Any] | None = None
    n_gpu: int = 0
    n_host: int = 0
    #: Samples refused by the clock-skew check, counted per node.
    rejected_skew: int = 0
    #: The samples' first and last time as :func:`gpufleet.wire.drop_skewed` left
    #: them (it reads every time anyway); whoever changes the columns after it sets
    #: this back to None.  Unset, :meth:`time_range` reads the columns.
    span: tuple[float, float] | None = field(default=None, repr=False, compare=False)

    def time_range(self) -> tuple[float, float] | None:
        if self.span is not None:
            return self.span
        parts = [c["time"].values for c in (self.gpu, self.host) if c]
        if not parts:
            return None
        return float(min(p.min() for p in parts)), float(max(p.max() for p in parts))


class Columns(dict[str, "Column"]):
    """A section's columns as validation's fast path leaves them: each numeric
    column a row of one float64 or int64 matrix, and :attr:`blocks` naming
    those matrices and their rows' columns, so a group commit can merge the
    matrices of many requests in one step each instead of merging column by
    column (:func:`gpufleet.collector.copy_binary.concat_parts`).  Any change
    made through the mapping forgets the blocks; a section built any other
    way is a plain dict and has none."""

    __slots__ = ("blocks",)

    def __init__(
        self, columns: dict[str, Column], blocks: tuple[tuple[np.ndarray, tuple[str, ...]], ...] | None = None
    ) -> None:
        super().__init__(columns)
        #: (matrix, the column each of its rows is), per matrix; None once the columns changed.
        self.blocks = blocks

    def __setitem__(self, key: str, value: Column) -> None:
        self.blocks = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.blocks = None
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self.blocks = None
        return super().pop(*args)

    def popitem(self) -> Any:
        self.blocks = None
        return super().popitem()

    def setdefault(self, *args: Any) -> Any:
        self.blocks = None
        return super().setdefault(*args)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.blocks = None
        super().update(*args, **kwargs)

    def clear(self) -> None:
        self.blocks = None
        super().clear()

    def __ior__(self, other: Any) -> Columns:  # type: ignore[override,misc]
        self.blocks = None
        return super().__ior__(other)


class Column:
    """One validated column: ``values`` (float64 or int64 ndarray, or a list of
    str/None for text) and ``null`` (bool ndarray, or None when nothing is null)."""

    __slots__ = ("lengths", "null", "values")

    def __init__(
        self, values: Any, null: np.ndarray | None = None, lengths: np.ndarray | None = None
    ) -> None:
        self.values = values
        self.null = null
        #: For text encoded as a numpy bytes array: each value's byte length.
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.values)

    def take(self, idx: np.ndarray) -> Column:
        if isinstance(self.values, list):
            return Column(
                [self.values[i] for i in idx.tolist()], None if self.null is None else self.null[idx]
            )
        return Column(self.values[idx], None if self.null is None else self.null[idx])

    def tolist(self) -> list[Any]:
        """Python values with None for NULL (tests, replay, detectors)."""
        if isinstance(self.values, list):
            return list(self.values)
        vals = self.values.tolist()
        if self.null is not None:
            import numpy as np

            for i in np.flatnonzero(self.null).tolist():
                vals[i] = None
        return vals
