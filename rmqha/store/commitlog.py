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

import errno
import json
import mmap
import os
import time
from typing import Callable, Iterator, NamedTuple, NoReturn, Sequence, Union

from twisted.logger import Logger
from zope.interface import implementer

from rmqha._files import write_atomically
from rmqha.store.interfaces import IAppendedTo
from rmqha.store import _guard
from rmqha.store import _record as _codec
from rmqha.store._prefault import Prefaulter
from rmqha.store._queues import _UNCOUNTED, QueueTable
from rmqha.store._record import (
    Blank,
    DEFAULT_MAX_MESSAGE_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    Host,
    Message,
    MessageRejected,
    Record,
    RecordEncoder,
    RecordError,
    ReplicaValidator,
    SysFlag,
    encode_blank,
    offset_msg_id,
    parse_record,
    read_header,
)
from rmqha.store._recovery import (
    RecoveryReport,
    damage_record,
    RepairReport,
    VerifyReport,
    log_recovery,
    recover_store,
    repair_store,
    verify_store,
)
from rmqha.store._segments import (
    DEFAULT_SEGMENT_SIZE,
    FlushDiskType,
    FlushPlan,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    _Segment,
    _ZERO_CHUNK,
    _check_segment_size,
    _fsync_dir,
    _incomplete,
    _lock,
    _quarantine_bytes,
    _quarantine_target,
    _zero_after,
    create_segment,
    detach_segments,
    segment_name,
)
from rmqha.store.errors import (
    _DAMAGED,
    CorruptRecordError,
    CorruptReplicaError,
    CorruptStoreError,
    Damage,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    SegmentCreateError,
    SegmentReadError,
    StoreDamagedError,
    StoreError,
    StoreLockedError,
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
    "SegmentReadError",
    "StoreDamagedError",
    "DEFAULT_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "MAX_SEGMENT_SIZE",
    "segment_name",
]


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


