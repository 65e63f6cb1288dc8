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
  (decoded by the store's L{parse_record}, the one record decoder),
  bodies inflated, tags filtered again, C{MIN_OFFSET}/C{MAX_OFFSET} added;
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
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

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
from rmqha.store._record import (
    MIN_RECORD_SIZE,
    Blank,
    RecordError,
    SysFlag,
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


def decode_messages(body: bytes, queue: MessageQueue) -> list[ReceivedMessage]:
    """
    C{MessageDecoder.decodes}: the records of a FOUND body, back to back,
    through the store's L{parse_record} (body CRC not checked, as the Java
    client does not).  Compressed bodies are inflated.  As in Java, a
    record that does not decode ends the list silently: the rest is
    dropped, and the queue's next pull starts at the reply's
    C{nextBeginOffset} anyway.
    """
    out: list[ReceivedMessage] = []
    pos, end = 0, len(body)
    while end - pos >= MIN_RECORD_SIZE:
        total, _ = read_header(body, pos)
        if total <= 0 or pos + total > end:
            break
        offset = read_physical_offset(body, pos)
        try:
            record = parse_record(body, pos, pos + total, offset, check_crc=False)
        except RecordError:
            break
        if isinstance(record, Blank):
            break
        data = record.body
        if record.sysflag & SysFlag.COMPRESSED:
            try:
                data = zlib.decompress(data)
            except zlib.error:
                break
        uniq = record.properties.get("UNIQ_KEY")
        out.append(
            ReceivedMessage(
                topic=record.topic,
                body=data,
                properties=record.properties,
                queue=MessageQueue(record.topic, queue.broker_name, record.queue_id),
                queue_offset=record.queue_offset,
                commit_log_offset=record.physical_offset,
                msg_id=uniq or record.msg_id,
                offset_msg_id=record.msg_id,
                flag=record.flag,
                sys_flag=record.sysflag,
                born_timestamp=record.born_timestamp,
                born_host=format_host(record.born_host),
                store_timestamp=record.store_timestamp,
                store_host=format_host(record.store_host),
                reconsume_times=record.reconsume_times,
                body_crc=record.body_crc,
            )
        )
        pos += total
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
        extra = {PROPERTY_MIN_OFFSET: str(header.min_offset), PROPERTY_MAX_OFFSET: str(header.max_offset)}
        messages = tuple(
            dataclasses.replace(m, properties={**m.properties, **extra})
            for m in decode_messages(response.body, queue)
            if subscription is None or subscription.matches(m.tags)
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
