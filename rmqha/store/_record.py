# -*- test-case-name: tests.test_record -*-
"""
The commit-log record codec: RocketMQ 4.9 v1 message records and the BLANK
end-of-segment filler, bytes in and bytes out, with no I/O and no Twisted.

Every integer is big-endian and signed (Java's C{ByteBuffer} defaults).  The
layout, with IPv4 hosts (each IPv6 host adds 12 bytes)::

    0  TOTALSIZE         int32   whole record, this field included
    4  MAGICCODE         int32   0xDAA320A7 (v1); 0xDAA320AB is 5.x's v2
    8  BODYCRC           int32   zlib.crc32(body) & 0x7fffffff
    12 QUEUEID           int32
    16 FLAG              int32
    20 QUEUEOFFSET       int64   per topic/queue sequence number
    28 PHYSICALOFFSET    int64   where the record starts in the commit log
    36 SYSFLAG           int32
    40 BORNTIMESTAMP     int64   ms
    48 BORNHOST          4s+int32 (IPv4) or 16s+int32 (IPv6, sysflag 0x10)
    56 STORETIMESTAMP    int64   ms
    64 STOREHOST         4s+int32 (IPv4) or 16s+int32 (IPv6, sysflag 0x20)
    72 RECONSUMETIMES    int32
    76 PREPAREDTXOFFSET  int64
    84 BODYLENGTH        int32, then the body
       TOPICLENGTH       int8 (v1) / int16 (v2), then the UTF-8 topic
       PROPERTIESLENGTH  int16, then name\\x01value\\x02name\\x01value

This module is the only record decoder in the project: the store, its
recovery, the CLI and the Spark pipeline all go through L{parse_record}.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from mmap import mmap
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence, Union, cast

__all__ = [
    "record_json",
    "MESSAGE_MAGIC_V1",
    "MESSAGE_MAGIC_V2",
    "BLANK_MAGIC",
    "END_FILE_MIN_BLANK_LENGTH",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "MAX_TOPIC_LENGTH",
    "MAX_PROPERTIES_LENGTH",
    "SysFlag",
    "Message",
    "Record",
    "Blank",
    "RecordError",
    "MessageRejected",
    "RecordEncoder",
    "encode_record",
    "encode_blank",
    "parse_record",
    "encode_properties",
    "decode_properties",
    "body_crc",
    "offset_msg_id",
    "record_length",
    "is_record_start",
    "record_starts",
    "read_header",
    "read_physical_offset",
    "ReplicaValidator",
    "walk_valid",
    "walk_headers",
    "ACCELERATED",
]

#: v1 magic, C{-626843481} as a Java int.
MESSAGE_MAGIC_V1 = -626843481
#: v2 magic (RocketMQ 5.x, int16 topic length): read, never written.
MESSAGE_MAGIC_V2 = -626843477
#: End-of-segment filler magic, C{-875286124} as a Java int.
BLANK_MAGIC = -875286124
#: A record is placed in a segment only if it leaves room for a BLANK filler.
END_FILE_MIN_BLANK_LENGTH = 8
#: RocketMQ's C{maxMessageSize} default: the largest body accepted.
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: A v1 record stores the topic length in one signed byte.
MAX_TOPIC_LENGTH = 127
#: The properties length is a signed int16.
MAX_PROPERTIES_LENGTH = 32767

_NAME_VALUE_SEPARATOR = "\x01"
_PROPERTY_SEPARATOR = "\x02"
# RocketMQ's TopicValidator pattern: what a RocketMQ client can produce.
_TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+\Z")

# Record prefix up to and including BORNTIMESTAMP.
_PREFIX = struct.Struct(">iiiiiqqiq")
_HEADER_SIZE = _PREFIX.size  # 48
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
_INT = struct.Struct(">i")
_IPV4_HOST = struct.Struct(">4si")
_IPV6_HOST = struct.Struct(">16si")
_MIDDLE = struct.Struct(">iqi")  # RECONSUMETIMES, PREPAREDTXOFFSET, BODYLENGTH
_MSG_ID_TAIL = struct.Struct(">iq")  # port, physical offset

#: Smallest possible v1 record: IPv4 hosts, empty body, topic and properties.
_MIN_FIXED = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
#: The smallest record there can be (IPv4 hosts, empty body, topic and
#: properties).
MIN_RECORD_SIZE = _MIN_FIXED


class SysFlag:
    """
    Bits of the SYSFLAG field (RocketMQ C{MessageSysFlag}).
    """

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_MASK = 0xC
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80
    COMPRESSION_TYPE_MASK = 0x700


class RecordError(ValueError):
    """
    Bytes at C{offset} are not a valid record.

    @ivar offset: commit-log offset of the record start.
    @ivar reason: what is wrong with it, for operators.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"bad record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class MessageRejected(ValueError):
    """
    A message cannot be stored: the text names the field and the limit.
    """


Host = tuple[str, int]


@dataclass(slots=True)
class Message:
    """
    What a producer sends; the store adds offsets and the store timestamp.

    @ivar born_timestamp: ms since the epoch; C{None} means "the store
        timestamp".
    @ivar born_host: C{(ip, port)}; C{None} means "the store host".
    """

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    sysflag: int = 0
    born_timestamp: int | None = None
    born_host: Host | None = None
    reconsume_times: int = 0
    prepared_tx_offset: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """
    One decoded v1 (or 5.x v2) message record.
    """

    offset: int
    size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]
    #: Whether the body matches BODYCRC; C{None} when it was not computed.
    crc_ok: bool | None

    @property
    def next_offset(self) -> int:
        return self.offset + self.size

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> str | None:
        return self.properties.get("KEYS")

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)


