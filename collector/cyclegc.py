"""Python's cyclic garbage collector in the server processes: settled once
the collector or the API is built, held off while a sweep runs.

**Settled at start.**  Everything built at start-up (modules, the app, the
settings, pydantic's schemas: about 92,000 tracked objects in a freshly built
collector or API, 150,000 in a collector serving 8,000 GPUs) lives as long
as the process, and every full collection traversed all of it again (22 and
24 ms for the freshly built collector and API on an idle machine).  On
Python's defaults (a young collection every 700 container allocations more
than frees) a collector taking 8,000 GPUs' batches collected a dozen times a
second and spent 8 % of its CPU doing so, half of it in the full collections,
each of which held the event loop for about 0.1 s.  :func:`settle` freezes
what start-up built (the collections skip it from then on) and raises the
young threshold: request handling frees nearly all it allocates by reference
counting, so collections come rarely and find little.  In the same fleet,
one collection in 30 s instead of about 400, and 4 to 17 % less collector
CPU per GPU-sample in three paired runs (``bench/vs_prometheus.py --only
gpufleet --fleets 8000``, with ``GPUFLEET_GC_YOUNG_THRESHOLD=0`` as
the baseline; ``gc_collections_in_window``).

**Paused during a sweep.**

A steady sweep of 10,000 GPUs builds and drops tens of thousands of small
container objects (a series and its column dict per GPU, the detectors'
per-run lists).  Every 700 more of them alive than before set off a
young-generation collection, every tenth of those an older one, and so a
sweep of about a second set off full collections of the whole interpreter
heap: 0.15 s of collecting per sweep at 10,000 GPUs, 0.18 s with the
collections between sweeps; with the pause, none inside the sweep and
0.04 s in all (``bench/sweep.py``: ``gc_unpaused_s``, ``gc_unpaused_all_s``,
``gc_s``, ``gc_all_s``).  Nearly all of that garbage is freed by reference
counting the moment it is dropped; the rare cycles wait for the first
collection after the sweep, which the allocations counted during the pause
set off at once.

Pauses nest and may overlap between threads: the collector is enabled again
when the last one ends, and only if it was enabled when the first began (an
application that turned it off keeps it off).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block (see the module doc)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def settle(young_threshold: int) -> None:
    """Freeze what exists now out of later collections and collect the young
    generation only after ``young_threshold`` net container allocations
    (see the module doc); 0 leaves the collector as Python set it.

    Called once, by the collector's and the API's commands after the app is
    built and before it serves, never by code that shares a process with
    other work (tests): it changes the whole interpreter.
    """
    if young_threshold <= 0:
        return
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
