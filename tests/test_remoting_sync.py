"""
Tests for L{rmqha.remoting.sync}: a slave's metadata sync from a fake
master that answers the four codes with what a genuine master's tables
encode to, over in-memory connections on a L{Clock}.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress, IProtocolFactory, IStreamClientEndpoint
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rmqha.remoting._frames import RemotingCommand, make_response
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import (
    BrokerMetadata,
    MetadataFile,
    SubscriptionGroupConfig,
    TopicConfig,
    parse_fastjson,
)
from rmqha.remoting.protocol import Answer, Dispatcher, RemotingClient, RemotingFactory
from rmqha.remoting.sync import MetadataSync, SyncTable
from rmqha.testing import MemoryConnection, connect_in_memory

_CODES = {
    RequestCode.GET_ALL_TOPIC_CONFIG: MetadataFile.TOPICS,
    RequestCode.GET_ALL_CONSUMER_OFFSET: MetadataFile.CONSUMER_OFFSETS,
    RequestCode.GET_ALL_DELAY_OFFSET: MetadataFile.DELAY_OFFSETS,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: MetadataFile.SUBSCRIPTION_GROUPS,
}


class _FakeMaster:
    """
    A master answering the four codes from its own L{BrokerMetadata}, as
    a genuine master does (the compact fastjson of its tables); C{answer}
    overrides one code's answer.
    """

    def __init__(self, metadata: BrokerMetadata) -> None:
        self.metadata = metadata
        self.asked: list[int] = []
        self.answer: dict[int, Callable[[RemotingCommand], Answer]] = {}
        self.dispatcher = Dispatcher({code: self._serve for code in _CODES})

    def _serve(self, command: RemotingCommand, peer: IAddress | None) -> Answer:
        self.asked.append(command.code)
        special = self.answer.get(command.code)
        if special is not None:
            return special(command)
        body = self.metadata.encode(_CODES[RequestCode(command.code)]).encode("utf-8")
        return make_response(command, ResponseCode.SUCCESS, body=body)


@implementer(IStreamClientEndpoint)
class _MasterEndpoint:
    """Dials the fake master in memory."""

    def __init__(self, master: _FakeMaster, clock: Clock) -> None:
        self.master = master
        self.clock = clock
        self.connections: list[MemoryConnection] = []

    def connect(self, factory: IProtocolFactory) -> Deferred[Any]:
        connection = connect_in_memory(
            RemotingFactory(self.master.dispatcher, self.clock), factory, self.clock
        )
        self.connections.append(connection)
        return succeed(connection.slave)


class _Case(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_000)
        root = self.mktemp()
        self.master_meta = BrokerMetadata(os.path.join(root, "master"), self.clock)
        self.clock.advance(1)
        self.slave_meta = BrokerMetadata(os.path.join(root, "slave"), self.clock)
        self.master = _FakeMaster(self.master_meta)
        self.endpoint = _MasterEndpoint(self.master, self.clock)
        self.addresses: list[str] = []
        self.sync = MetadataSync(self.slave_meta, self.clock, self._client)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def tearDown(self) -> None:
        if self.sync.running:
            self.sync.stopService()
        self.pump()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def _client(self, address: str) -> RemotingClient:
        self.addresses.append(address)
        return RemotingClient(None, self.endpoint, clock=self.clock, retry_policy=lambda n: 1.0)

    def pump(self) -> None:
        for _ in range(4):
            for connection in self.endpoint.connections:
                connection.flush()
            self.clock.advance(0)

    def advance(self, seconds: float) -> None:
        # In steps, the I/O of each tick done before the next is due.
        while seconds > 0:
            step = min(seconds, 0.5)
            self.clock.advance(step)
            self.pump()
            seconds -= step

    def start_slave(self, master: str | None = "192.0.2.1:10911") -> None:
        self.sync.set_master_address(master)
        self.sync.startService()
        self.sync.set_slave(True)

    def warnings(self, needle: str) -> list[str]:
        return [
            formatEvent(e) for e in self.events
            if e.get("log_level") is not None and e["log_level"].name in ("warn", "error", "critical")
            and needle in formatEvent(e)
        ]

    def read_json(self, which: MetadataFile) -> Any:
        with open(self.slave_meta.path(which), encoding="utf-8") as f:
            return parse_fastjson(f.read())


class ScheduleTests(_Case):
    """
    3 s after becoming a slave, then every 10 s; nothing while no master
    is known; stopped by a promotion, started again by a demotion.
    """

    def test_first_after_3s_then_every_10s(self) -> None:
        self.start_slave()
        self.advance(2.9)
        self.assertEqual(self.master.asked, [])
        self.advance(0.1)
        self.assertEqual(
            self.master.asked,
            [21, 43, 45, 201],
        )
        self.advance(9.9)
        self.assertEqual(len(self.master.asked), 4)
        self.advance(0.1)
        self.assertEqual(len(self.master.asked), 8)
        self.advance(10)
        self.assertEqual(len(self.master.asked), 12)
        self.assertEqual(self.addresses, ["192.0.2.1:10911"])
        status = self.sync.status()
        self.assertEqual((status.syncs, status.complete), (3, 3))
        self.assertEqual(status.last_success, self.clock.seconds())
        self.assertEqual(status.as_json(self.clock.seconds() + 4)["last_success_age_seconds"], 4)

    def test_no_master_no_sync(self) -> None:
        """
        Without a master address the ticks do nothing (C{syncAll} with a
        null masterAddr); once one is given it is synced at once (4.9.8
        waits for the next tick), then at every tick.
        """
        self.start_slave(master=None)
        self.advance(30)
        self.assertEqual(self.master.asked, [])
        self.assertEqual(self.addresses, [])
        self.sync.set_master_address("192.0.2.1:10911")
        self.advance(0.5)
        self.assertEqual(len(self.master.asked), 4)
        self.advance(10)
        self.assertEqual(len(self.master.asked), 8)

    def test_not_a_slave(self) -> None:
        self.sync.set_master_address("192.0.2.1:10911")
        self.sync.startService()
        self.advance(60)
        self.assertEqual(self.master.asked, [])
        self.assertFalse(self.sync.status().active)

    def test_promotion_stops_demotion_restarts(self) -> None:
        """
        A promotion stops the sync (its connection closes) and keeps what
        was synced, all four tables (docs/remoting.md, "Failover");
        becoming a slave again starts over: 3 s, then 10 s.
        """
        self.master_meta.update_topic(TopicConfig("T1"))
        self.master_meta.update_group(SubscriptionGroupConfig("G1"))
        self.master_meta.commit_offset("G1", "T1", 0, 42)
        self.master_meta.update_delay_offset(3, 9)
        self.start_slave()
        self.advance(3)
        self.assertIn("T1", self.slave_meta.topics)
        self.sync.set_slave(False)
        self.pump()
        self.assertFalse(self.sync.status().active)
        self.assertTrue(self.endpoint.connections[-1].dropped)
        self.advance(60)
        self.assertEqual(len(self.master.asked), 4)
        self.assertIn("T1", self.slave_meta.topics)
        self.assertTrue(self.slave_meta.topics_version.same(self.master_meta.topics_version))
        self.assertIn("G1", self.slave_meta.groups)
        self.assertEqual(self.slave_meta.query_offset("G1", "T1", 0), 42)
        self.assertEqual(self.slave_meta.delay_offsets, {3: 9})
        self.sync.set_slave(True)
        self.advance(2.9)
        self.assertEqual(len(self.master.asked), 4)
        self.advance(0.1)
        self.assertEqual(len(self.master.asked), 8)

    def test_promotion_during_a_sync(self) -> None:
        """
        A promotion while a step waits for its answer cancels the rest:
        no more requests, nothing counted as failed.
        """
        waiting: list[Deferred[RemotingCommand]] = []

        def never(command: RemotingCommand) -> Deferred[RemotingCommand]:
            d: Deferred[RemotingCommand] = Deferred()
            waiting.append(d)
            return d

        self.master.answer[RequestCode.GET_ALL_CONSUMER_OFFSET] = never
        self.start_slave()
        self.advance(3)
        self.assertEqual(self.master.asked, [21, 43])
        self.sync.set_slave(False)
        self.advance(10)
        self.assertEqual(self.master.asked, [21, 43])
        self.assertEqual(self.sync.status().failures, {})

    def test_repointed(self) -> None:
        """
        A new master address (a failover) replaces the connection and is
        synced at once, not at the next tick (up to 10 s away): its
        consumer offsets are what this node serves if elected next.
        """
        self.start_slave()
        self.advance(3)
        self.assertEqual(len(self.master.asked), 4)
        self.sync.set_master_address("192.0.2.2:10911")
        self.advance(0.5)
        self.assertEqual(self.addresses, ["192.0.2.1:10911", "192.0.2.2:10911"])
        self.assertTrue(self.endpoint.connections[0].dropped)
        self.assertEqual(len(self.master.asked), 8)
        self.advance(10)
        self.assertEqual(len(self.master.asked), 12)

    def test_bad_address(self) -> None:
        with self.assertRaises(ValueError):
            self.sync.set_master_address("no-port")


class ApplyTests(_Case):
    """
    Each table applied as C{SlaveSynchronize} applies it, and persisted.
    """

    def test_tables(self) -> None:
        self.master_meta.update_topic(TopicConfig("Orders", read_queue_nums=4, write_queue_nums=4))
        self.master_meta.update_group(SubscriptionGroupConfig("billing"))
        self.master_meta.commit_offset("billing", "Orders", 0, 120)
        self.master_meta.commit_offset("billing", "Orders", 3, 7)
        self.master_meta.update_delay_offset(1, 55)
        # (A data version is a timestamp and a counter: one change each
        # in the same millisecond would be the same version.)
        self.clock.advance(1)
        self.slave_meta.update_topic(TopicConfig("OnlyOnSlave"))
        self.slave_meta.commit_offset("local", "OnlyOnSlave", 0, 9)
        self.slave_meta.update_delay_offset(2, 99)
        self.start_slave()
        self.advance(3)
        # Topics and groups: replaced (the slave's own topic is gone).
        self.assertEqual(set(self.slave_meta.topics), {"Orders"})
        self.assertEqual(self.slave_meta.topics["Orders"].read_queue_nums, 4)
        self.assertTrue(self.slave_meta.topics_version.same(self.master_meta.topics_version))
        self.assertEqual(set(self.slave_meta.groups), {"billing"})
        # Offsets: merged.
        self.assertEqual(self.slave_meta.query_offset("billing", "Orders", 3), 7)
        self.assertEqual(self.slave_meta.query_offset("local", "OnlyOnSlave", 0), 9)
        # Delay offsets: the master's.
        self.assertEqual(dict(self.slave_meta.delay_offsets), {1: 55})
        # Persisted, in RocketMQ's format.
        topics = self.read_json(MetadataFile.TOPICS)
        self.assertEqual(set(topics["topicConfigTable"]), {"Orders"})
        self.assertEqual(self.read_json(MetadataFile.CONSUMER_OFFSETS)["offsetTable"]["Orders@billing"], {0: 120, 3: 7})
        self.assertEqual(self.read_json(MetadataFile.DELAY_OFFSETS)["offsetTable"], {1: 55})
        self.assertIn("billing", self.read_json(MetadataFile.SUBSCRIPTION_GROUPS)["subscriptionGroupTable"])
        self.assertEqual(self.slave_meta.dirty, frozenset())
        # Reloads as it was written.
        again = BrokerMetadata.load(self.slave_meta.store_dir, self.clock)
        self.assertEqual(set(again.topics), {"Orders"})
        self.assertEqual(again.query_offset("billing", "Orders", 0), 120)

    def test_same_version_not_replaced(self) -> None:
        """
        The topic table is replaced only when the data version differs:
        an unchanged master's table is not rewritten every 10 s.
        """
        self.master_meta.update_topic(TopicConfig("Orders"))
        self.start_slave()
        self.advance(3)
        path = self.slave_meta.path(MetadataFile.TOPICS)
        os.remove(path)
        self.advance(10)
        self.assertFalse(os.path.exists(path))
        self.master_meta.update_topic(TopicConfig("Orders", perm=4))
        self.advance(10)
        self.assertTrue(os.path.exists(path))
        self.assertEqual(self.slave_meta.topics["Orders"].perm, 4)

    def test_later_offsets_overwrite(self) -> None:
        """
        The master's offsets overwrite the slave's at every sync, lower
        ones included (RocketMQ's putAll; #1094).
        """
        self.master_meta.commit_offset("g", "T", 0, 10)
        self.start_slave()
        self.advance(3)
        self.slave_meta.commit_offset("g", "T", 0, 50)
        self.advance(10)
        self.assertEqual(self.slave_meta.query_offset("g", "T", 0), 10)


class FailureTests(_Case):
    """
    A step that fails leaves its table as it was, is counted, and is
    logged once however often it recurs.
    """

    def setUp(self) -> None:
        super().setUp()
        self.master_meta.update_topic(TopicConfig("Orders"))
        self.master_meta.commit_offset("g", "Orders", 0, 5)
        self.clock.advance(1)
        self.slave_meta.update_topic(TopicConfig("Mine"))
        self.slave_meta.commit_offset("g", "Mine", 0, 1)

    def snapshot(self) -> tuple[Any, ...]:
        return (
            dict(self.slave_meta.topics),
            dict(self.slave_meta.consumer_offsets),
            dict(self.slave_meta.delay_offsets),
            dict(self.slave_meta.groups),
        )

    def check_once(self, table: SyncTable, kind: str, needle: str, syncs: int = 4) -> None:
        self.start_slave()
        self.advance(3 + 10 * (syncs - 1))
        status = self.sync.status()
        self.assertEqual(status.failures, {(table.label, kind): syncs})
        self.assertEqual(status.syncs, syncs)
        self.assertEqual(status.complete, 0)
        self.assertIsNone(status.last_success)
        self.assertEqual(status.failing[table.label][0], kind)
        self.assertEqual(len(self.warnings(needle)), 1, self.warnings("metadata sync"))

    def test_refused(self) -> None:
        self.master.answer[RequestCode.GET_ALL_TOPIC_CONFIG] = lambda c: make_response(
            c, ResponseCode.SYSTEM_ERROR, "no topics for you"
        )
        before = self.snapshot()[0]
        self.check_once(SyncTable.TOPICS, "refused", "no topics for you")
        self.assertEqual(self.slave_meta.topics, before)
        # The other tables still sync.
        self.assertEqual(self.slave_meta.query_offset("g", "Orders", 0), 5)

    def test_not_supported(self) -> None:
        """
        A master that does not serve a code (REQUEST_CODE_NOT_SUPPORTED).
        """
        self.master.dispatcher = Dispatcher(
            {c: self.master._serve for c in _CODES if c != RequestCode.GET_ALL_DELAY_OFFSET}
        )
        self.slave_meta.update_delay_offset(3, 33)
        self.check_once(SyncTable.DELAY_OFFSETS, "refused", "REQUEST_CODE_NOT_SUPPORTED")
        self.assertEqual(dict(self.slave_meta.delay_offsets), {3: 33})

    def test_garbage(self) -> None:
        self.master.answer[RequestCode.GET_ALL_CONSUMER_OFFSET] = lambda c: make_response(
            c, ResponseCode.SUCCESS, body=b'{"offsetTable":{"T@g":{0:'
        )
        before = self.snapshot()[1]
        self.check_once(SyncTable.CONSUMER_OFFSETS, "bad_body", "GET_ALL_CONSUMER_OFFSET")
        self.assertEqual(self.slave_meta.consumer_offsets, before)
        self.assertIn("Orders", self.slave_meta.topics)

    def test_not_utf8(self) -> None:
        self.master.answer[RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG] = lambda c: make_response(
            c, ResponseCode.SUCCESS, body=b"\xff\xfe"
        )
        self.check_once(SyncTable.SUBSCRIPTION_GROUPS, "bad_body", "not UTF-8")

    def test_timeout(self) -> None:
        """
        No answer within 3 s: the step fails, the next steps run.
        """
        self.master.answer[RequestCode.GET_ALL_TOPIC_CONFIG] = lambda c: Deferred()
        before = self.snapshot()[0]
        self.start_slave()
        self.advance(3)
        self.assertEqual(self.master.asked, [21])
        self.advance(3)
        self.assertEqual(self.master.asked, [21, 43, 45, 201])
        self.assertEqual(self.sync.status().failures, {("topics", "timeout"): 1})
        self.assertEqual(self.slave_meta.topics, before)
        self.assertEqual(self.slave_meta.query_offset("g", "Orders", 0), 5)
        self.advance(10)
        self.assertEqual(len(self.warnings("within 3 s")), 1)

    def test_no_connection(self) -> None:
        def refuse(factory: IProtocolFactory) -> Deferred[Any]:
            from twisted.internet.defer import fail

            return fail(ConnectionRefusedError())

        self.endpoint.connect = refuse  # type: ignore[method-assign]
        before = self.snapshot()
        self.start_slave()
        self.advance(3 + 10 * 5)
        self.assertEqual(self.snapshot(), before)
        failures = self.sync.status().failures
        self.assertEqual(set(failures), {(t.label, "connection") for t in SyncTable})
        self.assertEqual(len(self.warnings("cannot connect")), 4)

    def test_relogged_and_recovered(self) -> None:
        """
        A failure that goes on is logged again after the relog interval;
        when it ends, that is said once.
        """
        self.sync.relog_interval = 60
        self.master.answer[RequestCode.GET_ALL_TOPIC_CONFIG] = lambda c: make_response(
            c, ResponseCode.SYSTEM_ERROR, "boom"
        )
        self.start_slave()
        self.advance(3 + 50)
        self.assertEqual(len(self.warnings("boom")), 1)
        self.advance(10)
        self.assertEqual(len(self.warnings("still fails")), 1)
        del self.master.answer[RequestCode.GET_ALL_TOPIC_CONFIG]
        self.advance(10)
        self.assertIn("Orders", self.slave_meta.topics)
        self.assertEqual(self.sync.status().failing, {})
        self.assertEqual(self.sync.status().last_success, self.clock.seconds())
        self.assertTrue(any("succeeds again" in formatEvent(e) for e in self.events))

    def test_changing_kinds_logged_once(self) -> None:
        """
        A step failing by turns in different ways (a master going down
        fails with connection, then timeout) is one failure: logged once,
        counted by kind.
        """
        turn = [0]

        def flaky(command: RemotingCommand) -> Answer:
            turn[0] += 1
            if turn[0] % 2:
                return Deferred()
            return make_response(command, ResponseCode.SYSTEM_BUSY, "busy")

        self.master.answer[RequestCode.GET_ALL_TOPIC_CONFIG] = flaky
        self.start_slave()
        self.advance(3 + 10 * 5)
        failures = self.sync.status().failures
        self.assertEqual(failures, {("topics", "timeout"): 3, ("topics", "refused"): 3})
        self.assertEqual(len(self.warnings("GET_ALL_TOPIC_CONFIG")), 1)

    def test_write_failure(self) -> None:
        """
        A table that cannot be written is a failure of kind write.
        """
        for which in MetadataFile:
            # (A directory where the file goes: not writable, even by root.)
            path = self.slave_meta.path(which)
            if os.path.exists(path):
                os.remove(path)
            os.makedirs(path)
        self.start_slave()
        self.advance(3)
        kinds = {kind for (_, kind) in self.sync.status().failures}
        self.assertEqual(kinds, {"write"})
        self.assertEqual(len(self.warnings("cannot write")), 4)


class DefaultClientTests(SynchronousTestCase):
    def test_plain_tcp(self) -> None:
        """
        The default client dials C{host:port} over plain TCP (IPv6 too).
        """
        from twisted.internet.testing import MemoryReactorClock

        from rmqha.remoting.sync import remoting_client

        build = remoting_client(MemoryReactorClock())
        self.assertEqual(build("192.0.2.1:10911").name, "tcp:host=192.0.2.1:port=10911")
        self.assertEqual(build("[::1]:10911").name, r"tcp:host=\:\:1:port=10911")
