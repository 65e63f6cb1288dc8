# -*- test-case-name: tests.test_commitlog,tests.test_recovery -*-
"""
A commit log laid out on disk exactly like Apache RocketMQ 4.9's.

::

    <store>/commitlog/00000000000000000000     segment files, each exactly
    <store>/commitlog/00000000001073741824     segment_size bytes, named by
    ...                                         their 20-digit start offset
    <store>/abort                               present while open: its
                                                presence at open means the
                                                last shutdown was not clean
    <store>/lock                                POSIX lock held while open
    <store>/rmqha/                              rmqha's own files (queue
                                                offset snapshot, segments
                                                moved aside by recovery)

Three ways in:

  - the put path (L{CommitLog.put}) encodes a message as a v1 record at the
    end of the log, writing a BLANK filler and rolling to a new segment
    when the record (plus room for a filler) does not fit;
  - the replica path (L{CommitLog.append_at}) copies raw bytes a master sent
    at exactly the offset they belong at;
  - the transfer read path (L{CommitLog.read}) hands out bytes from an
    offset, never crossing a segment.

Everything runs on the caller's thread; the only thing meant to run on
another thread is L{FlushPlan.execute} (an C{fdatasync}), see
L{rmqha.store.service}.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import json
import mmap
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, NoReturn, Sequence, Union

from twisted.logger import Logger

from rmqha._files import write_atomically
from rmqha.store._record import (
    BLANK_MAGIC,
    DEFAULT_MAX_MESSAGE_SIZE,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE as _MIN_RECORD,
    END_FILE_MIN_BLANK_LENGTH,
    Blank,
    Host,
    Message,
    MessageRejected,
    Record,
    RecordEncoder,
    RecordError,
    SysFlag,
    encode_blank,
    offset_msg_id,
    parse_record,
    record_starts,
)

__all__ = [
    "CommitLog",
    "Message",
    "Record",
    "Blank",
    "MessageRejected",
    "RecordError",
    "CorruptReplicaError",
    "FlushDiskType",
    "FlushPlan",
    "AppendResult",
    "RecoveryReport",
    "VerifyReport",
    "verify_store",
    "StoreError",
    "StoreLockedError",
    "CorruptStoreError",
    "CorruptRecordError",
    "Damage",
    "RepairReport",
    "repair_store",
    "OffsetMismatchError",
    "OffsetOutOfRangeError",
    "ReadOnlyStoreError",
    "SegmentCreateError",
    "DEFAULT_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "MAX_SEGMENT_SIZE",
    "segment_name",
]

#: RocketMQ's C{mappedFileSizeCommitLog} default.
DEFAULT_SEGMENT_SIZE = 1024 * 1024 * 1024
#: Small enough for tests, large enough for one minimal record and a BLANK.
MIN_SEGMENT_SIZE = 256
#: A BLANK filler's size is an int32, so a segment cannot be larger.
MAX_SEGMENT_SIZE = 0x7FFFFFFF

_BLANK_HEADER = struct.Struct(">ii")
# BODYCRC, PHYSICALOFFSET and SYSFLAG of a record, from its start.
_CHECKED = struct.Struct(">8xi16xqi")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_V6_HOSTS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
# Where BODYLENGTH sits with IPv4 hosts (each IPv6 host adds 12 bytes).
_BODY_LENGTH_AT = 48 + 8 + 8 + 8 + 4 + 8
_UNCOUNTED = (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE)
_SEGMENT_NAME = re.compile(r"[0-9]{20}\Z")
_PAGE = mmap.PAGESIZE
_ZERO_CHUNK = bytes(1 << 20)


def segment_name(start: int) -> str:
    """
    The file name of the segment starting at C{start}: 20 zero-padded digits.
    """
    return f"{start:020d}"


class StoreError(Exception):
    """
    Base class of every error the store raises about itself.
    """


class StoreLockedError(StoreError):
    """
    Another process holds the store open for writing.
    """


class CorruptStoreError(StoreError):
    """
    The store's files are not a commit log this code can open.
    """


class ReadOnlyStoreError(StoreError):
    """
    A write was attempted on a store opened read-only.
    """


class CorruptReplicaError(StoreError):
    """
    A replicated record failed validation (its size, magic, offset field or
    body CRC); the log was cut back to the record's start.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(
            f"replicated record at offset {offset} is corrupt ({reason}); cut back "
            f"to offset {offset}"
        )
        self.offset = offset
        self.reason = reason


class OffsetMismatchError(StoreError):
    """
    Replica bytes were offered at an offset other than the end of the log.
    """

    def __init__(self, expected: int, offered: int, why: str | None = None) -> None:
        super().__init__(
            f"replica append at offset {offered} refused: "
            + (why or f"the commit log ends at offset {expected}")
        )
        self.expected = expected
        self.offered = offered


class OffsetOutOfRangeError(StoreError):
    """
    A read asked for an offset the log does not hold.
    """

    def __init__(self, offset: int, min_offset: int, max_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the commit log "
            f"[{min_offset}, {max_offset}]"
        )
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset


class SegmentCreateError(OSError):
    """
    A put needed the next segment and it could not be made (the disk is
    full, most likely: C{errno} says).  Nothing of the put was written; the
    log takes the next put at the same offset.
    """


class FlushDiskType(enum.Enum):
    """
    RocketMQ's C{flushDiskType}.
    """

    #: A periodic flush (see L{rmqha.store.service.CommitLogService}).
    ASYNC_FLUSH = "ASYNC_FLUSH"
    #: Every put and append is on disk before it returns.
    SYNC_FLUSH = "SYNC_FLUSH"


class AppendResult(NamedTuple):
    """
    Where a put landed.
    """

    offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    store_host: Host

    @property
    def next_offset(self) -> int:
        return self.offset + self.size

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.offset)


@dataclass
class RecoveryReport:
    """
    What opening the store found and did.

    @ivar clean_shutdown: no C{abort} marker was found.
    @ivar walk_from: where the record walk started (start of the
        third-to-last segment).
    @ivar end_offset: the recovered max offset.
    @ivar stop_reason: why the walk stopped short of a BLANK-terminated or
        zero-filled end, or C{None} when it ended cleanly.
    @ivar torn: whether bytes after C{end_offset} in its segment were not
        zero (and were quarantined and zeroed, unless read-only).
    @ivar dropped_segments: segment files past the end: all-zero ones
        deleted, others moved into C{<store>/rmqha/quarantine/} (or,
        read-only, merely ignored).
    @ivar quarantined: the files recovery wrote or moved into
        C{<store>/rmqha/quarantine/}, each with a C{.json} sidecar.
    @ivar corruption: a bad record with valid records after it (the one
        line L{CorruptRecordError} says), found read-only or cut by
        C{truncate_corrupt}; a read-write open without that raises.
    @ivar truncated_corrupt: C{truncate_corrupt} cut such a record.
    @ivar records: records verified by the walk.
    @ivar unfinished_segment: the name of a last segment file whose creation
        was interrupted (shorter than a segment, only zeros), removed (or,
        read-only, ignored).
    """

    clean_shutdown: bool
    walk_from: int
    end_offset: int
    stop_reason: str | None = None
    torn: bool = False
    dropped_segments: list[str] = field(default_factory=list)
    records: int = 0
    unfinished_segment: str | None = None
    quarantined: list[str] = field(default_factory=list)
    corruption: str | None = None
    truncated_corrupt: bool = False


class _Segment:
    """
    One segment file, mapped lazily.

    @ivar wrote: bytes of the segment holding data (RocketMQ's wrote
        position); the segment is full when it equals C{size}.
    """

    __slots__ = ("start", "path", "size", "wrote", "writable", "fd", "_mm")

    def __init__(self, start: int, path: str, size: int, writable: bool) -> None:
        self.start = start
        self.path = path
        self.size = size
        self.wrote = 0
        self.writable = writable
        self.fd: int | None = None
        self._mm: mmap.mmap | None = None

    @property
    def mm(self) -> mmap.mmap:
        if self._mm is None:
            # The segment's descriptor, opened here if need be: a second one
            # would leak (one descriptor per segment for ever).
            fd = self.ensure_fd()
            self._mm = mmap.mmap(
                fd,
                self.size,
                access=mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ,
            )
            if not self.writable:
                self.close_fd()
        return self._mm

    @property
    def end(self) -> int:
        return self.start + self.wrote

    def ensure_fd(self) -> int:
        if self.fd is None:
            flags = os.O_RDWR if self.writable else os.O_RDONLY
            self.fd = os.open(self.path, flags | getattr(os, "O_CLOEXEC", 0))
        return self.fd

    def pread(self, position: int, size: int) -> bytes:
        fd = self.ensure_fd()
        data = os.pread(fd, size, position)
        while len(data) < size:  # short reads are allowed; finish the job
            more = os.pread(fd, size - len(data), position + len(data))
            if not more:
                raise OSError(f"{self.path}: unexpected end of file at {position + len(data)}")
            data += more
        return data

    def pwrite(self, position: int, data: memoryview) -> None:
        fd = self.ensure_fd()
        while data:
            written = os.pwrite(fd, data, position)
            position += written
            data = data[written:]

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release_mapping(self) -> None:
        """
        Unmap (the descriptor stays open for flushes and preads).  A full
        segment is only read with C{pread} after this; keeping its pages
        mapped would count every byte ever put towards the process's RSS.
        """
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                return  # a read_view of it is still alive; unmapped later
            self._mm = None

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self.close_fd()


