"""
Tests for L{rmqha.store._record}: the RocketMQ 4.9 commit-log record codec.

Expected bytes are built by hand with C{struct} from the field table in the
reference notes (section C.2), never with the code under test.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import string
import struct
import tracemalloc
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rmqha.store import _record
from rmqha.store._record import (
    BLANK_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    Blank,
    Message,
    MessageRejected,
    Record,
    RecordEncoder,
    RecordError,
    ReplicaValidator,
    SysFlag,
    body_crc,
    check_header,
    check_record,
    decode_properties,
    encode_blank,
    encode_properties,
    encode_record,
    parse_record,
    read_header,
    read_physical_offset,
    record_length,
)

# The magic codes as the reference gives them: signed Java ints.
V1 = -626843481  # 0xDAA320A7
V2 = -626843477  # 0xDAA320AB
BLANK = -875286124  # 0xCBD43194

STORE = ("10.0.0.1", 10911)
STORE_PACKED = (bytes([10, 0, 0, 1]), 10911)
BORN = ("192.168.1.2", 40000)
BORN_PACKED = (bytes([192, 168, 1, 2]), 40000)
BORN6 = ("2001:db8::1", 50000)
BORN6_PACKED = (bytes.fromhex("20010db8000000000000000000000001"), 50000)
STORE6 = ("2001:db8::2a", 10912)
STORE6_PACKED = (bytes.fromhex("20010db800000000000000000000002a"), 10912)

# Where the store puts the sample message.
QUEUE_OFFSET = 42
PHYSICAL_OFFSET = 4096
STORE_TIMESTAMP = 1_700_000_000_123
SAMPLE_PROPERTIES = b"TAGS\x01TagA\x02KEYS\x01key1 key2"  # 24 bytes


def sample_message(**changes: object) -> Message:
    """
    The message that L{handmade}'s defaults describe.
    """
    message = Message(
        topic="TopicTest",
        body=b"Hello RocketMQ",
        queue_id=3,
        flag=7,
        properties={"TAGS": "TagA", "KEYS": "key1 key2"},
        sysflag=0,
        born_timestamp=1_700_000_000_000,
        born_host=BORN,
        reconsume_times=2,
        prepared_tx_offset=0,
    )
    return dataclasses.replace(message, **changes)


def encode(
    message: Message,
    store_host: tuple[str, int] = STORE,
    *,
    queue_offset: int = QUEUE_OFFSET,
    physical_offset: int = PHYSICAL_OFFSET,
    store_timestamp: int = STORE_TIMESTAMP,
) -> bytes:
    """
    Encode C{message} through L{RecordEncoder.encode}, the store's put path,
    into a buffer with room to spare (by default at the sample place).
    """
    buf = bytearray(len(message.body) + 0x10000)
    size = RecordEncoder(store_host).encode(
        buf, 0, len(buf), message, queue_offset, physical_offset, store_timestamp
    )
    return bytes(buf[:size])


def handmade(
    *,
    body: bytes = b"Hello RocketMQ",
    topic: bytes = b"TopicTest",
    properties: bytes = SAMPLE_PROPERTIES,
    queue_id: int = 3,
    flag: int = 7,
    queue_offset: int = QUEUE_OFFSET,
    physical_offset: int = PHYSICAL_OFFSET,
    sysflag: int = 0,
    born_timestamp: int = 1_700_000_000_000,
    born_host: tuple[bytes, int] = BORN_PACKED,
    store_timestamp: int = STORE_TIMESTAMP,
    store_host: tuple[bytes, int] = STORE_PACKED,
    reconsume_times: int = 2,
    prepared_tx_offset: int = 0,
    magic: int = V1,
    total: int | None = None,
    stored_crc: int | None = None,
    body_length: int | None = None,
    topic_length: int | None = None,
    properties_length: int | None = None,
) -> bytes:
    """
    A record assembled field by field from the reference table (C.2).

    Hosts are C{(packed address, port)}.  The C{*_length}, C{total} and
    C{stored_crc} arguments override the computed value, to forge bad records.
    """
    if stored_crc is None:
        stored_crc = zlib.crc32(body) & 0x7FFFFFFF
    topic_length_format = ">b" if magic == V1 else ">h"  # int8 in v1, int16 in v2
    if body_length is None:
        body_length = len(body)
    if topic_length is None:
        topic_length = len(topic)
    if properties_length is None:
        properties_length = len(properties)
    rest = b"".join(
        [
            struct.pack(">i", magic),  # MAGICCODE
            struct.pack(">i", stored_crc),  # BODYCRC
            struct.pack(">i", queue_id),  # QUEUEID
            struct.pack(">i", flag),  # FLAG
            struct.pack(">q", queue_offset),  # QUEUEOFFSET
            struct.pack(">q", physical_offset),  # PHYSICALOFFSET
            struct.pack(">i", sysflag),  # SYSFLAG
            struct.pack(">q", born_timestamp),  # BORNTIMESTAMP
            born_host[0] + struct.pack(">i", born_host[1]),  # BORNHOST
            struct.pack(">q", store_timestamp),  # STORETIMESTAMP
            store_host[0] + struct.pack(">i", store_host[1]),  # STOREHOSTADDRESS
            struct.pack(">i", reconsume_times),  # RECONSUMETIMES
            struct.pack(">q", prepared_tx_offset),  # PREPAREDTRANSACTIONOFFSET
            struct.pack(">i", body_length),  # BODYLENGTH
            body,
            struct.pack(topic_length_format, topic_length),  # TOPICLENGTH
            topic,
            struct.pack(">h", properties_length),  # PROPERTIESLENGTH
            properties,
        ]
    )
    if total is None:
        total = 4 + len(rest)
    return struct.pack(">i", total) + rest  # TOTALSIZE


class ConstantsTests(SynchronousTestCase):
    """
    The module's magic numbers and length formula match the reference.
    """

    def test_magic_codes(self) -> None:
        """
        The v1, v2 and BLANK magics are 0xDAA320A7, 0xDAA320AB and 0xCBD43194
        read as big-endian signed ints.
        """
        self.assertEqual(
            (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2, BLANK_MAGIC),
            struct.unpack(">iii", bytes.fromhex("DAA320A7DAA320ABCBD43194")),
        )

    def test_body_crc(self) -> None:
        """
        C{body_crc} is CRC32 masked to 31 bits.
        """
        self.assertEqual(body_crc(b"hi"), 0x58932AAC)  # crc32 0xD8932AAC
        self.assertEqual(body_crc(b""), 0)

    def test_record_length(self) -> None:
        """
        C{record_length} is 91 fixed bytes plus body, topic and properties,
        12 more per IPv6 host, and one more for the v2 int16 topic length.
        """
        self.assertEqual(record_length(0, 0, 0), 91)
        self.assertEqual(record_length(10, 20, 30), 151)
        self.assertEqual(record_length(10, 20, 30, born_v6=True), 163)
        self.assertEqual(record_length(10, 20, 30, store_v6=True), 163)
        self.assertEqual(record_length(10, 20, 30, True, True), 175)
        self.assertEqual(record_length(10, 20, 30, magic=V2), 152)


class EncodeRecordTests(SynchronousTestCase):
    """
    C{encode_record} writes the v1 layout byte for byte.
    """

    def test_literal_vector(self) -> None:
        """
        A tiny record (topic C{T}, body C{hi}, no properties) encodes to
        bytes written out by hand from the table, one field per line.
        """
        expected = bytes.fromhex(
            "0000005e"  # TOTALSIZE 94 = 91 + 2 + 1 + 0
            "daa320a7"  # MAGICCODE v1
            "58932aac"  # BODYCRC crc32(b"hi") = 0xd8932aac, & 0x7fffffff
            "00000001"  # QUEUEID 1
            "00000000"  # FLAG 0
            "0000000000000000"  # QUEUEOFFSET 0
            "0000000000000100"  # PHYSICALOFFSET 256
            "00000000"  # SYSFLAG 0
            "0000000000000001"  # BORNTIMESTAMP 1
            "7f000001" "00000001"  # BORNHOST 127.0.0.1:1
            "0000000000000002"  # STORETIMESTAMP 2
            "7f000001" "00000002"  # STOREHOSTADDRESS 127.0.0.1:2
            "00000000"  # RECONSUMETIMES 0
            "0000000000000000"  # PREPAREDTRANSACTIONOFFSET 0
            "00000002" "6869"  # BODYLENGTH 2, b"hi"
            "01" "54"  # TOPICLENGTH 1, b"T"
            "0000"  # PROPERTIESLENGTH 0
        )
        message = Message(
            topic="T",
            body=b"hi",
            queue_id=1,
            born_timestamp=1,
            born_host=("127.0.0.1", 1),
        )
        data = encode_record(
            message,
            queue_offset=0,
            physical_offset=256,
            store_timestamp=2,
            store_host=("127.0.0.1", 2),
        )
        self.assertEqual(data.hex(), expected.hex())

    def test_ipv4_hosts(self) -> None:
        """
        With IPv4 born and store hosts the record matches the table, its
        properties are C{name\\x01value\\x02name\\x01value} with no trailing
        separator, and it is 91 bytes plus body, topic and properties.
        """
        data = encode(sample_message())
        self.assertEqual(data, handmade())
        self.assertEqual(len(data), 91 + 14 + 9 + 24)
        self.assertEqual(struct.unpack_from(">i", data)[0], len(data))

    def test_ipv6_born_host(self) -> None:
        """
        An IPv6 born host is 16 address bytes and an int32 port, sets
        SYSFLAG 0x10 and makes the record 12 bytes longer.
        """
        data = encode(sample_message(born_host=BORN6))
        self.assertEqual(data, handmade(born_host=BORN6_PACKED, sysflag=0x10))
        self.assertEqual(len(data), 91 + 12 + 14 + 9 + 24)

    def test_ipv6_store_host(self) -> None:
        """
        An IPv6 store host sets SYSFLAG 0x20 and adds 12 bytes.
        """
        data = encode(sample_message(), store_host=STORE6)
        self.assertEqual(data, handmade(store_host=STORE6_PACKED, sysflag=0x20))
        self.assertEqual(len(data), 91 + 12 + 14 + 9 + 24)

    def test_ipv6_both_hosts(self) -> None:
        """
        IPv6 born and store hosts set both bits and add 24 bytes.
        """
        data = encode(sample_message(born_host=BORN6), store_host=STORE6)
        self.assertEqual(
            data,
            handmade(born_host=BORN6_PACKED, store_host=STORE6_PACKED, sysflag=0x30),
        )
        self.assertEqual(len(data), 91 + 24 + 14 + 9 + 24)

    def test_v6_flags_follow_hosts(self) -> None:
        """
        The host-family bits describe the hosts actually written: wrong bits
        passed in C{Message.sysflag} are cleared or set, other bits are kept.
        """
        other = SysFlag.MULTI_TAGS | SysFlag.TRANSACTION_COMMIT_TYPE | 0x100
        self.assertEqual(
            encode(sample_message(sysflag=other | 0x30)), handmade(sysflag=other)
        )
        self.assertEqual(
            encode(sample_message(sysflag=other | 0x20, born_host=BORN6)),
            handmade(sysflag=other | 0x10, born_host=BORN6_PACKED),
        )
        self.assertEqual(
            encode(sample_message(sysflag=other | 0x10), store_host=STORE6),
            handmade(sysflag=other | 0x20, store_host=STORE6_PACKED),
        )

    def test_born_defaults_to_store(self) -> None:
        """
        A message without born host or timestamp gets the store host (and
        its v6 bit) and the store timestamp.
        """
        message = sample_message(born_host=None, born_timestamp=None)
        self.assertEqual(
            encode(message),
            handmade(born_host=STORE_PACKED, born_timestamp=STORE_TIMESTAMP),
        )
        self.assertEqual(
            encode(message, store_host=STORE6),
            handmade(
                born_host=STORE6_PACKED,
                store_host=STORE6_PACKED,
                born_timestamp=STORE_TIMESTAMP,
                sysflag=0x30,
            ),
        )

    def test_int_extremes(self) -> None:
        """
        Integer fields take their whole signed range.
        """
        low, high = -(2**31), 2**31 - 1
        message = sample_message(
            queue_id=low,
            flag=high,
            reconsume_times=low,
            prepared_tx_offset=2**63 - 1,
            born_timestamp=-(2**63),
        )
        self.assertEqual(
            encode(message),
            handmade(
                queue_id=low,
                flag=high,
                reconsume_times=low,
                prepared_tx_offset=2**63 - 1,
                born_timestamp=-(2**63),
            ),
        )

    def test_encode_at_position(self) -> None:
        """
        C{RecordEncoder.encode} writes the record at C{pos} when it fits in
        C{room} exactly, returns its size and leaves the bytes around it
        alone.
        """
        expected = handmade()
        buf = bytearray(b"\xaa" * (len(expected) + 20))
        size = RecordEncoder(STORE).encode(
            buf,
            10,
            len(expected),
            sample_message(),
            QUEUE_OFFSET,
            PHYSICAL_OFFSET,
            STORE_TIMESTAMP,
        )
        self.assertEqual(size, len(expected))
        self.assertEqual(bytes(buf), b"\xaa" * 10 + expected + b"\xaa" * 10)

    def test_encode_no_room(self) -> None:
        """
        When the record needs more than C{room} bytes, C{RecordEncoder.encode}
        returns its size negated and writes nothing.
        """
        expected = handmade()
        buf = bytearray(b"\xaa" * (len(expected) + 20))
        size = RecordEncoder(STORE).encode(
            buf,
            10,
            len(expected) - 1,
            sample_message(),
            QUEUE_OFFSET,
            PHYSICAL_OFFSET,
            STORE_TIMESTAMP,
        )
        self.assertEqual(size, -len(expected))
        self.assertEqual(bytes(buf), b"\xaa" * len(buf))

    def test_encode_record(self) -> None:
        """
        C{encode_record} returns exactly the record's bytes, for IPv4 and
        IPv6 hosts.
        """
        place = dict(
            queue_offset=QUEUE_OFFSET,
            physical_offset=PHYSICAL_OFFSET,
            store_timestamp=STORE_TIMESTAMP,
        )
        self.assertEqual(
            encode_record(sample_message(), store_host=STORE, **place), handmade()
        )
        self.assertEqual(
            encode_record(sample_message(born_host=BORN6), store_host=STORE6, **place),
            handmade(born_host=BORN6_PACKED, store_host=STORE6_PACKED, sysflag=0x30),
        )

    def test_encode_record_memory(self) -> None:
        """
        C{encode_record} for a 94-byte record allocates memory in proportion
        to the record, not to the largest possible record (2 GiB).
        """
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
            self.addCleanup(tracemalloc.stop)
        tracemalloc.reset_peak()
        encode_record(
            Message("T", b"hi"),
            queue_offset=0,
            physical_offset=0,
            store_timestamp=0,
            store_host=STORE,
        )
        _, peak = tracemalloc.get_traced_memory()
        self.assertLess(peak, 1 << 20)


class BlankTests(SynchronousTestCase):
    """
    The end-of-segment BLANK filler (reference C.3).
    """

    def test_encode_blank(self) -> None:
        """
        A BLANK is int32 size then int32 0xCBD43194.
        """
        self.assertEqual(encode_blank(1000), struct.pack(">ii", 1000, BLANK))
        self.assertEqual(encode_blank(1000), bytes.fromhex("000003e8cbd43194"))

    def test_blank_reaching_end(self) -> None:
        """
        A BLANK covering exactly the rest of the segment decodes as L{Blank}
        whatever the bytes after its header; its C{next_offset} is the
        segment end.
        """
        record = handmade()
        for filler in (bytes(42), b"\x99" * 42):
            segment = record + encode_blank(50) + filler
            blank = parse_record(
                segment, len(record), len(segment), PHYSICAL_OFFSET + len(record)
            )
            self.assertEqual(blank, Blank(PHYSICAL_OFFSET + len(record), 50))
            self.assertEqual(blank.next_offset, PHYSICAL_OFFSET + len(segment))

    def test_blank_size_mismatch(self) -> None:
        """
        A BLANK whose size is not the number of bytes left is a
        L{RecordError} that gives both numbers.
        """
        for remaining in (49, 51):
            segment = encode_blank(50) + bytes(remaining - 8)
            error = self.assertRaises(
                RecordError, parse_record, segment, 0, len(segment), 7000
            )
            self.assertEqual(error.offset, 7000)
            self.assertIn("BLANK", error.reason)
            self.assertIn("50", error.reason)
            self.assertIn(str(remaining), error.reason)


class ParseRecordTests(SynchronousTestCase):
    """
    C{parse_record} gives back every field of a well-formed record.
    """

    def test_every_field(self) -> None:
        """
        A record inside a larger buffer decodes to the values written: hosts
        as C{(ip, port)}, properties as a dict, tags and keys, the offset
        message id and the next offset.
        """
        data = handmade(sysflag=SysFlag.MULTI_TAGS)
        buf = b"\xff" * 7 + data + b"\xee" * 5
        record = parse_record(buf, 7, len(buf), PHYSICAL_OFFSET)
        self.assertEqual(
            record,
            Record(
                offset=4096,
                size=138,
                magic=V1,
                body_crc=zlib.crc32(b"Hello RocketMQ") & 0x7FFFFFFF,
                queue_id=3,
                flag=7,
                queue_offset=42,
                physical_offset=4096,
                sysflag=0x2,
                born_timestamp=1_700_000_000_000,
                born_host=("192.168.1.2", 40000),
                store_timestamp=1_700_000_000_123,
                store_host=("10.0.0.1", 10911),
                reconsume_times=2,
                prepared_tx_offset=0,
                body=b"Hello RocketMQ",
                topic="TopicTest",
                properties={"TAGS": "TagA", "KEYS": "key1 key2"},
                crc_ok=True,
            ),
        )
        self.assertEqual(record.tags, "TagA")
        self.assertEqual(record.keys, "key1 key2")
        self.assertEqual(record.next_offset, 4096 + 138)
        # 0A000001 = 10.0.0.1, 00002A9F = port 10911, then offset 4096.
        self.assertEqual(record.msg_id, "0A00000100002A9F0000000000001000")

    def test_ipv6_hosts(self) -> None:
        """
        IPv6 hosts decode to their canonical text form, and the message id
        is 16 address bytes, the port and the offset (28 bytes).
        """
        data = handmade(born_host=BORN6_PACKED, store_host=STORE6_PACKED, sysflag=0x30)
        record = parse_record(data, 0, len(data), PHYSICAL_OFFSET)
        self.assertEqual(record.born_host, BORN6)
        self.assertEqual(record.store_host, STORE6)
        self.assertEqual(record.size, 138 + 24)
        self.assertEqual(
            record.msg_id,
            "20010DB800000000000000000000002A" "00002AA0" "0000000000001000",
        )

    def test_no_tags_or_keys(self) -> None:
        """
        C{tags} and C{keys} are C{None} when the properties lack them.
        """
        data = handmade(properties=b"")
        record = parse_record(data, 0, len(data), PHYSICAL_OFFSET)
        self.assertEqual(record.properties, {})
        self.assertIsNone(record.tags)
        self.assertIsNone(record.keys)

    def test_without_body(self) -> None:
        """
        C{with_body=False} leaves the body empty; C{crc_ok} is C{None}
        unless the CRC is checked.  Unchecked but with the body, C{crc_ok}
        still says whether it matches.
        """
        data = handmade()
        record = parse_record(data, 0, len(data), PHYSICAL_OFFSET, check_crc=False)
        self.assertEqual((record.body, record.crc_ok), (b"Hello RocketMQ", True))
        unchecked = parse_record(
            data, 0, len(data), PHYSICAL_OFFSET, check_crc=False, with_body=False
        )
        self.assertEqual((unchecked.body, unchecked.crc_ok), (b"", None))
        checked = parse_record(data, 0, len(data), PHYSICAL_OFFSET, with_body=False)
        self.assertEqual((checked.body, checked.crc_ok), (b"", True))
        self.assertEqual(checked.topic, "TopicTest")

    def test_buffer_types(self) -> None:
        """
        C{bytearray} and C{memoryview} buffers decode like C{bytes}.
        """
        data = handmade()
        expected = parse_record(data, 0, len(data), PHYSICAL_OFFSET)
        for buf in (bytearray(data), memoryview(data)):
            self.assertEqual(parse_record(buf, 0, len(data), PHYSICAL_OFFSET), expected)

    def test_v2_record(self) -> None:
        """
        A 5.x v2 record (magic 0xDAA320AB, int16 topic length, one byte
        longer) decodes, including a topic longer than v1's 127 bytes.
        """
        for topic in (b"TopicTest", b"t" * 200):
            data = handmade(magic=V2, topic=topic)
            self.assertEqual(len(data), 91 + 1 + 14 + len(topic) + 24)
            record = parse_record(data, 0, len(data), PHYSICAL_OFFSET)
            self.assertEqual(record.magic, V2)
            self.assertEqual(record.size, len(data))
            self.assertEqual(record.topic, topic.decode())
            self.assertEqual(record.body, b"Hello RocketMQ")
            self.assertEqual(record.properties, {"TAGS": "TagA", "KEYS": "key1 key2"})


class ParseRecordRejectionTests(SynchronousTestCase):
    """
    C{parse_record} refuses malformed bytes with a L{RecordError} that names
    the record offset and the problem.
    """

    def assertRejected(
        self,
        buf: bytes,
        *words: str,
        pos: int = 0,
        end: int | None = None,
        offset: int = PHYSICAL_OFFSET,
        **kwargs: bool,
    ) -> RecordError:
        end = len(buf) if end is None else end
        error = self.assertRaises(
            RecordError, parse_record, buf, pos, end, offset, **kwargs
        )
        self.assertEqual(error.offset, offset)
        for word in words:
            self.assertIn(word, error.reason.lower())
        self.assertIn(f"offset {offset}", str(error))
        return error

    def test_bad_magic(self) -> None:
        """
        An unknown magic code is rejected and shown in hex.
        """
        self.assertRejected(handmade(magic=0x12345678), "magic", "12345678")

    def test_zero_bytes(self) -> None:
        """
        Zero-filled space (a pre-allocated segment) is "no record", with a
        full header or fewer than 8 bytes.
        """
        self.assertRejected(bytes(200), "no record")
        self.assertRejected(bytes(5), "no record")

    def test_truncated_header(self) -> None:
        """
        Fewer than 8 non-zero bytes before C{end} cannot hold a header.
        """
        self.assertRejected(handmade()[:5], "truncated", "5")
        self.assertRejected(handmade(), "truncated", "7", end=7)

    def test_torn(self) -> None:
        """
        A TOTALSIZE running past C{end} is a torn record.
        """
        data = handmade()
        self.assertRejected(data[:-1], "torn", "138")
        self.assertRejected(data + b"\x00", "torn", end=len(data) - 10)

    def test_total_below_minimum(self) -> None:
        """
        A TOTALSIZE below the 91-byte minimum is rejected.
        """
        self.assertRejected(handmade(total=90), "smaller", "90", "91")
        self.assertRejected(handmade(total=0), "smaller")
        self.assertRejected(handmade(total=-5), "smaller")

    def test_total_not_sum_of_fields(self) -> None:
        """
        TOTALSIZE must equal what the fields add up to, whether it is larger
        or smaller.
        """
        data = handmade()
        self.assertRejected(
            handmade(total=len(data) + 4) + bytes(4), "total size 142", "does not match"
        )
        self.assertRejected(handmade(total=len(data) - 1), "total size 137")

    def test_hosts_do_not_fit(self) -> None:
        """
        SYSFLAG claiming IPv6 hosts that do not fit in TOTALSIZE is rejected.
        """
        data = handmade(body=b"", topic=b"", properties=b"", sysflag=0x30)
        self.assertEqual(len(data), 91)
        self.assertRejected(data, "hosts")

    def test_body_length(self) -> None:
        """
        A body length that is negative or runs past the record is rejected.
        """
        self.assertRejected(handmade(body_length=1000), "body length 1000")
        self.assertRejected(handmade(body_length=-1), "body length -1")

    def test_topic_length(self) -> None:
        """
        A topic length that is negative or runs past the record, or a body
        that leaves no room for the topic length byte, is rejected.
        """
        self.assertRejected(handmade(topic_length=100), "topic length 100")
        self.assertRejected(handmade(topic_length=-1), "topic length -1")
        total = len(handmade())
        self.assertRejected(handmade(body_length=total - 88), "topic length")

    def test_properties_length(self) -> None:
        """
        A properties length that is negative or runs past the record is
        rejected.
        """
        self.assertRejected(handmade(properties_length=1000), "properties length 1000")
        self.assertRejected(handmade(properties_length=-1), "properties length -1")

    def test_physical_offset_mismatch(self) -> None:
        """
        A record whose PHYSICALOFFSET is not where it was found is rejected,
        giving both offsets.
        """
        self.assertRejected(handmade(), "physicaloffset", "4096", "4097", offset=4097)

    def test_strict_trailing_zero(self) -> None:
        """
        With C{strict}, a topic or properties ending in a zero byte (what a
        torn write leaves) is rejected; without it the record decodes.
        """
        for data, word in [
            (handmade(topic=b"T\x00"), "topic"),
            (handmade(properties=b"TAGS\x01TagA\x00"), "properties"),
        ]:
            self.assertRejected(data, word, "zero byte", strict=True)
            record = parse_record(data, 0, len(data), PHYSICAL_OFFSET)
            self.assertEqual(record.size, len(data))
        data = handmade()
        self.assertEqual(
            parse_record(data, 0, len(data), PHYSICAL_OFFSET, strict=True),
            parse_record(data, 0, len(data), PHYSICAL_OFFSET),
        )

    def test_body_crc_mismatch(self) -> None:
        """
        A flipped body byte fails the CRC check; with C{check_crc=False} the
        record decodes with C{crc_ok} false.
        """
        data = bytearray(handmade())
        data[88] ^= 0x01  # first body byte
        self.assertRejected(bytes(data), "crc")
        record = parse_record(data, 0, len(data), PHYSICAL_OFFSET, check_crc=False)
        self.assertFalse(record.crc_ok)
        self.assertEqual(record.body, b"Iello RocketMQ")

    def test_stored_crc_mismatch(self) -> None:
        """
        A wrong BODYCRC field over an intact body fails the CRC check, and
        the message shows the stored value.
        """
        self.assertRejected(handmade(stored_crc=12345), "crc", "12345")


class PropertiesTests(SynchronousTestCase):
    """
    The properties string: strict when writing, RocketMQ-lenient reading.
    """

    def test_encode(self) -> None:
        """
        Properties encode as UTF-8 C{name\\x01value} pairs joined by
        C{\\x02}, without a trailing separator; none encode to nothing.
        """
        self.assertEqual(encode_properties({}), b"")
        self.assertEqual(encode_properties({"a": "1"}), b"a\x011")
        self.assertEqual(
            encode_properties({"a": "1", "b": "2", "k": "\u00e9"}),
            b"a\x011\x02b\x012\x02k\x01\xc3\xa9",
        )

    def test_separators_refused(self) -> None:
        """
        C{\\x01} or C{\\x02} inside a name or value is refused, naming the
        property.
        """
        cases = [
            ("a\x01b", "v"),
            ("a\x02b", "v"),
            ("name", "v\x01w"),
            ("name", "v\x02w"),
        ]
        for name, value in cases:
            error = self.assertRaises(
                MessageRejected, encode_properties, {"ok": "fine", name: value}
            )
            self.assertIn(repr(name), str(error))

    def test_empty_name_refused(self) -> None:
        """
        An empty property name is refused.
        """
        error = self.assertRaises(MessageRejected, encode_properties, {"": "v"})
        self.assertIn("empty", str(error))

    def test_non_string_refused(self) -> None:
        """
        Names and values must be strings.
        """
        error = self.assertRaises(MessageRejected, encode_properties, {"a": 1})
        self.assertIn("strings", str(error))

    def test_unencodable_refused(self) -> None:
        """
        A value that cannot be encoded as UTF-8 (a lone surrogate) is a
        L{MessageRejected}, like every other property the store refuses.
        """
        self.assertRaises(MessageRejected, encode_properties, {"k": "\ud800"})

    def test_size_limit(self) -> None:
        """
        The encoded properties may be at most 32767 bytes, counted in UTF-8
        bytes rather than characters.
        """
        self.assertEqual(len(encode_properties({"k": "x" * 32765})), 32767)
        error = self.assertRaises(
            MessageRejected, encode_properties, {"k": "x" * 32766}
        )
        self.assertIn("32768", str(error))
        self.assertIn("32767", str(error))
        # 16385 characters, 32768 bytes.
        error = self.assertRaises(
            MessageRejected, encode_properties, {"k": "\u00e9" * 16383}
        )
        self.assertIn("32768", str(error))

    def test_decode(self) -> None:
        """
        Well-formed properties decode to a dict, with or without the
        trailing separator older clients leave.
        """
        self.assertEqual(decode_properties(b""), {})
        self.assertEqual(decode_properties(b"a\x011\x02b\x012"), {"a": "1", "b": "2"})
        self.assertEqual(
            decode_properties(b"a\x011\x02b\x012\x02"), {"a": "1", "b": "2"}
        )
        self.assertEqual(decode_properties(b"k\x01\xc3\xa9"), {"k": "\u00e9"})

    def test_decode_lenient(self) -> None:
        """
        Like RocketMQ's C{string2messageProperties}: chunks shorter than 3
        characters, or without a separator strictly inside, are skipped; a
        value keeps any later C{\\x01}; a repeated name keeps the last value.
        """
        cases = [
            (b"ab\x02x\x01y", {"x": "y"}),  # no separator
            (b"\x01ab\x02x\x01y", {"x": "y"}),  # separator first
            (b"ab\x01\x02x\x01y", {"x": "y"}),  # separator last: empty value
            (b"a\x01\x02\x01b\x02x\x01y", {"x": "y"}),  # 2-character chunks
            (b"\x02\x02x\x01y\x02\x02", {"x": "y"}),  # empty chunks
            (b"a\x01b\x01c", {"a": "b\x01c"}),
            (b"a\x011\x02a\x012", {"a": "2"}),
        ]
        for raw, expected in cases:
            self.assertEqual(decode_properties(raw), expected, raw)

    def test_decode_bad_utf8(self) -> None:
        """
        Invalid UTF-8 becomes U+FFFD, as Java's decoder does, not an error.
        """
        self.assertEqual(decode_properties(b"k\x01\xff"), {"k": "\ufffd"})


class EncoderRejectionTests(SynchronousTestCase):
    """
    Messages the encoder refuses, each with a L{MessageRejected} naming the
    field or limit, whether or not the record would fit.
    """

    def assertRejected(
        self,
        message: Message,
        *words: str,
        encoder: RecordEncoder | None = None,
        untouched: bool = True,
    ) -> None:
        """
        C{encoder.encode} refuses C{message} with enough room and with none;
        the text contains C{words}; the buffer is left as it was (or, with
        C{untouched=False}, at least holds no record).
        """
        encoder = RecordEncoder(STORE) if encoder is None else encoder
        for room in (0x10000, 0):
            buf = bytearray(b"\xaa" * 0x10000)
            error = self.assertRaises(
                MessageRejected,
                encoder.encode,
                buf,
                0,
                room,
                message,
                QUEUE_OFFSET,
                PHYSICAL_OFFSET,
                STORE_TIMESTAMP,
            )
            for word in words:
                self.assertIn(word, str(error))
            if untouched:
                self.assertEqual(buf, b"\xaa" * 0x10000)
            else:
                self.assertRaises(
                    RecordError, parse_record, buf, 0, len(buf), PHYSICAL_OFFSET
                )

    def test_body_size(self) -> None:
        """
        A body above C{max_message_size} is refused; one at the limit is not.
        """
        encoder = RecordEncoder(STORE, max_message_size=16)
        buf = bytearray(200)
        size = encoder.encode(buf, 0, 200, Message("T", b"x" * 16), 0, 0, 0)
        self.assertEqual(size, 91 + 16 + 1)
        self.assertRejected(
            Message("T", b"x" * 17), "17", "maxMessageSize is 16", encoder=encoder
        )

    def test_body_type(self) -> None:
        """
        A body that is not bytes is refused.
        """
        self.assertRejected(sample_message(body="text"), "body")

    def test_topic_length(self) -> None:
        """
        A topic of 127 bytes is accepted, 128 is refused naming the limit.
        """
        data = encode(sample_message(topic="t" * 127))
        self.assertEqual(data[88 + 14 : 88 + 14 + 128], b"\x7f" + b"t" * 127)
        self.assertRejected(sample_message(topic="t" * 128), "128", "127")

    def test_empty_topic(self) -> None:
        """
        An empty topic is refused.
        """
        self.assertRejected(sample_message(topic=""), "topic")

    def test_topic_characters(self) -> None:
        """
        A topic is limited to RocketMQ's C{[%|a-zA-Z0-9_-]}.
        """
        data = encode(sample_message(topic="%RETRY%cg|a_b-C9"))
        record = parse_record(data, 0, len(data), PHYSICAL_OFFSET)
        self.assertEqual(record.topic, "%RETRY%cg|a_b-C9")
        for topic in ("a b", "a/b", "a.b", "t\u00f3pico", "a\nb", "a\x01"):
            self.assertRejected(
                sample_message(topic=topic), repr(topic), "[%|a-zA-Z0-9_-]"
            )

    def test_unencodable_topic(self) -> None:
        """
        A topic with a lone surrogate is a L{MessageRejected}, not a
        C{UnicodeEncodeError}.
        """
        self.assertRejected(sample_message(topic="T\ud800"), "topic")

    def test_bad_properties(self) -> None:
        """
        Properties C{encode_properties} refuses make the message refused.
        """
        self.assertRejected(sample_message(properties={"a\x01b": "v"}), "'a\\x01b'")
        self.assertRejected(sample_message(properties={"k": "x" * 32766}), "32767")

    def test_integer_ranges(self) -> None:
        """
        An integer field outside its Java type is refused naming the field
        and value, and no record is left in the buffer.
        """
        cases = [
            ("queue_id", 2**31),
            ("queue_id", -(2**31) - 1),
            ("flag", 2**31),
            ("sysflag", 2**31),
            ("reconsume_times", -(2**31) - 1),
            ("prepared_tx_offset", 2**63),
            ("born_timestamp", -(2**63) - 1),
        ]
        for name, value in cases:
            self.assertRejected(
                sample_message(**{name: value}), name, str(value), untouched=False
            )

    def test_bad_born_host(self) -> None:
        """
        A born host that is not an (IPv4 or IPv6 address, 0-65535 port) pair
        is refused.
        """
        hosts = [
            ("not-an-ip", 1),
            ("10.0.0.300", 1),
            ("10.0.0.1", 65536),
            ("10.0.0.1", -1),
            ("10.0.0.1", "80"),
            ("10.0.0.1",),
        ]
        for host in hosts:
            self.assertRejected(sample_message(born_host=host), "host")

    def test_bad_store_host(self) -> None:
        """
        A bad store host is refused when the encoder is made.
        """
        for host in (("host.example", 10911), ("10.0.0.1", 70000)):
            error = self.assertRaises(MessageRejected, RecordEncoder, host)
            self.assertIn("host", str(error))


# -- property-based tests -----------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TOPICS = st.text(
    alphabet=string.ascii_letters + string.digits + "%|_-", min_size=1, max_size=127
)
# Empty values are left out: RocketMQ's reader skips "name\x01" chunks.
PROPERTY_TEXT = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x01\x02"),
    min_size=1,
    max_size=24,
)
HOSTS = st.tuples(
    # Not ::ffff:a.b.c.d: it is stored as the IPv4 address (as Java does).
    st.one_of(
        st.ip_addresses(v=4), st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None)
    ).map(str),
    st.integers(0, 0xFFFF),
)


def messages(
    max_body: int = 4096, max_properties: int = 6
) -> st.SearchStrategy[Message]:
    return st.builds(
        Message,
        topic=TOPICS,
        body=st.binary(max_size=max_body),
        queue_id=INT32,
        flag=INT32,
        properties=st.dictionaries(
            PROPERTY_TEXT, PROPERTY_TEXT, max_size=max_properties
        ),
        sysflag=INT32,
        born_timestamp=st.none() | INT64,
        born_host=st.none() | HOSTS,
        reconsume_times=INT32,
        prepared_tx_offset=INT64,
    )


def is_v6(host: tuple[str, int]) -> bool:
    return ipaddress.ip_address(host[0]).version == 6


class RoundTripTests(SynchronousTestCase):
    """
    Whatever the encoder accepts, the decoder gives back unchanged.
    """

    @settings(deadline=None, derandomize=True, max_examples=300,
              suppress_health_check=[HealthCheck.differing_executors])
    @given(
        message=messages(),
        store_host=HOSTS,
        queue_offset=INT64,
        physical_offset=st.integers(0, 2**63 - 1),
        store_timestamp=INT64,
    )
    def test_round_trip(
        self,
        message: Message,
        store_host: tuple[str, int],
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
    ) -> None:
        """
        Decoding an encoded message returns every field of it; the length
        is C{record_length}, the TOTALSIZE field and (negated) what the
        encoder answers when there is no room; the message id is the store
        host bytes, port and physical offset in upper hex.
        """
        place = (queue_offset, physical_offset, store_timestamp)
        data = encode(
            message,
            store_host,
            queue_offset=queue_offset,
            physical_offset=physical_offset,
            store_timestamp=store_timestamp,
        )
        born_host = store_host if message.born_host is None else message.born_host
        born_timestamp = message.born_timestamp
        if born_timestamp is None:
            born_timestamp = store_timestamp
        born_v6, store_v6 = is_v6(born_host), is_v6(store_host)
        topic = message.topic.encode()
        properties = message.properties
        properties_length = sum(
            len(name.encode()) + 1 + len(value.encode())
            for name, value in properties.items()
        ) + max(len(properties) - 1, 0)
        length = 91 + 12 * born_v6 + 12 * store_v6 + len(message.body) + len(topic)
        length += properties_length

        self.assertEqual(len(data), length)
        no_room = RecordEncoder(store_host).encode(bytearray(), 0, 0, message, *place)
        self.assertEqual(no_room, -length)
        self.assertEqual(struct.unpack_from(">i", data)[0], length)
        self.assertEqual(
            record_length(
                len(message.body), len(topic), properties_length, born_v6, store_v6
            ),
            length,
        )
        record = parse_record(data, 0, len(data), physical_offset)
        self.assertEqual(
            record,
            Record(
                offset=physical_offset,
                size=length,
                magic=V1,
                body_crc=zlib.crc32(message.body) & 0x7FFFFFFF,
                queue_id=message.queue_id,
                flag=message.flag,
                queue_offset=queue_offset,
                physical_offset=physical_offset,
                sysflag=(message.sysflag & ~0x30) | born_v6 * 0x10 | store_v6 * 0x20,
                born_timestamp=born_timestamp,
                born_host=born_host,
                store_timestamp=store_timestamp,
                store_host=store_host,
                reconsume_times=message.reconsume_times,
                prepared_tx_offset=message.prepared_tx_offset,
                body=message.body,
                topic=message.topic,
                properties=dict(properties),
                crc_ok=True,
            ),
        )
        store_bytes = ipaddress.ip_address(store_host[0]).packed + struct.pack(
            ">iq", store_host[1], physical_offset
        )
        self.assertEqual(record.msg_id, store_bytes.hex().upper())


@st.composite
def decoder_inputs(draw: st.DrawFn) -> tuple[bytes, int, int, int]:
    """
    C{(buf, pos, end, offset)}: random bytes, random bytes behind a real
    header, or a real record with bytes or int32 fields overwritten.
    """
    kind = draw(st.sampled_from(["mutated", "header", "random"]))
    offset = draw(st.integers(0, 2**40))
    if kind == "random":
        body = draw(st.binary(max_size=300))
    elif kind == "header":
        magic = draw(st.sampled_from([BLANK, V1, V2]))
        rest = draw(st.binary(max_size=300))
        # None: the size of what follows, so a BLANK can reach the end.
        total = draw(st.none() | st.integers(0, 300) | INT32)
        total = 8 + len(rest) if total is None else total
        body = struct.pack(">ii", total, magic) + rest
    else:
        message = draw(messages(max_body=64, max_properties=3))
        buf = bytearray(
            encode(
                message,
                draw(HOSTS),
                queue_offset=draw(INT64),
                physical_offset=offset,
                store_timestamp=draw(INT64),
            )
        )
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
            else:
                value = draw(st.integers(-300, 300) | INT32)
                struct.pack_into(">i", buf, draw(st.integers(0, len(buf) - 4)), value)
        if draw(st.booleans()):
            buf[4:8] = struct.pack(">i", V2)
        body = bytes(buf)
    prefix = draw(st.binary(max_size=8))
    buf = prefix + body + draw(st.binary(max_size=16))
    pos = len(prefix)
    # Mostly the end of the record or of the buffer, sometimes anywhere.
    end = draw(
        st.sampled_from([pos + len(body), len(buf)]) | st.integers(pos, len(buf))
    )
    return buf, pos, end, offset


def decode_outcome(
    buf: bytes | memoryview, pos: int, end: int, offset: int, **kwargs: bool
) -> Record | Blank | tuple[str, int, str]:
    """
    What C{parse_record} returns, or the offset and reason it gives up with;
    any other exception propagates.
    """
    try:
        return parse_record(buf, pos, end, offset, **kwargs)
    except RecordError as error:
        return ("RecordError", error.offset, error.reason)


class DecoderRobustnessTests(SynchronousTestCase):
    """
    Hostile bytes give a L{RecordError} or a result, never another
    exception, and nothing after C{end} is read.
    """

    @settings(deadline=None, derandomize=True, max_examples=500)
    @given(
        inputs=decoder_inputs(),
        check_crc=st.booleans(),
        with_body=st.booleans(),
        strict=st.booleans(),
    )
    def test_arbitrary_bytes(
        self,
        inputs: tuple[bytes, int, int, int],
        check_crc: bool,
        with_body: bool,
        strict: bool,
    ) -> None:
        """
        C{parse_record} on arbitrary bytes returns a L{Record} or L{Blank}
        within C{[pos, end)} or raises L{RecordError} at C{offset}, and the
        outcome is the same whatever follows C{end}, or when the buffer stops
        there.
        """
        buf, pos, end, offset = inputs
        kwargs = {"check_crc": check_crc, "with_body": with_body, "strict": strict}
        outcome = decode_outcome(buf, pos, end, offset, **kwargs)
        if isinstance(outcome, Blank):  # a NamedTuple: test it first
            self.assertEqual(outcome, Blank(offset, end - pos))
        elif isinstance(outcome, Record):
            self.assertEqual(outcome.size, struct.unpack_from(">i", buf, pos)[0])
            self.assertLessEqual(pos + outcome.size, end)
        else:
            self.assertEqual(outcome[:2], ("RecordError", offset))
        flipped = buf[:end] + bytes(b ^ 0xFF for b in buf[end:]) + b"\x5a" * 8
        for other in (flipped, buf[:end], memoryview(buf)):
            self.assertEqual(decode_outcome(other, pos, end, offset, **kwargs), outcome)


class ReplicaCheckTests(SynchronousTestCase):
    """
    L{check_header} and L{check_record}: the header hop and the no-decode
    record check the replica path runs once per replicated record, kept
    next to L{parse_record} so the two cannot drift apart.
    """

    def test_valid_record(self) -> None:
        """
        A record encoded by the put path passes both checks at its offset.
        """
        record = encode(sample_message())
        total, magic = struct.unpack_from(">ii", record)
        self.assertIsNone(check_header(total, magic, 0, 4096))
        self.assertIsNone(check_record(record, 0, PHYSICAL_OFFSET, total, magic))

    def test_reasons(self) -> None:
        """
        Each failure is named: a BLANK not reaching the segment end, a bad
        magic, an impossible size, a wrong PHYSICALOFFSET, a body CRC
        mismatch.
        """
        self.assertIn("does not reach", check_header(16, BLANK, 0, 4096) or "")
        self.assertIsNone(check_header(4096, BLANK, 0, 4096))
        self.assertIn("bad magic", check_header(100, 1234, 0, 4096) or "")
        self.assertIn("impossible", check_header(5000, V1, 0, 4096) or "")
        record = encode(sample_message())
        total, magic = struct.unpack_from(">ii", record)
        self.assertIn(
            "PHYSICALOFFSET", check_record(record, 0, PHYSICAL_OFFSET + 1, total, magic) or ""
        )
        damaged = bytearray(record)
        damaged[record.index(b"Hello RocketMQ")] ^= 1
        self.assertEqual(
            check_record(bytes(damaged), 0, PHYSICAL_OFFSET, total, magic), "body CRC mismatch"
        )

    def test_topic_length_is_signed(self) -> None:
        """
        A v1 topic length byte of 128 or more is negative, to the replica
        check as to L{parse_record} (and RocketMQ's Java): a record whose
        fields add up only when that byte is read unsigned is refused by
        both, so a slave never acknowledges what its recovery would call
        damage.
        """
        record = encode(sample_message())
        total, magic = struct.unpack_from(">ii", record)
        sysflag = struct.unpack_from(">i", record, 36)[0]
        body_at = _record.body_length_at(sysflag)
        (body_length,) = struct.unpack_from(">i", record, body_at)
        topic_at = body_at + 4 + body_length
        old_length = record[topic_at]
        forged = bytearray(record[:topic_at])
        forged += bytes([200]) + b"T" * 200 + record[topic_at + 1 + old_length :]
        struct.pack_into(">i", forged, 0, len(forged))
        self.assertIn(
            "negative", check_record(bytes(forged), 0, PHYSICAL_OFFSET, len(forged), magic) or ""
        )
        self.assertRaises(
            RecordError, parse_record, bytes(forged), 0, len(forged), PHYSICAL_OFFSET
        )

    @settings(deadline=None, derandomize=True, max_examples=500,
              suppress_health_check=[HealthCheck.differing_executors])
    @given(inputs=decoder_inputs())
    def test_never_refuses_what_the_decoder_accepts(
        self, inputs: tuple[bytes, int, int, int]
    ) -> None:
        """
        A message record L{parse_record} accepts (with its CRC) passes the
        replica checks, at any place in a segment it fits in.
        """
        buf, pos, end, offset = inputs
        outcome = decode_outcome(buf, pos, end, offset, check_crc=True)
        if not isinstance(outcome, Record):
            return
        total, magic = struct.unpack_from(">ii", buf, pos)
        self.assertIsNone(check_header(total, magic, 0, total))
        self.assertIsNone(check_record(buf, pos, offset, total, magic))


def replicated_log(segment_size: int, segments: int) -> tuple[bytes, list[int]]:
    """
    C{segments} full segments of small records, each closed by a BLANK
    filler, as a master would send them; and every record boundary.
    """
    log = bytearray()
    boundaries = [0]
    for start in range(0, segments * segment_size, segment_size):
        body = 0
        while True:
            record = encode(
                sample_message(body=bytes([body % 251]) * (20 + body)),
                physical_offset=len(log),
            )
            body += 1
            if len(log) - start + len(record) + 8 > segment_size:
                break
            log += record
            boundaries.append(len(log))
        log += encode_blank(start + segment_size - len(log))
        log += bytes(start + segment_size - len(log))
        boundaries.append(len(log))
    return bytes(log), boundaries


class ReplicaValidatorTests(SynchronousTestCase):
    """
    L{ReplicaValidator}: the replica path's incremental check, fed the
    bytes a master sends in chunks that cut through records.
    """

    SEGMENT = 1024

    def validator(self) -> tuple[ReplicaValidator, bytearray, list[tuple[int, int]]]:
        """
        A validator over a log received into the returned bytearray, and
        the list of the reads of earlier bytes it asks for.
        """
        reads: list[tuple[int, int]] = []
        received = bytearray()

        def read(offset: int, length: int) -> bytes:
            reads.append((offset, length))
            self.assertLessEqual(offset + length, len(received))
            return bytes(received[offset : offset + length])

        return ReplicaValidator(self.SEGMENT, read), received, reads

    def feed(self, log: bytes, cut: int) -> tuple[list[int], list[tuple[int, int]]]:
        """
        Append C{log} C{cut} bytes at a time; the record end after each
        chunk, and the reads of earlier bytes the validator asked for.
        """
        validator, received, reads = self.validator()
        end = 0
        ends = []
        for at in range(0, len(log), cut):
            chunk = log[at : at + cut]
            received += chunk
            end = validator.advance(end, len(received), at, memoryview(chunk))
            ends.append(end)
        return ends, reads

    def test_record_end_follows_whole_records(self) -> None:
        """
        After each chunk the record end is the last record boundary the
        bytes received reach, for any chunk size; a BLANK filler moves it
        to the next segment only once the whole segment has arrived.  Only
        records that began in an earlier chunk are read back.
        """
        log, boundaries = replicated_log(self.SEGMENT, 3)
        for cut in (1, 7, 8, 100, 333, self.SEGMENT, len(log)):
            ends, reads = self.feed(log, cut)
            expected = [
                max(b for b in boundaries if b <= min(at + cut, len(log)))
                for at in range(0, len(log), cut)
            ]
            self.assertEqual(ends, expected, f"chunks of {cut}")
            if cut == len(log):
                self.assertEqual(reads, [])

    def test_corrupt_record(self) -> None:
        """
        A completed record that does not check raises L{RecordError} at its
        offset with L{check_record}'s reason, whether it arrived whole in
        one chunk or across several.
        """
        log, boundaries = replicated_log(self.SEGMENT, 1)
        bad = boundaries[2]
        damaged = bytearray(log)
        damaged[bad + 100] ^= 1  # in the body
        for cut in (5, len(log)):
            with self.assertRaises(RecordError) as caught:
                self.feed(bytes(damaged), cut)
            self.assertEqual((caught.exception.offset, caught.exception.reason),
                             (bad, "body CRC mismatch"))

    def feed_pieces(
        self, log: bytes, cuts: list[int], pieces_per_append: int
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """
        Append C{log} cut at C{cuts}, C{pieces_per_append} consecutive
        pieces (empty ones too) per L{ReplicaValidator.advance_pieces}; the
        record end after each append, and the reads of earlier bytes.
        """
        validator, received, reads = self.validator()
        bounds = [0, *cuts, len(log)]
        pieces = [memoryview(log)[a:b] for a, b in zip(bounds, bounds[1:])]
        end = 0
        ends = []
        for i in range(0, len(pieces), pieces_per_append):
            group = pieces[i : i + pieces_per_append]
            at = len(received)
            for piece in group:
                received += piece
            end = validator.advance_pieces(end, len(received), at, group)
            ends.append(end)
        return ends, reads

    def test_pieces(self) -> None:
        """
        L{ReplicaValidator.advance_pieces} over consecutive pieces (cutting
        records and their headers anywhere, some empty) reaches the last
        record boundary the bytes received reach, as L{advance} over the
        pieces joined; compiled, a record cut between two pieces of one
        append is not read back, only one begun in an earlier append.
        """
        log, boundaries = replicated_log(self.SEGMENT, 3)
        for step in (1, 3, 50, 301, 700):
            cuts = sorted({*range(step, len(log), step), *range(step // 2, len(log), 997)})
            cuts += cuts[::5]  # empty pieces
            cuts.sort()
            for per_append in (1, 4, len(cuts) + 1):
                ends, reads = self.feed_pieces(log, cuts, per_append)
                self.assertEqual(ends[-1], len(log), (step, per_append))
                for end in ends:
                    self.assertIn(end, boundaries)
                if per_append == len(cuts) + 1:
                    self.assertEqual(ends, [len(log)])
                    if _record._accel is not None:
                        self.assertEqual(reads, [])

    def test_pieces_corrupt_record(self) -> None:
        """
        A damaged record cut between two pieces, or lying in one, raises
        L{RecordError} at its offset with the reason L{advance} gives.
        """
        log, boundaries = replicated_log(self.SEGMENT, 1)
        bad = boundaries[2]
        damaged = bytearray(log)
        damaged[bad + 100] ^= 1  # in the body
        for cuts in ([bad + 50], [bad - 1, bad + 3], [5, 500]):
            with self.assertRaises(RecordError) as caught:
                self.feed_pieces(bytes(damaged), cuts, len(cuts) + 1)
            self.assertEqual((caught.exception.offset, caught.exception.reason),
                             (bad, "body CRC mismatch"))

    def test_short_blank(self) -> None:
        """
        A BLANK filler that stops short of the segment's end is refused
        with L{check_header}'s reason.
        """
        log, boundaries = replicated_log(self.SEGMENT, 1)
        blank = boundaries[-2]
        damaged = bytearray(log)
        damaged[blank : blank + 8] = encode_blank(self.SEGMENT - blank - 8)
        with self.assertRaises(RecordError) as caught:
            self.feed(bytes(damaged), 64)
        self.assertEqual(caught.exception.offset, blank)
        self.assertIn("does not reach", caught.exception.reason)


class HeaderHopTests(SynchronousTestCase):
    """
    L{read_header} and L{read_physical_offset}: the one place a record's
    header and offset field are read without decoding it.
    """

    def test_fields(self) -> None:
        """
        TOTALSIZE and MAGICCODE come from the record's first 8 bytes and
        PHYSICALOFFSET from byte 28, at any position of any buffer type.
        """
        record = encode(sample_message())
        for buf in (b"xy" + record, bytearray(b"xy" + record), memoryview(b"xy" + record)):
            self.assertEqual(read_header(buf, 2), (len(record), V1))
            self.assertEqual(read_physical_offset(buf, 2), PHYSICAL_OFFSET)
        self.assertEqual(read_header(encode_blank(64)), (64, BLANK))