class Blank(NamedTuple):
    """
    The end-of-segment filler: C{size} bytes (to the segment end) skipped.
    """

    offset: int
    size: int

    @property
    def next_offset(self) -> int:
        return self.offset + self.size


def body_crc(body: bytes) -> int:
    """
    RocketMQ's body checksum: C{java.util.zip.CRC32} masked to 31 bits.
    """
    return crc32(body) & 0x7FFFFFFF


@lru_cache(maxsize=1024)
def format_host(host: Host) -> str:
    """
    C{ip:port}, or C{[ip]:port} for IPv6.
    """
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _parse_host(host: Host) -> tuple[bytes, int, bool]:
    """
    C{(ip, port)} as C{(packed address, port, is IPv6)}.
    """
    try:
        ip, port = host
        address = ipaddress.ip_address(ip)
    except (TypeError, ValueError):
        raise MessageRejected(
            f"host {host!r} is not an (IPv4 or IPv6 address, port) pair"
        ) from None
    if not isinstance(port, int) or not 0 <= port <= 0xFFFF:
        raise MessageRejected(f"host port {port!r} is outside 0-65535")
    if address.version == 6 and address.ipv4_mapped is not None:
        # Java's InetAddress turns ::ffff:a.b.c.d into an Inet4Address.
        address = address.ipv4_mapped
    return address.packed, port, address.version == 6


def _unpack_host(buf: bytes | memoryview | bytearray | mmap, pos: int, v6: bool) -> Host:
    if v6:
        raw, port = _IPV6_HOST.unpack_from(buf, pos)
        return str(ipaddress.IPv6Address(raw)), port
    raw, port = _IPV4_HOST.unpack_from(buf, pos)
    return ".".join(map(str, raw)), port


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """
    C{name\\x01value\\x02name\\x01value}, no trailing separator (4.9's
    C{messageProperties2String}); refuses names or values that would break
    the framing.
    """
    if not properties:
        return b""
    try:
        text = _PROPERTY_SEPARATOR.join(
            map(_NAME_VALUE_SEPARATOR.join, properties.items())
        )
    except TypeError:
        raise MessageRejected("property names and values must be strings") from None
    # Counting separators in C is much cheaper than checking every string.
    count = len(properties)
    if (
        text.count(_NAME_VALUE_SEPARATOR) != count
        or text.count(_PROPERTY_SEPARATOR) != count - 1
        or "" in properties
    ):
        _explain_bad_properties(properties)
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MessageRejected(f"properties are not encodable as UTF-8: {e.reason}") from None
    if len(encoded) > MAX_PROPERTIES_LENGTH:
        raise MessageRejected(
            f"properties are {len(encoded)} bytes encoded; "
            f"the limit is {MAX_PROPERTIES_LENGTH}"
        )
    return encoded


def _explain_bad_properties(properties: Mapping[str, str]) -> None:
    for name, value in properties.items():
        if not name:
            raise MessageRejected("property names must not be empty")
        for part in (name, value):
            if _NAME_VALUE_SEPARATOR in part or _PROPERTY_SEPARATOR in part:
                raise MessageRejected(
                    f"property {name!r}: \\x01 and \\x02 are separators and "
                    "cannot appear in names or values"
                )
    raise AssertionError("unreachable")  # pragma: no cover


def decode_properties(raw: bytes | str) -> dict[str, str]:
    """
    Parse properties like RocketMQ's C{MessageDecoder.string2messageProperties}:
    chunks shorter than 3 characters, or without a separator strictly
    inside, are ignored rather than rejected.  C{raw} is the stored bytes
    (UTF-8), or the text (a send's header carries it as text).
    """
    result: dict[str, str] = {}
    if not raw:
        return result
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    for chunk in text.split(_PROPERTY_SEPARATOR):
        if len(chunk) < 3:
            continue
        index = chunk.find(_NAME_VALUE_SEPARATOR)
        if 0 < index < len(chunk) - 1:
            result[chunk[:index]] = chunk[index + 1 :]
    return result


def record_length(
    body_length: int,
    topic_length: int,
    properties_length: int,
    born_v6: bool = False,
    store_v6: bool = False,
    magic: int = MESSAGE_MAGIC_V1,
) -> int:
    """
    RocketMQ's C{calMsgLength}: 91 bytes of fixed fields with IPv4 hosts.
    """
    return (
        _MIN_FIXED
        + (12 if born_v6 else 0)
        + (12 if store_v6 else 0)
        + (1 if magic == MESSAGE_MAGIC_V2 else 0)
        + body_length
        + topic_length
        + properties_length
    )


def offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """
    RocketMQ's C{offsetMsgId}: upper-case hex of the store host (address and
    int32 port) followed by the int64 physical offset.
    """
    ip, port = store_host
    return (_packed_ip(ip) + _MSG_ID_TAIL.pack(port, physical_offset)).hex().upper()


@lru_cache(maxsize=64)
def _packed_ip(ip: str) -> bytes:
    # (A store has one host: parsing it for every put's msg_id cost ~2 %
    # of an HTTP put.)
    return ipaddress.ip_address(ip).packed


def encode_blank(size: int) -> bytes:
    """
    The 8 bytes that mark the remaining C{size} bytes of a segment unused.
    """
    return RECORD_HEADER.pack(size, BLANK_MAGIC)


def _check_int(name: str, value: int, bits: int) -> None:
    limit = 1 << (bits - 1)
    if not isinstance(value, int) or not -limit <= value < limit:
        raise MessageRejected(f"{name} {value!r} is not a {bits}-bit signed integer")


