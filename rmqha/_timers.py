# -*- test-case-name: tests.test_timers -*-
"""
Idle timers on an injected clock: "do something when X has not happened
for N seconds", without resetting a delayed call on every X.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime

__all__ = ["IdleTimer"]


class IdleTimer:
    """
    Calls C{on_idle} once C{last()} (a clock time) is C{interval} seconds
    old.  Between checks it sleeps exactly until that could first be true,
    so frequent activity costs nothing but updating the timestamp.

    C{on_idle} returns whether to keep watching (the next check is then a
    full interval later).
    """

    def __init__(
        self,
        clock: IReactorTime,
        interval: float,
        last: Callable[[], float],
        on_idle: Callable[[], bool],
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._last = last
        self._on_idle = on_idle
        self._call: IDelayedCall | None = None

    def start(self) -> None:
        self._schedule(self._interval)

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _schedule(self, delay: float) -> None:
        self._call = self._clock.callLater(max(delay, 0.0), self._check)

    def _check(self) -> None:
        self._call = None
        idle = self._clock.seconds() - self._last()
        if idle < self._interval:
            self._schedule(self._interval - idle)
        elif self._on_idle():
            self._schedule(self._interval)
