"""
Tests for L{rmqha.remoting.sends}: SEND_MESSAGE (10), SEND_MESSAGE_V2
(310) and SEND_BATCH_MESSAGE (320) on a broker's remoting port, over an
in-memory transport: the checks, topic auto-creation, the stored records,
msgIds, batches, and the put path's outcomes mapped as RocketMQ maps them.
"""

from __future__ import annotations

import errno
import gc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred, succeed

from rmqha.ha.config import Role
from rmqha.ha.group import PutMessageResult, PutStatus
from rmqha.puts import NotMasterError, NotStoredError
from rmqha.remoting._frames import FrameDecoder, RemotingCommand, encode, header_from_ext_fields
from rmqha.remoting.codes import RequestCode, ResponseCode, SerializeType
from rmqha.remoting.metadata import MetadataFile, SubscriptionGroupConfig, TopicConfig
from rmqha.remoting.sends import (
    MAX_BATCH_MESSAGES,
    STORED_CODES,
    BatchError,
    SendMessageResponseHeader,
    decode_batch,
    encode_batch_item,
    not_stored_reply,
)
from rmqha.store._batch import AppendResult
from rmqha.store._record import Record
from tests.test_remoting_broker import _BrokerCase


def _v2(topic: str = "TopicTest", queue: int = 1, properties: str | None = "UNIQ_KEY\x01AB12\x02WAIT\x01true\x02TAGS\x01TagA", **more: str) -> dict[str, str]:
    ext = {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue),
        "f": "0",
        "g": "1700000000123",
        "h": "7",
        "k": "false",
        "m": "false",
        "n": "broker-a",
    }
    if properties is not None:
        ext["i"] = properties
    ext.update(more)
    return ext


def _v1(topic: str = "TopicTest", queue: int = 1, **more: str) -> dict[str, str]:
    ext = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": str(queue),
        "sysFlag": "0",
        "bornTimestamp": "1700000000123",
        "flag": "7",
        "properties": "KEYS\x01k1 k2\x02WAIT\x01true",
        "unitMode": "false",
        "batch": "false",
    }
    ext.update(more)
    return ext


class _SendCase(_BrokerCase):
    def start(self, role: Role = Role.MASTER, **settings: Any) -> Any:
        settings.setdefault("store_host", ("127.0.0.1", 10911))
        broker = super().start(role, **settings)
        broker.metadata.update_topic(TopicConfig("TopicTest", 4, 4))
        return broker

    def records(self, broker: Any) -> list[Record]:
        return [r for r in broker.store.commitlog.records() if isinstance(r, Record)]


