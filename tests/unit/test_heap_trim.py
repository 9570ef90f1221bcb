"""The runner's heap trimmer: trims once per busy period, only after ``idle_s`` without a
step, and really releases freed memory on glibc."""

from __future__ import annotations

import ctypes.util
import time

import psutil
import pytest

from houchu.actors.heap import HeapTrimmer


def test_due_once_after_each_busy_period() -> None:
    heap = HeapTrimmer(idle_s=0.05)
    if not heap.available:
        pytest.skip("no glibc malloc_trim here")
    assert not heap.due()  # nothing ran yet
    heap.note_step()
    assert not heap.due()  # a step just ran
    time.sleep(0.06)
    assert heap.due()
    heap.trim()
    assert not heap.due() and heap.num_trims == 1  # once per busy period
    heap.note_step()
    time.sleep(0.06)
    assert heap.due()


def test_trim_gives_freed_heap_back() -> None:
    heap = HeapTrimmer()
    if not heap.available or "libc.so.6" not in (ctypes.util.find_library("c") or ""):
        pytest.skip("no glibc malloc_trim here")
    proc = psutil.Process()
    # many small blocks (below the mmap threshold) land on the heap; keep every 64th so
    # that the freed pages sit between live blocks and only a trim can return them
    blocks = [ctypes.create_string_buffer(4000) for _ in range(40_000)]  # ~160 MB
    keep = blocks[::64]
    del blocks
    before = proc.memory_info().rss
    heap.trim()
    after = proc.memory_info().rss
    assert before - after > 50 * 2**20, (before >> 20, after >> 20)
    del keep
