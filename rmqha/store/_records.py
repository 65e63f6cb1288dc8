# -*- test-case-name: tests.test_commitlog,tests.test_rocketmq_store -*-
"""
Decoding the records of an open commit log's segments, in order: what
L{rmqha.store.commitlog.CommitLog.records} returns, and the one record at
an offset the queue table's snapshot asks for.

Functions over the log's list of segments and its offset lookup (passed
in): reading records keeps no state of its own between calls, so it needs
no part object.
"""

from __future__ import annotations

from typing import Callable, Iterator, Union

from rmqha.store._record import Blank, Record, RecordError, parse_record
from rmqha.store._segments import _Segment, _incomplete

__all__ = ["iter_records", "item_at"]

#: The segment holding an offset, the position in it, and where a read of
#: a given size from there ends (L{rmqha.store.commitlog.CommitLog._locate}).
Locate = Callable[[int, int], tuple[_Segment, int, int]]


def iter_records(
    segments: list[_Segment],
    locate: Locate,
    start: int | None,
    end: int | None,
    check_crc: bool,
    with_body: bool,
    blanks: bool,
) -> Iterator[Union[Record, Blank]]:
    """
    Decode records from C{start} (a record boundary, default the start of
    the first segment) up to C{end} (default the end of the last); the
    defaults are taken when the first record is asked for.

    @param blanks: also yield the BLANK fillers.
    @raise RecordError: at the first record that does not decode (an
        incomplete record at the end of the last segment ends the
        iteration instead: a replica's tail mid-transfer).
    """
    max_offset = segments[-1].end if segments else 0
    start = (segments[0].start if segments else 0) if start is None else start
    end = max_offset if end is None else min(end, max_offset)
    offset = start
    while offset < end:
        segment, position, _ = locate(offset, 0)
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
            if segment is segments[-1] and _incomplete(
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


def item_at(locate: Locate, offset: int) -> Record | Blank:
    """
    The record or BLANK at C{offset} (headers only, no CRC check).
    """
    segment, position, _ = locate(offset, 0)
    return parse_record(
        segment.mm, position, segment.wrote, offset, check_crc=False, with_body=False
    )