@dataclass
class FlushPlan:
    """
    One flush: C{fdatasync} these descriptors and everything up to C{target}
    is on disk.  L{execute} may run on a worker thread; the rest of the
    store must only be touched from the thread that owns it.
    """

    target: int
    fds: list[int]

    def execute(self) -> None:
        for fd in self.fds:
            os.fdatasync(fd)


class CommitLog:
    """
    A RocketMQ-compatible commit log.  Use L{CommitLog.open}.
    """

    _log = Logger()

    def __init__(
        self,
        store_dir: str,
        commitlog_dir: str,
        segment_size: int,
        segments: list[_Segment],
        read_only: bool,
        encoder: RecordEncoder,
        flush_disk_type: FlushDiskType,
        clock: Callable[[], float],
        lock_fd: int | None,
        recovery: RecoveryReport,
    ) -> None:
        self.store_dir = store_dir
        self.commitlog_dir = commitlog_dir
        self.segment_size = segment_size
        self.read_only = read_only
        self.flush_disk_type = flush_disk_type
        self.recovery = recovery
        self._segments = segments
        self._encoder = encoder
        self._clock = clock
        self._lock_fd = lock_fd
        self._flushed = self.max_offset
        self._sync_flush = flush_disk_type is FlushDiskType.SYNC_FLUSH
        #: With SYNC_FLUSH, whether put and append_at flush before they
        #: return.  A service doing group commit (one flush for many puts,
        #: off the caller's thread) turns this off and owns the guarantee.
        self.sync_flush_inline = True
        # Where the next put may go without L{_prepare_put}'s checks; -1
        # after anything else changed the log.
        self._put_ready_at = -1
        # Every byte before this is whole records (and BLANKs); a replica's
        # bytes after it are a record still arriving.
        self._record_end = self.max_offset
        self._flushes_in_flight = 0
        self._closed = False
        # (topic, queue id) -> next queue offset, accurate for the records
        # before _queue_table_end; built when the first put needs it.
        self._queue_table: dict[tuple[str, int], int] | None = None
        self._queue_table_end = -1
        # Offset of the last record the table has seen, for its snapshot.
        self._last_put: int | None = None

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(
        cls,
        store_dir: str,
        *,
        segment_size: int | None = None,
        read_only: bool = False,
        commitlog_dir: str | None = None,
        check_crc: bool = True,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        store_host: Host = ("127.0.0.1", 10911),
        flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH,
        clock: Callable[[], float] = time.time,
        truncate_corrupt: bool = False,
    ) -> "CommitLog":
        """
        Open (creating, unless C{read_only}) the store at C{store_dir} and
        recover its tail.

        @param segment_size: the size of a segment; an existing store's files
            decide it, and a different value here is an error.  C{None}
            means "whatever the files say", or L{DEFAULT_SEGMENT_SIZE} for a
            new store.
        @param read_only: inspect without modifying anything: no lock, no
            C{abort} marker, no truncation, no zeroing, no file moved.
        @param commitlog_dir: RocketMQ's C{storePathCommitLog}; defaults to
            C{<store_dir>/commitlog}.
        @param check_crc: verify body CRCs while recovering
            (RocketMQ's C{checkCRCOnRecover}).
        @param clock: seconds since the epoch, for store timestamps (pass
            C{reactor.seconds}).
        @param truncate_corrupt: when recovery finds a bad record with
            valid records after it, cut the log there anyway (everything
            cut is quarantined first) instead of raising
            L{CorruptRecordError}.  The operator's escape hatch.

        @raise CorruptRecordError: a bad record with valid records after
            it; nothing on disk was changed.
        """
        if segment_size is not None:
            _check_segment_size(segment_size)
        if not isinstance(max_message_size, int) or max_message_size < 0:
            raise ValueError(f"max_message_size {max_message_size!r} is not a size")
        store_dir = os.path.abspath(store_dir)
        commitlog_dir = os.path.abspath(
            commitlog_dir or os.path.join(store_dir, "commitlog")
        )
        encoder = RecordEncoder(store_host, max_message_size)
        if read_only:
            if not os.path.isdir(commitlog_dir):
                raise StoreError(f"{commitlog_dir}: no such commit log directory")
            lock_fd = None
        else:
            os.makedirs(commitlog_dir, exist_ok=True)
            lock_fd = _lock(os.path.join(store_dir, "lock"))
        try:
            abort_path = os.path.join(store_dir, "abort")
            clean = not os.path.exists(abort_path)
            segments, segment_size, unfinished = _load_segments(
                commitlog_dir, segment_size, writable=not read_only
            )
            try:
                recovery = _recover(
                    store_dir, segments, clean, check_crc, read_only,
                    truncate_corrupt, clock,
                )
            except BaseException:
                for segment in segments:
                    segment.close()
                raise
            if unfinished is not None:
                # Nothing in it; the log creates it again when it needs it.
                recovery.unfinished_segment = os.path.basename(unfinished)
                if not read_only:
                    os.unlink(unfinished)
                    _fsync_dir(commitlog_dir)
            # Recovery read the tail through mappings; let them go (they
            # come back when needed) so that an open store does not hold
            # the pages it read as its own memory.
            for segment in segments:
                segment.close()
            if not read_only:
                with open(abort_path, "wb"):
                    pass
                _fsync_dir(store_dir)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        self = cls(
            store_dir,
            commitlog_dir,
            segment_size,
            segments,
            read_only,
            encoder,
            flush_disk_type,
            clock,
            lock_fd,
            recovery,
        )
        if not recovery.clean_shutdown or recovery.stop_reason:
            self._log.warn(
                "commit log {dir} recovered to offset {end} "
                "(clean shutdown: {clean}; stopped because: {reason}; "
                "dropped segments: {dropped})",
                dir=commitlog_dir,
                end=recovery.end_offset,
                clean=recovery.clean_shutdown,
                reason=recovery.stop_reason or "end of data",
                dropped=recovery.dropped_segments or "none",
            )
        if recovery.corruption is not None:
            self._log.error(
                "commit log {dir}: {corruption}{what}",
                dir=commitlog_dir,
                corruption=recovery.corruption,
                what=" (cut by --truncate-corrupt)" if recovery.truncated_corrupt else "",
            )
        for path in recovery.quarantined:
            self._log.warn("commit log {dir}: kept what recovery cut in {path}",
                           dir=commitlog_dir, path=path)
        if recovery.unfinished_segment is not None:
            self._log.warn(
                "commit log {dir}: segment file {name} was never finished (shorter "
                "than {size} bytes, only zeros: its creation was interrupted); "
                "{what}",
                dir=commitlog_dir,
                name=recovery.unfinished_segment,
                size=segment_size,
                what="ignored" if read_only else "removed, it held nothing",
            )
        return self

    # -- offsets -----------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """
        The start of the oldest segment (0 for an empty store).
        """
        return self._segments[0].start if self._segments else 0

    @property
    def max_offset(self) -> int:
        """
        The offset one past the last byte written.
        """
        return self._segments[-1].end if self._segments else 0

    @property
    def flushed_offset(self) -> int:
        """
        Everything before this offset is on disk.
        """
        return self._flushed

    @property
    def segments(self) -> list[tuple[str, int, int]]:
        """
        C{(file name, start offset, bytes written)} for every segment.
        """
        return [(os.path.basename(s.path), s.start, s.wrote) for s in self._segments]

    # -- the put path ------------------------------------------------------

    def put(self, message: Message) -> AppendResult:
        """
        Append C{message} as a v1 record at the end of the log.

        @raise MessageRejected: the message breaks a limit (named in the
            text); nothing is written.
        """
        return self.put_batch((message,))[0]

    def put_batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        """
        Append C{messages} as consecutive records (RocketMQ's batch put,
        C{asyncPutMessages}): like RocketMQ, a batch never straddles two
        segments: if it does not fit in what is left of the current one,
        the BLANK filler goes first and the whole batch starts the next.
        All or nothing; under C{SYNC_FLUSH} one flush serves the batch.

        @raise MessageRejected: a message breaks a limit (named in the
            text), or the batch cannot fit even an empty segment; nothing
            is written.
        """
        segments = self._segments
        segment = segments[-1] if segments else None
        if segment is None or segment.start + segment.wrote != self._put_ready_at:
            segment = self._prepare_put()
        store_timestamp = int(self._clock() * 1000)
        results = self._encode_batch(segment, messages, store_timestamp)
        if results is None:
            # Does not fit: check every message before writing the BLANK
            # and a new segment, so a refused batch leaves no trace.
            size = self._batch_size(messages, store_timestamp)
            if segment is not None and segment.wrote == 0 or size > (
                self.segment_size - END_FILE_MIN_BLANK_LENGTH
            ):
                raise MessageRejected(
                    f"{'batch' if len(messages) > 1 else 'record'} of {size} "
                    "bytes (plus an 8-byte BLANK filler) does not fit in a "
                    f"segment of {self.segment_size} bytes"
                )
            try:
                segment = self._roll()
            except OSError as e:
                # RocketMQ's CREATE_MAPEDFILE_FAILED.  What _roll did before
                # failing (a BLANK closing the full segment) is a valid log.
                raise SegmentCreateError(
                    e.errno,
                    f"cannot create the commit-log segment "
                    f"{segment_name(self.max_offset)}: {e.strerror or e}",
                ) from e
            results = self._encode_batch(segment, messages, store_timestamp)
            assert results is not None
        if not results:
            return results
        end = results[-1].offset + results[-1].size
        segment.wrote = end - segment.start  # type: ignore[union-attr]
        self._put_ready_at = self._record_end = self._queue_table_end = end
        self._last_put = results[-1].offset
        if self._sync_flush and self.sync_flush_inline:
            self.flush()
        return results

    def _encode_batch(
        self,
        segment: _Segment | None,
        messages: Sequence[Message],
        store_timestamp: int,
    ) -> list[AppendResult] | None:
        """
        Encode C{messages} from the end of C{segment}, assigning queue
        offsets; C{None} (with nothing written and the queue table as it
        was) if they do not all fit.
        """
        table = self._queue_table
        assert table is not None
        encode = self._encoder.encode
        store_host = self._encoder.store_host
        if segment is None:
            mm, start, first, limit = None, 0, 0, -1
        else:
            mm, start, first = segment.mm, segment.start, segment.wrote
            # Records go in only if they leave room for a BLANK filler.
            limit = segment.size - END_FILE_MIN_BLANK_LENGTH
        position = first
        results: list[AppendResult] = []
        previous: dict[tuple[str, int], int] = {}
        try:
            for message in messages:
                # Prepared and rolled-back transaction messages take no
                # queue slot.
                if message.sysflag & SysFlag.TRANSACTION_MASK in _UNCOUNTED:
                    queue_offset = 0
                else:
                    key = (message.topic, message.queue_id)
                    queue_offset = table.get(key, 0)
                    if key not in previous:
                        previous[key] = queue_offset
                    table[key] = queue_offset + 1
                total = encode(
                    mm,
                    position,
                    limit - position,
                    message,
                    queue_offset,
                    start + position,
                    store_timestamp,
                )
                if total < 0:
                    self._undo_batch(mm, first, position, previous)
                    return None
                results.append(
                    AppendResult(
                        start + position, total, queue_offset, store_timestamp, store_host
                    )
                )
                position += total
        except BaseException:
            self._undo_batch(mm, first, position, previous)
            raise
        return results

    def _undo_batch(
        self,
        mm: mmap.mmap | None,
        first: int,
        position: int,
        previous: dict[tuple[str, int], int],
    ) -> None:
        if mm is not None and position > first:
            mm[first:position] = bytes(position - first)
        assert self._queue_table is not None
        self._queue_table.update(previous)

    def _batch_size(self, messages: Sequence[Message], store_timestamp: int) -> int:
        """
        Validate every message (raising L{MessageRejected}) and add up
        their record sizes.
        """
        return sum(
            -self._encoder.encode(None, 0, -1, m, 0, 0, store_timestamp)
            for m in messages
        )

    def _prepare_put(self) -> _Segment | None:
        """
        The checks a put needs after anything but a put changed the log;
        then puts go straight in at L{_put_ready_at} until the next such
        change.

        @return: the segment to write to, if any.
        """
        self._check_writable()
        if self._record_end != self.max_offset:
            self._cut_incomplete_tail("before a put")
        if self._queue_table is None or self._queue_table_end != self.max_offset:
            self._catch_up_queue_table()
        self._put_ready_at = self.max_offset
        return self._segments[-1] if self._segments else None

    def _roll(self) -> _Segment:
        """
        Close the current segment with a BLANK filler and start the next.
        """
        last = self._segments[-1] if self._segments else None
        if last is None:
            return self._create_segment(0)
        table_current = self._queue_table_end == last.end
        remaining = last.size - last.wrote
        if remaining >= END_FILE_MIN_BLANK_LENGTH:
            last.mm[last.wrote : last.wrote + 8] = encode_blank(remaining)
        last.wrote = last.size
        self._record_end = last.end
        if table_current and self._queue_table is not None:
            self._queue_table_end = last.end
            self._save_queue_table()
        last.release_mapping()
        return self._create_segment(last.end)

    def _create_segment(self, start: int) -> _Segment:
        path = os.path.join(self.commitlog_dir, segment_name(start))
        existed = os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            _allocate(fd, self.segment_size)
        except OSError:
            if not existed:
                # Ours and holding nothing (the disk is full, say): give
                # its blocks back.
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        _fsync_dir(self.commitlog_dir)
        segment = _Segment(start, path, self.segment_size, writable=True)
        self._segments.append(segment)
        return segment

    # -- the replica path --------------------------------------------------

    def append_at(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """
        Write raw commit-log bytes that belong at C{offset}, which must be
        the current max offset.  The bytes may cut through records and
        cross segment boundaries.  An empty store starts its first segment
        at C{offset}, which must then be a segment boundary.

        @return: the new max offset.
        @raise OffsetMismatchError: C{offset} is not the max offset.
        @raise OSError: a segment could not be made (the disk is full, say):
            the bytes before it were appended (and validated), the rest not.
        """
        self._check_writable()
        if not self.has_data():
            if offset < 0 or offset % self.segment_size:
                raise OffsetMismatchError(
                    max(0, offset - offset % self.segment_size),
                    offset,
                    "the commit log is empty and its first segment must start "
                    f"at a multiple of the segment size {self.segment_size}",
                )
            if self._segments and self._segments[0].start != offset:
                self._discard_empty_segments()
            # The log now starts here: nothing before it is owed to disk.
            self._record_end = self._flushed = offset
        elif offset != self.max_offset:
            raise OffsetMismatchError(self.max_offset, offset)
        self._put_ready_at = -1
        view = memoryview(data).cast("B")
        written = 0
        total = len(view)
        try:
            while written < total:
                segment = self._segments[-1] if self._segments else None
                if segment is None:
                    segment = self._create_segment(offset)
                elif segment.wrote == segment.size:
                    segment = self._create_segment(segment.start + segment.size)
                n = min(total - written, segment.size - segment.wrote)
                # pwrite, not the mapping: a slave copying a whole log would
                # otherwise map all of it into its memory.
                segment.pwrite(segment.wrote, view[written : written + n])
                segment.wrote += n
                written += n
        except OSError:
            # The next segment could not be made (a full disk): what was
            # written is validated like any append, so the log ends, and
            # takes the rest, exactly where the failure left it.
            if written:
                self._advance_record_end(offset, view[:written])
            raise
        self._advance_record_end(offset, view)
        if self._sync_flush and self.sync_flush_inline:
            self.flush()
        return self.max_offset

    def _advance_record_end(self, chunk_offset: int, chunk: memoryview) -> None:
        """
        Validate the records replica appends have completed and move the
        record end past them: each record's size, magic, PHYSICALOFFSET and
        body CRC, and that a BLANK filler reaches exactly the segment's end.
        Headers and bodies come from C{chunk}, the bytes just appended at
        C{chunk_offset}, or from the file for a record that began in an
        earlier append — never through the mapping, which would map the
        whole replicated log into this process.

        @raise CorruptReplicaError: a completed record is invalid; the log
            is cut back to its start first (it was never acknowledged).
        """
        chunk_end = chunk_offset + len(chunk)
        end = self._record_end
        max_offset = self.max_offset
        unpack_from = _BLANK_HEADER.unpack_from
        checked = _CHECKED.unpack_from
        int_at = _INT.unpack_from
        short_at = _SHORT.unpack_from
        crc32 = zlib.crc32
        while end < max_offset:
            segment, position, _ = self._locate(end, 0)
            size, wrote = segment.size, segment.wrote
            # Hop record to record inside this segment (the hot loop: one
            # pass per replicated record).
            while position < size:
                if wrote - position < 8:
                    self._record_end = end
                    return
                in_chunk = chunk_offset <= end and end + 8 <= chunk_end
                if in_chunk:
                    total, magic = unpack_from(chunk, end - chunk_offset)
                else:
                    total, magic = _BLANK_HEADER.unpack(segment.pread(position, 8))
                if magic == BLANK_MAGIC:
                    if position + total != size:
                        self._reject(
                            end,
                            f"a BLANK filler of {total} bytes at segment position "
                            f"{position} does not reach this store's segment end "
                            f"({size}): the master's segment size differs "
                            "(mappedFileSizeCommitLog must match)",
                        )
                    if wrote < size:
                        self._record_end = end
                        return
                    position = size
                    break
                if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2:
                    self._reject(end, f"bad magic code 0x{magic & 0xFFFFFFFF:08X}")
                if total < _MIN_RECORD or position + total > size:
                    self._reject(
                        end,
                        f"total size {total} is impossible at segment position "
                        f"{position} of {size}",
                    )
                if position + total > wrote:
                    self._record_end = end
                    return
                if in_chunk and end + total <= chunk_end:
                    record: memoryview | bytes = chunk
                    at = end - chunk_offset
                else:
                    record = segment.pread(position, total)
                    at = 0
                (crc, physical, sysflag) = checked(record, at)
                if physical != end:
                    self._reject(end, f"PHYSICALOFFSET field says {physical}")
                if sysflag & _V6_HOSTS:
                    body_at = at + _BODY_LENGTH_AT + (
                        12 if sysflag & SysFlag.BORNHOST_V6 else 0
                    ) + (12 if sysflag & SysFlag.STOREHOST_V6 else 0)
                else:
                    body_at = at + _BODY_LENGTH_AT
                record_end = at + total
                if body_at + 4 > record_end:
                    self._reject(end, f"total size {total} is too small for its hosts")
                (body_length,) = int_at(record, body_at)
                body_at += 4
                # The fields must add up to TOTALSIZE (RocketMQ's calMsgLength):
                # the topic length byte(s) and the properties length must fit.
                topic_at = body_at + body_length
                if body_length < 0 or topic_at + 2 > record_end:
                    self._reject(end, f"body length {body_length} does not fit")
                if magic == MESSAGE_MAGIC_V1:
                    topic_length = record[topic_at]
                    properties_at = topic_at + 1 + topic_length
                else:
                    (topic_length,) = short_at(record, topic_at)
                    properties_at = topic_at + 2 + topic_length
                if properties_at + 2 > record_end or (
                    properties_at + 2 + short_at(record, properties_at)[0] != record_end
                ):
                    self._reject(end, f"its fields do not add up to its total size {total}")
                if body_length and (
                    crc32(record[body_at : body_at + body_length]) & 0x7FFFFFFF
                ) != crc:
                    self._reject(end, "body CRC mismatch")
                end += total
                position += total
            if position >= size:
                end = segment.start + size
        self._record_end = end

    def _reject(self, offset: int, reason: str) -> NoReturn:
        """
        A replicated record failed validation: cut the log back to its
        start (nothing from it on was acknowledged) and raise.
        """
        self._record_end = offset
        self._truncate_replica(offset)
        raise CorruptReplicaError(offset, reason)

    def _truncate_replica(self, offset: int) -> None:
        """
        Zero every replicated byte from C{offset} on, in whichever segments
        they reached.
        """
        self._put_ready_at = -1
        for segment in reversed(self._segments):
            if segment.start + segment.wrote <= offset:
                break
            keep = max(0, offset - segment.start)
            _zero_after(segment.mm, keep, segment.wrote)
            segment.wrote = keep
        # Segments that now begin past the cut go (their files too): the
        # next append must land in the segment holding the cut.
        while len(self._segments) > 1 and self._segments[-1].start > offset:
            segment = self._segments.pop()
            segment.close()
            os.unlink(segment.path)

    def discard_incomplete_record(self) -> None:
        """
        Cut replicated bytes after the last whole record (a slave does
        this before asking its master for more: the master resends the
        record whole, and the slave never reports a partial one).
        """
        self._check_writable()
        if self._record_end != self.max_offset:
            self._cut_incomplete_tail("before asking the master for it again")

    def record_start_at_or_before(self, offset: int) -> int:
        """
        The start of the record (or BLANK filler) holding C{offset}, found
        by hopping record headers from its segment's start.
        """
        segment, position, _ = self._locate(min(offset, self.max_offset), 0)
        if position == segment.size:
            return segment.start + position
        hop = 0
        while True:
            if hop + 8 > segment.wrote:
                return segment.start + hop
            total, magic = _BLANK_HEADER.unpack(segment.pread(hop, 8))
            if total <= 0 or hop + total > position:
                return segment.start + hop
            hop += total

    def truncate_replica(self, offset: int) -> None:
        """
        Cut the log back to C{offset}, a record boundary at or after its
        min offset: what a diverged slave does to resume from the last
        offset it shares with its master.  The bytes are zeroed.
        """
        self._check_writable()
        if not self.min_offset <= offset <= self.max_offset:
            raise OffsetOutOfRangeError(offset, self.min_offset, self.max_offset)
        if offset == self.max_offset:
            return
        path = self._quarantine_range(
            offset,
            "a diverged slave cut back to the last offset it shares with its "
            "master (truncate_replica)",
        )
        self._truncate_replica(offset)
        self._record_end = offset
        self._flushed = min(self._flushed, offset)
        self._queue_table = None
        self._log.warn(
            "cut the log back to offset {offset}; the cut bytes are kept in {path}",
            offset=offset,
            path=path,
        )

    def _quarantine_range(self, offset: int, action: str) -> str:
        """
        Copy the log's bytes from C{offset} to the max offset into
        quarantine (see L{_quarantine_bytes}) before they are cut.
        """
        end = self.max_offset

        def chunks() -> Iterator[bytes]:
            position = offset
            while position < end:
                chunk = self.read(position, len(_ZERO_CHUNK))
                if not chunk:  # a segment's unused end: skip to the next
                    position = position - position % self.segment_size + self.segment_size
                    continue
                yield chunk
                position += len(chunk)

        first = self._locate(offset, 0)[0]
        return _quarantine_bytes(
            self.store_dir,
            offset,
            chunks(),
            {
                "end": end,
                "segment": os.path.basename(first.path),
                "position": offset - first.start,
                "action": action,
            },
            self._clock,
        )

    @property
    def record_end(self) -> int:
        """
        The end of the last whole, validated record: what a slave may
        acknowledge (bytes after it are a record still arriving).
        """
        return self._record_end

    def _cut_incomplete_tail(self, why: str) -> None:
        """
        Drop replicated bytes after the last whole record: a record that
        will not be completed (the log is about to be written by a put, or
        closed).  Nothing whole is lost; a master resends from here.
        """
        end = self._record_end
        segment, position, _ = self._locate(end, 0)
        if position == segment.size:
            return
        cut = self.max_offset - end
        self._put_ready_at = -1
        _zero_after(segment.mm, position, segment.wrote)
        segment.wrote = position
        self._log.warn(
            "cut {cut} bytes of an incomplete replicated record at offset "
            "{offset} {why}",
            cut=cut,
            offset=end,
            why=why,
        )

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreError(f"{self.commitlog_dir} is closed")
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.commitlog_dir} is open read-only")

    def has_data(self) -> bool:
        """
        Whether the log holds any byte (a slave with none accepts the
        master's first frame at any segment boundary).
        """
        return bool(self._segments) and (
            len(self._segments) > 1 or self._segments[0].wrote > 0
        )

    def _discard_empty_segments(self) -> None:
        for segment in self._segments:
            segment.close()
            os.unlink(segment.path)
        self._segments = []
        self._flushed = self._record_end = 0

    # -- the transfer read path --------------------------------------------

    def read(self, offset: int, limit: int) -> bytes:
        """
        Up to C{limit} bytes from C{offset}, stopping at the end of the
        segment holding C{offset} and at the max offset.  The only copy
        made is the one C{transport.write} needs: a C{pread}, not an mmap
        slice, so that streaming a whole log to a slave does not map it
        into this process (file pages mapped in count as its memory).

        @return: C{b""} at the max offset.
        @raise OffsetOutOfRangeError: C{offset} is not in the log.
        """
        if self._empty_at(offset, limit):
            return b""
        segment, position, end = self._locate(offset, limit)
        return segment.pread(position, end - position)

    def read_view(self, offset: int, limit: int) -> memoryview:
        """
        Like L{read} but without copying: a view into the mapped segment,
        valid until the store is closed (release it before L{close}).
        """
        if self._empty_at(offset, limit):
            return memoryview(b"")
        segment, position, end = self._locate(offset, limit)
        return memoryview(segment.mm)[position:end]

    def _empty_at(self, offset: int, limit: int) -> bool:
        # A log with no segment yet has one offset, 0, and nothing there.
        return not self._segments and offset == 0 and limit >= 0 and not self._closed

    def _locate(self, offset: int, limit: int) -> tuple[_Segment, int, int]:
        if limit < 0:
            raise ValueError(f"read limit {limit} is negative")
        if self._closed:
            raise StoreError(f"{self.commitlog_dir} is closed")
        if not self._segments or not self.min_offset <= offset <= self.max_offset:
            raise OffsetOutOfRangeError(offset, self.min_offset, self.max_offset)
        index = (offset - self._segments[0].start) // self.segment_size
        if index == len(self._segments):
            index -= 1
        segment = self._segments[index]
        position = offset - segment.start
        return segment, position, min(segment.wrote, position + limit)

    # -- reading records ---------------------------------------------------

    def records(
        self,
        start: int | None = None,
        end: int | None = None,
        *,
        check_crc: bool = False,
        with_body: bool = True,
        blanks: bool = False,
    ) -> Iterator[Union[Record, Blank]]:
        """
        Decode records from C{start} (a record boundary, default the min
        offset) up to C{end} (default the max offset).

        @param blanks: also yield the BLANK fillers.
        @raise RecordError: at the first record that does not decode.
        """
        start = self.min_offset if start is None else start
        end = self.max_offset if end is None else min(end, self.max_offset)
        offset = start
        while offset < end:
            segment, position, _ = self._locate(offset, 0)
            limit = segment.wrote
            if position >= limit:
                offset = segment.start + segment.size
                continue
            try:
                item = parse_record(
                    segment.mm,
                    position,
                    limit,
                    offset,
                    check_crc=check_crc,
                    with_body=with_body,
                )
            except RecordError:
                if segment is self._segments[-1] and _incomplete(
                    segment.mm, position, limit, segment.size
                ):
                    # The tail of a replica mid-transfer: not corrupt, just
                    # not all here yet.
                    return
                raise
            if type(item) is Blank:
                if blanks:
                    yield item
                offset = segment.start + segment.size
                continue
            yield item
            offset += item.size

    # -- flushing ----------------------------------------------------------

    def flush_plan(self, least_bytes: int = 0) -> FlushPlan | None:
        """
        What a flush would sync now, or C{None} when fewer than
        C{least_bytes} are unflushed.
        """
        target = self.max_offset
        dirty = target - self._flushed
        if dirty <= 0 or dirty < least_bytes:
            return None
        fds = []
        for segment in self._segments:
            if segment.end > self._flushed and segment.wrote > 0:
                fds.append(segment.ensure_fd())
        self._flushes_in_flight += 1
        return FlushPlan(target, fds)

    def flush_done(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} was executed.
        """
        self._flushes_in_flight -= 1
        if plan.target > self._flushed:
            self._flushed = plan.target
        if self._flushes_in_flight == 0:
            # Descriptors of full, flushed segments are not needed again.
            for segment in self._segments[:-1]:
                if segment.end <= self._flushed:
                    segment.close_fd()

    def flush_abandoned(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} failed and was not executed.
        """
        self._flushes_in_flight -= 1

    def flush(self) -> int:
        """
        Flush synchronously.

        @return: the flushed offset.
        """
        plan = self.flush_plan()
        if plan is not None:
            try:
                plan.execute()
            except BaseException:
                self.flush_abandoned(plan)
                raise
            self.flush_done(plan)
        return self._flushed

    # -- queue offsets -----------------------------------------------------

    def _queue_table_path(self) -> str:
        return os.path.join(self.store_dir, "rmqha", "queue-offsets.json")

    def _catch_up_queue_table(self) -> dict[tuple[str, int], int]:
        """
        Bring the (topic, queue) -> next queue offset table up to the max
        offset: from the in-memory table, else the snapshot, else the whole
        log, by reading QUEUEOFFSET fields of the records not yet seen.
        """
        table = self._queue_table
        start = self._queue_table_end
        if table is None:
            table, start = self._load_queue_table()
        try:
            self._scan_queue_offsets(table, start)
        except RecordError:
            if start == self.min_offset:
                raise
            # The snapshot pointed somewhere wrong: read everything.
            table, start = {}, self.min_offset
            self._scan_queue_offsets(table, start)
        self._queue_table = table
        self._queue_table_end = self.max_offset
        return table

    def _scan_queue_offsets(self, table: dict[tuple[str, int], int], start: int) -> None:
        for record in self.records(start, with_body=False):
            assert isinstance(record, Record)
            transaction = record.sysflag & SysFlag.TRANSACTION_MASK
            if transaction in (
                SysFlag.TRANSACTION_PREPARED_TYPE,
                SysFlag.TRANSACTION_ROLLBACK_TYPE,
            ):
                continue
            key = (record.topic, record.queue_id)
            if record.queue_offset + 1 > table.get(key, 0):
                table[key] = record.queue_offset + 1
            self._last_put = record.offset

    def _load_queue_table(self) -> tuple[dict[tuple[str, int], int], int]:
        """
        The snapshot's table and the offset it is valid up to, if it still
        describes this log: its C{check} record must be in the log and
        directly precede C{offset} (or a BLANK between them must).
        Otherwise an empty table from the min offset (a full scan).
        """
        try:
            with open(self._queue_table_path()) as f:
                snapshot = json.load(f)
            offset = snapshot["offset"]
            check = snapshot["check"]
            table = {(str(t), int(q)): int(n) for t, q, n in snapshot["queues"]}
            if not (
                isinstance(offset, int) and self.min_offset <= offset <= self.max_offset
            ):
                raise ValueError("snapshot offset outside the log")
            if check is None:
                if offset != self.min_offset:
                    raise ValueError("snapshot names no record")
            else:
                first, size, crc = check
                record = self._item_at(first)
                if type(record) is not Record or [record.size, record.body_crc] != [
                    size,
                    crc,
                ]:
                    raise ValueError("snapshot does not match the log")
                if record.next_offset != offset:
                    blank = self._item_at(record.next_offset)
                    if type(blank) is not Blank or blank.next_offset != offset:
                        raise ValueError("snapshot offset does not follow its record")
                self._last_put = first
            return table, offset
        except (OSError, ValueError, KeyError, TypeError, StoreError):
            return {}, self.min_offset

    def _item_at(self, offset: int) -> Record | Blank:
        """
        The record or BLANK at C{offset} (headers only, no CRC check).
        """
        segment, position, _ = self._locate(offset, 0)
        return parse_record(
            segment.mm, position, segment.wrote, offset, check_crc=False, with_body=False
        )

    def _save_queue_table(self) -> None:
        """
        Snapshot the queue table so that opening a large store does not
        have to read every record to continue queue offsets.  The snapshot
        names the last record it has seen, so a log that was cut back or
        replaced since is noticed and the snapshot ignored.
        """
        if self._queue_table is None:
            return
        check = None
        if self._last_put is not None:
            record = self._item_at(self._last_put)
            assert type(record) is Record
            check = [record.offset, record.size, record.body_crc]
        snapshot = {
            "offset": self._queue_table_end,
            "check": check,
            "queues": [[t, q, n] for (t, q), n in sorted(self._queue_table.items())],
        }
        # (A full disk, say, leaves the old snapshot and no temporary file.)
        write_atomically(self._queue_table_path(), lambda f: json.dump(snapshot, f))

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """
        Flush, snapshot the queue table, remove the C{abort} marker and
        release the lock.  Idempotent.
        """
        if self._closed:
            return
        try:
            if not self.read_only:
                if self._record_end != self.max_offset:
                    self._cut_incomplete_tail("at close")
                self.flush()
                if self._queue_table is not None and self._queue_table_end == self.max_offset:
                    self._save_queue_table()
        finally:
            self._closed = True
            self._put_ready_at = -1
            for segment in self._segments:
                segment.close()
            if not self.read_only:
                try:
                    os.unlink(os.path.join(self.store_dir, "abort"))
                except FileNotFoundError:
                    pass
                _fsync_dir(self.store_dir)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "CommitLog":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_segment_size(size: int) -> None:
    if not isinstance(size, int) or not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
        raise ValueError(
            f"segment size {size!r} must be between {MIN_SEGMENT_SIZE} and "
            f"{MAX_SEGMENT_SIZE} bytes"
        )


def _lock(path: str) -> int:
    """
    Take the POSIX record lock RocketMQ takes on C{<store>/lock} (Java's
    C{FileChannel.tryLock} is an C{fcntl} lock, so this excludes a running
    broker too).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise StoreLockedError(
                f"{os.path.dirname(path)} is in use by another process "
                f"(lock held on {path})"
            ) from None
        raise
    return fd


def _allocate(fd: int, size: int) -> None:
    """
    Give a new segment its full size with blocks allocated, like RocketMQ's
    pre-allocated files.  Writing into holes of a sparse file costs a
    block allocation per page fault: about ten times the copy itself.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _all_zero(path: str) -> bool:
    """
    Whether every byte of the file at C{path} is zero (an empty file, which
    cannot be mapped, is).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return True
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            return not _nonzero_after(mm, 0, size)


def _unfinished_segment(
    found: list[tuple[int, str, int]], segment_size: int | None
) -> str | None:
    """
    The path of the last segment file if its creation was interrupted: it
    is shorter than a segment and holds only zeros.  A process killed
    between creating a segment file and giving it its full size leaves one
    (so does RocketMQ, whose broker then refuses to start); nothing was
    ever written to it, since writing starts only once it has its size.
    """
    if not found:
        return None
    start, path, size = found[-1]
    if len(found) > 1:
        expected: int | None = found[0][2] if segment_size is None else segment_size
        if start != found[-2][0] + found[-2][2]:
            return None
    else:
        expected = segment_size
    if expected is None:
        # A lone file, no configured size: short if no segment has its size.
        try:
            _check_segment_size(size)
            return None
        except ValueError:
            pass
    elif size >= expected:
        return None
    return path if _all_zero(path) else None


def _load_segments(
    commitlog_dir: str, segment_size: int | None, writable: bool
) -> tuple[list[_Segment], int, str | None]:
    """
    List the segment files, checking names, sizes and contiguity.

    @return: the segments, the segment size, and the path of an unfinished
        last segment file (see L{_unfinished_segment}), which is not among
        the segments.
    """
    names = sorted(os.listdir(commitlog_dir))
    found: list[tuple[int, str, int]] = []
    for name in names:
        path = os.path.join(commitlog_dir, name)
        if not _SEGMENT_NAME.match(name) or not os.path.isfile(path):
            raise CorruptStoreError(
                f"{path}: not a commit-log segment (segment files are named by "
                "their 20-digit start offset)"
            )
        found.append((int(name), path, os.path.getsize(path)))
    unfinished = _unfinished_segment(found, segment_size)
    if unfinished is not None:
        del found[-1]
    if not found:
        return [], segment_size or DEFAULT_SEGMENT_SIZE, unfinished
    sizes = {size for _, _, size in found}
    if segment_size is None:
        # The first file's size decides; every file must have it.
        segment_size = found[0][2]
        try:
            _check_segment_size(segment_size)
        except ValueError:
            raise CorruptStoreError(
                f"{found[0][1]}: {segment_size} bytes is not a valid segment size"
            ) from None
    for start, path, size in found:
        if size != segment_size:
            raise CorruptStoreError(
                f"{path}: {size} bytes, but segments are {segment_size} bytes"
                + (" (configured)" if len(sizes) == 1 else "")
            )
        if start % segment_size:
            raise CorruptStoreError(
                f"{path}: start offset {start} is not a multiple of the segment "
                f"size {segment_size}"
            )
    for (a, path_a, _), (b, path_b, _) in zip(found, found[1:]):
        if b != a + segment_size:
            raise CorruptStoreError(
                f"segments are not contiguous: {os.path.basename(path_a)} is "
                f"followed by {os.path.basename(path_b)}"
            )
    segments = [_Segment(start, path, size, writable) for start, path, size in found]
    for segment in segments:
        segment.wrote = segment.size
    return segments, segment_size, unfinished


@dataclass
class _Walk:
    """
    Where a record walk over whole segment files stopped.

    @ivar last: the offset of the last record (or BLANK) verified, if any.
    """

    index: int
    position: int
    records: int
    error: RecordError | None
    last: int | None = None


def _walk(
    segments: list[_Segment], index: int, check_crc: bool, position: int = 0
) -> _Walk:
    """
    Verify records from C{position} of C{segments[index]} over the full
    size of every segment file, following BLANK fillers to the next
    segment, until zero bytes (the normal end), a record that does not
    verify, or the end of the last segment.
    """
    records = 0
    last = None
    while True:
        segment = segments[index]
        mm = segment.mm
        while position < segment.size:
            try:
                item = parse_record(
                    mm,
                    position,
                    segment.size,
                    segment.start + position,
                    check_crc=check_crc,
                    with_body=False,
                    strict=True,
                )
            except RecordError as e:
                return _Walk(index, position, records, e, last)
            last = segment.start + position
            if type(item) is Blank:
                position = segment.size
                break
            records += 1
            position += item.size
        if index + 1 == len(segments):
            return _Walk(index, position, records, None, last)
        index += 1
        position = 0


def _is_end_of_data(error: RecordError | None) -> bool:
    return error is None or error.reason == "no record here (zero bytes)"


@dataclass
class Damage:
    """
    Bytes of a commit log, where a record walk arrived, that are not a
    record.

    @ivar offset: where they start (the end of the last good record).
    @ivar segment: the file name of the segment holding C{offset}.
    @ivar reason: what is wrong there.
    @ivar previous: the offset of the good record (or BLANK) before it,
        when the walk saw one.
    @ivar next_valid: the first valid record after C{offset} (its magic,
        size, fields, PHYSICALOFFSET and body CRC all check out): the log
        has data after the damage.  C{None}: nothing valid follows, the
        damage is the log's tail.
    @ivar valid_end: where the valid records from C{next_valid} stop.
    @ivar tail_end: for a tail, one past its last non-zero byte.
    """

    offset: int
    segment: str
    reason: str
    previous: int | None = None
    next_valid: int | None = None
    valid_end: int | None = None
    tail_end: int | None = None

    @property
    def is_tail(self) -> bool:
        return self.next_valid is None


class CorruptRecordError(CorruptStoreError):
    """
    A bad record with valid records after it: damage, not a torn tail.
    Opening refuses (nothing on disk changed); the message is one line
    saying where, what, and what to do.
    """

    def __init__(self, store_dir: str, damage: Damage) -> None:
        assert damage.next_valid is not None and damage.valid_end is not None
        valid = damage.valid_end - damage.next_valid
        super().__init__(
            f"bad record at offset {damage.offset} in segment {damage.segment} "
            f"({damage.reason}) with {valid} bytes of valid records after it "
            f"(offsets {damage.next_valid}..{damage.valid_end}); refusing to open "
            f"{store_dir} so that they are not lost (nothing was changed): repair "
            f"it from a replica with 'rmqha store repair {store_dir} --from "
            "REPLICA_DIR', or start with --truncate-corrupt to cut the log at "
            f"offset {damage.offset} (everything cut is kept in "
            f"{os.path.join(store_dir, *_QUARANTINE)}/)"
        )
        self.damage = damage


def _segment_index(segments: list[_Segment], offset: int) -> int | None:
    """
    The index of the segment holding C{offset}, if any.
    """
    if not segments or offset < segments[0].start:
        return None
    index = (offset - segments[0].start) // segments[0].size
    return index if index < len(segments) else None


def _first_valid_after(
    segments: list[_Segment], index: int, position: int, check_crc: bool
) -> int | None:
    """
    The offset of the first valid record (every check L{parse_record}
    makes, body CRC included) starting after C{position} of
    C{segments[index]} or anywhere in a later segment.  Candidates come
    from L{record_starts} (a C{find} for the magic), so the cost is one
    pass over the bytes plus a parse per candidate.
    """
    start = position + 1
    for segment in segments[index:]:
        mm = segment.mm
        for p in record_starts(mm, start, segment.size, segment.start, segment.size):
            try:
                parse_record(
                    mm, p, segment.size, segment.start + p,
                    check_crc=check_crc, with_body=False, strict=True,
                )
            except RecordError:
                continue
            return segment.start + p
        start = 0
    return None


def _valid_end(segments: list[_Segment], offset: int, check_crc: bool) -> int:
    """
    Where the run of valid records starting at C{offset} ends.
    """
    index = _segment_index(segments, offset)
    assert index is not None
    walk = _walk(segments, index, check_crc, offset - segments[index].start)
    return segments[walk.index].start + walk.position


def _tail_end(segments: list[_Segment], index: int, position: int) -> int | None:
    """
    One past the last non-zero byte from C{position} of C{segments[index]}
    to the end of the last segment; C{None} when all of it is zero.
    """
    for segment in reversed(segments[index:]):
        start = position if segment is segments[index] else 0
        last = _last_nonzero(segment.mm, start, segment.size)
        if last is not None:
            return segment.start + last + 1
    return None


def _examine(
    segments: list[_Segment], walk: _Walk, check_crc: bool, own_segment: bool = True
) -> Damage | None:
    """
    What is where a walk stopped: C{None} for the end of the data (zeros,
    or the end of the last segment, with nothing but zeros after), else
    the L{Damage} (whose C{valid_end} is left for the caller).

    @param own_segment: look for non-zero bytes after the end in the
        stopping segment too (not needed after a clean shutdown: the store
        zeroed that at its last recovery and writes strictly in order).
    """
    segment = segments[walk.index]
    position = walk.position
    if walk.error is None:
        return None
    if _is_end_of_data(walk.error):
        first = _first_nonzero(segment.mm, position, segment.size) if own_segment else None
        if first is None:
            for later in segments[walk.index + 1 :]:
                found = _first_nonzero(later.mm, 0, later.size)
                if found is not None:
                    first = later.start + found - segment.start
                    break
        if first is None:
            return None
        reason = (
            "no record here (zero bytes), but non-zero bytes follow at offset "
            f"{segment.start + first}"
        )
    else:
        reason = walk.error.reason
    damage = Damage(
        segment.start + position,
        os.path.basename(segment.path),
        reason,
        previous=walk.last,
    )
    damage.next_valid = _first_valid_after(segments, walk.index, position, check_crc)
    if damage.next_valid is None:
        damage.tail_end = _tail_end(segments, walk.index, position)
    return damage


def _find_damage(
    segments: list[_Segment], check_crc: bool
) -> tuple[list[Damage], int, int]:
    """
    Walk every record of every segment and list each stretch of bytes that
    is not records, resuming after each at the next valid record.

    @return: the damage, the count of good records, and where the last run
        of records ends.
    """
    damage: list[Damage] = []
    records = 0
    index, position = 0, 0
    while True:
        walk = _walk(segments, index, check_crc, position)
        records += walk.records
        end = segments[walk.index].start + walk.position
        if damage:
            damage[-1].valid_end = end
        found = _examine(segments, walk, check_crc)
        if found is None:
            return damage, records, end
        damage.append(found)
        if found.next_valid is None:
            return damage, records, found.offset
        index = _segment_index(segments, found.next_valid)  # type: ignore[assignment]
        position = found.next_valid - segments[index].start


_QUARANTINE = ("rmqha", "quarantine")


def _quarantine_target(store_dir: str, stem: str, suffix: str, clock: Callable[[], float]) -> str:
    """
    A new path in C{<store>/rmqha/quarantine/} named C{stem}, the UTC time
    and C{suffix}; never one that exists (so nothing quarantined is ever
    replaced).
    """
    directory = os.path.join(store_dir, *_QUARANTINE)
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
    base = os.path.join(directory, f"{stem}-{stamp}")
    target, n = base + suffix, 1
    while os.path.exists(target) or os.path.exists(target + ".json"):
        target, n = f"{base}.{n}{suffix}", n + 1
    return target


def _write_sidecar(path: str, info: dict[str, object], clock: Callable[[], float]) -> None:
    info = {
        **info,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock())),
    }
    with open(path + ".json", "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _quarantine_bytes(
    store_dir: str,
    offset: int,
    chunks: Iterator[bytes],
    info: dict[str, object],
    clock: Callable[[], float],
) -> str:
    """
    Keep C{chunks}, the bytes at commit-log C{offset} about to be zeroed or
    overwritten, byte for byte in C{<store>/rmqha/quarantine/<offset>-<utc
    time>.bin}, with a JSON sidecar (C{info}: why, from where), both on
    disk before this returns.

    @return: the path of the C{.bin} file.
    """
    target = _quarantine_target(store_dir, f"{offset:020d}", ".bin", clock)
    length = 0
    with open(target, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            length += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    _write_sidecar(target, {"offset": offset, "length": length, **info}, clock)
    _fsync_dir(os.path.dirname(target))
    return target


def _quarantine_segment(
    store_dir: str, segment: _Segment, info: dict[str, object], clock: Callable[[], float]
) -> str:
    """
    Move a whole segment file into quarantine (renamed, bytes untouched),
    with a JSON sidecar.
    """
    name = os.path.basename(segment.path)
    target = _quarantine_target(store_dir, name, ".segment", clock)
    _write_sidecar(
        target, {"offset": segment.start, "length": segment.size, "segment": name, **info},
        clock,
    )
    os.rename(segment.path, target)
    _fsync_dir(os.path.dirname(target))
    return target


def _mapped_chunks(mm: mmap.mmap, start: int, end: int) -> Iterator[bytes]:
    step = len(_ZERO_CHUNK)
    for position in range(start, end, step):
        yield mm[position : min(end, position + step)]


def _recover(
    store_dir: str,
    segments: list[_Segment],
    clean: bool,
    check_crc: bool,
    read_only: bool,
    truncate_corrupt: bool = False,
    clock: Callable[[], float] = time.time,
) -> RecoveryReport:
    """
    RocketMQ's C{recoverNormally} walk, from the third-to-last segment; the
    first record that does not verify, or zero bytes, is the end.  Unlike
    RocketMQ, what follows decides what happens:

      - nothing but zeros: the end of the log;
      - no valid record anywhere after it (a proven torn tail): its
        non-zero bytes are copied into quarantine, then zeroed, and later
        segment files holding anything are moved into quarantine (all-zero
        ones, pre-allocated, are deleted);
      - a valid record after it: L{CorruptRecordError}, nothing changed,
        unless C{truncate_corrupt}, which cuts it all like a torn tail.

    Read-only, nothing is changed or raised: the report says what a
    read-write open would do.
    """
    if not segments:
        return RecoveryReport(clean_shutdown=clean, walk_from=0, end_offset=0)
    index = max(0, len(segments) - 3)
    walk = _walk(segments, index, check_crc)
    segment = segments[walk.index]
    position = walk.position
    report = RecoveryReport(
        clean_shutdown=clean,
        walk_from=segments[index].start,
        end_offset=segment.start + position,
        stop_reason=None if _is_end_of_data(walk.error) else str(walk.error),
        records=walk.records,
    )
    damage = _examine(
        segments, walk, check_crc, own_segment=not clean or report.stop_reason is not None
    )
    action = "recovery cut a torn tail (no valid record after it)"
    if damage is not None and damage.next_valid is not None:
        damage.valid_end = _valid_end(segments, damage.next_valid, check_crc)
        error = CorruptRecordError(store_dir, damage)
        report.corruption = str(error)
        if not read_only and not truncate_corrupt:
            raise error
        action = (
            "--truncate-corrupt cut the log at a bad record with valid records "
            f"after it (offsets {damage.next_valid}..{damage.valid_end})"
        )
        report.truncated_corrupt = not read_only
    segment.wrote = position
    mm = segment.mm
    if damage is not None:
        last = _last_nonzero(mm, position, segment.size)
        report.torn = last is not None
        if last is not None and not read_only:
            report.quarantined.append(
                _quarantine_bytes(
                    store_dir,
                    report.end_offset,
                    _mapped_chunks(mm, position, last + 1),
                    {
                        "segment": os.path.basename(segment.path),
                        "position": position,
                        "reason": damage.reason,
                        "action": action,
                    },
                    clock,
                )
            )
            _zero_after(mm, position, last + 1)
            mm.flush()
    dropped = segments[walk.index + 1 :]
    del segments[walk.index + 1 :]
    for later in dropped:
        name = os.path.basename(later.path)
        report.dropped_segments.append(name)
        empty = not _nonzero_after(later.mm, 0, later.size)
        later.close()
        if read_only:
            continue
        if empty:
            # Pre-allocated and never written (RocketMQ's
            # AllocateMappedFileService leaves these): nothing to keep.
            os.unlink(later.path)
        else:
            report.quarantined.append(
                _quarantine_segment(
                    store_dir,
                    later,
                    {"reason": damage.reason if damage else "after the end", "action": action},
                    clock,
                )
            )
    if report.dropped_segments and not read_only:
        _fsync_dir(os.path.dirname(segments[0].path))
    return report


def _first_nonzero(mm: mmap.mmap, start: int, end: int) -> int | None:
    step = len(_ZERO_CHUNK)
    position = start
    while position < end:
        n = min(step, end - position)
        chunk = mm[position : position + n]
        if chunk != _ZERO_CHUNK[:n]:
            return position + len(chunk) - len(chunk.lstrip(b"\0"))
        position += n
    return None


def _last_nonzero(mm: mmap.mmap, start: int, end: int) -> int | None:
    step = len(_ZERO_CHUNK)
    position = end
    while position > start:
        n = min(step, position - start)
        chunk = mm[position - n : position]
        if chunk != _ZERO_CHUNK[:n]:
            return position - n + len(chunk.rstrip(b"\0")) - 1
        position -= n
    return None


def _nonzero_after(mm: mmap.mmap, start: int, end: int) -> bool:
    return _first_nonzero(mm, start, end) is not None


def _zero_after(mm: mmap.mmap, start: int, end: int) -> None:
    step = len(_ZERO_CHUNK)
    position = start
    while position < end:
        n = min(step, end - position)
        if mm[position : position + n] != _ZERO_CHUNK[:n]:
            mm[position : position + n] = _ZERO_CHUNK[:n]
        position += n


def _incomplete(mm: mmap.mmap, position: int, written: int, size: int) -> bool:
    """
    Whether the bytes at C{position} are the valid start of a record that
    continues past C{written} (but within the segment).
    """
    if written - position < 8:
        return True
    total, magic = struct.unpack_from(">ii", mm, position)
    return (
        magic in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2)
        and written - position < total <= size - position
    )


