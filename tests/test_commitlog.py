"""
Tests for L{rmqha.store.commitlog}: the on-disk layout, the put path and its
BLANK rule, queue offsets, the replica path, the transfer read path,
flushing, record iteration and opening checks.

Recovery from crashes is in L{tests.test_recovery}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st
from twisted.logger import capturedLogs, formatEvent
from twisted.trial.unittest import SkipTest, SynchronousTestCase

import rmqha
from rmqha.store import _spans, commitlog
from rmqha.store._queues import QueueTable
from rmqha.store._record import (
    Blank,
    MessageRejected,
    Record,
    RecordError,
    SysFlag,
    encode_blank,
)
from rmqha.store.commitlog import (
    CommitLog,
    CorruptStoreError,
    FlushDiskType,
    OffsetMismatchError,
    CorruptReplicaError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    StoreError,
)

from tests._helpers import (
    replica_records,
    BLANK_MAGIC,
    MAGIC_V1,
    STORE_HOST_HEX,
    STORE_SECONDS,
    STORE_TIMESTAMP,
    commitlog_dir,
    copy_store,
    disk,
    disk_fields,
    fixed_clock,
    make_message,
    open_store,
    plan_offsets,
    put_all,
    record_size,
    segment_file_name,
    segment_files,
    segment_path,
    tree_digest,
    xor_byte,
)

SEGMENT = 512


def body_for_size(size: int, topic: str = "T") -> bytes:
    """
    A body making a record (no properties) exactly C{size} bytes long.
    """
    length = size - 91 - len(topic)
    assert length >= 0
    return bytes((i % 251) + 1 for i in range(length))


class LayoutTests(SynchronousTestCase):
    """
    The files a store consists of.
    """

    def test_empty_store(self) -> None:
        """
        A new store has no segment file yet and both its min and max
        offsets are 0.
        """
        log = open_store(self, segment_size=SEGMENT)
        self.assertEqual(os.listdir(log.commitlog_dir), [])
        self.assertEqual((log.min_offset, log.max_offset), (0, 0))

    def test_segments(self) -> None:
        """
        Segments are named by their start offset in 20 zero-padded digits,
        every file is exactly the segment size, the min offset is the first
        segment's start and the max offset is the end of the last record.
        """
        log = open_store(self, segment_size=SEGMENT)
        sizes = (100, 100, 250, 10, 300, 40, 100)
        messages = [make_message(b"m" * n) for n in sizes]
        put_all(log, messages)
        _, _, end = plan_offsets(map(record_size, messages), SEGMENT)
        expected = [segment_file_name(start) for start in range(0, end, SEGMENT)]
        self.assertEqual(
            expected[:2], ["00000000000000000000", "00000000000000000512"]
        )
        directory = commitlog_dir(log.store_dir)
        self.assertEqual(sorted(os.listdir(directory)), expected)
        for name in expected:
            self.assertEqual(os.path.getsize(os.path.join(directory, name)), SEGMENT)
        self.assertEqual((log.min_offset, log.max_offset), (0, end))

    def test_lock_and_abort_marker(self) -> None:
        """
        C{<store>/lock} and C{<store>/abort} exist while the store is open;
        C{close()} removes the C{abort} marker.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message())
        self.assertTrue(os.path.isfile(os.path.join(log.store_dir, "lock")))
        self.assertTrue(os.path.isfile(os.path.join(log.store_dir, "abort")))
        log.close()
        self.assertFalse(os.path.exists(os.path.join(log.store_dir, "abort")))


class PutTests(SynchronousTestCase):
    """
    The put path: where records land and what they hold.
    """

    def test_consecutive_offsets(self) -> None:
        """
        Records land back to back; each one's TOTALSIZE, MAGICCODE,
        PHYSICALOFFSET, BODYCRC, BODYLENGTH and STORETIMESTAMP on disk are
        what the 4.9 format says.
        """
        log = open_store(self, segment_size=4096)
        messages = [
            make_message(b"", topic="A"),
            make_message(b"hello", properties={"TAGS": "t1"}),
            make_message(bytes(range(256)), topic="Topic_B-2", queue_id=3),
        ]
        results = put_all(log, messages)
        offset = 0
        for message, result in zip(messages, results):
            size = record_size(message)
            self.assertEqual((result.offset, result.size), (offset, size))
            fields = disk_fields(log, offset)
            self.assertEqual(fields["TOTALSIZE"], size)
            self.assertEqual(fields["MAGICCODE"], MAGIC_V1)
            self.assertEqual(fields["PHYSICALOFFSET"], offset)
            self.assertEqual(
                fields["BODYCRC"], zlib.crc32(message.body) & 0x7FFFFFFF
            )
            self.assertEqual(fields["BODYLENGTH"], len(message.body))
            self.assertEqual(fields["STORETIMESTAMP"], STORE_TIMESTAMP)
            offset += size
        self.assertEqual(log.max_offset, offset)

    def test_queue_offsets_per_queue(self) -> None:
        """
        Queue offsets count from 0 separately for every (topic, queue id),
        in the AppendResult and in the QUEUEOFFSET field.
        """
        log = open_store(self, segment_size=4096)
        keys = [("A", 0), ("A", 1), ("B", 0), ("A", 0), ("B", 0), ("A", 1), ("A", 0)]
        results = put_all(log, [make_message(topic=t, queue_id=q) for t, q in keys])
        self.assertEqual([r.queue_offset for r in results], [0, 0, 0, 1, 1, 1, 2])
        on_disk = [disk_fields(log, r.offset)["QUEUEOFFSET"] for r in results]
        self.assertEqual(on_disk, [0, 0, 0, 1, 1, 1, 2])

    def test_transaction_sysflags(self) -> None:
        """
        Prepared (0x4) and rolled-back (0xC) transaction messages get queue
        offset 0 and take no slot; commit (0x8) messages count like plain
        ones.  SYSFLAG is stored as given.
        """
        log = open_store(self, segment_size=4096)
        sysflags = [0x0, 0x4, 0x0, 0xC, 0x8, 0x4, 0x0]
        results = put_all(log, [make_message(sysflag=s) for s in sysflags])
        self.assertEqual([r.queue_offset for r in results], [0, 0, 1, 0, 2, 0, 3])
        for sysflag, result in zip(sysflags, results):
            fields = disk_fields(log, result.offset)
            self.assertEqual(
                (fields["SYSFLAG"], fields["QUEUEOFFSET"]),
                (sysflag, result.queue_offset),
            )

    def test_append_result(self) -> None:
        """
        AppendResult carries the offset, size, queue offset, the store
        timestamp from the injected clock in ms, and the offsetMsgId: hex of
        the store host's address and port and the 8-byte offset.
        """
        log = open_store(self, segment_size=4096)
        log.put(make_message(b"first"))
        message = make_message(b"second", queue_id=2)
        result = log.put(message)
        offset = record_size(make_message(b"first"))
        self.assertEqual(result.offset, offset)
        self.assertEqual(result.size, record_size(message))
        self.assertEqual(result.next_offset, offset + record_size(message))
        self.assertEqual(result.queue_offset, 0)
        self.assertEqual(result.store_timestamp, STORE_TIMESTAMP)
        self.assertEqual(result.msg_id, STORE_HOST_HEX + "%016X" % offset)

    def test_store_timestamp_from_clock(self) -> None:
        """
        Every put reads the injected clock: STORETIMESTAMP is its value in
        whole milliseconds.
        """
        ticks = iter(range(10))
        log = open_store(
            self, segment_size=4096, clock=lambda: STORE_SECONDS + next(ticks) * 0.25
        )
        results = put_all(log, [make_message() for _ in range(3)])
        # open() may read the clock too; the puts read consecutive ticks.
        stamps = [r.store_timestamp for r in results]
        self.assertEqual((stamps[0] - STORE_TIMESTAMP) % 250, 0)
        self.assertEqual([b - a for a, b in zip(stamps, stamps[1:])], [250, 250])
        for result in results:
            self.assertEqual(
                disk_fields(log, result.offset)["STORETIMESTAMP"],
                result.store_timestamp,
            )


