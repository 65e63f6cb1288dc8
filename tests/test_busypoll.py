"""
Busy polling (L{rmqha._busypoll}; docs/sync.md, "Busy polling"): the
window, its bounds, the back-off after fruitless windows, and who
registers while it runs.  A fake C{epoll} and a fake timer: no real time.
"""

from __future__ import annotations

import os
import select
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from rmqha import _busypoll
from rmqha._busypoll import (
    LOSSES_BEFORE_BACKOFF,
    MAX_BACKOFF,
    BusyPoll,
    IExpectsBytes,
    busy_poll,
)
from rmqha.ha.config import HAConfig
from rmqha.ha.group import HAService, PutStatus
from rmqha.settings import BrokerSettings, SettingsError


class FakeTimer:
    """
    C{perf_counter}, moved by the fake poller's polls.
    """

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeEpoll:
    """
    An C{epoll} that answers C{poll(0)} with events after C{ready_after}
    polls (never, if C{None}); each C{poll(0)} takes C{step} seconds of the
    timer's time.  Blocking polls are recorded and return C{[]}.
    """

    def __init__(self, timer: FakeTimer, ready_after: int | None, step: float = 1e-6) -> None:
        self.timer = timer
        self.ready_after = ready_after
        self.step = step
        self.nonblocking = 0
        self.blocking: list[float] = []
        self.registered: list[tuple[str, int, int]] = []
        self.closed = False

    def poll(self, timeout: float = -1, maxevents: int = -1) -> list[tuple[int, int]]:
        if timeout == 0:
            self.nonblocking += 1
            self.timer.now += self.step
            if self.ready_after is not None and self.nonblocking > self.ready_after:
                return [(7, select.EPOLLIN)]
            return []
        self.blocking.append(timeout)
        return []

    def register(self, fd: int, mask: int) -> None:
        self.registered.append(("register", fd, mask))

    def modify(self, fd: int, mask: int) -> None:
        self.registered.append(("modify", fd, mask))

    def unregister(self, fd: int) -> None:
        self.registered.append(("unregister", fd, 0))

    def fileno(self) -> int:
        return 42

    def close(self) -> None:
        self.closed = True


@implementer(IExpectsBytes)
class Source:
    def __init__(self, expecting: bool = True) -> None:
        self.wanted = expecting

    def expecting(self) -> bool:
        return self.wanted


def polling(ready_after: int | None, step: float = 1e-6) -> tuple[BusyPoll, FakeEpoll]:
    timer = FakeTimer()
    epoll = FakeEpoll(timer, ready_after, step)
    return BusyPoll(epoll, timer), epoll