@lru_cache(maxsize=4096)
def _encode_topic(topic: str) -> bytes:
    """
    Validate a topic and return C{int8 length + UTF-8 bytes}.
    """
    if not isinstance(topic, str) or not topic:
        raise MessageRejected("topic must be a non-empty string")
    if not _TOPIC_PATTERN.match(topic):
        raise MessageRejected(
            f"topic {topic!r} has characters outside RocketMQ's [%|a-zA-Z0-9_-]"
        )
    encoded = topic.encode("ascii")
    if len(encoded) > MAX_TOPIC_LENGTH:
        raise MessageRejected(
            f"topic is {len(encoded)} bytes; a v1 record holds at most "
            f"{MAX_TOPIC_LENGTH}"
        )
    return bytes([len(encoded)]) + encoded


def _fixed_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    """
    Everything from TOTALSIZE to BODYLENGTH in one struct.
    """
    born = "16si" if born_v6 else "4si"
    store = "16si" if store_v6 else "4si"
    return struct.Struct(f">iiiiiqqiq{born}q{store}iqi")


_FIXED = {(b, s): _fixed_struct(b, s) for b in (False, True) for s in (False, True)}
_NOT_V6 = ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
# A BLANK's size is an int32, so no segment (and no record) is larger.
_MAX_RECORD = 0x7FFFFFFF


class RecordEncoder:
    """
    Encodes messages into v1 records for one store host.

    The store's put path calls L{encode} with the position, room and
    queue offset it assigns; L{encode_record} is the same code for callers
    that want bytes.

    @ivar max_message_size: the largest body accepted.
    """

    def __init__(
        self, store_host: Host, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    ) -> None:
        self.store_host = store_host
        self._store_ip, self._store_port, self._store_v6 = _parse_host(store_host)
        self._store_v6_flag = SysFlag.STOREHOST_V6 if self._store_v6 else 0
        # Born host defaults to the store host: same address family.
        self._fixed_default = _FIXED[self._store_v6, self._store_v6]
        self.max_message_size = max_message_size
        # What the compiled encoder reads: the store host, and the topics
        # and born hosts this encoder has already validated (filled by the
        # Python path, which the compiled one falls back to on a miss).
        self._topics: dict[str, bytes] = {}
        self._hosts: dict[Host, tuple[bytes, int, bool]] = {}
        self._c_state = (
            self._store_ip, self._store_port, self._store_v6, self._topics, self._hosts
        )

    def encode(
        self,
        buf: bytearray | memoryview | mmap | None,
        pos: int,
        room: int,
        message: Message,
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
    ) -> int:
        """
        Validate C{message} and, if its record takes at most C{room} bytes,
        write it at C{buf[pos:]}.  With C{room} -1 (and no C{buf}) this
        only validates and tells the size.

        One call does both because the store's put path needs the size to
        choose where the record goes, and a second pass over the message
        would cost as much as the encoding.

        @return: the record's size, or its size negated when it does not
            fit in C{room} (nothing is written then).
        @raise MessageRejected: the message breaks a limit (named in the
            text); nothing is written.
        """
        if _accel is not None:
            # The compiled encoder does the common message and answers
            # None for anything else (refusals included): this code then.
            total: int | None = _accel.encode(
                self, buf, pos, room, message, queue_offset, physical_offset,
                store_timestamp,
            )
            if total is not None:
                return total
        return self._encode(
            buf, pos, room, message, queue_offset, physical_offset, store_timestamp
        )

    def _remember(self, message: Message, topic: bytes, born: tuple[bytes, int, bool] | None) -> None:
        """
        Keep a validated topic and born host for the compiled encoder (exact
        C{str} and C{(str, int)} keys only: a C{1.0} or C{True} port would
        compare equal to C{1} and skip the checks).
        """
        if type(message.topic) is str and len(self._topics) < 4096:
            self._topics[message.topic] = topic
        host = message.born_host
        if (
            born is not None
            and type(host) is tuple
            and len(host) == 2
            and type(host[0]) is str
            and type(host[1]) is int
            and len(self._hosts) < 4096
        ):
            self._hosts[host] = born

    def _encode(
        self,
        buf: bytearray | memoryview | mmap | None,
        pos: int,
        room: int,
        message: Message,
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
    ) -> int:
        """
        L{encode} in Python: the reference the compiled encoder must equal.
        """
        body = message.body
        if type(body) is not bytes and not isinstance(body, (bytes, bytearray)):
            raise MessageRejected("body must be bytes")
        body_length = len(body)
        if body_length > self.max_message_size:
            raise MessageRejected(
                f"body is {body_length} bytes; maxMessageSize is "
                f"{self.max_message_size}"
            )
        try:
            topic = _encode_topic(message.topic)
        except TypeError:  # unhashable: not a string
            raise MessageRejected("topic must be a non-empty string") from None
        properties = (
            encode_properties(message.properties) if message.properties else b""
        )
        born_host = message.born_host
        # The host-family bits describe the record, whatever the caller set.
        sysflag = message.sysflag & _NOT_V6 | self._store_v6_flag
        if born_host is None:
            born_ip, born_port = self._store_ip, self._store_port
            fixed = self._fixed_default
            if self._store_v6:
                sysflag |= SysFlag.BORNHOST_V6
            self._remember(message, topic, None)
        else:
            try:
                born = _parse_host(cast(Host, tuple(born_host)))
            except TypeError:
                raise MessageRejected(
                    f"born host {born_host!r} is not an (address, port) pair"
                ) from None
            born_ip, born_port, born_v6 = born
            fixed = _FIXED[born_v6, self._store_v6]
            if born_v6:
                sysflag |= SysFlag.BORNHOST_V6
            self._remember(message, topic, born)
        tail = topic + _SHORT.pack(len(properties)) + properties
        total = fixed.size + body_length + len(tail)
        if total > room:
            # The caller may roll to a new segment on this answer: it must
            # only come for a message that is otherwise acceptable.
            born_timestamp = message.born_timestamp
            self._explain_bad_integer(
                message, store_timestamp if born_timestamp is None else born_timestamp
            )
            return -total
        assert buf is not None, "a buffer is needed when there is room"
        born_timestamp = message.born_timestamp
        if born_timestamp is None:
            born_timestamp = store_timestamp
        try:
            fixed.pack_into(
                buf,
                pos,
                total,
                MESSAGE_MAGIC_V1,
                crc32(body) & 0x7FFFFFFF,
                message.queue_id,
                message.flag,
                queue_offset,
                physical_offset,
                sysflag,
                born_timestamp,
                born_ip,
                born_port,
                store_timestamp,
                self._store_ip,
                self._store_port,
                message.reconsume_times,
                message.prepared_tx_offset,
                body_length,
            )
        except struct.error:
            # pack_into may have written some fields before failing.
            buf[pos : pos + fixed.size] = bytes(fixed.size)
            self._explain_bad_integer(message, born_timestamp)
            raise
        p = pos + fixed.size
        buf[p : p + body_length] = body
        p += body_length
        buf[p : p + len(tail)] = tail
        return total

    @staticmethod
    def _explain_bad_integer(message: Message, born_timestamp: int) -> None:
        _check_int("queue_id", message.queue_id, 32)
        _check_int("flag", message.flag, 32)
        _check_int("sysflag", message.sysflag, 32)
        _check_int("born_timestamp", born_timestamp, 64)
        _check_int("reconsume_times", message.reconsume_times, 32)
        _check_int("prepared_tx_offset", message.prepared_tx_offset, 64)


