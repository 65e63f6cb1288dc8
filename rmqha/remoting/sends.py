# -*- test-case-name: tests.test_remoting_sends -*-
"""
Sends on a broker's remoting port: SEND_MESSAGE (10, long header names),
SEND_MESSAGE_V2 (310, short names) and SEND_BATCH_MESSAGE (320), as
RocketMQ 4.9.8's C{SendMessageProcessor} answers them (docs/remoting.md,
"Producing").

L{SendHandlers} checks a send as C{AbstractSendMessageProcessor.msgCheck}
does (topic name, forbidden topics, unknown topics created from
C{TBW102}, the queue id), builds the stored L{Message} (queue chosen,
properties with C{CLUSTER} added and C{WAIT} dropped, sysFlag, born
host), hands it to the broker's put path and maps the put's outcome to
the reply RocketMQ gives: C{SUCCESS} only for C{PUT_OK}, the three
"stored, but" codes for the three stored statuses, and every refusal
(not stored) to the response code a genuine client retries on
(L{STORED_CODES}, L{not_stored_reply}).
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from twisted.internet.interfaces import IAddress
from twisted.logger import Logger

from rmqha.ha.group import PutMessageResult, PutStatus
from rmqha.puts import NotMasterError, NotStoredError, master_refusal
from rmqha.remoting._frames import (
    CustomHeaderError,
    Int32,
    RemotingCommand,
    header_from_ext_fields,
    header_to_ext_fields,
    java_hashmap_order,
    make_response,
    response_to,
)
from rmqha.remoting.codes import RequestCode, ResponseCode, SerializeType
from rmqha.remoting.metadata import (
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    BrokerMetadata,
    MetadataError,
    MetadataFile,
    SubscriptionGroupConfig,
    TopicConfig,
    TopicFilterType,
)
from rmqha.remoting.protocol import Answer, format_peer
from rmqha.store import _record as _codec
from rmqha.store._batch import AppendResult
from rmqha.store._record import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Host,
    Message,
    MessageRejected,
    SysFlag,
    decode_properties,
    encode_properties,
)

if TYPE_CHECKING:
    from rmqha.broker import Broker

__all__ = [
    "SENDS",
    "MAX_BATCH_MESSAGES",
    "STORED_CODES",
    "SendMessageRequestHeader",
    "SendMessageRequestHeaderV2",
    "SendMessageResponseHeader",
    "SendHandlers",
    "read_send_header",
    "BatchError",
    "decode_batch",
    "encode_batch_item",
    "not_stored_reply",
]

#: The request codes served here.
SENDS: Final = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)

#: The most messages one SEND_BATCH_MESSAGE may carry (rmqha's bound: each
#: becomes a record and an object in memory; RocketMQ bounds only the bytes).
MAX_BATCH_MESSAGES: Final = 8192

#: C{MessageConst}: the reply's extra fields, and properties a send reads.
MSG_REGION: Final = "MSG_REGION"
TRACE_ON: Final = "TRACE_ON"
PROPERTY_CLUSTER: Final = "CLUSTER"
PROPERTY_WAIT: Final = "WAIT"
PROPERTY_DELAY: Final = "DELAY"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
#: C{BrokerConfig.regionId} and C{traceOn} defaults.
DEFAULT_REGION: Final = "DefaultRegion"

AUTO_CREATE_TOPIC: Final = "TBW102"
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
#: C{MQVersion.Version.V3_4_9}: from this version on a send's
#: C{maxReconsumeTimes} overrides the group's C{retryMaxTimes}.
_V3_4_9: Final = 121
#: C{TopicValidator}'s topics a client may not send to.
NOT_ALLOWED_SEND_TOPICS: Final = frozenset(
    {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
_TOPIC_CHARS = frozenset("%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_ITEM_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN
_SHORT = struct.Struct(">h")


#: What a send's reply needs of its request: the opaque and serialize type.
_ReplyTo = tuple[int, SerializeType]


def _wire(name: str) -> dict[str, str]:
    return {"wire": name}


@dataclasses.dataclass(frozen=True)
class SendMessageRequestHeader:
    """
    C{SendMessageRequestHeader} (code 10, long names); 310 and 320's
    L{SendMessageRequestHeaderV2} is read into one.
    """

    producer_group: str = dataclasses.field(metadata=_wire("producerGroup"))
    topic: str
    default_topic: str = dataclasses.field(metadata=_wire("defaultTopic"))
    default_topic_queue_nums: Int32 = dataclasses.field(metadata=_wire("defaultTopicQueueNums"))
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    sys_flag: Int32 = dataclasses.field(metadata=_wire("sysFlag"))
    born_timestamp: int = dataclasses.field(metadata=_wire("bornTimestamp"))
    flag: Int32
    properties: str | None = None
    reconsume_times: Int32 | None = dataclasses.field(default=None, metadata=_wire("reconsumeTimes"))
    unit_mode: bool = dataclasses.field(default=False, metadata=_wire("unitMode"))
    batch: bool = False
    max_reconsume_times: Int32 | None = dataclasses.field(default=None, metadata=_wire("maxReconsumeTimes"))
    bname: str | None = None


@dataclasses.dataclass(frozen=True)
class SendMessageRequestHeaderV2:
    """
    C{SendMessageRequestHeaderV2} (codes 310 and 320): the same fields
    under one-letter names, C{a} to C{n}.
    """

    a: str
    b: str
    c: str
    d: Int32
    e: Int32
    f: Int32
    g: int
    h: Int32
    i: str | None = None
    j: Int32 | None = None
    k: bool = False
    l: Int32 | None = None  # noqa: E741 (RocketMQ's name)
    m: bool = False
    n: str | None = None

    def to_v1(self) -> SendMessageRequestHeader:
        """C{createSendMessageRequestHeaderV1}."""
        return SendMessageRequestHeader(
            producer_group=self.a,
            topic=self.b,
            default_topic=self.c,
            default_topic_queue_nums=self.d,
            queue_id=self.e,
            sys_flag=self.f,
            born_timestamp=self.g,
            flag=self.h,
            properties=self.i,
            reconsume_times=self.j,
            unit_mode=self.k,
            batch=self.m,
            max_reconsume_times=self.l,
            bname=self.n,
        )


_INT32_MAX: Final = (1 << 31) - 1
_INT64_MAX: Final = (1 << 63) - 1


def _plain(text: str | None, most: int) -> bool:
    # (A value header_from_ext_fields reads as int(text), in range.)
    return text is not None and text.isascii() and text.isdigit() and int(text) <= most


_SendFields = tuple[
    str, str, str, int, int, int, int, int, "str | None", "int | None", bool, bool, "int | None", "str | None"
]


def send_header_v2(ext: Mapping[str, str]) -> _SendFields | None:
    """
    A V2 send header's fields, in L{SendMessageRequestHeader}'s order, when
    C{a} to C{c} are there and its numbers are all plain digits in range
    (what every client sends); C{None} for any other (then
    L{header_from_ext_fields} reads it, or says what is wrong).  The
    compiled C{send_header_v2} is its twin: the same answer for a C{dict}
    of C{str} whose C{k} and C{m} are ASCII, C{None} for anything else.
    """
    get = ext.get
    a, b, c, d, e, f, g, h = get("a"), get("b"), get("c"), get("d"), get("e"), get("f"), get("g"), get("h")
    j, k, l, m = get("j"), get("k"), get("l"), get("m")  # noqa: E741
    if not (
        a is not None
        and b is not None
        and c is not None
        and _plain(d, _INT32_MAX)
        and _plain(e, _INT32_MAX)
        and _plain(f, _INT32_MAX)
        and _plain(g, _INT64_MAX)
        and _plain(h, _INT32_MAX)
        and (j is None or _plain(j, _INT32_MAX))
        and (l is None or _plain(l, _INT32_MAX))
    ):
        return None
    assert d is not None and e is not None and f is not None and g is not None and h is not None
    return (
        a,
        b,
        c,
        int(d),
        int(e),
        int(f),
        int(g),
        int(h),
        get("i"),
        None if j is None else int(j),
        k is not None and k.lower() == "true",
        m is not None and m.lower() == "true",
        None if l is None else int(l),
        get("n"),
    )


def read_send_header(code: int, ext: Mapping[str, str] | None) -> SendMessageRequestHeader:
    """
    The send header of a request of C{code}: L{SendMessageRequestHeader}
    for 10, L{SendMessageRequestHeaderV2} (then C{to_v1}) for 310 and 320,
    read by L{header_from_ext_fields}.  A V2 header whose numbers are all
    plain digits in range (what every client sends) is read here in one
    go, to the same header.

    @raise CustomHeaderError: as L{header_from_ext_fields}.
    """
    if code == RequestCode.SEND_MESSAGE:
        return header_from_ext_fields(SendMessageRequestHeader, ext)
    if ext is not None:
        accel = _codec._accel  # the compiled codec, or None (RMQHA_PURE=1)
        fields = send_header_v2(ext) if accel is None else accel.send_header_v2(ext)
        if fields is not None:
            # (SendMessageRequestHeader(*fields) without the 14 frozen
            # setattrs of its __init__: the same header, a third the time.)
            header = _new_header(SendMessageRequestHeader)
            header.__dict__.update(zip(_SEND_FIELD_NAMES, fields))
            return header
    return header_from_ext_fields(SendMessageRequestHeaderV2, ext).to_v1()


_SEND_FIELD_NAMES: Final = tuple(f.name for f in dataclasses.fields(SendMessageRequestHeader))
_new_header = object.__new__


@dataclasses.dataclass(frozen=True)
class SendMessageResponseHeader:
    """
    C{SendMessageResponseHeader}: the first message's id (a batch's ids
    comma-joined), its queue and consume-queue offset.
    """

    msg_id: str = dataclasses.field(metadata=_wire("msgId"))
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    queue_offset: int = dataclasses.field(metadata=_wire("queueOffset"))
    transaction_id: str | None = dataclasses.field(default=None, metadata=_wire("transactionId"))


#: How a stored put's status is answered (C{handlePutMessageResult}): the
#: four statuses RocketMQ's client takes for "stored"; the message is
#: stored in each case, but only C{PUT_OK} is C{SUCCESS}.
STORED_CODES: Final[Mapping[PutStatus, int]] = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
}

_SERVICE_NOT_AVAILABLE = "service not available now: "


def not_stored_reply(error: NotStoredError) -> tuple[int, str]:
    """
    The response code and remark for a put the put path refused (nothing
    stored): each a code RocketMQ's client retries on (C{DefaultMQProducer}'s
    C{retryResponseCodes}: 1, 14, 16, 17, 204, 205).

    - not the master (a slave, a fenced failover master) → 14
      SERVICE_NOT_AVAILABLE, as a genuine slave's store answers;
    - the disk full → 14, as 4.9.8's store answers when it is not writeable;
    - too few in-sync replicas → 1 SYSTEM_ERROR, as RocketMQ 5 answers
      C{IN_SYNC_REPLICAS_NOT_ENOUGH};
    - no new segment, another I/O error → 1, as C{CREATE_MAPEDFILE_FAILED}
      and C{UNKNOWN_ERROR}.
    """
    text = str(error)
    if isinstance(error, NotMasterError) or error.status is PutStatus.SERVICE_NOT_AVAILABLE:
        return ResponseCode.SERVICE_NOT_AVAILABLE, _SERVICE_NOT_AVAILABLE + text
    if error.disk_full:
        return ResponseCode.SERVICE_NOT_AVAILABLE, f"{_SERVICE_NOT_AVAILABLE}the broker's disk is full: {text}"
    if error.status is PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH:
        return ResponseCode.SYSTEM_ERROR, f"in-sync replicas not enough: {text}; nothing was stored"
    if error.status is PutStatus.CREATE_MAPEDFILE_FAILED:
        return ResponseCode.SYSTEM_ERROR, f"create mapped file failed, server is busy or broken: {text}"
    return ResponseCode.SYSTEM_ERROR, f"{error.status.value}: {text}"


class BatchError(ValueError):
    """A SEND_BATCH_MESSAGE body that is not a run of encoded messages."""


def encode_batch_item(flag: int, body: bytes, properties: bytes) -> bytes:
    """
    C{MessageDecoder.encodeMessage}: one message of a batch body (the
    inverse of L{decode_batch}, for tests and clients).
    """
    size = 20 + len(body) + 2 + len(properties)
    return _ITEM_HEAD.pack(size, 0, 0, flag, len(body)) + body + _SHORT.pack(len(properties)) + properties


def decode_batch(body: bytes, max_messages: int = MAX_BATCH_MESSAGES) -> list[tuple[int, bytes, bytes]]:
    """
    A batch body as C{MessageDecoder.decodeMessages} reads it: a run of
    C{encodeMessage} items (int32 size, int32 0, int32 0, int32 flag,
    int32 body length + body, int16 properties length + properties), as
    C{(flag, body, properties bytes)}.  The size, magic and CRC fields are
    not read, as in Java.

    @raise BatchError: an item reaches past the body or has a negative
        length, the body is empty, or it holds more than C{max_messages}
        items; the text names the item and the field.
    """
    items: list[tuple[int, bytes, bytes]] = []
    view = memoryview(body)
    end = len(body)
    pos = 0
    if not end:
        raise BatchError("the batch body is empty")
    while pos < end:
        n = len(items)
        if n >= max_messages:
            raise BatchError(f"the batch holds more than {max_messages} messages (the limit)")
        if end - pos < _ITEM_HEAD.size:
            raise BatchError(f"message {n} of the batch: {end - pos} bytes left, less than its 20-byte head")
        _, _, _, flag, body_len = _ITEM_HEAD.unpack_from(view, pos)
        pos += _ITEM_HEAD.size
        if body_len < 0 or body_len > end - pos:
            raise BatchError(f"message {n} of the batch: body length {body_len} reaches past the batch")
        item_body = bytes(view[pos : pos + body_len])
        pos += body_len
        if end - pos < 2:
            raise BatchError(f"message {n} of the batch: no properties length after the body")
        (props_len,) = _SHORT.unpack_from(view, pos)
        pos += 2
        if props_len < 0 or props_len > end - pos:
            raise BatchError(f"message {n} of the batch: properties length {props_len} reaches past the batch")
        items.append((flag, item_body, bytes(view[pos : pos + props_len])))
        pos += props_len
    return items


def _java_map_order(properties: dict[str, str]) -> dict[str, str]:
    """
    C{properties} in the order the Java C{HashMap} holding them iterates
    (what C{messageProperties2String} writes).
    """
    return {k: properties[k] for k in java_hashmap_order(properties)}


def _born_host(peer: IAddress | None) -> Host | None:
    host = getattr(peer, "host", None)
    port = getattr(peer, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return host.split("%", 1)[0], port
    return None


class _Refused(Exception):
    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class SendHandlers:
    """
    The send codes of one broker's remoting port (L{handlers}).

    @ivar max_batch_messages: the most messages a batch may hold.
    @ivar max_message_size: the largest body, and the largest batch body
        (C{maxMessageSize}).
    """

    _log = Logger(namespace="rmqha.remoting.sends")

    def __init__(
        self,
        broker: Broker,
        *,
        rng: random.Random | None = None,
        max_batch_messages: int = MAX_BATCH_MESSAGES,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        region: str = DEFAULT_REGION,
        trace_on: bool = True,
    ) -> None:
        self._broker = broker
        self._random = rng or random.Random()
        self.max_batch_messages = max_batch_messages
        self.max_message_size = max_message_size
        self._reply_ext = {MSG_REGION: region, TRACE_ON: "true" if trace_on else "false"}
        #: Topic names that passed L{_check_topic_name}.
        self._valid_topics: set[str] = set()

    def handlers(self) -> Mapping[int, Callable[[RemotingCommand, IAddress | None], Answer]]:
        return {code: self.send for code in SENDS}

    @property
    def _metadata(self) -> BrokerMetadata:
        return self._broker.metadata

    # -- the request -----------------------------------------------------------

    def send(self, request: RemotingCommand, peer: IAddress | None) -> Answer:
        """
        Codes 10, 310 and 320: the reply once the put path has decided
        (a Deferred), or at once for a refusal.
        """
        try:
            header = read_send_header(request.code, request.ext_fields)
        except CustomHeaderError as e:
            # (Java's decodeCommandCustomHeader throws: SYSTEM_ERROR, no ext.)
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        # The reply needs only the request's opaque and serialize type: the
        # body is not held while the put waits for its verdict.
        slim = (request.opaque, request.serialize_type)
        try:
            config = self._check(header, request, peer)
            if header.batch:
                return self._send_batch(slim, header, config, request.body, peer)
            return self._send_one(slim, header, config, request, peer)
        except _Refused as e:
            return self._reply(slim, e.code, e.remark)

    def _reply(
        self, slim: _ReplyTo, code: int, remark: str | None = None, header: SendMessageResponseHeader | None = None
    ) -> RemotingCommand:
        ext = dict(self._reply_ext)
        if header is not None:
            ext.update(header_to_ext_fields(header))
        return response_to(slim[0], slim[1], code, remark, ext)

    def _check(self, header: SendMessageRequestHeader, request: RemotingCommand, peer: IAddress | None) -> TopicConfig:
        """
        C{msgCheck}: the topic's config (created if need be), or L{_Refused}.
        """
        topic = header.topic
        if topic not in self._valid_topics:
            self._check_topic_name(topic)
            if len(self._valid_topics) >= 4096:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        # A slave refuses before anything changes (a genuine slave would
        # create the topic first, then its store refuses the put).
        refusal = master_refusal(self._broker.role_service)
        if refusal is not None:
            raise _Refused(ResponseCode.SERVICE_NOT_AVAILABLE, _SERVICE_NOT_AVAILABLE + refusal)
        metadata = self._metadata
        config = metadata.topic(topic)
        if config is None:
            config = self._create_topic(header, peer)
        valid = max(config.write_queue_nums, config.read_queue_nums)
        if header.queue_id >= valid:
            raise _Refused(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{header.queue_id}] is illegal, topic {topic} has {valid} queues, "
                f"Producer: {format_peer(peer)}",
            )
        return config

    @staticmethod
    def _check_topic_name(topic: str) -> None:
        """
        C{msgCheck}'s checks of the topic's name alone (their outcome is
        kept per name, L{_valid_topics}), or L{_Refused}.
        """
        if not topic.strip():
            raise _Refused(ResponseCode.SYSTEM_ERROR, "The specified topic is blank.")
        if not set(topic) <= _TOPIC_CHARS:
            raise _Refused(
                ResponseCode.SYSTEM_ERROR,
                "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$",
            )
        if len(topic) > 127:
            raise _Refused(ResponseCode.SYSTEM_ERROR, "The specified topic is longer than topic max length.")
        if topic in NOT_ALLOWED_SEND_TOPICS:
            raise _Refused(ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")

    def _create_topic(self, header: SendMessageRequestHeader, peer: IAddress | None) -> TopicConfig:
        """
        C{createTopicInSendMessageMethod}: an unknown topic from its
        default topic (C{TBW102}) when that one has INHERIT (with
        C{autoCreateTopicEnable} off, C{TBW102} counts as read-write only),
        C{min(defaultTopicQueueNums, its writeQueueNums)} queues; a
        C{%RETRY%} topic gets one queue; otherwise TOPIC_NOT_EXIST.
        Written to C{topics.json} with a new data version, and registered
        with the NameServers at once.
        """
        topic = header.topic
        metadata = self._metadata
        sys_flag = 0
        if header.unit_mode:
            sys_flag = 2 if topic.startswith(RETRY_PREFIX) else 1  # TopicSysFlag unit / unit sub
        config: TopicConfig | None = None
        default = metadata.topic(header.default_topic)
        if default is not None:
            perm = default.perm
            if header.default_topic == AUTO_CREATE_TOPIC and not self._broker.settings.auto_create_topic_enable:
                perm = PERM_READ | PERM_WRITE
            if perm & PERM_INHERIT:
                queues = max(0, min(header.default_topic_queue_nums, default.write_queue_nums))
                config = TopicConfig(
                    topic,
                    queues,
                    queues,
                    perm & ~PERM_INHERIT,
                    topic_filter_type=default.topic_filter_type,
                    topic_sys_flag=sys_flag,
                )
        if config is None and topic.startswith(RETRY_PREFIX):
            config = TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE, topic_sys_flag=sys_flag)
        if config is None:
            raise _Refused(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        self._add_topic(config, f"from {header.default_topic} for {format_peer(peer)}")
        return config

    def _add_topic(self, config: TopicConfig, why: str) -> None:
        metadata = self._metadata
        try:
            metadata.update_topic(config, persist=False)
        except MetadataError as e:
            raise _Refused(ResponseCode.SYSTEM_ERROR, str(e)) from None
        self._log.info(
            "topic {topic} created {why} ({queues} queues, perm {perm})",
            topic=config.topic_name,
            why=why,
            queues=config.write_queue_nums,
            perm=config.perm,
        )
        try:
            metadata.persist(MetadataFile.TOPICS)
        except OSError as e:
            # (The topic is in memory; the next change or the stop writes it.)
            self._log.error("cannot write {path}: {error}", path=metadata.path(MetadataFile.TOPICS), error=e)
        # (The broker's topic listener registers the new table with the
        # NameServers on the next turn: docs/remoting.md, "NameServers".)

    def _group(self, name: str) -> SubscriptionGroupConfig:
        """
        C{findSubscriptionGroupConfig} with C{autoCreateSubscriptionGroup}
        (4.9.8's default): an unknown group is created with the defaults.
        """
        metadata = self._metadata
        group = metadata.group(name)
        if group is None:
            group = SubscriptionGroupConfig(name)
            try:
                metadata.update_group(group, persist=False)
                metadata.persist(MetadataFile.SUBSCRIPTION_GROUPS)
            except MetadataError as e:
                raise _Refused(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {name}: {e}") from None
            except OSError as e:
                self._log.error("cannot write {path}: {error}", path=metadata.path(MetadataFile.SUBSCRIPTION_GROUPS), error=e)
        return group

    # -- one message -----------------------------------------------------------

    def _send_one(
        self,
        slim: _ReplyTo,
        header: SendMessageRequestHeader,
        config: TopicConfig,
        request: RemotingCommand,
        peer: IAddress | None,
    ) -> Answer:
        queue_id = header.queue_id
        if queue_id < 0:
            queue_id = self._random_queue(config)
        topic, stored_queue = header.topic, queue_id
        reconsume = header.reconsume_times or 0
        if topic.startswith(RETRY_PREFIX):
            # handleRetryAndDLQ: past maxReconsumeTimes, to the group's DLQ.
            group_name = topic[len(RETRY_PREFIX) :]
            group = self._group(group_name)
            most = group.retry_max_times
            if request.version >= _V3_4_9 and header.max_reconsume_times is not None:
                most = header.max_reconsume_times
            if reconsume >= most:
                topic, stored_queue = DLQ_PREFIX + group_name, 0
                dlq = self._metadata.topic(topic)
                if dlq is None:
                    dlq = TopicConfig(topic, 1, 1, PERM_READ | PERM_WRITE)
                    self._add_topic(dlq, f"as the dead-letter topic of {group_name}")
                config = dlq
        sys_flag = header.sys_flag
        if config.topic_filter_type == TopicFilterType.MULTI_TAG.value:
            sys_flag |= SysFlag.MULTI_TAGS
        properties = decode_properties(header.properties or "")
        if properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
            raise _Refused(
                ResponseCode.NO_PERMISSION,
                "sending transaction message is forbidden: rmqha serves no transactions",
            )
        self._refuse_delay(properties)
        properties[PROPERTY_CLUSTER] = self._broker.settings.cluster
        stored = _java_map_order(properties)
        stored.pop(PROPERTY_WAIT, None)
        message = Message(
            topic=topic,
            body=request.body,
            queue_id=stored_queue,
            flag=header.flag,
            properties=stored,
            sysflag=sys_flag,
            born_timestamp=header.born_timestamp,
            born_host=_born_host(peer),
            reconsume_times=reconsume,
        )
        try:
            waiting = self._broker.put(message)
        except NotStoredError as e:
            code, remark = not_stored_reply(e)
            raise _Refused(code, remark) from None
        except MessageRejected as e:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(e)) from None
        return waiting.addCallback(self._stored, slim, queue_id)

    def _stored(self, result: PutMessageResult, slim: _ReplyTo, queue_id: int) -> RemotingCommand:
        return self._verdict(slim, result.status, [result.append], queue_id)

    def _verdict(
        self, slim: _ReplyTo, status: PutStatus, appends: Sequence[AppendResult], queue_id: int
    ) -> RemotingCommand:
        code = STORED_CODES.get(status)
        if code is None:
            # Stored, but the put path says not enough copies hold it (an
            # IN_SYNC_REPLICAS_NOT_ENOUGH after the store): a refusal the
            # client retries, maybe duplicating the message.
            first = appends[0]
            return self._reply(
                slim,
                ResponseCode.SYSTEM_ERROR,
                f"{status.value}: stored at offset {first.offset} but not held by enough replicas; "
                "a retry may store it twice",
            )
        # (header_to_ext_fields of a SendMessageResponseHeader, written out:
        # queue_id is an Int32 already, from the request or _random_queue.)
        ext = dict(self._reply_ext)
        ext["msgId"] = appends[0].msg_id if len(appends) == 1 else ",".join(a.msg_id for a in appends)
        ext["queueId"] = str(queue_id)
        ext["queueOffset"] = str(appends[0].queue_offset)
        return response_to(slim[0], slim[1], code, None, ext)

    def _random_queue(self, config: TopicConfig) -> int:
        if config.write_queue_nums <= 0:
            raise _Refused(ResponseCode.SYSTEM_ERROR, f"topic {config.topic_name} has no write queues")
        # (ThreadLocalRandom.nextInt(99999999) % writeQueueNums)
        return self._random.randrange(99999999) % config.write_queue_nums

    @staticmethod
    def _refuse_delay(properties: Mapping[str, str]) -> None:
        delay = properties.get(PROPERTY_DELAY)
        if delay is None:
            return
        try:
            level = int(delay)
        except ValueError:
            return  # (Java's getDelayTimeLevel would throw; no delay here)
        if level > 0:
            raise _Refused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"delayed messages (DELAY={level}) are not served by rmqha: it has no schedule service",
            )

    # -- a batch ---------------------------------------------------------------

    def _send_batch(
        self,
        slim: _ReplyTo,
        header: SendMessageRequestHeader,
        config: TopicConfig,
        body: bytes,
        peer: IAddress | None,
    ) -> Answer:
        queue_id = header.queue_id
        if queue_id < 0:
            queue_id = self._random_queue(config)
        if len(body) > self.max_message_size:
            raise _Refused(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the batch body is {len(body)} bytes; maxMessageSize is {self.max_message_size}",
            )
        sys_flag = header.sys_flag
        if config.topic_filter_type == TopicFilterType.MULTI_TAG.value:
            sys_flag |= SysFlag.MULTI_TAGS
        if sys_flag & SysFlag.TRANSACTION_MASK:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be a transaction (sysFlag)")
        batch_properties = decode_properties(header.properties or "")
        try:
            self._refuse_delay(batch_properties)
        except _Refused:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be delayed (DELAY)") from None
        batch_properties[PROPERTY_CLUSTER] = self._broker.settings.cluster
        try:
            batch_bytes = encode_properties(_java_map_order(batch_properties))
        except MessageRejected as e:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, f"the batch's properties: {e}") from None
        try:
            items = decode_batch(body, self.max_batch_messages)
        except BatchError as e:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(e)) from None
        born_host = _born_host(peer)
        reconsume = header.reconsume_times or 0
        messages = []
        for flag, item_body, raw in items:
            # The item's properties as sent, then the batch's (CommitLog's
            # batch encoder: a \x02 between them unless the item ends so).
            if raw and batch_bytes and not raw.endswith(b"\x02"):
                raw += b"\x02"
            messages.append(
                Message(
                    topic=header.topic,
                    body=item_body,
                    queue_id=queue_id,
                    flag=flag,
                    properties=decode_properties(raw + batch_bytes),
                    sysflag=sys_flag,
                    born_timestamp=header.born_timestamp,
                    born_host=born_host,
                    reconsume_times=reconsume,
                )
            )
        try:
            waiting = self._broker.put_batch(messages)
        except NotStoredError as e:
            code, remark = not_stored_reply(e)
            raise _Refused(code, remark) from None
        except MessageRejected as e:
            raise _Refused(ResponseCode.MESSAGE_ILLEGAL, str(e)) from None
        return waiting.addCallback(lambda done: self._verdict(slim, done[0], done[1], queue_id))
