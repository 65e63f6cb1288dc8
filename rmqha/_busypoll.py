# -*- test-case-name: tests.test_busypoll -*-
"""
Busy polling: while this process expects a peer's bytes within a moment
(a SYNC_MASTER's puts wait for their ack; a slave's master sends frames
back to back), the reactor polls its C{epoll} without sleeping for a
short window before it sleeps in C{epoll_wait} (docs/sync.md, "Busy
polling").

Sleeping costs a SYNC round trip twice on each side: the process is
woken by the peer's send (a scheduler wake-up, on a virtual machine an
inter-processor interrupt and a halted vCPU resumed), and it then runs
its Python on cold caches.  On loopback, 2 cores, a SYNC put at one
producer took ~180 us sleeping and ~50 us polling (docs/benchmarks.md).

The cost is CPU: at most the window per poll that expects bytes, spent
only when something here expects them, and less when spins keep failing
(after L{LOSSES_BEFORE_BACKOFF} fruitless windows in a row, the next
wanted polls sleep at once, for twice as many polls each time, up to
L{MAX_BACKOFF}; a spin that gets its bytes resets it).  Off on a process
confined to one CPU, or to a cgroup CPU quota under two (a container's
CPU limit: its peer could not run while it spins, or the polling would
spend the quota), and on any reactor but Twisted's epoll reactor.

How it attaches: L{busy_poll} wraps the epoll reactor's poller
(C{EPollReactor._poller}, private to Twisted but unchanged since the
reactor's first release) in a L{BusyPoll} while at least one source is
registered, and puts the original back when the last one leaves.  It
imports only L{rmqha._cgroup} (the CPU quota) of rmqha.
"""

from __future__ import annotations

import os
import select
import time
import weakref
from typing import Any, Callable

from zope.interface import Interface

from rmqha._cgroup import cpu_quota

__all__ = [
    "BusyPoll",
    "IExpectsBytes",
    "LOSSES_BEFORE_BACKOFF",
    "MAX_BACKOFF",
    "MAX_WINDOW",
    "Registration",
    "busy_poll",
    "figures",
]

#: The longest window a setting may ask for, seconds.
MAX_WINDOW = 0.01
#: Fruitless windows in a row before wanted polls sleep at once.
LOSSES_BEFORE_BACKOFF = 4
#: The most wanted polls that then sleep at once before the next try.
MAX_BACKOFF = 1024


class IExpectsBytes(Interface):
    """
    Something in this process that may expect a peer's bytes within a
    moment.
    """

    def expecting() -> bool:
        """
        Whether bytes are expected now (asked before each sleep in
        C{epoll_wait}; must be cheap).
        """


class BusyPoll:
    """
    An C{epoll} object's stand-in for the epoll reactor: C{poll} with a
    timeout first polls without one, for up to the window of the
    registered sources that expect bytes, and only then sleeps (for what
    is left of the timeout).  Registering, modifying and unregistering
    descriptors go to the C{epoll} object unchanged.

    @ivar windows_with_events: windows that ended with events.
    @ivar windows_without_events: windows that ended without.
    @ivar poll_seconds: time spent polling in windows.
    """

    def __init__(
        self, poller: Any, timer: Callable[[], float] = time.perf_counter
    ) -> None:
        self.poller = poller
        self._timer = timer
        self._sources: dict[IExpectsBytes, float] = {}
        self.windows_with_events = 0
        self.windows_without_events = 0
        self.poll_seconds = 0.0
        self._losses = 0
        self._skip = 0
        self._backoff = 1

    # -- what the reactor calls on its poller

    def register(self, fd: int, eventmask: int) -> None:
        self.poller.register(fd, eventmask)

    def modify(self, fd: int, eventmask: int) -> None:
        self.poller.modify(fd, eventmask)

    def unregister(self, fd: int) -> None:
        self.poller.unregister(fd)

    def fileno(self) -> int:
        return int(self.poller.fileno())

    def close(self) -> None:
        self.poller.close()

    @property
    def closed(self) -> bool:
        return bool(self.poller.closed)

    def poll(self, timeout: float = -1, maxevents: int = -1) -> list[tuple[int, int]]:
        """
        C{epoll.poll}: events ready within C{timeout} seconds (-1 or
        C{None}: no limit).
        """
        poll: Callable[[float, int], list[tuple[int, int]]] = self.poller.poll
        if timeout == 0 or not self._sources:
            return poll(timeout, maxevents)
        window = 0.0
        for source, seconds in self._sources.items():
            if seconds > window and source.expecting():
                window = seconds
        if window == 0.0:
            return poll(timeout, maxevents)
        if self._skip:
            self._skip -= 1
            return poll(timeout, maxevents)
        if timeout is not None and 0 < timeout < window:
            window = timeout
        timer = self._timer
        started = now = timer()
        until = started + window
        while True:
            events = poll(0, maxevents)
            now = timer()
            if events:
                self.poll_seconds += now - started
                self.windows_with_events += 1
                self._losses = 0
                self._backoff = 1
                return events
            if now >= until:
                break
        self.poll_seconds += now - started
        self.windows_without_events += 1
        self._losses += 1
        if self._losses >= LOSSES_BEFORE_BACKOFF:
            self._losses = 0
            self._skip = self._backoff
            self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        if timeout is None or timeout < 0:
            return poll(-1, maxevents)
        return poll(max(0.0, timeout - (now - started)), maxevents)

    # -- sources

    def add(self, source: IExpectsBytes, window: float) -> None:
        """
        Poll for up to C{window} seconds before sleeping while C{source}
        expects bytes (until L{remove}).
        """
        if not 0 <= window <= MAX_WINDOW:
            raise ValueError(f"busy-poll window {window} s is not within 0..{MAX_WINDOW}")
        self._sources[source] = window

    def remove(self, source: IExpectsBytes) -> bool:
        """
        Forget C{source}.

        @return: whether no source is left.
        """
        self._sources.pop(source, None)
        return not self._sources


