"""
Tests for a failover master's in-sync set (L{rmqha.ha.insync.InSyncSet}):
who enters and leaves, and the rule that a member stops being waited for
only once the smaller set is published.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rmqha.coord.dcs import DCSError
from rmqha.ha.insync import PUBLISH_RETRY, InSyncSet
from rmqha.ha.interfaces import IInSyncObserver


@implementer(IInSyncObserver)
class _Observer:
    def __init__(self, test: "InSyncSetTests") -> None:
        self._test = test

    def in_sync_changed(self) -> None:
        self._test.changes += 1

    def in_sync_lost(self, why: str) -> None:
        self._test.lost.append(why)


class InSyncSetTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.published: list[tuple[tuple[str, ...], Deferred[bool]]] = []
        self.changes = 0
        self.lost: list[str] = []
        self.set = InSyncSet(
            self.clock,
            "m",
            self._publish,
            fallbehind_max=1000,
            catchup_timeout=1.0,
            observers=(_Observer(self),),
        )

    def _publish(self, members: tuple[str, ...]) -> Deferred[bool]:
        d: Deferred[bool] = Deferred()
        self.published.append((members, d))
        return d

    def test_observers_checked(self) -> None:
        """
        An observer that does not provide IInSyncObserver is refused when
        the set is built, naming the parameter.
        """
        with self.assertRaises(TypeError) as caught:
            InSyncSet(
                self.clock, "m", self._publish, fallbehind_max=1, observers=(object(),)  # type: ignore[arg-type]
            )
        self.assertIn("observers must provide IInSyncObserver", str(caught.exception))

    def test_enters_when_caught_up(self) -> None:
        """
        A replica enters once its ack covers both every acknowledged put
        and the master's max offset at its previous ack; it is waited for
        at once, before the set is published.
        """
        self.set.acked("s", 50, max_offset=100, acked_end=0)
        self.assertEqual(self.set.effective, {"m"})
        self.set.acked("s", 100, max_offset=120, acked_end=110)
        self.assertEqual(self.set.effective, {"m"}, "below an acknowledged put")
        self.set.acked("s", 120, max_offset=130, acked_end=110)
        self.assertEqual(self.set.effective, {"m", "s"})
        self.assertEqual(self.published[0][0], ("m", "s"))
        self.assertEqual(self.set.published, {"m"})
        self.published[0][1].callback(True)
        self.assertEqual(self.set.published, {"m", "s"})

    def test_shrink_waits_for_publication(self) -> None:
        """
        A member that leaves (disconnects) is still waited for until the
        set without it is stored: a put answered meanwhile is on it.
        """
        self.set.acked("s", 0, max_offset=0, acked_end=0)
        self.published.pop()[1].callback(True)
        self.set.gone("s")
        self.assertEqual(self.set.wanted, {"m"})
        self.assertEqual(self.set.effective, {"m", "s"})
        self.published.pop()[1].callback(True)
        self.assertEqual(self.set.effective, {"m"})

    def test_leaves_when_behind(self) -> None:
        """
        A member leaves when it is more than haSlaveFallbehindMax behind,
        or behind at all for longer than the catch-up timeout.
        """
        self.set.acked("s", 0, max_offset=0, acked_end=0)
        self.set.acked("t", 0, max_offset=0, acked_end=0)
        self.published.pop()[1].callback(True)
        self.published.pop()[1].callback(True)
        self.assertEqual(self.set.published, {"m", "s", "t"})
        self.set.acked("s", 10, max_offset=2000, acked_end=0)
        self.assertEqual(self.set.wanted, {"m", "t"})
        self.set.check(max_offset=2000)  # (t is 2000 behind too)
        self.assertEqual(self.set.wanted, {"m"})

    def test_leaves_when_stalled(self) -> None:
        """
        A member that stops acknowledging while the log grows leaves after
        the catch-up timeout, as checks see it.
        """
        self.set.acked("s", 0, max_offset=0, acked_end=0)
        self.published.pop()[1].callback(True)
        self.set.check(max_offset=10)
        self.clock.advance(0.9)
        self.set.check(max_offset=20)
        self.assertEqual(self.set.wanted, {"m", "s"})
        self.clock.advance(0.2)
        self.set.check(max_offset=20)
        self.assertEqual(self.set.wanted, {"m"})

    def test_publish_retried_then_lost(self) -> None:
        """
        A publication the coordinator does not answer is retried (the
        union rule holds meanwhile); one it refuses (no longer the
        leader) reports the leadership lost.
        """
        self.set.acked("s", 0, max_offset=0, acked_end=0)
        self.published.pop()[1].errback(DCSError("etcd: no quorum"))
        self.assertEqual(self.set.effective, {"m", "s"})
        self.assertEqual(self.published, [])
        self.clock.advance(PUBLISH_RETRY)
        self.published.pop()[1].callback(False)
        self.assertEqual(len(self.lost), 1)
