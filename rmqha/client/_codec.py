# -*- test-case-name: tests.test_client_codec -*-
"""
What a RocketMQ 4.9.8 producer puts on the wire and reads back, sans-IO
(values in, values out, no I/O): messages and their properties string,
the SEND_MESSAGE_V2 header (the broker's L{rmqha.remoting.sends}
definition), a batch body as C{MessageDecoder.encodeMessages} writes
it, the unique message id of
C{MessageClientIDSetter}, the send reply as C{MQClientAPIImpl.processSendResponse}
reads it, and routes (C{TopicRouteData}) as the NameServer sends them,
standard JSON or fastjson's unquoted integer keys.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import random
import struct
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Final

from rmqha.remoting._frames import (
    CustomHeaderError,
    RemotingCommand,
    header_from_ext_fields,
    java_hashmap_order,
)
from rmqha.remoting.codes import ResponseCode
from rmqha.remoting.metadata import PERM_WRITE, MetadataFormatError, parse_fastjson, validate_topic_name
from rmqha.remoting.sends import (
    AUTO_CREATE_TOPIC,
    MSG_REGION,
    NOT_ALLOWED_SEND_TOPICS,
    PROPERTY_DELAY,
    PROPERTY_WAIT,
    TRACE_ON,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    encode_batch_item,
)
from rmqha.store._record import encode_properties

__all__ = [
    "SendMessageRequestHeaderV2",
    "SendMessageResponseHeader",
    "Message",
    "MessageQueue",
    "SendStatus",
    "SendResult",
    "QueueData",
    "BrokerData",
    "TopicRoute",
    "RouteError",
    "SendError",
    "SendReplyError",
    "UniqueIdFactory",
    "properties_string",
    "encode_batch",
    "compress_body",
    "parse_route",
    "publish_queues",
    "default_route_for",
    "check_message",
    "send_result",
]

#: C{MessageConst}'s property names (the broker's side defines the rest).
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
#: C{MessageConst.STRING_HASH_SET}: names a user property may not take.
RESERVED_PROPERTIES: Final = frozenset(
    "TRACE_ON MSG_REGION KEYS TAGS WAIT DELAY RETRY_TOPIC REAL_TOPIC REAL_QID TRAN_MSG "
    "PGROUP MIN_OFFSET MAX_OFFSET BUYER_ID ORIGIN_MESSAGE_ID TRANSFER_FLAG CORRECTION_FLAG "
    "MQ2_FLAG RECONSUME_TIME UNIQ_KEY MAX_RECONSUME_TIMES CONSUME_START_TIME INSTANCE_ID "
    "CORRELATION_ID REPLY_TO_CLIENT TTL ARRIVE_TIME PUSH_REPLY_TIME CLUSTER MSG_TYPE "
    "INNER_MULTI_QUEUE_OFFSET".split()
)

#: C{TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC}: the topic whose route a
#: producer borrows for a topic the NameServers do not know.
AUTO_CREATE_TOPIC_KEY: Final = AUTO_CREATE_TOPIC
#: C{MessageSysFlag}.
COMPRESSED_FLAG: Final = 0x1
COMPRESSION_ZLIB_TYPE: Final = 0x3 << 8
TRANSACTION_PREPARED_TYPE: Final = 0x1 << 2
#: C{DefaultMQProducer.compressMsgBodyOverHowmuch} and the zlib level of
#: C{DefaultMQProducerImpl.compressLevel}.
COMPRESS_OVER: Final = 4 * 1024
COMPRESS_LEVEL: Final = 5
#: C{DefaultMQProducer.maxMessageSize}.
MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024
_MASTER_ID: Final = 0


@dataclasses.dataclass(frozen=True)
class MessageQueue:
    """C{MessageQueue}: one queue of a topic on one broker (by name)."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@dataclasses.dataclass(frozen=True)