def encode_record(
    message: Message,
    *,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    store_host: Host,
) -> bytes:
    """
    The whole v1 record for C{message} as bytes.
    """
    encoder = RecordEncoder(store_host, max_message_size=_MAX_RECORD)
    # Room -1 fits nothing: this validates and tells the size.
    size = -encoder.encode(
        None, 0, -1, message, queue_offset, physical_offset, store_timestamp
    )
    if size > _MAX_RECORD:
        raise MessageRejected(f"record of {size} bytes is larger than any segment")
    buf = bytearray(size)
    encoder.encode(buf, 0, size, message, queue_offset, physical_offset, store_timestamp)
    return bytes(buf)


# -- the header hop ----------------------------------------------------------
#
# The one description of where a record's fields sit, used by everything
# that walks raw commit-log bytes without decoding them (the replica path,
# recovery's tail checks, the scrub, the data pipeline's planner).

#: TOTALSIZE and MAGICCODE: the first 8 bytes of every record and of a
#: BLANK filler (L{read_header} reads them; L{encode_blank} writes them).
RECORD_HEADER = struct.Struct(">ii")
_read_header = RECORD_HEADER.unpack_from
#: Where PHYSICALOFFSET (int64) sits from a record's start.
PHYSICALOFFSET_AT = 28
#: Where SYSFLAG (int32) sits from a record's start.
SYSFLAG_AT = 36
# BODYCRC, PHYSICALOFFSET and SYSFLAG, from a record's start.
_CHECKED = struct.Struct(">8xi16xqi")
_V6_HOSTS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
# Where BODYLENGTH sits with IPv4 hosts (each IPv6 host adds 12 bytes).
_BODY_LENGTH_AT = _HEADER_SIZE + 8 + 8 + 8 + 4 + 8


Buffer = Union[bytes, bytearray, memoryview, mmap]