class SendTests(_SendCase):
    def test_v2_stored_and_answered(self) -> None:
        """
        A 310 send is stored with the header's fields, CLUSTER added and
        WAIT dropped (in the Java HashMap's order), the producer's address
        as born host; the reply is SUCCESS with msgId (store host +
        offset, upper-case hex), queueId, queueOffset, MSG_REGION and
        TRACE_ON.
        """
        broker = self.start()
        conn = self.connect("10.0.0.9")
        first = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"hello")
        second = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"again")
        self.assertEqual(first.code, ResponseCode.SUCCESS, first.remark)
        self.assertIsNone(first.remark)
        reply = header_from_ext_fields(SendMessageResponseHeader, first.ext_fields)
        self.assertEqual(reply.queue_id, 1)
        self.assertEqual(reply.queue_offset, 0)
        self.assertEqual(reply.msg_id, "7F00000100002A9F0000000000000000")
        self.assertEqual(first.ext("MSG_REGION"), "DefaultRegion")
        self.assertEqual(first.ext("TRACE_ON"), "true")
        (record, record2) = self.records(broker)
        self.assertEqual(header_from_ext_fields(SendMessageResponseHeader, second.ext_fields).queue_offset, 1)
        self.assertEqual(
            second.ext("msgId"), "7F00000100002A9F" + format(record2.offset, "016X")
        )
        self.assertEqual(record.topic, "TopicTest")
        self.assertEqual(record.queue_id, 1)
        self.assertEqual(record.flag, 7)
        self.assertEqual(record.body, b"hello")
        self.assertEqual(record.born_timestamp, 1700000000123)
        peer = conn.transport.getPeer()
        self.assertEqual(record.born_host, (peer.host, peer.port))
        self.assertEqual(record.store_host, ("127.0.0.1", 10911))
        # Java's HashMap order of {UNIQ_KEY, WAIT, TAGS, CLUSTER} (buckets 12, 13,
        # 14, 12: CLUSTER after UNIQ_KEY in bucket 12), WAIT removed.
        self.assertEqual(list(record.properties), ["UNIQ_KEY", "CLUSTER", "TAGS"])
        self.assertEqual(record.properties["CLUSTER"], "DefaultCluster")

    def test_v1_long_names(self) -> None:
        """Code 10 reads the long header names."""
        broker = self.start(cluster="C1")
        answer = self.connect().ask(RequestCode.SEND_MESSAGE, _v1(queue=3), b"x")
        self.assertEqual(answer.code, ResponseCode.SUCCESS, answer.remark)
        (record,) = self.records(broker)
        self.assertEqual(record.queue_id, 3)
        self.assertEqual(record.properties, {"KEYS": "k1 k2", "CLUSTER": "C1"})

    def test_binary_request(self) -> None:
        """A ROCKETMQ-serialized send is answered in kind."""
        self.start()
        answer = self.connect().ask(
            RequestCode.SEND_MESSAGE_V2, _v2(), b"x", serialize_type=SerializeType.ROCKETMQ
        )
        self.assertEqual(answer.code, ResponseCode.SUCCESS)

    def test_negative_queue_is_random(self) -> None:
        """A negative queueId lets the broker pick one of the write queues."""
        broker = self.start()
        conn = self.connect()
        queues = {int(conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(queue=-1), b"x").ext("queueId") or -1) for _ in range(40)}
        self.assertTrue(queues <= {0, 1, 2, 3})
        self.assertGreater(len(queues), 1)
        self.assertEqual({r.queue_id for r in self.records(broker)}, queues)

    def test_queue_out_of_range(self) -> None:
        """queueId >= max(read, write) queues is SYSTEM_ERROR, nothing stored."""
        broker = self.start()
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(queue=4), b"x")
        self.assertEqual(answer.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("queueId[4] is illegal", answer.remark or "")
        self.assertEqual(answer.ext("MSG_REGION"), "DefaultRegion")
        self.assertEqual(self.records(broker), [])

    def test_topic_checks(self) -> None:
        """TopicValidator's refusals, with 4.9.8's codes and remarks."""
        broker = self.start()
        conn = self.connect()
        for topic, code, remark in [
            (" ", ResponseCode.SYSTEM_ERROR, "The specified topic is blank."),
            ("a b", ResponseCode.SYSTEM_ERROR, "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"),
            ("t" * 128, ResponseCode.SYSTEM_ERROR, "The specified topic is longer than topic max length."),
            ("SCHEDULE_TOPIC_XXXX", ResponseCode.NO_PERMISSION, "Sending message to topic[SCHEDULE_TOPIC_XXXX] is forbidden."),
        ]:
            answer = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(topic=topic), b"x")
            self.assertEqual((answer.code, answer.remark), (code, remark))
        self.assertEqual(self.records(broker), [])

    def test_missing_header_field(self) -> None:
        """A missing required field is SYSTEM_ERROR naming it."""
        self.start()
        ext = _v2()
        del ext["g"]
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, ext, b"x")
        self.assertEqual(answer.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("'g'", answer.remark or "")

    def test_message_illegal(self) -> None:
        """A body above maxMessageSize, or properties above 32767 bytes: MESSAGE_ILLEGAL naming the limit."""
        broker = self.start()
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"x" * (4 * 1024 * 1024 + 1))
        self.assertEqual(answer.code, ResponseCode.MESSAGE_ILLEGAL)
        self.assertIn("4194304", answer.remark or "")
        props = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(properties="K\x01" + "v" * 32767), b"x")
        self.assertEqual(props.code, ResponseCode.MESSAGE_ILLEGAL)
        self.assertIn("the limit is 32767", props.remark or "")
        self.assertEqual(self.records(broker), [])

    def test_delay_and_transaction_refused(self) -> None:
        """rmqha has no schedule service or transactions: both refused, nothing stored."""
        broker = self.start()
        conn = self.connect()
        delayed = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(properties="DELAY\x013"), b"x")
        self.assertEqual(delayed.code, ResponseCode.MESSAGE_ILLEGAL)
        self.assertIn("DELAY=3", delayed.remark or "")
        tx = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(properties="TRAN_MSG\x01true"), b"x")
        self.assertEqual(tx.code, ResponseCode.NO_PERMISSION)
        self.assertEqual(self.records(broker), [])

    def test_multi_tag_sysflag(self) -> None:
        """A MULTI_TAG topic's messages get sysFlag MULTI_TAGS (0x2)."""
        broker = self.start()
        broker.metadata.update_topic(TopicConfig("Multi", 1, 1, topic_filter_type="MULTI_TAG"))
        self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="Multi", queue=0, f="1"), b"x")
        (record,) = self.records(broker)
        self.assertEqual(record.sysflag & 0x3, 0x3)


