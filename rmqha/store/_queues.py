# -*- test-case-name: tests.test_commitlog,tests.test_rocketmq_store -*-
"""
The queue-offset table: (topic, queue id) -> the next queue offset, kept
current by the put path, rebuilt from records when it is not, and
snapshotted in C{<store>/rmqha/queue-offsets.json} so that opening a large
store does not read every record again.

It is fed records (an iterator from an offset, the item at an offset) and
knows nothing of the commit log that produces them.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable, Union

from rmqha._files import write_atomically
from rmqha.store._record import Blank, Record, RecordError, SysFlag
from rmqha.store.errors import StoreError

__all__ = ["QueueTable"]

_UNCOUNTED = (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE)

#: Records (no bodies) from an offset to the end of the log.
RecordsFrom = Callable[[int], Iterable[Union[Record, Blank]]]
#: The record or BLANK at an offset (headers only).
ItemAt = Callable[[int], Union[Record, Blank]]


class QueueTable:
    """
    (topic, queue id) -> next queue offset.

    @ivar table: the table, accurate for the records before L{end}; C{None}
        until the first put needs it (or after the log was cut back).
    @ivar end: the offset L{table} is accurate up to (-1: nothing).
    @ivar last_put: the offset of the last record the table has seen, named
        by the snapshot so that a log cut back or replaced since is noticed.
    """

    __slots__ = ("path", "table", "end", "last_put")

    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, "rmqha", "queue-offsets.json")
        self.table: dict[tuple[str, int], int] | None = None
        self.end = -1
        self.last_put: int | None = None

    def current(self, max_offset: int) -> bool:
        """
        Whether the table describes every record before C{max_offset}.
        """
        return self.table is not None and self.end == max_offset

    def forget(self) -> None:
        """
        The log was cut back: rebuild the table when it is next needed.
        """
        self.table = None

    def catch_up(
        self, min_offset: int, max_offset: int, records_from: RecordsFrom, item_at: ItemAt
    ) -> dict[tuple[str, int], int]:
        """
        Bring the table up to C{max_offset}: from the in-memory table, else
        the snapshot, else the whole log, by reading QUEUEOFFSET fields of
        the records not yet seen.
        """
        table = self.table
        start = self.end
        if table is None:
            table, start = self._load(min_offset, max_offset, item_at)
        try:
            self._scan(table, records_from(start))
        except RecordError:
            if start == min_offset:
                raise
            # The snapshot pointed somewhere wrong: read everything.
            table, start = {}, min_offset
            self._scan(table, records_from(start))
        self.table = table
        self.end = max_offset
        return table

    def _scan(
        self, table: dict[tuple[str, int], int], records: Iterable[Union[Record, Blank]]
    ) -> None:
        for record in records:
            assert isinstance(record, Record)
            if record.sysflag & SysFlag.TRANSACTION_MASK in _UNCOUNTED:
                continue
            key = (record.topic, record.queue_id)
            if record.queue_offset + 1 > table.get(key, 0):
                table[key] = record.queue_offset + 1
            self.last_put = record.offset

    def _load(
        self, min_offset: int, max_offset: int, item_at: ItemAt
    ) -> tuple[dict[tuple[str, int], int], int]:
        """
        The snapshot's table and the offset it is valid up to, if it still
        describes this log: its C{check} record must be in the log and
        directly precede C{offset} (or a BLANK between them must).
        Otherwise an empty table from the min offset (a full scan).
        """
        try:
            with open(self.path) as f:
                snapshot = json.load(f)
            offset = snapshot["offset"]
            check = snapshot["check"]
            table = {(str(t), int(q)): int(n) for t, q, n in snapshot["queues"]}
            if not (isinstance(offset, int) and min_offset <= offset <= max_offset):
                raise ValueError("snapshot offset outside the log")
            if check is None:
                if offset != min_offset:
                    raise ValueError("snapshot names no record")
            else:
                first, size, crc = check
                record = item_at(first)
                if type(record) is not Record or [record.size, record.body_crc] != [
                    size,
                    crc,
                ]:
                    raise ValueError("snapshot does not match the log")
                if record.next_offset != offset:
                    blank = item_at(record.next_offset)
                    if type(blank) is not Blank or blank.next_offset != offset:
                        raise ValueError("snapshot offset does not follow its record")
                self.last_put = first
            return table, offset
        except (OSError, ValueError, KeyError, TypeError, StoreError):
            return {}, min_offset

    def save(self, item_at: ItemAt) -> None:
        """
        Snapshot the table.  The snapshot names the last record it has
        seen, so a log that was cut back or replaced since is noticed and
        the snapshot ignored.  (A full disk, say, leaves the old snapshot
        and no temporary file.)
        """
        if self.table is None:
            return
        check = None
        if self.last_put is not None:
            record = item_at(self.last_put)
            assert type(record) is Record
            check = [record.offset, record.size, record.body_crc]
        snapshot = {
            "offset": self.end,
            "check": check,
            "queues": [[t, q, n] for (t, q), n in sorted(self.table.items())],
        }
        write_atomically(self.path, lambda f: json.dump(snapshot, f))
