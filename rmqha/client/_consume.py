# -*- test-case-name: tests.test_client_consumer -*-
"""
What a RocketMQ 4.9.8 consumer puts on the wire and reads back, and the
bookkeeping it keeps, sans-IO (values in, values out, no I/O):

- the request and reply headers of PULL_MESSAGE (11), GET_MAX_OFFSET (30),
  SEARCH_OFFSET_BY_TIMESTAMP (29), GET_CONSUMER_LIST_BY_GROUP (38),
  UNREGISTER_CLIENT (35) and NOTIFY_CONSUMER_IDS_CHANGED (40), defined once
  for client and broker in L{rmqha.remoting.headers} and re-exported here;
  the offset headers (14, 15) are in L{rmqha.remoting.offsets};
- a pull reply as C{MQClientAPIImpl.processPullResponse} and
  C{PullAPIWrapper.processPullResult} read it: the status, the records
  (checked by the store's L{parse_record}, the one record decoder, or
  its compiled twin for the common records), bodies inflated, tags
  filtered again, C{MIN_OFFSET}/C{MAX_OFFSET} added (properties and ids
  decoded when first read);
- subscriptions (C{FilterAPI.buildSubscriptionData}) and the HEART_BEAT
  body (C{HeartbeatData}) as fastjson writes it;
- C{AllocateMessageQueueAveragely};
- L{ProcessQueue}: the messages of one queue pulled and not yet consumed,
  and the offset that may be committed (the smallest not yet consumed).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import functools
import ipaddress
import json
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Final

from rmqha._javahash import java_string_hash
from rmqha.client._codec import MessageQueue, TopicRoute
from rmqha.remoting._frames import (
    CustomHeaderError,
    Int32,
    RemotingCommand,
    header_from_ext_fields,
)
from rmqha.remoting.codes import ResponseCode
from rmqha.remoting.headers import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    GetConsumerListByGroupRequestHeader,
    GetMaxOffsetRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SearchOffsetRequestHeader,
    UnregisterClientRequestHeader,
)
from rmqha.remoting.metadata import PERM_READ
from rmqha.store import _record as _codec
from rmqha.store._record import (
    MESSAGE_MAGIC_V1,
    MIN_RECORD_SIZE,
    Blank,
    RecordError,
    SysFlag,
    body_length_at,
    decode_properties,
    format_host,
    parse_record,
    read_header,
    read_physical_offset,
)

__all__ = [
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "GetMaxOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "OffsetResponseHeader",
    "GetConsumerListByGroupRequestHeader",
    "UnregisterClientRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
    "PullStatus",
    "PullResult",
    "PullReplyError",
    "ReceivedMessage",
    "Subscription",
    "ConsumeFromWhere",
    "decode_messages",
    "pull_result",
    "subscribe_queues",
    "heartbeat_body",
    "consumer_id_list",
    "allocate_averagely",
    "tag_hash_code",
    "ProcessQueue",
    "retry_topic",
]

#: C{MixAll.MASTER_ID}.
MASTER_ID: Final = 0
#: C{MixAll.RETRY_GROUP_TOPIC_PREFIX}.
RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"
#: C{SubscriptionData.SUB_ALL}.
SUB_ALL: Final = "*"
#: C{MessageConst} property names the consumer reads or adds.
PROPERTY_MIN_OFFSET: Final = "MIN_OFFSET"
PROPERTY_MAX_OFFSET: Final = "MAX_OFFSET"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"


def _wire(name: str) -> dict[str, str]:
    return {"wire": name}


def retry_topic(group: str) -> str:
    """C{MixAll.getRetryTopic}: the group's retry topic."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def tag_hash_code(tag: str) -> int:
    """Java's C{String.hashCode} of a tag, as a signed int (C{codeSet})."""
    return java_string_hash(tag)


# -- subscriptions and heartbeats -------------------------------------------------


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts (C{ConsumeFromWhere})."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