class AutoCreateTests(_SendCase):
    def test_created_from_tbw102(self) -> None:
        """
        An unknown topic is created from TBW102: min(d, 8) queues, perm
        without INHERIT, topics.json written with a new data version.
        """
        broker = self.start()
        before = broker.metadata.topics_version
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="NewTopic", queue=-1, d="4"), b"x")
        self.assertEqual(answer.code, ResponseCode.SUCCESS, answer.remark)
        config = broker.metadata.topic("NewTopic")
        self.assertEqual(config, TopicConfig("NewTopic", 4, 4, 6))
        self.assertNotEqual(broker.metadata.topics_version, before)
        with open(broker.metadata.path(MetadataFile.TOPICS), encoding="utf-8") as f:
            self.assertIn('"NewTopic"', f.read())
        self.assertNotIn(MetadataFile.TOPICS, broker.metadata.dirty)
        # Capped by TBW102's 8 write queues.
        self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="Wide", queue=0, d="32"), b"x")
        self.assertEqual(broker.metadata.topic("Wide"), TopicConfig("Wide", 8, 8, 6))

    def test_registers_at_once(self) -> None:
        """A created topic is registered with the NameServers at once (registerBrokerAll)."""
        broker = self.start()

        class Registration:
            running = True
            rounds = 0

            def topics_changed(self) -> None:
                self.rounds += 1

        broker.registration = registration = Registration()
        self.addCleanup(setattr, broker, "registration", None)
        conn = self.connect()
        conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="NewTopic", queue=0), b"x")
        conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="NewTopic", queue=0), b"x")
        self.assertEqual(registration.rounds, 1)

    def test_disabled(self) -> None:
        """With autoCreateTopicEnable false: TOPIC_NOT_EXIST, nothing created."""
        broker = self.start(auto_create_topic_enable=False)
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="NewTopic", queue=-1), b"x")
        self.assertEqual(answer.code, ResponseCode.TOPIC_NOT_EXIST)
        self.assertEqual(answer.remark, "topic[NewTopic] not exist, apply first please!")
        self.assertIsNone(broker.metadata.topic("NewTopic"))
        self.assertIsNone(broker.metadata.topic("TBW102"))

    def test_retry_topic_and_dlq(self) -> None:
        """
        A %RETRY% topic is created with one queue; a message whose
        reconsumeTimes reached maxReconsumeTimes goes to %DLQ%group
        (created, queue 0), as handleRetryAndDLQ does.
        """
        broker = self.start(auto_create_topic_enable=False)
        broker.metadata.update_group(SubscriptionGroupConfig("CG", retry_max_times=3))
        conn = self.connect()
        retry = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="%RETRY%CG", queue=-1, j="2"), b"r")
        self.assertEqual(retry.code, ResponseCode.SUCCESS, retry.remark)
        self.assertEqual(broker.metadata.topic("%RETRY%CG"), TopicConfig("%RETRY%CG", 1, 1, 6))
        dead = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="%RETRY%CG", queue=0, j="3"), b"d")
        self.assertEqual(dead.code, ResponseCode.SUCCESS, dead.remark)
        # The header's maxReconsumeTimes (l) wins from version 121 on.
        kept = conn.ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="%RETRY%CG", queue=0, j="3", l="5"), b"k")
        self.assertEqual(kept.code, ResponseCode.SUCCESS, kept.remark)
        r1, r2, r3 = self.records(broker)
        self.assertEqual((r1.topic, r1.reconsume_times), ("%RETRY%CG", 2))
        self.assertEqual((r2.topic, r2.queue_id, r2.reconsume_times), ("%DLQ%CG", 0, 3))
        self.assertEqual(r3.topic, "%RETRY%CG")
        self.assertEqual(broker.metadata.topic("%DLQ%CG"), TopicConfig("%DLQ%CG", 1, 1, 6))

    def test_retry_group_created(self) -> None:
        """An unknown group behind %RETRY% is created (autoCreateSubscriptionGroup)."""
        broker = self.start()
        self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="%RETRY%NewGroup", queue=0), b"x")
        self.assertEqual(broker.metadata.group("NewGroup"), SubscriptionGroupConfig("NewGroup"))


