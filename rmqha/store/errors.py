# -*- test-case-name: tests.test_commitlog,tests.test_recovery -*-
"""
Every error the store raises, and the L{Damage} a corrupt record is reported as.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

#: Where recovery and truncation move bytes aside, under the store directory.
_QUARANTINE = ("rmqha", "quarantine")
#: Where an open log records a segment file found changed under it (which
#: file, what was wrong, how much of it was written), under the store
#: directory: the next open must not take that file for one whose creation
#: was interrupted (docs/store.md).
_DAMAGED = ("rmqha", "damaged.json")


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


class StoreDamagedError(StoreError, OSError):
    """
    A segment file the open log holds was truncated, removed or replaced
    under it (by another process), or a page of its mapping could not be
    read or written: the file is no longer the one the log thinks it is.
    The log refuses every write from then on, until it is opened again;
    the text is one line naming the file and what is wrong with it.  An
    C{OSError} (C{EIO}, C{filename} the segment file) so that whoever
    handles a failed write (a put that could not be stored) handles this.
    """

    def __init__(self, path: str, what: str) -> None:
        OSError.__init__(
            self,
            errno.EIO,
            f"{what} under the open commit log, which takes no more writes "
            "until it is opened again (restart the broker)",
            path,
        )
        #: The segment file.
        self.path = path
        #: What is wrong with it (C{"was truncated to 4096 bytes (…)"}).
        self.what = what

    def __str__(self) -> str:
        return f"segment file {self.filename}: {self.strerror}"


class SegmentReadError(StoreError):
    """
    A segment file could not be read where the log holds bytes (a file
    missing, shorter than the log says, another file by now, or an I/O
    error).  The text is one line naming the file.
    """

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"segment file {path}: {what}")
        self.path = path
        self.what = what


class SegmentCreateError(OSError):
    """
    A put needed the next segment and it could not be made (the disk is
    full, most likely: C{errno} says).  Nothing of the put was written; the
    log takes the next put at the same offset.
    """


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