def read_header(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """
    The header hop: C{(TOTALSIZE, MAGICCODE)} of the record or BLANK filler
    at C{buf[pos:]} (8 bytes must be there), unchecked; L{check_header} or
    L{parse_record} judge it.  The next record starts C{TOTALSIZE} bytes on.
    """
    header: tuple[int, int] = _read_header(buf, pos)
    return header


def read_physical_offset(buf: Buffer, pos: int) -> int:
    """
    The PHYSICALOFFSET field of the message record at C{buf[pos:]} (36
    bytes must be there), unchecked: where the record says it starts.
    """
    physical: int = _LONG.unpack_from(buf, pos + PHYSICALOFFSET_AT)[0]
    return physical


def body_length_at(sysflag: int) -> int:
    """
    Where BODYLENGTH (int32) sits from a record's start, given its SYSFLAG
    (an IPv6 born or store host adds 12 bytes before it).
    """
    if sysflag & _V6_HOSTS:
        return (
            _BODY_LENGTH_AT
            + (12 if sysflag & SysFlag.BORNHOST_V6 else 0)
            + (12 if sysflag & SysFlag.STOREHOST_V6 else 0)
        )
    return _BODY_LENGTH_AT


def is_message_magic(magic: int) -> bool:
    """
    Whether C{magic} is a message record's MAGICCODE (v1 or v2).
    """
    return magic == MESSAGE_MAGIC_V1 or magic == MESSAGE_MAGIC_V2


def check_header(total: int, magic: int, position: int, size: int) -> str | None:
    """
    Why the header C{(total, magic)} at C{position} of a segment of C{size}
    bytes cannot start a record or a BLANK filler, or C{None} if it can.
    A BLANK must reach exactly the segment's end; a record must fit in it.
    """
    if magic == BLANK_MAGIC:
        if position + total != size:
            return (
                f"a BLANK filler of {total} bytes at segment position {position} "
                f"does not reach this store's segment end ({size}): the master's "
                "segment size differs (mappedFileSizeCommitLog must match)"
            )
        return None
    if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2:
        return f"bad magic code 0x{magic & 0xFFFFFFFF:08X}"
    if total < _MIN_FIXED or position + total > size:
        return f"total size {total} is impossible at segment position {position} of {size}"
    return None


def check_record(
    record: bytes | bytearray | memoryview | mmap, at: int, offset: int, total: int, magic: int
) -> str | None:
    """
    Why the whole message record at C{record[at:at + total]}, whose header
    passed L{check_header}, is not a valid record at commit-log C{offset},
    or C{None} if it is: PHYSICALOFFSET, that the fields add up to TOTALSIZE
    (RocketMQ's C{calMsgLength}) and the body CRC.  Nothing is decoded: the
    replica path runs this once per replicated record; L{parse_record} is
    the decoder.
    """
    if _accel is not None and _accel.check_record(record, at, offset, total, magic):
        return None
    return _check_record(record, at, offset, total, magic)


def _check_record(
    record: bytes | bytearray | memoryview | mmap, at: int, offset: int, total: int, magic: int
) -> str | None:
    """
    L{check_record} in Python: the reference, and the one that says why.
    """
    (crc, physical, sysflag) = _CHECKED.unpack_from(record, at)
    if physical != offset:
        return f"PHYSICALOFFSET field says {physical}"
    body_at = at + body_length_at(sysflag)
    record_end = at + total
    if body_at + 4 > record_end:
        return f"total size {total} is too small for its hosts"
    (body_length,) = _INT.unpack_from(record, body_at)
    body_at += 4
    # The topic length byte(s) and the properties length must fit.
    topic_at = body_at + body_length
    if body_length < 0 or topic_at + 2 > record_end:
        return f"body length {body_length} does not fit"
    # Signed, as L{parse_record} and RocketMQ's Java read it: a length the
    # decoder refuses is refused here too, so a slave never acknowledges a
    # record its own recovery would call damage.
    if magic == MESSAGE_MAGIC_V1:
        topic_length = record[topic_at] if record[topic_at] < 128 else record[topic_at] - 256
        properties_at = topic_at + 1 + topic_length
    else:
        (topic_length,) = _SHORT.unpack_from(record, topic_at)
        properties_at = topic_at + 2 + topic_length
    if topic_length < 0:
        return f"topic length {topic_length} is negative"
    if properties_at + 2 > record_end or (
        properties_at + 2 + _SHORT.unpack_from(record, properties_at)[0] != record_end
    ):
        return f"its fields do not add up to its total size {total}"
    if body_length and (
        crc32(record[body_at : body_at + body_length]) & 0x7FFFFFFF
    ) != crc:
        return "body CRC mismatch"
    return None


class ReplicaValidator:
    """
    The replica path's incremental check: bytes a master sent arrive in
    chunks that cut through records; after each chunk, L{advance} checks
    the records it completed (L{check_header}, L{check_record}: size,
    magic, PHYSICALOFFSET, that the fields add up, body CRC, and that a
    BLANK filler reaches exactly its segment's end) and tells how far the
    whole, valid records now reach.

    It holds no position: the caller owns the record end (puts, cuts and
    truncation move it too) and passes it in.  Bytes of a record that began
    in an earlier chunk come from C{read}, never from a mapping (which would
    map a whole replicated log into the process).

    @ivar segment_size: the log's segment size; segments start at its
        multiples and every segment but the last is full.
    """

    __slots__ = ("segment_size", "_read")

    def __init__(self, segment_size: int, read: Callable[[int, int], bytes]) -> None:
        """
        @param read: C{read(offset, length)}: C{length} bytes of the log
            from C{offset}, all of them already written.
        """
        self.segment_size = segment_size
        self._read = read

    def advance(
        self, record_end: int, max_offset: int, chunk_offset: int, chunk: Buffer
    ) -> int:
        """
        Check the records between C{record_end} (a record boundary) and
        C{max_offset} that are now complete; C{chunk} holds the log's bytes
        from C{chunk_offset} (the ones just appended).

        @return: the new record end: the end of the last whole record, or
            the next segment's start after a BLANK filler.
        @raise RecordError: a completed record (at C{e.offset}) is invalid;
            C{e.reason} says why.
        """
        if _accel is None:
            return self._advance(record_end, max_offset, chunk_offset, chunk, -1)
        # The compiled hop goes over the valid records lying whole in the
        # chunk; the Python loop takes one step wherever it stops (a record
        # begun in an earlier chunk, a BLANK, an invalid record, which it
        # raises for), then the compiled hop goes on.
        hop: Callable[[Buffer, int, int, int, int], int] = _accel.replica_hop
        size = self.segment_size
        end = record_end
        while True:
            end = hop(chunk, chunk_offset, end, max_offset, size)
            if end >= max_offset:
                return end  # (the usual case: the chunk ends in whole records)
            after = self._advance(end, max_offset, chunk_offset, chunk, 1)
            if after == end:
                return end
            end = after

    def advance_pieces(
        self, record_end: int, max_offset: int, chunk_offset: int, pieces: Sequence[Buffer]
    ) -> int:
        """
        L{advance} over consecutive C{pieces} appended from C{chunk_offset}
        (a slave's frame bodies, written one after the other).  Compiled,
        one call goes over all of them, a record cut between two pieces
        included (checked from a copy of its bytes, not read back from the
        file); the Python step where it stops is given the piece holding
        the record end.  Without the accelerator: piece by piece.

        @raise RecordError: as L{advance}.
        """
        if _accel is None:
            end, position = record_end, chunk_offset
            for piece in pieces:
                length = len(memoryview(piece))
                end = self.advance(end, min(position + length, max_offset), position, piece)
                position += length
            return end
        hop: Callable[[Sequence[Buffer], int, int, int, int], int] = _accel.replica_hop_pieces
        size = self.segment_size
        end = record_end
        while True:
            end = hop(pieces, chunk_offset, end, max_offset, size)
            # The piece holding the record end (none: from the file).
            piece_offset, piece = chunk_offset, memoryview(b"")
            for candidate in pieces:
                length = len(memoryview(candidate))
                if piece_offset + length > end:
                    if piece_offset <= end:
                        piece = memoryview(candidate)
                    break
                piece_offset += length
            after = self._advance(end, max_offset, piece_offset, piece, 1)
            if after == end:
                return end
            end = after

    def _advance(
        self, record_end: int, max_offset: int, chunk_offset: int, chunk: Buffer,
        steps: int,
    ) -> int:
        """
        L{advance} in Python, returning after C{steps} records or BLANK
        fillers (-1: no limit).
        """
        chunk_end = chunk_offset + len(chunk)
        end = record_end
        total: int
        magic: int
        size = self.segment_size
        read = self._read
        header_at = _read_header
        while end < max_offset:
            position = end % size
            segment_start = end - position
            wrote = min(size, max_offset - segment_start)
            # Hop record to record inside this segment (the hot loop: one
            # pass per replicated record).
            while position < size:
                if wrote - position < 8:
                    return end
                in_chunk = chunk_offset <= end and end + 8 <= chunk_end
                if in_chunk:
                    total, magic = header_at(chunk, end - chunk_offset)
                else:
                    total, magic = header_at(read(end, 8))
                why = check_header(total, magic, position, size)
                if why is not None:
                    raise RecordError(end, why)
                if magic == BLANK_MAGIC:
                    if wrote < size:
                        return end
                    position = size
                    steps -= 1
                    break
                if position + total > wrote:
                    return end
                if in_chunk and end + total <= chunk_end:
                    why = check_record(chunk, end - chunk_offset, end, total, magic)
                else:
                    why = check_record(read(end, total), 0, end, total, magic)
                if why is not None:
                    raise RecordError(end, why)
                end += total
                position += total
                steps -= 1
                if not steps:
                    return end
            if position >= size:
                end = segment_start + size
            if not steps:
                return end
        return end


def record_body_length(buf: bytes | bytearray | memoryview | mmap, pos: int) -> int:
    """
    BODYLENGTH of the message record at C{buf[pos:]}, whose header has been
    checked (by L{parse_record}).
    """
    (sysflag,) = _INT.unpack_from(buf, pos + SYSFLAG_AT)
    length: int = _INT.unpack_from(buf, pos + body_length_at(sysflag))[0]
    return length


def record_topic(buf: bytes | bytearray | memoryview | mmap, pos: int, end: int) -> bytes | None:
    """
    The topic of the message record at C{buf[pos:end]}, read without
    decoding the rest (to skip records by topic cheaply), or C{None} when
    the bytes there are not a plausible message record; L{parse_record}
    remains the judge of validity.
    """
    if end - pos < _HEADER_SIZE:
        return None
    total, magic = _read_header(buf, pos)
    if (magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2) or not (
        _MIN_FIXED <= total <= end - pos
    ):
        return None
    (sysflag,) = _INT.unpack_from(buf, pos + SYSFLAG_AT)
    p = pos + body_length_at(sysflag)
    (body_length,) = _INT.unpack_from(buf, p)
    p += 4 + body_length
    limit = pos + total
    if body_length < 0 or p + 2 > limit:
        return None
    if magic == MESSAGE_MAGIC_V1:
        length = buf[p] if buf[p] < 128 else -1
        p += 1
    else:
        (length,) = _SHORT.unpack_from(buf, p)
        p += 2
    if length < 0 or p + length > limit:
        return None
    return bytes(buf[p : p + length])


#: The MAGICCODE bytes of a message record (v1, v2), to search for.
MAGIC_BYTES = (
    struct.pack(">i", MESSAGE_MAGIC_V1),
    struct.pack(">i", MESSAGE_MAGIC_V2),
)


def is_record_start(
    buf: bytes | bytearray | mmap, p: int, base: int, size: int
) -> bool:
    """
    Whether C{buf[p:]} looks like the start of a record (not yet a proof:
    L{parse_record} decides): a message magic, a TOTALSIZE no smaller than
    any record and ending by C{size}, and a PHYSICALOFFSET equal to
    C{base + p}, the offset it sits at.

    @param base: the commit-log offset of C{buf[0]}.
    @param size: where the segment ends, in C{buf}'s coordinates.
    """
    if p < 0 or p + PHYSICALOFFSET_AT + 8 > len(buf):
        return False
    total, magic = _read_header(buf, p)
    if magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2) or not (
        _MIN_FIXED <= total <= size - p
    ):
        return False
    return read_physical_offset(buf, p) == base + p