class BusyPollTests(SynchronousTestCase):
    def test_spin_gets_events(self) -> None:
        """
        While a source expects bytes, a poll with a timeout polls without
        one until events come, within the window, and never sleeps.
        """
        poller, epoll = polling(ready_after=5)
        poller.add(Source(), 50e-6)
        self.assertEqual(poller.poll(1.0, 8), [(7, select.EPOLLIN)])
        self.assertEqual(epoll.nonblocking, 6)
        self.assertEqual(epoll.blocking, [])
        self.assertEqual((poller.windows_with_events, poller.windows_without_events), (1, 0))
        self.assertAlmostEqual(poller.poll_seconds, 6e-6)

    def test_window_ends_then_sleeps_for_the_rest(self) -> None:
        """
        No events within the window: the poll sleeps for what is left of
        its timeout.
        """
        poller, epoll = polling(ready_after=None, step=10e-6)
        poller.add(Source(), 50e-6)
        self.assertEqual(poller.poll(1.0, 8), [])
        self.assertEqual(epoll.nonblocking, 5)
        self.assertEqual(len(epoll.blocking), 1)
        self.assertAlmostEqual(epoll.blocking[0], 1.0 - 50e-6)
        self.assertEqual((poller.windows_with_events, poller.windows_without_events), (0, 1))

    def test_no_limit_sleeps_without_one(self) -> None:
        """
        A poll without a timeout (-1, or C{None}) sleeps without one after
        a fruitless window.
        """
        for timeout in (-1, None):
            poller, epoll = polling(ready_after=None, step=10e-6)
            poller.add(Source(), 20e-6)
            poller.poll(timeout, 8)  # type: ignore[arg-type]
            self.assertEqual(epoll.blocking, [-1])

    def test_timeout_shorter_than_window(self) -> None:
        """
        The window never outlasts the reactor's timeout (its next timed
        call): the spin ends with it.
        """
        poller, epoll = polling(ready_after=None, step=10e-6)
        poller.add(Source(), 1e-3)
        poller.poll(35e-6, 8)
        # (Four polls in the window, then one for the timeout's rest: 0.)
        self.assertEqual(epoll.nonblocking, 5)
        self.assertEqual(epoll.blocking, [])

    def test_nothing_expected_sleeps_at_once(self) -> None:
        """
        No source expecting bytes, no source at all, or a zero timeout:
        one ordinary poll.
        """
        poller, epoll = polling(ready_after=0)
        self.assertEqual(poller.poll(1.0, 8), [])
        source = Source(expecting=False)
        poller.add(source, 50e-6)
        self.assertEqual(poller.poll(2.0, 8), [])
        self.assertEqual(epoll.blocking, [1.0, 2.0])
        source.wanted = True
        self.assertEqual(poller.poll(0, 8), [(7, select.EPOLLIN)])
        self.assertEqual(epoll.nonblocking, 1)
        self.assertEqual((poller.windows_with_events, poller.windows_without_events), (0, 0))

    def test_widest_expecting_window(self) -> None:
        """
        The window is the widest of the sources that expect bytes now.
        """
        poller, epoll = polling(ready_after=None, step=10e-6)
        poller.add(Source(expecting=False), 1e-3)
        poller.add(Source(), 30e-6)
        poller.add(Source(), 60e-6)
        poller.poll(1.0, 8)
        self.assertEqual(epoll.nonblocking, 6)

    def test_backoff_after_fruitless_windows(self) -> None:
        """
        After L{LOSSES_BEFORE_BACKOFF} fruitless windows in a row the next
        wanted poll sleeps at once, then twice as many each time, up to
        L{MAX_BACKOFF}; a window that gets events resets it.
        """
        poller, epoll = polling(ready_after=None, step=10e-6)
        poller.add(Source(), 20e-6)

        def spun() -> bool:
            before = epoll.nonblocking
            poller.poll(1.0, 8)
            return epoll.nonblocking > before

        self.assertEqual([spun() for _ in range(LOSSES_BEFORE_BACKOFF)], [True] * 4)
        self.assertFalse(spun())
        self.assertEqual([spun() for _ in range(LOSSES_BEFORE_BACKOFF)], [True] * 4)
        self.assertEqual([spun(), spun(), spun()], [False, False, True])
        self.assertEqual([spun() for _ in range(LOSSES_BEFORE_BACKOFF - 1)], [True] * 3)
        skips = []
        for _ in range(20):
            count = 0
            while not spun():
                count += 1
            skips.append(count)
            for _ in range(LOSSES_BEFORE_BACKOFF - 1):
                self.assertTrue(spun())
        self.assertEqual(skips[:3], [4, 8, 16])
        self.assertEqual(max(skips), MAX_BACKOFF)
        # Events in a window: back to spinning every time.
        while not spun():
            pass
        epoll.ready_after = epoll.nonblocking
        self.assertTrue(spun())
        epoll.ready_after = None
        self.assertEqual([spun() for _ in range(LOSSES_BEFORE_BACKOFF)], [True] * 4)
        self.assertFalse(spun())
        self.assertTrue(spun())

    def test_descriptor_calls_pass_through(self) -> None:
        poller, epoll = polling(ready_after=None)
        poller.register(3, 1)
        poller.modify(3, 4)
        poller.unregister(3)
        self.assertEqual(
            epoll.registered, [("register", 3, 1), ("modify", 3, 4), ("unregister", 3, 0)]
        )
        self.assertEqual(poller.fileno(), 42)
        poller.close()
        self.assertTrue(poller.closed)

    def test_window_bounds(self) -> None:
        poller, _ = polling(ready_after=None)
        for window in (-1e-6, 0.011):
            self.assertRaises(ValueError, poller.add, Source(), window)
            self.assertRaises(ValueError, busy_poll, Clock(), Source(), window)


class RegistrationTests(SynchronousTestCase):
    """
    L{busy_poll} wraps a real epoll reactor's poller while sources are
    registered, and leaves every other reactor alone.
    """

    def reactor(self) -> Any:
        from twisted.internet.epollreactor import EPollReactor

        reactor = EPollReactor()

        def close() -> None:
            reactor.removeAll()
            reactor._poller.close()
            reactor.waker.connectionLost(None)

        self.addCleanup(close)
        self.patch(_busypoll, "_cpus", lambda: 2)
        return reactor

    def test_wraps_and_restores(self) -> None:
        reactor = self.reactor()
        original = reactor._poller
        first = busy_poll(reactor, Source(), 50e-6)
        second = busy_poll(reactor, Source(), 80e-6)
        self.assertIsInstance(reactor._poller, BusyPoll)
        self.assertIs(first.polling, second.polling)
        self.assertIs(reactor._poller.poller, original)
        first.stop()
        self.assertIsInstance(reactor._poller, BusyPoll)
        second.stop()
        second.stop()
        self.assertIs(reactor._poller, original)
        # The reactor still works on its own poller.
        reactor.doIteration(0)

    def test_reactor_polls_through_it(self) -> None:
        """
        The epoll reactor's iteration polls the stand-in (what
        L{BusyPoll} relies on: C{EPollReactor.doPoll} calls
        C{self._poller.poll(timeout, n)}).
        """
        reactor = self.reactor()
        registration = busy_poll(reactor, Source(), 50e-6)
        self.addCleanup(registration.stop)
        assert registration.polling is not None
        reactor.doIteration(0.001)
        polling = registration.polling
        self.assertEqual(polling.windows_with_events + polling.windows_without_events, 1)

    def test_not_applied(self) -> None:
        """
        No stand-in on a test clock, with a zero window, in a process that
        may use one CPU, or over somebody else's poller.
        """
        self.assertIsNone(busy_poll(Clock(), Source(), 50e-6).polling)
        reactor = self.reactor()
        self.assertIsNone(busy_poll(reactor, Source(), 0).polling)
        self.patch(_busypoll, "_cpus", lambda: 1)
        self.assertIsNone(busy_poll(reactor, Source(), 50e-6).polling)
        self.patch(_busypoll, "_cpus", lambda: 2)
        original = reactor._poller
        foreign = BusyPoll(original)
        reactor._poller = foreign
        self.addCleanup(setattr, reactor, "_poller", original)
        self.assertIsNone(busy_poll(reactor, Source(), 50e-6).polling)
        self.assertIs(reactor._poller, foreign)


