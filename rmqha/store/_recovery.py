# -*- test-case-name: tests.test_recovery,tests.test_cli -*-
"""
What opening a store does to its tail (recovery: torn tail versus
corruption, C{truncate_corrupt}), the offline C{verify}, the offline
C{repair} from a replica, and their reports.  Works on segments, never on a
L{CommitLog}.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from twisted.logger import Logger

from rmqha.store._record import (
    Blank,
    RecordError,
    parse_record,
    record_starts,
    walk_valid,
)
from rmqha.store._segments import (
    _WALK_BLOCK,
    _Segment,
    _drop_pages,
    _first_nonzero,
    _fsync_dir,
    _incomplete,
    _last_nonzero,
    _load_segments,
    _lock,
    _mapped_chunks,
    _nonzero_after,
    _quarantine_bytes,
    _quarantine_segment,
    _segment_index,
    _zero_after,
)
from rmqha.store.errors import (
    _DAMAGED,
    CorruptRecordError,
    CorruptStoreError,
    Damage,
    StoreError,
)


#: What L{verify_store} tells of each stretch of verified records.
OnBlock = Callable[[mmap.mmap, int, int, int], object]


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
    segments: list[_Segment],
    index: int,
    check_crc: bool,
    position: int = 0,
    on_block: OnBlock | None = None,
) -> _Walk:
    """
    Verify records from C{position} of C{segments[index]} over the full
    size of every segment file, following BLANK fillers to the next
    segment, until zero bytes (the normal end), a record that does not
    verify, or the end of the last segment.

    @param on_block: told each stretch of verified records (a BLANK may
        end it) before its pages go back: C{(mm, start, end, segment
        start)}.
    """
    records = 0
    last = None
    while True:
        segment = segments[index]
        mm = segment.mm
        dropped = position
        while position < segment.size:
            # Hop over the valid records (compiled when it can be) up to the
            # end of this block, then parse the one it stopped at: a BLANK,
            # an error, the end, or a record across the block's end.  The
            # pages behind go back (the RSS stays flat however big the
            # segment: _WALK_BLOCK).
            if position - dropped >= _WALK_BLOCK:
                if on_block is not None:
                    on_block(mm, dropped, position, segment.start)
                _drop_pages(mm, dropped, position)
                dropped = position
            limit = min(segment.size, position - position % _WALK_BLOCK + _WALK_BLOCK)
            position, hopped, hop_last = walk_valid(
                mm, position, limit, segment.start + position,
                check_crc=check_crc, strict=True,
            )
            if hopped:
                records += hopped
                last = segment.start + hop_last
            if position >= segment.size:
                break
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
                if on_block is not None:
                    on_block(mm, dropped, position, segment.start)
                _drop_pages(mm, dropped, position)
                return _Walk(index, position, records, e, last)
            last = segment.start + position
            if type(item) is Blank:
                position = segment.size
                break
            records += 1
            position += item.size
        if on_block is not None:
            on_block(mm, dropped, position, segment.start)
        _drop_pages(mm, dropped, position)
        if index + 1 == len(segments):
            return _Walk(index, position, records, None, last)
        index += 1
        position = 0


def _is_end_of_data(error: RecordError | None) -> bool:
    return error is None or error.reason == "no record here (zero bytes)"


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
    segments: list[_Segment], check_crc: bool, on_block: OnBlock | None = None
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
        walk = _walk(segments, index, check_crc, position, on_block)
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
        # (Zeros the SIGBUS guard put where the file was cut meanwhile are
        # not a proof of emptiness: such a file is moved, not deleted.)
        empty = not _nonzero_after(later.mm, 0, later.size) and later.fault() is None
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


def recover_store(
    store_dir: str,
    commitlog_dir: str,
    segment_size: int | None,
    *,
    read_only: bool,
    check_crc: bool,
    truncate_corrupt: bool,
    clock: Callable[[], float],
) -> tuple[list[_Segment], int, RecoveryReport]:
    """
    What L{CommitLog.open} does between taking the lock and building the
    log: list the segment files, recover the tail (L{_recover}), remove an
    unfinished last segment file, let the mappings recovery read through
    go, and (read-write) write the C{abort} marker.

    @return: the segments, the segment size, the report.
    """
    abort_path = os.path.join(store_dir, "abort")
    clean = not os.path.exists(abort_path)
    if not read_only:
        _refuse_if_recorded_damaged(store_dir, commitlog_dir)
    segments, size, unfinished = _load_segments(
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
    return segments, size, recovery


def lock_and_recover(
    store_dir: str,
    commitlog_dir: str,
    segment_size: int | None,
    *,
    read_only: bool,
    check_crc: bool,
    truncate_corrupt: bool,
    clock: Callable[[], float],
) -> tuple[int | None, list[_Segment], int, RecoveryReport]:
    """
    L{recover_store} under the store's lock, taken here (and released
    again if recovery raises), the commit-log directory made first;
    read-only, no lock, and the directory must exist.

    @return: the lock's descriptor (C{None} read-only), the segments, the
        segment size, the report.
    """
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
    return lock_fd, segments, segment_size, recovery


def damage_record(store_dir: str) -> dict[str, object] | None:
    """
    What an open log recorded when it found one of its segment files
    changed under it (C{rmqha/damaged.json}), if it did and it can be read.
    """
    try:
        with open(os.path.join(store_dir, *_DAMAGED), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _refuse_if_recorded_damaged(store_dir: str, commitlog_dir: str) -> None:
    """
    The last run recorded one of its segment files changed under it: if
    that file is still not a segment's size, refuse, naming it, and leave
    it as it is.  Otherwise a file cut to zeros would pass for one whose
    creation was interrupted (deleted), and a lone one opened without a
    configured size would set the segment size.
    """
    record = damage_record(store_dir)
    if record is None:
        return
    path = os.path.join(commitlog_dir, str(record.get("segment")))
    try:
        length = os.path.getsize(path)
    except OSError:
        return  # (gone: the log ends before it; log_recovery's caller says so)
    if length == record.get("size"):
        return
    marker = os.path.join(store_dir, *_DAMAGED)
    raise CorruptStoreError(
        f"{path}: {length} bytes, but segments are {record.get('size')} bytes: it "
        f"{record.get('what')} under the running broker (recorded in {marker}); it held "
        "records, so it is left as it is, and they are not in this store any more: copy "
        "the file from a replica (the same name in its commitlog/ holds the same bytes), "
        "or move this store aside and rebuild it from a replica"
    )


def log_recovery(
    log: Logger,
    commitlog_dir: str,
    segment_size: int,
    read_only: bool,
    recovery: RecoveryReport,
) -> None:
    """
    Tell the operator what opening the store found and did (through the
    opening L{CommitLog}'s logger).
    """
    if not recovery.clean_shutdown or recovery.stop_reason:
        log.warn(
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
        log.error(
            "commit log {dir}: {corruption}{what}",
            dir=commitlog_dir,
            corruption=recovery.corruption,
            what=" (cut by --truncate-corrupt)" if recovery.truncated_corrupt else "",
        )
    for path in recovery.quarantined:
        log.warn("commit log {dir}: kept what recovery cut in {path}",
                       dir=commitlog_dir, path=path)
    if recovery.unfinished_segment is not None:
        log.warn(
            "commit log {dir}: segment file {name} was never finished (shorter "
            "than {size} bytes, only zeros: its creation was interrupted); "
            "{what}",
            dir=commitlog_dir,
            name=recovery.unfinished_segment,
            size=segment_size,
            what="ignored" if read_only else "removed, it held nothing",
        )


@dataclass
class VerifyReport:
    """
    What L{verify_store} found.

    @ivar error: the first problem, or C{None} when the store is sound.
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
    unfinished_segment: str | None = None
    damage: list[Damage] = field(default_factory=list)
    incomplete_tail: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def verify_store(
    store_dir: str,
    *,
    commitlog_dir: str | None = None,
    check_crc: bool = True,
    on_block: OnBlock | None = None,
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

    @param on_block: told each stretch of verified records while it is
        still in memory, C{(mm, start, end, segment start)} in log order
        (C{rmqha store check} checks the consume queues so: one read of
        the log for both).
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
        damage, records, end = _find_damage(segments, check_crc, on_block)
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
