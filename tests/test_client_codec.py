"""
Tests for L{rmqha.client._codec}: what a 4.9.8 producer puts on the wire
(properties, batch bodies, unique ids, compression) and reads back (send
replies, routes).  Expected bytes are derived by hand from the Java
sources named in each test, not from rmqha.
"""

from __future__ import annotations

import zlib
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rmqha.client._codec import (
    BrokerData,
    Message,
    MessageQueue,
    QueueData,
    RouteError,
    SendReplyError,
    SendStatus,
    TopicRoute,
    UniqueIdFactory,
    check_message,
    compress_body,
    default_route_for,
    encode_batch,
    parse_route,
    properties_string,
    publish_queues,
    send_result,
)
from rmqha.remoting._frames import RemotingCommand, header_to_ext_fields
from rmqha.remoting.sends import SendMessageRequestHeaderV2, decode_batch
from rmqha.store._record import decode_properties



class PropertiesTests(SynchronousTestCase):
    def test_java_hashmap_order(self) -> None:
        """
        messageProperties2String walks the message's HashMap: with
        String.hashCode spread (h ^ h>>>16) & 15, KEYS is bucket 7,
        UNIQ_KEY 12, WAIT 13, TAGS 14 (0x272c19 -> 14), so a Java
        producer's string is KEYS, UNIQ_KEY, WAIT, TAGS whatever the
        order they were put in; no trailing separator.
        """
        message = Message("T", b"x", tags="TagA", keys=["k1", "k2"], unique_id="ID")
        self.assertEqual(
            properties_string(message.property_map()),
            "KEYS\x01k1 k2\x02UNIQ_KEY\x01ID\x02WAIT\x01true\x02TAGS\x01TagA",
        )

    def test_delay_and_user_properties(self) -> None:
        """
        A user property lands in its own bucket ('color' is 4); DELAY
        shares WAIT's bucket 13 and follows it (put later).
        """
        message = Message("T", b"x", properties={"color": "red"}, delay_level=3, unique_id="ID")
        text = properties_string(message.property_map())
        self.assertEqual(text, "color\x01red\x02UNIQ_KEY\x01ID\x02WAIT\x01true\x02DELAY\x013")
        self.assertEqual(
            decode_properties(text.encode()), {"color": "red", "UNIQ_KEY": "ID", "WAIT": "true", "DELAY": "3"}
        )

    def test_wait_false(self) -> None:
        """waitStoreMsgOK false is sent as WAIT=false."""
        self.assertEqual(Message("T", b"x", wait_store_msg_ok=False).property_map(), {"WAIT": "false"})


class CheckMessageTests(SynchronousTestCase):
    def test_refusals(self) -> None:
        """
        Validators.checkMessage and putUserProperty: each refusal is one
        line naming the topic or the property.
        """
        cases = [
            (Message("", b"x"), "is not 1-127 characters"),
            (Message("a b", b"x"), "is not 1-127 characters of %|a-zA-Z0-9_-"),
            (Message("T" * 128, b"x"), "is not 1-127 characters"),
            (Message("SCHEDULE_TOPIC_XXXX", b"x"), "system topic"),
            (Message("T", b""), "empty body"),
            (Message("T", b"x" * 11), "11-byte body (at most 10)"),
            (Message("T", b"x", properties={"TAGS": "a"}), "used by RocketMQ"),
            (Message("T", b"x", properties={"a": " "}), "blank"),
            (Message("T", b"x", delay_level=-1), "delay level -1"),
        ]
        for message, text in cases:
            with self.assertRaises(ValueError) as e:
                check_message(message, max_size=10)
            self.assertIn(text, str(e.exception))
            self.assertNotIn("\n", str(e.exception))
        check_message(Message("%RETRY%g|a-b_c", b"x" * 10), max_size=10)

    def test_separators_refused(self) -> None:
        """A property holding \\x01 or \\x02 cannot be written (the store's check)."""
        with self.assertRaises(ValueError) as e:
            properties_string(Message("T", b"x", properties={"a": "b\x02c"}).property_map())
        self.assertIn("separators", str(e.exception))


