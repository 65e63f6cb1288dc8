"""
Tests for L{rmqha.remoting.pulls} and L{rmqha.remoting.consumers}: pulls,
long polling, queue offsets and a broker's clients, on a real broker with
a small store keeping consume queues, driven with the codec's frames
over in-memory connections and a fake clock.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha._limits import LimitedFactory
from rmqha.broker import Broker
from rmqha.client._codec import MessageQueue
from rmqha.client._consume import Subscription, decode_messages, heartbeat_body, ConsumeFromWhere
from rmqha.ha.config import Role
from rmqha.ha.roles import RoleState
from rmqha.remoting._frames import FrameDecoder, RemotingCommand, encode, header_to_ext_fields
from rmqha.remoting.broker import NOT_ON_VIP, BrokerDispatcher
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.consumers import ClientLimits, HeartbeatError, SubscriptionData, parse_heartbeat
from rmqha.remoting.headers import PullMessageRequestHeader
from rmqha.remoting.metadata import PERM_WRITE, SubscriptionGroupConfig, TopicConfig
from rmqha.remoting.pulls import GetMessageStatus, HoldLimits, PullHandlers, get_message, is_batch_full
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from rmqha.store.consumequeue import UNIT, Unit
from tests._helpers import fixed_clock
from tests.test_remoting_broker import _BrokerCase


class _Conn:
    """One client connection to the broker's remoting port, keeping every frame it got."""

    def __init__(self, factory: LimitedFactory, port: int) -> None:
        protocol = factory.buildProtocol(IPv4Address("TCP", "10.0.0.1", port))
        assert protocol is not None
        self.protocol = protocol
        self.transport = StringTransport()
        protocol.makeConnection(self.transport)
        self._opaque = 0
        self._decoder = FrameDecoder()
        self.frames: list[RemotingCommand] = []

    def send(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> int:
        self._opaque += 1
        self.protocol.dataReceived(encode(RemotingCommand(code=code, opaque=self._opaque, ext_fields=ext, body=body)))
        return self._opaque

    def received(self) -> list[RemotingCommand]:
        self._decoder.feed(self.transport.value())
        self.transport.clear()
        while (command := self._decoder.next_command()) is not None:
            self.frames.append(command)
        got, self.frames = self.frames, []
        return got

    def answers(self, opaque: int) -> list[RemotingCommand]:
        got = self.received()
        self.frames = [f for f in got if not (f.is_response and f.opaque == opaque)]
        return [f for f in got if f.is_response and f.opaque == opaque]

    def ask(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
        (answer,) = self.answers(self.send(code, ext, body))
        return answer

    def close(self) -> None:
        self.protocol.connectionLost(None)  # type: ignore[arg-type]


def _pull(
    group: str = "G", topic: str = "T", queue_id: int = 0, offset: int = 0, max_nums: int = 32,
    flag: int = 0, commit: int = 0, suspend: int = 15000, subscription: str | None = None, sub_version: int = 0,
) -> dict[str, str]:
    return header_to_ext_fields(
        PullMessageRequestHeader(
            group, topic, queue_id, offset, max_nums, flag, commit, suspend, subscription, sub_version,
            "TAG" if subscription is not None else None,
        )
    )


def _heartbeat(client: str = "10.0.0.1@1", group: str = "G", topics: dict[str, str] | None = None, version: int = 1) -> bytes:
    subs = [Subscription.build(t, e, version) for t, e in (topics or {"T": "*"}).items()]
    return heartbeat_body(client, group, subs, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)


class _Case(_BrokerCase):
    consume_queues = True

    def setUp(self) -> None:
        super().setUp()
        self._ports = 40000

    def begin(self, role: Role = Role.MASTER, messages: int = 0, tags: list[str] | None = None, **settings: Any) -> Broker:
        if messages:
            self.fill(messages, tags)
        broker = self.start(role, **settings)
        broker.metadata.update_topic(TopicConfig("T", 2, 2), persist=False)
        broker.metadata.update_group(SubscriptionGroupConfig("G"), persist=False)
        return broker

    def fill(self, count: int, tags: list[str] | None = None, size: int = 100) -> None:
        log = CommitLog.open(self.store, segment_size=64 * 1024, clock=fixed_clock)
        for i in range(count):
            props = {"TAGS": tags[i % len(tags)]} if tags else {}
            log.put(Message("T", b"%05d" % i + b"x" * (size - 5), queue_id=0, properties=props))
        log.close()

    def put(self, broker: Broker, count: int = 1, topic: str = "T", tag: str | None = None) -> None:
        log = broker.store.commitlog
        assert log is not None
        for _ in range(count):
            log.put(Message(topic, b"new", queue_id=0, properties={"TAGS": tag} if tag else {}))
        self.reactor.advance(0.01)  # (the dispatch step)

    def conn(self) -> _Conn:
        self._ports += 1
        return _Conn(self.remoting_factory(), self._ports)

    def pulls(self) -> PullHandlers:
        handler = self.remoting_factory().wrappedFactory.handler
        assert isinstance(handler, BrokerDispatcher)
        return handler.remoting.pulls

    def pull(self, conn: _Conn, **fields: Any) -> RemotingCommand:
        return conn.ask(RequestCode.PULL_MESSAGE, _pull(**fields))


class PullTests(_Case):
    """PULL_MESSAGE's statuses, codes and headers, as 4.9.8's."""

    def test_found(self) -> None:
        """
        FOUND: SUCCESS, the stored records concatenated as the body (the
        client decodes them), the offsets in the headers.
        """
        broker = self.begin(messages=5)
        conn = self.conn()
        self.assertEqual(conn.ask(RequestCode.HEART_BEAT, body=_heartbeat()).code, ResponseCode.SUCCESS)
        reply = self.pull(conn, offset=1)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.SUCCESS, "FOUND"))
        self.assertEqual(
            reply.ext_fields,
            {"suggestWhichBrokerId": "0", "nextBeginOffset": "5", "minOffset": "0", "maxOffset": "5"},
        )
        log = broker.store.commitlog
        assert log is not None
        queues = log.consume_queues
        assert queues is not None
        units = queues.units("T", 0, 1, 4)
        self.assertEqual(reply.body, b"".join(log.read(u.offset, u.size) for u in units))
        messages = decode_messages(reply.body, MessageQueue("T", "b", 0))
        self.assertEqual([m.queue_offset for m in messages], [1, 2, 3, 4])
        self.assertEqual(messages[0].body[:5], b"00001")

    def test_no_new_and_moved(self) -> None:
        """
        At the max: PULL_NOT_FOUND (OFFSET_OVERFLOW_ONE); past it:
        PULL_OFFSET_MOVED to the max; an empty queue: PULL_NOT_FOUND from
        0, PULL_OFFSET_MOVED to 0 from elsewhere.
        """
        self.begin(messages=3)
        conn = self.conn()
        conn.ask(RequestCode.HEART_BEAT, body=_heartbeat())
        reply = self.pull(conn, offset=3)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE"))
        self.assertEqual(reply.ext_fields and reply.ext_fields["nextBeginOffset"], "3")
        reply = self.pull(conn, offset=9)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY"))
        self.assertEqual(reply.ext_fields and reply.ext_fields["nextBeginOffset"], "3")
        reply = self.pull(conn, queue_id=1, offset=0)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.PULL_NOT_FOUND, "NO_MESSAGE_IN_QUEUE"))
        reply = self.pull(conn, queue_id=1, offset=4)
        self.assertEqual((reply.code, reply.ext_fields and reply.ext_fields["nextBeginOffset"]), (ResponseCode.PULL_OFFSET_MOVED, "0"))

    def test_refusals(self) -> None:
        """
        Unknown group 26, consumeEnable off 16, unknown topic 17, an
        unreadable topic 16, a queue id past readQueueNums SYSTEM_ERROR,
        no heartbeat 24, a heartbeat without the topic 24, an older
        subscription 25, a missing header field SYSTEM_ERROR.
        """
        broker = self.begin(messages=1)
        conn = self.conn()
        # An unknown group is created (autoCreateSubscriptionGroup), then
        # has no subscription; a name outside the rules cannot be.
        self.assertEqual(self.pull(conn, group="Nobody").code, ResponseCode.SUBSCRIPTION_NOT_EXIST)
        self.assertIsNotNone(broker.metadata.group("Nobody"))
        self.assertEqual(self.pull(conn, group="No body").code, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
        self.assertEqual(self.pull(conn).code, ResponseCode.SUBSCRIPTION_NOT_EXIST)
        reply = self.pull(conn, queue_id=2)
        self.assertEqual(reply.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("queueId[2] is illegal", reply.remark or "")
        conn.ask(RequestCode.HEART_BEAT, body=_heartbeat(topics={"Other": "*"}, version=5))
        reply = self.pull(conn)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist"))
        conn.ask(RequestCode.HEART_BEAT, body=_heartbeat(version=5))
        self.assertEqual(self.pull(conn, sub_version=6).code, ResponseCode.SUBSCRIPTION_NOT_LATEST)
        self.assertEqual(self.pull(conn, sub_version=5).code, ResponseCode.SUCCESS)
        self.assertEqual(self.pull(conn, topic="Nope", flag=4, subscription="*").code, ResponseCode.TOPIC_NOT_EXIST)
        broker.metadata.update_topic(TopicConfig("T", 2, 2, PERM_WRITE), persist=False)
        self.assertEqual(self.pull(conn).code, ResponseCode.NO_PERMISSION)
        broker.metadata.update_topic(TopicConfig("T", 2, 2), persist=False)
        broker.metadata.update_group(SubscriptionGroupConfig("G", consume_enable=False), persist=False)
        self.assertEqual(self.pull(conn).code, ResponseCode.NO_PERMISSION)
        reply = conn.ask(RequestCode.PULL_MESSAGE, {"consumerGroup": "G", "topic": "T"})
        self.assertEqual(reply.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("queueId", reply.remark or "")

    def test_tag_filter(self) -> None:
        """
        Units are filtered by tag hash against the subscription's codes
        (the request's own with flag 0x4, else the heartbeat's); nothing
        matching: PULL_RETRY_IMMEDIATELY, past what was scanned.
        """
        self.begin(messages=6, tags=["A", "B", "B"])
        conn = self.conn()
        reply = self.pull(conn, flag=4, subscription="A")
        got = decode_messages(reply.body, MessageQueue("T", "b", 0))
        self.assertEqual([m.queue_offset for m in got], [0, 3])
        reply = self.pull(conn, flag=4, subscription="A || B", max_nums=2)
        self.assertEqual(len(decode_messages(reply.body, MessageQueue("T", "b", 0))), 2)
        reply = self.pull(conn, flag=4, subscription="C")
        self.assertEqual((reply.code, reply.remark), (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE"))
        self.assertEqual(reply.ext_fields and reply.ext_fields["nextBeginOffset"], "6")
        conn.ask(RequestCode.HEART_BEAT, body=_heartbeat(topics={"T": "B"}))
        got = decode_messages(self.pull(conn).body, MessageQueue("T", "b", 0))
        self.assertEqual([m.queue_offset for m in got], [1, 2, 4, 5])

    def test_scan_to_file_end(self) -> None:
        """
        The units are scanned in growing chunks up to the end of their
        queue file (64 units here), as getIndexBuffer gives them: nothing
        matching there is PULL_RETRY_IMMEDIATELY from the next file.
        """
        self.begin(messages=101, tags=["B"] * 100 + ["A"])
        conn = self.conn()
        reply = self.pull(conn, flag=4, subscription="A", max_nums=4)
        self.assertEqual((reply.code, reply.ext_fields and reply.ext_fields["nextBeginOffset"]), (ResponseCode.PULL_RETRY_IMMEDIATELY, "64"))
        reply = self.pull(conn, flag=4, subscription="A", max_nums=4, offset=64)
        got = decode_messages(reply.body, MessageQueue("T", "b", 0))
        self.assertEqual(([m.queue_offset for m in got], reply.ext_fields and reply.ext_fields["nextBeginOffset"]), ([100], "101"))

    def test_commit_offset(self) -> None:
        """Flag 0x1 commits commitOffset on a master."""
        broker = self.begin(messages=2)
        conn = self.conn()
        self.pull(conn, flag=1 | 4, subscription="*", commit=1)
        self.assertEqual(broker.metadata.query_offset("G", "T", 0), 1)
        self.pull(conn, flag=4, subscription="*", commit=2)
        self.assertEqual(broker.metadata.query_offset("G", "T", 0), 1)


class BatchTests(_Case):
    """The batch limits: maxMsgNums; 32 / 256 KiB in memory; 8 / 64 KiB "in disk"."""

    def test_is_batch_full(self) -> None:
        self.assertFalse(is_batch_full(10**6, 1, 0, 0, True))  # (the first always goes)
        self.assertTrue(is_batch_full(1, 3, 3, 3, False))
        self.assertTrue(is_batch_full(1, 64, 100, 32, False))
        self.assertFalse(is_batch_full(1, 64, 100, 31, False))
        self.assertTrue(is_batch_full(1, 64, 100, 8, True))
        self.assertTrue(is_batch_full(1000, 64, 256 * 1024 - 999, 2, False))
        self.assertTrue(is_batch_full(1000, 64, 64 * 1024 - 999, 2, True))
        self.assertFalse(is_batch_full(1000, 64, 64 * 1024 - 1000, 2, True))

    def test_limits(self) -> None:
        """
        40 small messages: 32 in memory, 8 "in disk" (the suggestion then
        a slave's, with slaveReadEnable); 1 KiB bodies in disk: 64 KiB.
        """
        self.begin(messages=40, slave_read_enable=True)
        conn = self.conn()
        reply = self.pull(conn, flag=4, subscription="*", max_nums=64)
        self.assertEqual(reply.ext_fields and reply.ext_fields["nextBeginOffset"], "32")
        self.assertEqual(reply.ext_fields and reply.ext_fields["suggestWhichBrokerId"], "0")
        self.pulls().in_memory = 0
        reply = self.pull(conn, flag=4, subscription="*", max_nums=64)
        self.assertEqual(len(decode_messages(reply.body, MessageQueue("T", "b", 0))), 8)
        self.assertEqual(reply.ext_fields and reply.ext_fields["suggestWhichBrokerId"], "1")

    def test_bytes(self) -> None:
        """10 KiB records: 6 "in disk" (64 KiB), 25 in memory (256 KiB)."""
        self.fill(30, size=10_000)
        self.begin()
        conn = self.conn()
        self.pulls().in_memory = 0
        reply = self.pull(conn, flag=4, subscription="*", max_nums=64)
        self.assertEqual(len(decode_messages(reply.body, MessageQueue("T", "b", 0))), 6)
        self.assertEqual(reply.ext_fields and reply.ext_fields["suggestWhichBrokerId"], "0")  # (slaveReadEnable off)
        self.pulls().in_memory = 1 << 40
        reply = self.pull(conn, flag=4, subscription="*", max_nums=64)
        self.assertEqual(len(decode_messages(reply.body, MessageQueue("T", "b", 0))), 25)

    def test_limit_settings(self) -> None:
        """
        The maxTransfer* broker.conf keys (here 40 records, and 1000 bytes
        "in disk") bound a pull instead of 4.9.8's defaults.
        """
        self.begin(
            messages=50, max_transfer_count_on_message_in_memory=40, max_transfer_bytes_on_message_in_disk=1000
        )
        conn = self.conn()
        reply = self.pull(conn, flag=4, subscription="*", max_nums=64)
        self.assertEqual(reply.ext_fields and reply.ext_fields["nextBeginOffset"], "40")
        size = len(reply.body) // 40
        self.pulls().in_memory = 0
        reply = self.pull(conn, flag=4, subscription="*", max_nums=64)
        self.assertEqual(len(decode_messages(reply.body, MessageQueue("T", "b", 0))), 1000 // size)
        self.assertLess(1000 // size, 8)


class GatherTests(_Case):
    """A pull's records, read from the log with as few reads as is cheap."""

    def test_interleaved_queues(self) -> None:
        """
        A queue whose records alternate with another queue's: one read of
        the span, the records cut out of it; the body is the records as
        stored.
        """
        log = CommitLog.open(self.store, segment_size=64 * 1024, clock=fixed_clock)
        for i in range(40):
            log.put(Message("T", b"%05d" % i + b"x" * 95, queue_id=i % 2))
        log.close()
        broker = self.begin()
        reads: list[tuple[int, int]] = []
        store_log = broker.store.commitlog
        assert store_log is not None
        real = store_log.read

        def read(offset: int, limit: int) -> bytes:
            reads.append((offset, limit))
            return real(offset, limit)

        self.patch(store_log, "read", read)
        reply = self.pull(self.conn(), flag=4, subscription="*", queue_id=1, max_nums=10)
        got = decode_messages(reply.body, MessageQueue("T", "b", 1))
        self.assertEqual([m.body[:5] for m in got], [b"%05d" % i for i in range(1, 20, 2)])
        units = store_log.consume_queues.units("T", 1, 0, 10)  # type: ignore[union-attr]
        self.assertEqual(reply.body, b"".join(real(u.offset, u.size) for u in units))
        self.assertEqual(reads, [(units[0].offset, units[-1].offset + units[-1].size - units[0].offset)])

    def test_far_apart(self) -> None:
        """Records far apart in the log (more than 16 KiB a record between): one read each."""
        units = [Unit(1000 + i * 40_000, 50, 0) for i in range(3)]
        log = _Log()
        log.max_offset = 1 << 20
        log.segment_size = 1 << 20
        result = get_message(_Queues(_Queue(units, 0, 3)), log, "T", 0, 0, 32, None, in_memory=1 << 30)  # type: ignore[arg-type]
        self.assertEqual(result.records, [b"r" * 50] * 3)
        self.assertEqual(log.reads, [(u.offset, 50) for u in units])

    def test_span_short(self) -> None:
        """A span the log does not give whole (a segment's end inside it): one read a run."""
        units = [Unit(1000, 50, 0), Unit(1100, 50, 0)]
        log = _Log()
        log.limit = 60
        result = get_message(_Queues(_Queue(units, 0, 2)), log, "T", 0, 0, 32, None, in_memory=1 << 30)  # type: ignore[arg-type]
        self.assertEqual(result.records, [b"r" * 50] * 2)
        self.assertEqual(log.reads, [(1000, 150), (1000, 50), (1100, 50)])


class WalkTests(SynchronousTestCase):
    """The compiled unit walk (C{_speedups.pull_walk}) and its twin, L{_walk_units}, agree."""

    @settings(deadline=None, derandomize=True, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
    @given(
        units=st.lists(
            st.tuples(
                st.sampled_from([0, 100, 150, 990, 1000, 1050, 3000, 4990]) | st.integers(-(2**63), 2**63 - 1),
                st.sampled_from([50, 0, -1, 10]) | st.integers(-(2**31), 2**31 - 1),
                st.integers(-3, 3),
            ),
            max_size=40,
        ),
        start=st.sampled_from(
            [[0, 0, 0, 0, -1, 0], [2, 100, 5, 900, -1, 2], [0, 0, 1, 10, 2000, 1], [0, 0, 1, 10, 2**63 + 5, 1]]
        ),
        runs=st.sampled_from([[], [[900, 1000]], [[950, 990]]]),
        bounds=st.tuples(
            st.sampled_from([1, 3, 32]), st.sampled_from([120, 256 * 1024]), st.sampled_from([2, 32]),
            st.sampled_from([60, 64 * 1024]), st.sampled_from([1, 8]), st.sampled_from([-5, 1040, 1 << 40]),
        ),
        filtered=st.booleans(),
    )
    def test_agree(
        self, units: list[tuple[int, int, int]], start: list[int], runs: list[list[int]],
        bounds: tuple[int, ...], filtered: bool,
    ) -> None:
        from rmqha.remoting.pulls import _walk_units
        from rmqha.store import _record

        compiled = getattr(_record._accel, "pull_walk", None)
        if compiled is None:
            raise SkipTest("no compiled accelerator (or RMQHA_PURE=1)")
        chunk = b"".join(UNIT.pack(*u) for u in units)
        matches = (lambda code: code % 2 == 0) if filtered else None
        answers = []
        for step in (compiled, _walk_units):
            walk, taken = list(start), [list(r) for r in runs]
            full = step(chunk, walk, taken, matches, *bounds, 1000, 5000, 1000)
            answers.append((full, walk, taken))
        self.assertEqual(answers[0], answers[1])


class _Queue:
    def __init__(self, units: list[Unit], min_offset: int, max_offset: int) -> None:
        self._units, self._min, self.max_offset = units, min_offset, max_offset

    def min_offset(self, log_min: int) -> int:
        return self._min

    def units(self, logical: int, count: int) -> list[Unit]:
        return self._units[logical - self._min : logical - self._min + count]

    def unit_bytes(self, logical: int, count: int) -> bytes:
        return b"".join(UNIT.pack(u.offset, u.size, u.tags_code) for u in self.units(logical, count))


class _Queues:
    file_size = 20 * 10

    def __init__(self, queue: _Queue) -> None:
        self._queue = queue

    def queue(self, topic: str, queue_id: int) -> _Queue:
        return self._queue


class _Log:
    min_offset = 1000
    max_offset = 5000
    segment_size = 1000

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []
        self.limit = 1 << 30

    def read(self, offset: int, size: int) -> bytes:
        self.reads.append((offset, size))
        return b"r" * min(size, self.limit)


class StoreLookupTests(SynchronousTestCase):
    """L{get_message}'s statuses a small store does not reach: removed log, missing slice, too small."""

    def lookup(self, queue: _Queue, offset: int, correct: bool = True) -> Any:
        return get_message(_Queues(queue), _Log(), "T", 0, offset, 32, None, in_memory=1 << 30, correct_offsets=correct)  # type: ignore[arg-type]

    def test_too_small(self) -> None:
        result = self.lookup(_Queue([], 5, 9), 2)
        self.assertEqual((result.status, result.next_begin_offset), (GetMessageStatus.OFFSET_TOO_SMALL, 5))
        result = self.lookup(_Queue([], 5, 9), 2, correct=False)
        self.assertEqual(result.next_begin_offset, 2)

    def test_removing(self) -> None:
        """Units pointing before the log's min: MESSAGE_WAS_REMOVING, skipping to the next file."""
        units = [Unit(100, 50, 0), Unit(150, 50, 0), Unit(1000, 50, 0)]
        result = self.lookup(_Queue(units, 0, 3), 0)
        self.assertEqual(result.status, GetMessageStatus.FOUND)
        self.assertEqual((result.count, result.records), (1, [b"r" * 50]))
        result = self.lookup(_Queue(units[:2], 0, 3), 0)
        self.assertEqual((result.status, result.next_begin_offset), (GetMessageStatus.MESSAGE_WAS_REMOVING, 2))

    def test_found_null(self) -> None:
        result = self.lookup(_Queue([], 0, 30), 12)
        self.assertEqual((result.status, result.next_begin_offset), (GetMessageStatus.OFFSET_FOUND_NULL, 20))


class SlaveTests(_Case):
    """A slave serves data; offsets are not corrected (PULL_RETRY_IMMEDIATELY) nor committed."""

    def test_slave(self) -> None:
        broker = self.begin(Role.SLAVE, messages=3)
        conn = self.conn()
        reply = self.pull(conn, flag=1 | 4, subscription="*", commit=2)
        self.assertEqual(reply.code, ResponseCode.SUCCESS)
        self.assertEqual(broker.metadata.query_offset("G", "T", 0), -1)
        reply = self.pull(conn, flag=4, subscription="*", offset=9)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.PULL_RETRY_IMMEDIATELY, "OFFSET_OVERFLOW_BADLY"))
        self.assertEqual(reply.ext_fields and reply.ext_fields["nextBeginOffset"], "9")

    def test_offset_check_in_slave(self) -> None:
        self.begin(Role.SLAVE, messages=3, offset_check_in_slave=True)
        reply = self.pull(self.conn(), flag=4, subscription="*", offset=9)
        self.assertEqual((reply.code, reply.ext_fields and reply.ext_fields["nextBeginOffset"]), (ResponseCode.PULL_OFFSET_MOVED, "3"))


class FailoverReadTests(_Case):
    """
    A failover node answers pulls only as the master or as a slave whose
    log passed the checks against its master (L{RoleMachine.read_refusal});
    else SYSTEM_BUSY naming why, which a genuine client takes as an error
    and pulls again later, from the route's master.
    """

    def failover(self) -> Broker:
        return self.begin(
            Role.MASTER, messages=3, coordinator="etcd:http://127.0.0.1:2379", group="g", node_id="n0",
            advertise="127.0.0.1:10912", insecure_group=True,
        )

    def test_standing_by(self) -> None:
        broker = self.failover()
        self.assertIs(broker.roles.state, RoleState.STANDBY)
        reply = self.pull(self.conn(), flag=4, subscription="*")
        self.assertEqual(
            (reply.code, reply.remark),
            (
                ResponseCode.SYSTEM_BUSY,
                "[rmqha] not serving reads: this failover node is standing by: neither the elected master "
                "nor a slave following it",
            ),
        )
        self.assertEqual(reply.body, b"")

    def test_slave_until_checked(self) -> None:
        broker = self.failover()
        broker.become_slave("tcp:host=127.0.0.1:port=10912", ("n1", 1))
        self.reactor.advance(0.1)
        conn = self.conn()
        reply = self.pull(conn, flag=4, subscription="*")
        self.assertEqual(reply.code, ResponseCode.SYSTEM_BUSY)
        self.assertIn("a slave whose log has not yet passed the checks", reply.remark or "")
        broker.roles.service.reconciled = True  # (test_epochs drives the real checks)
        reply = self.pull(conn, flag=4, subscription="*")
        self.assertEqual((reply.code, reply.remark), (ResponseCode.SUCCESS, "FOUND"))


class LongPollingTests(_Case):
    """Held pulls: woken by the queue's growth, or answered at their time; once; dropped on close; bounded."""

    def test_woken(self) -> None:
        """A held pull is answered when its queue grows, with what came, once; the commit happened on the first pass only."""
        broker = self.begin(messages=2)
        conn = self.conn()
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(offset=2, flag=1 | 2 | 4, subscription="*", commit=2))
        self.assertEqual(conn.answers(opaque), [])
        self.assertEqual(self.pulls().held_count(), 1)
        broker.metadata.commit_offset("G", "T", 0, 0)
        self.put(broker, topic="T")
        (reply,) = conn.answers(opaque)
        self.assertEqual(reply.code, ResponseCode.SUCCESS)
        self.assertEqual([m.queue_offset for m in decode_messages(reply.body, MessageQueue("T", "b", 0))], [2])
        self.assertEqual(broker.metadata.query_offset("G", "T", 0), 0)
        self.reactor.advance(20)
        self.assertEqual(conn.answers(opaque), [])
        self.assertEqual(self.pulls().held_count(), 0)

    def test_held_pulls_hurry_dispatch(self) -> None:
        """
        While a pull is held, an append reaches it within 1 ms (the
        store's DISPATCH_DELAY); with none held, dispatch waits 10 ms
        (DISPATCH_IDLE_DELAY), and a pull that parks meanwhile brings it
        forward to 1 ms.
        """
        from rmqha.store.service import DISPATCH_DELAY

        broker = self.begin(messages=2)
        conn = self.conn()
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(offset=2, flag=2 | 4, subscription="*"))
        log = broker.store.commitlog
        assert log is not None
        log.put(Message("T", b"new", queue_id=0))
        self.reactor.advance(DISPATCH_DELAY)
        (reply,) = conn.answers(opaque)
        self.assertEqual(reply.code, ResponseCode.SUCCESS)
        # None held: the next append waits; a pull that parks hurries it.
        log.put(Message("T", b"newer", queue_id=0))
        self.reactor.advance(DISPATCH_DELAY)
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(offset=3, flag=2 | 4, subscription="*"))
        self.assertEqual(conn.answers(opaque), [])
        self.reactor.advance(DISPATCH_DELAY)
        (reply,) = conn.answers(opaque)
        self.assertEqual(
            [m.queue_offset for m in decode_messages(reply.body, MessageQueue("T", "b", 0))], [3]
        )

    def test_other_queue(self) -> None:
        broker = self.begin(messages=2)
        conn = self.conn()
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(queue_id=1, flag=2 | 4, subscription="*"))
        self.put(broker)
        self.assertEqual(conn.answers(opaque), [])

    def test_timeout(self) -> None:
        """No growth: PULL_NOT_FOUND at the hold's end, capped at brokerSuspendMaxTimeMillis."""
        self.begin(messages=1, broker_suspend_max_time_millis=5000)
        conn = self.conn()
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(offset=1, flag=2 | 4, subscription="*", suspend=60000))
        self.reactor.advance(4.9)
        self.assertEqual(conn.answers(opaque), [])
        self.reactor.advance(0.2)
        (reply,) = conn.answers(opaque)
        self.assertEqual((reply.code, reply.remark), (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE"))

    def test_short_polling(self) -> None:
        self.begin(messages=1, long_polling_enable=False)
        conn = self.conn()
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(offset=1, flag=2 | 4, subscription="*"))
        self.reactor.advance(1.01)
        self.assertEqual(len(conn.answers(opaque)), 1)

    def test_closed(self) -> None:
        """A closed connection's held pulls are dropped, never answered."""
        broker = self.begin(messages=1)
        conn = self.conn()
        conn.send(RequestCode.PULL_MESSAGE, _pull(offset=1, flag=2 | 4, subscription="*"))
        conn.close()
        self.assertEqual(self.pulls().held_count(), 0)
        self.put(broker)
        self.reactor.advance(20)
        self.assertEqual(conn.transport.value(), b"")

    def test_slave_woken(self) -> None:
        """On a slave too, at once (4.9.8's slaves wait for their 5 s check)."""
        broker = self.begin(Role.SLAVE, messages=1)
        conn = self.conn()
        opaque = conn.send(RequestCode.PULL_MESSAGE, _pull(offset=1, flag=2 | 4, subscription="*"))
        self.put(broker)
        (reply,) = conn.answers(opaque)
        self.assertEqual(reply.code, ResponseCode.SUCCESS)

    def test_bounds(self) -> None:
        """Held pulls per connection and in all are bounded; each refusal names its bound."""
        self.begin(messages=1)
        self.pulls().limits = HoldLimits(per_connection=2, total=3)
        a, b = self.conn(), self.conn()
        held = _pull(offset=1, flag=2 | 4, subscription="*")
        a.send(RequestCode.PULL_MESSAGE, held)
        a.send(RequestCode.PULL_MESSAGE, held)
        reply = a.ask(RequestCode.PULL_MESSAGE, held)
        self.assertEqual(reply.code, ResponseCode.SYSTEM_BUSY)
        self.assertIn("held pulls per connection: 2", reply.remark or "")
        b.send(RequestCode.PULL_MESSAGE, held)
        reply = b.ask(RequestCode.PULL_MESSAGE, held)
        self.assertIn("held pulls in all: 3", reply.remark or "")
        a.close()
        self.assertEqual(self.pulls().held_count(), 1)


class OffsetRequestTests(_Case):
    """GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, VIEW_MESSAGE_BY_ID."""

    def test_offsets(self) -> None:
        broker = self.begin(messages=4)
        conn = self.conn()
        q = {"topic": "T", "queueId": "0"}
        self.assertEqual(conn.ask(RequestCode.GET_MAX_OFFSET, q).ext_fields, {"offset": "4"})
        self.assertEqual(conn.ask(RequestCode.GET_MIN_OFFSET, q).ext_fields, {"offset": "0"})
        self.assertEqual(conn.ask(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "1"}).ext_fields, {"offset": "0"})
        log = broker.store.commitlog
        assert log is not None
        records = [r for r in log.records() if hasattr(r, "store_timestamp")]
        stamp = records[0].store_timestamp
        reply = conn.ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": str(stamp)})
        self.assertEqual(reply.code, ResponseCode.SUCCESS)
        self.assertIn(reply.ext_fields and reply.ext_fields["offset"], {"0", "1", "2", "3"})
        reply = conn.ask(RequestCode.GET_EARLIEST_MSG_STORETIME, q)
        self.assertEqual(reply.ext_fields, {"timestamp": str(stamp)})
        reply = conn.ask(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(records[1].offset)})
        self.assertEqual(reply.body, log.read(records[1].offset, records[1].size))
        reply = conn.ask(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(records[1].offset + 1)})
        self.assertEqual(reply.code, ResponseCode.SYSTEM_ERROR)

    def test_vip_port(self) -> None:
        """The VIP port answers the offset requests and heartbeats, not PULL_MESSAGE."""
        self.begin(messages=2, listen="tcp:10911:interface=127.0.0.1")
        (factory,) = [f for _, f, *_ in self.reactor.tcpServers if getattr(f, "name", None) == "vip"]
        vip = _Conn(factory, 45000)
        self.assertIn(RequestCode.PULL_MESSAGE, NOT_ON_VIP)
        self.assertEqual(self.pull(vip, flag=4, subscription="*").code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        self.assertEqual(vip.ask(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"}).ext_fields, {"offset": "2"})
        self.assertEqual(vip.ask(RequestCode.HEART_BEAT, body=_heartbeat()).code, ResponseCode.SUCCESS)
        main = _Conn(self.remoting_factory(), 45001)
        self.assertEqual(json.loads(main.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}).body), {"consumerIdList": ["10.0.0.1@1"]})


class ClientTests(_Case):
    """HEART_BEAT, GET_CONSUMER_LIST_BY_GROUP, UNREGISTER_CLIENT, NOTIFY_CONSUMER_IDS_CHANGED, expiry, bounds."""

    def ids(self, conn: _Conn, group: str = "G") -> Any:
        reply = conn.ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        return json.loads(reply.body)["consumerIdList"] if reply.code == ResponseCode.SUCCESS else reply.code

    def notified(self, conn: _Conn) -> list[str]:
        return [
            (f.ext_fields or {})["consumerGroup"]
            for f in conn.received()
            if not f.is_response and f.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and f.is_oneway
        ]

    def test_membership(self) -> None:
        broker = self.start()
        a, b = self.conn(), self.conn()
        self.assertEqual(a.ask(RequestCode.HEART_BEAT, body=_heartbeat("A", "New")).code, ResponseCode.SUCCESS)
        # The group and its retry topic are created.
        self.assertIsNotNone(broker.metadata.group("New"))
        retry = broker.metadata.topic("%RETRY%New")
        assert retry is not None
        self.assertEqual((retry.read_queue_nums, retry.perm), (1, 6))
        self.assertEqual(self.ids(a, "New"), ["A"])
        self.assertEqual(self.notified(a), ["New"])
        b.ask(RequestCode.HEART_BEAT, body=_heartbeat("B", "New"))
        self.assertEqual(sorted(self.ids(a, "New")), ["A", "B"])
        self.assertEqual(self.notified(a), ["New"])
        # Same heartbeat again: no change, no notice.
        a.ask(RequestCode.HEART_BEAT, body=_heartbeat("A", "New"))
        self.assertEqual(self.notified(a), [])
        b.ask(RequestCode.UNREGISTER_CLIENT, {"clientID": "B", "consumerGroup": "New"})
        self.assertEqual(self.ids(a, "New"), ["A"])
        self.assertEqual(self.notified(a), ["New"])
        b.ask(RequestCode.HEART_BEAT, body=_heartbeat("B", "New"))
        self.notified(a)
        b.close()
        self.assertEqual(self.ids(a, "New"), ["A"])
        self.assertEqual(self.notified(a), ["New"])
        a.close()
        self.assertEqual(self.ids(self.conn(), "New"), ResponseCode.SYSTEM_ERROR)

    def test_expiry(self) -> None:
        """A client silent for 120 s is removed (scanned every 10 s) and its connection closed."""
        self.start()
        a, b = self.conn(), self.conn()
        a.ask(RequestCode.HEART_BEAT, body=_heartbeat("A"))
        self.reactor.advance(60)
        b.ask(RequestCode.HEART_BEAT, body=_heartbeat("B"))
        self.reactor.advance(65)
        self.assertEqual(self.ids(b), ["B"])
        self.assertTrue(a.transport.disconnecting)
        self.assertFalse(b.transport.disconnecting)

    def test_bounds(self) -> None:
        self.start()
        handler = self.remoting_factory().wrappedFactory.handler
        assert isinstance(handler, BrokerDispatcher)
        handler.remoting.clients.limits = ClientLimits(clients=1, groups=1, subscriptions=2)
        a, b = self.conn(), self.conn()
        a.ask(RequestCode.HEART_BEAT, body=_heartbeat("A"))
        reply = b.ask(RequestCode.HEART_BEAT, body=_heartbeat("B"))
        self.assertEqual(reply.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("(its bound, clients)", reply.remark or "")
        reply = a.ask(RequestCode.HEART_BEAT, body=_heartbeat("A", "Other"))
        self.assertIn("(its bound, groups)", reply.remark or "")
        reply = a.ask(RequestCode.HEART_BEAT, body=_heartbeat("A", topics={"T": "*", "U": "*", "V": "*"}))
        self.assertIn("subscriptions", reply.remark or "")
        self.assertEqual(a.ask(RequestCode.HEART_BEAT, body=b"{").code, ResponseCode.SYSTEM_ERROR)

    def test_parse_heartbeat(self) -> None:
        """A genuine Java client's HeartbeatData (reference section 3.4)."""
        body = (
            b'{"clientID":"10.0.0.5@12345#987","producerDataSet":[{"groupName":"PG"}],"consumerDataSet":[{"groupName":"CG",'
            b'"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
            b'"unitMode":false,"subscriptionDataSet":[{"classFilterMode":false,"topic":"TopicTest","subString":"TagA",'
            b'"tagsSet":["TagA"],"codeSet":[2598919],"subVersion":1700000000000,"expressionType":"TAG"}]}]}'
        )
        data = parse_heartbeat(body)
        self.assertEqual((data.client_id, data.producer_groups), ("10.0.0.5@12345#987", ("PG",)))
        (sub,) = data.consumers[0].subscriptions
        self.assertEqual(sub, SubscriptionData("TopicTest", "TagA", frozenset({"TagA"}), frozenset({2598919}), 1700000000000))
        self.assertEqual(SubscriptionData.build("TopicTest", "TagA", "TAG", 1700000000000), sub)
        self.assertRaises(HeartbeatError, parse_heartbeat, b'{"clientID":1}')


class EndToEndTests(_Case):
    """
    rmqha.client's Producer and two PushConsumers of one group against the
    real broker handlers over in-memory connections: every message is
    consumed exactly once, and the group's offsets are committed.
    """

    def test_produce_consume(self) -> None:
        from rmqha.client import Producer, PushConsumer
        from rmqha.remoting.metadata import MetadataFile
        from rmqha.remoting.namesrv import RegisterBrokerBody, RegisterBrokerRequestHeader
        from rmqha.testing import FakeNameServer
        from tests.test_client_producer import _FactoryEndpoint

        broker = self.start(store_host=("127.0.0.1", 10911), group="broker-a")
        broker.metadata.update_topic(TopicConfig("Orders", 4, 4))
        clock = self.reactor
        ns = FakeNameServer(clock)
        ns.register_broker(
            RegisterBrokerRequestHeader("broker-a", "127.0.0.1:10911", "DefaultCluster", "127.0.0.1:10912", 0),
            RegisterBrokerBody(broker.metadata.table(MetadataFile.TOPICS)),
        )
        endpoint = _FactoryEndpoint(self.remoting_factory(), clock, "127.0.0.1", 10911)

        def pump(turns: int = 12, step: float = 0.0) -> None:
            for _ in range(turns):
                clock.advance(step)
                ns.flush()
                for connection in endpoint.connections:
                    connection.flush()

        got: dict[bytes, int] = {}
        by_consumer = [0, 0]

        def handler_of(n: int) -> Any:
            def handler(messages: list[Any]) -> None:
                by_consumer[n] += len(messages)
                for m in messages:
                    got[m.body] = got.get(m.body, 0) + 1

            return handler

        consumers = []
        for n in range(2):
            consumer = PushConsumer(
                None, [ns.client_endpoint(clock)], "CG", handler_of(n), clock=clock,
                endpoint_for=lambda addr: endpoint, client_id=f"10.9.9.9@{n}",
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            )
            consumer.subscribe("Orders")
            consumer.startService()
            consumers.append(consumer)
        producer = Producer(None, [ns.client_endpoint(clock)], "PG", clock=clock, endpoint_for=lambda addr: endpoint)
        producer.startService()
        pump()
        sent = [b"m%04d" % i for i in range(300)]
        for i, body in enumerate(sent):
            d = producer.send("Orders", body, tags="A")
            if i % 50 == 0:
                pump()
        pump()
        for _ in range(60):  # (a minute: rebalances, holds, commits)
            pump(4, 0.25)
            if len(got) == len(sent):
                break
        self.successResultOf(d)
        self.assertEqual(sorted(got), sorted(sent))
        self.assertEqual(set(got.values()), {1})
        self.assertTrue(all(by_consumer), by_consumer)
        # Both consumers are in the group, each with its share of the queues.
        reply = self.conn().ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"})
        self.assertEqual(sorted(json.loads(reply.body)["consumerIdList"]), ["10.9.9.9@0", "10.9.9.9@1"])
        pump(30, 0.25)  # (the 5 s commit)
        committed = sum(broker.metadata.query_offset("CG", "Orders", q) for q in range(4))
        self.assertEqual(committed, len(sent))
        for service in (producer, *consumers):
            service.stopService()
        pump()
