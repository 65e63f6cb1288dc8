"""
Tests for L{rmqha._timers.IdleTimer}.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rmqha._timers import IdleTimer


class IdleTimerTests(SynchronousTestCase):
    """
    An idle timer fires once its timestamp is an interval old.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.last = 0.0
        self.fired: list[float] = []
        self.keep = True

    def on_idle(self) -> bool:
        self.fired.append(self.clock.seconds())
        return self.keep

    def timer(self) -> IdleTimer:
        timer = IdleTimer(self.clock, 5.0, lambda: self.last, self.on_idle)
        timer.start()
        self.addCleanup(timer.stop)
        return timer

    def test_fires_after_interval_of_silence(self) -> None:
        """
        Activity pushes the firing back to exactly an interval after it;
        with no activity it fires every interval while kept.
        """
        self.timer()
        self.clock.advance(3)
        self.last = 3.0
        self.clock.advance(2)
        self.assertEqual(self.fired, [])
        self.clock.advance(3)
        self.assertEqual(self.fired, [8.0])
        self.clock.advance(5)
        self.assertEqual(self.fired, [8.0, 13.0])

    def test_stops_when_told(self) -> None:
        """
        on_idle returning False stops the timer: no call left scheduled.
        """
        self.keep = False
        self.timer()
        self.clock.advance(5)
        self.assertEqual(self.fired, [5.0])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_stop(self) -> None:
        """
        stop cancels the pending check.
        """
        timer = self.timer()
        timer.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(10)
        self.assertEqual(self.fired, [])