class BlankRuleTests(SynchronousTestCase):
    """
    RocketMQ's end-of-segment rule: a record is placed only if it leaves
    room for an 8-byte BLANK; otherwise a BLANK covers the rest.
    """

    def assertBlank(self, log: CommitLog, offset: int, size: int) -> None:
        data = disk(log, offset, offset + size)
        self.assertEqual(
            data[:8],
            size.to_bytes(4, "big", signed=True)
            + BLANK_MAGIC.to_bytes(4, "big", signed=True),
        )
        self.assertEqual(data[8:], bytes(size - 8))

    def test_leaving_exactly_eight_bytes_fits(self) -> None:
        """
        A record that leaves exactly 8 bytes in its segment stays there;
        the next record does not fit, so an 8-byte BLANK (int32 8, int32
        -875286124) fills the end and the record starts the next segment.
        """
        log = open_store(self, segment_size=SEGMENT)
        results = put_all(
            log,
            [
                make_message(body_for_size(300), topic="T"),
                make_message(body_for_size(204), topic="T"),
                make_message(body_for_size(100), topic="T"),
            ],
        )
        self.assertEqual([r.offset for r in results], [0, 300, 512])
        self.assertBlank(log, 504, 8)
        self.assertEqual(log.max_offset, 612)

    def test_leaving_seven_bytes_does_not_fit(self) -> None:
        """
        A record that would leave 7 bytes is not placed: a BLANK for the
        remaining 212 bytes is written at the old position (8 bytes; the
        rest stays zero) and the record goes to offset 0 of the next
        segment.
        """
        log = open_store(self, segment_size=SEGMENT)
        results = put_all(
            log,
            [
                make_message(body_for_size(300), topic="T"),
                make_message(body_for_size(205), topic="T"),
            ],
        )
        self.assertEqual([r.offset for r in results], [0, 512])
        self.assertBlank(log, 300, 212)
        self.assertEqual(
            sorted(os.listdir(log.commitlog_dir)),
            [segment_file_name(0), segment_file_name(512)],
        )

    def test_largest_record(self) -> None:
        """
        A record of segment size - 8 bytes fits an empty segment, both the
        first one and one rolled to.
        """
        log = open_store(self, segment_size=SEGMENT)
        results = put_all(
            log,
            [make_message(body_for_size(504), topic="T") for _ in range(2)],
        )
        self.assertEqual([r.offset for r in results], [0, 512])
        self.assertBlank(log, 504, 8)

    def test_record_larger_than_a_segment(self) -> None:
        """
        A record that cannot fit even an empty segment (size + 8 > segment
        size) is refused with MessageRejected naming the segment size: no
        BLANK, no new segment, no bytes, same max offset.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message(body_for_size(300), topic="T"))
        before = segment_files(log.store_dir)
        error = self.assertRaises(
            MessageRejected, log.put, make_message(body_for_size(505), topic="T")
        )
        self.assertIn("512", str(error))
        self.assertEqual(segment_files(log.store_dir), before)
        self.assertEqual(log.max_offset, 300)


_TOPIC_CHARS = "abcXYZ019%|_-"
_TEXT = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs",), blacklist_characters="\x00\x01\x02"
    ),
    min_size=1,
    max_size=12,
)
RANDOM_MESSAGES = st.lists(
    st.builds(
        make_message,
        body=st.binary(max_size=700),
        topic=st.text(alphabet=_TOPIC_CHARS, min_size=1, max_size=127),
        queue_id=st.integers(0, 7),
        properties=st.dictionaries(_TEXT, _TEXT, max_size=4),
        flag=st.integers(-(2**31), 2**31 - 1),
        born_timestamp=st.integers(0, 2**62),
    ),
    min_size=1,
    max_size=30,
)


class StoreRoundTripTests(SynchronousTestCase):
    """
    Random messages through the put path come back from the store, at the
    places RocketMQ's BLANK rule puts them.
    """

    @settings(deadline=None, derandomize=True, max_examples=60)
    @given(segment_size=st.integers(1024, 4096), messages=RANDOM_MESSAGES)
    def test_round_trip(self, segment_size, messages) -> None:
        """
        Every field of every message is read back, record offsets and BLANK
        fillers are where the rule computed by hand says, queue offsets
        count per (topic, queue), and all of it survives close and reopen.
        """
        log = open_store(self, segment_size=segment_size)
        fitting = [m for m in messages if record_size(m) + 8 <= segment_size]
        put_all(log, fitting)
        offsets, blanks, end = plan_offsets(map(record_size, fitting), segment_size)
        counters: dict = {}
        expected_queue_offsets = []
        for m in fitting:
            key = (m.topic, m.queue_id)
            expected_queue_offsets.append(counters.get(key, 0))
            counters[key] = counters.get(key, 0) + 1
        for reopened in (False, True):
            if reopened:
                log.close()
                log = open_store(self, log.store_dir)
            self.assertEqual(log.max_offset, end)
            items = list(log.records(check_crc=True, blanks=True))
            self.assertEqual(
                [(b.offset, b.size) for b in items if isinstance(b, Blank)], blanks
            )
            records = [r for r in items if isinstance(r, Record)]
            self.assertEqual([r.offset for r in records], offsets)
            self.assertEqual([r.queue_offset for r in records], expected_queue_offsets)
            for message, record in zip(fitting, records):
                self.assertEqual(
                    (record.topic, record.body, record.queue_id, record.flag,
                     record.properties, record.born_timestamp, record.size),
                    (message.topic, message.body, message.queue_id, message.flag,
                     dict(message.properties), message.born_timestamp,
                     record_size(message)),
                )


class BatchPutTests(SynchronousTestCase):
    """
    L{CommitLog.put_batch}: RocketMQ's batch put.  A batch is all or
    nothing and never straddles two segments.
    """

    def test_contiguous_records(self) -> None:
        """
        A batch lands as consecutive records with consecutive queue offsets
        per queue, in the order given.
        """
        log = open_store(self, segment_size=SEGMENT)
        messages = [make_message(b"m%d" % i, queue_id=i % 2) for i in range(4)]
        results = log.put_batch(messages)
        offsets, _, end = plan_offsets([record_size(m) for m in messages], SEGMENT)
        self.assertEqual([r.offset for r in results], offsets)
        self.assertEqual([r.queue_offset for r in results], [0, 0, 1, 1])
        self.assertEqual(log.max_offset, end)
        self.assertEqual(
            [disk_fields(log, o)["QUEUEOFFSET"] for o in offsets], [0, 0, 1, 1]
        )

    def test_whole_batch_moves_to_next_segment(self) -> None:
        """
        A batch that would fit record by record (the first record alone
        fits) but not as a whole goes entirely to the next segment, behind
        a BLANK at the old end (C{asyncPutMessages}).
        """
        log = open_store(self, segment_size=SEGMENT)
        first = sized(300)
        log.put(first)
        batch = [sized(150), sized(150)]
        # 300 + 150 + 8 fits, 300 + 300 + 8 does not.
        results = log.put_batch(batch)
        self.assertEqual([r.offset for r in results], [SEGMENT, SEGMENT + 150])
        blank = disk(log, 300, 308)
        self.assertEqual(blank, struct_pack_blank(SEGMENT - 300))

    def test_invalid_message_writes_nothing(self) -> None:
        """
        One refused message refuses the batch: no bytes, no queue offsets
        used, even for the messages before it.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message(b"a"))
        end = log.max_offset
        before = segment_files(log.store_dir)
        batch = [make_message(b"b"), make_message(b"c", topic="bad topic")]
        self.assertRaises(MessageRejected, log.put_batch, batch)
        self.assertEqual(log.max_offset, end)
        self.assertEqual(segment_files(log.store_dir), before)
        self.assertEqual(log.put(make_message(b"d")).queue_offset, 1)

    def test_invalid_message_after_the_roll_point(self) -> None:
        """
        A batch that does not fit the current segment and also holds a bad
        message is refused before the BLANK or a new segment is written.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(sized(300))
        before = segment_files(log.store_dir)
        batch = [
            sized(150),
            sized(150),
            make_message(b"x", topic="T", queue_id=2**31),
        ]
        e = self.assertRaises(MessageRejected, log.put_batch, batch)
        self.assertIn("queue_id", str(e))
        self.assertEqual(segment_files(log.store_dir), before)
        self.assertEqual(log.max_offset, 300)

    def test_batch_larger_than_a_segment(self) -> None:
        """
        A batch that could not fit even an empty segment is refused, on an
        empty store without creating the first segment.
        """
        log = open_store(self, segment_size=SEGMENT)
        batch = [sized(200) for _ in range(3)]
        e = self.assertRaises(MessageRejected, log.put_batch, batch)
        self.assertIn("600", str(e))
        self.assertEqual(os.listdir(commitlog_dir(log.store_dir)), [])

    def test_sync_flush_once_per_batch(self) -> None:
        """
        Under C{SYNC_FLUSH} the whole batch is on disk when it returns, by
        one flush.
        """
        log = open_store(
            self, segment_size=SEGMENT, flush_disk_type=FlushDiskType.SYNC_FLUSH
        )
        flushes = []
        original = log.flush
        log.flush = lambda: flushes.append(1) or original()  # type: ignore[method-assign]
        log.put_batch([make_message(b"a"), make_message(b"b"), make_message(b"c")])
        self.assertEqual(len(flushes), 1)
        self.assertEqual(log.flushed_offset, log.max_offset)

    def test_empty_batch(self) -> None:
        """
        An empty batch writes nothing and returns no results.
        """
        log = open_store(self, segment_size=SEGMENT)
        self.assertEqual(log.put_batch([]), [])
        self.assertEqual(log.max_offset, 0)


def sized(size: int):  # type: ignore[no-untyped-def]
    """
    A message whose record is exactly C{size} bytes.
    """
    return make_message(body_for_size(size), topic="T")


def struct_pack_blank(size: int) -> bytes:
    """
    A BLANK filler, by hand: int32 size, int32 0xCBD43194.
    """
    return size.to_bytes(4, "big") + (BLANK_MAGIC & 0xFFFFFFFF).to_bytes(4, "big")


class RejectionTests(SynchronousTestCase):
    """
    Messages the put path refuses leave the store as it was.
    """

    def setUp(self) -> None:
        self.log = open_store(self, segment_size=SEGMENT, max_message_size=300)
        self.log.put(make_message(b"x" * 100, topic="T"))

    def assertRejectedUnchanged(self, message) -> MessageRejected:
        """
        Putting C{message} raises MessageRejected and changes no file and
        not the max offset.
        """
        before = tree_digest(self.log.commitlog_dir)
        max_offset = self.log.max_offset
        error = self.assertRaises(MessageRejected, self.log.put, message)
        self.assertEqual(
            (self.log.max_offset, tree_digest(self.log.commitlog_dir)),
            (max_offset, before),
        )
        return error

    def test_oversized_body(self) -> None:
        """
        A body over max_message_size is refused and the text names both
        sizes; a body of exactly max_message_size is accepted.
        """
        error = self.assertRejectedUnchanged(make_message(b"x" * 301, topic="T"))
        self.assertIn("301", str(error))
        self.assertIn("300", str(error))
        # The refused message took no queue slot.
        result = self.log.put(make_message(b"x" * 300, topic="T"))
        self.assertEqual(result.queue_offset, 1)

    def test_bad_topics(self) -> None:
        """
        Empty topics, topics over 127 bytes and characters outside
        RocketMQ's [%|a-zA-Z0-9_-] are refused.
        """
        for topic in ["", "a" * 128, "bad topic", "t\u00f6pic", "a/b"]:
            self.assertRejectedUnchanged(make_message(topic=topic))

    def test_rejected_on_empty_store(self) -> None:
        """
        A message refused by a store holding nothing yet (bad topic,
        oversized body, a record larger than a segment) does not create
        the first segment file.
        """
        self.log = open_store(self, segment_size=SEGMENT, max_message_size=300)
        self.assertRejectedUnchanged(make_message(topic="bad topic"))
        self.assertRejectedUnchanged(make_message(b"x" * 301))
        big = open_store(self, segment_size=SEGMENT)
        self.assertRaises(
            MessageRejected, big.put, make_message(body_for_size(505), topic="T")
        )
        for log in (self.log, big):
            self.assertEqual(os.listdir(log.commitlog_dir), [])

    def test_longest_topic(self) -> None:
        """
        A 127-byte topic is accepted and stored in full.
        """
        result = self.log.put(make_message(topic="a" * 127))
        self.assertEqual(result.size, 91 + len(b"payload") + 127)
        records = list(self.log.records())
        self.assertEqual(records[-1].topic, "a" * 127)

    def test_out_of_range_field(self) -> None:
        """
        A message whose integer field does not fit its record field
        (queue id 2**31) is refused and the store is unchanged.
        """
        self.assertRejectedUnchanged(make_message(topic="T", queue_id=2**31))
        self.assertEqual(self.log.put(make_message(topic="T")).queue_offset, 1)

    def test_out_of_range_field_when_rolling(self) -> None:
        """
        The same refusal when the message would have started a new
        segment: the put path must not write the BLANK filler or create
        the next segment for a message it then refuses (the put contract:
        "nothing is written"), so the max offset stays where it was.
        """
        # 192 + 300 = 492 of 512 bytes used: a 300-byte record rolls.
        self.log.put(make_message(body_for_size(300), topic="T"))
        self.assertRejectedUnchanged(
            make_message(body_for_size(300), topic="T", queue_id=2**31)
        )


class QueueOffsetPersistenceTests(SynchronousTestCase):
    """
    Queue offsets continue across reopening, whatever state the snapshot
    in C{<store>/rmqha/queue-offsets.json} is in.
    """

    #: (topic, queue id) of the messages put by _fill, in order.
    KEYS = [("A", 0), ("A", 1), ("B", 0), ("A", 0), ("A", 1), ("A", 0)] * 2
    #: Queue offsets the next message of each queue must get.
    NEXT = {("A", 0): 6, ("A", 1): 4, ("B", 0): 2}

    def _fill(self):
        """
        A closed store holding KEYS over several 512-byte segments.
        """
        log = open_store(self, segment_size=SEGMENT)
        results = put_all(
            log, [make_message(b"q" * 120, topic=t, queue_id=q) for t, q in self.KEYS]
        )
        self.assertGreater(results[-1].offset, 2 * SEGMENT)
        log.close()
        return log.store_dir, results

    def _snapshot_path(self, store_dir: str) -> str:
        return os.path.join(store_dir, "rmqha", "queue-offsets.json")

    def _edit_snapshot(self, store_dir: str, edit) -> None:
        path = self._snapshot_path(store_dir)
        with open(path) as f:
            snapshot = json.load(f)
        edit(snapshot)
        with open(path, "w") as f:
            json.dump(snapshot, f)

    def assertContinues(self, store_dir: str, expected=None) -> None:
        log = open_store(self, store_dir)
        for (topic, queue_id), next_offset in (expected or self.NEXT).items():
            result = log.put(make_message(topic=topic, queue_id=queue_id))
            self.assertEqual(
                result.queue_offset, next_offset, f"queue {topic}:{queue_id}"
            )

    def test_reopen(self) -> None:
        """
        After close(), a snapshot exists and reopening continues every
        queue where it was.
        """
        store_dir, _ = self._fill()
        self.assertTrue(os.path.isfile(self._snapshot_path(store_dir)))
        self.assertContinues(store_dir)

    def test_snapshot_deleted(self) -> None:
        """
        Without the snapshot the queue offsets are rebuilt from the log.
        """
        store_dir, _ = self._fill()
        os.unlink(self._snapshot_path(store_dir))
        self.assertContinues(store_dir)

    def test_snapshot_garbage(self) -> None:
        """
        A snapshot that is not JSON is ignored and the offsets rebuilt.
        """
        store_dir, _ = self._fill()
        with open(self._snapshot_path(store_dir), "w") as f:
            f.write("{not json")
        self.assertContinues(store_dir)

    def test_snapshot_names_wrong_record(self) -> None:
        """
        A snapshot naming a record (offset, size, body CRC) that does not
        match the log, here with understated counters, is ignored.
        """
        store_dir, results = self._fill()

        def edit(snapshot):
            snapshot["check"] = [results[3].offset, results[3].size, 12345]
            snapshot["queues"] = [["A", 0, 1]]

        self._edit_snapshot(store_dir, edit)
        self.assertContinues(store_dir)

    def test_snapshot_names_offset_inside_record(self) -> None:
        """
        A snapshot naming a record at an offset that is inside a record is
        ignored.
        """
        store_dir, results = self._fill()

        def edit(snapshot):
            snapshot["check"] = [results[3].offset + 4, results[3].size, 1]
            snapshot["queues"] = []

        self._edit_snapshot(store_dir, edit)
        self.assertContinues(store_dir)

    def test_snapshot_past_end(self) -> None:
        """
        A snapshot taken at an offset beyond the log's end (the log was cut
        back since) is ignored.
        """
        store_dir, results = self._fill()

        def edit(snapshot):
            snapshot["offset"] = results[-1].next_offset + 1000
            snapshot["queues"] = []

        self._edit_snapshot(store_dir, edit)
        self.assertContinues(store_dir)

    def test_snapshot_from_log_replaced(self) -> None:
        """
        A snapshot left behind when the commit log was replaced by another
        store's (different records at the checked offset) is ignored.
        """
        store_dir, _ = self._fill()
        other = open_store(self, segment_size=SEGMENT)
        put_all(other, [make_message(b"o" * 33, topic="C") for _ in range(30)])
        other.close()
        os.rename(commitlog_dir(store_dir), commitlog_dir(store_dir) + ".old")
        os.rename(commitlog_dir(other.store_dir), commitlog_dir(store_dir))
        self.assertContinues(store_dir, {("C", 0): 30, ("A", 0): 0})

    def test_snapshot_stale_after_crash(self) -> None:
        """
        After a crash the snapshot is the one written when the last
        segment was started; the records put after it are counted too.
        """
        log = open_store(self, segment_size=SEGMENT)
        put_all(
            log, [make_message(b"q" * 120, topic=t, queue_id=q) for t, q in self.KEYS]
        )
        with open(self._snapshot_path(log.store_dir)) as f:
            self.assertLess(json.load(f)["offset"], log.max_offset)
        self.assertContinues(copy_store(self, log.store_dir))

    def test_snapshot_offset_inside_record(self) -> None:
        """
        A snapshot whose resume offset is inside a record (its check record
        is genuine) does not break the put path: it is ignored and queue
        offsets continue.
        """
        store_dir, results = self._fill()
        self._edit_snapshot(
            store_dir, lambda s: s.update(offset=results[4].offset + 5)
        )
        self.assertContinues(store_dir)

    def test_snapshot_offset_not_after_check(self) -> None:
        """
        A snapshot whose resume offset is not where its check record ends
        (or the next segment's start) is inconsistent and must not be
        trusted: here it names the first record, resumes at the end of the
        log and understates every queue.
        """
        store_dir, results = self._fill()

        def edit(snapshot):
            crc = zlib.crc32(b"q" * 120) & 0x7FFFFFFF
            snapshot["check"] = [results[0].offset, results[0].size, crc]
            snapshot["queues"] = [["A", 0, 1]]

        self._edit_snapshot(store_dir, edit)
        self.assertContinues(store_dir)


MESSAGES = st.lists(
    st.builds(
        make_message,
        body=st.binary(min_size=20, max_size=300),
        topic=st.sampled_from(["T", "TopicA", "Topic_B-9"]),
        queue_id=st.integers(0, 3),
        properties=st.sampled_from(
            [None, {"TAGS": "a"}, {"KEYS": "k1 k2", "TAGS": "tag"}]
        ),
    ),
    # Enough 111..419-byte records to fill several small segments.
    min_size=12,
    max_size=40,
)


class ReplicaAppendTests(SynchronousTestCase):
    """
    The replica path, C{append_at(offset, data)}.
    """

    # (tests.test_pure_path runs it again on the pure path: a second executor.)
    @settings(deadline=None, derandomize=True, max_examples=40,
              suppress_health_check=[HealthCheck.differing_executors])
    @given(
        segment_size=st.integers(512, 2048),
        messages=MESSAGES,
        cut_fractions=st.lists(st.floats(0, 1), max_size=12),
        cut_at_segments=st.booleans(),
        wrap=st.sampled_from([bytes, bytearray, memoryview]),
    )
    def test_copy_is_byte_identical(
        self, segment_size, messages, cut_fractions, cut_at_segments, wrap
    ) -> None:
        """
        Copying a master's bytes [min, max) into an empty store through
        append_at, in chunks that cut through records and cross segment
        boundaries, gives byte-identical segment files with the same names
        and the same max offset.
        """
        source = open_store(self, segment_size=segment_size)
        put_all(source, messages)
        _, _, end = plan_offsets(map(record_size, messages), segment_size)
        self.assertEqual(source.max_offset, end)
        data = disk(source, 0, end)
        cuts = {0, end, *(int(f * end) for f in cut_fractions)}
        if cut_at_segments:
            cuts.update(range(0, end, segment_size))
        cuts = sorted(cuts)
        target = open_store(self, segment_size=segment_size)
        for start, stop in zip(cuts, cuts[1:]):
            self.assertEqual(target.append_at(start, wrap(data[start:stop])), stop)
        self.assertEqual(target.max_offset, end)
        self.assertEqual(
            segment_files(target.store_dir), segment_files(source.store_dir)
        )
        source.close()
        target.close()

    # (tests.test_pure_path runs it again on the pure path: a second executor.)
    @settings(deadline=None, derandomize=True, max_examples=40,
              suppress_health_check=[HealthCheck.differing_executors])
    @given(
        segment_size=st.integers(512, 2048),
        messages=MESSAGES,
        cut_fractions=st.lists(st.floats(0, 1), max_size=12),
        piece_fractions=st.lists(st.floats(0, 1), max_size=12),
    )
    def test_pieces_are_byte_identical(
        self, segment_size, messages, cut_fractions, piece_fractions
    ) -> None:
        """
        append_at also takes a list of consecutive pieces (a slave's frame
        bodies, written by one pwritev per segment, not joined): copied in
        chunks of pieces that cut through records and cross segment
        boundaries, the store is byte-identical to the master's and every
        record was validated (the record end reaches the max offset).
        """
        source = open_store(self, segment_size=segment_size)
        put_all(source, messages)
        end = source.max_offset
        data = disk(source, 0, end)
        cuts = sorted({0, end, *(int(f * end) for f in cut_fractions)})
        target = open_store(self, segment_size=segment_size)
        for start, stop in zip(cuts, cuts[1:]):
            inner = sorted({start, stop, *(start + int(f * (stop - start)) for f in piece_fractions)})
            pieces = [memoryview(data)[a:b] for a, b in zip(inner, inner[1:])]
            self.assertEqual(target.append_at(start, pieces), stop)
        self.assertEqual((target.max_offset, target.record_end), (end, source.record_end))
        self.assertEqual(segment_files(target.store_dir), segment_files(source.store_dir))
        source.close()
        target.close()

    def _store_with_data(self) -> CommitLog:
        log = open_store(self, segment_size=SEGMENT)
        # A record, the BLANK closing the 512-byte segment, a record.
        log.append_at(
            0, replica_records(0, 300) + encode_blank(212).ljust(212, b"\0") + replica_records(512, 188)
        )
        return log

    def test_offset_mismatch_refused(self) -> None:
        """
        Bytes offered anywhere but at the max offset (leaving a gap, or
        overlapping) are refused with OffsetMismatchError naming the
        expected and the offered offset; nothing is written.
        """
        log = self._store_with_data()
        before = segment_files(log.store_dir)
        for offered in (701, 699, 0):
            error = self.assertRaises(OffsetMismatchError, log.append_at, offered, b"x")
            self.assertEqual((error.expected, error.offered), (700, offered))
            self.assertIn("700", str(error))
            self.assertIn(str(offered), str(error))
        self.assertEqual(segment_files(log.store_dir), before)
        self.assertEqual(log.max_offset, 700)

    def test_empty_store_starts_at_segment_boundary(self) -> None:
        """
        An empty store takes its first bytes at any multiple of the segment
        size: its first file is named after that offset, which becomes the
        min offset.
        """
        log = open_store(self, segment_size=SEGMENT)
        # A record, the BLANK, and the first 88 bytes of the next record.
        data = (
            replica_records(3 * SEGMENT, 400)
            + encode_blank(112).ljust(112, b"\0")
            + replica_records(4 * SEGMENT, 200)[:88]
        )
        self.assertEqual(log.append_at(3 * SEGMENT, data), 3 * SEGMENT + 600)
        self.assertEqual(
            sorted(os.listdir(log.commitlog_dir)),
            [segment_file_name(3 * SEGMENT), segment_file_name(4 * SEGMENT)],
        )
        self.assertEqual(
            (log.min_offset, log.max_offset), (3 * SEGMENT, 3 * SEGMENT + 600)
        )
        self.assertEqual(disk(log, 3 * SEGMENT, 4 * SEGMENT + 88), data)

    def test_empty_store_refuses_unaligned_start(self) -> None:
        """
        An empty store refuses a first offset that is not a segment
        boundary, naming it, and creates no file.
        """
        log = open_store(self, segment_size=SEGMENT)
        error = self.assertRaises(
            OffsetMismatchError, log.append_at, 3 * SEGMENT + 1, b"x"
        )
        self.assertEqual(error.offered, 3 * SEGMENT + 1)
        self.assertIn(str(3 * SEGMENT + 1), str(error))
        self.assertEqual(os.listdir(log.commitlog_dir), [])
        self.assertEqual(log.max_offset, 0)

    def test_read_only_refuses_writes(self) -> None:
        """
        A store opened read-only refuses put and append_at with
        ReadOnlyStoreError and its files stay as they were.
        """
        log = open_store(self, segment_size=SEGMENT)
        end = log.put(make_message()).next_offset
        log.close()
        before = tree_digest(log.store_dir)
        reader = open_store(self, log.store_dir, read_only=True)
        self.assertEqual(reader.max_offset, end)
        self.assertRaises(ReadOnlyStoreError, reader.put, make_message())
        self.assertRaises(ReadOnlyStoreError, reader.append_at, end, b"x")
        reader.close()
        self.assertEqual(tree_digest(log.store_dir), before)


class ReadTests(SynchronousTestCase):
    """
    The transfer read path.
    """

    def setUp(self) -> None:
        self.log = open_store(self, segment_size=SEGMENT)
        sizes = (300, 150, 90, 400, 10, 200, 200)
        messages = [make_message(b"r" * n, topic="T") for n in sizes]
        put_all(self.log, messages)
        _, blanks, self.end = plan_offsets(map(record_size, messages), SEGMENT)
        self.assertGreaterEqual(len(blanks), 2)

    def expected(self, offset: int, limit: int) -> bytes:
        """
        What a read must return: the file bytes up to the first of
        C{offset + limit}, the segment end and the max offset.
        """
        segment_end = offset - offset % SEGMENT + SEGMENT
        stop = min(offset + limit, segment_end, self.end)
        return disk(self.log, offset, stop) if stop > offset else b""

    @settings(deadline=None, derandomize=True, max_examples=150)
    @given(data=st.data(), limit=st.integers(0, 2000))
    def test_read_matches_files(self, data, limit) -> None:
        """
        read(offset, limit) is the file bytes from offset up to the first
        of offset + limit, the end of offset's segment and the max offset;
        read_view gives the same bytes as a memoryview.
        """
        offset = data.draw(st.integers(0, self.end))
        expected = self.expected(offset, limit)
        self.assertEqual(self.log.read(offset, limit), expected)
        with self.log.read_view(offset, limit) as view:
            self.assertIsInstance(view, memoryview)
            self.assertEqual(bytes(view), expected)

    def test_read_stops_at_segment_end(self) -> None:
        """
        Reading from 10 bytes before a segment's end with a large limit
        gives only those 10 bytes (the end of the BLANK filler).
        """
        chunk = self.log.read(SEGMENT - 10, 10_000)
        self.assertEqual(len(chunk), 10)
        self.assertEqual(chunk, disk(self.log, SEGMENT - 10, SEGMENT))

    def test_read_stops_at_max_offset(self) -> None:
        """
        A read never goes past the max offset, and at the max offset it
        gives b"".
        """
        self.assertEqual(
            self.log.read(self.end - 5, 100), disk(self.log, self.end - 5, self.end)
        )
        self.assertEqual(self.log.read(self.end, 100), b"")

    def test_read_of_the_written_segment_without_a_system_call(self) -> None:
        """
        A read of what this process's puts wrote through the last
        segment's mapping is a slice of it (no pread: a SYNC put's frame
        is read so); older segments, a last segment not mapped, and bytes
        the log held when opened or got from append_at are read with
        pread, so streaming a log maps and faults in nothing new.
        """
        segments = self.log._segments
        last = segments[-1]
        self.assertTrue(last.mapped)
        preads: list[tuple[int, int]] = []
        real = os.pread

        def counted(fd: int, size: int, position: int) -> bytes:
            preads.append((position, size))
            return real(fd, size, position)

        self.patch(os, "pread", counted)
        start = last.start
        self.assertEqual(self.log.read(start, 10_000), disk(self.log, start, self.end))
        self.assertEqual(preads, [])
        first = segments[0]
        if first.mapped:  # (as when only the transfer reads an old segment)
            first.mm.close()
            first._mm = None
        self.assertEqual(self.log.read(0, 100), disk(self.log, 0, 100))
        self.assertEqual(preads, [(0, 100)])
        self.assertFalse(first.mapped)
        # Opened again: nothing was put through this process's mapping yet.
        path = self.log.commitlog_dir
        self.log.close()
        log = CommitLog.open(os.path.dirname(path), segment_size=SEGMENT)
        self.addCleanup(log.close)
        del preads[:]
        tail = log._segments[-1]
        tail.mm  # (mapped, as puts would map it)
        self.assertEqual(log.read(tail.start, 10_000), disk(log, tail.start, self.end))
        self.assertEqual(preads, [(0, self.end - tail.start)])
        put_all(log, [make_message(b"n" * 50, topic="T")])
        self.assertEqual(log.read(self.end, 10_000), disk(log, self.end, log.max_offset))
        self.assertEqual(len(preads), 1)

    def test_empty_log(self) -> None:
        """
        An empty log reads as nothing at its max offset, 0, and refuses
        any other offset.
        """
        log = open_store(self, segment_size=SEGMENT)
        self.assertEqual(log.read(0, 100), b"")
        self.assertEqual(bytes(log.read_view(0, 100)), b"")
        self.assertRaises(OffsetOutOfRangeError, log.read, 1, 100)

    def test_out_of_range(self) -> None:
        """
        Offsets above the max offset or below the min offset raise
        OffsetOutOfRangeError with the offset and the bounds.
        """
        error = self.assertRaises(
            OffsetOutOfRangeError, self.log.read, self.end + 1, 10
        )
        self.assertEqual(
            (error.offset, error.min_offset, error.max_offset),
            (self.end + 1, 0, self.end),
        )
        replica = open_store(self, segment_size=SEGMENT)
        data = replica_records(3 * SEGMENT, 100)
        replica.append_at(3 * SEGMENT, data)
        for offset in (0, 3 * SEGMENT - 1, 3 * SEGMENT + 101):
            self.assertRaises(OffsetOutOfRangeError, replica.read, offset, 10)
            self.assertRaises(OffsetOutOfRangeError, replica.read_view, offset, 10)
        self.assertEqual(replica.read(3 * SEGMENT, 1000), data)


def open_commitlog_files(log: CommitLog) -> list[str]:
    """
    The names of C{log}'s segment files open in this process, once per
    descriptor (sorted).
    """
    if not os.path.isdir("/proc/self/fd"):
        raise SkipTest("needs /proc")
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(log.commitlog_dir):
            names.append(os.path.basename(target))
    return sorted(names)


class FileSpanTests(SynchronousTestCase):
    """
    L{CommitLog.file_span}: what L{CommitLog.read} would return, as a
    descriptor, a position, a size and a CRC-32 computed in a mapping of
    the segment file's own (rmqha/store/_spans.py).
    """

    def setUp(self) -> None:
        self.log = open_store(self, segment_size=64 * 1024)
        while len(self.log.segments) < 3:
            self.log.put(make_message(b"s" * 700))
        self.log.flush()
        self.end = self.log.max_offset

    @settings(deadline=None, derandomize=True, max_examples=100)
    @given(data=st.data(), limit=st.integers(0, 70_000))
    def test_span_is_the_read(self, data, limit) -> None:
        """
        The file holds, at the span's position, exactly the bytes read()
        returns for the same offset and limit, and the CRC is theirs.
        """
        offset = data.draw(st.integers(0, self.end))
        expected = self.log.read(offset, limit)
        fd, position, size, crc = self.log.file_span(offset, limit)
        self.assertEqual(size, len(expected))
        self.assertEqual(position, offset % (64 * 1024))
        self.assertEqual(os.pread(fd, size, position), expected)
        self.assertEqual(crc, zlib.crc32(expected))

    def test_readers_by_segment(self) -> None:
        """
        A span holds the file of its segment open on its own, for the next
        spans there; spans in other segments get readers of their own, up
        to C{_SPAN_READERS}, beyond which the least recently used is
        closed; the log's close closes them all.  The log's own state of
        an older segment (no descriptor, no mapping) is left as it was:
        the log's file checks never see the readers'.
        """
        self.patch(commitlog, "_SPAN_READERS", 2)
        first, second, last = self.log._segments
        before = open_commitlog_files(self.log)
        self.assertNotIn(os.path.basename(first.path), before)

        def spanned() -> set[str]:
            return {name for name in open_commitlog_files(self.log) if name not in before}

        fd, _, _, _ = self.log.file_span(100, 1000)
        again, _, _, _ = self.log.file_span(1100, 1000)
        self.assertEqual(again, fd)
        self.assertEqual(spanned(), {os.path.basename(first.path)})
        self.assertEqual((first.fd, first.mapped), (None, False))
        other, _, _, _ = self.log.file_span(second.start, 1000)
        self.assertNotEqual(other, fd)
        self.assertEqual(spanned(), {os.path.basename(first.path), os.path.basename(second.path)})
        self.assertEqual(self.log.file_span(2100, 1000)[0], fd)
        self.log.file_span(last.start, 1000)
        # (The second segment's reader was the least recently used.)
        self.assertEqual(spanned(), {os.path.basename(first.path)})
        self.assertEqual((second.fd, second.mapped), (None, False))
        self.log.close()
        self.assertEqual(open_commitlog_files(self.log), [])

    def test_reader_let_go_with_its_segment(self) -> None:
        """
        A replica cut back below the segment a span reader holds: the
        reader is closed with the segment (no removed file stays open).
        """
        log = open_store(self, segment_size=64 * 1024)
        offset = self.log.min_offset
        while offset < self.end:
            chunk = self.log.read(offset, self.end - offset)
            log.append_at(offset, chunk)
            offset += len(chunk)
        second = log._segments[1]
        log.file_span(second.start + 100, 1000)
        self.assertIn(os.path.basename(second.path), open_commitlog_files(log))
        log.truncate_replica(log.record_start_at_or_before(1000))
        self.assertEqual(len(log.segments), 1)
        self.assertNotIn(os.path.basename(second.path), open_commitlog_files(log))
        self.assertEqual(log._spans, {})

    def test_without_the_guard(self) -> None:
        """
        Where a mapping cannot be guarded (no compiled module, or every
        slot taken), a fault would kill the process: the reader checksums
        what C{pread} reads instead, with the same results.
        """
        self.patch(_spans._guard, "add", lambda mm: -1)
        preads: list[int] = []
        real = os.pread

        def counted(fd: int, size: int, position: int) -> bytes:
            preads.append(size)
            return real(fd, size, position)

        self.patch(_spans.os, "pread", counted)
        for offset in (0, 1000, 70_000):
            del preads[:]
            fd, position, size, crc = self.log.file_span(offset, 3000)
            self.assertEqual(preads, [size])
            expected = self.log.read(offset, 3000)
            self.assertEqual(crc, zlib.crc32(expected))

    def test_pages_given_back(self) -> None:
        """
        Consecutive spans give their pages back every C{SPAN_BLOCK} bytes
        (whole pages, none twice); a span elsewhere gives back those before
        it first.
        """
        dropped: list[tuple[int, int]] = []
        real = _spans._drop_pages

        def drop(mm: Any, start: int, end: int) -> None:
            dropped.append((start, end))
            real(mm, start, end)

        self.patch(_spans, "_drop_pages", drop)
        self.patch(_spans, "SPAN_BLOCK", 3 * 4096)
        offset = 0
        while offset < 40_000:
            offset += self.log.file_span(offset, 1000)[2]
        self.assertEqual(dropped[0], (0, 13_000))
        for (_, end), (start, _) in zip(dropped, dropped[1:]):
            self.assertEqual(start, end - end % 4096)
        self.assertTrue(all(end - start >= 3 * 4096 for start, end in dropped))
        self.assertGreaterEqual(offset - dropped[-1][1], 0)
        del dropped[:]
        self.log.file_span(50_000, 1000)
        self.assertEqual(len(dropped), 1)
        self.assertEqual(dropped[0][1], offset)


class FlushTests(SynchronousTestCase):
    """
    flushed_offset, flush() and flush_plan().
    """

    def test_flush(self) -> None:
        """
        Puts do not advance the flushed offset by themselves; flush()
        advances it to the max offset and returns it.  A reopened store
        has nothing to flush.
        """
        log = open_store(self, segment_size=SEGMENT)
        put_all(log, [make_message(b"f" * 200) for _ in range(5)])
        self.assertEqual(log.flushed_offset, 0)
        self.assertEqual(log.flush(), log.max_offset)
        self.assertEqual(log.flushed_offset, log.max_offset)
        log.close()
        reopened = open_store(self, log.store_dir)
        self.assertEqual(reopened.flushed_offset, reopened.max_offset)
        self.assertIsNone(reopened.flush_plan())

    def test_flush_plan_threshold(self) -> None:
        """
        flush_plan(least_bytes) is None while fewer than least_bytes are
        unflushed; otherwise executing the plan and reporting it done
        moves the flushed offset to the plan's target, the max offset.
        """
        log = open_store(self, segment_size=SEGMENT)
        self.assertIsNone(log.flush_plan())
        size = log.put(make_message(b"f" * 100)).size
        self.assertIsNone(log.flush_plan(size + 1))
        plan = log.flush_plan(size)
        self.assertEqual(plan.target, size)
        plan.execute()
        log.flush_done(plan)
        self.assertEqual(log.flushed_offset, size)
        self.assertIsNone(log.flush_plan())

    def test_sync_flush(self) -> None:
        """
        With SYNC_FLUSH every put and every replica append is flushed
        before it returns.
        """
        sync = FlushDiskType.SYNC_FLUSH
        log = open_store(self, segment_size=SEGMENT, flush_disk_type=sync)
        for n in (100, 300, 300, 10):
            log.put(make_message(b"s" * n))
            self.assertEqual(log.flushed_offset, log.max_offset)
        replica = open_store(self, segment_size=SEGMENT, flush_disk_type=sync)
        position = 0
        while position < log.max_offset:
            position = replica.append_at(position, log.read(position, 200))
            self.assertEqual(replica.flushed_offset, position)


class ClosedStoreTests(SynchronousTestCase):
    """
    A closed store refuses every access instead of quietly mapping its
    files again.
    """

    def test_closed_refuses_access(self) -> None:
        """
        put, put_batch, append_at, read, read_view and records all raise
        L{StoreError} naming the store once it is closed.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message(b"a"))
        end = log.max_offset
        log.close()
        for call in [
            lambda: log.put(make_message(b"b")),
            lambda: log.put_batch([make_message(b"b")]),
            lambda: log.append_at(end, b"xx"),
            lambda: log.read(0, 10),
            lambda: log.read_view(0, 10),
            lambda: list(log.records()),
        ]:
            e = self.assertRaises(StoreError, call)
            self.assertIn("closed", str(e))
        with open(segment_path(log.store_dir, 0), "rb") as f:
            self.assertEqual(f.read(end + 2)[end:], b"\0\0")


