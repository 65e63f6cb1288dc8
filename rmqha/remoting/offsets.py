# -*- test-case-name: tests.test_remoting_offsets -*-
"""
Consumer offsets on a broker's remoting port: QUERY_CONSUMER_OFFSET (14)
and UPDATE_CONSUMER_OFFSET (15), as 4.9.8's C{ConsumerManageProcessor}
answers them (docs/remoting.md, "Consumer offsets").

Both go to the broker's L{BrokerMetadata} (C{config/consumerOffset.json},
written by its L{MetadataFlusher} every 5 s), on a master and on a slave
alike.  A query for an offset nobody committed is answered 0 or
QUERY_NOT_FOUND by RocketMQ's rule, which needs the consume queue's head
(L{consume_queue_head}, from the store's consume queues).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from twisted.internet.interfaces import IAddress

from rmqha.remoting._frames import (
    CustomHeaderError,
    Int32,
    RemotingCommand,
    header_from_ext_fields,
    header_to_ext_fields,
    make_response,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.metadata import BrokerMetadata, MetadataError
from rmqha.remoting.protocol import Answer
from rmqha.store.consumequeue import ConsumeQueues

__all__ = [
    "SERVED",
    "NOT_FOUND_REMARK",
    "QueryConsumerOffsetRequestHeader",
    "QueryConsumerOffsetResponseHeader",
    "UpdateConsumerOffsetRequestHeader",
    "QueueHead",
    "LogBounds",
    "ConsumerOffsets",
    "consume_queue_head",
    "in_memory_bytes",
]

#: The request codes L{ConsumerOffsets} answers.
SERVED: Final = (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET)

#: 4.9.8's remark on a QUERY_NOT_FOUND answer (C{ConsumerManageProcessor}).
NOT_FOUND_REMARK: Final = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"

#: C{MessageStoreConfig.accessMessageInMemoryMaxRatio}: the newest 40 % of
#: physical memory's worth of the commit log counts as "in memory".
ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO: Final = 40


def _wire(name: str) -> dict[str, str]:
    return {"wire": name}


@dataclasses.dataclass(frozen=True)
class QueryConsumerOffsetRequestHeader:
    """
    C{QueryConsumerOffsetRequestHeader} (and C{RpcRequestHeader}'s
    optional C{bname}).
    """

    consumer_group: str = dataclasses.field(metadata=_wire("consumerGroup"))
    topic: str
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    bname: str | None = None


@dataclasses.dataclass(frozen=True)
class QueryConsumerOffsetResponseHeader:
    """C{QueryConsumerOffsetResponseHeader}: the offset found."""

    offset: int


@dataclasses.dataclass(frozen=True)
class UpdateConsumerOffsetRequestHeader:
    """
    C{UpdateConsumerOffsetRequestHeader} (and C{RpcRequestHeader}'s
    optional C{bname}).
    """

    consumer_group: str = dataclasses.field(metadata=_wire("consumerGroup"))
    topic: str
    queue_id: Int32 = dataclasses.field(metadata=_wire("queueId"))
    commit_offset: int = dataclasses.field(metadata=_wire("commitOffset"))
    bname: str | None = None


class LogBounds(Protocol):
    """
    What L{consume_queue_head} reads of a commit log (an
    L{rmqha.store.commitlog.CommitLog}): its bounds and its consume queues.
    """

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def consume_queues(self) -> ConsumeQueues | None: ...


@dataclasses.dataclass(frozen=True)
class QueueHead:
    """
    The head of one consume queue, as RocketMQ's rule for a group with no
    committed offset reads it.

    @ivar min_offset: C{getMinOffsetInQueue}: the queue offset of its
        oldest unit still in the log (0 for a queue with none yet).
    @ivar first_unit_at: the commit-log offset of the queue's unit 0
        (C{checkInDiskByConsumeOffset(topic, queueId, 0)} reads it), or
        C{None} when the queue has no unit 0.
    """

    min_offset: int
    first_unit_at: int | None


def consume_queue_head(commitlog: LogBounds | None, topic: str, queue_id: int) -> QueueHead:
    """
    The consume queue's head of (C{topic}, C{queue_id}), read from the
    store's consume queues as 4.9.8's C{DefaultMessageStore} reads it:
    C{getMinOffsetInQueue}, and unit 0's commit-log offset
    (C{getIndexBuffer(0)}).  No log, a log without consume queues, or no
    such queue: C{(0, None)}, the empty queue 4.9.8's C{findConsumeQueue}
    makes.
    """
    queues = commitlog.consume_queues if commitlog is not None else None
    if queues is None or queues.queue(topic, queue_id) is None:
        return QueueHead(0, None)
    units = queues.units(topic, queue_id, 0, 1)
    return QueueHead(queues.min_offset(topic, queue_id), units[0].offset if units else None)


def in_memory_bytes() -> int:
    """
    How much of the newest commit log counts as "in memory" for
    C{checkInDiskByCommitOffset}: 40 % of the machine's physical memory
    (C{StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE} times
    C{accessMessageInMemoryMaxRatio}).
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 24 << 30  # (StoreUtil's fallback when it cannot ask: 24 GiB)
    return total * ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO // 100


