"""Freed heap pages go back to the OS after a sweep (glibc only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet.collector.heap import _malloc_trim

PROBE = r"""
import psutil, numpy as np
from gpufleet.collector.heap import release_free_memory
rss = lambda: psutil.Process().memory_info().rss / 2**20
# 1,000 arrays of 100 KB (below glibc's mmap threshold, so on the heap); all
# but the newest freed: the heap top stays in use, so free() alone keeps the pages.
arrays = [np.ones(100_000 // 8) for _ in range(1000)]
keep = arrays[-1]
del arrays
before = rss()
assert release_free_memory()
print(before, rss())
"""


@pytest.mark.skipif(_malloc_trim() is None, reason="not glibc: nothing to trim with")
def test_release_gives_freed_heap_pages_back() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    before, after = map(float, out.split())
    assert before - after > 60, (before, after)  # ~95 MB were free inside the heap
