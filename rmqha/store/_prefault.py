# -*- test-case-name: tests.test_prefault -*-
"""
Faulting in the pages ahead of the put position, off the put thread.

The first write to each page of a fresh, fallocated segment is a page fault
in which the kernel zeroes the page (about 1.3-1.9 us a page on the 2-core
VM of docs/benchmarks.md, 0.3-1.0 us of every 1 KiB put, with a wide spread
under load).  RocketMQ warms a whole new segment (C{warmMapedFileEnable})
by writing it; here the accelerator's C{Prefault} keeps the pages from the
put position to L{AHEAD} bytes past it faulted in, writable, on a C thread
of its own that never takes the GIL (C{madvise(MADV_POPULATE_WRITE)}, 1 MiB
per call, no byte written).  The puts then find their pages present.  The
CPU is the same (the kernel still zeroes every page); what moves is where
it is paid: not on the put thread, the reactor's.  (A Python worker thread
was tried first: every chunk it finished had to take the GIL back from the
put thread, and on a loaded machine a descheduled worker holding the GIL
stalled the puts for milliseconds.)

Bounded: at most 2 x L{AHEAD} bytes past the put position, one chunk in
flight, one thread per commit log, started by its first put.  Without the
accelerator (C{RMQHA_PURE=1}), or on a kernel without
C{MADV_POPULATE_WRITE} (before Linux 5.14), it does nothing and the puts
fault their pages in as before.
"""

from __future__ import annotations

import mmap
from typing import Protocol

from rmqha.store import _record

__all__ = ["Prefaulter", "AHEAD", "prefaulter"]

#: How far past the put position the pages are kept faulted in (asked for
#: up to twice this, again once a put is this far past the last ask).
AHEAD = 4 << 20


class Engine(Protocol):
    """
    What populates: the accelerator's C{Prefault} (tests give a fake).
    """

    def ask(self, mm: mmap.mmap, position: int, target: int) -> bool: ...

    def release(self) -> None: ...

    def stop(self) -> None: ...


class Prefaulter:
    """
    One commit log's pre-faulting.  The put thread calls L{ahead} when a
    put passes L{ask_at}; whoever unmaps or closes the mapping being
    populated calls L{release} first; L{stop} at close.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: The position in the segment past which a put asks for more (so
        #: that a put costs one comparison).
        self.ask_at = 0

    def ahead(self, mm: mmap.mmap, position: int, size: int) -> None:
        """
        The put position in the segment mapped by C{mm} (of C{size} bytes)
        is C{position}: keep the pages up to L{AHEAD} past it faulted in.
        """
        target = min(size, position + 2 * AHEAD)
        try:
            if target < size and self.engine.ask(mm, position, target):
                self.ask_at = position + AHEAD
                return
            if target >= size:
                self.engine.ask(mm, position, size)
        except (ValueError, TypeError, BufferError, OSError):
            # (A put has already written its record: never fail it here.
            # A mapping the engine cannot hold is left to the puts' faults.)
            pass
        # The segment's end is asked for, or the engine cannot: no put of
        # this segment asks again.
        self.ask_at = size + 1

    def release(self) -> None:
        """
        Stop working on the current mapping, waiting for a chunk in flight
        (at most 1 MiB): call before the mapping is closed.
        """
        self.engine.release()
        self.ask_at = 0

    def stop(self) -> None:
        """
        End the thread (after any chunk in flight); idempotent.
        """
        self.engine.stop()
        self.ask_at = 0


def prefaulter() -> Prefaulter | None:
    """
    A L{Prefaulter} for a commit log's puts, or C{None} without the
    accelerator's C{Prefault} (C{RMQHA_PURE=1}, or an old build).
    """
    accel = _record._accel
    if accel is None or not hasattr(accel, "Prefault"):
        return None
    return Prefaulter(accel.Prefault())
