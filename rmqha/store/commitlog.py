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

import os
import time
from typing import Callable, Iterator, Sequence, Union

from twisted.logger import Logger
from zope.interface import implementer

from rmqha.store.interfaces import IAppendedTo
from rmqha.store import _guard
from rmqha.store import _record as _codec
from rmqha.store._batch import AppendResult, encode_batch
from rmqha.store._damage import DamageWatch
from rmqha.store._flush import Flusher
from rmqha.store._prefault import PrefaultFigures, Prefaulter, prefaulter
from rmqha.store._queues import QueueTable
from rmqha.store.consumequeue import ConsumeQueues
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
)
from rmqha.store._recovery import (
    RecoveryReport,
    RepairReport,
    VerifyReport,
    lock_and_recover,
    log_recovery,
    repair_store,
    verify_store,
)
from rmqha.store._records import iter_records
from rmqha.store._replica import ReplicaTail
from rmqha.store._rolling import SegmentRolling
from rmqha.store._segments import (
    DEFAULT_SEGMENT_SIZE,
    FlushDiskType,
    FlushPlan,
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    _Segment,
    _check_segment_size,
    release_store,
    segment_name,
)
from rmqha.store._spans import SpanReader
from rmqha.store.errors import (
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


#: Bytes of commit log between two progress lines of a consume-queue build
#: at open, and the smallest gap that is logged at all.
_PROGRESS_BYTES = 256 * 1024 * 1024
#: Commit-log bytes per dispatch step while opening (nothing else runs).
_OPEN_STEP = 8 * 1024 * 1024
#: Commit-log bytes between two syncs of the queues while building them at open.
_SYNC_BYTES = 64 * 1024 * 1024
#: Segments L{CommitLog.file_span} keeps a reader open for: slaves catching
#: up in different segments at once do not open and map a file per frame
#: (which made two of them 0.77x as fast a MB as C{pread}).
_SPAN_READERS = 4

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


@implementer(IAppendedTo)
class CommitLog(ReplicaTail, SegmentRolling):
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
        #: The segment size L{open} was told (C{--segment-size}), or
        #: C{None}: the files decided it, or nothing did (an empty store
        #: takes L{DEFAULT_SEGMENT_SIZE}, or its master's:
        #: L{adopt_segment_size}).
        self.configured_segment_size: int | None = None
        self.read_only = read_only
        self.flush_disk_type = flush_disk_type
        self.recovery = recovery
        self._segments = segments
        self._encoder = encoder
        self._clock = clock
        self._lock_fd = lock_fd
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
        # file_span's readers, by segment, the least recently used first.
        self._spans: dict[_Segment, SpanReader] = {}
        self._validator = ReplicaValidator(segment_size, self.read)
        self._closed = False
        self._queues = QueueTable(store_dir)
        #: The consume queues (docs/consumequeue.md), built from the log's
        #: whole records; C{None} when open read-only.
        self.consume_queues: ConsumeQueues | None = None
        # (A tuple, replaced as observers come and go: every put iterates
        # it, with no copy.)
        self._append_observers: tuple[Callable[[int], object], ...] = ()
        # A segment file changed under the log (truncated, removed,
        # replaced; docs/store.md): found, kept and told by its own part,
        # which shares the list of segments (never replaced) with the
        # flusher.  The check append_at makes is bound once here (no more
        # lookups than a method of the log).
        watch = self._watch = DamageWatch(
            store_dir, read_only, segments, clock, self._stop_puts
        )
        self._refuse_if_changed = watch.refuse_if_changed
        self._flusher = Flusher(segments, watch, self.check)
        # The SIGBUS guard's fault count when this log last looked.
        self._faults_seen = _guard.faults()
        # The pages ahead of the put position are faulted in on another
        # thread (rmqha/store/_prefault.py): with the accelerator only.
        self._prefault: Prefaulter | None = None if read_only else prefaulter()

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
        consume_queues: bool = False,
        consume_queue_units: int | None = None,
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
        @param consume_queues: keep RocketMQ's consume queues
            (docs/consumequeue.md): recovered, cut and completed here, then
            fed by L{dispatch}.  A broker's store does; a log opened only
            to be read or written as a log need not (the next open with
            them builds what they miss).
        @param consume_queue_units: units per consume-queue file
            (RocketMQ's C{mappedFileSizeConsumeQueue} / 20); C{None}: what
            the existing files hold, else 300,000.

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
        configured = segment_size
        lock_fd, segments, segment_size, recovery = lock_and_recover(
            store_dir,
            commitlog_dir,
            segment_size,
            read_only=read_only,
            check_crc=check_crc,
            truncate_corrupt=truncate_corrupt,
            clock=clock,
        )
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
        self.configured_segment_size = configured
        log_recovery(self._log, commitlog_dir, segment_size, read_only, recovery)
        # A file cut while recovery read it (the SIGBUS guard gave zeros
        # there): refuse, naming it, rather than trust what was read.
        damage = self.check()
        if damage is not None:
            self.close()
            raise StoreDamagedError(damage.path, damage.what)
        if not read_only:
            self._watch.forget_recorded(self.max_offset)
        if consume_queues and not read_only:
            try:
                self._open_consume_queues(consume_queue_units)
            except BaseException:
                self.close()
                raise
        return self

    def _open_consume_queues(self, units_per_file: int | None) -> None:
        """
        Recover the consume queues, cut them at the log's end, and build
        what they miss up to it (all of them for a store that has none),
        before the log is handed out; progress is logged for large gaps.
        """
        queues = self.consume_queues = ConsumeQueues(self.store_dir, self, units_per_file)
        end = self._record_end
        queues.open(end)
        start = queues.dispatched
        if start >= end:
            return
        gap = end - start
        if gap >= _PROGRESS_BYTES:
            self._log.info(
                "building consume queues from commit-log offset {start} to {end} ({mib} MiB)",
                start=start, end=end, mib=gap >> 20,
            )
        told = synced = start
        while queues.dispatch(end, _OPEN_STEP):
            if queues.dispatched - synced >= _SYNC_BYTES:
                # (A build killed half-way resumes from here.)
                synced = queues.dispatched
                plan = queues.sync_plan(self.flushed_offset)
                if plan is not None:
                    plan()
            if queues.dispatched - told >= _PROGRESS_BYTES:
                told = queues.dispatched
                self._log.info(
                    "consume queues: {done} of {gap} MiB dispatched",
                    done=(told - start) >> 20, gap=gap >> 20,
                )
        if gap >= _PROGRESS_BYTES:
            self._log.info("consume queues built up to commit-log offset {end}", end=end)

    def dispatch(self, limit: int, end: int | None = None) -> bool:
        """
        One bounded step of consume-queue dispatch up to the last whole
        record (RocketMQ's C{ReputMessageService.doReput}), or the last
        whole record before C{end}.

        @return: whether more is left to dispatch.
        """
        queues = self.consume_queues
        if queues is None or self._closed or self._watch.damage is not None:
            return False  # (a damaged log: said once, by the log)
        return queues.dispatch(self._record_end if end is None else min(end, self._record_end), limit)

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
        return self._flusher.flushed

    def prefault_figures(self) -> PrefaultFigures | None:
        """
        What the pre-faulting of the pages ahead of the puts has done
        (rmqha/store/_prefault.py), or C{None} where there is none (no
        accelerator, a read-only log).
        """
        return None if self._prefault is None else self._prefault.figures()

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

    def record_size(self, message: Message) -> int:
        """
        The bytes C{message}'s record would take, writing nothing.

        @raise MessageRejected: the message breaks a limit (named in the
            text), as L{put} would raise.
        """
        size: int = -self._encoder.encode(None, 0, -1, message, 0, 0, 0)
        return size

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
        table = self._queues.table
        assert table is not None
        results = encode_batch(self._encoder, table, segment, messages, store_timestamp)
        if results is None:
            # Does not fit: a new segment, or a refusal.
            segment = self._roll_for(segment, messages, store_timestamp)
            results = encode_batch(self._encoder, table, segment, messages, store_timestamp)
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
            self._watch.refuse_if_damaged()
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
        self._append_observers += (observer,)

        def stop() -> None:
            observers = list(self._append_observers)
            if observer in observers:
                observers.remove(observer)
                self._append_observers = tuple(observers)

        return stop

    def _appended(self, end: int) -> None:
        for observer in self._append_observers:
            try:
                observer(end)
            except Exception:
                self._log.failure("an append observer failed at offset {offset}", offset=end)

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
        return self._watch.observe(observer)

    def _stop_puts(self) -> None:
        self._put_ready_at = -1  # (damage found: _prepare_put refuses)

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
            self._start_at(offset)
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
            self._keep_written(offset, pieces, written)
            raise
        self._validate_pieces(offset, pieces, total)
        if self._sync_flush and self.sync_flush_inline:
            self.flush()
            self._watch.refuse_if_damaged()
        if total and self._append_observers:
            self._appended(self.max_offset)
        return self.max_offset

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreError(f"{self.commitlog_dir} is closed")
        if self.read_only:
            raise ReadOnlyStoreError(f"{self.commitlog_dir} is open read-only")
        if self._watch.damage is not None:
            self._watch.refuse_if_damaged()

    def _check_faults(self) -> None:
        """
        Raise L{StoreDamagedError} if an access to a mapping of this log
        faulted since the last look (one call when none did).
        """
        count = _guard.faults()
        if count != self._faults_seen:
            self._watch.refuse_if_faulted()
            self._faults_seen = count  # (another log's mapping)

    # -- a segment file changed under the log -------------------------------

    @property
    def damage(self) -> StoreDamagedError | None:
        """
        The first damage found (a segment file the log holds truncated,
        removed or replaced under it, or a page of a mapping that faulted):
        every write raises it from then on, until the log is opened again.
        C{None}: none found.
        """
        return self._watch.damage

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
        if self._closed:
            return self._watch.damage
        damage = self._watch.check()
        if damage is None:
            self._faults_seen = _guard.faults()
        return damage

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
            raise self._watch.read_failure(segment, held, position, end - position, e) from None

    def file_span(self, offset: int, limit: int) -> tuple[int, int, int, int]:
        """
        What L{read} would return, for sending from the file itself
        (C{sendfile}) instead of from a copy: a descriptor of the segment
        file holding C{offset}, C{offset}'s position in it, and the size
        and CRC-32 of the bytes from there, the CRC computed in a mapping
        of the file (nothing copied: rmqha/store/_spans.py).  The
        descriptor is valid until the log's close, or until spans in
        L{_SPAN_READERS} other segments came after this one; not to be
        closed by the caller.

        @raise OffsetOutOfRangeError: C{offset} is not in the log.
        @raise SegmentReadError: the segment file is gone, another file, or
            does not hold the bytes (as L{read}'s: the log is not damaged
            by it).
        """
        segment, position, end = self._locate(offset, limit)
        spans = self._spans
        reader = spans.pop(segment, None)
        if reader is None:
            if len(spans) >= _SPAN_READERS:
                spans.pop(next(iter(spans))).close()
            reader = SpanReader(segment)
        try:
            crc = reader.crc(position, end)
        except SegmentReadError:
            reader.close()
            raise
        spans[segment] = reader
        return reader.fd, position, end - position, crc

    def _release_spans(self) -> None:
        """
        Close L{file_span}'s readers (their descriptors and mappings):
        before segments are removed or cut, and at close, so that no file
        the log let go of is held open by them.
        """
        spans = list(self._spans.values())
        self._spans.clear()
        for reader in spans:
            reader.close()

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
        return iter_records(
            self._segments, self._locate, start, end, check_crc, with_body, blanks
        )

    # -- flushing ----------------------------------------------------------

    def flush_plan(self, least_bytes: int = 0) -> FlushPlan | None:
        """
        What a flush would sync now, or C{None} when fewer than
        C{least_bytes} are unflushed.
        """
        return self._flusher.plan(least_bytes)

    def flush_done(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} was executed.
        """
        self._flusher.done(plan)

    def flush_abandoned(self, plan: FlushPlan) -> None:
        """
        Record that C{plan} failed and was not executed.
        """
        self._flusher.abandoned(plan)

    def flush(self) -> int:
        """
        Flush synchronously.

        @return: the flushed offset.
        """
        return self._flusher.flush()

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
                self._close_consume_queues()
            elif not self.read_only:
                if self._record_end != self.max_offset:
                    self._cut_incomplete_tail("at close")
                self.flush()
                if self._queues.current(self.max_offset):
                    self._queues.save(self._item_at)
                self._close_consume_queues()
        finally:
            self._closed = True
            self._put_ready_at = -1
            self._release_spans()
            if self._prefault is not None:
                self._prefault.stop()
            release_store(
                self.store_dir,
                self._segments,
                self._lock_fd,
                clean=not self.read_only and not damaged,
            )
            self._lock_fd = None

    def _close_consume_queues(self) -> None:
        queues, self.consume_queues = self.consume_queues, None
        if queues is not None:
            try:
                if self._watch.damage is None:
                    # (RocketMQ's shutdown lets the reput finish too.)
                    while queues.dispatch(self._record_end, _OPEN_STEP):
                        pass
                queues.close(self.flushed_offset)
            except (OSError, StoreError) as e:
                self._log.warn("closing the consume queues failed: {error}", error=e)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "CommitLog":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
