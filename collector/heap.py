"""Give freed heap memory back to the operating system after a sweep.

A new leader loads the whole detector window at once; the temporaries of
that load are freed, but glibc keeps the pages inside its heap, so a
collector that took over sat ~10 % above one that had grown its window
sample by sample, for the rest of its life (measured by ``bench/soak.py``).
``malloc_trim(0)`` returns free pages anywhere in the heap; it costs a few
milliseconds when there are ~100 MB to hand back (``tests/collector/test_heap.py``'s
probe: 6 ms) and next to nothing when there are none (median under 1 us,
max 4 us over 50 calls beside 100 MB of live arrays).  The sweeper calls it
after a sweep that loaded the window (:data:`gpufleet.collector.sweep.LOAD_SHARE`),
not after every sweep: a steady sweep's scratch is the same from one sweep
to the next, and pages handed back would only be faulted in again.
Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_memory() -> bool:
    """Return free heap pages to the OS; False where the C library cannot."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
