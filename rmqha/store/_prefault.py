# -*- test-case-name: tests.test_commitlog -*-
"""
Faulting in the pages ahead of the put position, off the put thread.

The first write to each page of a fresh, fallocated segment is a page fault
in which the kernel zeroes the page (about 1.3-1.9 us a page on the 2-core
VM of docs/benchmarks.md, 0.3-1.0 us of every 1 KiB put; its spread under
load is wide).  RocketMQ warms a new segment (C{warmMapedFileEnable}) by
writing it whole; here a daemon thread keeps the pages from the put
position to L{AHEAD} bytes past it faulted in, writable, with
C{madvise(MADV_POPULATE_WRITE)} (the accelerator's C{populate}, which
drops the GIL and writes no byte), L{CHUNK} bytes at a time.  The puts
then find their pages present.  The CPU is the same (the kernel still
zeroes every page); what moves is where it is paid: not on the put thread,
the reactor's.

Bounded: at most L{AHEAD} + L{CHUNK} bytes past the put position, one
chunk in flight, one thread per commit log, started on the first put.
Without the accelerator (C{RMQHA_PURE=1}) or on a kernel without
C{MADV_POPULATE_WRITE} it does nothing and the puts fault their pages in
as before.
"""

from __future__ import annotations

import mmap
import threading
from typing import Callable

__all__ = ["Prefaulter", "AHEAD", "CHUNK"]

#: How far past the put position the pages are kept faulted in.
AHEAD = 4 << 20
#: Bytes per C{populate} call (the longest a roll or close waits for it).
CHUNK = 1 << 20

#: Seconds the worker waits for work before it ends.
IDLE = 10.0

#: C{populate(mm, position, length) -> bytes populated (0: cannot)}.
Populate = Callable[[mmap.mmap, int, int], int]
#: Starts the worker (a daemon thread; tests run it by hand).
StartWorker = Callable[[Callable[[], None]], object]


def _daemon(run: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=run, name="rmqha-prefault", daemon=True)
    thread.start()
    return thread


class Prefaulter:
    """
    One commit log's pre-faulting.  The put thread calls L{ahead} when a
    put passes L{ask_at}; whoever unmaps or closes the mapping being
    populated calls L{release} first; L{stop} ends the worker.
    """

    def __init__(self, populate: Populate, start: StartWorker = _daemon) -> None:
        self._populate = populate
        self._start = start
        self._cond = threading.Condition()
        self._mm: mmap.mmap | None = None
        self._done = 0  # populated up to here in _mm
        self._target = 0  # ... and asked up to here
        self._busy = False
        self._stopped = False
        self._started = False
        #: False once C{populate} could not (no MADV_POPULATE_WRITE).
        self.working = True
        #: Put thread only: the position in the segment past which a put
        #: asks for more (so a put costs one comparison).
        self.ask_at = 0

    def ahead(self, mm: mmap.mmap, position: int, size: int) -> None:
        """
        The put position in the segment mapped by C{mm} (of C{size} bytes)
        is C{position}: keep the pages up to L{AHEAD} past it faulted in.
        """
        if not self.working or self._stopped:
            self.ask_at = size + 1
            return
        target = min(size, position + 2 * AHEAD)
        self.ask_at = min(size, position + AHEAD) if target < size else size + 1
        with self._cond:
            # (Pages the puts already faulted in are not asked for again.)
            page = position - position % mmap.PAGESIZE
            if self._mm is not mm:
                self._mm, self._done, self._target = mm, page, target
            else:
                self._done, self._target = max(self._done, page), max(self._target, target)
            self._cond.notify()
            start, self._started = not self._started, True
        if start:
            self._start(self._run)

    def release(self) -> None:
        """
        Stop working on the current mapping, waiting for a chunk in flight
        (at most one L{CHUNK}): call before the mapping is closed.
        """
        with self._cond:
            self._mm = None
            self._done = self._target = 0
            while self._busy:
                self._cond.wait()
        self.ask_at = 0

    def stop(self) -> None:
        """
        End the worker (after any chunk in flight); idempotent.
        """
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self.release()

    def work_once(self) -> bool:
        """
        Populate the next chunk asked for, if any (the worker's step; tests
        call it by hand).  Whether there was one.
        """
        cond = self._cond
        with cond:
            mm, start = self._mm, self._done
            if mm is None or start >= self._target or self._stopped:
                return False
            length = min(CHUNK, self._target - start)
            self._busy = True
        got = 0
        try:
            got = self._populate(mm, start, length)
        except (ValueError, OSError, BufferError):
            pass
        finally:
            with cond:
                self._busy = False
                if got <= 0:
                    # The kernel cannot (no MADV_POPULATE_WRITE): the puts
                    # fault their pages in themselves, as before.
                    self.working = False
                    self._mm = None
                elif self._mm is mm:
                    self._done = max(self._done, start + length)
                cond.notify_all()
        return True

    def _idle(self) -> bool:
        return self._mm is None or self._done >= self._target

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._stopped and self._idle():
                    if not cond.wait(IDLE) and self._idle():
                        # Idle (no puts, or a log never closed): end; the
                        # next put that asks starts another.
                        self._started = False
                        return
                if self._stopped:
                    return
            self.work_once()