class Message:
    """
    A message to send, as C{new Message(topic, tags, keys, flag, body,
    waitStoreMsgOK)} builds it.

    @ivar keys: C{KEYS}, joined with spaces (C{MessageConst.KEY_SEPARATOR}).
    @ivar properties: user properties (names of L{RESERVED_PROPERTIES}
        refused, as C{putUserProperty} does).
    @ivar wait_store_msg_ok: the C{WAIT} property: the broker answers a
        SYNC master's send once the slave has it (C{true}, the default).
    @ivar unique_id: C{UNIQ_KEY}; the producer makes one when it is C{None}.
    @ivar delay_level: C{DELAY} (C{setDelayTimeLevel}; 1-18 on a default
        broker): delivered after that level's delay; 0 at once.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    flag: int = 0
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    wait_store_msg_ok: bool = True
    unique_id: str | None = None
    delay_level: int = 0

    def property_map(self) -> dict[str, str]:
        """
        The properties as the Java message holds them, in the order it
        put them in its C{HashMap}: TAGS, KEYS, WAIT, the user's, UNIQ_KEY.
        """
        props: dict[str, str] = {}
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        keys = self.keys if isinstance(self.keys, str) or self.keys is None else " ".join(self.keys)
        if keys:
            props[PROPERTY_KEYS] = keys
        props[PROPERTY_WAIT] = "true" if self.wait_store_msg_ok else "false"
        props.update(self.properties)
        if self.delay_level > 0:
            props[PROPERTY_DELAY] = str(self.delay_level)
        if self.unique_id is not None:
            props[PROPERTY_UNIQ_KEY] = self.unique_id
        return props


def check_message(message: Message, max_size: int = MAX_MESSAGE_SIZE) -> None:
    """
    C{Validators.checkMessage} and C{putUserProperty}'s checks.

    @raise ValueError: one line naming the topic and what is wrong.
    """
    topic = message.topic
    validate_topic_name(topic)
    if topic in NOT_ALLOWED_SEND_TOPICS:
        raise ValueError(f"topic {topic!r} is a system topic messages cannot be sent to")
    if message.delay_level < 0:
        raise ValueError(f"the message to topic {topic!r} has delay level {message.delay_level}")
    if not message.body:
        raise ValueError(f"the message to topic {topic!r} has an empty body")
    if len(message.body) > max_size:
        raise ValueError(
            f"the message to topic {topic!r} has a {len(message.body)}-byte body (at most {max_size})"
        )
    for name, value in message.properties.items():
        if name in RESERVED_PROPERTIES:
            raise ValueError(f"property {name!r} is used by RocketMQ itself; choose another name")
        if not name.strip() or not value.strip():
            raise ValueError(f"property {name!r}={value!r}: neither name nor value may be blank")


def properties_string(props: Mapping[str, str]) -> str:
    """
    C{MessageDecoder.messageProperties2String}: C{name\\x01value} joined
    by C{\\x02}, no trailing separator, in the iteration order of the Java
    C{HashMap} the properties were put into in C{props}' order.

    @raise ValueError: (the store's C{MessageRejected}) a separator in a
        name or value, an empty name, or more than 32767 bytes.
    """
    ordered = {name: props[name] for name in java_hashmap_order(props)}
    return encode_properties(ordered).decode("utf-8")


def encode_batch(items: Iterable[tuple[bytes, int, str]]) -> bytes:
    """
    A SEND_BATCH_MESSAGE body, C{MessageDecoder.encodeMessages}: each
    C{(body, flag, properties string)} as the broker's
    L{encode_batch_item} writes it, back to back.
    """
    return b"".join(encode_batch_item(flag, body, props.encode("utf-8")) for body, flag, props in items)


def compress_body(body: bytes, over: int = COMPRESS_OVER) -> tuple[bytes, int]:
    """
    C{tryToCompressMessage}: a body of C{over} bytes or more deflated
    (zlib stream, level 5, as C{ZlibCompressor}), with the sysFlag bits it
    sets (COMPRESSED plus the ZLIB compression type); else as it is, 0.
    """
    if len(body) >= over:
        return zlib.compress(body, COMPRESS_LEVEL), COMPRESSED_FLAG | COMPRESSION_ZLIB_TYPE
    return body, 0


class SendStatus(enum.Enum):
    """
    C{SendStatus}: every one means the broker stored the message; all but
    SEND_OK say a SYNC guarantee was not met in time.
    """

    SEND_OK = ResponseCode.SUCCESS
    FLUSH_DISK_TIMEOUT = ResponseCode.FLUSH_DISK_TIMEOUT
    FLUSH_SLAVE_TIMEOUT = ResponseCode.FLUSH_SLAVE_TIMEOUT
    SLAVE_NOT_AVAILABLE = ResponseCode.SLAVE_NOT_AVAILABLE


@dataclasses.dataclass(frozen=True)
class SendResult:
    """
    C{SendResult}.

    @ivar msg_id: the message's C{UNIQ_KEY} (a batch: its items', joined
        with commas).
    @ivar offset_msg_id: the broker's id: store host and commit-log offset
        in hex (a batch: comma-joined).
    @ivar queue_offset: the (first) message's index in its queue.
    @ivar broker: where it was sent: C{name (address)}.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    broker: str = ""