class BatchTests(SynchronousTestCase):
    def test_encode_messages_bytes(self) -> None:
        """
        MessageDecoder.encodeMessage per item: int32 size (20 + body + 2 +
        properties), int32 0, int32 0, int32 flag, int32 body length,
        body, int16 properties length, properties; items back to back.
        Hand-derived: item 1 is 20+5+2+22 = 49 (0x31) bytes, item 2 is
        20+2+2+32 = 56 (0x38) bytes.
        """
        p1 = "UNIQ_KEY\x01ID1\x02WAIT\x01true"
        p2 = "UNIQ_KEY\x01ID2\x02WAIT\x01true\x02TAGS\x01TagA"
        expected = (
            bytes.fromhex("00000031 00000000 00000000 00000000 00000005")
            + b"hello"
            + bytes.fromhex("0016")
            + p1.encode()
            + bytes.fromhex("00000038 00000000 00000000 00000007 00000002")
            + b"hi"
            + bytes.fromhex("0020")
            + p2.encode()
        )
        m1 = Message("T", b"hello", unique_id="ID1")
        m2 = Message("T", b"hi", flag=7, tags="TagA", unique_id="ID2")
        items = [(m.body, m.flag, properties_string(m.property_map())) for m in (m1, m2)]
        self.assertEqual(encode_batch(items), expected)

    @settings(deadline=None, derandomize=True, max_examples=25)
    @given(
        st.lists(
            st.tuples(
                st.binary(max_size=64),
                st.integers(-(2**31), 2**31 - 1),
                st.dictionaries(st.text("abcXYZ_", min_size=1, max_size=5), st.text("é日a\x00", max_size=6), max_size=4),
            ),
            min_size=1,
            max_size=5,
        )
    )
    def test_round_trip(self, raw: list[tuple[bytes, int, dict[str, str]]]) -> None:
        """
        Any items (non-ASCII properties included) decode back as encoded,
        by the broker's decoder.
        """
        items = [(body, flag, properties_string(props)) for body, flag, props in raw]
        data = encode_batch(items)
        self.assertEqual(decode_batch(data), [(f, b, p.encode()) for b, f, p in items])
        self.assertEqual(len(data), sum(22 + len(b) + len(p.encode()) for b, _, p in items))

class CompressionTests(SynchronousTestCase):
    def test_threshold_and_flag(self) -> None:
        """
        tryToCompressMessage: a body of compressMsgBodyOverHowmuch (4096)
        bytes or more is a zlib stream (Java's Deflater, level 5), with
        sysFlag COMPRESSED_FLAG | COMPRESSION_ZLIB_TYPE = 0x1 | 0x300;
        4095 bytes are sent as they are.
        """
        small = b"a" * 4095
        self.assertEqual(compress_body(small), (small, 0))
        big = b"ab" * 2048
        data, flag = compress_body(big)
        self.assertEqual(flag, 0x301)
        self.assertEqual(zlib.decompress(data), big)
        self.assertEqual(data[:2], b"\x78\x5e")  # zlib header of level 5 (FLEVEL 1)


class UniqueIdTests(SynchronousTestCase):
    def test_format(self) -> None:
        """
        createUniqID: hex of IP (4) + pid as short (2) + an instance int
        (4), then milliseconds since the month began (4) and a counter (2),
        upper case, 32 digits.
        """
        factory = UniqueIdFactory(bytes([10, 0, 0, 5]), pid=0x12345, instance=0xCAFEBABE)
        now = datetime(2026, 11, 3, 0, 0, 1, 500000, tzinfo=timezone.utc).timestamp()
        ms = (2 * 86400 + 1) * 1000 + 500
        first = factory.create(now)
        self.assertEqual(first, "0A000005" + "2345" + "CAFEBABE" + f"{ms:08X}" + "0000")
        self.assertEqual(factory.create(now)[-4:], "0001")
        # A new month starts the span again.
        december = datetime(2026, 12, 1, 0, 0, 0, 7000, tzinfo=timezone.utc).timestamp()
        self.assertEqual(factory.create(december)[20:28], "00000007")

    def test_counter_wraps_at_16_bits(self) -> None:
        """The counter is written as a short: it wraps after 0xFFFF."""
        factory = UniqueIdFactory(bytes(4), pid=1, instance=1)
        factory._counter = 0xFFFF
        self.assertEqual(factory.create(0.0)[-4:], "FFFF")
        self.assertEqual(factory.create(0.0)[-4:], "0000")


def _reply(code: int, ext: dict[str, str] | None, remark: str | None = None) -> RemotingCommand:
    return RemotingCommand(code, flag=1, remark=remark, ext_fields=ext)


class SendResultTests(SynchronousTestCase):
    queue = MessageQueue("T", "broker-a", -1)

    def test_stored_codes(self) -> None:
        """
        processSendResponse: 0, 10, 12, 11 are SEND_OK, FLUSH_DISK_TIMEOUT,
        FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE; the queue id is the
        broker's; MSG_REGION / TRACE_ON read.
        """
        ext = {"msgId": "7F00000100002A9F0000000000001234", "queueId": "2", "queueOffset": "41",
               "MSG_REGION": "R1", "TRACE_ON": "false"}
        for code, status in [(0, SendStatus.SEND_OK), (10, SendStatus.FLUSH_DISK_TIMEOUT),
                             (12, SendStatus.FLUSH_SLAVE_TIMEOUT), (11, SendStatus.SLAVE_NOT_AVAILABLE)]:
            result = send_result(_reply(code, ext), self.queue, "UNIQ", "broker-a (1.2.3.4:10911)")
            self.assertEqual(result.status, status)
            self.assertEqual(result.queue, MessageQueue("T", "broker-a", 2))
            self.assertEqual((result.msg_id, result.offset_msg_id), ("UNIQ", ext["msgId"]))
            self.assertEqual(result.queue_offset, 41)
            self.assertEqual((result.region_id, result.trace_on), ("R1", False))

    def test_other_codes_raise(self) -> None:
        """Any other code raises, one line naming broker, topic, code and remark."""
        with self.assertRaises(SendReplyError) as e:
            send_result(_reply(13, {"MSG_REGION": "DefaultRegion"}, "the message is\nillegal"),
                        self.queue, "U", "broker-a (1.2.3.4:10911)")
        self.assertEqual(e.exception.code, 13)
        self.assertEqual(
            str(e.exception),
            "broker broker-a (1.2.3.4:10911) answered a send to topic 'T' with "
            "MESSAGE_ILLEGAL (13): the message is illegal",
        )

    def test_unreadable_success(self) -> None:
        """A SUCCESS without queueOffset is an error of code -1 (retried)."""
        with self.assertRaises(SendReplyError) as e:
            send_result(_reply(0, {"msgId": "X", "queueId": "1"}), self.queue, "U", "b")
        self.assertEqual(e.exception.code, -1)
        self.assertIn("queueOffset", str(e.exception))