@dataclass
class VerifyReport:
    """
    What L{verify_store} found.

    @ivar error: the first problem, or C{None} when the store is sound.
    @ivar bad_offset: where that problem is.
    @ivar damage: every stretch of bytes that is not records (the first is
        C{error}), each saying whether valid records follow it.
    @ivar incomplete_tail: the offset of a last record still being written
        (or torn: a read-only check cannot tell), which is not an error.
    @ivar unfinished_segment: the name of a last segment file whose creation
        was interrupted (it holds nothing; opening the store removes it).
    """

    segments: int
    records: int
    min_offset: int
    end_offset: int
    error: str | None = None
    bad_offset: int | None = None
    unfinished_segment: str | None = None
    damage: list[Damage] = field(default_factory=list)
    incomplete_tail: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def verify_store(
    store_dir: str, *, commitlog_dir: str | None = None, check_crc: bool = True
) -> VerifyReport:
    """
    Check every record of every segment (not just the last three, as
    opening does), without modifying anything: each record must verify,
    every segment but the last must be closed by a BLANK filler (or end
    exactly at its end), and nothing but zeros may follow the last record.
    After a bad record the check goes on from the next valid one, so every
    damaged stretch is listed.

    A last record that is the beginning of a record and nothing after it
    is what a live slave's store shows while a record is arriving: it is
    reported as C{incomplete_tail}, not as an error.

    @raise StoreError: the store cannot be opened at all.
    """
    commitlog_dir = commitlog_dir or os.path.join(store_dir, "commitlog")
    if not os.path.isdir(commitlog_dir):
        raise StoreError(f"{commitlog_dir}: no such commit log directory")
    segments, _, unfinished = _load_segments(commitlog_dir, None, writable=False)
    unfinished_name = None if unfinished is None else os.path.basename(unfinished)
    try:
        if not segments:
            return VerifyReport(0, 0, 0, 0, unfinished_segment=unfinished_name)
        damage, records, end = _find_damage(segments, check_crc)
        report = VerifyReport(
            len(segments), records, segments[0].start, end,
            unfinished_segment=unfinished_name, damage=damage,
        )
        tail_end = damage[-1].tail_end if damage and damage[-1].is_tail else None
        if tail_end is not None:
            tail = damage[-1]
            segment = segments[_segment_index(segments, tail.offset)]  # type: ignore[index]
            if tail_end <= segment.start + segment.size and _incomplete(
                segment.mm,
                tail.offset - segment.start,
                tail_end - segment.start,
                segment.size,
            ):
                report.incomplete_tail = tail.offset
                damage.pop()
        if damage:
            report.error = damage[0].reason
            report.bad_offset = damage[0].offset
        return report
    finally:
        for segment in segments:
            segment.close()


