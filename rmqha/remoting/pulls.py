# -*- test-case-name: tests.test_remoting_pulls -*-
"""
Pulls on a broker's remoting port, as 4.9.8's C{PullMessageProcessor},
C{PullRequestHoldService} and C{DefaultMessageStore.getMessage} answer
them (docs/remoting.md, "Consuming"): PULL_MESSAGE (11) with long
polling, GET_MAX_OFFSET (30), GET_MIN_OFFSET (31),
SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32) and
VIEW_MESSAGE_BY_ID (33), all read from the store's consume queues
(L{rmqha.store.consumequeue}).

L{get_message} is the store lookup (a status, the raw records, the
offsets); L{PullHandlers} maps it to the reply, parks a pull that finds
nothing (flag 0x2) until its queue grows (the consume queues' growth
observer, on masters and slaves alike) or its time is up, and answers it
once.  Held pulls are bounded per connection and in all.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress, IDelayedCall
from twisted.logger import Logger

from rmqha.remoting._frames import (
    CustomHeaderError,
    RemotingCommand,
    header_from_ext_fields,
    header_to_ext_fields,
    make_response,
)
from rmqha.remoting.codes import RequestCode, ResponseCode
from rmqha.remoting.consumers import ClientManager, SubscriptionData
from rmqha.remoting.headers import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    EarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SearchOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from rmqha.remoting.metadata import PERM_READ, MetadataError
from rmqha.remoting.offsets import in_memory_bytes
from rmqha.remoting.protocol import Answer, format_peer
from rmqha.store import _record as _codec
from rmqha.store._record import MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2
from rmqha.store.consumequeue import UNIT, UNIT_SIZE, ConsumeQueue, ConsumeQueues
from rmqha.store.errors import StoreError

if TYPE_CHECKING:
    from rmqha.broker import Broker
    from rmqha.store.commitlog import CommitLog

__all__ = [
    "SERVED",
    "GetMessageStatus",
    "GetMessageResult",
    "HoldLimits",
    "TransferLimits",
    "get_message",
    "is_batch_full",
    "PullHandlers",
    "store_timestamp",
]

#: The request codes L{PullHandlers} answers (PULL_MESSAGE not on the VIP port).
SERVED: Final = (
    RequestCode.PULL_MESSAGE,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
    RequestCode.GET_MAX_OFFSET,
    RequestCode.GET_MIN_OFFSET,
    RequestCode.GET_EARLIEST_MSG_STORETIME,
    RequestCode.VIEW_MESSAGE_BY_ID,
)

#: C{MessageStoreConfig}: what one pull carries at most.
MAX_TRANSFER_BYTES_IN_MEMORY: Final = 256 * 1024
MAX_TRANSFER_COUNT_IN_MEMORY: Final = 32
MAX_TRANSFER_BYTES_IN_DISK: Final = 64 * 1024
MAX_TRANSFER_COUNT_IN_DISK: Final = 8
#: C{getMessage}'s scan bound: C{max(16000, maxMsgNums * 20)} bytes of units.
_MIN_FILTER_BYTES: Final = 16000
#: The fewest units read first (more in growing chunks while the pull needs them).
_FIRST_UNITS: Final = 16
#: C{MixAll.MASTER_ID}.
MASTER_ID: Final = 0
#: The largest record VIEW_MESSAGE_BY_ID reads (C{maxMessageSize} and a
#: record's header).
MAX_VIEW_SIZE: Final = 4 * 1024 * 1024 + 64 * 1024


class GetMessageStatus(enum.Enum):
    """C{GetMessageStatus}, whose name is a pull reply's remark."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclasses.dataclass
