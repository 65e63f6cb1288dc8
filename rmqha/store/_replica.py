# -*- test-case-name: tests.test_commitlog,tests.test_slave,tests.test_divergence -*-
"""
The replica side of the commit log's tail: validating the records a master's
bytes complete (moving the record end, L{ReplicaValidator}), cutting an
incomplete record, and cutting the log back (L{ReplicaTail.truncate_replica}:
quarantine, then move the ends back, then zero and remove in bulk).

A mixin of L{rmqha.store.commitlog.CommitLog}, not a part it owns: every
method here reads and moves the log's own ends (its segments, its record
end, where the next put may go) that the put and replica paths, which stay
on the log for speed, move too; a part would have to own them, and the put
path would pay an attribute hop per put to reach them.  What the mixin needs
of the log is declared below (attributes) and, for the type checker only,
as stubs (methods).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn

from twisted.logger import Logger

from rmqha.store._damage import DamageWatch
from rmqha.store._flush import Flusher
from rmqha.store._queues import QueueTable
from rmqha.store.consumequeue import ConsumeQueues
from rmqha.store._record import ReplicaValidator, RecordError, read_header
from rmqha.store._segments import (
    _Segment,
    _ZERO_CHUNK,
    _check_segment_size,
    _quarantine_bytes,
    _quarantine_segment,
    _zero_after,
    detach_segments,
)
from rmqha.store.errors import (
    CorruptReplicaError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
)

__all__ = ["ReplicaTail"]


class ReplicaTail:
    """
    The commit log's replica-side tail and its cut-back path.
    """

    _log: Logger
    store_dir: str
    segment_size: int
    _segments: list[_Segment]
    _clock: Callable[[], float]
    _record_end: int
    _put_ready_at: int
    _validator: ReplicaValidator
    _queues: QueueTable
    consume_queues: ConsumeQueues | None
    _watch: DamageWatch
    _flusher: Flusher
    _append_observers: tuple[Callable[[int], object], ...]

    if TYPE_CHECKING:

        @property
        def min_offset(self) -> int:
            raise NotImplementedError

        @property
        def max_offset(self) -> int:
            raise NotImplementedError

        def read(self, offset: int, limit: int) -> bytes:
            raise NotImplementedError

        def _locate(self, offset: int, limit: int) -> tuple[_Segment, int, int]:
            raise NotImplementedError

        def _check_writable(self) -> None:
            raise NotImplementedError

        def _release_prefault(self) -> None:
            raise NotImplementedError

        def _release_spans(self) -> None:
            raise NotImplementedError

        def _appended(self, end: int) -> None:
            raise NotImplementedError

    def _release_segment_users(self) -> None:
        """
        Before segments are cut, removed or closed here: the pre-faulting
        thread and L{CommitLog.file_span}'s readers let go of them.
        """
        self._release_prefault()
        self._release_spans()

    @property
    def record_end(self) -> int:
        """
        The end of the last whole, validated record: what a slave may
        acknowledge (bytes after it are a record still arriving).
        """
        return self._record_end

    def has_data(self) -> bool:
        """
        Whether the log holds any byte (a slave with none accepts the
        master's first frame at any segment boundary).
        """
        return bool(self._segments) and (
            len(self._segments) > 1 or self._segments[0].wrote > 0
        )

    def _keep_written(self, offset: int, pieces: list[memoryview], written: int) -> None:
        """
        An L{append_at} from C{offset} failed after C{written} bytes of
        C{pieces} (the next segment could not be made: a full disk): what
        was written is validated and observed like any append, so the log
        ends, and takes the rest, exactly where the failure left it.
        """
        if written:
            self._validate_pieces(offset, pieces, written)
            if self._append_observers:
                self._appended(self.max_offset)

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
        self._release_segment_users()
        bulk = detach_segments(self._segments, offset)
        if self.consume_queues is not None:
            # (Units past the new end point at nothing: provably garbage.)
            self.consume_queues.truncate(offset)
        return bulk

    def discard_incomplete_record(self) -> None:
        """
        Cut replicated bytes after the last whole record (a slave does
        this before asking its master for more: the master resends the
        record whole, and the slave never reports a partial one).  Nothing
        is cut in a damaged log (L{damage}): it takes no writes.
        """
        if self._watch.damage is not None:
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
        self._flusher.flushed = min(self._flusher.flushed, offset)
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

    def _start_at(self, offset: int) -> None:
        """
        The first bytes a master sends an empty log belong at C{offset}:
        the log starts there, at a segment boundary.

        @raise OffsetMismatchError: C{offset} is not a segment boundary.
        """
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
        self._record_end = self._flusher.flushed = offset

    def adopt_segment_size(self, size: int) -> list[str]:
        """
        An empty log (no record) takes C{size} as its segment size: a
        slave's must be its master's.  A segment file the log holds but
        never wrote a record to (its creation outlived by a crash) is
        moved into C{<store>/rmqha/quarantine/}, bytes untouched: nothing
        proves it holds only zeros (a clean shutdown is not read past its
        first bytes), so it is kept, not deleted.

        @return: the quarantined files' paths.
        @raise ValueError: the log holds a record, or C{size} is not a
            segment size.
        """
        self._check_writable()
        if self.has_data():
            raise ValueError(
                f"{self.store_dir}: the commit log holds records; its segment size "
                f"{self.segment_size} cannot change"
            )
        _check_segment_size(size)
        kept = []
        if self._segments:
            self._release_segment_users()
            for segment in self._segments:
                segment.close()
                info: dict[str, object] = {
                    "reason": f"an empty store adopting its master's segment size {size}",
                }
                kept.append(_quarantine_segment(self.store_dir, segment, info, self._clock))
            self._segments.clear()  # (the same list: the parts share it)
            self._flusher.flushed = self._record_end = 0
        self.segment_size = self._validator.segment_size = size
        self._put_ready_at = -1
        return kept

    def _discard_empty_segments(self) -> None:
        """
        An empty log's segment files (no record), before it starts at
        another boundary: one proven to hold only zeros is removed, any
        other moved into quarantine, bytes untouched (recovery reads a
        cleanly closed segment no further than its first bytes: "no
        record" does not prove "nothing").
        """
        self._release_segment_users()
        for segment in self._segments:
            segment.close()
            if _holds_only_zeros(segment.path, _ZERO_PROOF_LIMIT):
                os.unlink(segment.path)
                continue
            where = _quarantine_segment(
                self.store_dir, segment,
                {"reason": "an empty log starting at another segment boundary: a file "
                 "with non-zero bytes and no record"},
                self._clock,
            )
            self._log.warn(
                "moved {path} into quarantine ({where}): the log starts at another "
                "segment boundary and the file, holding no record, is not all zeros",
                path=segment.path, where=where,
            )
        self._segments.clear()  # (the same list: the parts share it)
        self._flusher.flushed = self._record_end = 0


#: At most this many bytes of a file's data are read to prove it all zeros
#: (holes are zeros without a read): past it, the file is kept.
_ZERO_PROOF_LIMIT = 64 << 20


def _holds_only_zeros(path: str, limit: int) -> bool:
    """
    Whether the file at C{path} holds only zero bytes, reading at most
    C{limit} bytes of its data (C{SEEK_DATA}/C{SEEK_HOLE} skip its holes);
    C{False} past the limit, or when it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        position, read = 0, 0
        while position < size:
            try:
                start = os.lseek(fd, position, os.SEEK_DATA)
            except OSError:
                return True  # (ENXIO: no data after position, holes only)
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            while start < stop:
                chunk = os.pread(fd, min(len(_ZERO_CHUNK), stop - start), start)
                if not chunk:
                    return True  # (the file shrank: nothing more to read)
                if chunk != _ZERO_CHUNK[: len(chunk)]:
                    return False
                start += len(chunk)
                read += len(chunk)
                if read > limit:
                    return False
            position = stop
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