@dataclass
class Repair:
    """
    One damaged stretch and what L{repair_store} did about it.

    @ivar end: the end of the bytes replaced (or, dry run, to replace).
    @ivar records: the replica's records (and BLANKs) copied.
    @ivar problem: why it could not be repaired, or C{None}.
    @ivar quarantined: where the damaged bytes were kept.
    """

    damage: Damage
    end: int | None = None
    records: int = 0
    problem: str | None = None
    quarantined: str | None = None


@dataclass
class RepairReport:
    """
    What L{repair_store} found and did.
    """

    repairs: list[Repair]
    dry_run: bool

    @property
    def ok(self) -> bool:
        return all(r.problem is None for r in self.repairs)


def _replica_pieces(
    segments: list[_Segment], replica: list[_Segment], damage: Damage
) -> tuple[list[tuple[int, int]], int]:
    """
    The replica's records covering C{damage}, each C{(offset, size)}, and
    their end.  Every one must pass every check (structure, PHYSICALOFFSET,
    body CRC), they must end exactly at the store's next valid record (or,
    for a tail, cover its last non-zero byte), and the records on both
    sides must be the same bytes in both stores.

    @raise ValueError: why the replica's copy cannot be used (one line).
    """
    start = damage.offset
    target = damage.next_valid if damage.next_valid is not None else damage.tail_end
    assert target is not None
    # The record before the damage: the same in both, or they are not
    # copies of one log.
    if damage.previous is not None:
        _same_item(segments, replica, damage.previous, "before")
    pieces: list[tuple[int, int]] = []
    offset = start
    while offset < target:
        index = _segment_index(replica, offset)
        if index is None:
            raise ValueError(
                f"the replica does not hold offset {offset} (it holds "
                f"{_span(replica)})"
            )
        segment = replica[index]
        position = offset - segment.start
        try:
            item = parse_record(
                segment.mm, position, segment.size, offset,
                check_crc=True, with_body=False, strict=True,
            )
        except RecordError as e:
            raise ValueError(
                f"the replica's record at offset {offset} is bad too ({e.reason})"
            ) from None
        size = segment.size - position if type(item) is Blank else item.size
        if damage.next_valid is not None and offset + size > target:
            raise ValueError(
                f"the replica's record at offset {offset} ({size} bytes) runs past "
                f"offset {target}, where this store's next valid record starts: "
                "the two logs do not line up"
            )
        if _segment_index(segments, offset) != _segment_index(segments, offset + size - 1):
            raise ValueError(f"this store has no segment for offset {offset + size - 1}")
        pieces.append((offset, size))
        offset += size
    if damage.next_valid is not None:
        _same_item(segments, replica, damage.next_valid, "after")
    return pieces, offset


