"""Hold off Python's cyclic garbage collector while a sweep runs.

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