STANDARD = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},"brokerName":"broker-b",'
    b'"cluster":"DefaultCluster"},{"brokerAddrs":{"1":"10.0.0.4:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-b","perm":6,'
    b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":3},{"brokerName":"broker-a","perm":6,'
    b'"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2}]}'
)


class RouteTests(SynchronousTestCase):
    def test_standard_and_fastjson(self) -> None:
        """
        A route reads the same as standard JSON (4.9.4+) and with
        fastjson's unquoted Long keys in brokerAddrs (older NameServers).
        """
        fastjson = STANDARD.replace(b'"0":', b"0:").replace(b'"1":', b"1:")
        self.assertNotEqual(fastjson, STANDARD)
        route = parse_route(STANDARD)
        self.assertEqual(parse_route(fastjson), route)
        self.assertEqual([b.broker_name for b in route.broker_datas], ["broker-a", "broker-b"])
        self.assertEqual(route.master_addr("broker-b"), "10.0.0.1:10911")
        self.assertIsNone(route.master_addr("broker-a"))
        self.assertEqual(route.addresses(), {"10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.4:10911"})

    def test_publish_queues(self) -> None:
        """
        topicRouteData2TopicPublishInfo: writeQueueNums queues of each
        writable queue data whose broker has a master (broker-a has only
        a slave here); not writable (perm 4) is skipped; an
        orderTopicConf wins.
        """
        route = parse_route(STANDARD)
        self.assertEqual(publish_queues("T", route), [MessageQueue("T", "broker-b", i) for i in range(3)])
        readonly = TopicRoute((QueueData("broker-b", 4, 4, 4),), route.broker_datas)
        self.assertEqual(publish_queues("T", readonly), [])
        ordered = TopicRoute((), (), "broker-x:2;broker-y:1")
        self.assertEqual(
            publish_queues("T", ordered),
            [MessageQueue("T", "broker-x", 0), MessageQueue("T", "broker-x", 1), MessageQueue("T", "broker-y", 0)],
        )

    def test_default_route_capped(self) -> None:
        """TBW102's route is cut to min(defaultTopicQueueNums, readQueueNums) queues."""
        tbw = TopicRoute((QueueData("b", 8, 8, 7), QueueData("c", 2, 8, 7)), (BrokerData("C", "b", {0: "x"}),))
        capped = default_route_for(tbw, 4)
        self.assertEqual([(q.read_queue_nums, q.write_queue_nums) for q in capped.queue_datas], [(4, 4), (2, 2)])

    def test_errors(self) -> None:
        """Unreadable routes are one-line errors naming the part."""
        for body, text in [
            (b"{", "does not parse"),
            (b"[]", "not a JSON object"),
            (b'{"queueDatas":[{"brokerName":"b","perm":"6","readQueueNums":1,"writeQueueNums":1}]}', "perm"),
            (b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"x":"a"}}]}', "not a brokerId"),
            (b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{0:1}}]}', "not a string"),
        ]:
            with self.assertRaises(RouteError) as e:
                parse_route(body)
            self.assertIn(text, str(e.exception))


class HeaderTests(SynchronousTestCase):
    def test_v2_short_names(self) -> None:
        """
        SendMessageRequestHeaderV2 as makeCustomHeaderToNet writes what
        sendKernelImpl fills in: a..n, the booleans k and m always, the
        unset maxReconsumeTimes (l) left out.
        """
        header = SendMessageRequestHeaderV2("PG", "T", "TBW102", 4, 1, 0x301, 1700000000123, 0, "WAIT\x01true",
                                            0, False, None, True, "broker-a")
        self.assertEqual(
            header_to_ext_fields(header),
            {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "1", "f": "769", "g": "1700000000123",
             "h": "0", "i": "WAIT\x01true", "j": "0", "k": "false", "m": "true", "n": "broker-a"},
        )