def record_starts(
    buf: bytes | bytearray | mmap, start: int, end: int, base: int, size: int
) -> Iterator[int]:
    """
    The positions C{start <= p < end} of C{buf}, in order, passing
    L{is_record_start}.  The commit log has no sync marker; this is the one
    way to find where records start again after damage (recovery, C{rmqha
    store check} and C{repair}, the data pipeline's cuts).  It costs a C
    speed C{find} for each magic plus a few field reads per match.
    """
    found = [buf.find(magic, start + 4) for magic in MAGIC_BYTES]
    while True:
        live = [i for i in found if i != -1]
        if not live:
            return
        i = min(live)
        p = i - 4
        if p >= end:
            return
        if is_record_start(buf, p, base, size):
            yield p
        which = found.index(i)
        found[which] = buf.find(MAGIC_BYTES[which], i + 1)


def parse_record(
    buf: bytes | bytearray | memoryview | mmap,
    pos: int,
    end: int,
    offset: int,
    *,
    check_crc: bool = True,
    with_body: bool = True,
    strict: bool = False,
    report_crc: bool = False,
) -> Union[Record, Blank]:
    """
    Decode the record at C{buf[pos:end]}, which sits at commit-log C{offset}.

    C{end} is the end of the segment (or of the bytes known to be written):
    nothing past it is read.  A BLANK filler must reach exactly C{end}.

    Checks, each failure a L{RecordError} naming the offset and the reason:
    the magic; that TOTALSIZE fits before C{end} and equals the length the
    fields add up to (RocketMQ's C{calMsgLength} check); that PHYSICALOFFSET
    is C{offset} (RocketMQ does not check this; a record at the wrong place
    is stale or misplaced bytes); and, with C{check_crc}, the body CRC.

    @param with_body: C{False} leaves C{body} empty and C{crc_ok} C{None}
        unless C{check_crc} or C{report_crc} is set.
    @param report_crc: compute C{crc_ok} without raising on a mismatch, even
        without the body (the data pipeline's C{crc_ok} column).
    @param strict: also refuse a topic or properties that end in a zero
        byte.  Neither can (topics are validated, property text is never
        NUL-terminated), but it is exactly what a torn write leaves when a
        record's last bytes never reached the disk, and the body CRC does
        not cover them.  Recovery and C{rmqha store check} use it.
    """
    available = end - pos
    if available < 8:
        if available > 0 and not any(buf[pos:end]):
            raise RecordError(offset, "no record here (zero bytes)")
        raise RecordError(
            offset, f"truncated: {available} bytes left, a record header needs 8"
        )
    total, magic = _read_header(buf, pos)
    if magic == BLANK_MAGIC:
        if total != available:
            raise RecordError(
                offset,
                f"BLANK filler says {total} bytes but {available} remain "
                "in the segment",
            )
        return Blank(offset, total)
    if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2:
        if total == 0 and magic == 0:
            raise RecordError(offset, "no record here (zero bytes)")
        raise RecordError(offset, f"bad magic code 0x{magic & 0xFFFFFFFF:08X}")
    if total < _MIN_FIXED:
        raise RecordError(
            offset, f"total size {total} is smaller than any record ({_MIN_FIXED})"
        )
    if total > available:
        raise RecordError(
            offset,
            f"total size {total} runs past the {available} bytes written "
            "after it (torn record)",
        )
    (
        _,
        _,
        stored_crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sysflag,
        born_timestamp,
    ) = _PREFIX.unpack_from(buf, pos)
    born_v6 = bool(sysflag & SysFlag.BORNHOST_V6)
    store_v6 = bool(sysflag & SysFlag.STOREHOST_V6)
    p = pos + _HEADER_SIZE
    limit = pos + total
    # The fixed part is now known; every later read stays inside the record.
    fixed_end = p + (20 if born_v6 else 8) + 8 + (20 if store_v6 else 8) + 16
    if fixed_end > limit:
        raise RecordError(offset, f"total size {total} is too small for its hosts")
    born_host = _unpack_host(buf, p, born_v6)
    p += 20 if born_v6 else 8
    (store_timestamp,) = _LONG.unpack_from(buf, p)
    p += 8
    store_host = _unpack_host(buf, p, store_v6)
    p += 20 if store_v6 else 8
    reconsume_times, prepared_tx_offset, body_length = _MIDDLE.unpack_from(buf, p)
    p += 16
    if body_length < 0 or p + body_length > limit:
        raise RecordError(
            offset, f"body length {body_length} does not fit in total size {total}"
        )
    body_start = p
    p += body_length
    if magic == MESSAGE_MAGIC_V1:
        if p + 1 > limit:
            raise RecordError(offset, "topic length runs past the record")
        topic_length = buf[p] if buf[p] < 128 else buf[p] - 256
        p += 1
    else:
        if p + 2 > limit:
            raise RecordError(offset, "topic length runs past the record")
        (topic_length,) = _SHORT.unpack_from(buf, p)
        p += 2
    if topic_length < 0 or p + topic_length + 2 > limit:
        raise RecordError(
            offset, f"topic length {topic_length} does not fit in total size {total}"
        )
    topic_bytes = bytes(buf[p : p + topic_length])
    if strict and topic_length and topic_bytes[-1] == 0:
        raise RecordError(offset, "topic ends in a zero byte (torn record)")
    p += topic_length
    (properties_length,) = _SHORT.unpack_from(buf, p)
    p += 2
    if properties_length < 0 or p + properties_length > limit:
        raise RecordError(
            offset,
            f"properties length {properties_length} does not fit in total size "
            f"{total}",
        )
    properties_raw = bytes(buf[p : p + properties_length])
    if strict and properties_length and properties_raw[-1] == 0:
        raise RecordError(offset, "properties end in a zero byte (torn record)")
    p += properties_length
    if p != limit:
        raise RecordError(
            offset,
            f"total size {total} does not match the {p - pos} bytes its fields "
            "add up to",
        )
    if physical_offset != offset:
        raise RecordError(
            offset,
            f"PHYSICALOFFSET field says {physical_offset}, the record is at {offset}",
        )
    body = bytes(buf[body_start : body_start + body_length]) if with_body else b""
    if check_crc and body_length > 0:
        crc_ok = (
            crc32(buf[body_start : body_start + body_length]) & 0x7FFFFFFF
        ) == stored_crc
        if not crc_ok:
            raise RecordError(
                offset,
                f"body CRC mismatch: stored {stored_crc}, computed "
                f"{body_crc(bytes(buf[body_start:body_start + body_length]))}",
            )
    elif check_crc or with_body or report_crc:
        # RocketMQ checks the CRC only when the body is not empty.
        crc_ok = body_length == 0 or (
            crc32(buf[body_start : body_start + body_length]) & 0x7FFFFFFF
        ) == stored_crc
    else:
        crc_ok = None
    return Record(
        offset=offset,
        size=total,
        magic=magic,
        body_crc=stored_crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sysflag=sysflag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_timestamp=store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_tx_offset=prepared_tx_offset,
        body=body,
        topic=topic_bytes.decode("utf-8", "replace"),
        properties=decode_properties(properties_raw),
        crc_ok=crc_ok,
    )