@dataclasses.dataclass(frozen=True)
class Subscription:
    """
    C{SubscriptionData} of a TAG expression, as
    C{FilterAPI.buildSubscriptionData} builds it: C{"*"} (or empty) takes
    every message; C{"A || B"} the tags A and B.
    """

    topic: str
    expression: str
    tags: tuple[str, ...]
    sub_version: int

    @classmethod
    def build(cls, topic: str, expression: str | None, sub_version: int) -> Subscription:
        if expression is None or expression.strip() in ("", SUB_ALL):
            return cls(topic, SUB_ALL, (), sub_version)
        tags = tuple(dict.fromkeys(t.strip() for t in expression.split("||") if t.strip()))
        if not tags:
            raise ValueError(f"tag expression {expression!r} of topic {topic!r} names no tag")
        return cls(topic, expression, tags, sub_version)

    def matches(self, tags: str | None) -> bool:
        """C{processPullResult}'s filter: every message for C{*}, else its
        C{TAGS} must be one of ours."""
        return not self.tags or (tags is not None and tags in self.tags)

    def codes(self) -> list[int]:
        return [tag_hash_code(t) for t in self.tags]


def _java_int_set_order(values: Iterable[int]) -> list[int]:
    """A Java C{HashSet<Integer>}'s iteration order (by spread hash bucket)."""
    vs = list(dict.fromkeys(values))
    capacity = 16
    while len(vs) > capacity * 3 // 4:
        capacity *= 2

    def bucket(v: int) -> int:
        h = v & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(vs, key=bucket)


def _java_str_set_order(values: Iterable[str]) -> list[str]:
    from rmqha.remoting._frames import java_hashmap_order

    return java_hashmap_order(values)


def heartbeat_body(
    client_id: str,
    group: str,
    subscriptions: Sequence[Subscription],
    consume_from_where: ConsumeFromWhere,
    *,
    producer_groups: Sequence[str] = (),
) -> bytes:
    """
    The HEART_BEAT body, C{HeartbeatData} as fastjson writes it: keys
    sorted, enums by name, sets in Java C{HashSet} order (subscriptions by
    topic: Java's order there depends on object hash codes).
    """
    subs = [
        {
            "classFilterMode": False,
            "codeSet": _java_int_set_order(s.codes()),
            "expressionType": "TAG",
            "subString": s.expression,
            "subVersion": s.sub_version,
            "tagsSet": _java_str_set_order(s.tags),
            "topic": s.topic,
        }
        for s in sorted(subscriptions, key=lambda s: s.topic)
    ]
    data = {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "consumeFromWhere": consume_from_where.value,
                "consumeType": "CONSUME_PASSIVELY",
                "groupName": group,
                "messageModel": "CLUSTERING",
                "subscriptionDataSet": subs,
                "unitMode": False,
            }
        ],
        "producerDataSet": [{"groupName": g} for g in producer_groups],
    }
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def consumer_id_list(body: bytes) -> list[str]:
    """
    A GET_CONSUMER_LIST_BY_GROUP body, C{{"consumerIdList":[...]}}.

    @raise ValueError: naming what is wrong.
    """
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"the consumer list does not parse: {e}") from None
    ids = doc.get("consumerIdList") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("the consumer list has no list of strings 'consumerIdList'")
    return ids


def subscribe_queues(topic: str, route: TopicRoute) -> list[MessageQueue]:
    """
    C{MQClientInstance.topicRouteData2TopicSubscribeInfo}: the
    C{readQueueNums} queues of every readable queue data, sorted as
    C{MessageQueue.compareTo} sorts them.
    """
    queues = [
        MessageQueue(topic, qd.broker_name, i)
        for qd in route.queue_datas
        if qd.perm & PERM_READ
        for i in range(qd.read_queue_nums)
    ]
    return sorted(queues, key=lambda q: (q.topic, q.broker_name, q.queue_id))


