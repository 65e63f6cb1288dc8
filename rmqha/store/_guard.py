# -*- test-case-name: tests.test_store_faults -*-
"""
The SIGBUS guard of the segment mappings (the C code and why: the
C{_speedups.c} section "The SIGBUS guard"; docs/store.md, "A segment file
changed under the open log").

A page of a shared file mapping past the end of its file faults with
SIGBUS, whose default action kills the process: another process
truncating a segment file under the broker killed it at its next put.  Each
segment mapping is registered here when it is made; a fault inside one is
absorbed (zero pages mapped over the rest of the mapping, the access runs
again and completes) and recorded, and the store asks before it answers a
put or sends what it read.

This is not codec: it comes from the compiled module whether or not
C{RMQHA_PURE} selects the pure-Python codec.  Without the compiled module
(an install without a C compiler) nothing is guarded (L{AVAILABLE} is
false): the store's file checks still refuse writes once they see a
damaged file, but a fault before they do kills the process, as it did.
"""

from __future__ import annotations

import mmap
from typing import Any

__all__ = ["AVAILABLE", "add", "remove", "fault", "faults"]


def _load() -> Any:
    from rmqha.store import _native

    _speedups = _native.load()
    if _speedups is None:
        return None
    # (A stale build from before the guard has the codec but not this.)
    return _speedups if hasattr(_speedups, "guard_add") else None


_accel: Any = _load()

#: Whether mappings are guarded in this process.
AVAILABLE = _accel is not None


def add(mm: mmap.mmap) -> int:
    """
    Guard C{mm}; its slot, or -1 (not guarded: no compiled module, or every
    slot taken).  L{remove} it before C{mm} is closed.
    """
    if _accel is None:
        return -1
    slot: int = _accel.guard_add(mm)
    return slot


def remove(slot: int) -> None:
    """
    Stop guarding the mapping of C{slot} (a slot L{add} gave, or -1).
    """
    if slot >= 0:
        _accel.guard_remove(slot)


def fault(slot: int) -> int | None:
    """
    Where, in the mapping of C{slot}, the lowest page an access faulted on
    starts (the guard put zero pages there and after it), or C{None}.
    """
    if slot < 0:
        return None
    at: int = _accel.guard_fault(slot)
    return None if at < 0 else at


def faults() -> int:
    """
    Faults absorbed in this process so far, every mapping together: a
    cheap "anything new?" before asking each mapping.
    """
    if _accel is None:
        return 0
    count: int = _accel.guard_faults()
    return count