def walk_valid(
    buf: Buffer, pos: int, end: int, offset: int, *, check_crc: bool, strict: bool
) -> tuple[int, int, int]:
    """
    Hop over the message records from C{buf[pos:end]} (C{buf[pos]} at
    commit-log C{offset}) that L{parse_record} accepts (with
    C{with_body=False} and these C{check_crc} and C{strict}), stopping at
    the first thing that is not one: a BLANK, a record it refuses, the end.
    Nothing is decoded; the caller parses the record where the hop stopped
    to learn what is there.  Recovery's walk and C{rmqha store check}.
    Nothing past the buffer is read, whatever C{end} says.

    @return: C{(stop, records, last)}: where it stopped, how many records
        it went over, the position of the last one (-1: none).
    """
    if _accel is not None:
        walked: tuple[int, int, int] = _accel.walk_valid(
            buf, pos, end, offset, check_crc, strict
        )
        return walked
    base = offset - pos
    records, last = 0, -1
    end = min(end, len(buf))
    while pos < end:
        try:
            item = parse_record(
                buf, pos, end, base + pos,
                check_crc=check_crc, with_body=False, strict=strict,
            )
        except RecordError:
            break
        if type(item) is Blank:
            break
        records += 1
        last = pos
        pos += item.size
    return pos, records, last