def allocate_averagely(
    group: str, current: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
) -> list[MessageQueue]:
    """
    C{AllocateMessageQueueAveragely.allocate}: C{mq_all} and C{cid_all}
    sorted, each consumer a contiguous run of queues, the first
    C{len(mq_all) % len(cid_all)} consumers one more.  Nothing for a
    consumer not in C{cid_all}.
    """
    mqs = sorted(mq_all, key=lambda q: (q.topic, q.broker_name, q.queue_id))
    cids = sorted(cid_all)
    if current not in cids or not mqs:
        return []
    index = cids.index(current)
    mod = len(mqs) % len(cids)
    if len(mqs) <= len(cids):
        average = 1
    elif mod > 0 and index < mod:
        average = len(mqs) // len(cids) + 1
    else:
        average = len(mqs) // len(cids)
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, len(mqs) - start)
    return [mqs[(start + i) % len(mqs)] for i in range(count)]


# -- pull replies ----------------------------------------------------------------


class PullStatus(enum.Enum):
    """C{PullStatus}, from the reply code (C{processPullResponse})."""

    FOUND = ResponseCode.SUCCESS
    NO_NEW_MSG = ResponseCode.PULL_NOT_FOUND
    NO_MATCHED_MSG = ResponseCode.PULL_RETRY_IMMEDIATELY
    OFFSET_ILLEGAL = ResponseCode.PULL_OFFSET_MOVED


class PullReplyError(Exception):
    """
    A broker answered a consumer's request with a code the client does not
    take (C{MQBrokerException}); the text names the request, the broker
    and the code.

    @ivar code: the response code (-1: a reply the client cannot read).
    """

    def __init__(self, what: str, broker: str, code: int, remark: str | None) -> None:
        self.code = code
        self.remark = remark
        try:
            name = f"{ResponseCode(code).name} ({code})"
        except ValueError:
            name = f"code {code}"
        text = f"broker {broker} answered {what} with {name}"
        if remark:
            text += ": " + " ".join(remark.split())[:300]
        super().__init__(text)


@dataclasses.dataclass(frozen=True)
class ReceivedMessage:
    """
    One consumed message (C{MessageExt}), as the Java client hands it over.

    @ivar msg_id: the producer's C{UNIQ_KEY}, or L{offset_msg_id} when it
        has none (C{MessageClientExt.getMsgId}).
    @ivar offset_msg_id: store host and commit-log offset in hex.
    @ivar queue: the queue it was pulled from (C{brokerName} set).
    @ivar properties: as stored, plus C{MIN_OFFSET}/C{MAX_OFFSET} of the
        pull that brought it.

    A pulled message is made by L{decode_messages} with its properties,
    hosts and ids not yet decoded: each is decoded from the record's bytes
    (C{_lazy} in its C{__dict__}) the first time it is read, then kept.
    """

    topic: str
    body: bytes
    properties: Mapping[str, str]
    queue: MessageQueue
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    body_crc: int

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> str | None:
        return self.properties.get("KEYS")

    if not TYPE_CHECKING:  # (so that mypy still knows the attributes there are)

        def __getattr__(self, name: str) -> Any:
            # (Only for a field not decoded yet: found ones never get here.)
            lazy = self.__dict__.get("_lazy")
            if lazy is None or name not in _LAZY_FIELDS:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raw, born, store, extra = lazy
            value: Any
            if name == "properties":
                value = decode_properties(raw)
                if extra is not None:
                    value[PROPERTY_MIN_OFFSET], value[PROPERTY_MAX_OFFSET] = extra
            elif name == "born_host":
                value = _host_text(born)
            elif name == "store_host":
                value = _host_text(store)
            elif name == "offset_msg_id":
                value = (store + _OFFSET.pack(self.commit_log_offset)).hex().upper()
            else:  # msg_id
                value = decode_properties(raw).get("UNIQ_KEY") or self.offset_msg_id
            self.__dict__[name] = value
            return value


#: The fields of a pulled L{ReceivedMessage} decoded when first read.
_LAZY_FIELDS: Final = frozenset({"properties", "born_host", "store_host", "offset_msg_id", "msg_id"})
_OFFSET: Final = struct.Struct(">q")
_new_message = object.__new__
_set_dict = object.__setattr__


@functools.lru_cache(maxsize=256)
def _host_text(raw: bytes) -> str:
    """C{format_host} of a stored host: 4 (or 16) address bytes and the int32 port."""
    if len(raw) == 8:
        return f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}:{_PORT.unpack_from(raw, 4)[0]}"
    return format_host((str(ipaddress.IPv6Address(raw[:16])), _PORT.unpack_from(raw, 16)[0]))