class BatchTests(_SendCase):
    def batch(self, *items: tuple[int, bytes, str]) -> bytes:
        return b"".join(encode_batch_item(f, b, p.encode()) for f, b, p in items)

    def test_batch_stored(self) -> None:
        """
        A 320 batch: each item its own record, consecutive queue offsets,
        its own properties then the batch's (WAIT and CLUSTER, joined by
        \\x02); the reply's msgId comma-joined, queueOffset the first's.
        """
        broker = self.start()
        body = self.batch((1, b"one", "UNIQ_KEY\x01U1"), (2, b"two", ""), (3, b"three", "UNIQ_KEY\x01U3\x02"))
        answer = self.connect().ask(
            RequestCode.SEND_BATCH_MESSAGE, _v2(properties="WAIT\x01true", m="true", queue=2), body
        )
        self.assertEqual(answer.code, ResponseCode.SUCCESS, answer.remark)
        records = self.records(broker)
        self.assertEqual([r.body for r in records], [b"one", b"two", b"three"])
        self.assertEqual([r.flag for r in records], [1, 2, 3])
        self.assertEqual([r.queue_offset for r in records], [0, 1, 2])
        self.assertEqual({r.queue_id for r in records}, {2})
        self.assertEqual(records[0].properties, {"UNIQ_KEY": "U1", "WAIT": "true", "CLUSTER": "DefaultCluster"})
        self.assertEqual(records[1].properties, {"WAIT": "true", "CLUSTER": "DefaultCluster"})
        self.assertEqual(records[2].properties["UNIQ_KEY"], "U3")
        self.assertEqual(answer.ext("msgId"), ",".join(r.msg_id for r in records))
        self.assertEqual(answer.ext("queueOffset"), "0")

    def test_batch_waits_once(self) -> None:
        """
        On a SYNC_MASTER without a slave a batch is stored and answered
        SLAVE_NOT_AVAILABLE with every msgId; on a slave it is refused.
        """
        broker = self.start(Role.SYNC_MASTER)
        body = self.batch((0, b"a", ""), (0, b"b", ""))
        answer = self.connect().ask(RequestCode.SEND_BATCH_MESSAGE, _v2(m="true", queue=0), body)
        self.assertEqual(answer.code, ResponseCode.SLAVE_NOT_AVAILABLE)
        self.assertEqual((answer.ext("msgId") or "").count(","), 1)
        self.assertEqual(broker.put_path.puts, 2)
        self.assertEqual(broker.put_path.put_statuses[PutStatus.SLAVE_NOT_AVAILABLE], 1)

    def test_batch_on_slave(self) -> None:
        broker = self.start(Role.SLAVE)
        body = self.batch((0, b"a", ""))
        answer = self.connect().ask(RequestCode.SEND_BATCH_MESSAGE, _v2(m="true", queue=0), body)
        self.assertEqual(answer.code, ResponseCode.SERVICE_NOT_AVAILABLE)
        self.assertEqual(self.records(broker), [])

    def test_batch_refusals(self) -> None:
        """Each bound and malformation: MESSAGE_ILLEGAL naming it, nothing stored."""
        broker = self.start()
        conn = self.connect()
        good = self.batch((0, b"x", ""))
        cases = [
            (good[:-3], {}, "reaches past the batch"),
            (b"", {}, "empty"),
            (good, {"f": "4"}, "transaction"),
            (good, {"i": "DELAY\x012"}, "delayed"),
        ]
        for body, more, text in cases:
            answer = conn.ask(RequestCode.SEND_BATCH_MESSAGE, _v2(m="true", **more), body)
            self.assertEqual(answer.code, ResponseCode.MESSAGE_ILLEGAL, body)
            self.assertIn(text, answer.remark or "")
        self.assertEqual(self.records(broker), [])

    def test_batch_limits(self) -> None:
        """More than the message or byte limit: MESSAGE_ILLEGAL naming the limit."""
        with self.assertRaisesRegex(BatchError, "more than 2 messages"):
            decode_batch(encode_batch_item(0, b"", b"") * 3, max_messages=2)
        self.assertEqual(MAX_BATCH_MESSAGES, 8192)
        self.start()
        big = encode_batch_item(0, b"x" * (4 * 1024 * 1024), b"")
        answer = self.connect().ask(RequestCode.SEND_BATCH_MESSAGE, _v2(m="true"), big)
        self.assertEqual(answer.code, ResponseCode.MESSAGE_ILLEGAL)
        self.assertIn("maxMessageSize is 4194304", answer.remark or "")

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=40), st.binary(max_size=20)), min_size=1, max_size=8)
    )
    def test_decode_round_trip(self, items: list[tuple[int, bytes, bytes]]) -> None:
        """decode_batch reads back what encodeMessage writes, and every prefix is refused."""
        body = b"".join(encode_batch_item(*item) for item in items)
        self.assertEqual(decode_batch(body), items)

    @settings(max_examples=150, deadline=None)
    @given(st.binary(max_size=80))
    def test_decode_garbage(self, body: bytes) -> None:
        """Any bytes decode or raise BatchError, never anything else."""
        try:
            decode_batch(body)
        except BatchError:
            pass