class SendError(Exception):
    """
    A send that failed; the text is one line naming the topic, and the
    broker and response code where there is one.
    """


class SendReplyError(SendError):
    """
    A broker answered a send with a code that is not a "stored" one
    (C{MQBrokerException}), or with a header a client cannot read.

    @ivar code: the response code (-1: an unreadable success reply).
    """

    def __init__(self, code: int, remark: str | None, broker: str, topic: str) -> None:
        self.code = code
        self.remark = remark
        self.broker = broker
        self.topic = topic
        try:
            name = f"{ResponseCode(code).name} ({code})"
        except ValueError:
            name = f"code {code}"
        text = f"broker {broker} answered a send to topic {topic!r} with {name}"
        if remark:
            text += ": " + " ".join(remark.split())[:300]
        super().__init__(text)


def send_result(
    response: RemotingCommand, queue: MessageQueue, unique_id: str, broker: str
) -> SendResult:
    """
    C{MQClientAPIImpl.processSendResponse}: the result of a stored send
    (codes 0, 10, 11, 12).

    @param queue: the queue asked for; its id is replaced by the broker's.
    @param broker: C{name (address)}, for errors.
    @raise SendReplyError: any other code (with the broker's remark), or a
        stored reply without C{msgId}/C{queueId}/C{queueOffset} (code -1).
    """
    try:
        status = SendStatus(response.code)
    except ValueError:
        raise SendReplyError(response.code, response.remark, broker, queue.topic) from None
    try:
        header = header_from_ext_fields(SendMessageResponseHeader, response.ext_fields)
    except CustomHeaderError as e:
        raise SendReplyError(-1, f"unreadable reply header: {e}", broker, queue.topic) from None
    ext = response.ext_fields or {}
    return SendResult(
        status=status,
        msg_id=unique_id,
        offset_msg_id=header.msg_id,
        queue=dataclasses.replace(queue, queue_id=header.queue_id),
        queue_offset=header.queue_offset,
        transaction_id=header.transaction_id,
        region_id=ext.get(MSG_REGION) or "DefaultRegion",
        trace_on=ext.get(TRACE_ON) != "false",
        broker=broker,
    )


class UniqueIdFactory:
    """
    C{MessageClientIDSetter.createUniqID}: 32 upper-case hex digits of the
    client's IPv4 address (4 bytes), its pid (2), a per-instance number
    (4; Java: its class loader's hash code), the milliseconds since the
    start of the current month (4) and a counter (2).

    The month starts in UTC here (Java: in the JVM's time zone); the
    format, and the IP and pid a broker's tools read from it, are Java's.
    """

    def __init__(
        self, ip: bytes = b"\x7f\x00\x00\x01", pid: int | None = None, instance: int | None = None
    ) -> None:
        if len(ip) not in (4, 16):
            raise ValueError(f"the IP for message ids is {len(ip)} bytes, not 4 or 16")
        pid = os.getpid() if pid is None else pid
        instance = random.getrandbits(32) if instance is None else instance
        self._prefix = (ip + struct.pack(">HI", pid & 0xFFFF, instance & 0xFFFFFFFF)).hex().upper()
        self._counter = 0
        self._month_start = 0.0
        self._next_month = 0.0

    def _months(self, now: float) -> None:
        t = datetime.fromtimestamp(now, timezone.utc)
        start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        self._month_start, self._next_month = start.timestamp(), nxt.timestamp()

    def create(self, now: float | None = None) -> str:
        """A new id at C{now} (seconds since the epoch)."""
        now = time.time() if now is None else now
        if now >= self._next_month or now < self._month_start:
            self._months(now)
        diff = round(now * 1000) - round(self._month_start * 1000)
        counter, self._counter = self._counter, (self._counter + 1) & 0xFFFF
        return self._prefix + struct.pack(">IH", diff & 0xFFFFFFFF, counter).hex().upper()


# -- routes ---------------------------------------------------------------------


class RouteError(ValueError):
    """A route body that cannot be read, naming why."""


@dataclasses.dataclass(frozen=True)
class QueueData:
    """C{QueueData}: one broker's queues of a topic."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclasses.dataclass(frozen=True)
class BrokerData:
    """C{BrokerData}: a broker name's addresses by brokerId (0: master)."""

    cluster: str
    broker_name: str
    addrs: Mapping[int, str]