class GetMessageResult:
    """C{GetMessageResult}: what L{get_message} found."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    #: The records found, as stored: runs of adjacent records.
    records: list[bytes] = dataclasses.field(default_factory=list)
    #: How many records, and their bytes.
    count: int = 0
    size: int = 0
    suggest_pulling_from_slave: bool = False


@dataclasses.dataclass(frozen=True)
class TransferLimits:
    """
    What one pull carries at most (C{MessageStoreConfig}'s
    C{maxTransfer*OnMessageIn*}, 4.9.8's defaults; broker.conf keys of the
    same names).
    """

    bytes_in_memory: int = MAX_TRANSFER_BYTES_IN_MEMORY
    count_in_memory: int = MAX_TRANSFER_COUNT_IN_MEMORY
    bytes_in_disk: int = MAX_TRANSFER_BYTES_IN_DISK
    count_in_disk: int = MAX_TRANSFER_COUNT_IN_DISK


def is_batch_full(
    size: int, max_msg_nums: int, total: int, count: int, in_disk: bool, limits: TransferLimits = TransferLimits()
) -> bool:
    """
    C{DefaultMessageStore.isTheBatchFull}: the first message always goes;
    then C{maxMsgNums}, and (by default) 64 KiB / 8 messages "in disk",
    256 KiB / 32 in memory.
    """
    if total == 0 or count == 0:
        return False
    if max_msg_nums <= count:
        return True
    if in_disk:
        return total + size > limits.bytes_in_disk or count > limits.count_in_disk - 1
    return total + size > limits.bytes_in_memory or count > limits.count_in_memory - 1


def get_message(
    queues: ConsumeQueues | None,
    log: CommitLog | None,
    topic: str,
    queue_id: int,
    offset: int,
    max_msg_nums: int,
    matches: Callable[[int], bool] | None,
    *,
    in_memory: int,
    correct_offsets: bool = True,
    limits: TransferLimits = TransferLimits(),
) -> GetMessageResult:
    """
    C{DefaultMessageStore.getMessage}: up to C{max_msg_nums} records of
    the queue from logical C{offset} whose unit's tag code C{matches}
    (every one for C{None}), within the batch limits, and the status.

    @param in_memory: how many bytes behind the log's end still count as
        in memory (the 40 % rule).
    @param correct_offsets: C{nextOffsetCorrection}: a master (or a slave
        with C{offsetCheckInSlave}) answers the corrected offset, a slave
        the requested one.
    @param limits: L{is_batch_full}'s.
    """

    def correction(new: int) -> int:
        return new if correct_offsets else offset

    if queues is None or log is None:
        return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, correction(0), 0, 0)
    queue = queues.queue(topic, queue_id)
    if queue is None:
        # (RocketMQ's findConsumeQueue makes an empty one.)
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, correction(0), 0, 0)
    log_min, log_max = log.min_offset, log.max_offset
    min_offset = queue.min_offset(log_min)
    max_offset = queue.max_offset
    if max_offset == 0:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, correction(0), min_offset, max_offset)
    if offset < min_offset:
        return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, correction(min_offset), min_offset, max_offset)
    if offset == max_offset:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, correction(offset), min_offset, max_offset)
    if offset > max_offset:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, correction(max_offset), min_offset, max_offset)
    limit = max(_MIN_FILTER_BYTES, max_msg_nums * UNIT_SIZE) // UNIT_SIZE
    # (The batch's records and the unit that shows it full, to begin with.)
    asked = min(limit, max(_FIRST_UNITS, max_msg_nums + 1))
    first = queue.unit_bytes(offset, asked)
    if not first:
        # The slice is missing: on to the next consume-queue file.
        units_per_file = queues.file_size // UNIT_SIZE
        next_file = offset + units_per_file - offset % units_per_file
        return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, correction(next_file), min_offset, max_offset)
    # The walk's state: records taken and their bytes, units scanned, the
    # last unit's offset, where the next log file starts after a deleted
    # one (-1: none), the status so far.
    walk = [0, 0, 0, 0, -1, _NO_MATCH]
    # The records taken, as runs of adjacent records in one log segment
    # [start, end]: each run is read with one call.
    runs: list[list[int]] = []
    step = getattr(_codec._accel, "pull_walk", None) or _walk_units
    for chunk in _scan(queue, offset, limit, first, asked):
        if step(
            chunk, walk, runs, matches, max_msg_nums, limits.bytes_in_memory, limits.count_in_memory,
            limits.bytes_in_disk, limits.count_in_disk, log_max - in_memory, log_min, log_max, log.segment_size,
        ):
            break
    count, total, scanned, max_pulling, _, status = walk
    result = GetMessageResult(_STATUSES[status], offset + scanned, min_offset, max_offset, count=count, size=total)
    if runs:
        result.records = _gather(log, runs, total, topic, queue_id)
    result.suggest_pulling_from_slave = log_max - max_pulling > in_memory
    return result


_NO_MATCH, _REMOVING, _FOUND = 0, 1, 2
_STATUSES: Final = {
    _NO_MATCH: GetMessageStatus.NO_MATCHED_MESSAGE,
    _REMOVING: GetMessageStatus.MESSAGE_WAS_REMOVING,
    _FOUND: GetMessageStatus.FOUND,
}


def _walk_units(
    units: bytes,
    walk: list[int],
    runs: list[list[int]],
    matches: Callable[[int], bool] | None,
    max_msg_nums: int,
    bytes_in_memory: int,
    count_in_memory: int,
    bytes_in_disk: int,
    count_in_disk: int,
    in_disk_below: int,
    log_min: int,
    log_max: int,
    segment: int,
) -> bool:
    """
    L{get_message}'s walk over one chunk of units (C{_speedups.pull_walk}
    is this compiled): each unit scanned, filtered (C{matches}), its record
    taken into C{runs} until the batch is full (L{is_batch_full}, inline;
    a unit at or past C{in_disk_below} is "in memory"); a unit whose
    record left the log skips to the next log file.  C{walk} is updated
    in place.

    @return: whether the batch is full.
    """
    count, total, scanned, max_pulling, next_file_start, status = walk
    full = False
    for unit_offset, size, code in UNIT.iter_unpack(units):
        max_pulling = unit_offset
        if unit_offset < next_file_start:
            scanned += 1
            continue
        if count:
            if max_msg_nums <= count:
                full = True
                break
            if unit_offset < in_disk_below:
                if total + size > bytes_in_disk or count > count_in_disk - 1:
                    full = True
                    break
            elif total + size > bytes_in_memory or count > count_in_memory - 1:
                full = True
                break
        scanned += 1
        if matches is not None and not matches(code):
            continue
        if not (log_min <= unit_offset and unit_offset + size <= log_max) or size <= 0:
            # (Its log file was deleted: on to the next one.)
            if not count:
                status = _REMOVING
            next_file_start = unit_offset - unit_offset % segment + segment
            continue
        if runs and runs[-1][1] == unit_offset and unit_offset % segment != 0:
            runs[-1][1] += size
        else:
            runs.append([unit_offset, unit_offset + size])
        count += 1
        total += size
        status = _FOUND
        next_file_start = -1
    walk[:] = [count, total, scanned, max_pulling, next_file_start, status]
    return full


#: L{_gather} reads a pull's records with one read of the log from the
#: first to the last when the bytes between them (other queues' records,
#: mostly) are at most this much a run more than the records: a read
#: system call and its Python costs several microseconds, a copy of 16
#: KiB about as much.
_SPAN_SLACK: Final = 16 * 1024


def _gather(log: CommitLog, runs: list[list[int]], total: int, topic: str, queue_id: int) -> list[bytes]:
    """
    The records of C{runs} (adjacent records, each in one segment), read
    from the log: one read of the whole span and the runs cut out of it
    when the span is not much more than the records (C{_SPAN_SLACK}), one
    read a run otherwise.

    @raise StoreError: bytes that could not be read.
    """
    first, last = runs[0][0], runs[-1][1]
    if len(runs) > 1 and last - first <= total + _SPAN_SLACK * len(runs):
        try:
            span = log.read(first, last - first)
        except StoreError:
            span = b""
        if len(span) == last - first:  # (else: it crossed a segment's end)
            view = memoryview(span)
            return [b"".join([view[start - first : end - first] for start, end in runs])]
    records = []
    for start, end in runs:
        try:
            data = log.read(start, end - start)
        except StoreError:
            data = b""
        if len(data) != end - start:
            raise StoreError(
                f"commit-log bytes {start}..{end} of queue {topic}/{queue_id} could not be read "
                f"(got {len(data)} bytes)"
            )
        records.append(data)
    return records


def _scan(queue: ConsumeQueue, offset: int, limit: int, first: bytes, asked: int) -> Iterator[bytes]:
    """
    Up to C{limit} units from C{offset} to the end of its queue file (what
    C{getIndexBuffer} gives), as raw units in growing chunks from C{first}
    (the C{asked} first): a pull of 32 records does not read 800 units.
    """
    got, position, left = first, offset, limit
    while True:
        yield got
        n = len(got) // UNIT_SIZE
        if n < asked:
            return  # (the file's or the queue's end)
        position += n
        left -= n
        if left <= 0:
            return
        asked = min(left, asked * 2)
        got = queue.unit_bytes(position, asked)


_I64 = struct.Struct(">q")


def store_timestamp(record: bytes) -> int:
    """The STORETIMESTAMP of a raw record (-1 if it is too short)."""
    if len(record) < 48:
        return -1
    sysflag = struct.unpack_from(">i", record, 36)[0]
    at = 48 + (20 if sysflag & 0x10 else 8)
    if len(record) < at + 8:
        return -1
    value: int = _I64.unpack_from(record, at)[0]
    return value


@dataclasses.dataclass(frozen=True)
class HoldLimits:
    """
    Held pulls, at most (RocketMQ holds any number).

    @ivar per_connection: on one connection (below the protocol's 256
        requests in flight, so that a consumer's other requests still go).
    @ivar total: on the broker.
    """

    per_connection: int = 200
    total: int = 20_000


class _Held:
    """One parked pull (C{PullRequest}): answered once, on wake, timeout or never (closed)."""

    def __init__(
        self,
        request: RemotingCommand,
        header: PullMessageRequestHeader,
        peer: IAddress | None,
        deferred: Deferred[RemotingCommand | None],
    ) -> None:
        self.request = request
        self.header = header
        self.peer = peer
        self.deferred = deferred
        self.timer: IDelayedCall | None = None
        self.key = (header.topic, header.queue_id)


class PullHandlers:
    """
    The pull codes of one broker's remoting port (L{handlers}).

    @param clients: the broker's L{ClientManager} (the subscriptions of
        pulls without their own).
    @param in_memory: the bytes at the end of the commit log that count as
        in memory (L{in_memory_bytes} by default).
    @ivar in_memory: that.
    """

    _log = Logger(namespace="rmqha.remoting.pulls")

    def __init__(
        self,
        broker: Broker,
        clients: ClientManager,
        *,
        in_memory: int | None = None,
        limits: HoldLimits = HoldLimits(),
    ) -> None:
        self._broker = broker
        self._clients = clients
        self.in_memory = in_memory_bytes() if in_memory is None else in_memory
        self.limits = limits
        #: Parked pulls by (topic, queue id), in arrival order.
        self.held: dict[tuple[str, int], list[_Held]] = {}
        self._per_peer: dict[int, int] = {}
        self._held_count = 0
        self._observed: ConsumeQueues | None = None
        self._stop_observing: Callable[[], None] | None = None

    def handlers(self) -> Mapping[int, Callable[[RemotingCommand, "IAddress | None"], Answer]]:
        return {
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
        }

    # -- the store -----------------------------------------------------------------

    def _log_and_queues(self) -> tuple[CommitLog | None, ConsumeQueues | None]:
        log = self._broker.store.commitlog
        return log, (log.consume_queues if log is not None else None)

    @property
    def _is_slave(self) -> bool:
        return bool(self._broker.roles.is_slave)

    # -- PULL_MESSAGE ----------------------------------------------------------------

    def pull_message(self, request: RemotingCommand, peer: IAddress | None) -> Answer:
        """
        Code 11 (C{PullMessageProcessor.processRequest}), first pass: the
        reply, or a Deferred of it for a pull parked until its queue grows
        or its time is up.
        """
        try:
            header = header_from_ext_fields(PullMessageRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        reply = self._pull(request, header, peer, allow_suspend=True)
        if reply is not None:
            return reply
        return self._hold(request, header, peer)

    def _pull(
        self,
        request: RemotingCommand,
        header: PullMessageRequestHeader,
        peer: IAddress | None,
        *,
        allow_suspend: bool,
    ) -> RemotingCommand | None:
        """
        One pass: the reply, or C{None} when the pull is to be parked.
        """
        if self._broker.settings.failover:
            refusal = self._broker.roles.read_refusal()
            if refusal is not None:
                # (rmqha: a failover node reads nothing a failover may
                # cut; a genuine client takes the code as an error and
                # pulls again later, from the route's master.)
                return make_response(
                    request, ResponseCode.SYSTEM_BUSY, f"[rmqha] not serving reads: this failover node is {refusal}"
                )
        metadata = self._broker.metadata
        try:
            group = self._clients.find_group(metadata, header.consumer_group)
        except MetadataError as e:
            # (4.9.8 creates any group; rmqha's table is capped.)
            return make_response(
                request,
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{header.consumer_group}] does not exist: {e}",
            )
        if not group.consume_enable:
            return make_response(
                request, ResponseCode.NO_PERMISSION, f"subscription group no permission, {header.consumer_group}"
            )
        flags = header.sys_flag
        topic = metadata.topic(header.topic)
        if topic is None:
            return make_response(
                request, ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist, apply first please!"
            )
        if not topic.perm & PERM_READ:
            return make_response(
                request, ResponseCode.NO_PERMISSION, f"the topic[{header.topic}] pulling message is forbidden"
            )
        if header.queue_id < 0 or header.queue_id >= topic.read_queue_nums:
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                f"topicConfig.readQueueNums:[{topic.read_queue_nums}] consumer:[{format_peer(peer)}]",
            )
        subscription: SubscriptionData | None
        if flags & FLAG_SUBSCRIPTION:
            subscription = SubscriptionData.build(
                header.topic, header.subscription, header.expression_type, header.sub_version
            )
        else:
            info = self._clients.consumers.get(header.consumer_group)
            if info is None:
                return make_response(
                    request, ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's group info not exist"
                )
            if not group.consume_broadcast_enable and info.message_model == "BROADCASTING":
                return make_response(
                    request,
                    ResponseCode.NO_PERMISSION,
                    f"the consumer group[{header.consumer_group}] can not consume by broadcast way",
                )
            subscription = info.subscription(header.topic)
            if subscription is None:
                return make_response(
                    request, ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist"
                )
            if subscription.sub_version < header.sub_version:
                return make_response(
                    request, ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest"
                )
        if subscription.expression_type != "TAG":
            return make_response(
                request,
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {subscription.expression_type}",
            )
        slave = self._is_slave
        settings = self._broker.settings
        log, queues = self._log_and_queues()
        result = get_message(
            queues,
            log,
            header.topic,
            header.queue_id,
            header.queue_offset,
            header.max_msg_nums,
            None if subscription.takes_all else subscription.matches_code,
            in_memory=self.in_memory,
            correct_offsets=not slave or settings.offset_check_in_slave,
            limits=TransferLimits(
                settings.max_transfer_bytes_on_message_in_memory,
                settings.max_transfer_count_on_message_in_memory,
                settings.max_transfer_bytes_on_message_in_disk,
                settings.max_transfer_count_on_message_in_disk,
            ),
        )
        if settings.slave_read_enable:
            suggest = group.which_broker_when_consume_slowly if result.suggest_pulling_from_slave else group.broker_id
        else:
            suggest = MASTER_ID
        status = result.status
        body = b""
        if status is GetMessageStatus.FOUND:
            code = ResponseCode.SUCCESS
            body = b"".join(result.records)
        elif status in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
        elif status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
            code = ResponseCode.PULL_OFFSET_MOVED if header.queue_offset != 0 else ResponseCode.PULL_NOT_FOUND
        elif status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
            code = ResponseCode.PULL_NOT_FOUND
        else:  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL
            code = ResponseCode.PULL_OFFSET_MOVED
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and flags & FLAG_SUSPEND:
            self._commit(header, allow_suspend, slave)
            return None
        if code == ResponseCode.PULL_OFFSET_MOVED:
            if not slave or settings.offset_check_in_slave:
                self._log.warn(
                    "PULL_OFFSET_MOVED: topic {topic} queue {qid} group {group}: requested {asked}, "
                    "next {next} ({status})",
                    topic=header.topic, qid=header.queue_id, group=header.consumer_group,
                    asked=header.queue_offset, next=result.next_begin_offset, status=status.value,
                )
            else:
                suggest = group.broker_id
                code = ResponseCode.PULL_RETRY_IMMEDIATELY
        self._commit(header, allow_suspend, slave)
        ext = header_to_ext_fields(
            PullMessageResponseHeader(suggest, result.next_begin_offset, result.min_offset, result.max_offset)
        )
        return make_response(request, code, status.value, ext, body)

    def _commit(self, header: PullMessageRequestHeader, allow_suspend: bool, slave: bool) -> None:
        """The offset committed by the pull: flag 0x1, first pass, not on a slave."""
        if not (allow_suspend and header.sys_flag & FLAG_COMMIT_OFFSET and not slave):
            return
        try:
            self._broker.metadata.commit_offset(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )
        except MetadataError as e:
            self._log.warn("the offset a pull commits is refused: {error}", error=e)

    # -- long polling --------------------------------------------------------------------

    def _hold(
        self, request: RemotingCommand, header: PullMessageRequestHeader, peer: IAddress | None
    ) -> Answer:
        settings = self._broker.settings
        peer_key = id(peer)
        on_peer = self._per_peer.get(peer_key, 0)
        if on_peer >= self.limits.per_connection:
            return make_response(
                request,
                ResponseCode.SYSTEM_BUSY,
                f"{on_peer} pulls are held for this connection already (the broker's bound, "
                f"held pulls per connection: {self.limits.per_connection})",
            )
        if self._held_count >= self.limits.total:
            return make_response(
                request,
                ResponseCode.SYSTEM_BUSY,
                f"{self._held_count} pulls are held already (the broker's bound, held pulls in all: "
                f"{self.limits.total})",
            )
        if settings.long_polling_enable:
            millis = min(max(header.suspend_timeout_millis, 0), settings.broker_suspend_max_time_millis)
        else:
            millis = settings.short_polling_time_mills
        self._observe()
        # The body is not needed to answer (a pull has none).
        slim = RemotingCommand(
            code=request.code, opaque=request.opaque, ext_fields=request.ext_fields,
            serialize_type=request.serialize_type,
        )

        def cancelled(d: Deferred[RemotingCommand | None]) -> None:
            # (The connection closed: nothing is answered.)
            self._release(held)

        held = _Held(slim, header, peer, Deferred(cancelled))
        self.held.setdefault(held.key, []).append(held)
        self._per_peer[peer_key] = on_peer + 1
        self._held_count += 1
        held.timer = self._broker.reactor.callLater(millis / 1000, self._wake, held)
        # (While a pull is held the store dispatches within 1 ms, not 10.)
        self._broker.store.reader_parked()
        return held.deferred

    def _release(self, held: _Held) -> bool:
        """Forget a parked pull; whether it was still parked."""
        waiting = self.held.get(held.key)
        if waiting is None or held not in waiting:
            return False
        waiting.remove(held)
        if not waiting:
            del self.held[held.key]
        peer_key = id(held.peer)
        left = self._per_peer.get(peer_key, 1) - 1
        if left > 0:
            self._per_peer[peer_key] = left
        else:
            self._per_peer.pop(peer_key, None)
        self._held_count -= 1
        self._broker.store.reader_left()
        if held.timer is not None and held.timer.active():
            held.timer.cancel()
        held.timer = None
        return True

    def _wake(self, held: _Held) -> None:
        """
        C{executeRequestWhenWakeup}: the pull runs again, without parking
        or committing, and is answered (once).
        """
        if held.timer is not None and not held.timer.active():
            held.timer = None
        if not self._release(held):
            return
        try:
            reply = self._pull(held.request, held.header, held.peer, allow_suspend=False)
        except Exception as e:
            self._log.failure("a held pull failed when woken")
            reply = make_response(held.request, ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        held.deferred.callback(reply)

    def _observe(self) -> None:
        """Follow the growth of the store's current consume queues (once each)."""
        _, queues = self._log_and_queues()
        if queues is self._observed:
            return
        if self._stop_observing is not None:
            self._stop_observing()
        self._observed = queues
        self._stop_observing = queues.observe_growth(self._grown) if queues is not None else None

    def _grown(self, topic: str, queue_id: int, max_offset: int) -> None:
        """
        C{notifyMessageArriving}: the queue's parked pulls from below its
        new max offset are woken.
        """
        waiting = self.held.get((topic, queue_id))
        if not waiting:
            return
        for held in [h for h in waiting if max_offset > h.header.queue_offset]:
            self._wake(held)

    def held_count(self) -> int:
        return self._held_count

    def stop(self) -> None:
        """Answer nothing more: every parked pull is dropped (the broker stops)."""
        for waiting in list(self.held.values()):
            for held in list(waiting):
                self._release(held)
        if self._stop_observing is not None:
            self._stop_observing()
        self._stop_observing = None
        self._observed = None

    # -- queue offsets -------------------------------------------------------------------

    def get_max_offset(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """Code 30: the queue's max offset (units written; 0 for none)."""
        try:
            header = header_from_ext_fields(GetMaxOffsetRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        _, queues = self._log_and_queues()
        offset = queues.max_offset(header.topic, header.queue_id) if queues is not None else 0
        return self._offset(request, offset)

    def get_min_offset(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """Code 31: the queue's min offset (its first unit still in the log)."""
        try:
            header = header_from_ext_fields(GetMaxOffsetRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        _, queues = self._log_and_queues()
        offset = queues.min_offset(header.topic, header.queue_id) if queues is not None else 0
        return self._offset(request, offset)

    def search_offset_by_timestamp(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """Code 29: C{getOffsetInQueueByTime}."""
        try:
            header = header_from_ext_fields(SearchOffsetRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        log, queues = self._log_and_queues()
        if queues is None or log is None:
            return self._offset(request, 0)
        offset = queues.offset_by_time(
            header.topic, header.queue_id, header.timestamp, lambda at, size: self._stored_at(log, at, size)
        )
        return self._offset(request, offset)

    def get_earliest_msg_storetime(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 32: the store time of the queue's first message still in the
        log; SYSTEM_ERROR when there is none (4.9.8's -1 there).
        """
        try:
            header = header_from_ext_fields(GetMaxOffsetRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        log, queues = self._log_and_queues()
        stamp = -1
        if queues is not None and log is not None:
            first = queues.min_offset(header.topic, header.queue_id)
            units = queues.units(header.topic, header.queue_id, first, 1)
            if units:
                stamp = self._stored_at(log, units[0].offset, units[0].size)
        return make_response(
            request,
            ResponseCode.SUCCESS,
            ext_fields=header_to_ext_fields(EarliestMsgStoretimeResponseHeader(stamp)),
        )

    def view_message_by_id(self, request: RemotingCommand, peer: IAddress | None) -> RemotingCommand:
        """
        Code 33: the record at a commit-log offset, raw; SYSTEM_ERROR when
        there is none there (or it is larger than L{MAX_VIEW_SIZE}).
        """
        try:
            header = header_from_ext_fields(ViewMessageRequestHeader, request.ext_fields)
        except CustomHeaderError as e:
            return make_response(request, ResponseCode.SYSTEM_ERROR, str(e))
        log, _ = self._log_and_queues()
        at = header.offset
        record = b""
        if log is not None and log.min_offset <= at < log.max_offset:
            try:
                head = log.read(at, 8)
                size, magic = struct.unpack(">ii", head) if len(head) == 8 else (0, 0)
                if 0 < size <= MAX_VIEW_SIZE and magic in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
                    record = log.read(at, size)
                    if len(record) != size:
                        record = b""
            except StoreError:
                record = b""
        if not record:
            return make_response(request, ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {at}")
        return make_response(request, ResponseCode.SUCCESS, body=record)

    @staticmethod
    def _stored_at(log: CommitLog, at: int, size: int) -> int:
        if not log.min_offset <= at < log.max_offset:
            return -1
        try:
            return store_timestamp(log.read(at, min(size, 96)))
        except StoreError:
            return -1

    @staticmethod
    def _offset(request: RemotingCommand, offset: int) -> RemotingCommand:
        return make_response(
            request, ResponseCode.SUCCESS, ext_fields=header_to_ext_fields(OffsetResponseHeader(offset))
        )
