"""
The custom headers of the consuming requests, one definition for the
client (L{rmqha.client}) and the broker (L{rmqha.remoting.pulls},
L{rmqha.remoting.consumers}): PULL_MESSAGE (11), the queue-offset
requests (29-32), GET_CONSUMER_LIST_BY_GROUP (38), UNREGISTER_CLIENT (35)
and NOTIFY_CONSUMER_IDS_CHANGED (40), as 4.9.8's
C{org.apache.rocketmq.common.protocol.header} classes write them.
The consumer-offset headers (14, 15) are in L{rmqha.remoting.offsets}.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from rmqha.remoting._frames import Int32

__all__ = [
    "FLAG_COMMIT_OFFSET",
    "FLAG_SUSPEND",
    "FLAG_SUBSCRIPTION",
    "FLAG_CLASS_FILTER",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "GetMaxOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "OffsetResponseHeader",
    "EarliestMsgStoretimeResponseHeader",
    "ViewMessageRequestHeader",
    "GetConsumerListByGroupRequestHeader",
    "UnregisterClientRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
]

#: C{PullSysFlag}.
FLAG_COMMIT_OFFSET: Final = 0x1
FLAG_SUSPEND: Final = 0x2
FLAG_SUBSCRIPTION: Final = 0x4
FLAG_CLASS_FILTER: Final = 0x8


def _wire(name: str) -> dict[str, str]:
    return {"wire": name}


@dataclasses.dataclass(frozen=True)
class PullMessageRequestHeader:
    """C{PullMessageRequestHeader} (and C{RpcRequestHeader}'s C{bname})."""

    consumer_group: str = dataclasses.field(metadata=_wire("consumerGroup"))
    topic: str
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    queue_offset: int = dataclasses.field(metadata=_wire("queueOffset"))
    max_msg_nums: Int32 = dataclasses.field(metadata=_wire("maxMsgNums"))
    sys_flag: Int32 = dataclasses.field(metadata=_wire("sysFlag"))
    commit_offset: int = dataclasses.field(metadata=_wire("commitOffset"))
    suspend_timeout_millis: int = dataclasses.field(metadata=_wire("suspendTimeoutMillis"))
    subscription: str | None = None
    sub_version: int = dataclasses.field(default=0, metadata=_wire("subVersion"))
    expression_type: str | None = dataclasses.field(default=None, metadata=_wire("expressionType"))
    bname: str | None = None


@dataclasses.dataclass(frozen=True)
class PullMessageResponseHeader:
    """C{PullMessageResponseHeader}: every field required (the Java client
    fails unboxing a missing one)."""

    suggest_which_broker_id: int = dataclasses.field(metadata=_wire("suggestWhichBrokerId"))
    next_begin_offset: int = dataclasses.field(metadata=_wire("nextBeginOffset"))
    min_offset: int = dataclasses.field(metadata=_wire("minOffset"))
    max_offset: int = dataclasses.field(metadata=_wire("maxOffset"))


@dataclasses.dataclass(frozen=True)
class GetMaxOffsetRequestHeader:
    """C{GetMaxOffsetRequestHeader} (also C{GetMinOffsetRequestHeader})."""

    topic: str
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    bname: str | None = None


@dataclasses.dataclass(frozen=True)
class SearchOffsetRequestHeader:
    """C{SearchOffsetRequestHeader}: C{timestamp} in ms."""

    topic: str
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    timestamp: int
    bname: str | None = None


@dataclasses.dataclass(frozen=True)
class OffsetResponseHeader:
    """C{GetMaxOffsetResponseHeader}, C{SearchOffsetResponseHeader}, ..."""

    offset: int


@dataclasses.dataclass(frozen=True)
class GetConsumerListByGroupRequestHeader:
    """C{GetConsumerListByGroupRequestHeader}."""

    consumer_group: str = dataclasses.field(metadata=_wire("consumerGroup"))
    bname: str | None = None


@dataclasses.dataclass(frozen=True)
class UnregisterClientRequestHeader:
    """C{UnregisterClientRequestHeader}: C{clientID} and the groups that go."""

    client_id: str = dataclasses.field(metadata=_wire("clientID"))
    producer_group: str | None = dataclasses.field(default=None, metadata=_wire("producerGroup"))
    consumer_group: str | None = dataclasses.field(default=None, metadata=_wire("consumerGroup"))


@dataclasses.dataclass(frozen=True)
class NotifyConsumerIdsChangedRequestHeader:
    """C{NotifyConsumerIdsChangedRequestHeader}: broker to client, oneway."""

    consumer_group: str = dataclasses.field(metadata=_wire("consumerGroup"))


@dataclasses.dataclass(frozen=True)
class EarliestMsgStoretimeResponseHeader:
    """C{GetEarliestMsgStoretimeResponseHeader}."""

    timestamp: int


@dataclasses.dataclass(frozen=True)
class ViewMessageRequestHeader:
    """C{ViewMessageRequestHeader}: a commit-log offset."""

    offset: int