@dataclasses.dataclass(frozen=True)
class TopicRoute:
    """C{TopicRouteData}, queue and broker data sorted by broker name."""

    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None

    def master_addr(self, broker_name: str) -> str | None:
        """C{findBrokerAddressInPublish}: the master's address, or None."""
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b.addrs.get(_MASTER_ID)
        return None

    def addresses(self) -> set[str]:
        """Every broker address the route names."""
        return {a for b in self.broker_datas for a in b.addrs.values()}


def _int(obj: Mapping[object, object], key: str, where: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RouteError(f"{where}: {key} is {value!r}, not an integer")
    return value


def _str(obj: Mapping[object, object], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise RouteError(f"{where}: {key} is {value!r}, not a string")
    return value


def parse_route(data: bytes) -> TopicRoute:
    """
    A GET_ROUTEINFO_BY_TOPIC body: standard JSON (a 4.9.4+ NameServer
    answering a 4.9.4+ client) or fastjson with unquoted integer keys in
    C{brokerAddrs} (older NameServers, or older clients).

    @raise RouteError: naming what is wrong.
    """
    try:
        doc = parse_fastjson(data.decode("utf-8"))
    except (UnicodeDecodeError, MetadataFormatError) as e:
        raise RouteError(f"the route does not parse: {e}") from None
    if not isinstance(doc, dict):
        raise RouteError("the route is not a JSON object")
    queues, brokers = doc.get("queueDatas") or [], doc.get("brokerDatas") or []
    if not isinstance(queues, list) or not isinstance(brokers, list):
        raise RouteError("the route's queueDatas or brokerDatas is not a list")
    qds = []
    for i, q in enumerate(queues):
        where = f"queueDatas[{i}]"
        if not isinstance(q, dict):
            raise RouteError(f"{where} is not an object")
        qds.append(
            QueueData(
                _str(q, "brokerName", where),
                _int(q, "readQueueNums", where),
                _int(q, "writeQueueNums", where),
                _int(q, "perm", where),
                _int(q, "topicSysFlag", where, 0),
            )
        )
    bds = []
    for i, b in enumerate(brokers):
        where = f"brokerDatas[{i}]"
        if not isinstance(b, dict):
            raise RouteError(f"{where} is not an object")
        raw = b.get("brokerAddrs") or {}
        if not isinstance(raw, dict):
            raise RouteError(f"{where}: brokerAddrs is not an object")
        addrs: dict[int, str] = {}
        for k, v in raw.items():
            try:
                broker_id = int(k)
            except ValueError:
                raise RouteError(f"{where}: brokerAddrs key {k!r} is not a brokerId") from None
            if not isinstance(v, str):
                raise RouteError(f"{where}: the address of brokerId {k} is {v!r}, not a string")
            addrs[broker_id] = v
        cluster = b.get("cluster")
        bds.append(
            BrokerData(cluster if isinstance(cluster, str) else "", _str(b, "brokerName", where), addrs)
        )
    conf = doc.get("orderTopicConf")
    return TopicRoute(
        tuple(sorted(qds, key=lambda q: q.broker_name)),
        tuple(sorted(bds, key=lambda b: b.broker_name)),
        conf if isinstance(conf, str) and conf else None,
    )


def publish_queues(topic: str, route: TopicRoute) -> list[MessageQueue]:
    """
    C{MQClientInstance.topicRouteData2TopicPublishInfo}: the queues a
    producer writes to.  With C{orderTopicConf} (C{"broker-a:4;broker-b:4"}),
    those; else every writable queue data's C{writeQueueNums} queues, of
    brokers (in name order) whose master (brokerId 0) the route names.
    """
    queues: list[MessageQueue] = []
    if route.order_topic_conf:
        for item in route.order_topic_conf.split(";"):
            name, _, nums = item.partition(":")
            if name and nums.isdigit():
                queues.extend(MessageQueue(topic, name, i) for i in range(int(nums)))
        return queues
    for qd in route.queue_datas:
        if not qd.perm & PERM_WRITE or route.master_addr(qd.broker_name) is None:
            continue
        queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return queues


def default_route_for(route: TopicRoute, queue_nums: int) -> TopicRoute:
    """
    What C{updateTopicRouteInfoFromNameServer(topic, true, producer)} makes
    of the C{TBW102} route for a topic the NameServers do not know: each
    broker's queues cut to C{min(defaultTopicQueueNums, readQueueNums)}.
    """
    return dataclasses.replace(
        route,
        queue_datas=tuple(
            dataclasses.replace(
                q,
                read_queue_nums=min(queue_nums, q.read_queue_nums),
                write_queue_nums=min(queue_nums, q.read_queue_nums),
            )
            for q in route.queue_datas
        ),
    )