def walk_headers(buf: Buffer, pos: int, size: int) -> tuple[list[int], int]:
    """
    The header hop over one buffer, checking nothing but the header: the
    positions of the records from C{buf[pos:]} whose MAGICCODE is a
    message's and whose TOTALSIZE is positive and ends by C{size}, and
    where the hop stopped: at a header that is not such a record's, at
    C{size}, or where fewer than 8 bytes of C{buf} are left (then the
    caller reads on from there).  The data pipeline's planner.
    """
    if _accel is not None:
        hopped: tuple[list[int], int] = _accel.walk_headers(buf, pos, size)
        return hopped
    positions = []
    length = len(buf)
    while pos >= 0 and pos + 8 <= length and pos + 8 <= size:
        total, magic = _read_header(buf, pos)
        if (magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2) or (
            total <= 0 or pos + total > size
        ):
            break
        positions.append(pos)
        pos += total
    return positions, pos


def record_json(record: Record) -> dict[str, Any]:
    """
    C{record} as JSON-ready values: one line of C{rmqha store dump}, and
    the pipeline's verify report of a record (base64 body).
    """
    return {
        "offset": record.offset,
        "size": record.size,
        "topic": record.topic,
        "queue_id": record.queue_id,
        "queue_offset": record.queue_offset,
        "flag": record.flag,
        "sysflag": record.sysflag,
        "born_timestamp": record.born_timestamp,
        "born_host": format_host(record.born_host),
        "store_timestamp": record.store_timestamp,
        "store_host": format_host(record.store_host),
        "reconsume_times": record.reconsume_times,
        "prepared_tx_offset": record.prepared_tx_offset,
        "msg_id": record.msg_id,
        "properties": record.properties,
        "tags": record.tags,
        "keys": record.keys,
        "body_crc": record.body_crc,
        "crc_ok": record.crc_ok,
        "body": base64.b64encode(record.body).decode("ascii"),
    }


# -- the compiled accelerator ------------------------------------------------


def _load_accelerator() -> Any:
    """
    C{rmqha.store._speedups} (built by pip from C{_speedups.c}; from the
    zip a Spark driver ships, too: L{rmqha.store._native}), unless
    C{RMQHA_PURE} is set to anything but C{0} or it was not built.
    """
    if os.environ.get("RMQHA_PURE", "0") not in ("", "0"):
        return None
    from rmqha.store import _native

    return _native.load()


#: The compiled hot loops (L{RecordEncoder.encode}, L{check_record},
#: L{ReplicaValidator.advance}, L{walk_valid}, L{walk_headers}), or C{None}:
#: the pure-Python code here.  Each compiled function answers only what
#: this module's code would answer and hands everything else (refusals and
#: their reasons included) back to it.
_accel: Any = _load_accelerator()
#: Whether the compiled accelerator is in use (see C{RMQHA_PURE}).
ACCELERATED = _accel is not None
#: The one CRC-32 of the project's hot paths (body CRCs here, checked
#: framing in L{rmqha.ha._wire}): C{crc32(data, value=0)}, exactly
#: C{zlib.crc32}'s results.  The compiled one folds with PCLMULQDQ where the
#: CPU has it (several times zlib's speed, see docs/store.md); without the
#: accelerator (or with C{RMQHA_PURE=1}) it is C{zlib.crc32} itself.
crc32: Callable[..., int] = zlib.crc32 if _accel is None else _accel.crc32
