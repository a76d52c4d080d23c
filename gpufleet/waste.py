"""Which state a lost GPU-second is in, and which incident explains it: one rule.

Several incident kinds can claim the same GPU-seconds (a checkpoint pause looks
like input starvation to a detector that sees only the utilisation sawtooth; a
checkpoint's writer rank looks like a straggler to its peers).  A person reads
one explanation per lost second, and a ledger must put each second in exactly
one state, so both ask this module:

* :data:`STATE_OF_KIND` maps the incident kinds that account for GPU time to
  the ledger state they put it in; health kinds (PCIe, NVLink, GPU memory,
  host configuration) are causes, not states of time, and map to nothing.
* :data:`PRECEDENCE` orders the states, most specific explanation first: a GPU
  that does no work at all is ``idle`` whatever else is said of it; a run stuck
  in a collective is ``hung``; a pause the run spends writing its state is a
  ``checkpoint``, never ``starved``; a GPU waiting on its input is ``starved``
  before it is waiting on a slow peer (``straggler_wait``) or slowed by its own
  clocks (``throttled``).  What no incident claims is ``productive``.

The detectors' arbitration (:func:`explaining_kind`) and the accounting ledger
(:func:`state_of`) both read this order, so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

#: Ledger states, in the order the contract lists them (docs/contracts.md, section 3).
STATES: Final = ("productive", "idle", "hung", "starved", "checkpoint", "straggler_wait", "throttled")

#: Incident kind -> the ledger state of the GPU-time it claims.
STATE_OF_KIND: Final[dict[str, str]] = {
    "idle_allocation": "idle",
    "hung_collective": "hung",
    "checkpoint_stall": "checkpoint",
    "starvation": "starved",
    "straggler": "straggler_wait",
    "throttling": "throttled",
}

#: Lost states, most specific explanation first; ``productive`` is what is left.
PRECEDENCE: Final = ("idle", "hung", "checkpoint", "starved", "straggler_wait", "throttled")

_RANK: Final = {state: i for i, state in enumerate(PRECEDENCE)}


def state_of(kind: str) -> str | None:
    """The ledger state an incident of ``kind`` puts GPU-time in, or None for health kinds."""
    return STATE_OF_KIND.get(kind)


def rank(kind: str) -> int | None:
    """Position of ``kind`` in :data:`PRECEDENCE` (0 explains first), or None for health kinds."""
    state = STATE_OF_KIND.get(kind)
    return None if state is None else _RANK[state]


def explaining_kind(kinds: Iterable[str]) -> str | None:
    """Of incident kinds claiming the same GPU-seconds, the one that explains them (None if none accounts for time)."""
    best: tuple[int, str] | None = None
    for kind in kinds:
        r = rank(kind)
        if r is not None and (best is None or r < best[0]):
            best = (r, kind)
    return None if best is None else best[1]


def outranks(kind: str, other: str) -> bool:
    """True when ``kind`` explains seconds that ``other`` also claims (so ``other`` must not fire there)."""
    a, b = rank(kind), rank(other)
    return a is not None and b is not None and a < b