#: Each wrapped reactor's L{BusyPoll}.
_wrapped: weakref.WeakKeyDictionary[object, BusyPoll] = weakref.WeakKeyDictionary()


def _epoll_reactor(reactor: object) -> bool:
    try:
        from twisted.internet.epollreactor import EPollReactor
    except ImportError:  # (no epoll on this platform)
        return False
    return isinstance(reactor, EPollReactor)


def _cpus() -> float:
    """
    The CPUs this process may use: its CPU set, or fewer when its
    cgroup's CPU quota (a container's CPU limit) allows less.
    """
    try:
        count = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        count = float(os.cpu_count() or 1)
    quota = cpu_quota()
    return count if quota is None else min(count, quota)


def busy_poll(reactor: object, source: IExpectsBytes, window: float) -> "Registration":
    """
    Register C{source} with C{reactor}'s busy polling for C{window}
    seconds (0: nothing is registered), until the registration's
    C{stop}: a master side or a slave connection holds one while it
    runs.  A no-op on a reactor that is not Twisted's epoll reactor (a
    test's C{Clock}, the asyncio reactor), and in a process that may use
    less than two CPUs (L{cpu_quota}).
    """
    return Registration(reactor, source, window)


class Registration:
    """
    One source's registration (L{busy_poll}).

    @ivar polling: the reactor's L{BusyPoll}, or C{None} when none
        applies.
    """

    def __init__(self, reactor: object, source: IExpectsBytes, window: float) -> None:
        if not 0 <= window <= MAX_WINDOW:
            raise ValueError(f"busy-poll window {window} s is not within 0..{MAX_WINDOW}")
        self._reactor = reactor
        self._source = source
        self.polling: BusyPoll | None = None
        if window == 0 or not _epoll_reactor(reactor) or _cpus() < 2:
            return
        existing = _wrapped.get(reactor)
        current: object = getattr(reactor, "_poller", None)
        polling: BusyPoll
        if existing is not None and existing is current:
            polling = existing
        elif isinstance(current, select.epoll):
            if existing is not None and existing.poller is current:
                # (The reactor's stand-in from before, its counts kept.)
                polling = existing
            else:
                polling = _wrapped[reactor] = BusyPoll(current)
            reactor._poller = polling  # type: ignore[attr-defined]
        else:
            # (Somebody else's stand-in, or no poller: left alone.)
            return
        polling.add(source, window)
        self.polling = polling

    def stop(self) -> None:
        """
        Unregister; the last source out puts the reactor's own poller back.
        """
        polling = self.polling
        self.polling = None
        if polling is None:
            return
        original = polling.poller
        if polling.remove(self._source) and getattr(self._reactor, "_poller", None) is polling:
            self._reactor._poller = original  # type: ignore[attr-defined]


def figures(reactor: object) -> BusyPoll | None:
    """
    C{reactor}'s L{BusyPoll} (its counts), registered now or before;
    C{None} if it never had one.
    """
    return _wrapped.get(reactor)