class ConsumerOffsets:
    """
    The consumer-offset requests of a broker's remoting port, each a
    method taking the request and the peer; L{handlers} maps codes to
    them.

    @param metadata: the broker's metadata at the time of a request
        (C{Broker.metadata}: a new object at each start).
    @param commitlog: the broker's commit log at the time of a request, or
        C{None} when none is open.
    @param in_memory: the bytes at the end of the commit log that count as
        in memory (L{in_memory_bytes} by default).
    """

    def __init__(
        self,
        metadata: Callable[[], BrokerMetadata],
        commitlog: Callable[[], LogBounds | None],
        in_memory: int | None = None,
    ) -> None:
        self._metadata = metadata
        self._commitlog = commitlog
        self._in_memory = in_memory_bytes() if in_memory is None else in_memory

    def handlers(self) -> Mapping[int, Callable[[RemotingCommand, "IAddress | None"], Answer]]:
        return {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
        }

    def update_consumer_offset(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 15 (C{ConsumerManageProcessor.updateConsumerOffset}): the
        group's next offset in the queue, stored over whatever was there (a
        lower one too), on a master and a slave alike; written to
        C{config/consumerOffset.json} by the next flush (every 5 s).  A
        genuine client sends it oneway: the answer, SUCCESS, is dropped.

        Refused with SYSTEM_ERROR naming the field: a header field missing
        or not a number; a topic or group name outside RocketMQ's rules, a
        negative queue id, or a new key or queue past the table's caps
        (L{rmqha.remoting.metadata.MetadataLimits}).
        """
        try:
            header = header_from_ext_fields(UpdateConsumerOffsetRequestHeader, request.ext_fields)
            self._metadata().commit_offset(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )
        except (CustomHeaderError, MetadataError) as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        return make_response(request, ResponseCode.SUCCESS)

    def query_consumer_offset(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 14 (C{ConsumerManageProcessor.queryConsumerOffset}): the
        offset stored for the group and queue; when none is, 0 if the
        queue's min offset is at most 0 and its unit 0 is not "in disk"
        (more than L{in_memory_bytes} behind the log's end) -- a new
        group on a young queue reads it from the start --, otherwise
        QUERY_NOT_FOUND (the consumer's C{consumeFromWhere} decides).
        """
        try:
            header = header_from_ext_fields(QueryConsumerOffsetRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        offset = self._metadata().query_offset(header.consumer_group, header.topic, header.queue_id)
        if offset < 0 and self._starts_at_zero(header.topic, header.queue_id):
            offset = 0
        if offset < 0:
            return make_response(request, ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK)
        return make_response(
            request,
            ResponseCode.SUCCESS,
            ext_fields=header_to_ext_fields(QueryConsumerOffsetResponseHeader(offset)),
        )

    def _starts_at_zero(self, topic: str, queue_id: int) -> bool:
        commitlog = self._commitlog()
        head = consume_queue_head(commitlog, topic, queue_id)
        if head.min_offset > 0:
            return False
        if head.first_unit_at is None or commitlog is None:
            return True
        return commitlog.max_offset - head.first_unit_at <= self._in_memory