_PORT: Final = struct.Struct(">i")
_INT: Final = _PORT
_SHORT: Final = struct.Struct(">h")
#: Where BORNHOST starts in a record.
_BORN_HOST_AT: Final = 48


def _decode_one(
    body: bytes, pos: int, queue: MessageQueue, extra: tuple[str, str] | None, tags: AbstractSet[str] | None
) -> tuple[ReceivedMessage | None, int]:
    """
    The record at C{body[pos:]} (C{MessageDecoder.decode}): the message
    (C{None} when its TAGS is not one of C{tags}) and where the next
    record starts.  The store's L{parse_record} checks it (body CRC not
    checked, as the Java client does not); a compressed body is inflated.
    C{_speedups.pull_decode} is this function compiled, for the common
    records.

    @raise RecordError: a record that does not decode, or a BLANK (naming
        its offset and why).
    @raise zlib.error: a compressed body that does not inflate.
    """
    end = len(body)
    if end - pos < MIN_RECORD_SIZE:
        raise RecordError(-1, f"{end - pos} bytes left at body position {pos}, fewer than any record's")
    total, _ = read_header(body, pos)
    if total <= 0 or pos + total > end:
        raise RecordError(-1, f"total size {total} at body position {pos} runs past the body's {end} bytes")
    record = parse_record(body, pos, pos + total, read_physical_offset(body, pos), check_crc=False)
    if isinstance(record, Blank):
        raise RecordError(record.offset, "a BLANK filler in a pull body")
    data = record.body
    if record.sysflag & SysFlag.COMPRESSED:
        data = zlib.decompress(data)
    if tags is not None and record.properties.get("TAGS") not in tags:
        return None, pos + total
    # (The fields parse_record has checked, as bytes: decoded when read.)
    born_at = pos + _BORN_HOST_AT
    born_size = 20 if record.sysflag & SysFlag.BORNHOST_V6 else 8
    store_at = born_at + born_size + 8
    store_size = 20 if record.sysflag & SysFlag.STOREHOST_V6 else 8
    p = pos + body_length_at(record.sysflag)
    p += 4 + _INT.unpack_from(body, p)[0]
    if record.magic == MESSAGE_MAGIC_V1:
        p += 1 + body[p]
    else:
        p += 2 + _SHORT.unpack_from(body, p)[0]
    props_start, props_end = p + 2, pos + total
    same = record.topic == queue.topic and record.queue_id == queue.queue_id
    message = _new_message(ReceivedMessage)
    _set_dict(
        message,
        "__dict__",
        {
            "topic": queue.topic if same else record.topic,
            "body": data,
            "queue": queue if same else MessageQueue(record.topic, queue.broker_name, record.queue_id),
            "queue_offset": record.queue_offset,
            "commit_log_offset": record.physical_offset,
            "flag": record.flag,
            "sys_flag": record.sysflag,
            "born_timestamp": record.born_timestamp,
            "store_timestamp": record.store_timestamp,
            "reconsume_times": record.reconsume_times,
            "body_crc": record.body_crc,
            "_lazy": (
                bytes(body[props_start:props_end]),
                bytes(body[born_at : born_at + born_size]),
                bytes(body[store_at : store_at + store_size]),
                extra,
            ),
        },
    )
    return message, pos + total


def decode_messages(
    body: bytes,
    queue: MessageQueue,
    *,
    extra: tuple[str, str] | None = None,
    tags: AbstractSet[str] | None = None,
) -> list[ReceivedMessage]:
    """
    C{MessageDecoder.decodes}: the records of a FOUND body, back to back
    (L{_decode_one}, most of them in one call of its compiled twin).  As
    in Java, a record that does not decode ends the list silently: the
    rest is dropped, and the queue's next pull starts at the reply's
    C{nextBeginOffset} anyway.

    @param extra: C{MIN_OFFSET} and C{MAX_OFFSET}, added to every
        message's properties.
    @param tags: only the messages whose TAGS is one of these.
    """
    out: list[ReceivedMessage] = []
    pos, end = 0, len(body)
    # (L{_decode_one} compiled, or None: RMQHA_PURE=1, or not built.)
    compiled = getattr(_codec._accel, "pull_decode", None)
    topic = queue.topic.encode("utf-8") if compiled is not None else b""
    while pos < end:
        if compiled is not None:
            pos = compiled(body, pos, ReceivedMessage, queue, topic, queue.queue_id, extra, tags, out)
            if pos >= end:
                break
        try:
            message, pos = _decode_one(body, pos, queue, extra, tags)
        except (RecordError, zlib.error):
            break
        if message is not None:
            out.append(message)
    return out