@implementer(IAppendedTo)
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
        # Bytes from here on were written by this process's puts, through
        # the mapping (L{read} slices them); before it they came from the
        # disk or from append_at's pwrite, and a slice would fault each of
        # their pages into this process.
        self._mapped_from = self.max_offset
        self._validator = ReplicaValidator(segment_size, self.read)
        self._flushes_in_flight = 0
        self._closed = False
        self._queues = QueueTable(store_dir)
        self._append_observers: list[Callable[[int], object]] = []
        # A segment file changed under the log (truncated, removed,
        # replaced; docs/store.md): the first such finding, and who is told.
        self._damage: StoreDamagedError | None = None
        self._damage_observers: list[Callable[[StoreDamagedError], object]] = []
        # The SIGBUS guard's fault count when this log last looked.
        self._faults_seen = _guard.faults()
        # The pages ahead of the put position are faulted in on another
        # thread (rmqha/store/_prefault.py): with the accelerator only.
        accel = _codec._accel
        self._prefault: Prefaulter | None = (
            Prefaulter(accel.Prefault())
            if accel is not None and hasattr(accel, "Prefault") and not read_only
            else None
        )

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
            segments, segment_size, recovery = recover_store(
                store_dir,
                commitlog_dir,
                segment_size,
                read_only=read_only,
                check_crc=check_crc,
                truncate_corrupt=truncate_corrupt,
                clock=clock,
            )
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
        log_recovery(self._log, commitlog_dir, segment_size, read_only, recovery)
        # A file cut while recovery read it (the SIGBUS guard gave zeros
        # there): refuse, naming it, rather than trust what was read.
        damage = self.check()
        if damage is not None:
            self.close()
            raise StoreDamagedError(damage.path, damage.what)
        if not read_only:
            self._forget_recorded_damage()
        return self

    def _forget_recorded_damage(self) -> None:
        """
        Opened although the last run recorded a segment file changed under
        it (the file was restored, or the log ends before it now): say so,
        and move the record into the quarantine (kept, not repeated).
        """
        record = damage_record(self.store_dir)
        path = os.path.join(self.store_dir, *_DAMAGED)
        if record is None and not os.path.exists(path):
            return
        target = _quarantine_target(self.store_dir, "damaged", ".json", self._clock)
        os.rename(path, target)
        self._log.warn(
            "the last run found segment file {segment} {what} under it; the log was "
            "recovered as the files are now, to offset {end} (the record is kept in "
            "{target})",
            segment=(record or {}).get("segment"),
            what=(record or {}).get("what"),
            end=self.max_offset,
            target=target,
        )

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
        # The common put in one compiled call; anything else (a roll, a
        # refusal, a message the compiled code leaves to Python, the log
        # changed by something other than a put) goes through put_batch,
        # which this path did nothing for.
        accel = _codec._accel  # the compiled codec, or None (RMQHA_PURE=1)
        segments = self._segments
        table = self._queues.table
        if accel is not None and segments and table is not None:
            segment = segments[-1]
            start = segment.start
            wrote = segment.wrote
            if start + wrote == self._put_ready_at:
                encoder = self._encoder
                result: AppendResult | None = accel.put_one(
                    encoder, segment.mm, wrote, segment.size - END_FILE_MIN_BLANK_LENGTH,
                    message, table, start, int(self._clock() * 1000), AppendResult,
                    encoder.store_host,
                )
                if result is not None:
                    self._put_done(segment, result[0] + result[1], result[0])
                    return result
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
        # A page the records went to that the file no longer has (the
        # SIGBUS guard took the fault; put_one declines then, to here).
        self._check_faults()
        last = results[-1]
        self._put_done(segment, last.offset + last.size, last.offset)  # type: ignore[arg-type]
        return results

    def _put_done(self, segment: _Segment, end: int, last_put: int) -> None:
        """
        The bookkeeping after a put or a batch wrote records up to C{end}
        (the last one at C{last_put}) in C{segment}: once per batch.
        """
        segment.wrote = end - segment.start
        self._put_ready_at = self._record_end = end
        queues = self._queues
        queues.end = end
        queues.last_put = last_put
        if self._sync_flush and self.sync_flush_inline:
            self.flush()
            self._refuse_if_damaged()
        if self._append_observers:
            self._appended(end)
        prefault = self._prefault
        if prefault is not None and end - segment.start > prefault.ask_at:
            prefault.ahead(segment.mm, end - segment.start, segment.size)

    # -- observers ---------------------------------------------------------

    def observe_appends(self, observer: Callable[[int], object]) -> Callable[[], None]:
        """
        Call C{observer} with the new max offset each time a put, a batch or
        an L{append_at} wrote bytes, after they are written (and, with
        C{SYNC_FLUSH} inline, flushed), before the call that wrote them
        returns.  The writer no longer has to remember to tell anyone.

        An observer that raises is logged and the others are still called;
        the write has happened either way.

        @return: a function that stops the observing (idempotent).
        """
        self._append_observers.append(observer)

        def stop() -> None:
            if observer in self._append_observers:
                self._append_observers.remove(observer)

        return stop

    def observe_damage(
        self, observer: Callable[[StoreDamagedError], object]
    ) -> Callable[[], None]:
        """
        Call C{observer} with the L{StoreDamagedError} once, when the log
        first finds a segment file it holds changed under it (L{check}),
        on the thread and in the call that found it (a put, a read, a
        flush, the timer): an observer that must not run there schedules
        its work.  An observer that raises is logged.

        @return: a function that stops the observing (idempotent).
        """
        self._damage_observers.append(observer)

        def stop() -> None:
            if observer in self._damage_observers:
                self._damage_observers.remove(observer)

        return stop

    def _appended(self, end: int) -> None:
        for observer in list(self._append_observers):
            try:
                observer(end)
            except Exception:
                self._log.failure("an append observer failed at offset {offset}", offset=end)

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
        table = self._queues.table
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
        accel = _codec._accel  # the compiled codec, or None (RMQHA_PURE=1)
        fast = None if accel is None else accel.put_batch
        index = 0
        try:
            # len() every time round, like iterating: a message's attribute
            # read may change the list.
            while index < len(messages):
                if fast is not None:
                    # The compiled loop does every common message; it stops
                    # at the end, at one that does not fit, or at one it
                    # leaves to the Python code below (the judge).
                    index, position, over = fast(
                        self._encoder, mm, position, limit, messages, index, table,
                        previous, start, store_timestamp, AppendResult, store_host,
                        results,
                    )
                    if over is not None:
                        self._undo_batch(mm, first, position, previous)
                        return None
                    if index >= len(messages):
                        break
                message = messages[index]
                index += 1
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
        assert self._queues.table is not None
        self._queues.table.update(previous)

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
        if not self._queues.current(self.max_offset):
            try:
                self._catch_up_queue_table()
            except RecordError:
                self._check_faults()  # (zeros where a cut file was: that)
                raise
            self._check_faults()
        self._put_ready_at = self.max_offset
        return self._segments[-1] if self._segments else None

    def _roll(self) -> _Segment:
        """
        Close the current segment with a BLANK filler and start the next.
        """
        last = self._segments[-1] if self._segments else None
        if last is None:
            return self._create_segment(0)
        # The BLANK closes the file the log has been writing: that file.
        what = last.examine(by_path=True)
        if what is not None:
            raise self._damaged(last, what)
        table_current = self._queues.current(last.end)
        remaining = last.size - last.wrote
        if remaining >= END_FILE_MIN_BLANK_LENGTH:
            last.mm[last.wrote : last.wrote + 8] = encode_blank(remaining)
        last.wrote = last.size
        self._record_end = last.end
        if table_current:
            self._queues.end = last.end
            try:
                self._queues.save(self._item_at)
            except RecordError:
                self._check_faults()
                raise
        self._check_faults()
        self._release_prefault()
        last.release_mapping()
        return self._create_segment(last.end)

    def _release_prefault(self) -> None:
        # Before a mapping the pre-faulting may be working on is closed.
        if self._prefault is not None:
            self._prefault.release()

    def _create_segment(self, start: int) -> _Segment:
        segment = create_segment(self.commitlog_dir, start, self.segment_size)
        self._segments.append(segment)
        return segment

    # -- the replica path --------------------------------------------------

    def append_at(
        self,
        offset: int,
        data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview],
    ) -> int:
        """
        Write raw commit-log bytes that belong at C{offset}, which must be
        the current max offset.  The bytes may cut through records and
        cross segment boundaries.  An empty store starts its first segment
        at C{offset}, which must then be a segment boundary.

        C{data} may be a list of consecutive pieces (a slave's frame
        bodies): they are written by one C{pwritev} per segment, not joined
        first, and validated piece by piece (a record cut between two
        pieces is read back from the file: worth it for a few large pieces,
        not for many small ones).

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
        if isinstance(data, (bytes, bytearray, memoryview)):
            pieces = [memoryview(data).cast("B")]
        else:
            pieces = [memoryview(piece).cast("B") for piece in data]
        written = 0
        total = sum(len(piece) for piece in pieces)
        # (pwrite, not the mapping: read() is not to slice these bytes,
        # the validator's read-backs of them included.)
        self._mapped_from = offset + total
        try:
            index, used = 0, 0  # the next byte to write: pieces[index][used]
            while written < total:
                segment = self._segments[-1] if self._segments else None
                if segment is None:
                    segment = self._create_segment(offset)
                elif segment.wrote == segment.size:
                    segment = self._create_segment(segment.start + segment.size)
                # pwrite into a file cut short would grow it back with a
                # hole, into a removed one write nowhere: look first (an
                # fstat; docs/store.md for the window left).
                self._refuse_if_changed(segment)
                n = min(total - written, segment.size - segment.wrote)
                # pwrite, not the mapping: a slave copying a whole log would
                # otherwise map all of it into its memory.
                if len(pieces) == 1:
                    segment.pwrite(segment.wrote, pieces[0][written : written + n])
                else:
                    views, left = [], n
                    while left:
                        view = pieces[index][used : used + left]
                        views.append(view)
                        left -= len(view)
                        used += len(view)
                        if used == len(pieces[index]):
                            index, used = index + 1, 0
                    segment.pwritev(segment.wrote, views)
                segment.wrote += n
                written += n
        except OSError:
            # The next segment could not be made (a full disk): what was
            # written is validated like any append, so the log ends, and
            # takes the rest, exactly where the failure left it.
            if written:
                self._validate_pieces(offset, pieces, written)
                if self._append_observers:
                    self._appended(self.max_offset)
            raise
        self._validate_pieces(offset, pieces, total)
        if self._sync_flush and self.sync_flush_inline:
            self.flush()
            self._refuse_if_damaged()
        if total and self._append_observers:
            self._appended(self.max_offset)
        return self.max_offset

    def _validate_pieces(self, offset: int, pieces: list[memoryview], written: int) -> None:
        """
        Validate the first C{written} bytes of C{pieces}, appended from
        C{offset}: all pieces in one compiled pass (a record cut between
        two pieces checked from a copy of its bytes), or, without the
        accelerator, piece by piece, each as far as it reaches.
        """
        if written <= 0:
            return
        if len(pieces) == 1:
            self._advance_record_end(offset, pieces[0][:written], offset + written)
            return
        end, left, cut = offset + written, written, []
        for piece in pieces:
            if left <= 0:
                break
            cut.append(piece[:left])
            left -= len(cut[-1])
        try:
            self._record_end = self._validator.advance_pieces(self._record_end, end, offset, cut)
        except RecordError as e:
            self._reject(e.offset, e.reason)

    def _advance_record_end(
        self, chunk_offset: int, chunk: memoryview, written_end: int | None = None
    ) -> None:
        """
        Move the record end past the records replica appends completed,
        validated by L{ReplicaValidator} (the chunk just appended at
        C{chunk_offset}, or the file for a record that began earlier), up
        to C{written_end} (default: the max offset).

        @raise CorruptReplicaError: a completed record is invalid; the log
            is cut back to its start first (it was never acknowledged).
        """
        try:
            self._record_end = self._validator.advance(
                self._record_end,
                self.max_offset if written_end is None else written_end,
                chunk_offset,
                chunk,
            )
        except RecordError as e:
            self._reject(e.offset, e.reason)

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
        self._detach_after(offset)()

    def _detach_after(self, offset: int) -> Callable[[], None]:
        """
        The log ends at C{offset} from now on (L{detach_segments}); the
        zeroing and file removal are returned, to run before the next
        append.
        """
        self._put_ready_at = -1
        self._release_prefault()
        return detach_segments(self._segments, offset)

    def discard_incomplete_record(self) -> None:
        """
        Cut replicated bytes after the last whole record (a slave does
        this before asking its master for more: the master resends the
        record whole, and the slave never reports a partial one).  Nothing
        is cut in a damaged log (L{damage}): it takes no writes.
        """
        if self._damage is not None:
            return
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
            total, _ = read_header(segment.pread(hop, 8))
            if total <= 0 or hop + total > position:
                return segment.start + hop
            hop += total

    def truncate_replica(self, offset: int) -> None:
        """
        Cut the log back to C{offset}, a record boundary at or after its
        min offset: what a diverged slave does to resume from the last
        offset it shares with its master.  The bytes are zeroed (a copy of
        them is kept in quarantine first), and the cut is logged.
        """
        path = self.cut_back(offset)
        if path is not None:
            self._log.warn(
                "cut the log back to offset {offset}; the cut bytes are kept in {path}",
                offset=offset,
                path=path,
            )

    def cut_back(self, offset: int) -> str | None:
        """
        L{truncate_replica} without its log line: L{quarantine_tail}, then
        L{cut_quarantined} and the bulk it returns.

        @return: the quarantine file, or C{None} (nothing to cut).
        @raise OffsetOutOfRangeError: C{offset} is outside the log.
        """
        path = self.quarantine_tail(offset)
        if path is not None:
            self.cut_quarantined(offset)()
        return path

    def quarantine_tail(self, offset: int) -> str | None:
        """
        The heavy half of a cut back: copy the bytes from C{offset} to the
        max offset into quarantine, with fsync (reads of the log and writes
        of a new file only).  It may run in a thread
        (L{rmqha.store.service.CommitLogService.exclusive}) while nothing
        writes to the log.

        @return: the quarantine file, or C{None} (nothing to cut).
        @raise OffsetOutOfRangeError: C{offset} is outside the log.
        """
        self._check_writable()
        if not self.min_offset <= offset <= self.max_offset:
            raise OffsetOutOfRangeError(offset, self.min_offset, self.max_offset)
        if offset == self.max_offset:
            return None
        return self._quarantine_range(
            offset,
            "a diverged slave cut back to the last offset it shares with its "
            "master (truncate_replica)",
        )

    def cut_quarantined(self, offset: int) -> Callable[[], None]:
        """
        The second step, on the log's own thread: move the log's ends back
        to C{offset} and drop the segments past it (their copy is in
        quarantine).  (Not in a thread: it stops the pre-faulting and
        closes mappings other parts of the log hold.)  It takes
        microseconds whatever the size of the cut.

        @return: the third step, the bulk: zero the cut bytes of the
            segments that stay and remove the files of those that went.
            Nothing a reader can reach is touched, so it may run in a
            thread (L{rmqha.store.service.CommitLogService.exclusive});
            nothing may append to the log until it has run.
        """
        bulk = self._detach_after(offset)
        self._record_end = offset
        self._flushed = min(self._flushed, offset)
        self._queues.forget()
        return bulk

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
        self._refuse_if_damaged()

    # -- a segment file changed under the log -------------------------------

    @property
    def damage(self) -> StoreDamagedError | None:
        """
        The first damage found (a segment file the log holds truncated,
        removed or replaced under it, or a page of a mapping that faulted):
        every write raises it from then on, until the log is opened again.
        C{None}: none found.
        """
        return self._damage

    def check(self) -> StoreDamagedError | None:
        """
        Look at every segment file the log holds open (an C{fstat} of each
        descriptor, a C{stat} of the last one's path) and at the SIGBUS
        guard of its mappings: the first damage found is kept (see
        L{damage}), logged once and told to the L{observe_damage}
        observers.  Cheap (a few system calls): L{CommitLogService} calls
        it on a timer, and the log after every flush and before every
        roll; a put does not (docs/store.md: the window that leaves).

        @return: the damage, if any, found now or before.
        """
        if self._damage is not None or self._closed:
            return self._damage
        segments = self._segments
        for segment in segments:
            if segment.fd is None and not segment.mapped and segment.fault() is None:
                continue  # (nothing held, and no fault while it was: recovery's)
            what = segment.examine(by_path=segment is segments[-1])
            if what is not None:
                return self._damaged(segment, what)
        self._faults_seen = _guard.faults()
        return None

    def _check_faults(self) -> None:
        """
        Raise L{StoreDamagedError} if an access to a mapping of this log
        faulted since the last look (one call when none did).
        """
        count = _guard.faults()
        if count == self._faults_seen:
            return
        for segment in self._segments:
            if segment.fault() is not None:
                raise self._damaged(segment, segment.examine(by_path=True) or "")
        self._faults_seen = count  # (another log's mapping)

    def _refuse_if_changed(self, segment: _Segment) -> None:
        """
        Before writing into C{segment}'s file: raise L{StoreDamagedError}
        if it is not the file the log holds.
        """
        fd = segment.fd
        if fd is None:
            try:
                fd = segment.ensure_fd()
            except OSError as e:
                raise self._damaged(segment, self._open_failure(e)) from None
        # The file's size by lseek, not fstat: after a write, fstat costs
        # ~1.8 us here (a slave appends per read: ~15 % of a one-record
        # frame), lseek ~0.45.  A removed or replaced file keeps its size:
        # that is for check() (the timer, flushes, rolls) to find.
        if os.lseek(fd, 0, os.SEEK_END) != segment.size:
            raise self._damaged(segment, segment.examine(by_path=True) or "changed")

    def _refuse_if_damaged(self) -> None:
        damage = self._damage
        if damage is not None:
            # (A new exception each time: one raised again and again would
            # carry every traceback it was raised with.)
            raise StoreDamagedError(damage.path, damage.what)

    def _damaged(self, segment: _Segment, what: str) -> StoreDamagedError:
        """
        C{segment}'s file is not what the log holds (C{what}): from now on
        refuse every write.  Logged once, told to the observers once.

        @return: the error to raise (the first damage, if there was one).
        """
        if self._damage is None:
            damage = self._damage = StoreDamagedError(segment.path, what or "changed")
            self._put_ready_at = -1
            self._log.error("the commit log is damaged: {error}", error=str(damage))
            self._record_damage(segment, damage.what)
            for observer in list(self._damage_observers):
                try:
                    observer(damage)
                except Exception:
                    self._log.failure("a damage observer failed")
        damage = self._damage
        return StoreDamagedError(damage.path, damage.what)

    def _record_damage(self, segment: _Segment, what: str) -> None:
        """
        Write which file changed and how into C{rmqha/damaged.json}, for
        the next open: a file cut to zeros must not pass there for one
        whose creation was interrupted (and be deleted).
        """
        if self.read_only:
            return
        record = {
            "segment": os.path.basename(segment.path),
            "size": segment.size,
            "offset": segment.start,
            "written": segment.wrote,
            "what": what,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock())),
        }
        path = os.path.join(self.store_dir, *_DAMAGED)
        try:
            write_atomically(path, lambda f: json.dump(record, f, indent=1))
        except OSError as e:
            self._log.warn("cannot record the damage in {path}: {error}", path=path, error=e)

    @staticmethod
    def _open_failure(error: OSError) -> str:
        if error.errno == errno.ENOENT:
            return "was removed"
        if error.errno == errno.ESTALE:
            return "was replaced by another file"
        return f"cannot be opened: {error.strerror or error}"

    def _read_failure(
        self, segment: _Segment, held: bool, position: int, size: int, error: OSError
    ) -> StoreError:
        """
        The error for a C{pread} of C{segment} that failed with C{error}: a
        damage if the file is one the log held open (C{held}: the last
        segment, or one not flushed yet) and it changed, else a
        L{SegmentReadError} naming the file and why.  (An older segment's
        file gone or cut costs the reads of it, not the puts.)
        """
        if segment.fd is None:
            # (ensure_fd failed: the file of a segment not held open.)
            return SegmentReadError(segment.path, self._open_failure(error))
        what = segment.examine(by_path=True)
        if not held:
            # Opened for this read: closed again, so that the look at the
            # files held (check) does not take it for one.
            segment.close_fd()
        elif what is not None:
            return self._damaged(segment, what)
        if what is not None:
            return SegmentReadError(segment.path, what)
        if error.errno is None:  # (a short read: the file ends early)
            return SegmentReadError(
                segment.path, f"ends before position {position + size} ({error})"
            )
        return SegmentReadError(
            segment.path,
            f"cannot read {size} bytes at position {position}: {error.strerror or error}",
        )

    def has_data(self) -> bool:
        """
        Whether the log holds any byte (a slave with none accepts the
        master's first frame at any segment boundary).
        """
        return bool(self._segments) and (
            len(self._segments) > 1 or self._segments[0].wrote > 0
        )

    def _discard_empty_segments(self) -> None:
        self._release_prefault()
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
        into this process (file pages mapped in count as its memory) —
        except for what this process's puts wrote through the mapping of
        the last segment: a slice of it, without a system call (a SYNC
        put's frame is read this way).  Bytes this process did not write
        so (a catch-up from a log it opened) are read with C{pread}: a
        slice would fault their pages in one by one.

        @return: C{b""} at the max offset.
        @raise OffsetOutOfRangeError: C{offset} is not in the log.
        """
        if self._empty_at(offset, limit):
            return b""
        segment, position, end = self._locate(offset, limit)
        if offset >= self._mapped_from and segment.mapped and segment is self._segments[-1]:
            data = segment.mm[position:end]
            if _guard.faults() != self._faults_seen:
                self._check_faults()  # (zeros where the file was cut: refuse)
            return data
        held = segment.fd is not None
        try:
            return segment.pread(position, end - position)
        except OSError as e:
            raise self._read_failure(segment, held, position, end - position, e) from None

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
        segments = self._segments
        if not segments or not segments[0].start <= offset <= segments[-1].end:
            raise OffsetOutOfRangeError(offset, self.min_offset, self.max_offset)
        index = (offset - segments[0].start) // self.segment_size
        if index == len(segments):
            index -= 1
        segment = segments[index]
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
                try:
                    fds.append(segment.ensure_fd())
                except OSError as e:
                    # (Nothing to sync there: the log is damaged, and the
                    # flushed offset stays where it is: flush_done.)
                    self._damaged(segment, self._open_failure(e))
        self._flushes_in_flight += 1
        return FlushPlan(target, fds)

    def flush_done(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} was executed.
        """
        self._flushes_in_flight -= 1
        # On disk only if it went to the files the log holds: looked at
        # after the sync (an fstat each), before it counts.
        if self.check() is None and plan.target > self._flushed:
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

    def _item_at(self, offset: int) -> Record | Blank:
        """
        The record or BLANK at C{offset} (headers only, no CRC check).
        """
        segment, position, _ = self._locate(offset, 0)
        return parse_record(
            segment.mm, position, segment.wrote, offset, check_crc=False, with_body=False
        )

    def _catch_up_queue_table(self) -> dict[tuple[str, int], int]:
        return self._queues.catch_up(
            self.min_offset,
            self.max_offset,
            lambda start: self.records(start, with_body=False),
            self._item_at,
        )

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """
        Flush, snapshot the queue table, remove the C{abort} marker and
        release the lock.  Idempotent.
        """
        if self._closed:
            return
        damaged = self.check() is not None
        try:
            if not self.read_only and damaged:
                # Nothing written, nothing cut; what can be synced is, and
                # the abort marker stays: the next open recovers the tail
                # (docs/store.md, "A segment file changed under the open
                # log").
                try:
                    self.flush()
                except OSError as e:
                    self._log.warn("flushing the damaged commit log failed: {error}", error=e)
            elif not self.read_only:
                if self._record_end != self.max_offset:
                    self._cut_incomplete_tail("at close")
                self.flush()
                if self._queues.current(self.max_offset):
                    self._queues.save(self._item_at)
        finally:
            self._closed = True
            self._put_ready_at = -1
            if self._prefault is not None:
                self._prefault.stop()
            for segment in self._segments:
                segment.close()
            if not self.read_only and not damaged:
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
