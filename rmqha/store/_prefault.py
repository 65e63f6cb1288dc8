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

Only with CPU to spare: before each ask, an L{IdleGauge} looks at how
much of the CPUs this process may use sat idle over the last L{WINDOW}
seconds (C{/proc/stat}; under a container's CPU quota, no more than the
quota left); under L{IDLE_CPUS} of a CPU, nothing is asked and the puts
fault their pages in themselves.  The thread moves the zeroing to another
CPU, it does not make it cheaper: where no CPU is idle (a master and its
slave busy-polling on two cores at one producer) it takes its share from
the reactors, and the one producer's p99 was ~1.5x longer with it.  Where
some CPU is idle it is worth having twice over: the puts go faster, and
on ext4 it, not the reactor, waits for the journal when a fresh page is
first written (docs/benchmarks.md, "Pre-faulting only with a CPU to
spare").

Bounded: at most 2 x L{AHEAD} bytes past the put position, one chunk in
flight, one thread per commit log, started by its first put.  Without the
accelerator (C{RMQHA_PURE=1}), or on a kernel without
C{MADV_POPULATE_WRITE} (before Linux 5.14), it does nothing and the puts
fault their pages in as before.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Callable, NamedTuple, Protocol

from rmqha._cgroup import CPULimit, cpu_limit
from rmqha.store import _record

__all__ = [
    "Prefaulter", "PrefaultFigures", "AHEAD", "IDLE_CPUS", "WINDOW", "IdleGauge", "prefaulter",
]

#: How far past the put position the pages are kept faulted in (asked for
#: up to twice this, again once a put is this far past the last ask).
AHEAD = 4 << 20

#: How much idle CPU (in CPUs, over those this process may use) the last
#: L{WINDOW} must have had for the pages to be asked for: the CPUs are not
#: saturated.  Two reactors busy-polling on two cores (a SYNC master and
#: its slave at one producer) leave 0-0.1 of a CPU idle, and the thread then
#: takes its share from them; at 32 producers the same pair leaves 0.2-0.45
#: and the thread fits in it -- where it also keeps the reactor off ext4's
#: journal: the first write to a fresh page waits while C{jbd2} commits
#: (docs/benchmarks.md, "Pre-faulting only with a CPU to spare").
IDLE_CPUS = 0.2

#: The shortest span (s) idle time is measured over: C{/proc/stat} counts
#: in 10 ms ticks, and is read at most this often.
WINDOW = 0.2


class Engine(Protocol):
    """
    What populates: the accelerator's C{Prefault} (tests give a fake).
    """

    def ask(self, mm: mmap.mmap, position: int, target: int) -> bool: ...

    def release(self) -> None: ...

    def stop(self) -> None: ...

    def cpu_time(self) -> float: ...


def _proc_stat() -> str:
    with open("/proc/stat") as f:
        return f.read()


def _allowed_cpus() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def idle_ticks(text: str, cpus: frozenset[int] | None) -> tuple[int, int, int]:
    """
    From C{/proc/stat}'s text: the idle ticks (C{idle} + C{iowait}), all
    ticks (its first eight columns) and how many CPUs were counted, over the
    C{cpuN} lines of C{cpus} (every one when C{None}).

    @raise ValueError: a C{cpuN} line that is not one.
    """
    idle = total = counted = 0
    for line in text.splitlines():
        if not line.startswith("cpu"):
            break
        name, _, rest = line.partition(" ")
        if name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        fields = [int(v) for v in rest.split()[:8]]
        if len(fields) < 5:
            raise ValueError(f"/proc/stat line {line!r} has fewer than 5 columns")
        idle += fields[3] + fields[4]
        total += sum(fields)
        counted += 1
    return idle, total, counted


class IdleGauge:
    """
    Whether the CPUs this process may use had L{IDLE_CPUS} of a CPU to
    spare over the last L{WINDOW} or more: idle (C{/proc/stat}'s ticks,
    counted since the reading that last decided), or used by the
    pre-faulting itself (its thread's CPU time: what it takes would be idle
    without it).  Under a cgroup CPU quota (a container's CPU limit,
    L{rmqha._cgroup}), no more than what the quota left over that span: a
    container limited to two CPUs on a host of sixty-four idle ones has
    only its own quota to spare.  Read at most once a L{WINDOW}; between
    readings the last answer stands.  Where it cannot tell (no
    C{/proc/stat}, a text it does not know), it says yes: the pages are
    asked for, as before it existed; a quota whose use cannot be read is
    left out.
    """

    def __init__(
        self,
        read: Callable[[], str] = _proc_stat,
        clock: Callable[[], float] = time.monotonic,
        cpus: frozenset[int] | None = None,
        hz: int = os.sysconf("SC_CLK_TCK"),
        limit: CPULimit | None = None,
    ) -> None:
        self._read = read
        self._clock = clock
        self._cpus = cpus
        self._hz = hz
        self._limit = limit
        # (idle ticks, all ticks, own CPU s, clock, the quota's cgroup's CPU s)
        self._base: tuple[int, int, float, float, float | None] | None = None
        self._next = 0.0
        self._answer = True

    def idle(self, own: float) -> bool:
        """
        Whether a CPU is spare, C{own} being the seconds of CPU the
        pre-faulting has used so far.
        """
        now = self._clock()
        if now < self._next:
            return self._answer
        self._next = now + WINDOW
        try:
            idle, total, counted = idle_ticks(self._read(), self._cpus)
        except (OSError, ValueError):
            self._base = None
            self._answer = True
            return True
        used = None if self._limit is None else self._limit.used_seconds()
        base, self._base = self._base, (idle, total, own, now, used)
        if base is not None and total > base[1] and counted:
            # (max: a forked child's thread starts its count afresh.)
            mine = max(0.0, own - base[2])
            spare = counted * (idle - base[0] + mine * self._hz) / (total - base[1])
            if self._limit is not None and used is not None and base[4] is not None:
                # What the quota left, the thread's own use counted as spare.
                others = max(0.0, used - base[4] - mine)
                spare = min(spare, self._limit.cpus - others / (now - base[3]))
            self._answer = spare >= IDLE_CPUS
        return self._answer


class PrefaultFigures(NamedTuple):
    """
    What a commit log's pre-faulting has done (for C{/status} and
    C{/metrics}).
    """

    #: Asks for pages made (one per 4 MiB of puts at most).
    asks: int
    #: Asks not made: no CPU to spare (L{IdleGauge}); the puts faulted
    #: their own pages.
    skipped: int
    #: Seconds of CPU its thread has used.
    cpu_seconds: float


class Prefaulter:
    """
    One commit log's pre-faulting.  The put thread calls L{ahead} when a
    put passes L{ask_at}; whoever unmaps or closes the mapping being
    populated calls L{release} first; L{stop} at close.
    """

    def __init__(self, engine: Engine, gauge: IdleGauge | None = None) -> None:
        self.engine = engine
        #: Whether a CPU is spare (L{IdleGauge}); C{None}: always ask.
        self.gauge = gauge
        #: The position in the segment past which a put asks for more (so
        #: that a put costs one comparison).
        self.ask_at = 0
        self.asks = 0
        self.skipped = 0

    def figures(self) -> PrefaultFigures:
        return PrefaultFigures(self.asks, self.skipped, self.engine.cpu_time())

    def ahead(self, mm: mmap.mmap, position: int, size: int) -> None:
        """
        The put position in the segment mapped by C{mm} (of C{size} bytes)
        is C{position}: keep the pages up to L{AHEAD} past it faulted in,
        when a CPU is spare; otherwise look again L{AHEAD} further on.
        """
        gauge = self.gauge
        if gauge is not None and not gauge.idle(self.engine.cpu_time()):
            self.skipped += 1
            self.ask_at = position + AHEAD
            return
        self.asks += 1
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
    A L{Prefaulter} for a commit log's puts (asking only with a CPU to
    spare, L{IdleGauge}), or C{None} without the
    accelerator's C{Prefault} (C{RMQHA_PURE=1}, or an old build).
    """
    accel = _record._accel
    if accel is None or not hasattr(accel, "Prefault"):
        return None
    return Prefaulter(accel.Prefault(), IdleGauge(cpus=_allowed_cpus(), limit=cpu_limit()))
