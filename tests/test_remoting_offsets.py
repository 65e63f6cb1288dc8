"""
Tests for L{rmqha.remoting.offsets}: QUERY_CONSUMER_OFFSET (14) and
UPDATE_CONSUMER_OFFSET (15) on a broker's remoting port, driven with the
codec's frames over an in-memory transport, as 4.9.8's
C{ConsumerManageProcessor} answers them.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from rmqha.ha.config import Role
from rmqha.remoting._frames import (
    CustomHeaderError,
    RemotingCommand,
    encode,
    header_from_ext_fields,
    header_to_ext_fields,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import ConsumerOffsetTable, MetadataFile, MetadataLimits, load_file
from rmqha.remoting.offsets import (
    NOT_FOUND_REMARK,
    ConsumerOffsets,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    QueueHead,
    UpdateConsumerOffsetRequestHeader,
    consume_queue_head,
    in_memory_bytes,
)
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog
from tests._helpers import fixed_clock
from tests.test_remoting_broker import _BrokerCase


def _update(group: str, topic: str, queue_id: int | str, offset: int | str) -> dict[str, str]:
    return {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "commitOffset": str(offset)}


def _query(group: str, topic: str, queue_id: int | str) -> dict[str, str]:
    return {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)}


class HeaderTests(SynchronousTestCase):
    """
    The custom headers carry 4.9.8's field names and Java types.
    """

    def test_wire_names(self) -> None:
        self.assertEqual(
            header_to_ext_fields(UpdateConsumerOffsetRequestHeader("G", "T", 3, 120, bname="broker-a")),
            {"consumerGroup": "G", "topic": "T", "queueId": "3", "commitOffset": "120", "bname": "broker-a"},
        )
        self.assertEqual(
            header_from_ext_fields(QueryConsumerOffsetRequestHeader, _query("G", "T", 3)),
            QueryConsumerOffsetRequestHeader("G", "T", 3),
        )
        self.assertEqual(header_to_ext_fields(QueryConsumerOffsetResponseHeader(7)), {"offset": "7"})

    def test_java_types(self) -> None:
        """
        C{queueId} is a Java int, C{commitOffset} a long; every field but
        C{bname} is required (C{@CFNotNull}).
        """
        self.assertRaises(
            CustomHeaderError, header_from_ext_fields, QueryConsumerOffsetRequestHeader, _query("G", "T", 1 << 31)
        )
        header = header_from_ext_fields(UpdateConsumerOffsetRequestHeader, _update("G", "T", 0, 1 << 40))
        self.assertEqual(header.commit_offset, 1 << 40)
        e = self.assertRaises(
            CustomHeaderError, header_from_ext_fields, UpdateConsumerOffsetRequestHeader, _query("G", "T", 0)
        )
        self.assertIn("'commitOffset' is missing", str(e))


class UpdateAndQueryTests(_BrokerCase):
    """
    UPDATE_CONSUMER_OFFSET stores, QUERY_CONSUMER_OFFSET answers what is
    stored, on masters and slaves, persisted in consumerOffset.json.
    """

    def test_commit_then_query(self) -> None:
        """
        A committed offset is answered in the C{offset} ext field; a later
        commit overwrites it, a lower one too (a consumer's reset); other
        queues and groups are apart.
        """
        broker = self.start()
        connection = self.connect()
        response = connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G1", "Orders", 2, 120))
        self.assertEqual((response.code, response.remark), (ResponseCode.SUCCESS, None))
        response = connection.ask(RequestCode.QUERY_CONSUMER_OFFSET, _query("G1", "Orders", 2))
        self.assertEqual((response.code, response.ext_fields), (ResponseCode.SUCCESS, {"offset": "120"}))

        connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G1", "Orders", 2, 40))
        response = connection.ask(RequestCode.QUERY_CONSUMER_OFFSET, _query("G1", "Orders", 2))
        self.assertEqual(response.ext_fields, {"offset": "40"})
        connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G2", "Orders", 1, 9))
        self.assertEqual(broker.metadata.consumer_offsets, {"Orders@G1": {2: 40}, "Orders@G2": {1: 9}})

    def test_oneway_commit(self) -> None:
        """
        A genuine consumer commits oneway (C{RemoteBrokerOffsetStore}):
        stored, and nothing is answered.
        """
        broker = self.start()
        connection = self.connect()
        connection.transport.clear()
        request = RemotingCommand(
            code=RequestCode.UPDATE_CONSUMER_OFFSET, opaque=99, flag=2, ext_fields=_update("G1", "Orders", 0, 5)
        )
        connection.protocol.dataReceived(encode(request))
        self.assertEqual(connection.transport.value(), b"")
        self.assertEqual(broker.metadata.query_offset("G1", "Orders", 0), 5)

    def test_slave_takes_commits(self) -> None:
        """
        A slave takes commits and answers queries (a consumer commits to a
        slave while its master is down); its next sync from the master
        overwrites them (#1094, docs/remoting.md).
        """
        broker = self.start(Role.SLAVE)
        connection = self.connect()
        response = connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G1", "Orders", 0, 7))
        self.assertEqual(response.code, ResponseCode.SUCCESS)
        response = connection.ask(RequestCode.QUERY_CONSUMER_OFFSET, _query("G1", "Orders", 0))
        self.assertEqual(response.ext_fields, {"offset": "7"})
        self.assertEqual(broker.metadata.consumer_offsets, {"Orders@G1": {0: 7}})

    def test_persisted_every_5_seconds(self) -> None:
        """
        Commits are written to C{config/consumerOffset.json} by the flush
        every 5 s (C{flushConsumerOffsetInterval}), in RocketMQ's format,
        and a restarted broker answers them.
        """
        broker = self.start()
        connection = self.connect()
        connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G1", "Orders", 3, 120))
        path = os.path.join(self.store, "config", "consumerOffset.json")
        self.assertFalse(os.path.exists(path))
        self.reactor.advance(5)
        table = load_file(path, MetadataFile.CONSUMER_OFFSETS, MetadataLimits())
        assert isinstance(table, ConsumerOffsetTable)
        self.assertEqual(table.offsets, {"Orders@G1": {3: 120}})
        with open(path) as f:
            self.assertIn('"Orders@G1":{3:120\n', f.read())
        self.successResultOf(broker.stopService())

        self.reactor = MemoryReactorClock()  # (a new process)
        self.start()
        response = self.connect().ask(RequestCode.QUERY_CONSUMER_OFFSET, _query("G1", "Orders", 3))
        self.assertEqual(response.ext_fields, {"offset": "120"})

    def test_refusals(self) -> None:
        """
        A bad header, a name outside RocketMQ's rules or a negative queue
        id is SYSTEM_ERROR naming it, and stores nothing.
        """
        broker = self.start()
        connection = self.connect()
        for ext, named in [
            ({"consumerGroup": "G1", "topic": "Orders", "queueId": "0"}, "commitOffset"),
            (_update("G1", "Orders", "x", 1), "queueId"),
            (_update("G1", "Orders", 0, "1.5"), "commitOffset"),
            (_update("G1", "Or ders", 0, 1), "Or ders"),
            (_update("G" * 256, "Orders", 0, 1), "group"),
            (_update("G1", "Orders", -1, 1), "queue id -1"),
        ]:
            response = connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, ext)
            self.assertEqual(response.code, ResponseCode.SYSTEM_ERROR, ext)
            self.assertIn(named, response.remark or "")
        response = connection.ask(RequestCode.QUERY_CONSUMER_OFFSET, {"topic": "Orders", "queueId": "0"})
        self.assertEqual(response.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("consumerGroup", response.remark or "")
        self.assertEqual(broker.metadata.consumer_offsets, {})

    def test_bounded(self) -> None:
        """
        One request adds at most one queue entry, and none past the table's
        caps: a new key or queue beyond them is refused, naming the limit;
        overwriting a stored offset is always allowed.
        """
        broker = self.start()
        broker.metadata.limits = MetadataLimits(max_offset_keys=2, max_offset_entries=3)
        connection = self.connect()
        for ext in [_update("G1", "T", 0, 1), _update("G1", "T", 1, 1), _update("G2", "T", 0, 1)]:
            self.assertEqual(connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, ext).code, ResponseCode.SUCCESS)
        response = connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G3", "T", 0, 1))
        self.assertEqual(response.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("consumer offset keys", response.remark or "")
        response = connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G2", "T", 1, 1))
        self.assertIn("consumer offset entries", response.remark or "")
        response = connection.ask(RequestCode.UPDATE_CONSUMER_OFFSET, _update("G1", "T", 1, 99))
        self.assertEqual(response.code, ResponseCode.SUCCESS)
        self.assertEqual(broker.metadata.consumer_offsets, {"T@G1": {0: 1, 1: 99}, "T@G2": {0: 1}})


class NothingCommittedTests(_BrokerCase):
    """
    A query for a group that committed nothing: 0 when the queue's min
    offset is at most 0 and its unit 0 is not "in disk", else
    QUERY_NOT_FOUND with 4.9.8's remark, read from the store's consume
    queues.
    """

    consume_queues = True

    def fill(self, count: int) -> int:
        log = CommitLog.open(self.store, segment_size=64 * 1024, clock=fixed_clock)
        for i in range(count):
            log.put(Message("Orders", b"x" * 100, queue_id=i % 2))
        end = log.max_offset
        log.close()
        return end

    def ask(self, broker: Any, in_memory: int | None = None) -> RemotingCommand:
        request = RemotingCommand(
            code=RequestCode.QUERY_CONSUMER_OFFSET, opaque=1, ext_fields=_query("New", "Orders", 0)
        )
        offsets = ConsumerOffsets(lambda: broker.metadata, lambda: broker.store.commitlog, in_memory)
        answer = offsets.query_consumer_offset(request, None)
        assert isinstance(answer, RemotingCommand)
        return answer

    def test_empty_store(self) -> None:
        """
        An empty store: every queue is new, a new group starts at 0 (a
        genuine broker creates the empty consume queue and answers 0).
        """
        self.start()
        response = self.connect().ask(RequestCode.QUERY_CONSUMER_OFFSET, _query("New", "Orders", 0))
        self.assertEqual((response.code, response.ext_fields), (ResponseCode.SUCCESS, {"offset": "0"}))

    def test_young_queue(self) -> None:
        """
        A log that starts at 0 and lies within the in-memory window
        (40 % of physical memory): 0.
        """
        end = self.fill(20)
        broker = self.start()
        response = self.ask(broker, in_memory=end)
        self.assertEqual((response.code, response.ext_fields), (ResponseCode.SUCCESS, {"offset": "0"}))

    def test_in_disk(self) -> None:
        """
        Unit 0 more than the in-memory window behind the log's end:
        QUERY_NOT_FOUND, 4.9.8's remark; a committed offset is still
        answered.
        """
        end = self.fill(20)
        broker = self.start()
        response = self.ask(broker, in_memory=end - 1)
        self.assertEqual((response.code, response.remark), (ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK))
        self.assertIsNone(response.ext_fields)
        broker.metadata.commit_offset("New", "Orders", 0, 4)
        self.assertEqual(self.ask(broker, in_memory=end - 1).ext_fields, {"offset": "4"})

    def test_in_memory_default(self) -> None:
        """
        The window is 40 % of the machine's physical memory.
        """
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.assertEqual(in_memory_bytes(), total * 40 // 100)


class ConsumeQueueHeadTests(_BrokerCase):
    """
    L{consume_queue_head}: the queue's min offset and unit 0's commit-log
    offset, from the store's consume queues.
    """

    consume_queues = True

    def test_no_queue(self) -> None:
        """No log, a log without queues, or no such queue: the empty queue."""
        self.assertEqual(consume_queue_head(None, "T", 0), QueueHead(0, None))
        broker = self.start()
        self.assertEqual(consume_queue_head(broker.store.commitlog, "T", 0), QueueHead(0, None))

    def test_recent_queue(self) -> None:
        """
        A queue whose first message is recent in a long log: its unit 0 is
        where that message is (the old approximation took offset 0, and
        answered QUERY_NOT_FOUND where 4.9.8 answers 0).
        """
        log = CommitLog.open(self.store, segment_size=64 * 1024, clock=fixed_clock)
        for _ in range(50):
            log.put(Message("Old", b"x" * 500))
        first = log.max_offset
        log.put(Message("Young", b"y"))
        end = log.max_offset
        log.close()
        broker = self.start()
        self.assertEqual(consume_queue_head(broker.store.commitlog, "Young", 0), QueueHead(0, first))
        offsets = ConsumerOffsets(lambda: broker.metadata, lambda: broker.store.commitlog, end - first)
        request = RemotingCommand(code=RequestCode.QUERY_CONSUMER_OFFSET, opaque=1, ext_fields=_query("New", "Young", 0))
        answer = offsets.query_consumer_offset(request, None)
        assert isinstance(answer, RemotingCommand)
        self.assertEqual(answer.ext_fields, {"offset": "0"})
        answer = offsets.query_consumer_offset(
            RemotingCommand(code=RequestCode.QUERY_CONSUMER_OFFSET, opaque=1, ext_fields=_query("New", "Old", 0)), None
        )
        assert isinstance(answer, RemotingCommand)
        self.assertEqual(answer.code, ResponseCode.QUERY_NOT_FOUND)