class MappingTests(_SendCase):
    """
    The put path's outcomes as replies: every PutStatus and every refusal.
    """

    def put_answers(self, broker: Any, outcome: Any) -> Any:
        broker.put = lambda message: outcome
        return self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"x")

    def test_stored_statuses(self) -> None:
        """The four stored statuses keep the msgId; only PUT_OK is SUCCESS."""
        broker = self.start()
        append = AppendResult(4096, 100, 12, 0, ("127.0.0.1", 10911))
        expected = {
            PutStatus.PUT_OK: 0,
            PutStatus.FLUSH_DISK_TIMEOUT: 10,
            PutStatus.FLUSH_SLAVE_TIMEOUT: 12,
            PutStatus.SLAVE_NOT_AVAILABLE: 11,
        }
        self.assertEqual(dict(STORED_CODES), expected)
        for status, code in expected.items():
            answer = self.put_answers(broker, succeed(PutMessageResult(status, append)))
            self.assertEqual(answer.code, code)
            self.assertEqual(answer.ext("msgId"), "7F00000100002A9F0000000000001000")
            self.assertEqual(answer.ext("queueOffset"), "12")

    def test_stored_not_enough(self) -> None:
        """IN_SYNC_REPLICAS_NOT_ENOUGH after the store: SYSTEM_ERROR (retried), no msgId."""
        broker = self.start()
        append = AppendResult(4096, 100, 12, 0, ("127.0.0.1", 10911))
        answer = self.put_answers(broker, succeed(PutMessageResult(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, append)))
        self.assertEqual(answer.code, ResponseCode.SYSTEM_ERROR)
        self.assertIsNone(answer.ext("msgId"))
        self.assertIn("stored at offset 4096", answer.remark or "")

    def test_refusals(self) -> None:
        """Every refusal of the put path, to a code the Java client retries."""
        full = NotStoredError(PutStatus.CREATE_MAPEDFILE_FAILED, "no space", errno.ENOSPC)
        cases = [
            (NotMasterError("this node is a slave"), ResponseCode.SERVICE_NOT_AVAILABLE, "this node is a slave"),
            (full, ResponseCode.SERVICE_NOT_AVAILABLE, "disk is full"),
            (NotStoredError(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, "0 replicas"), ResponseCode.SYSTEM_ERROR, "in-sync replicas not enough"),
            (NotStoredError(PutStatus.CREATE_MAPEDFILE_FAILED, "EIO"), ResponseCode.SYSTEM_ERROR, "create mapped file failed"),
            (NotStoredError(PutStatus.UNKNOWN_ERROR, "EIO"), ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
        ]
        retried = {1, 14, 16, 17, 204, 205}  # DefaultMQProducer.retryResponseCodes
        broker = self.start()
        for error, code, text in cases:
            self.assertEqual(not_stored_reply(error)[0], code)
            self.assertIn(code, retried)

            def put(message: Any, error: Exception = error) -> Deferred[Any]:
                raise error

            broker.put = put
            answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"x")
            self.assertEqual(answer.code, code)
            self.assertIn(text, answer.remark or "")

    def test_sync_master_without_slave(self) -> None:
        """A SYNC_MASTER with no slave: stored, SLAVE_NOT_AVAILABLE (11)."""
        self.start(Role.SYNC_MASTER)
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"x")
        self.assertEqual(answer.code, ResponseCode.SLAVE_NOT_AVAILABLE)
        self.assertIsNotNone(answer.ext("msgId"))

    def test_min_in_sync_refused(self) -> None:
        """minInSyncReplicas 2 and no slave: SYSTEM_ERROR, nothing stored."""
        broker = self.start(Role.SYNC_MASTER, in_sync_replicas=2, min_in_sync_replicas=2)
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"x")
        self.assertEqual(answer.code, ResponseCode.SYSTEM_ERROR)
        self.assertIn("in-sync replicas not enough", answer.remark or "")
        self.assertEqual(self.records(broker), [])

    def test_slave_refuses(self) -> None:
        """A slave answers SERVICE_NOT_AVAILABLE and creates no topic."""
        broker = self.start(Role.SLAVE)
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(topic="NewTopic"), b"x")
        self.assertEqual(answer.code, ResponseCode.SERVICE_NOT_AVAILABLE)
        self.assertIn("slave", answer.remark or "")
        self.assertIsNone(broker.metadata.topic("NewTopic"))

    def test_waiting_sends_bounded(self) -> None:
        """
        Sends waiting for their verdict hold no body, are answered when
        the wait ends, and at most 256 wait per connection: the next is
        SYSTEM_BUSY [OVERLOAD] at once, nothing stored (the protocol's
        bound on requests in service).
        """
        broker = self.start()
        waits: list[Deferred[PutMessageResult]] = []

        def put(message: Any) -> Deferred[PutMessageResult]:
            waits.append(Deferred())
            return waits[-1]

        broker.put = put
        conn = self.connect()
        conn.transport.clear()
        body = b"b" * 1000
        conn.protocol.dataReceived(
            b"".join(encode(RemotingCommand(code=310, opaque=n, ext_fields=_v2(), body=body)) for n in range(257))
        )
        self.assertEqual(len(waits), 256)
        decoder = FrameDecoder()
        decoder.feed(conn.transport.value())
        busy = decoder.next_command()
        assert busy is not None
        self.assertEqual((busy.code, busy.opaque), (ResponseCode.SYSTEM_BUSY, 256))
        self.assertIn("[OVERLOAD]", busy.remark or "")
        # No request with its body is alive while they wait.
        gc.collect()
        alive = [o for o in gc.get_objects() if isinstance(o, RemotingCommand) and o.body == body]
        self.assertEqual(alive, [])
        conn.transport.clear()
        waits[0].callback(PutMessageResult(PutStatus.PUT_OK, AppendResult(0, 100, 0, 0, ("127.0.0.1", 10911))))
        decoder = FrameDecoder()
        decoder.feed(conn.transport.value())
        done = decoder.next_command()
        assert done is not None
        self.assertEqual((done.code, done.opaque), (ResponseCode.SUCCESS, 0))