def _same_item(
    segments: list[_Segment], replica: list[_Segment], offset: int, where: str
) -> None:
    """
    Check that the record (or BLANK) at C{offset} has the same bytes in
    the replica as in the store, when the replica holds it.
    """
    mine = _item_bytes(segments, offset)
    if mine is None or _segment_index(replica, offset) is None:
        return
    theirs = _item_bytes(replica, offset)
    if theirs != mine:
        raise ValueError(
            f"the record at offset {offset}, just {where} the damage, differs in "
            "the replica: it is not a copy of this log (a diverged or different store)"
        )


def _item_bytes(segments: list[_Segment], offset: int) -> bytes | None:
    index = _segment_index(segments, offset)
    if index is None:
        return None
    segment = segments[index]
    position = offset - segment.start
    try:
        item = parse_record(
            segment.mm, position, segment.size, offset, check_crc=False, with_body=False
        )
    except RecordError:
        return None
    size = 8 if type(item) is Blank else item.size
    return segment.mm[position : position + size]


def _span(segments: list[_Segment]) -> str:
    if not segments:
        return "no segment"
    return f"offsets {segments[0].start}..{segments[-1].start + segments[-1].size}"


def repair_store(
    store_dir: str,
    replica_dir: str,
    *,
    dry_run: bool = False,
    clock: Callable[[], float] = time.time,
) -> RepairReport:
    """
    Replace each damaged stretch of a closed store with a replica's copy of
    the same records (C{rmqha store repair}).  The whole store is walked
    with CRC checks; for each stretch the replica's records at the same
    offsets must pass every check and line up with the records around it
    (see L{_replica_pieces}), else that stretch is left as it is and the
    report says why.  The damaged bytes are quarantined, then the
    replica's are written in place (C{pwrite}, C{fsync}).

    @param dry_run: find and check, write nothing.
    @raise StoreLockedError: the store is open (a broker runs on it).
    @raise StoreError: either directory is not a commit log, or their
        segment sizes differ.
    """
    store_dir = os.path.abspath(store_dir)
    commitlog_dir = os.path.join(store_dir, "commitlog")
    replica_log = os.path.join(os.path.abspath(replica_dir), "commitlog")
    for directory in (commitlog_dir, replica_log):
        if not os.path.isdir(directory):
            raise StoreError(f"{directory}: no such commit log directory")
    lock_fd = _lock(os.path.join(store_dir, "lock"))
    segments: list[_Segment] = []
    replica: list[_Segment] = []
    try:
        segments, size, _ = _load_segments(commitlog_dir, None, writable=not dry_run)
        replica, replica_size, _ = _load_segments(replica_log, None, writable=False)
        if segments and replica and replica_size != size:
            raise StoreError(
                f"{replica_log}: segments of {replica_size} bytes, but {commitlog_dir} "
                f"has {size}-byte segments: not a replica of it"
            )
        damage, _, _ = _find_damage(segments, True)
        report = RepairReport([Repair(d) for d in damage], dry_run)
        for repair in report.repairs:
            try:
                pieces, repair.end = _replica_pieces(segments, replica, repair.damage)
            except ValueError as e:
                repair.problem = str(e)
                continue
            repair.records = len(pieces)
            if dry_run:
                continue
            repair.quarantined = _quarantine_bytes(
                store_dir,
                repair.damage.offset,
                (_item_range(segments, offset, size) for offset, size in pieces),
                {
                    "end": repair.end,
                    "segment": repair.damage.segment,
                    "reason": repair.damage.reason,
                    "action": f"rmqha store repair replaced these bytes with the copy "
                    f"in {os.path.abspath(replica_dir)}",
                },
                clock,
            )
            written = set()
            for offset, size in pieces:
                # One record (or BLANK filler) at a time: memory stays
                # bounded by the largest record, whatever the damage spans.
                segment = segments[_segment_index(segments, offset)]  # type: ignore[index]
                data = _item_range(replica, offset, size)
                segment.pwrite(offset - segment.start, memoryview(data))
                written.add(segment)
            for segment in written:
                os.fsync(segment.ensure_fd())
        return report
    finally:
        for segment in segments + replica:
            segment.close()
        os.close(lock_fd)


def _item_range(segments: list[_Segment], offset: int, length: int) -> bytes:
    segment = segments[_segment_index(segments, offset)]  # type: ignore[index]
    position = offset - segment.start
    return segment.mm[position : position + length]
