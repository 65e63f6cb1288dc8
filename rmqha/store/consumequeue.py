# -*- test-case-name: tests.test_consumequeue -*-
"""
Consume queues in RocketMQ 4.9.8's format, built from the commit log as
RocketMQ's C{ReputMessageService} builds them (docs/consumequeue.md).

::

    <store>/consumequeue/<topic>/<queueId>/00000000000000000000
    <store>/consumequeue/<topic>/<queueId>/00000000000006000000   (300,000 units a file)
    <store>/checkpoint                                            4096 bytes

A unit is 20 bytes, big-endian: int64 commit-log offset, int32 record size,
int64 tag hash.  Logical offset C{n} of a queue is at byte C{n * 20}.

L{ConsumeQueues} is a part the L{rmqha.store.commitlog.CommitLog} owns: it
follows the log's whole records (its C{record_end}) from C{dispatched}, in
bounded steps (L{ConsumeQueues.dispatch}), on masters (puts) and slaves
(C{append_at}) alike; no Twisted here: the service schedules the steps.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence

from twisted.logger import Logger

from rmqha._javahash import java_string_hash
from rmqha.store import _record as _codec
from rmqha.store._record import (
    BLANK_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    SysFlag,
    decode_properties,
)
from rmqha.store._segments import _drop_pages, _load_segments, _Segment, segment_name
from rmqha.store.errors import StoreError

if TYPE_CHECKING:
    from rmqha.store.commitlog import CommitLog

__all__ = [
    "UNIT_SIZE",
    "UNIT",
    "DEFAULT_UNITS_PER_FILE",
    "DEFAULT_DISPATCH_STEP",
    "ConsumeQueue",
    "ConsumeQueues",
    "ConsumeQueueError",
    "Unit",
    "java_string_hash",
    "tags_code",
    "read_checkpoint",
    "CHECKPOINT_SIZE",
    "verify_consume_queues",
    "verify_store_queues",
    "QueueCheck",
]

#: ConsumeQueue.CQ_STORE_UNIT_SIZE.
UNIT_SIZE = 20
#: MessageStoreConfig.mappedFileSizeConsumeQueue / 20.
DEFAULT_UNITS_PER_FILE = 300_000
#: How many commit-log bytes one dispatch step reads at most (one step per
#: reactor turn: a slave catching up gigabytes never holds the reactor
#: longer than one step).
DEFAULT_DISPATCH_STEP = 1024 * 1024
#: Dispatched bytes of log since the last sync above which closing syncs
#: the queues (below it, the next open dispatches them again).
CLOSE_SYNC_BYTES = 64 * 1024 * 1024
#: StoreCheckpoint maps one OS page.
CHECKPOINT_SIZE = 4096
#: TopicValidator.RMQ_SYS_SCHEDULE_TOPIC.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: MessageStoreConfig.messageDelayLevel.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: The unit fillPreBlank writes before the first unit of a queue whose
#: first file starts at a non-zero index.
_PRE_BLANK = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)

#: A unit: commit-log offset, record size, tag hash code.
UNIT = _UNIT = struct.Struct(">qiq")
_HEAD = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
_HEADER = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
_V4_TAIL = struct.Struct(">q8x4x8xi")  # STORETIMESTAMP .. BODYLENGTH, IPv4 hosts
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_UNCOUNTED = (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE)
_TAGS = b"TAGS\x01"
_SCHEDULE = SCHEDULE_TOPIC.encode()


class ConsumeQueueError(StoreError):
    """
    A consume-queue file that cannot be used (the text names it).
    """


@dataclass(frozen=True, slots=True)
class Unit:
    """
    One consume-queue unit: where a message record is, how long, its tag hash.
    """

    offset: int
    size: int
    tags_code: int


def parse_delay_levels(text: str = DEFAULT_DELAY_LEVELS) -> dict[int, int]:
    """
    C{messageDelayLevel} as ScheduleMessageService.parseDelayLevel reads it:
    level (from 1) to milliseconds.
    """
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    table = {}
    for level, item in enumerate(text.split(), 1):
        table[level] = int(item[:-1]) * units[item[-1]]
    return table


_DELAYS = parse_delay_levels()
_MAX_LEVEL = max(_DELAYS)


def tags_code(topic: str, properties: dict[str, str], store_timestamp: int) -> int:
    """
    The tag hash of a record, as C{CommitLog.checkMessageAndReturnSize}
    computes it: C{String.hashCode} of the TAGS property (0 without), and
    for the schedule topic with a DELAY level, the delivery time.
    """
    code = 0
    tags = properties.get("TAGS")
    if tags:
        code = java_string_hash(tags)
    if topic == SCHEDULE_TOPIC and "DELAY" in properties:
        try:
            level = int(properties["DELAY"])
        except ValueError:
            return code  # (RocketMQ's parseInt would throw: see the docs)
        level = min(level, _MAX_LEVEL)
        if level > 0:
            code = _DELAYS.get(level, 1000) + store_timestamp
    return code


class _Reader(Protocol):
    """
    What the queues need of the commit log.
    """

    @property
    def min_offset(self) -> int: ...

    @property
    def segment_size(self) -> int: ...

    def read(self, offset: int, limit: int) -> bytes: ...


# -- one queue -----------------------------------------------------------------


class ConsumeQueue:
    """
    One (topic, queue id)'s files: C{end} is the logical byte offset one
    past the last unit (RocketMQ's max offset times 20).

    @ivar max_physic: C{offset + size} of the last unit (-1: none).
    """

    _log = Logger()

    def __init__(self, directory: str, topic: str, queue_id: int, file_size: int) -> None:
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self.files: list[int] = []  # start (logical byte) offsets, sorted
        self.end = 0
        self.max_physic = -1
        self.min_logical: int | None = None  # cached min offset (bytes)
        self._fds: dict[int, int] = {}
        self._pending = bytearray()
        self._pending_at = 0
        self.dirty: set[int] = set()

    # -- files --

    def path(self, start: int) -> str:
        return os.path.join(self.directory, segment_name(start))

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            fd = self._fds[start] = os.open(self.path(start), os.O_RDWR | os.O_CLOEXEC)
        return fd

    def _create(self, start: int) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(self.path(start), flags, 0o644)
        except FileNotFoundError:  # (a new queue: its directories first)
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(self.path(start), flags, 0o644)
        os.ftruncate(fd, self.file_size)  # (RandomAccessFile.setLength)
        self._fds[start] = fd
        self.files.append(start)

    def close(self) -> None:
        self.write_pending()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    # -- load and recover --

    def load(self) -> None:
        """
        Find the files and recover the end as C{ConsumeQueue.recover}
        does: from the third-to-last file, units while C{offset >= 0 and
        size > 0}; the end is after the last good one.

        @raise ConsumeQueueError: a file of the wrong size or name.
        """
        names = sorted(os.listdir(self.directory)) if os.path.isdir(self.directory) else []
        starts: list[int] = []
        for name in names:
            path = os.path.join(self.directory, name)
            if not (len(name) == 20 and name.isdigit()):
                raise ConsumeQueueError(f"{path}: not a consume-queue file name")
            size = os.path.getsize(path)
            if size != self.file_size and name == names[-1] and size < self.file_size:
                with open(path, "rb") as f:
                    unfinished = not f.read().strip(b"\0")
                if unfinished:
                    # Created, then the process died before the file had
                    # its size: nothing was ever written to it.
                    self._log.info(
                        "consume-queue file {path} was never finished ({size} bytes, "
                        "zeros): removed",
                        path=path, size=size,
                    )
                    os.unlink(path)
                    continue
            if size != self.file_size:
                raise ConsumeQueueError(
                    f"{path}: {size} bytes, but consume-queue files are {self.file_size} bytes"
                )
            start = int(name)
            if start % self.file_size or (starts and start != starts[-1] + self.file_size):
                raise ConsumeQueueError(f"{path}: not where the queue's next file belongs")
            starts.append(start)
        self.files = starts
        if not starts:
            self.end = 0
            return
        index = max(0, len(starts) - 3)
        end = starts[index]
        max_physic = -1
        while index < len(starts):
            good = True
            for position, offset, size in self._scan(starts[index]):
                if not (offset >= 0 and size > 0):
                    good = False
                    break
                end = starts[index] + position + UNIT_SIZE
                max_physic = offset + size
            if not good:
                break
            index += 1
        self.end = end
        self.max_physic = max_physic
        self._cut_files(end)

    def _cut_files(self, end: int) -> None:
        """
        The queue ends at C{end}: drop the files that start at or after
        it (no unit of theirs is in the queue), zero what follows C{end}
        in the last one.
        """
        while self.files and self.files[-1] >= end:
            self._drop_last()
        if not self.files:
            self.end = 0
            self.max_physic = -1
            return
        self.end = end
        self._zero_after(end)

    def _scan(self, start: int) -> Iterator[tuple[int, int, int]]:
        """
        (position, offset, size) of every unit of the file at C{start},
        read a block at a time (a caller that stops early reads no more).
        """
        fd = self._fd(start)
        block = 3276 * UNIT_SIZE  # (64 KiB, whole units)
        for at in range(0, self.file_size, block):
            data = os.pread(fd, min(block, self.file_size - at), at)
            for position in range(0, len(data) - UNIT_SIZE + 1, UNIT_SIZE):
                offset, size, _ = _UNIT.unpack_from(data, position)
                yield at + position, offset, size

    def _drop_last(self) -> None:
        start = self.files.pop()
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)
        self.dirty.discard(start)
        os.unlink(self.path(start))

    def _zero_after(self, end: int) -> None:
        """
        Zero the non-zero bytes of the last file after C{end} (units that
        are not part of the queue any more: stale units must never come
        back at the next recovery).
        """
        if not self.files:
            return
        start = self.files[-1]
        position = end - start
        if not 0 <= position < self.file_size:
            return
        fd = self._fd(start)
        step = 1024 * UNIT_SIZE
        while position < self.file_size:
            chunk = os.pread(fd, min(step, self.file_size - position), position)
            if not chunk:
                break
            if chunk.strip(b"\0"):
                os.pwrite(fd, bytes(len(chunk)), position)
                self.dirty.add(start)
            else:
                break  # (units are written in order: zeros to the end)
            position += len(chunk)

    def truncate(self, log_end: int) -> bool:
        """
        Cut the units that point at or past C{log_end}
        (C{truncateDirtyLogicFiles}); the cut units are zeroed (RocketMQ
        only moves the write position back) and files left with none are
        removed.

        @return: whether anything was cut.
        """
        self.write_pending()
        if self.max_physic <= log_end or not self.files:
            return False
        self._cut_files(self.first_past(log_end))
        self.max_physic = -1
        if self.files and self.end > self.files[0]:
            offset, size, _ = self.unit_at(self.end - UNIT_SIZE)
            if size != 0x7FFFFFFF:
                self.max_physic = offset + size
        self.min_logical = None
        return True

    def first_past(self, log_end: int) -> int:
        """
        The logical byte offset of the first unit pointing at or past
        commit-log offset C{log_end} (the queue's end if none does).
        """
        if not self.files:
            return self.end
        # Units are in commit-log order: bisect (fillPreBlank's units
        # point at offset 0).
        lo, hi = self.files[0], self.end
        while lo < hi:
            mid = lo + (hi - lo) // (2 * UNIT_SIZE) * UNIT_SIZE
            if self.unit_at(mid)[0] >= log_end:
                hi = mid
            else:
                lo = mid + UNIT_SIZE
        return lo

    # -- appending --

    def put(self, offset: int, size: int, code: int, queue_offset: int) -> bool:
        """
        C{putMessagePositionInfo}: append a unit for the record at
        C{offset} whose QUEUEOFFSET is C{queue_offset}.

        @return: whether a unit was added.
        """
        if offset + size <= self.max_physic:
            return False  # (dispatched before: a re-dispatch after a restart)
        expect = queue_offset * UNIT_SIZE
        end = self.end + len(self._pending)
        if not self.files and not self._pending:
            # The first file of a queue: where its first unit falls, padded
            # before it (fillPreBlank).
            start = expect - expect % self.file_size
            self._create(start)
            self.end = start
            self._pending_at = start
            pad = expect - start
            if pad:
                self._pending += _PRE_BLANK * (pad // UNIT_SIZE)
            end = expect
        if expect < end:
            self._log.warn(
                "consume queue {topic}/{qid}: a unit for logical offset {expect} "
                "(commit-log offset {offset}) arrived at {end}: skipped as already built",
                topic=self.topic, qid=self.queue_id, expect=queue_offset,
                offset=offset, end=end // UNIT_SIZE,
            )
            return False
        if expect != end:
            # (RocketMQ logs "logic queue order maybe wrong" and appends.)
            self._log.error(
                "consume queue {topic}/{qid}: record at commit-log offset {offset} has "
                "queue offset {expect}, but the queue ends at {end}: appended at {end}",
                topic=self.topic, qid=self.queue_id, expect=queue_offset,
                offset=offset, end=end // UNIT_SIZE,
            )
        if not self._pending:
            self._pending_at = self.end
        self._pending += _UNIT.pack(offset, size, code)
        self.max_physic = offset + size
        return True

    def put_units(self, units: bytes, offsets: bytes, first: int, consecutive: bool) -> None:
        """
        L{put} for consecutive records' units (C{units}, 20 bytes each),
        their QUEUEOFFSETs (C{offsets}, int64 each, the first C{first}):
        appended at once when they follow the queue's last unit in both
        logs, else one by one.
        """
        first_offset, first_size, _ = _UNIT.unpack_from(units)
        if (
            consecutive
            and self.files
            and first * UNIT_SIZE == self.end + len(self._pending)
            and first_offset + first_size > self.max_physic
        ):
            if not self._pending:
                self._pending_at = self.end
            self._pending += units
            last_offset, last_size, _ = _UNIT.unpack_from(units, len(units) - UNIT_SIZE)
            self.max_physic = last_offset + last_size
            return
        for i in range(0, len(units), UNIT_SIZE):
            offset, size, code = _UNIT.unpack_from(units, i)
            self.put(offset, size, code, _I64.unpack_from(offsets, i // UNIT_SIZE * 8)[0])

    def write_pending(self) -> None:
        """
        Write the units appended since the last call (one C{pwrite} per file).
        """
        data = self._pending
        if not data:
            return
        at = self._pending_at
        view = memoryview(data)
        while view:
            start = at - at % self.file_size
            if not self.files or self.files[-1] < start:
                self._create(start)
            n = min(len(view), start + self.file_size - at)
            os.pwrite(self._fd(start), view[:n], at - start)
            self.dirty.add(start)
            at += n
            view = view[n:]
        view.release()
        self.end = at
        self._pending = bytearray()

    # -- reading --

    @property
    def max_offset(self) -> int:
        """
        RocketMQ's C{getMaxOffsetInQueue}: one past the last unit, logical.
        """
        return (self.end + len(self._pending)) // UNIT_SIZE

    def unit_at(self, position: int) -> tuple[int, int, int]:
        """
        The unit at logical byte C{position} (written units only).
        """
        start = position - position % self.file_size
        data = os.pread(self._fd(start), UNIT_SIZE, position - start)
        if len(data) < UNIT_SIZE:
            raise ConsumeQueueError(f"{self.path(start)}: short read at {position - start}")
        offset, size, code = _UNIT.unpack(data)
        return offset, size, code

    def min_offset(self, log_min: int) -> int:
        """
        RocketMQ's C{getMinOffsetInQueue} (C{correctMinOffset}): the first
        unit of the first file pointing at or past the log's min offset.
        """
        self.write_pending()
        if not self.files:
            return 0
        if self.min_logical is None:
            start = self.files[0]
            found = self.end
            for position, offset, _ in self._scan(start):
                if start + position >= self.end:
                    break
                if offset >= log_min:
                    found = start + position
                    break
            self.min_logical = found
        return self.min_logical // UNIT_SIZE

    def units(self, logical: int, count: int) -> list[Unit]:
        """
        Up to C{count} units from logical offset C{logical} (fewer at the
        end of the queue or of a file, as RocketMQ's
        C{getIndexBuffer}).
        """
        return [Unit(*fields) for fields in _UNIT.iter_unpack(self.unit_bytes(logical, count))]

    def unit_bytes(self, logical: int, count: int) -> bytes:
        """
        L{units} as stored: whole 20-byte units, read with one C{pread}
        (a pull walks them without making a L{Unit} of each).
        """
        self.write_pending()
        position = logical * UNIT_SIZE
        if count <= 0 or logical < 0 or position >= self.end or not self.files:
            return b""
        if position < self.files[0]:
            return b""
        start = position - position % self.file_size
        n = min(count * UNIT_SIZE, self.end - position, start + self.file_size - position)
        data = os.pread(self._fd(start), n, position - start)
        whole = len(data) - len(data) % UNIT_SIZE
        return data if whole == len(data) else data[:whole]

    def sync_fds(self) -> list[int]:
        """
        Duplicates of the descriptors of the files written since the last
        call, to C{fdatasync} and close on another thread.
        """
        self.write_pending()
        fds = [os.dup(self._fd(start)) for start in sorted(self.dirty) if start in self.files]
        self.dirty.clear()
        return fds


# -- the set of queues, and dispatch ---------------------------------------------


class ConsumeQueues:
    """
    Every consume queue of a store, built from the commit log.

    @ivar dispatched: every whole record before this commit-log offset has
        its unit (RocketMQ's C{reputFromOffset}).
    @ivar last_timestamp: the store timestamp of the last record dispatched
        (the checkpoint's C{logicsMsgTimestamp}).
    """

    _log = Logger()

    def __init__(
        self,
        store_dir: str,
        log: _Reader,
        units_per_file: int | None = None,
    ) -> None:
        """
        @param units_per_file: units per file (RocketMQ's
            C{mappedFileSizeConsumeQueue} / 20); C{None}: what the existing
            files hold, else L{DEFAULT_UNITS_PER_FILE}.  A value the files
            contradict is an error naming a file.
        """
        if units_per_file is not None and units_per_file <= 0:
            raise ValueError(f"units per consume-queue file {units_per_file!r} must be positive")
        self.store_dir = store_dir
        self.root = os.path.join(store_dir, "consumequeue")
        if units_per_file is None:
            units_per_file = _existing_units(self.root) or DEFAULT_UNITS_PER_FILE
        self.file_size = units_per_file * UNIT_SIZE
        self._log_reader = log
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.dispatched = 0
        self.last_timestamp = 0
        self.physic_timestamp = 0
        self._observers: list[Callable[[str, int, int], object]] = []
        self._checkpoint_fd: int | None = None
        self._synced_mark = -1
        self._by_raw: dict[tuple[bytes, int], ConsumeQueue] = {}
        self._tag_codes: dict[bytes, int] = {}

    # -- opening --

    def open(self, log_end: int) -> None:
        """
        Load and recover every queue, cut the units past C{log_end}
        (C{truncateDirtyLogicFiles}), and set where dispatch starts: the
        largest C{maxPhysicOffset} of the queues (RocketMQ's start),
        at least the log's min offset.
        """
        self._load_checkpoint()
        if os.path.isdir(self.root):
            for topic in sorted(os.listdir(self.root)):
                topic_dir = os.path.join(self.root, topic)
                if not os.path.isdir(topic_dir):
                    continue
                for name in sorted(os.listdir(topic_dir)):
                    path = os.path.join(topic_dir, name)
                    if not os.path.isdir(path):
                        # (Left alone, never read or removed: store check
                        # names it.)
                        self._log.warn("{path}: {what}", path=path, what=STRAY_FILE)
                        continue
                    if not name.isdigit():
                        raise ConsumeQueueError(f"{path}: not a queue id directory")
                    queue = ConsumeQueue(
                        os.path.join(topic_dir, name), topic, int(name), self.file_size
                    )
                    queue.load()
                    self.queues[(topic, int(name))] = queue
        mark = self._read_mark()
        foreign = self._foreign(log_end, mark)
        if foreign is not None:
            self._set_aside(foreign)
            mark = None
        for key, queue in self.queues.items():
            if queue.truncate(log_end):
                self._log.warn(
                    "consume queue {topic}/{qid}: units past the commit log's end "
                    "{end} cut (logical end now {n})",
                    topic=key[0], qid=key[1], end=log_end, n=queue.max_offset,
                )
        start = max((q.max_physic for q in self.queues.values()), default=-1)
        if mark is not None and (start < 0 or mark < start):
            # What the last run had synced (rmqha's own mark; without it,
            # RocketMQ's start): a queue whose last units did not reach
            # the disk before a power loss is built again.
            start = mark
        self.dispatched = min(max(start, self._log_reader.min_offset), log_end)
        if mark != self.dispatched:
            # From now on the mark never says more than the files hold: a
            # build killed half-way starts again from here, not from the
            # furthest queue (whose units may be ahead of the others').
            write_mark(self.mark_path, self.dispatched)
        self._synced_mark = self.dispatched

    def _foreign(self, log_end: int, mark: int | None) -> str | None:
        """
        Why the queues cannot describe this log (a log replaced under
        them, say), or C{None}: in every queue, the last unit before the
        log's end must point at a record of its topic and queue with its
        size and queue offset, and the mark must be at a record (or a
        segment's end).  (Checked before anything is cut.)
        """
        log = self._log_reader
        for (topic, queue_id), queue in self.queues.items():
            position = queue.first_past(log_end) - UNIT_SIZE
            if not queue.files or position < queue.files[0]:
                continue
            offset, size, _ = queue.unit_at(position)
            if size == 0x7FFFFFFF:
                continue  # (only fillPreBlank's units)
            logical = position // UNIT_SIZE
            data = log.read(offset, size) if log.min_offset <= offset < log_end else b""
            if not _describes(data, size, topic, queue_id, logical):
                start = position - position % queue.file_size
                return (
                    f"{queue.path(start)} unit {(position - start) // UNIT_SIZE} points at "
                    f"commit-log offset {offset}, where there is no record of {topic} "
                    f"queue {queue_id} with queue offset {logical} and size {size}"
                )
        start = -1 if mark is None else mark
        if log.min_offset < start < log_end:
            head = log.read(start, 8)
            if len(head) == 8:
                magic = _HEADER.unpack(head)[1]
                if magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2, BLANK_MAGIC):
                    return f"dispatch would start at commit-log offset {start}, not a record"
        return None

    def _set_aside(self, why: str) -> None:
        """
        The queues describe another log: move C{consumequeue/} and the
        mark into C{rmqha/quarantine/} (never deleted: an operator decides)
        and start from nothing.
        """
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()
        self._by_raw.clear()
        directory = os.path.join(self.store_dir, "rmqha", "quarantine")
        os.makedirs(directory, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target, n = os.path.join(directory, f"consumequeue-{stamp}"), 1
        while os.path.exists(target):
            target, n = os.path.join(directory, f"consumequeue-{stamp}.{n}"), n + 1
        if os.path.isdir(self.root):
            os.rename(self.root, target)
        if os.path.exists(self.mark_path):
            os.rename(self.mark_path, target + ".cq-dispatched")
        self._log.warn(
            "the consume queues do not describe this commit log ({why}): moved to "
            "{target}; building them again from the log",
            why=why, target=target,
        )

    # -- observers --

    def observe_growth(self, observer: Callable[[str, int, int], object]) -> Callable[[], None]:
        """
        Call C{observer(topic, queue_id, max_offset)} once per dispatch
        step for each queue that grew in it (pull long-polling wakes its
        held requests from here).

        @return: a function that stops the observing.
        """
        self._observers.append(observer)

        def stop() -> None:
            if observer in self._observers:
                self._observers.remove(observer)

        return stop

    # -- dispatch --

    def dispatch(self, end: int, limit: int = DEFAULT_DISPATCH_STEP) -> bool:
        """
        One step: add units for the whole records from L{dispatched} up
        to C{end} (the log's record end, or less: a record reaching past
        C{end} is not dispatched), reading at most about C{limit} bytes of
        the log (one record at least).

        @return: whether records before C{end} are left for another step.
        @raise ConsumeQueueError: bytes at L{dispatched} that are not a
            record (the log changed under the queues).
        """
        offset = self.dispatched
        if offset >= end:
            return False
        log = self._log_reader
        segment_size = log.segment_size
        budget = limit
        touched: set[ConsumeQueue] = set()
        one = self._one
        by_raw = self._by_raw
        scan = getattr(_codec._accel, "cq_units", None)
        waiting = False  # (a record reaching past end)
        while offset < end and budget > 0:
            # (At least a header: a read the budget cut shorter could not
            # tell a BLANK, which ends the segment, from a message.)
            data = log.read(offset, min(max(budget, 8), end - offset))
            n = len(data)
            position = 0
            blank = False
            while position + 8 <= n:
                if scan is not None:
                    # The compiled decode of the plain records in a row,
                    # their units assembled per queue.
                    groups, position, stamp = scan(data, position, n, offset)
                    for topic, queue_id, first, consecutive, units, offsets in groups:
                        queue = by_raw.get((topic, queue_id)) or self._queue_for(topic, queue_id)
                        queue.put_units(units, offsets, first, consecutive)
                        touched.add(queue)
                    if stamp >= 0:
                        self.last_timestamp = stamp
                    if position + 8 > n:
                        break
                total, magic = _HEADER.unpack_from(data, position)
                if magic == BLANK_MAGIC:
                    blank = True
                    break
                if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2 or total <= 0:
                    raise ConsumeQueueError(
                        f"commit-log offset {offset + position}: not a record "
                        f"(magic {magic & 0xFFFFFFFF:#x}); the consume queues are "
                        f"dispatched up to there"
                    )
                if position + total > n:
                    break
                added = one(data, position, total, magic, offset + position)
                if added is not None:
                    touched.add(added)
                position += total
            if blank or not n:
                # The segment's end (a BLANK, or nothing more in it).
                budget -= position + 8
                offset = (offset + position) - (offset + position) % segment_size + segment_size
                continue
            if position == 0:
                # One record longer than what was read (its header checked
                # above): read it whole -- unless it reaches past C{end} (a
                # limit inside a record: the replicas' acknowledged
                # offset): it waits.
                total = _HEADER.unpack_from(data)[0]
                if offset + total > end:
                    waiting = True
                    break
                data = log.read(offset, total)
                if len(data) < total:
                    raise ConsumeQueueError(
                        f"commit-log offset {offset}: a record of {total} bytes "
                        f"reaches past what the log holds"
                    )
                magic = _HEADER.unpack_from(data)[1]
                added = one(data, 0, total, magic, offset)
                if added is not None:
                    touched.add(added)
                position = total
            offset += position
            budget -= position
        self.dispatched = offset
        grown = []
        for queue in touched:
            queue.write_pending()
            grown.append((queue.topic, queue.queue_id, queue.max_offset))
        if grown and self._observers:
            for topic, queue_id, count in grown:
                for observer in list(self._observers):
                    try:
                        observer(topic, queue_id, count)
                    except Exception:
                        self._log.failure("a consume-queue observer failed")
        return not waiting and self.dispatched < end

    def _one(
        self, data: bytes, p: int, total: int, magic: int, offset: int
    ) -> ConsumeQueue | None:
        """
        The unit of the record at C{data[p:p + total]} (commit-log
        C{offset}), added to its queue; C{None} for a record that gets none.
        """
        stamp, topic_bytes, queue_id, queue_offset, code = _record_unit(
            data, p, magic, self._tag_codes
        )
        self.last_timestamp = stamp
        if topic_bytes is None:
            return None
        queue = self._by_raw.get((topic_bytes, queue_id)) or self._queue_for(
            topic_bytes, queue_id
        )
        queue.put(offset, total, code, queue_offset)
        return queue

    def _queue_for(self, topic_bytes: bytes, queue_id: int) -> ConsumeQueue:
        """
        The queue of a record's topic (as stored) and queue id, made if new.
        """
        topic = topic_bytes.decode("utf-8", "replace")
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            queue = self.queues[(topic, queue_id)] = ConsumeQueue(
                os.path.join(self.root, topic, str(queue_id)), topic, queue_id, self.file_size
            )
        self._by_raw[(topic_bytes, queue_id)] = queue
        return queue

    # -- cutting back --

    def truncate(self, log_end: int) -> None:
        """
        The commit log was cut back to C{log_end}: cut every queue's units
        at or past it, and dispatch from there.
        """
        for key, queue in self.queues.items():
            if queue.truncate(log_end):
                self._log.info(
                    "consume queue {topic}/{qid} cut back with the commit log to "
                    "offset {end} (logical end {n})",
                    topic=key[0], qid=key[1], end=log_end, n=queue.max_offset,
                )
        self.dispatched = min(self.dispatched, log_end)
        if self._synced_mark > log_end:
            write_mark(self.mark_path, log_end)
            self._synced_mark = log_end

    # -- reading --

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get((topic, queue_id))
        return 0 if queue is None else queue.max_offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get((topic, queue_id))
        return 0 if queue is None else queue.min_offset(self._log_reader.min_offset)

    def units(self, topic: str, queue_id: int, logical: int, count: int) -> list[Unit]:
        queue = self.queues.get((topic, queue_id))
        return [] if queue is None else queue.units(logical, count)

    def topics(self) -> dict[str, list[int]]:
        """
        Topic to its queue ids, sorted.
        """
        result: dict[str, list[int]] = {}
        for topic, queue_id in sorted(self.queues):
            result.setdefault(topic, []).append(queue_id)
        return result

    def offset_by_time(
        self, topic: str, queue_id: int, timestamp: int, store_timestamp: Callable[[int, int], int]
    ) -> int:
        """
        RocketMQ's C{getOffsetInQueueByTime}: the logical offset of the
        unit whose record's store timestamp equals C{timestamp}, else the
        nearer of its two neighbours in a binary search.  The file is the
        first whose last unit's record is at or after C{timestamp} (RocketMQ
        picks it by the file's modification time: docs/consumequeue.md).

        @param store_timestamp: the store timestamp of the record at
            (offset, size), negative when it is not in the log.
        """
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            return 0
        queue.write_pending()
        if not queue.files or queue.end <= queue.files[0]:
            return 0
        log_min = self._log_reader.min_offset
        files = queue.files
        chosen = files[-1]
        for start in files:
            last = min(start + queue.file_size, queue.end) - UNIT_SIZE
            offset, size, _ = queue.unit_at(last)
            if offset >= log_min and store_timestamp(offset, size) >= timestamp:
                chosen = start
                break
        min_logical = queue.min_offset(log_min) * UNIT_SIZE
        low = min_logical - chosen if min_logical > chosen else 0
        high = min(queue.file_size, queue.end - chosen) - UNIT_SIZE
        target = left = right = -1
        left_value = right_value = -1
        while high >= low:
            mid = (low + high) // (2 * UNIT_SIZE) * UNIT_SIZE
            offset, size, _ = queue.unit_at(chosen + mid)
            if offset < log_min:
                low = mid + UNIT_SIZE
                left = mid
                continue
            stored = store_timestamp(offset, size)
            if stored < 0:
                return 0
            if stored == timestamp:
                target = mid
                break
            if stored > timestamp:
                high = mid - UNIT_SIZE
                right, right_value = mid, stored
            else:
                low = mid + UNIT_SIZE
                left, left_value = mid, stored
        if target != -1:
            found = target
        elif left_value == -1:
            found = right
        elif right_value == -1:
            found = left
        else:
            found = right if abs(timestamp - left_value) > abs(timestamp - right_value) else left
        return (chosen + found) // UNIT_SIZE

    # -- flushing, checkpoint, closing --

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_dir, "checkpoint")

    def _load_checkpoint(self) -> None:
        values = read_checkpoint(self.checkpoint_path)
        if values is not None:
            self.physic_timestamp, self.last_timestamp, _ = values

    @property
    def mark_path(self) -> str:
        return os.path.join(self.store_dir, "rmqha", "cq-dispatched")

    def _read_mark(self) -> int | None:
        try:
            with open(self.mark_path, "rb") as f:
                data = f.read(8)
        except FileNotFoundError:
            return None
        return _I64.unpack(data)[0] if len(data) == 8 else None

    def sync_plan(self, flushed_offset: int) -> Callable[[], None] | None:
        """
        What a flush of the queues does, to run on another thread: the
        C{fdatasync} of every file written since the last plan, then the
        checkpoint's timestamps written and synced (RocketMQ's
        C{FlushConsumeQueueService}).  Everything is taken now, on the
        caller's thread; the plan touches only duplicated descriptors.
        """
        fds: list[int] = []
        for queue in self.queues.values():
            fds.extend(queue.sync_fds())
        if not fds and self._synced_mark == self.dispatched:
            return None
        self._synced_mark = self.dispatched
        if self.dispatched <= flushed_offset:
            self.physic_timestamp = max(self.physic_timestamp, self.last_timestamp)
        page = struct.pack(">qqq", self.physic_timestamp, self.last_timestamp, 0)
        if self._checkpoint_fd is None:
            self._checkpoint_fd = _open_checkpoint(self.checkpoint_path)
        checkpoint = os.dup(self._checkpoint_fd)
        mark = self.dispatched
        mark_path = self.mark_path

        def run() -> None:
            try:
                for fd in fds:
                    os.fdatasync(fd)
                # Every unit before the mark is on disk now.  The mark and
                # the checkpoint are written after that, not synced: a
                # write of theirs lost with the machine leaves older
                # values, which only make the next start re-dispatch more
                # (rmqha from the mark, a genuine broker from the
                # checkpoint's timestamps).
                os.pwrite(checkpoint, page, 0)
                write_mark(mark_path, mark)
            finally:
                for fd in fds:
                    os.close(fd)
                os.close(checkpoint)

        return run

    def close(self, flushed_offset: int) -> None:
        """
        Write what is pending and close the files.  They are synced (and
        the mark moved) only when more than L{CLOSE_SYNC_BYTES} of the log
        were dispatched since the last sync: otherwise the next open
        dispatches that much again from the mark (the units already there
        are skipped), which costs less than a sync of every queue written
        (a store opened and closed for a few puts; a broker's service
        syncs every second anyway).  The checkpoint is written either way.
        """
        if self.dispatched - self._synced_mark > CLOSE_SYNC_BYTES:
            plan = self.sync_plan(flushed_offset)
            if plan is not None:
                plan()
        else:
            for queue in self.queues.values():
                queue.write_pending()
            if self.dispatched <= flushed_offset:
                self.physic_timestamp = max(self.physic_timestamp, self.last_timestamp)
            if self._checkpoint_fd is None:
                self._checkpoint_fd = _open_checkpoint(self.checkpoint_path)
            page = struct.pack(">qqq", self.physic_timestamp, self.last_timestamp, 0)
            os.pwrite(self._checkpoint_fd, page, 0)
        for queue in self.queues.values():
            queue.close()
        if self._checkpoint_fd is not None:
            os.close(self._checkpoint_fd)
            self._checkpoint_fd = None


def _tags_hash(raw: bytes, cache: dict[bytes, int]) -> int:
    """
    The hash of the TAGS property in C{raw} properties (0 without),
    parsed as C{string2messageProperties} would; hashes are cached per
    tag in C{cache}.
    """
    at = raw.find(_TAGS)
    while at > 0 and raw[at - 1] != 2:
        at = raw.find(_TAGS, at + 1)
    if at < 0:
        return 0
    end = raw.find(b"\x02", at)
    if end < 0:
        end = len(raw)
    if raw.find(_TAGS, end) >= 0:
        # TAGS twice (the last one counts, as in a HashMap): the slow way.
        tags = decode_properties(raw).get("TAGS")
        return java_string_hash(tags) if tags else 0
    value = raw[at + 5 : end]
    code = cache.get(value)
    if code is None:
        code = java_string_hash(value.decode("utf-8", "replace")) if value else 0
        if len(cache) >= 4096:
            cache.clear()
        cache[value] = code
    return code


def _record_unit(
    data: "bytes | memoryview", p: int, magic: int, cache: dict[bytes, int]
) -> tuple[int, bytes | None, int, int, int]:
    """
    What the unit of the whole message record at C{data[p:]} needs:
    (store timestamp, topic as stored, queue id, QUEUEOFFSET, tag hash);
    the topic is C{None} for a record that gets no unit (a prepared or
    rolled-back transaction record).  The pure-Python decode
    (C{ConsumeQueues._one}, and L{verify_consume_queues}).
    """
    (_, _, _, queue_id, _, queue_offset, _, sysflag, _) = _HEAD.unpack_from(data, p)
    if not sysflag & 0x30:  # (both hosts IPv4: the common case)
        store_timestamp, body_length = _V4_TAIL.unpack_from(data, p + 56)
        q = p + 88
    else:
        born = 20 if sysflag & 0x10 else 8
        store = 20 if sysflag & 0x20 else 8
        store_timestamp = _I64.unpack_from(data, p + 48 + born)[0]
        q = p + 68 + born + store
        body_length = _I32.unpack_from(data, q)[0]
        q += 4
    if sysflag & SysFlag.TRANSACTION_MASK in _UNCOUNTED:
        return store_timestamp, None, queue_id, queue_offset, 0
    q += body_length
    if magic == MESSAGE_MAGIC_V1:
        topic_length = data[q]
        q += 1
    else:
        topic_length = _I16.unpack_from(data, q)[0]
        q += 2
    topic_bytes = bytes(data[q : q + topic_length])
    q += topic_length
    properties_length = data[q] << 8 | data[q + 1]
    code = 0
    if properties_length:
        raw = bytes(data[q + 2 : q + 2 + properties_length])
        if topic_bytes == _SCHEDULE:
            code = tags_code(SCHEDULE_TOPIC, decode_properties(raw), store_timestamp)
        else:
            code = _tags_hash(raw, cache)
    return store_timestamp, topic_bytes, queue_id, queue_offset, code


def _describes(data: bytes, size: int, topic: str, queue_id: int, logical: int) -> bool:
    """
    Whether C{data} is a whole message record of C{size} bytes for
    C{topic}, C{queue_id}, at queue offset C{logical}.
    """
    if len(data) != size or size < 92:
        return False
    total, magic, _, record_queue, _, queue_offset, _, sysflag, _ = _HEAD.unpack_from(data)
    if total != size or magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
        return False
    if (record_queue, queue_offset) != (queue_id, logical):
        return False
    born = 20 if sysflag & 0x10 else 8
    store = 20 if sysflag & 0x20 else 8
    q = 68 + born + store
    q += 4 + _I32.unpack_from(data, q)[0]
    if q + 2 > size:
        return False
    if magic == MESSAGE_MAGIC_V1:
        length, q = data[q], q + 1
    else:
        length, q = _I16.unpack_from(data, q)[0], q + 2
    return data[q : q + length] == topic.encode("utf-8")


#: What C{store check} and the open say of a file where a queue id
#: directory belongs (C{consumequeue/<topic>/<file>}).  A dispatch step
#: before 2026-11-27 could leave C{consumequeue/0/00000000000000000000}: a
#: segment's BLANK dispatched as a message of topic "" (docs/consumequeue.md).
STRAY_FILE = (
    "a file where a queue id directory belongs, not a consume queue (left alone; "
    "consumequeue/0/00000000000000000000 is what a dispatch of a BLANK as a message "
    "left before 2026-11-27: safe to delete)"
)


def _existing_units(root: str) -> int | None:
    """
    The units per file of the first consume-queue file under C{root}.
    """
    try:
        topics = sorted(os.listdir(root))
    except FileNotFoundError:
        return None
    for topic in topics:
        topic_dir = os.path.join(root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for queue_id in sorted(os.listdir(topic_dir)):
            queue_dir = os.path.join(topic_dir, queue_id)
            if not os.path.isdir(queue_dir):
                continue
            for name in sorted(os.listdir(queue_dir)):
                size = os.path.getsize(os.path.join(queue_dir, name))
                if size > 0 and size % UNIT_SIZE == 0:
                    return size // UNIT_SIZE
    return None


def write_mark(path: str, offset: int) -> None:
    """
    Write the dispatch mark (C{<store>/rmqha/cq-dispatched}, one int64):
    every whole record before C{offset} has its unit written (on disk, if
    the units were synced before).  Written in place, not synced: a lost
    write leaves an older, lower mark, which is safe.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, flags, 0o644)
    try:
        os.pwrite(fd, _I64.pack(offset), 0)
    finally:
        os.close(fd)


def _open_checkpoint(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    if os.fstat(fd).st_size < CHECKPOINT_SIZE:
        os.ftruncate(fd, CHECKPOINT_SIZE)
    return fd


def read_checkpoint(path: str) -> tuple[int, int, int] | None:
    """
    The checkpoint's (physicMsgTimestamp, logicsMsgTimestamp,
    indexMsgTimestamp), or C{None} when there is no such file.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(24)
    except FileNotFoundError:
        return None
    if len(data) < 24:
        return None
    physic, logics, index = struct.unpack(">qqq", data)
    return physic, logics, index


# -- store check ------------------------------------------------------------------

#: How many commit-log bytes L{verify_consume_queues} decodes at a time.
CHECK_CHUNK = 8 * 1024 * 1024

#: One queue's units of consecutive records, as C{_speedups.cq_units}
#: returns them: (topic as stored, queue id, first QUEUEOFFSET, whether
#: each QUEUEOFFSET is one more than the one before, the 20-byte units,
#: the QUEUEOFFSETs as int64 each).
_Group = tuple[bytes, int, int, bool, bytes, bytes]


def _units_py(
    data: "bytes | memoryview", pos: int, size: int, base: int, cache: dict[bytes, int]
) -> tuple[list[_Group], int]:
    """
    C{_speedups.cq_units} in Python, for every record it reads: the units
    of the whole message records in a row from C{data[pos:size]} grouped
    per queue (any topic, any tags); stops at a BLANK, bytes that are not
    a record, or a record not whole in C{data[:size]}.

    @return: the groups and where it stopped.
    """
    groups: dict[tuple[bytes, int], _GroupBuild] = {}
    pack, pack_offset = _UNIT.pack, _I64.pack
    while pos + 8 <= size:
        total, magic = _HEADER.unpack_from(data, pos)
        if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2 or total <= 0:
            break
        if pos + total > size:
            break
        _, topic, queue_id, queue_offset, code = _record_unit(data, pos, magic, cache)
        if topic is not None:
            group = groups.get((topic, queue_id))
            if group is None:
                group = groups[(topic, queue_id)] = _GroupBuild(queue_offset, True, queue_offset, [], [])
            elif queue_offset != group.last + 1:
                group.consecutive = False
            group.last = queue_offset
            group.units.append(pack(base + pos, total, code))
            group.offsets.append(pack_offset(queue_offset))
        pos += total
    return [
        (topic, queue_id, g.first, g.consecutive, b"".join(g.units), b"".join(g.offsets))
        for (topic, queue_id), g in groups.items()
    ], pos


@dataclass(slots=True)
class _GroupBuild:
    """
    A L{_Group} being built by L{_units_py}.
    """

    first: int
    consecutive: bool
    last: int
    units: list[bytes]
    offsets: list[bytes]


#: Findings reported per queue by C{rmqha store check}; the rest of a
#: queue's are counted in one line (a queue missing or from another log
#: would otherwise print a line per record).
PER_QUEUE_FINDINGS = 10


class _Reporter:
    """A queue's findings, at most L{PER_QUEUE_FINDINGS} of them reported."""

    def __init__(self, files: "_QueueFiles", found: list[tuple[int, str]]) -> None:
        self.files = files
        self.found = found

    def append(self, item: tuple[int, str]) -> None:
        files = self.files
        if files.reported < PER_QUEUE_FINDINGS:
            files.reported += 1
            self.found.append(item)
        else:
            files.more += 1


class _QueueFiles:
    """
    Read-only access to one queue's units for L{verify_consume_queues}.
    """

    def __init__(self, directory: str, topic: str, queue_id: int, file_size: int) -> None:
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self._fds: dict[int, int] = {}
        #: Why this queue cannot be read (its directory or a file), once
        #: known: its units are not checked further.
        self.unreadable: str | None = None
        #: Findings reported, and those past L{PER_QUEUE_FINDINGS} counted.
        self.reported = 0
        self.more = 0
        self.said = False
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            names = []
        except OSError as e:
            names = []
            self.unreadable = f"{directory}: {e.strerror or e}"
        self.starts = sorted(int(n) for n in names if len(n) == 20 and n.isdigit())
        self._known = set(self.starts)
        self.checked = -1  # the highest queue offset compared with a record

    def path(self, start: int) -> str:
        return os.path.join(self.directory, segment_name(start))

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            fd = self._fds[start] = os.open(self.path(start), os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _pread(self, start: int, n: int, at: int) -> bytes | None:
        # (An unreadable file: said once, by the check, as a finding.)
        try:
            return os.pread(self._fd(start), n, at)
        except OSError as e:
            self.unreadable = f"{self.path(start)}: {e.strerror or e}"
            return None

    def read(self, position: int, length: int) -> bytes | None:
        """
        The C{length} bytes of units from logical byte C{position}, or
        C{None} when a file they fall in is missing or short.
        """
        parts = []
        while length > 0:
            start = position - position % self.file_size
            if start not in self._known:
                return None
            n = min(length, start + self.file_size - position)
            data = self._pread(start, n, position - start)
            if data is None or len(data) < n:
                return None
            parts.append(data)
            position += n
            length -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def unit(self, logical: int) -> tuple[str, int, tuple[int, int, int] | None]:
        """
        (file, unit index in it, the unit or C{None}: no such file).
        """
        position = logical * UNIT_SIZE
        start = position - position % self.file_size
        index = (position - start) // UNIT_SIZE
        if start not in self._known:
            return self.path(start), index, None
        data = self._pread(start, UNIT_SIZE, position - start)
        if data is None or len(data) < UNIT_SIZE:
            return self.path(start), index, None
        offset, size, code = _UNIT.unpack(data)
        return self.path(start), index, (offset, size, code)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def verify_consume_queues(log: "CommitLog", limit: int = 1000) -> list[str]:
    """
    Check the consume queues against the log (C{rmqha store check}): every
    unit points at a record of its topic and queue with the right size and
    tag hash, and every dispatchable record (not a prepared or rolled-back
    transaction record) has its unit at its QUEUEOFFSET.  Read-only.

    The units the log calls for are built as dispatch builds them
    (C{_speedups.cq_units}, else L{_units_py}), a chunk of the log at a
    time, and compared with the queue files' bytes, one comparison per
    queue per chunk; only a queue whose bytes differ is looked at unit by
    unit, to say which unit and why.

    On a store a broker has open (or that it left after a crash: the
    C{abort} marker), records at or after the dispatch mark
    (C{rmqha/cq-dispatched}) may not have their unit yet, and units may
    point past the end this check read: neither is a finding.  After a
    clean close every record has its unit.

    @return: one line per finding (at most C{limit}), naming the file and
        the unit, in commit-log order.
    @raise ConsumeQueueError: bytes in the log that are not a record.
    """
    return _verify(log.store_dir, log._segments, log.max_offset, limit)


def verify_store_queues(store_dir: str, end: int, limit: int = 1000) -> list[str]:
    """
    L{verify_consume_queues} on a store that is not open here, its log
    sound up to C{end}: the segments are mapped as they are, without
    opening the log (whose recovery would walk its records once more).
    (C{rmqha store check} feeds a L{QueueCheck} from its own walk instead.)
    """
    segments, _, _ = _load_segments(os.path.join(store_dir, "commitlog"), None, writable=False)
    try:
        return _verify(store_dir, segments, end, limit)
    finally:
        for segment in segments:
            segment.close()


def _verify(store_dir: str, segments: "Sequence[_Segment]", log_end: int, limit: int) -> list[str]:
    """
    The queues of C{store_dir} against C{segments} up to C{log_end}, read
    L{CHECK_CHUNK} bytes at a time.
    """
    check = QueueCheck(store_dir, limit)
    index = 0
    offset = segments[0].start if segments else 0
    try:
        while offset < log_end and not check.full:
            while segments[index].start + segments[index].size <= offset:
                index += 1
            segment = segments[index]
            at = offset - segment.start
            upto = min(segment.size, at + CHECK_CHUNK, log_end - segment.start)
            position, blank = check.feed(segment.mm, at, upto, segment.start, strict=True)
            _drop_pages(segment.mm, at, upto)  # (the RSS stays flat)
            if not blank and upto - at >= 8 and position == 0:
                # One record longer than a chunk: read it whole.
                total = _HEADER.unpack_from(segment.mm, at)[0]
                upto = min(segment.size, at + total, log_end - segment.start)
                if upto - at < total:
                    raise ConsumeQueueError(
                        f"commit-log offset {offset}: a record of {total} bytes "
                        f"reaches past what the log holds"
                    )
                position, blank = check.feed(segment.mm, at, upto, segment.start, strict=True)
                _drop_pages(segment.mm, at, upto)
            if blank or upto - at < 8:
                # The segment's end (a BLANK, or nothing more in it).
                offset = segment.start + segment.size
            else:
                offset += position
        return check.finish(log_end)
    finally:
        check.close()


class QueueCheck:
    """
    The consume queues of a store against its log's records, fed whole
    records a stretch at a time in log order (L{feed}): the units each
    stretch calls for are built per queue (C{_speedups.cq_units}, else
    L{_units_py}) and compared with the queue files' bytes, one comparison
    per queue per stretch; only a queue whose bytes differ is looked at
    unit by unit.  C{rmqha store check} feeds it from the record check's
    own walk (C{verify_store(on_block=...)}), while each block is still in
    memory; L{verify_consume_queues} from the log.
    """

    def __init__(self, store_dir: str, limit: int = 1000) -> None:
        self.root = os.path.join(store_dir, "consumequeue")
        self.limit = limit
        self.mark: int | None = None
        if os.path.exists(os.path.join(store_dir, "abort")):
            # Open (or it crashed): dispatch may not have reached the end.
            try:
                with open(os.path.join(store_dir, "rmqha", "cq-dispatched"), "rb") as f:
                    data = f.read(8)
                self.mark = _I64.unpack(data)[0] if len(data) == 8 else 0
            except FileNotFoundError:
                self.mark = 0
        self.file_size = (_existing_units(self.root) or DEFAULT_UNITS_PER_FILE) * UNIT_SIZE
        self.queues: dict[tuple[str, int], _QueueFiles] = {}
        self._by_raw: dict[tuple[bytes, int], _QueueFiles] = {}
        self.findings: list[str] = []
        self._found: list[tuple[int, str]] = []  # (commit-log offset, line) of a stretch
        self._cache: dict[bytes, int] = {}
        self._scan = getattr(_codec._accel, "cq_units", None)
        # (Files where a queue id directory belongs: not queues, named.)
        self._strays: list[str] = []
        if os.path.isdir(self.root):
            for topic in sorted(os.listdir(self.root)):
                if os.path.isdir(os.path.join(self.root, topic)):
                    for name in sorted(os.listdir(os.path.join(self.root, topic))):
                        path = os.path.join(self.root, topic, name)
                        if name.isdigit() and str(int(name)) == name:
                            # (A queue id; a file there is found unreadable.)
                            self._files_of(topic, int(name))
                        elif not os.path.isdir(path):
                            self._strays.append(path)

    @property
    def full(self) -> bool:
        return len(self.findings) >= self.limit

    def _files_of(self, topic: str, queue_id: int) -> _QueueFiles:
        key = (topic, queue_id)
        files = self.queues.get(key)
        if files is None:
            files = self.queues[key] = _QueueFiles(
                os.path.join(self.root, topic, str(queue_id)), topic, queue_id, self.file_size
            )
        return files

    def feed(
        self, mm: "mmap.mmap | bytes", start: int, end: int, base: int, strict: bool = False
    ) -> tuple[int, bool]:
        """
        Check the units of the records in C{mm[start:end]} (C{base}: the
        commit-log offset of C{mm[0]}).

        @param strict: bytes that are not a record raise
            L{ConsumeQueueError}; otherwise the stretch ends there (the
            record check names them).
        @return: where the records stopped (relative to C{start}: a
            record not whole before C{end}, a BLANK, or other bytes), and
            whether at a BLANK.
        """
        if self.full:
            return end - start, False
        view = memoryview(mm)[start:end]
        try:
            position, blank = self._walk(view, len(view), base + start, strict)
        finally:
            view.release()
        found = self._found
        if found:
            found.sort()
            self.findings.extend(line for _, line in found[: self.limit - len(self.findings)])
            found.clear()
        return position, blank

    def _walk(
        self, data: memoryview, n: int, base: int, strict: bool
    ) -> tuple[int, bool]:
        # The records in data[:n] (base: its commit-log offset): where the
        # walk stopped, and whether at a BLANK.
        scan = self._scan
        compare = self._compare
        position = 0
        while position + 8 <= n:
            if scan is not None:
                groups, position, _ = scan(data, position, n, base)
                compare(groups)
                if position + 8 > n:
                    break
            total, magic = _HEADER.unpack_from(data, position)
            if magic == BLANK_MAGIC:
                return position, True
            if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2 or total <= 0:
                if not strict:
                    break
                raise ConsumeQueueError(
                    f"commit-log offset {base + position}: not a record "
                    f"(magic {magic & 0xFFFFFFFF:#x})"
                )
            if position + total > n:
                break
            # What the compiled decode leaves (the schedule topic, TAGS
            # twice, non-ASCII tags): one record; everything without it.
            groups, position = _units_py(
                data, position, n if scan is None else position + total, base, self._cache
            )
            compare(groups)
        return position, False

    def _compare(self, groups: list[_Group]) -> None:
        by_raw = self._by_raw
        for topic_bytes, queue_id, first, consecutive, units, offsets in groups:
            files = by_raw.get((topic_bytes, queue_id))
            if files is None:
                topic = topic_bytes.decode("utf-8", "replace")
                files = by_raw[(topic_bytes, queue_id)] = self._files_of(topic, queue_id)
            if files.unreadable is None:
                if consecutive and files.read(first * UNIT_SIZE, len(units)) == units:
                    last = first + len(units) // UNIT_SIZE - 1
                    if last > files.checked:
                        files.checked = last
                elif files.unreadable is None:
                    self._explain(files, units, offsets)
            if files.unreadable is not None and not files.said:
                files.said = True
                self._found.append((_UNIT.unpack_from(units, 0)[0] if units else 0,
                    f"{files.unreadable}: unreadable; the units of {files.topic} queue "
                    f"{files.queue_id} are not checked"
                ))

    def _explain(self, files: _QueueFiles, units: bytes, offsets: bytes) -> None:
        # Unit by unit (a queue whose bytes differ from what the log calls for).
        topic, queue_id, mark = files.topic, files.queue_id, self.mark
        found = _Reporter(files, self._found)
        for i in range(0, len(units) // UNIT_SIZE):
            offset, size, code = _UNIT.unpack_from(units, i * UNIT_SIZE)
            n = _I64.unpack_from(offsets, i * 8)[0]
            if n > files.checked:
                files.checked = n
            path, index, unit = files.unit(n)
            where = f"{path} unit {index} (queue offset {n})"
            if unit is None or unit[0] < 0 or unit[1] <= 0 or unit == (0, 0, 0):
                if mark is not None and offset >= mark:
                    continue  # (not dispatched yet when the mark was synced)
                found.append((offset,
                    f"record at commit-log offset {offset} ({topic}, queue "
                    f"{queue_id}, queue offset {n}) has no unit: {path} unit {index}"
                ))
            elif unit[0] != offset:
                found.append((offset,
                    f"{where}: points at commit-log offset {unit[0]}, but the "
                    f"record with this queue offset is at {offset}"
                ))
            elif unit[1] != size:
                found.append((offset,
                    f"{where}: size {unit[1]}, but the record at commit-log offset "
                    f"{offset} is {size} bytes"
                ))
            elif unit[2] != code:
                found.append((offset,
                    f"{where}: tag hash {unit[2]}, but the record at commit-log "
                    f"offset {offset} hashes to {code}"
                ))

    def finish(self, log_end: int) -> list[str]:
        """
        After the last record (the log ends at C{log_end}): the units after
        each queue's last record, which must point at nothing.

        @return: one line per finding (at most the limit), in commit-log
            order, then the queues'.
        """
        for path in self._strays:
            if not self.full:
                self.findings.append(f"{path}: {STRAY_FILE}")
        for (topic, queue_id), files in sorted(self.queues.items()):
            if files.more and not self.full:
                self.findings.append(
                    f"... and {files.more} more finding(s) in {topic} queue {queue_id} "
                    f"({files.directory})"
                )
            if not files.starts or self.full or files.unreadable is not None:
                continue
            n = files.checked + 1
            path, index, unit = files.unit(n)
            if unit is not None and 0 <= unit[0] < log_end and unit[1] > 0:
                self.findings.append(
                    f"{path} unit {index} (queue offset {n}): points at commit-log "
                    f"offset {unit[0]}, but {topic} queue {queue_id} has no record "
                    f"with this queue offset in the log"
                )
        return self.findings

    def close(self) -> None:
        for files in self.queues.values():
            files.close()
