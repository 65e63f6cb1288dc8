# -*- test-case-name: tests.test_commitlog,tests.test_store_faults,tests.test_prefault -*-
"""
The put path's slow track: the checks a put needs after anything but a put
changed the log (an incomplete replicated record cut, the queue table
caught up), and rolling to a new segment when a batch does not fit (the
batch checked first, a BLANK filler closing the full segment, the queue
table's snapshot, the next file created).

A mixin of L{rmqha.store.commitlog.CommitLog}, not a part it owns, for the
same reason as L{rmqha.store._replica.ReplicaTail}: every method here moves
the log's own ends (its segments, its record end, where the next put may
go) that the put path's fast track, which stays on the log, reads and moves
per put.  What it needs of the log is declared below (attributes) and, for
the type checker only, as stubs (methods).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence, Union

from rmqha.store._batch import batch_size
from rmqha.store._damage import DamageWatch
from rmqha.store._prefault import Prefaulter
from rmqha.store._queues import QueueTable
from rmqha.store._record import (
    Blank,
    END_FILE_MIN_BLANK_LENGTH,
    Message,
    MessageRejected,
    Record,
    RecordEncoder,
    RecordError,
    encode_blank,
)
from rmqha.store._records import item_at
from rmqha.store._segments import _Segment, create_segment, segment_name
from rmqha.store.errors import SegmentCreateError

__all__ = ["SegmentRolling"]


class SegmentRolling:
    """
    Preparing the end of the commit log for puts.
    """

    commitlog_dir: str
    segment_size: int
    _segments: list[_Segment]
    _encoder: RecordEncoder
    _record_end: int
    _put_ready_at: int
    _queues: QueueTable
    _watch: DamageWatch
    _prefault: Prefaulter | None

    if TYPE_CHECKING:

        @property
        def min_offset(self) -> int:
            raise NotImplementedError

        @property
        def max_offset(self) -> int:
            raise NotImplementedError

        def records(
            self,
            start: int | None = None,
            end: int | None = None,
            *,
            check_crc: bool = False,
            with_body: bool = True,
            blanks: bool = False,
        ) -> Iterator[Union[Record, Blank]]:
            raise NotImplementedError

        def _locate(self, offset: int, limit: int) -> tuple[_Segment, int, int]:
            raise NotImplementedError

        def _check_writable(self) -> None:
            raise NotImplementedError

        def _cut_incomplete_tail(self, why: str) -> None:
            raise NotImplementedError

        def _check_faults(self) -> None:
            raise NotImplementedError

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

    def _roll_for(
        self, segment: _Segment | None, messages: Sequence[Message], store_timestamp: int
    ) -> _Segment:
        """
        C{messages} do not fit in what is left of C{segment}: check every
        one before writing the BLANK and a new segment (L{_roll}), so that
        a refused batch leaves no trace.

        @return: the new segment.
        @raise MessageRejected: a message breaks a limit, or the batch
            cannot fit even an empty segment.
        @raise SegmentCreateError: the new segment's file could not be made.
        """
        size = batch_size(self._encoder, messages, store_timestamp)
        if segment is not None and segment.wrote == 0 or size > (
            self.segment_size - END_FILE_MIN_BLANK_LENGTH
        ):
            raise MessageRejected(
                f"{'batch' if len(messages) > 1 else 'record'} of {size} "
                "bytes (plus an 8-byte BLANK filler) does not fit in a "
                f"segment of {self.segment_size} bytes"
            )
        try:
            return self._roll()
        except OSError as e:
            # RocketMQ's CREATE_MAPEDFILE_FAILED.  What _roll did before
            # failing (a BLANK closing the full segment) is a valid log.
            raise SegmentCreateError(
                e.errno,
                f"cannot create the commit-log segment "
                f"{segment_name(self.max_offset)}: {e.strerror or e}",
            ) from e

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
            raise self._watch.damaged(last, what)
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

    def _item_at(self, offset: int) -> Record | Blank:
        """
        The record or BLANK at C{offset} (headers only, no CRC check).
        """
        return item_at(self._locate, offset)

    def _catch_up_queue_table(self) -> dict[tuple[str, int], int]:
        return self._queues.catch_up(
            self.min_offset,
            self.max_offset,
            lambda start: self.records(start, with_body=False),
            self._item_at,
        )