class StoreHostTests(_BrokerCase):
    def test_broker_ip1_and_listen_port(self) -> None:
        """
        Without --store-host, a broker with --listen writes brokerIP1:listenPort
        as STOREHOST, so msgIds name its remoting port (as RocketMQ's).
        """
        from rmqha.assemble import build_service
        from rmqha.settings import BrokerSettings

        service: Any = build_service(
            BrokerSettings(
                store_dir=self.store, ha_listen="tcp:0", listen="tcp:10999",
                broker_ip1="10.1.2.3", segment_size=64 * 1024,
            ),
            self.reactor,
        )
        service.startService()
        self.addCleanup(service.stopService)
        service.metadata.update_topic(TopicConfig("TopicTest", 4, 4))
        answer = self.connect().ask(RequestCode.SEND_MESSAGE_V2, _v2(), b"x")
        self.assertEqual(answer.code, ResponseCode.SUCCESS, answer.remark)
        self.assertEqual(answer.ext("msgId"), "0A010203" "00002AF7" "0000000000000000")
        (record,) = [r for r in service.store.commitlog.records() if isinstance(r, Record)]
        self.assertEqual(record.store_host, ("10.1.2.3", 10999))


class SettingTests(_BrokerCase):
    def test_auto_create_setting(self) -> None:
        """--auto-create-topic-enable / autoCreateTopicEnable: true by default, true|false."""
        from rmqha.settings import BrokerSettings, SettingsError

        self.assertTrue(BrokerSettings().auto_create_topic_enable)
        conf = BrokerSettings.from_sources(conf={"autoCreateTopicEnable": "false"}, conf_path="b.conf")
        self.assertFalse(conf.auto_create_topic_enable)
        flag = BrokerSettings.from_sources(flags={"auto-create-topic-enable": "FALSE"})
        self.assertFalse(flag.auto_create_topic_enable)
        with self.assertRaisesRegex(SettingsError, "--auto-create-topic-enable: 'no' is not true or false"):
            BrokerSettings.from_sources(flags={"auto-create-topic-enable": "no"})
