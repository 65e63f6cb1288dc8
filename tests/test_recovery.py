"""
Tests for what L{rmqha.store.commitlog.CommitLog.open} does to a store's tail:
RocketMQ's C{recoverNormally} walk, cutting torn records, moving segments
past the end aside, read-only inspection and a replica's incomplete tail.

A crash is simulated by leaving the C{abort} marker (or copying a store
while it is open) and editing segment files: zeroing them from a position
is what a segment looks like when writing stopped there, since segment
files are fixed-size and pre-allocated with zeros.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Callable, Iterable

from twisted.trial.unittest import SynchronousTestCase

from rmqha.store._record import MessageRejected, RecordError
from rmqha.store import _segments
from rmqha.store.commitlog import CommitLog, CorruptRecordError, StoreError

from tests._helpers import (
    copy_store,
    disk,
    field_spans,
    fixed_clock,
    file_bytes,
    make_message,
    mark_unclean,
    open_store,
    plan_offsets,
    put_all,
    record_size,
    segment_file_name,
    segment_files,
    segment_path,
    tree_digest,
    xor_byte,
    zero_from,
)

#: Fields a flipped byte in must be noticed by recovery: they are checked
#: (magic, sizes adding up, PHYSICALOFFSET, body CRC).
DETECTED_FIELDS = [
    "TOTALSIZE",
    "MAGICCODE",
    "BODYCRC",
    "PHYSICALOFFSET",
    "BODYLENGTH",
    "BODY",
    "TOPICLENGTH",
    "PROPERTIESLENGTH",
]


def body(length: int, seed: int = 0) -> bytes:
    """
    A body without zero bytes, so zeroing any part of it changes it.
    """
    return bytes((seed + i * 7) % 255 + 1 for i in range(length))


class TornStore:
    """
    A closed store whose last segment holds several records, and the
    knowledge of where everything is, computed by hand.
    """

    SEGMENT = 1024

    def __init__(self, case: SynchronousTestCase) -> None:
        # Four 250-byte records fill segment 0 up to a 24-byte BLANK; the
        # last segment holds two more and a 124-byte one.
        self.messages = [
            make_message(body(150, i), properties={"K": "v"}) for i in range(6)
        ] + [make_message(body(24, 6), properties={"K": "v"})]
        log = open_store(case, segment_size=self.SEGMENT)
        put_all(log, self.messages)
        log.close()
        self.store_dir = log.store_dir
        self.offsets, self.blanks, self.end = plan_offsets(
            map(record_size, self.messages), self.SEGMENT
        )
        self.last = self.offsets[-1]
        self.last_start = self.last - self.last % self.SEGMENT
        self.spans = field_spans(self.messages[-1])
        case.assertEqual((self.blanks, self.last_start), ([(1000, 24)], 1024))

    def last_segment(self, store_dir: str) -> str:
        return segment_path(store_dir, self.last_start)


def quarantined(store_dir: str, pattern: str = "*") -> dict[str, bytes]:
    """
    File name -> contents of the files (not the sidecars) in
    C{<store>/rmqha/quarantine} matching C{pattern}.
    """
    found = {}
    for path in sorted(glob.glob(os.path.join(store_dir, "rmqha", "quarantine", pattern))):
        if not path.endswith(".json"):
            with open(path, "rb") as f:
                found[os.path.basename(path)] = f.read()
    return found


def sidecar(store_dir: str, name: str) -> dict:
    with open(os.path.join(store_dir, "rmqha", "quarantine", name + ".json")) as f:
        return json.load(f)


class RecoveryCheck:
    """
    Assertions about a recovered store, for sweeps over many positions.
    """

    def sweep(self, positions: Iterable[int], check: Callable[[int], None]) -> None:
        """
        Run C{check} for every position and fail once, listing every
        position whose check failed and why.
        """
        failures = {}
        for position in positions:
            try:
                check(position)
            except Exception as e:
                failures[position] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        self.assertEqual(failures, {})

    def assertRecovered(
        self,
        log: CommitLog,
        offsets: list[int],
        segment_size: int,
        next_queue_offset: int | None = None,
    ) -> None:
        """
        C{log} holds exactly the records at C{offsets}, all verifying, with
        nothing but zeros from its end to its segment's end; a new record
        lands at the end and the log then still verifies, with zeros after
        the new record.
        """
        end = log.max_offset
        self.assertEqual([r.offset for r in log.records(check_crc=True)], offsets)
        segment_end = end - end % segment_size + segment_size
        tail = disk(log, end, segment_end)
        self.assertEqual(tail, bytes(len(tail)), "bytes after the end are not zero")
        result = log.put(make_message(b"new"))
        self.assertEqual(result.offset, end)
        if next_queue_offset is not None:
            self.assertEqual(result.queue_offset, next_queue_offset)
        self.assertEqual(
            [r.offset for r in log.records(check_crc=True)], offsets + [end]
        )
        tail = disk(log, result.next_offset, segment_end)
        self.assertEqual(tail, bytes(len(tail)), "stale bytes after the new record")


class TornTailTests(RecoveryCheck, SynchronousTestCase):
    """
    A crash while the last record was being written.
    """

    def setUp(self) -> None:
        self.store = TornStore(self)

    def _crashed_copy(
        self, edit: Callable[[str, int], None], position: int
    ) -> CommitLog:
        """
        Copy the store, apply C{edit} to its last segment at commit-log
        C{position}, leave the abort marker and reopen it.
        """
        store_dir = copy_store(self, self.store.store_dir)
        edit(self.store.last_segment(store_dir), position - self.store.last_start)
        mark_unclean(store_dir)
        return open_store(self, store_dir)

    def test_torn_at_every_byte(self) -> None:
        """
        If writing the last record stopped at any of its bytes (the rest of
        the segment zero) and the abort marker was left, reopening cuts the
        torn record: the max offset is its start, the earlier records
        verify, zeros follow, and a new put lands there with the torn
        record's queue offset.

        The exception is a record whose missing bytes are all inside the
        PROPERTIES text: no 4.9 field covers it (no CRC; 5.x added
        C{__CRC32#}), so neither RocketMQ nor rmqha can tell it from a
        record whose properties hold NUL characters, and the record may
        be kept whole.
        """
        store = self.store
        properties_start = store.last + store.spans["PROPERTIES"].start

        def check(position: int) -> None:
            log = self._crashed_copy(zero_from, position)
            try:
                self.assertFalse(log.recovery.clean_shutdown)
                if log.max_offset == store.end and position >= properties_start:
                    self.assertRecovered(log, store.offsets, store.SEGMENT)
                else:
                    self.assertEqual(log.max_offset, store.last)
                    self.assertRecovered(log, store.offsets[:-1], store.SEGMENT, 6)
            finally:
                log.close()

        self.sweep(range(store.last, store.end), check)

    def test_garbled_at_every_byte(self) -> None:
        """
        If any one byte of the last record is flipped and the abort marker
        was left, reopening either cuts the record (max offset at its
        start) or keeps it whole, nothing else; a flipped byte in TOTALSIZE,
        MAGICCODE, BODYCRC, PHYSICALOFFSET, BODYLENGTH, the body,
        TOPICLENGTH or PROPERTIESLENGTH is always caught.  Either way the
        log verifies afterwards, a new put lands at the end and no stale
        bytes follow it.
        """
        store = self.store
        detected = {
            store.last + i for name in DETECTED_FIELDS for i in store.spans[name]
        }

        def check(position: int) -> None:
            log = self._crashed_copy(xor_byte, position)
            try:
                if position in detected or log.max_offset != store.end:
                    self.assertEqual(log.max_offset, store.last)
                    self.assertRecovered(log, store.offsets[:-1], store.SEGMENT)
                else:
                    self.assertRecovered(log, store.offsets, store.SEGMENT)
            finally:
                log.close()

        self.sweep(range(store.last, store.end), check)


    def test_torn_tail_quarantined(self) -> None:
        """
        What recovery cuts from a torn tail is first kept, byte for byte,
        in <store>/rmqha/quarantine/<offset>-<time>.bin, with a JSON
        sidecar saying where it was and why it was cut.
        """
        store = self.store
        store_dir = copy_store(self, store.store_dir)
        path = store.last_segment(store_dir)
        position = store.last - store.last_start
        zero_from(path, position + 60)
        with open(path, "rb") as f:
            cut = f.read()[position:].rstrip(b"\0")
        mark_unclean(store_dir)
        log = open_store(self, store_dir)
        self.assertEqual(log.max_offset, store.last)
        files = quarantined(store_dir)
        self.assertEqual(list(files.values()), [cut])
        (name,) = files
        self.assertTrue(name.startswith(f"{store.last:020d}-"), name)
        self.assertEqual(log.recovery.quarantined, [os.path.join(
            os.path.abspath(store_dir), "rmqha", "quarantine", name)])
        info = sidecar(store_dir, name)
        self.assertEqual((info["offset"], info["length"]), (store.last, len(cut)))
        self.assertEqual(info["segment"], segment_file_name(store.last_start))
        self.assertIn("torn tail", info["action"])
        self.assertRecovered(log, store.offsets[:-1], store.SEGMENT, 6)


class SegmentsPastTheEndTests(RecoveryCheck, SynchronousTestCase):
    """
    Segment files after the segment where the walk stopped.
    """

    SEGMENT = 512

    def _store(self, count: int = 6):
        """
        A closed store of 242-byte records, two per 512-byte segment.
        """
        messages = [make_message(body(150, i), topic="T") for i in range(count)]
        log = open_store(self, segment_size=self.SEGMENT)
        put_all(log, messages)
        log.close()
        offsets, _, end = plan_offsets(map(record_size, messages), self.SEGMENT)
        return log.store_dir, offsets, end

    def _tear_segment_one(self, store_dir: str, offsets: list[int]) -> int:
        """
        Tear the second record of segment 1 in its middle, leave the abort
        marker; the torn record's offset.
        """
        torn = offsets[3]
        self.assertEqual(torn // self.SEGMENT, 1)
        zero_from(segment_path(store_dir, self.SEGMENT), torn - self.SEGMENT + 100)
        mark_unclean(store_dir)
        return torn

    def test_data_after_torn_segment_refused(self) -> None:
        """
        When segment 1 is damaged in the middle while segment 2 holds valid
        records, that is not a torn tail (RocketMQ would destroy segment
        2): opening refuses with one line naming the bad record, its
        segment, the valid bytes after it and what to do, and no file
        changes.
        """
        store_dir, offsets, end = self._store()
        torn = self._tear_segment_one(store_dir, offsets)
        before = tree_digest(store_dir)
        error = self.assertRaises(CorruptRecordError, CommitLog.open, store_dir)
        message = str(error)
        self.assertNotIn("\n", message)
        self.assertIn(f"bad record at offset {torn} in segment "
                      f"{segment_file_name(self.SEGMENT)}", message)
        self.assertIn(f"{end - 2 * self.SEGMENT} bytes of valid records after it "
                      f"(offsets {2 * self.SEGMENT}..{end})", message)
        self.assertIn(f"rmqha store repair {os.path.abspath(store_dir)} --from REPLICA_DIR",
                      message)
        self.assertIn("--truncate-corrupt", message)
        self.assertEqual(tree_digest(store_dir), before)

    def test_truncate_corrupt_quarantines(self) -> None:
        """
        With truncate_corrupt, the same store opens cut at the bad record:
        the bytes cut from segment 1 and the whole of segment 2 are in
        <store>/rmqha/quarantine/ byte for byte (segment 2 under its own
        name), then zeroed or removed, and a put lands at the cut.
        """
        store_dir, offsets, _ = self._store()
        name = segment_file_name(2 * self.SEGMENT)
        torn = self._tear_segment_one(store_dir, offsets)
        files = segment_files(store_dir)
        position = torn - self.SEGMENT
        cut = files[segment_file_name(self.SEGMENT)][position:].rstrip(b"\0")
        log = open_store(self, store_dir, truncate_corrupt=True)
        self.assertEqual(log.max_offset, torn)
        self.assertTrue(log.recovery.truncated_corrupt)
        self.assertIn(f"bad record at offset {torn}", log.recovery.corruption)
        self.assertEqual(log.recovery.dropped_segments, [name])
        self.assertEqual(
            sorted(os.listdir(log.commitlog_dir)),
            [segment_file_name(0), segment_file_name(self.SEGMENT)],
        )
        self.assertEqual(list(quarantined(store_dir, f"{torn:020d}-*").values()), [cut])
        (kept,) = quarantined(store_dir, f"{name}-*.segment").items()
        self.assertEqual(kept[1], files[name])
        self.assertEqual(sidecar(store_dir, kept[0])["offset"], 2 * self.SEGMENT)
        self.assertFalse(os.path.exists(os.path.join(store_dir, "rmqha", "dropped")))
        self.assertRecovered(log, offsets[:3], self.SEGMENT)

    def test_garbage_segment_after_torn_tail_quarantined(self) -> None:
        """
        A later segment holding bytes but no valid record (garbage, not
        data) after a torn tail is part of the torn tail: it is moved into
        quarantine intact, and the store opens at the torn record.
        """
        store_dir, offsets, _ = self._store()
        name = segment_file_name(2 * self.SEGMENT)
        garbage = bytes(range(1, 129)) * (self.SEGMENT // 128)
        with open(segment_path(store_dir, 2 * self.SEGMENT), "wb") as f:
            f.write(garbage)
        torn = self._tear_segment_one(store_dir, offsets)
        log = open_store(self, store_dir)
        self.assertEqual(log.max_offset, torn)
        self.assertIsNone(log.recovery.corruption)
        self.assertEqual(list(quarantined(store_dir, f"{name}-*").values()), [garbage])
        self.assertRecovered(log, offsets[:3], self.SEGMENT)

    def test_quarantined_twice(self) -> None:
        """
        A segment quarantined a second time under the same name (within
        the same second) does not replace the first one in
        rmqha/quarantine/.
        """
        store_dir, offsets, _ = self._store()
        self._tear_segment_one(store_dir, offsets)
        name = segment_file_name(2 * self.SEGMENT)
        first = segment_files(store_dir)[name]
        log = open_store(self, store_dir, truncate_corrupt=True)
        # The same three offsets as before, other bodies: a new segment 2.
        results = put_all(
            log, [make_message(body(150, 40 + i), topic="T") for i in range(3)]
        )
        self.assertEqual([r.offset for r in results], offsets[3:])
        log.close()
        second = segment_files(store_dir)[name]
        self.assertNotEqual(first, second)
        self._tear_segment_one(store_dir, offsets)
        open_store(self, store_dir, truncate_corrupt=True).close()
        contents = list(quarantined(store_dir, f"{name}-*.segment").values())
        self.assertEqual(sorted(contents), sorted([first, second]))

    def test_preallocated_segment_after_partial_one(self) -> None:
        """
        An all-zero segment after a partly written last segment (one
        RocketMQ pre-allocated) is removed, not kept aside, and no record
        is lost.
        """
        store_dir, offsets, end = self._store(5)
        name = segment_file_name(3 * self.SEGMENT)
        with open(os.path.join(store_dir, "commitlog", name), "wb") as f:
            f.write(bytes(self.SEGMENT))
        log = open_store(self, store_dir)
        self.assertEqual(log.max_offset, end)
        self.assertNotIn(name, os.listdir(log.commitlog_dir))
        dropped = os.path.join(store_dir, "rmqha", "dropped", name)
        self.assertFalse(os.path.exists(dropped))
        self.assertRecovered(log, offsets, self.SEGMENT)

    def test_preallocated_segment_after_full_one(self) -> None:
        """
        An all-zero segment after a segment closed by a BLANK is where the
        log continues: nothing is lost and the next put lands at its start.
        """
        store_dir, offsets, _ = self._store(6)
        # A seventh record rolls to segment 3, leaving a BLANK in segment
        # 2; zeroing segment 3 makes it a pre-allocated, unwritten file.
        log = open_store(self, store_dir)
        result = log.put(make_message(body(150, 9), topic="T"))
        self.assertEqual(result.offset, 3 * self.SEGMENT)
        log.close()
        zero_from(segment_path(store_dir, 3 * self.SEGMENT), 0)
        log = open_store(self, store_dir)
        self.assertEqual(log.max_offset, 3 * self.SEGMENT)
        self.assertIsNone(log.recovery.stop_reason)
        self.assertIn(
            segment_file_name(3 * self.SEGMENT), os.listdir(log.commitlog_dir)
        )
        self.assertRecovered(log, offsets, self.SEGMENT)


class UnfinishedSegmentTests(SynchronousTestCase):
    """
    A last segment file whose creation was interrupted: a process killed
    between creating the file and giving it its size leaves it empty or
    short, and only zeros.  RocketMQ then refuses to start; rmqha opens the
    store without it, since nothing was ever written to it.
    """

    SEGMENT = 512

    def _store(self) -> tuple[str, list[int], int]:
        """
        Six records filling segments 0..2 exactly (two per segment, BLANK
        at the end of each), closed cleanly; offsets and the end.
        """
        messages = [make_message(body(150, i), topic="T") for i in range(6)]
        log = open_store(self, segment_size=self.SEGMENT)
        put_all(log, messages)
        log.close()
        offsets, _, end = plan_offsets(map(record_size, messages), self.SEGMENT)
        return log.store_dir, offsets, end

    def _leave(self, store_dir: str, content: bytes) -> str:
        """
        The next segment file, as a killed process left it.
        """
        name = segment_file_name(3 * self.SEGMENT)
        with open(os.path.join(store_dir, "commitlog", name), "wb") as f:
            f.write(content)
        mark_unclean(store_dir)
        return name

    def test_empty_file_removed(self) -> None:
        """
        A 0-byte last segment file is removed and named in the recovery
        report; every record survives, and the next put that needs the
        segment creates it again at its full size.
        """
        store_dir, offsets, _ = self._store()
        name = self._leave(store_dir, b"")
        log = open_store(self, store_dir, segment_size=self.SEGMENT)
        self.assertEqual(log.recovery.unfinished_segment, name)
        self.assertNotIn(name, os.listdir(log.commitlog_dir))
        self.assertEqual([r.offset for r in log.records(check_crc=True)], offsets)
        result = log.put(make_message(body(150, 9), topic="T"))
        self.assertEqual(result.offset, 3 * self.SEGMENT)
        log.close()
        self.assertEqual(len(segment_files(store_dir)[name]), self.SEGMENT)

    def test_short_zero_file_removed(self) -> None:
        """
        A last segment file cut short while it was being allocated (only
        zeros) is removed as well, also when the segment size is not
        given but read from the other files.
        """
        store_dir, offsets, end = self._store()
        name = self._leave(store_dir, bytes(100))
        log = open_store(self, store_dir)
        self.assertEqual(log.recovery.unfinished_segment, name)
        self.assertEqual(log.max_offset, end)
        self.assertNotIn(name, os.listdir(log.commitlog_dir))

    def test_short_file_with_data_refused(self) -> None:
        """
        A short last segment file holding data is not an interrupted
        creation (a truncated copy?): opening fails naming the file and
        both sizes, and the file is left as it was.
        """
        store_dir, _, _ = self._store()
        content = b"\0" * 50 + b"\x01" + b"\0" * 49
        name = self._leave(store_dir, content)
        error = self.assertRaises(
            StoreError, CommitLog.open, store_dir, segment_size=self.SEGMENT
        )
        self.assertIn(name, str(error))
        self.assertIn(f"100 bytes, but segments are {self.SEGMENT} bytes", str(error))
        self.assertEqual(segment_files(store_dir)[name], content)

    def test_read_only_ignores_it(self) -> None:
        """
        Read-only, the unfinished file is reported and left in place.
        """
        store_dir, offsets, _ = self._store()
        name = self._leave(store_dir, b"")
        before = tree_digest(store_dir)
        log = open_store(self, store_dir, read_only=True)
        self.assertEqual(log.recovery.unfinished_segment, name)
        self.assertEqual([r.offset for r in log.records(check_crc=True)], offsets)
        log.close()
        self.assertEqual(tree_digest(store_dir), before)

    def test_lone_unfinished_file(self) -> None:
        """
        A store whose only segment file is unfinished opens empty, and
        replication can then start it at any segment boundary.
        """
        store_dir = self.mktemp()
        os.makedirs(os.path.join(store_dir, "commitlog"))
        name = segment_file_name(4 * self.SEGMENT)
        with open(os.path.join(store_dir, "commitlog", name), "wb"):
            pass
        log = open_store(self, store_dir, segment_size=self.SEGMENT)
        self.assertEqual(log.recovery.unfinished_segment, name)
        self.assertFalse(log.has_data())
        self.assertEqual(os.listdir(log.commitlog_dir), [])

    def test_killed_while_creating(self) -> None:
        """
        The crash itself: a replica append that dies between creating the
        next segment's file and sizing it leaves a store that opens again,
        at the end of what was written, and accepts the rest.
        """
        store_dir, _, end = self._store()
        # Segments 0 and 1 whole, segment 2 up to its last record.
        data = b"".join(segment_files(store_dir).values())[:end]
        replica_dir = self.mktemp()
        replica = CommitLog.open(replica_dir, segment_size=self.SEGMENT, clock=fixed_clock)
        replica.append_at(0, data[: 2 * self.SEGMENT])

        class Killed(BaseException):
            pass

        def die(fd: int, size: int) -> None:
            raise Killed()

        allocate = _segments._allocate
        _segments._allocate = die
        try:
            self.assertRaises(
                Killed, replica.append_at, 2 * self.SEGMENT, data[2 * self.SEGMENT :]
            )
        finally:
            _segments._allocate = allocate
        # The process is gone, and so is its lock.
        assert replica._lock_fd is not None
        os.close(replica._lock_fd)
        replica._lock_fd = None
        self.assertEqual(
            len(segment_files(replica_dir)[segment_file_name(2 * self.SEGMENT)]), 0
        )
        replica = open_store(self, replica_dir, segment_size=self.SEGMENT)
        self.assertEqual(replica.recovery.unfinished_segment, segment_file_name(2 * self.SEGMENT))
        self.assertEqual(replica.max_offset, 2 * self.SEGMENT)
        replica.append_at(2 * self.SEGMENT, data[2 * self.SEGMENT :])
        replica.close()
        self.assertEqual(b"".join(segment_files(replica_dir).values())[:end], data)
        self.assertEqual(segment_files(replica_dir), segment_files(store_dir))


class WalkStartTests(SynchronousTestCase):
    """
    Where the recovery walk starts.
    """

    SEGMENT = 512

    def setUp(self) -> None:
        messages = [make_message(body(150, i), topic="T") for i in range(10)]
        log = open_store(self, segment_size=self.SEGMENT)
        put_all(log, messages)
        log.close()
        self.store_dir = log.store_dir
        self.offsets, _, self.end = plan_offsets(
            map(record_size, messages), self.SEGMENT
        )
        self.assertEqual(self.end // self.SEGMENT, 4)

    def _garble_body(self, offset: int) -> CommitLog:
        store_dir = copy_store(self, self.store_dir)
        start = offset - offset % self.SEGMENT
        xor_byte(segment_path(store_dir, start), offset - start + 88 + 10)
        mark_unclean(store_dir)
        return open_store(self, store_dir)

    def test_old_corruption_not_detected(self) -> None:
        """
        Like RocketMQ's recoverNormally, the walk starts at the third-to-last
        segment (RecoveryReport.walk_from), so a corrupt record in an
        older segment is not noticed by open(): the log keeps its length
        and only reading the record with CRC checks finds the damage.
        """
        log = self._garble_body(self.offsets[0])
        self.assertEqual(log.recovery.walk_from, 2 * self.SEGMENT)
        self.assertEqual(log.max_offset, self.end)
        error = self.assertRaises(RecordError, list, log.records(check_crc=True))
        self.assertEqual(error.offset, self.offsets[0])

    def _garbled_copy(self, offset: int) -> str:
        store_dir = copy_store(self, self.store_dir)
        start = offset - offset % self.SEGMENT
        xor_byte(segment_path(store_dir, start), offset - start + 88 + 10)
        return store_dir

    def test_corruption_in_walked_segment(self) -> None:
        """
        The same damage (one flipped body byte) in the third-to-last
        segment of a cleanly shut-down store, with valid records after it
        in that segment and the two later ones, refuses to open: one line
        naming the offset, the segment and the CRC mismatch, and no byte
        on disk changes.
        """
        first_walked = self.offsets[4]
        self.assertEqual(first_walked, 2 * self.SEGMENT)
        store_dir = self._garbled_copy(first_walked)
        before = tree_digest(store_dir)
        error = self.assertRaises(CorruptRecordError, CommitLog.open, store_dir)
        self.assertIn(f"bad record at offset {first_walked} in segment "
                      f"{segment_file_name(2 * self.SEGMENT)} (body CRC mismatch", str(error))
        self.assertIn(f"offsets {self.offsets[5]}..{self.end}", str(error))
        self.assertEqual(tree_digest(store_dir), before)

    def test_corruption_in_last_segment(self) -> None:
        """
        A flipped body byte in a middle record of the last segment (a
        record follows it) of a cleanly shut-down store: refused, nothing
        changed.  RocketMQ (and rmqha before) zeroed the record after it
        and reused its offsets.
        """
        bad = self.offsets[8]
        self.assertEqual((bad // self.SEGMENT, self.offsets[9] // self.SEGMENT), (4, 4))
        store_dir = self._garbled_copy(bad)
        before = tree_digest(store_dir)
        error = self.assertRaises(CorruptRecordError, CommitLog.open, store_dir)
        self.assertIn(f"bad record at offset {bad} in segment {segment_file_name(bad)}",
                      str(error))
        self.assertEqual(error.damage.next_valid, self.offsets[9])
        self.assertEqual(tree_digest(store_dir), before)

    def test_corruption_read_only(self) -> None:
        """
        Read-only, a corrupt store opens (inspection must work) with the
        corruption in the recovery report and nothing changed.
        """
        store_dir = self._garbled_copy(self.offsets[8])
        before = tree_digest(store_dir)
        log = open_store(self, store_dir, read_only=True)
        self.assertIn(f"bad record at offset {self.offsets[8]}", log.recovery.corruption)
        self.assertEqual(log.max_offset, self.offsets[8])
        log.close()
        self.assertEqual(tree_digest(store_dir), before)


class CleanShutdownTests(SynchronousTestCase):
    """
    RecoveryReport.clean_shutdown.
    """

    def test_clean_shutdown(self) -> None:
        """
        A store closed with close() reopens with clean_shutdown True; a
        copy taken while it was open (abort marker present) reopens with
        clean_shutdown False, and after closing that, True again.
        """
        log = open_store(self, segment_size=512)
        log.put(make_message())
        crashed = copy_store(self, log.store_dir)
        log.close()
        self.assertTrue(open_store(self, log.store_dir).recovery.clean_shutdown)
        self.assertTrue(os.path.exists(os.path.join(crashed, "abort")))
        reopened = open_store(self, crashed)
        self.assertFalse(reopened.recovery.clean_shutdown)
        self.assertEqual(reopened.max_offset, record_size(make_message()))
        reopened.close()
        self.assertTrue(open_store(self, crashed).recovery.clean_shutdown)


class ReadOnlyRecoveryTests(SynchronousTestCase):
    """
    read_only=True inspects a store without modifying anything.
    """

    SEGMENT = 512

    def _torn_store(self, with_later_segment: bool) -> tuple[str, list[int], int]:
        """
        A store of only commitlog/ whose last record (or, with
        C{with_later_segment}, a record of segment 1 while segment 2 has
        data) is torn; the surviving offsets and the torn one.
        """
        messages = [make_message(body(150, i), topic="T") for i in range(6)]
        log = open_store(self, segment_size=self.SEGMENT)
        put_all(log, messages)
        log.close()
        offsets, _, _ = plan_offsets(map(record_size, messages), self.SEGMENT)
        store_dir = self.mktemp()
        os.mkdir(store_dir)
        shutil.copytree(log.commitlog_dir, os.path.join(store_dir, "commitlog"))
        torn = offsets[3] if with_later_segment else offsets[-1]
        start = torn - torn % self.SEGMENT
        zero_from(segment_path(store_dir, start), torn - start + 60)
        return store_dir, offsets[: offsets.index(torn)], torn

    def _inspect(self, store_dir: str, offsets: list[int], torn: int) -> CommitLog:
        log = open_store(self, store_dir, read_only=True)
        self.assertEqual(log.max_offset, torn)
        self.assertEqual([r.offset for r in log.records(check_crc=True)], offsets)
        self.assertEqual(log.read(offsets[-1], 10_000), disk(log, offsets[-1], torn))
        log.close()
        return log

    def test_torn_tail(self) -> None:
        """
        Opening a torn store read-only, reading its records and closing it
        changes no byte and creates no lock, abort marker or rmqha/
        directory, while the CommitLog's max offset is the recovered end.
        """
        store_dir, offsets, torn = self._torn_store(with_later_segment=False)
        before = tree_digest(store_dir)
        self._inspect(store_dir, offsets, torn)
        self.assertEqual(tree_digest(store_dir), before)
        self.assertEqual(os.listdir(store_dir), ["commitlog"])

    def test_segment_past_the_end(self) -> None:
        """
        Read-only, a segment past a torn one is ignored, not moved: the
        files (and the abort marker a crash left) stay as they were.
        """
        store_dir, offsets, torn = self._torn_store(with_later_segment=True)
        mark_unclean(store_dir)
        before = tree_digest(store_dir)
        log = self._inspect(store_dir, offsets, torn)
        self.assertFalse(log.recovery.clean_shutdown)
        self.assertEqual(
            log.recovery.dropped_segments, [segment_file_name(2 * self.SEGMENT)]
        )
        self.assertEqual(tree_digest(store_dir), before)


class ReplicaTailTests(RecoveryCheck, SynchronousTestCase):
    """
    A replica whose last append ended inside a record.
    """

    def setUp(self) -> None:
        self.store = TornStore(self)
        self.data = file_bytes(
            self.store.store_dir, self.store.SEGMENT, 0, self.store.end
        )

    def _check_cut(self, present: int) -> None:
        """
        A replica holding C{present} bytes of the last record iterates the
        complete records while open; closed and reopened, it ends at the
        last complete record, followed by zeros.
        """
        store = self.store
        log = open_store(self, segment_size=store.SEGMENT)
        try:
            log.append_at(0, self.data[: store.last + present])
            self.assertEqual(log.max_offset, store.last + present)
            self.assertEqual([r.offset for r in log.records()], store.offsets[:-1])
        finally:
            log.close()
        log = open_store(self, log.store_dir)
        try:
            self.assertEqual(log.max_offset, store.last)
            self.assertEqual(
                [r.offset for r in log.records(check_crc=True)], store.offsets[:-1]
            )
            tail = disk(log, store.last, store.last_start + store.SEGMENT)
            self.assertEqual(tail, bytes(len(tail)))
        finally:
            log.close()

    def test_incomplete_record_cut(self) -> None:
        """
        Whatever part of the last record arrived, up to and including one
        byte of PROPERTIESLENGTH, records() stops before it while open and
        reopening cuts it.
        """
        self.sweep(range(1, self.store.spans["PROPERTIESLENGTH"].stop), self._check_cut)

    def test_incomplete_properties_cut(self) -> None:
        """
        A replica closed cleanly while the last record's PROPERTIES text
        was still missing must not, reopened, take the record as complete:
        it would report a max offset past the bytes it received and keep
        zeros where the master has property text, so the copies diverge
        for good.
        """
        self.sweep(self.store.spans["PROPERTIES"], self._check_cut)

    def test_put_after_incomplete_tail(self) -> None:
        """
        A put on a store whose tail is an incomplete replica record (a
        slave promoted without a restart) must not be acknowledged at an
        offset that recovery then cuts away: either it is refused, or the
        record it acknowledges is readable and survives reopening.
        """
        store = self.store
        log = open_store(self, segment_size=store.SEGMENT)
        log.append_at(0, self.data[: store.last + 40])
        try:
            result = log.put(make_message(b"promoted"))
        except (StoreError, MessageRejected):
            return
        self.assertIn(result.offset, [r.offset for r in log.records()])
        log.close()
        reopened = open_store(self, log.store_dir)
        self.assertIn(
            result.offset, [r.offset for r in reopened.records(check_crc=True)]
        )
