# -*- test-case-name: tests.test_commitlog,tests.test_speedups,tests.test_pure_path -*-
"""
Encoding a batch of messages into the end of a segment: where each record
lands (L{AppendResult}), the queue offsets it takes, and undoing both when
the batch does not fit.

Functions, not a part object: a batch has no state that outlives the call
(the encoder and the queue table are the commit log's, passed in), and a
module-level function costs the put path no attribute hop.  The commit log
decides what a refusal means (a roll, or L{MessageRejected}) and does the
bookkeeping after a batch (L{rmqha.store.commitlog.CommitLog.put_batch}).
"""

from __future__ import annotations

import mmap
from typing import NamedTuple, Sequence

from rmqha.store import _record as _codec
from rmqha.store._queues import _UNCOUNTED
from rmqha.store._record import (
    END_FILE_MIN_BLANK_LENGTH,
    Host,
    Message,
    RecordEncoder,
    SysFlag,
    offset_msg_id,
)
from rmqha.store._segments import _Segment

__all__ = ["AppendResult", "encode_batch", "batch_size"]


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


#: The queue table: (topic, queue id) -> the next queue offset.
Table = dict[tuple[str, int], int]


def encode_batch(
    encoder: RecordEncoder,
    table: Table,
    segment: _Segment | None,
    messages: Sequence[Message],
    store_timestamp: int,
) -> list[AppendResult] | None:
    """
    Encode C{messages} from the end of C{segment}, assigning queue offsets
    from C{table}; C{None} (with nothing written and the queue table as it
    was) if they do not all fit.
    """
    encode = encoder.encode
    store_host = encoder.store_host
    if segment is None:
        mm, start, first, limit = None, 0, 0, -1
    else:
        mm, start, first = segment.mm, segment.start, segment.wrote
        # Records go in only if they leave room for a BLANK filler.
        limit = segment.size - END_FILE_MIN_BLANK_LENGTH
    position = first
    results: list[AppendResult] = []
    previous: Table = {}
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
                    encoder, mm, position, limit, messages, index, table,
                    previous, start, store_timestamp, AppendResult, store_host,
                    results,
                )
                if over is not None:
                    _undo_batch(table, mm, first, position, previous)
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
                _undo_batch(table, mm, first, position, previous)
                return None
            results.append(
                AppendResult(
                    start + position, total, queue_offset, store_timestamp, store_host
                )
            )
            position += total
    except BaseException:
        _undo_batch(table, mm, first, position, previous)
        raise
    return results


def _undo_batch(
    table: Table,
    mm: mmap.mmap | None,
    first: int,
    position: int,
    previous: Table,
) -> None:
    """
    Zero what a refused batch wrote from C{first} to C{position} and put
    the queue offsets it took back.
    """
    if mm is not None and position > first:
        mm[first:position] = bytes(position - first)
    table.update(previous)


def batch_size(
    encoder: RecordEncoder, messages: Sequence[Message], store_timestamp: int
) -> int:
    """
    Validate every message (raising L{MessageRejected}) and add up
    their record sizes.
    """
    return sum(
        -encoder.encode(None, 0, -1, m, 0, 0, store_timestamp) for m in messages
    )