class SourcesTests(SynchronousTestCase):
    """
    What expects bytes: a SYNC_MASTER's waiting puts, a slave's flowing
    frames.
    """

    def test_ha_service_expects_acks_while_puts_wait(self) -> None:
        from tests.test_group import StubAcks, StubAppended

        clock = Clock()
        for sync in (True, False):
            ha = HAService(
                clock,
                acks=StubAcks(),
                appended=StubAppended(1000),
                sync=sync,
                in_sync_replicas=2,
                min_in_sync_replicas=1,
                slave_fallbehind_max=1 << 20,
                slave_timeout=3.0,
            )
            verifyObject(IExpectsBytes, ha)
            self.assertFalse(ha.expecting())
            waited = ha.group.wait_for(100)
            self.assertEqual(ha.expecting(), sync)
            ha.group.quorum_changed(100)
            ha.group.release()
            self.assertEqual(self.successResultOf(waited), PutStatus.PUT_OK)
            self.assertFalse(ha.expecting())

    def test_slave_expects_frames_while_they_flow(self) -> None:
        from rmqha.ha.slave import SlaveFactory
        from rmqha.store.commitlog import CommitLog

        clock = Clock()
        clock.advance(1000)
        log = CommitLog.open(self.mktemp(), segment_size=1 << 20)
        self.addCleanup(log.close)
        factory = SlaveFactory(log, clock)
        connection = factory.buildProtocol(None)
        connection.makeConnection(StringTransport())
        self.addCleanup(connection.connectionLost)
        verifyObject(IExpectsBytes, connection)
        self.assertTrue(connection.expecting())  # (connected just now)
        clock.advance(0.002)
        self.assertFalse(connection.expecting())
        connection.dataReceived(b"\0" * 8)
        self.assertTrue(connection.expecting())
        clock.advance(0.0009)
        self.assertTrue(connection.expecting())
        clock.advance(0.0002)
        self.assertFalse(connection.expecting())


class SettingTests(SynchronousTestCase):
    def test_default_and_flag(self) -> None:
        self.assertEqual(BrokerSettings().busy_poll, 200e-6)
        self.assertEqual(BrokerSettings().ha_config.busy_poll, 200e-6)
        settings = BrokerSettings.from_sources(flags={"busy-poll": "0"})
        self.assertEqual(settings.ha_config.busy_poll, 0)

    def test_bad_values_named(self) -> None:
        for text in ("20000", "-5", "fast", "1.5"):
            with self.assertRaises(SettingsError) as caught:
                BrokerSettings.from_sources(flags={"busy-poll": text})
            self.assertIn(repr(text), str(caught.exception))
            self.assertIn("busy-poll", str(caught.exception))
        self.assertRaises(ValueError, HAConfig, busy_poll=0.02)

    def test_conf_key(self) -> None:
        settings = BrokerSettings.from_sources(conf={"haBusyPoll": "500"}, conf_path="b.conf")
        self.assertEqual(settings.busy_poll, 500e-6)
        with self.assertRaises(SettingsError) as caught:
            BrokerSettings.from_sources(conf={"haBusyPoll": "lots"}, conf_path="b.conf")
        self.assertIn("haBusyPoll", str(caught.exception))


class CPUQuotaBusyPollTests(SynchronousTestCase):
    """
    Busy polling stays off under a CPU quota of two CPUs
    (L{rmqha._cgroup.cpu_quota}).
    """

    def test_quota_under_two_cpus_turns_it_off(self) -> None:
        from twisted.internet.epollreactor import EPollReactor

        reactor = EPollReactor()
        self.addCleanup(reactor.waker.connectionLost, None)
        self.addCleanup(reactor.removeAll)
        self.addCleanup(reactor._poller.close)
        # (Four CPUs in the set, whatever this machine has.)
        self.patch(_busypoll.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
        self.patch(_busypoll, "cpu_quota", lambda: 1.5)
        self.assertIsNone(busy_poll(reactor, Source(), 50e-6).polling)
        self.patch(_busypoll, "cpu_quota", lambda: 2.0)
        registration = busy_poll(reactor, Source(), 50e-6)
        self.addCleanup(registration.stop)
        self.assertIsNotNone(registration.polling)
