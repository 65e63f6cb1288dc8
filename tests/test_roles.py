"""
Tests for changing a broker's role at run time (L{rmqha.broker.Broker.become_master},
L{rmqha.broker.Broker.become_slave}) and for the replica's lifecycle
(L{rmqha.ha.replica}): in memory, on one clock, the store never reopened.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.test import iosim
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rmqha.broker import Broker, NotMasterError, Role
from rmqha.settings import BrokerSettings
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.ha.group import PutStatus
from rmqha.ha.replica import Replica, ReplicaState

from rmqha.remoting.metadata import BrokerMetadata
from rmqha.remoting.protocol import RemotingClient
from rmqha.remoting.sync import MetadataSync
from rmqha.testing import StringEndpoint
from tests._helpers import fixed_clock

SEGMENT = 64 * 1024


@implementer(IStreamClientEndpoint)
class _BrokerEndpoint:
    """
    Connects to a broker's master side over an in-memory iosim pump.
    """

    def __init__(self, target: Broker, clock: MemoryReactorClock) -> None:
        self.target = target
        self.clock = clock
        self.description = "tcp:host=127.0.0.1:port=10912"
        self.pumps: list[iosim.IOPump] = []

    def connect(self, factory: Factory) -> Deferred[Any]:
        # (A failover node holds its HA port in every role: its gate.)
        held = self.target.ports.held
        master = held[1] if held is not None else self.target.master_factory
        if master is None:
            return fail(ConnectionRefusedError("not a master"))
        server = master.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000 + len(self.pumps)))
        client = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 10912))
        server_transport = iosim.FakeTransport(server, isServer=True)
        client_transport = iosim.FakeTransport(client, isServer=False)
        pump = iosim.connect(
            server, server_transport, client, client_transport, greet=False, clock=self.clock
        )
        self.pumps.append(pump)
        return succeed(client)


class _InMemory(SynchronousTestCase):
    """
    Brokers on one MemoryReactorClock, connected over iosim.
    """

    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.endpoints: list[_BrokerEndpoint] = []

    def broker(
        self, role: Role, master: Broker | None = None, segment: int = SEGMENT, **more: Any
    ) -> Broker:
        store = self.mktemp()
        endpoint = None
        if master is not None:
            endpoint = self.endpoint(master)
        broker = Broker(
            BrokerSettings(role=role, ha_listen="tcp:0", master_endpoint=endpoint, scrub_rate=0, **more),  # type: ignore[arg-type]
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=segment, clock=fixed_clock),
            run_in_thread=lambda f: succeed(f()),
            retry_policy=lambda attempt: 1.0,
            fd_limit=lambda: 4096,
        )
        broker.startService()
        return broker

    def endpoint(self, master: Broker) -> _BrokerEndpoint:
        endpoint = _BrokerEndpoint(master, self.clock)
        self.endpoints.append(endpoint)
        return endpoint

    def settle(self) -> None:
        """
        Pump every connection and run the clock's due calls until quiet.
        """
        for _ in range(200):
            moved = False
            for endpoint in self.endpoints:
                for pump in endpoint.pumps:
                    moved = pump.pump() or moved
            self.clock.advance(0)
            if not moved:
                break

    def switch(self, d: Deferred[None]) -> None:
        """
        Let a role switch finish (the old role's connections close).
        """
        self.settle()
        self.successResultOf(d)

    def put(self, broker: Broker, body: bytes = b"x" * 100) -> Any:
        return self.successResultOf(broker.put(Message("RoleTopic", body)))

    def stop(self, *brokers: Broker) -> None:
        for broker in brokers:
            d = broker.stopService()
            self.settle()
            self.successResultOf(d)
        # The in-memory connections, closed by the stops, report it.
        self.settle()



class RoleSwitchTests(_InMemory):
    def test_promote_and_demote_on_one_store(self) -> None:
        """
        A slave promoted to master takes puts on the same open CommitLog;
        the old master, demoted, replicates from it; nothing is reopened
        and no delayed call is left once both stop.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        first = self.put(a)
        self.settle()
        self.assertEqual(b.commitlog.max_offset, first.next_offset)
        self.assertRaises(NotMasterError, b.put, Message("RoleTopic", b"no"))
        a_log, b_log = a.commitlog, b.commitlog

        self.switch(b.become_master())
        self.assertIs(b.role, Role.ASYNC_MASTER)
        self.assertIsNotNone(b.master_factory)
        second = self.put(b)
        self.assertEqual(second.status, PutStatus.PUT_OK)
        self.assertEqual(second.offset, first.next_offset)

        self.switch(a.become_slave(self.endpoint(b)))  # type: ignore[arg-type]
        self.assertIs(a.role, Role.SLAVE)
        self.assertIsNone(a.master_factory)
        self.assertRaises(NotMasterError, a.put, Message("RoleTopic", b"no"))
        self.settle()
        self.assertEqual(a.commitlog.max_offset, second.next_offset)
        replica = a.role_service
        assert isinstance(replica, Replica)
        self.assertIs(replica.state, ReplicaState.REPLICATING)
        self.assertEqual(a.commitlog.read(0, SEGMENT), b.commitlog.read(0, SEGMENT))

        self.assertIs(a.commitlog, a_log)
        self.assertIs(b.commitlog, b_log)
        self.stop(a, b)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_scrub_follows_the_role(self) -> None:
        """
        The background scrub learns the broker's role at each switch, so
        its repair advice for a corrupt record is about the right copy: a
        promoted slave's scrub no longer says "the master has the record",
        a demoted master's does.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        self.assertEqual((a.scrub.slave, b.scrub.slave), (False, True))
        self.switch(b.become_master())
        self.assertFalse(b.scrub.slave)
        self.switch(a.become_slave(self.endpoint(b)))  # type: ignore[arg-type]
        self.assertTrue(a.scrub.slave)
        self.stop(a, b)

    def test_metadata_sync_follows_the_role(self) -> None:
        """
        An attached metadata sync runs while the broker is a slave (from
        --master-remoting's address), stops at a promotion and starts
        again at a demotion; it stops with the broker.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a, master_remoting="127.0.0.1:10911")
        self.settle()
        addresses: list[str] = []

        def client(address: str) -> RemotingClient:
            addresses.append(address)
            return RemotingClient(None, StringEndpoint(refuse=True), clock=self.clock)

        sync = MetadataSync(BrokerMetadata(self.mktemp(), self.clock), self.clock, client)
        b.attach_metadata_sync(sync)
        self.assertTrue(sync.running and sync.active)
        for _ in range(60):
            self.clock.advance(0.5)
        self.assertEqual(addresses, ["127.0.0.1:10911"])
        self.assertGreaterEqual(sync.status().syncs, 1)
        self.switch(b.become_master())
        self.assertFalse(sync.active)
        self.switch(a.become_slave(self.endpoint(b)))  # type: ignore[arg-type]
        self.switch(b.become_slave(self.endpoint(a)))  # type: ignore[arg-type]
        self.assertTrue(sync.active)
        self.stop(a, b)
        self.assertFalse(sync.running or sync.active)
        self.flushLoggedErrors()

    def test_switch_needs_a_running_broker(self) -> None:
        """
        A broker that is not running has no role to switch (its role is
        its constructor's): both switches say so at once.
        """
        store = self.mktemp()
        broker = Broker(
            BrokerSettings(role=Role.MASTER),
            reactor=self.clock,
            open_commitlog=lambda: CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock),
        )
        self.assertRaises(RuntimeError, broker.become_master)
        self.assertRaises(RuntimeError, broker.become_slave, "tcp:host=127.0.0.1:port=1")

    def test_async_to_sync_master(self) -> None:
        """
        A running master switched to SYNC_MASTER keeps its side (and its
        slaves); its next put waits for its slave.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        side = a.role_service
        self.switch(a.become_master(Role.SYNC_MASTER))
        self.assertIs(a.role_service, side)
        waiting = a.put(Message("RoleTopic", b"z" * 100))
        self.assertNoResult(waiting)
        self.settle()
        self.assertEqual(self.successResultOf(waiting).status, PutStatus.PUT_OK)
        self.stop(a, b)

    def test_demotion_ends_waiting_puts(self) -> None:
        """
        A SYNC_MASTER demoted while a put waits for its slave: the put
        ends with SLAVE_NOT_AVAILABLE (it is stored), its slaves are
        disconnected, and its HA port is closed.
        """
        a = self.broker(Role.SYNC_MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        self.assertEqual(len(a.slaves()), 1)
        waiting = a.put(Message("RoleTopic", b"y" * 100))
        self.assertNoResult(waiting)  # (not pumped: no ack yet)
        port = a.ha_service
        assert port is not None
        self.switch(b.become_master())
        self.switch(a.become_slave(self.endpoint(b)))  # type: ignore[arg-type]
        result = self.successResultOf(waiting)
        self.assertEqual(result.status, PutStatus.SLAVE_NOT_AVAILABLE)
        self.assertFalse(port.running)
        self.settle()
        self.assertEqual(a.slaves(), [])
        self.stop(a, b)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_promotion_drops_an_incomplete_tail(self) -> None:
        """
        Bytes of a record still arriving when the slave is promoted are
        cut first: the first put lands where the last whole record ended.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a)
        self.settle()
        whole = self.put(a)
        self.settle()
        following = self.put(a)  # (not pumped)
        arriving = a.commitlog.read(whole.next_offset, following.next_offset - whole.next_offset)
        b.commitlog.append_at(whole.next_offset, arriving[:10])
        self.assertEqual(b.commitlog.max_offset, whole.next_offset + 10)
        self.switch(b.become_master())
        self.assertEqual(b.commitlog.max_offset, whole.next_offset)
        self.assertEqual(self.put(b).offset, whole.next_offset)
        self.stop(a, b)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class ReplicaLifecycleTests(_InMemory):
    """
    L{Replica}'s states, as the broker's role service.
    """

    def test_halted_then_stopped(self) -> None:
        """
        A segment size that differs from the master's halts the replica
        (HALTED: no connection service running, the problem says why);
        stopping it ends in STOPPED; HALTED leads nowhere else.
        """
        a = self.broker(Role.MASTER)
        b = self.broker(Role.SLAVE, master=a, segment=2 * SEGMENT)
        self.settle()
        replica = b.role_service
        assert isinstance(replica, Replica)
        self.assertIs(replica.state, ReplicaState.HALTED)
        assert replica.client_service is not None and b.problem is not None
        self.assertFalse(replica.client_service.running)
        self.assertIn("segment size must be its master's", b.problem)
        self.assertRaises(RuntimeError, replica._to, ReplicaState.REPLICATING)
        self.stop(a, b)
        self.assertIs(replica.state, ReplicaState.STOPPED)
        self.assertEqual(self.clock.getDelayedCalls(), [])
