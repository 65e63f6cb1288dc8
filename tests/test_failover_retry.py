"""
A failover slave retries a master it could not reach within a fraction of
a second (the election names a master before it listens), doubling from
there; a classic slave keeps its 1-2 s first retry.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import succeed
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.broker import Broker, Role
from rmqha.settings import BrokerSettings
from rmqha.ha.epochs import EpochFile
from rmqha.store.commitlog import CommitLog
from rmqha.testing import StringEndpoint
from tests._helpers import fixed_clock, replication_of, settings_and_runtime

SEGMENT = 64 * 1024


class FailoverRetryTests(SynchronousTestCase):
    def broker(self, **kwargs: Any) -> tuple[Broker, MemoryReactorClock]:
        store = self.mktemp()
        reactor = MemoryReactorClock()
        endpoint = StringEndpoint(refuse=True)
        endpoint.description = "127.0.0.1:10912"  # type: ignore[attr-defined]
        if kwargs.pop("failover", False):
            kwargs["epochs"] = EpochFile(store)
        settings, runtime = settings_and_runtime(kwargs, role=Role.SLAVE, master_endpoint=endpoint)
        broker = Broker(
            settings,
            reactor=reactor,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 1.0,
            **runtime,
        )
        broker.startService()
        self.addCleanup(lambda: self.successResultOf(broker.stopService()))
        return broker, reactor

    def test_failover_slave_retries_soon(self) -> None:
        """
        A failover slave (one with an epoch file) whose master refuses the
        connection checks again within 0.2 s, then after 0.2-0.3 s: the
        checks come 0.1 s (plus up to 0.1 s) apart and double.
        """
        broker, reactor = self.broker(failover=True)
        self.assertEqual(replication_of(broker).failed_checks, 1)
        reactor.advance(0.2)
        self.assertEqual(replication_of(broker).failed_checks, 2)
        reactor.advance(0.3)
        self.assertEqual(replication_of(broker).failed_checks, 3)

    def test_classic_slave_keeps_its_backoff(self) -> None:
        """
        Without an epoch file the first retry still comes after 1-2 s.
        """
        broker, reactor = self.broker()
        self.assertEqual(replication_of(broker).failed_checks, 1)
        reactor.advance(0.99)
        self.assertEqual(replication_of(broker).failed_checks, 1)
        reactor.advance(1.02)
        self.assertEqual(replication_of(broker).failed_checks, 2)