@dataclasses.dataclass(frozen=True)
class PullResult:
    """
    C{PullResult}: the status, where the next pull starts, the queue's
    bounds, the messages found (after the tag filter), and which broker
    the broker suggests for the next pull (0: the master).
    """

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[ReceivedMessage, ...]
    suggest_which_broker_id: int


def pull_result(
    response: RemotingCommand, queue: MessageQueue, subscription: Subscription | None, broker: str
) -> PullResult:
    """
    C{processPullResponse} then C{processPullResult}: the status of the
    code, the header, the records decoded, filtered again by tag, each
    given C{MIN_OFFSET}/C{MAX_OFFSET}.

    @raise PullReplyError: another code, or a header that does not read.
    """
    try:
        status = PullStatus(response.code)
    except ValueError:
        raise PullReplyError(f"PULL_MESSAGE for {queue}", broker, response.code, response.remark) from None
    try:
        header = header_from_ext_fields(PullMessageResponseHeader, response.ext_fields)
    except CustomHeaderError as e:
        raise PullReplyError(f"PULL_MESSAGE for {queue}", broker, -1, f"unreadable header: {e}") from None
    messages: tuple[ReceivedMessage, ...] = ()
    if status is PullStatus.FOUND:
        messages = tuple(
            decode_messages(
                response.body,
                queue,
                extra=(str(header.min_offset), str(header.max_offset)),
                tags=frozenset(subscription.tags) if subscription is not None and subscription.tags else None,
            )
        )
    return PullResult(
        status,
        header.next_begin_offset,
        header.min_offset,
        header.max_offset,
        messages,
        header.suggest_which_broker_id,
    )


# -- the process queue -------------------------------------------------------------


class ProcessQueue:
    """
    C{ProcessQueue}: the messages of one queue pulled and not yet
    consumed, by queue offset.  L{remove} answers the offset that may be
    committed once they are consumed: the smallest offset still here, or
    one past the largest ever put when none is -- never past a message
    not yet consumed, so a crash redelivers it (at least once).
    """

    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._sizes: dict[int, int] = {}
        self.msg_size = 0
        self.queue_offset_max = -1
        self.dropped = False

    @property
    def msg_count(self) -> int:
        return len(self._offsets)

    @property
    def max_span(self) -> int:
        """C{getMaxSpan}: last offset held minus the first (0: none)."""
        return self._offsets[-1] - self._offsets[0] if self._offsets else 0

    def put(self, messages: Iterable[ReceivedMessage]) -> None:
        for m in messages:
            if m.queue_offset in self._sizes:
                continue
            size = len(m.body)
            self._sizes[m.queue_offset] = size
            if not self._offsets or m.queue_offset > self._offsets[-1]:
                self._offsets.append(m.queue_offset)
            else:
                bisect.insort(self._offsets, m.queue_offset)
            self.msg_size += size
            self.queue_offset_max = max(self.queue_offset_max, m.queue_offset)

    def remove(self, messages: Iterable[ReceivedMessage]) -> int:
        """
        C{removeMessage}: take consumed messages out; the offset to
        commit, or -1 if the queue held nothing.
        """
        if not self._offsets:
            return -1
        for m in messages:
            size = self._sizes.pop(m.queue_offset, None)
            if size is None:
                continue
            i = bisect.bisect_left(self._offsets, m.queue_offset)
            del self._offsets[i]
            self.msg_size -= size
        return self._offsets[0] if self._offsets else self.queue_offset_max + 1