class RecordsAndOpeningTests(SynchronousTestCase):
    """
    records() iteration and the checks made when opening a store.
    """

    def test_records(self) -> None:
        """
        records() yields every message as put, at the planned offsets, and
        with blanks=True also the BLANK fillers in place.
        """
        log = open_store(self, segment_size=SEGMENT)
        messages = [
            make_message(b"a" * n, topic=t, queue_id=q, properties=p)
            for n, t, q, p in [
                (300, "A", 0, None),
                (200, "B", 1, {"TAGS": "x"}),
                (10, "A", 0, {"KEYS": "k", "TAGS": "y"}),
                (400, "A", 2, None),
                (0, "C", 0, None),
            ]
        ]
        put_all(log, messages)
        offsets, blanks, _ = plan_offsets(map(record_size, messages), SEGMENT)
        records = list(log.records(check_crc=True))
        self.assertEqual([r.offset for r in records], offsets)
        self.assertEqual(
            [(r.topic, r.queue_id, r.body, r.properties, r.crc_ok) for r in records],
            [(m.topic, m.queue_id, m.body, dict(m.properties), True) for m in messages],
        )
        with_blanks = list(log.records(blanks=True))
        self.assertEqual(
            [(b.offset, b.size) for b in with_blanks if isinstance(b, Blank)], blanks
        )
        self.assertEqual(
            [r.offset for r in with_blanks if isinstance(r, Record)], offsets
        )

    def test_records_check_crc(self) -> None:
        """
        A body byte changed on disk makes records(check_crc=True) raise
        RecordError at that record; without check_crc it is yielded with
        crc_ok False.
        """
        log = open_store(self, segment_size=SEGMENT)
        results = put_all(log, [make_message(b"c" * 50) for _ in range(3)])
        xor_byte(segment_path(log.store_dir, 0), results[1].offset + 88 + 7)
        error = self.assertRaises(RecordError, list, log.records(check_crc=True))
        self.assertEqual(error.offset, results[1].offset)
        self.assertEqual([r.crc_ok for r in log.records()], [True, False, True])

    def test_segment_size_mismatch(self) -> None:
        """
        Opening an existing store with a different segment size fails with
        a StoreError naming both sizes, and leaves the store usable.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message())
        log.close()
        before = tree_digest(log.store_dir)
        error = self.assertRaises(
            StoreError,
            CommitLog.open,
            log.store_dir,
            segment_size=1024,
            clock=fixed_clock,
        )
        self.assertIn("512", str(error))
        self.assertIn("1024", str(error))
        self.assertEqual(tree_digest(log.store_dir), before)
        self.assertEqual(open_store(self, log.store_dir).segment_size, SEGMENT)

    def test_foreign_file(self) -> None:
        """
        A file in commitlog/ that is not a segment makes open fail with
        CorruptStoreError naming the file.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message())
        log.close()
        with open(os.path.join(log.commitlog_dir, "notes.txt"), "w") as f:
            f.write("hello")
        error = self.assertRaises(
            CorruptStoreError, CommitLog.open, log.store_dir, clock=fixed_clock
        )
        self.assertIn("notes.txt", str(error))

    def test_second_writer_locked(self) -> None:
        """
        While a store is open for writing, another process's writable open
        fails with StoreLockedError (POSIX locks are per process, hence the
        subprocess); once it is closed, the other process can open it.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.put(make_message())
        script = (
            "import sys\n"
            "from rmqha.store.commitlog import CommitLog, StoreLockedError\n"
            "try:\n"
            "    CommitLog.open(sys.argv[1]).close()\n"
            "except StoreLockedError as e:\n"
            "    print(e)\n"
            "    sys.exit(3)\n"
        )
        env = dict(os.environ)
        checkout = os.path.dirname(os.path.dirname(os.path.abspath(rmqha.__file__)))
        env["PYTHONPATH"] = checkout

        def other_process():
            return subprocess.run(
                [sys.executable, "-c", script, log.store_dir],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )

        locked = other_process()
        self.assertEqual(locked.returncode, 3, locked.stderr)
        self.assertIn(log.store_dir, locked.stdout)
        log.close()
        unlocked = other_process()
        self.assertEqual(unlocked.returncode, 0, unlocked.stderr)


class ReplicaValidationTests(SynchronousTestCase):
    """
    Every replicated record is checked as it completes; a bad one is cut
    and never becomes part of the log (so a slave never acknowledges it).
    """

    def flipped(self, data: bytes, position: int) -> bytes:
        return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]

    def test_bad_record_in_a_later_piece(self) -> None:
        """
        A damaged record in a later piece, or one cut between two pieces,
        is refused like one in a single chunk: the log is cut back to its
        start and nothing from it on counts as validated.
        """
        good = replica_records(0, 150, 200, 100)
        for cut in (160, 250, 350):
            log = open_store(self, segment_size=SEGMENT)
            bad = self.flipped(good, 150 + 5)
            error = self.assertRaises(
                CorruptReplicaError, log.append_at, 0, [bad[:cut], bad[cut:]]
            )
            self.assertIn("bad magic code", str(error))
            self.assertEqual((log.max_offset, log.record_end), (150, 150))

    def test_good_records_in_any_chunking(self) -> None:
        """
        Records arriving whole, byte by byte, or split at every position
        complete: the record end follows them.
        """
        data = replica_records(0, 150, 200) + encode_blank(162).ljust(162, b"\0")
        data += replica_records(512, 300)
        for cut in range(0, len(data), 37):
            log = open_store(self, segment_size=SEGMENT)
            log.append_at(0, data[:cut])
            log.append_at(cut, data[cut:])
            self.assertEqual((log.record_end, log.max_offset), (812, 812))

    def test_corrupt_body_is_cut(self) -> None:
        """
        A flipped body byte: CorruptReplicaError naming the record's offset
        and "body CRC mismatch"; the log ends at that record, its bytes are
        zeros, the good record before it stays, and the right bytes are then
        accepted at that offset.
        """
        good = replica_records(0, 150, 200)
        bad = self.flipped(good, 150 + 88 + 5)
        for chunks in ([bad], [bad[:160], bad[160:]], [bad[:300], bad[300:]]):
            log = open_store(self, segment_size=SEGMENT)
            error = None
            position = 0
            for chunk in chunks:
                try:
                    log.append_at(position, chunk)
                except CorruptReplicaError as e:
                    error = e
                    break
                position += len(chunk)
            assert error is not None
            self.assertEqual(error.offset, 150)
            self.assertIn("body CRC mismatch", str(error))
            self.assertEqual((log.record_end, log.max_offset), (150, 150))
            self.assertEqual(disk(log, 0, 512)[150:], bytes(362))
            log.append_at(150, good[150:])
            self.assertEqual(log.record_end, 350)

    def test_other_corruptions(self) -> None:
        """
        A bad magic, an impossible size and a wrong PHYSICALOFFSET are each
        refused, naming what was wrong.
        """
        good = replica_records(0, 150, 200)
        cases = [
            (self.flipped(good, 150 + 5), "bad magic code"),
            (good[:150] + (600).to_bytes(4, "big") + good[154:], "total size 600 is impossible"),
            (replica_records(0, 150) + replica_records(999, 200), "PHYSICALOFFSET field says 999"),
        ]
        for data, needle in cases:
            log = open_store(self, segment_size=SEGMENT)
            error = self.assertRaises(CorruptReplicaError, log.append_at, 0, data)
            self.assertIn(needle, str(error))
            self.assertEqual(log.max_offset, 150)

    def test_ipv6_flags_on_a_small_record(self) -> None:
        """
        A small record whose SYSFLAG claims IPv6 hosts (so its body length
        would sit past its end) is refused, whether it arrived whole or in
        two pieces (found by python -m tools.fuzz: it used to raise
        struct.error).
        """
        good = bytearray(replica_records(0, 98))
        good[39] |= 0x30  # BORNHOST_V6 | STOREHOST_V6
        for cut in (len(good), 50):
            log = open_store(self, segment_size=SEGMENT)
            with self.assertRaises(CorruptReplicaError) as raised:
                log.append_at(0, bytes(good[:cut]))
                log.append_at(cut, bytes(good[cut:]))
            self.assertIn("too small for its hosts", str(raised.exception))
            self.assertEqual(log.max_offset, 0)

    def test_segment_size_mismatch(self) -> None:
        """
        A BLANK filler that does not end at this store's segment end means
        the master's segments are another size: refused, saying so.
        """
        data = replica_records(0, 300) + encode_blank(724).ljust(724, b"\0")
        log = open_store(self, segment_size=SEGMENT)
        error = self.assertRaises(CorruptReplicaError, log.append_at, 0, data[:400])
        self.assertIn("segment size differs", str(error))
        self.assertIn("mappedFileSizeCommitLog", str(error))
        self.assertEqual(log.max_offset, 300)


class ResourceTests(SynchronousTestCase):
    """
    A long-running master keeps neither mappings nor descriptors of full
    segments (found by python -m tools.soak: RSS and open files grew with
    every segment written).
    """

    def test_full_segments_released(self) -> None:
        """
        After rolling through five segments, reading old ones, and a flush:
        only the last segment is mapped and open.
        """
        if not os.path.isdir("/proc/self/fd"):
            raise SkipTest("needs /proc")
        log = open_store(self, segment_size=64 * 1024)
        for i in range(320):
            result = log.put(make_message(b"r" * 1000))
            if i % 40 == 0:
                log.read(max(0, result.offset - 3000), 1000)
        log.flush()
        last = log._segments[-1]
        self.assertGreaterEqual(len(log._segments), 5)
        self.assertEqual([s for s in log._segments if s._mm is not None], [last])
        self.assertEqual(set(open_commitlog_files(log)), {os.path.basename(last.path)})


class TruncateReplicaTests(SynchronousTestCase):
    """
    C{truncate_replica}: a diverged slave cuts back to a common offset.
    """

    def test_cut_across_segments_then_append(self) -> None:
        """
        A cut inside the first of three segments zeroes the rest, removes
        the later segment files, and the next append lands right there.
        """
        source = open_store(self, segment_size=SEGMENT)
        for _ in range(6):
            source.put(make_message(body_for_size(300)))  # 305 bytes with topic "TopicA"
        log = open_store(self, segment_size=SEGMENT)
        position = 0
        while position < source.max_offset:
            chunk = source.read(position, source.max_offset - position)
            log.append_at(position, chunk)
            position += len(chunk)
        self.assertGreaterEqual(len(os.listdir(log.commitlog_dir)), 3)
        log.truncate_replica(305)
        self.assertEqual((log.max_offset, log.record_end), (305, 305))
        self.assertEqual(os.listdir(log.commitlog_dir), [segment_file_name(0)])
        log.append_at(305, source.read(305, SEGMENT - 305))
        self.assertEqual(log.max_offset, SEGMENT)
        self.assertRaises(OffsetOutOfRangeError, log.truncate_replica, SEGMENT + 1)

    def test_cut_bytes_quarantined(self) -> None:
        """
        What truncate_replica cuts (records the slave held, perhaps the
        only copy of them) is kept byte for byte in
        <store>/rmqha/quarantine/<offset>-<time>.bin, with a JSON sidecar
        saying where it was and why, before it is zeroed.
        """
        source = open_store(self, segment_size=SEGMENT)
        for _ in range(4):
            source.put(make_message(body_for_size(300)))
        log = open_store(self, segment_size=SEGMENT)
        log.append_at(0, source.read(0, SEGMENT))
        log.append_at(SEGMENT, source.read(SEGMENT, SEGMENT))
        end = log.max_offset
        expected = source.read(305, SEGMENT - 305) + source.read(SEGMENT, SEGMENT)
        log.truncate_replica(305)
        directory = os.path.join(log.store_dir, "rmqha", "quarantine")
        names = sorted(os.listdir(directory))
        self.assertEqual(len(names), 2, names)
        self.assertTrue(names[0].startswith(f"{305:020d}-"), names)
        with open(os.path.join(directory, names[0]), "rb") as f:
            self.assertEqual(f.read(), expected)
        with open(os.path.join(directory, names[1])) as f:
            info = json.load(f)
        self.assertEqual(
            (info["offset"], info["end"], info["length"]), (305, end, len(expected))
        )
        self.assertIn("diverged", info["action"])


    def test_cut_in_three_steps(self) -> None:
        """
        A cut back's steps (what a slave runs in a thread, on the reactor,
        in a thread): after the quarantine copy and the quick step, the
        log ends at the cut for every reader, though no byte has been
        zeroed and no file removed yet; the bulk then zeroes the cut bytes
        of the segment that stays and removes the later segment files.
        """
        source = open_store(self, segment_size=SEGMENT)
        for _ in range(6):
            source.put(make_message(body_for_size(300)))
        log = open_store(self, segment_size=SEGMENT)
        log.append_at(0, source.read(0, source.max_offset))
        while log.max_offset < source.max_offset:
            log.append_at(log.max_offset, source.read(log.max_offset, SEGMENT))
        files = sorted(os.listdir(log.commitlog_dir))
        self.assertGreaterEqual(len(files), 3)
        path = log.quarantine_tail(305)
        self.assertIsNotNone(path)
        bulk = log.cut_quarantined(305)
        self.assertEqual((log.max_offset, log.record_end), (305, 305))
        self.assertEqual(log.read(305, 100), b"")
        self.assertEqual(sorted(os.listdir(log.commitlog_dir)), files)
        with open(os.path.join(log.commitlog_dir, files[0]), "rb") as f:
            self.assertNotEqual(f.read()[305:610], bytes(305))
        bulk()
        self.assertEqual(os.listdir(log.commitlog_dir), [segment_file_name(0)])
        with open(os.path.join(log.commitlog_dir, files[0]), "rb") as f:
            self.assertEqual(f.read()[305:SEGMENT], bytes(SEGMENT - 305))
        log.append_at(305, source.read(305, SEGMENT - 305))
        self.assertEqual(log.max_offset, SEGMENT)


class AppendObserverTests(SynchronousTestCase):
    """
    L{CommitLog.observe_appends}: the log tells its observers "appended up
    to N" itself after a put, a batch or an append_at, so writers need not
    remember to notify anyone.
    """

    def test_put_and_batch_notify_the_new_end(self) -> None:
        """
        A put and a batch each call every observer once, with the new max
        offset, before they return; a refused put calls nobody.
        """
        log = open_store(self, segment_size=SEGMENT)
        seen: list[int] = []
        log.observe_appends(seen.append)
        log.put(make_message(b"one"))
        self.assertEqual(seen, [log.max_offset])
        log.put_batch([make_message(b"two"), make_message(b"three")])
        self.assertEqual(seen[1:], [log.max_offset])
        self.assertRaises(MessageRejected, log.put, make_message(b"x" * 10000))
        log.put_batch([])
        self.assertEqual(len(seen), 2)

    def test_append_at_notifies_the_new_end(self) -> None:
        """
        append_at calls the observers with the new max offset, even when the
        bytes end inside a record; an empty append calls nobody.
        """
        log = open_store(self, segment_size=SEGMENT)
        seen: list[int] = []
        log.observe_appends(seen.append)
        data = replica_records(0, 300)
        log.append_at(0, data[:100])
        log.append_at(100, data[100:])
        log.append_at(300, b"")
        self.assertEqual(seen, [100, 300])

    def test_stop_observing(self) -> None:
        """
        The function observe_appends returns stops the observing, and may
        be called twice.
        """
        log = open_store(self, segment_size=SEGMENT)
        seen: list[int] = []
        stop = log.observe_appends(seen.append)
        log.put(make_message(b"one"))
        stop()
        stop()
        log.put(make_message(b"two"))
        self.assertEqual(len(seen), 1)

    def test_failing_observer_is_logged(self) -> None:
        """
        An observer that raises does not fail the put (it is stored) nor
        keep the other observers from being called; the failure is logged.
        """
        log = open_store(self, segment_size=SEGMENT)
        seen: list[int] = []

        def broken(end: int) -> None:
            raise ZeroDivisionError(end)

        log.observe_appends(broken)
        log.observe_appends(seen.append)
        result = log.put(make_message(b"one"))
        self.assertEqual(seen, [result.next_offset])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)


class QueueTableTests(SynchronousTestCase):
    """
    L{QueueTable} on its own: fed records and an item reader, no commit
    log.
    """

    def test_fed_records(self) -> None:
        """
        catch_up reads the records it is given from where the table ends,
        counting each (topic, queue)'s next queue offset and skipping
        prepared and rolled-back transaction messages; save writes a
        snapshot a new table loads instead of reading the records again.
        """
        log = open_store(self, segment_size=4096)
        put_all(log, [
            make_message(b"a", queue_id=0),
            make_message(b"b", queue_id=1),
            make_message(b"d", queue_id=0, sysflag=SysFlag.TRANSACTION_PREPARED_TYPE),
            make_message(b"c", queue_id=0),
        ])
        items = list(log.records(with_body=False))
        starts: list[int] = []

        def records_from(start: int) -> list:
            starts.append(start)
            return [r for r in items if r.offset >= start]

        def item_at(offset: int) -> Record:
            return next(r for r in items if r.offset == offset)

        directory = self.mktemp()
        table = QueueTable(directory)
        self.assertFalse(table.current(log.max_offset))
        got = table.catch_up(log.min_offset, log.max_offset, records_from, item_at)
        self.assertEqual(got, {("TopicA", 0): 2, ("TopicA", 1): 1})
        self.assertTrue(table.current(log.max_offset))
        self.assertEqual(starts, [0])
        os.makedirs(os.path.dirname(table.path))
        table.save(item_at)
        again = QueueTable(directory)
        self.assertEqual(
            again.catch_up(log.min_offset, log.max_offset, records_from, item_at), got
        )
        self.assertEqual(starts, [0, log.max_offset])


class PartsTests(SynchronousTestCase):
    """
    L{CommitLog} split into parts and mixins (issue 26): the public API and
    the state the parts share.
    """

    def test_public_api(self) -> None:
        """
        Every public method and property of L{CommitLog} before the split
        is still on it.
        """
        for name in [
            "append_at", "check", "close", "closed", "cut_back", "cut_quarantined",
            "damage", "discard_incomplete_record", "flush", "flush_abandoned",
            "flush_done", "flush_plan", "flushed_offset", "has_data", "max_offset",
            "min_offset", "observe_appends", "observe_damage", "open", "put",
            "put_batch", "quarantine_tail", "read", "read_view", "record_end",
            "record_start_at_or_before", "records", "segments", "truncate_replica",
        ]:
            self.assertTrue(hasattr(CommitLog, name), name)

    def test_empty_segments_discarded_only_when_zeros(self) -> None:
        """
        An empty log (no record) starting at another segment boundary
        removes its segment file only when the file holds only zeros; a
        file with a non-zero byte past where recovery looked (it reads an
        empty segment no further than its first bytes) is moved into
        quarantine, bytes untouched, and the move logged.
        """
        for garbage in (False, True):
            log = open_store(self, segment_size=SEGMENT)
            log.append_at(0, replica_records(0, 400))
            log.truncate_replica(0)
            path = segment_path(log.store_dir, 0)
            log.close()
            if garbage:
                with open(path, "r+b") as f:
                    f.seek(300)
                    f.write(b"\x07not a record")
            with open(path, "rb") as f:
                before = f.read()
            log = CommitLog.open(log.store_dir, segment_size=SEGMENT, clock=fixed_clock)
            self.addCleanup(log.close)
            self.assertEqual(log.max_offset, 0)
            with capturedLogs() as events:
                log.append_at(3 * SEGMENT, replica_records(3 * SEGMENT, 400))
            self.assertFalse(os.path.exists(path))
            quarantine = os.path.join(log.store_dir, "rmqha", "quarantine")
            # (truncate_replica quarantined the cut bytes: *.bin; segments
            # moved whole are *.segment.)
            kept = [n for n in sorted(os.listdir(quarantine)) if ".segment" in n]
            moved = [e for e in events if "into quarantine" in formatEvent(e)]
            if not garbage:
                self.assertEqual((kept, moved), ([], []))
                continue
            self.assertEqual(len(kept), 2, kept)  # the file and its sidecar
            (segment,) = [n for n in kept if n.endswith(".segment")]
            with open(os.path.join(quarantine, segment), "rb") as f:
                self.assertEqual(f.read(), before)
            self.assertEqual(len(moved), 1)
            self.assertIn(path, formatEvent(moved[0]))

    def test_parts_follow_discarded_segments(self) -> None:
        """
        When an empty log's segments are discarded for a first append at
        another boundary, the flush planning and the damage watch see the
        new segment: a flush covers it, and its file removed is damage.
        """
        log = open_store(self, segment_size=SEGMENT)
        log.append_at(0, replica_records(0, 400))
        log.truncate_replica(0)
        self.assertEqual(log.segments, [(segment_file_name(0), 0, 0)])
        log.append_at(3 * SEGMENT, replica_records(3 * SEGMENT, 400))
        self.assertEqual(log.flush(), 3 * SEGMENT + 400)
        self.assertEqual(log.flushed_offset, 3 * SEGMENT + 400)
        self.assertIsNone(log.check())
        os.unlink(segment_path(log.store_dir, 3 * SEGMENT))
        damage = log.check()
        assert damage is not None
        self.assertIn(segment_file_name(3 * SEGMENT), damage.path)
        self.assertIn("removed", damage.what)
