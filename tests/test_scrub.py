"""
Tests for L{rmqha.store.scrub}: the background scrub of the commit log, driven
by a fake clock, with reads run in-line or held until the test runs them.

Expected offsets come from this suite's own knowledge of the layout
(L{tests._helpers.plan_offsets}, L{tests._helpers.field_spans}), never from
the store.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.python.failure import Failure
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.store import _record, scrub
from rmqha.store.commitlog import CommitLog
from rmqha.store.scrub import ScrubService, check_chunk, parse_scrub_rate

from tests._helpers import (
    field_spans,
    fixed_clock,
    make_message,
    plan_offsets,
    record_size,
    replica_records,
    rewrite,
    segment_file_name,
    segment_path,
    xor_byte,
)

SEGMENT = 64 * 1024
BODY = 1000
#: Record size of the messages these tests put (IPv4 hosts, no properties).
SIZE = record_size(make_message(b"x" * BODY))
#: Enough messages for six segments: the first is outside the recovery walk
#: (which starts at the third-to-last), so opening never looks at it.
COUNT = 6 * SEGMENT // SIZE


class _HeldThreads:
    """
    Stands in for the thread pool: reads run when the test says so.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def __call__(self, f: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.pending.append((f, d))
        return d

    def run(self, before: Callable[[], object] | None = None) -> None:
        """
        Run the one pending read (after C{before}).
        """
        ((f, d),) = self.pending
        self.pending = []
        if before is not None:
            before()
        try:
            result = f()
        except Exception:
            d.errback(Failure())
        else:
            d.callback(result)


def _inline(f: Callable[[], Any]) -> Deferred[Any]:
    return succeed(f())


def _fill(store: str, count: int) -> tuple[list[int], int]:
    """
    A closed store with C{count} messages of C{BODY} bytes in C{SEGMENT}
    segments; the records' offsets and the end, by the layout rules.
    """
    log = CommitLog.open(store, segment_size=SEGMENT, clock=fixed_clock)
    for n in range(count):
        log.put(make_message(bytes([n % 251]) * BODY))
    log.close()
    offsets, _, end = plan_offsets([SIZE] * count, SEGMENT)
    return offsets, end


def _body_position(offset: int) -> int:
    """
    The position in its segment file of the first body byte of the record
    at C{offset}.
    """
    return offset % SEGMENT + field_spans(make_message(b"x" * BODY))["BODY"].start


class ScrubTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1700000000)
        self.store = self.mktemp()

    def open(self, store: str | None = None) -> CommitLog:
        log = CommitLog.open(store or self.store, segment_size=SEGMENT, clock=fixed_clock)
        self.addCleanup(log.close)
        return log

    def scrub(
        self,
        log: Callable[[], CommitLog | None] | CommitLog,
        run_in_thread: Callable[[Callable[[], Any]], Deferred[Any]] = _inline,
        **options: Any,
    ) -> ScrubService:
        provider = log if callable(log) else (lambda: log)
        options.setdefault("rate", 1024 * 1024)
        options.setdefault("pass_interval", 60.0)
        service = ScrubService(provider, self.clock, run_in_thread=run_in_thread, **options)
        service.startService()

        def stop() -> None:
            service.stopService()
            self.assertEqual(self.clock.getDelayedCalls(), [])

        self.addCleanup(stop)
        return service

    def run_for(self, seconds: float, step: float = 0.05) -> None:
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def errors(self, events: list[dict[str, Any]]) -> list[str]:
        return [
            formatEvent(e) for e in events
            if e.get("log_level") is not None and e["log_level"].name == "error"
        ]


class FindsCorruptionTests(ScrubTestCase):
    """
    The scrub finds damage in segments recovery never reads, and says so
    once.
    """

    def test_flipped_body_byte_in_old_segment(self) -> None:
        """
        One flipped body byte in the first of six segments — outside the
        recovery walk, which starts at the third-to-last — is found by the
        first pass: logged as an error naming the offset, the segment file,
        the body CRC, and the C{rmqha store repair} command, and listed.
        """
        offsets, end = _fill(self.store, COUNT)
        bad = offsets[3]
        xor_byte(segment_path(self.store, 0), _body_position(bad))
        log = self.open()
        self.assertGreater(log.recovery.walk_from, 0)  # recovery never looked
        self.assertEqual(log.max_offset, end)
        with capturedLogs() as events:
            scrub = self.scrub(log)
            self.run_for(5)
        self.assertEqual(scrub.passes, 1)
        self.assertEqual(sorted(scrub.corrupt), [bad])
        (error,) = self.errors(events)
        self.assertIn(f"offset {bad}", error)
        self.assertIn(segment_file_name(0), error)
        self.assertIn("body CRC mismatch", error)
        self.assertIn(f"rmqha store repair {os.path.abspath(self.store)} --from", error)
        # The walk went on with the record after it.
        self.assertIn(f"next good record is at offset {bad + SIZE}", error)
        self.assertEqual(scrub.corrupt[bad].resumed_at, bad + SIZE)

    def test_damaged_structure_resumes_at_next_good_record(self) -> None:
        """
        A record whose magic is destroyed cannot be stepped over by its
        size: the walk searches for the next record that verifies, reports
        the bad one once with where the good bytes resume, and checks the
        rest of the log (a second, body damage later on is also found).
        """
        offsets, _ = _fill(self.store, COUNT)
        first, second = offsets[5], offsets[40]
        rewrite(segment_path(self.store, 0), first % SEGMENT + 4, b"\0\0\0\0")
        path = segment_path(self.store, second - second % SEGMENT)
        xor_byte(path, _body_position(second))
        with capturedLogs() as events:
            scrub = self.scrub(self.open())
            self.run_for(5)
        self.assertEqual(sorted(scrub.corrupt), [first, second])
        self.assertEqual(scrub.corrupt[first].resumed_at, first + SIZE)
        self.assertIn("bad magic code", scrub.corrupt[first].reason)
        self.assertEqual(len(self.errors(events)), 2)

    def test_damaged_total_size(self) -> None:
        """
        A TOTALSIZE made larger (the record seems to run into the next
        ones) is read whole and refused by the decoder: reported, and the
        walk resumes at the next record.
        """
        offsets, _ = _fill(self.store, COUNT)
        bad = offsets[3]
        rewrite(segment_path(self.store, 0), bad % SEGMENT, (30000).to_bytes(4, "big"))
        with capturedLogs() as events:
            scrub = self.scrub(self.open())
            self.run_for(3)
        self.assertEqual(list(scrub.corrupt), [bad])
        self.assertEqual(scrub.corrupt[bad].resumed_at, bad + SIZE)
        self.assertEqual(len(self.errors(events)), 1)

    def test_huge_record_skipped_not_read(self) -> None:
        """
        A record claiming more than the scrub reads at once is not read
        into memory: a warning, the rest of its segment unchecked this
        pass, nothing reported, and the next segments are checked.
        """
        from rmqha.store import scrub as scrub_module

        self.patch(scrub_module, "MAX_RECORD_READ", 4096)
        offsets, _ = _fill(self.store, COUNT)
        rewrite(segment_path(self.store, 0), offsets[3] % SEGMENT, (30000).to_bytes(4, "big"))
        # In the second segment: also outside the recovery walk.
        later = next(o for o in offsets if o > SEGMENT + 10 * SIZE)
        xor_byte(segment_path(self.store, later - later % SEGMENT), _body_position(later))
        with capturedLogs() as events:
            scrub = self.scrub(self.open(), slice_bytes=4096)
            self.run_for(10)
        self.assertEqual(list(scrub.corrupt), [later])
        (warning,) = [formatEvent(e) for e in events if "more than the scrub reads" in formatEvent(e)]
        self.assertIn(f"offset {offsets[3]}", warning)

    def test_missing_segment_file(self) -> None:
        """
        A segment file that vanished while the log still lists it (not a
        cut the store made) is one corrupt range, reported once, and the
        walk goes on with the next segment.
        """
        offsets, _ = _fill(self.store, COUNT)
        log = self.open()
        os.unlink(segment_path(self.store, SEGMENT))
        later = next(o for o in offsets if o > 2 * SEGMENT)
        xor_byte(segment_path(self.store, 2 * SEGMENT), _body_position(later))
        with capturedLogs() as events:
            scrub = self.scrub(log)
            self.run_for(10)
        self.assertEqual(sorted(scrub.corrupt), [SEGMENT, later])
        self.assertIn(f"{segment_file_name(SEGMENT)} is missing", scrub.corrupt[SEGMENT].reason)
        self.assertEqual(len(self.errors(events)), 2)

    def test_logged_once_across_passes(self) -> None:
        """
        A corrupt record found again by later passes is logged once, stays
        listed once, and counts once.
        """
        offsets, _ = _fill(self.store, COUNT)
        xor_byte(segment_path(self.store, 0), _body_position(offsets[1]))
        with capturedLogs() as events:
            scrub = self.scrub(self.open(), pass_interval=1.0)
            self.run_for(10)
        self.assertGreaterEqual(scrub.passes, 3)
        self.assertEqual(len(self.errors(events)), 1)
        self.assertEqual(scrub.corrupt_count, 1)
        status = scrub.status()
        self.assertEqual(status["corrupt_records"], 1)
        self.assertEqual([r["offset"] for r in status["corrupt"]], [offsets[1]])

    def test_repaired_record_leaves_the_list(self) -> None:
        """
        When a later pass finds the record good again (its bytes were
        repaired), it leaves the list and the count.
        """
        offsets, _ = _fill(self.store, COUNT)
        path = segment_path(self.store, 0)
        xor_byte(path, _body_position(offsets[1]))
        scrub = self.scrub(self.open(), pass_interval=1.0)
        self.run_for(2)
        self.assertEqual(list(scrub.corrupt), [offsets[1]])
        xor_byte(path, _body_position(offsets[1]))  # flipped back: repaired
        with capturedLogs() as events:
            self.run_for(3)
        self.assertEqual(scrub.corrupt, {})
        self.assertEqual(scrub.corrupt_count, 0)
        self.assertTrue(any("verifies again" in formatEvent(e) for e in events))

    def test_slave_hint(self) -> None:
        """
        On a slave the advice is about the slave's own copy: the master has
        the record.
        """
        offsets, _ = _fill(self.store, COUNT)
        xor_byte(segment_path(self.store, 0), _body_position(offsets[0]))
        with capturedLogs() as events:
            self.scrub(self.open(), slave=True)
            self.run_for(2)
        (error,) = self.errors(events)
        self.assertIn("this slave's copy is damaged", error)
        self.assertIn("--from MASTER_DIR", error)

    def test_read_twice_before_reporting(self) -> None:
        """
        A record that fails on one read and verifies on the re-read (damage
        that was not on the disk to stay: a bad read, a write racing the
        read) is not reported.
        """
        offsets, _ = _fill(self.store, COUNT)
        path = segment_path(self.store, 0)
        position = _body_position(offsets[2])
        threads = _HeldThreads()
        with capturedLogs() as events:
            scrub = self.scrub(self.open(), threads)
            self.clock.advance(0)
            threads.run(before=lambda: xor_byte(path, position))
            xor_byte(path, position)  # good again for the second read
            self.clock.advance(1)
            while threads.pending:
                threads.run()
                self.clock.advance(1)
        self.assertEqual(self.errors(events), [])
        self.assertEqual(scrub.corrupt, {})
        self.assertEqual(scrub.passes, 1)


class RateAndLifecycleTests(ScrubTestCase):
    """
    The scrub reads at its rate, starts and stops cleanly, and can be
    turned off.
    """

    def test_rate_honoured(self) -> None:
        """
        With a rate of 64 KiB/s, after T clock seconds the scrub has read
        about 64 KiB * T (within one read) and no more, however long the
        store is.
        """
        _fill(self.store, 8 * SEGMENT // SIZE)
        rate = 64 * 1024
        scrub = self.scrub(self.open(), rate=rate, slice_bytes=16 * 1024)
        for seconds in (1, 2, 3, 4):
            self.run_for(1, step=0.01)
            self.assertLessEqual(scrub.bytes_total, rate * seconds + 16 * 1024)
            # Steps start late by up to a clock tick each: a bound, not a
            # promise.
            self.assertGreaterEqual(scrub.bytes_total, rate * seconds * 0.8)
        self.assertEqual(scrub.passes, 0)

    def test_no_descriptor_left_open(self) -> None:
        """
        Each read opens its own descriptor and closes it: passes leave
        the process's open files as they were.
        """
        fds = "/proc/self/fd"
        if not os.path.isdir(fds):
            raise SkipTest("needs /proc/self/fd")
        _fill(self.store, COUNT)
        log = self.open()
        before = len(os.listdir(fds))
        scrub = self.scrub(log, pass_interval=1.0)
        self.run_for(5)
        self.assertGreaterEqual(scrub.passes, 3)
        self.assertEqual(len(os.listdir(fds)), before)

    def test_busy_share_bounded(self) -> None:
        """
        A step that took long (small records, a slow disk) is followed by
        a wait of at least nine times its length, whatever the rate
        allows: the scrub works at most a tenth of the time.
        """
        _fill(self.store, COUNT)
        threads = _HeldThreads()
        self.scrub(self.open(), threads, rate=1 << 30)
        self.clock.advance(0)
        threads.run(before=lambda: self.clock.advance(0.1))
        (call,) = self.clock.getDelayedCalls()
        self.assertAlmostEqual(call.getTime() - self.clock.seconds(), 0.9, places=3)

    def test_new_pass_after_interval(self) -> None:
        """
        A pass covers the log up to its stable end; the next starts once
        the pass interval has passed since the last one started, and
        records put meanwhile are checked by it.
        """
        log = self.open()
        for n in range(10):
            log.put(make_message(b"x" * BODY))
        log.flush()
        scrub = self.scrub(log, pass_interval=30.0)
        self.clock.advance(1)
        self.assertEqual(scrub.passes, 1)
        self.assertEqual(scrub.last_pass["bytes"], 10 * SIZE)  # type: ignore[index]
        for n in range(10):
            log.put(make_message(b"x" * BODY))
        log.flush()
        self.clock.advance(20)
        self.assertEqual(scrub.passes, 1)
        self.clock.advance(11)
        self.assertEqual(scrub.passes, 2)
        self.assertEqual(scrub.last_pass["bytes"], 20 * SIZE)  # type: ignore[index]

    def test_unflushed_tail_not_read(self) -> None:
        """
        Only flushed whole records are checked: bytes put but not yet
        flushed wait for a later pass.
        """
        log = self.open()
        for n in range(10):
            log.put(make_message(b"x" * BODY))
        scrub = self.scrub(log)
        self.clock.advance(5)
        self.assertEqual(scrub.bytes_total, 0)
        self.assertEqual(scrub.last_pass["end_offset"], 0)  # type: ignore[index]

    def test_disabled(self) -> None:
        """
        A rate of 0 schedules nothing and reads nothing.
        """
        _fill(self.store, 10)
        scrub = self.scrub(self.open(), rate=0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(100)
        self.assertEqual((scrub.bytes_total, scrub.passes), (0, 0))
        self.assertFalse(scrub.status()["enabled"])

    def test_stop_waits_for_read_in_flight(self) -> None:
        """
        Stopping cancels the next step; with a read in progress the stop
        fires when it ends, its result is dropped, and no call is left.
        """
        _fill(self.store, 10)
        threads = _HeldThreads()
        scrub = ScrubService(
            lambda: log, self.clock, rate=1024 * 1024, run_in_thread=threads
        )
        log = self.open()
        scrub.startService()
        self.clock.advance(0)
        self.assertEqual(len(threads.pending), 1)
        stopping = scrub.stopService()
        self.assertNoResult(stopping)
        threads.run()
        self.successResultOf(stopping)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(scrub.bytes_total, 0)

    def test_restart_ignores_old_read(self) -> None:
        """
        Stopped with a read in flight and started again: the old read's
        result, arriving late, changes nothing; the new walk goes on.
        """
        _fill(self.store, COUNT)
        threads = _HeldThreads()
        scrub = self.scrub(self.open(), threads)
        self.clock.advance(0)
        (old,) = threads.pending
        threads.pending = []
        scrub.stopService()
        scrub.startService()
        self.clock.advance(0)
        (new,) = threads.pending
        threads.pending = [old]
        threads.run()
        self.assertEqual((scrub.bytes_total, self.clock.getDelayedCalls()), (0, []))
        threads.pending = [new]
        threads.run()
        self.assertGreater(scrub.bytes_total, 0)
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_closed_store_waits(self) -> None:
        """
        While there is no open log (a slave moving its store aside) the
        scrub waits; a new log starts a new pass and forgets the old
        log's findings.
        """
        offsets, _ = _fill(self.store, COUNT)
        xor_byte(segment_path(self.store, 0), _body_position(offsets[0]))
        current: list[CommitLog | None] = [self.open()]
        scrub = self.scrub(lambda: current[0], pass_interval=1.0)
        self.run_for(2)
        self.assertEqual(list(scrub.corrupt), [offsets[0]])
        current[0] = None
        self.run_for(2)
        fresh = self.mktemp()
        _fill(fresh, 3)
        current[0] = self.open(fresh)
        self.run_for(2)
        self.assertEqual(scrub.corrupt, {})


class ChangingLogTests(ScrubTestCase):
    """
    A slave's log is cut back and grows again while the scrub walks it:
    no false report.
    """

    def master_bytes(self, count: int, body: int) -> bytes:
        """
        The commit-log bytes of a master that took C{count} messages of
        C{body} bytes (records, BLANKs and all), as a slave receives them.
        """
        master = self.open(self.mktemp())
        for n in range(count):
            master.put(make_message(bytes([n % 251]) * body))
        data = b""
        while len(data) < master.max_offset:
            data += master.read(len(data), SEGMENT)
        return data

    def replica(self, count: int, body: int = BODY) -> CommitLog:
        log = self.open()
        log.append_at(0, self.master_bytes(count, body))
        log.flush()
        return log

    def test_truncated_while_read_in_flight(self) -> None:
        """
        The log is cut back (bytes zeroed, later segments deleted) between
        planning a read and the read: the read sees zeros or no file, and
        nothing is reported; the walk goes on from the cut.
        """
        count = 3 * SEGMENT // SIZE
        offsets, _, _ = plan_offsets([SIZE] * count, SEGMENT)
        log = self.replica(count)
        threads = _HeldThreads()
        with capturedLogs() as events:
            scrub = self.scrub(log, threads, slice_bytes=SEGMENT)
            self.clock.advance(0)
            threads.run()  # first segment fine
            self.clock.advance(1)
            # The read of the second segment is planned; cut in the first.
            threads.run(before=lambda: log.truncate_replica(offsets[10]))
            for _ in range(10):
                self.clock.advance(1)
                while threads.pending:
                    threads.run()
        self.assertEqual(self.errors(events), [])
        self.assertEqual(scrub.corrupt, {})

    def test_cut_and_regrown_between_steps(self) -> None:
        """
        Cut back below the walk and grown again with records of other
        sizes between two reads: the walk's position is no longer a record
        boundary; the re-checked anchor record tells, and the segment is
        walked again from its start instead of reported.
        """
        log = self.replica(30)
        scrub_threads = _HeldThreads()
        with capturedLogs() as events:
            scrub = self.scrub(log, scrub_threads, slice_bytes=8 * 1024)
            self.clock.advance(0)
            scrub_threads.run()
            self.assertGreater(scrub.status()["position"], 0)
            log.truncate_replica(0)
            log.append_at(0, self.master_bytes(40, 700))
            log.flush()
            for _ in range(100):
                self.clock.advance(0.5)
                while scrub_threads.pending:
                    scrub_threads.run()
        self.assertEqual(self.errors(events), [])
        self.assertEqual(scrub.corrupt, {})
        self.assertGreaterEqual(scrub.passes, 1)

    def test_incomplete_replica_tail_not_read(self) -> None:
        """
        A record still arriving on a slave (after the record end) is never
        checked, whatever the flushed offset says.
        """
        log = self.open()
        data = replica_records(0, 1000, 1000)
        log.append_at(0, data[:1500])
        log.flush()
        self.assertEqual(log.record_end, 1000)
        with capturedLogs() as events:
            scrub = self.scrub(log)
            self.run_for(3)
        self.assertEqual(self.errors(events), [])
        self.assertEqual(scrub.last_pass["end_offset"], 1000)  # type: ignore[index]


class CheckChunkTests(SynchronousTestCase):
    """
    L{check_chunk}, the sans-IO walk over some bytes of one segment.
    """

    def test_record_continuing_after_the_chunk(self) -> None:
        """
        A chunk that ends inside a record stops at that record and asks
        for all of it; the records before are counted.
        """
        data = replica_records(0, 500, 3000)
        result = check_chunk(
            data[:1000], 0, segment_start=0, segment_size=SEGMENT,
            limit=len(data), anchored=False, searching=False,
        )
        self.assertEqual((result.next_offset, result.want, result.records), (500, 3000, 1))
        self.assertEqual((result.anchor, result.findings), (0, []))

    def test_long_record_needs_its_place(self) -> None:
        """
        A header claiming more bytes than the chunk holds is read whole
        next time only when its PHYSICALOFFSET says it is where it is;
        otherwise it is reported at once (no large read for garbage).
        """
        data = bytearray(replica_records(0, 500, 500))
        data[500:504] = (20000).to_bytes(4, "big")
        result = check_chunk(
            bytes(data), 0, segment_start=0, segment_size=SEGMENT,
            limit=SEGMENT, anchored=False, searching=False,
        )
        self.assertEqual((result.next_offset, result.want, result.findings), (500, 20000, []))
        data[528:536] = (7).to_bytes(8, "big")
        result = check_chunk(
            bytes(data), 0, segment_start=0, segment_size=SEGMENT,
            limit=len(data), anchored=False, searching=False,
        )
        (finding,) = result.findings
        self.assertEqual(finding.offset, 500)
        self.assertIn("PHYSICALOFFSET field says 7", finding.reason)
        self.assertTrue(result.searching)
        self.assertLess(result.want, 20000)

    def test_lost_anchor(self) -> None:
        """
        A chunk whose first record (which verified before) does not now
        reports nothing and sends the walk to the segment's start.
        """
        data = replica_records(0, 500, 500)
        result = check_chunk(
            data[100:], 100, segment_start=0, segment_size=SEGMENT,
            limit=1000, anchored=True, searching=False,
        )
        self.assertTrue(result.lost_anchor)
        self.assertEqual((result.next_offset, result.findings), (0, []))


def _record_by_record(
    buf: bytes, pos: int, end: int, offset: int, *, check_crc: bool, strict: bool
) -> tuple[int, int, int]:
    """
    A C{walk_valid} that hops over nothing: L{check_chunk} then takes
    every record through its own steps, one L{parse_record} each (what it
    did before the compiled walk).
    """
    return pos, 0, -1


class CheckChunkWalkTests(SynchronousTestCase):
    """
    L{check_chunk} hops over the records that verify in one compiled walk
    (C{walk_valid}), and finds what it found record by record.
    """

    def test_whole_records_are_not_parsed_one_by_one(self) -> None:
        """
        With the accelerator, a chunk of good records is checked without
        a L{parse_record} call per record (about 8 us each in Python; the
        scrub's cost at its default rate: docs/store.md, "Scrub").
        """
        if _record._accel is None:
            raise SkipTest("rmqha.store._speedups is not built (or RMQHA_PURE=1)")
        calls: list[int] = []
        real = scrub.parse_record

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(args[1])
            return real(*args, **kwargs)

        self.patch(scrub, "parse_record", counted)
        data = replica_records(0, *[500] * 40)
        result = check_chunk(
            data, 0, segment_start=0, segment_size=SEGMENT,
            limit=len(data), anchored=False, searching=False,
        )
        self.assertEqual((result.records, result.anchor, result.findings), (40, 39 * 500, []))
        self.assertEqual(result.next_offset, len(data))
        self.assertEqual(calls, [])
        # Anchored: the anchor (verified before, not counted again) alone
        # is parsed, the rest walked.
        result = check_chunk(
            data[500:], 500, segment_start=0, segment_size=SEGMENT,
            limit=len(data), anchored=True, searching=False,
        )
        self.assertEqual((result.records, result.findings), (38, []))
        self.assertEqual(calls, [0])

    @settings(
        deadline=None,
        derandomize=True,
        max_examples=300,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        sizes=st.lists(st.integers(min_value=200, max_value=900), min_size=1, max_size=12),
        damage=st.lists(
            st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
            max_size=3,
        ),
        torn=st.lists(st.integers(min_value=0, max_value=11), max_size=2),
        cut=st.integers(min_value=0),
        start_at=st.integers(min_value=0, max_value=3),
        searching=st.booleans(),
        blank_tail=st.booleans(),
    )
    def test_same_result_as_record_by_record(
        self,
        sizes: list[int],
        damage: list[tuple[int, int]],
        torn: list[int],
        cut: int,
        start_at: int,
        searching: bool,
        blank_tail: bool,
    ) -> None:
        """
        Over good and damaged records (bytes flipped anywhere: sizes,
        magics, PHYSICALOFFSET, bodies; torn topics), a chunk cut anywhere, from any
        record, anchored or not, searching or not, a BLANK filler or
        not: the same L{check_chunk} result as taking every record
        through L{parse_record}.  C{torn}: records whose topic ends in a
        zero byte (what the strict checks refuse; these records have no
        properties, so the topic's last byte is the third from the end).
        """
        size = sum(sizes)
        data = bytearray(replica_records(0, *sizes))
        segment = size + 64 if blank_tail else size
        if blank_tail:
            data += (64).to_bytes(4, "big") + _record.BLANK_MAGIC.to_bytes(4, "big", signed=True)
            data += bytes(56)
        for position, mask in damage:
            data[position % len(data)] ^= mask
        for index in torn:
            data[sum(sizes[: index % len(sizes) + 1]) - 3] = 0
        first = sum(sizes[: start_at % len(sizes)])
        end = first + 1 + cut % (len(data) - first)
        chunk = bytes(data[first:end])
        for anchored in (False, True) if first else (False,):
            arguments = dict(
                segment_start=0, segment_size=segment, limit=len(data),
                anchored=anchored and not searching, searching=searching,
            )
            walked = check_chunk(chunk, first, **arguments)  # type: ignore[arg-type]
            self.patch(scrub, "walk_valid", _record_by_record)
            try:
                one_by_one = check_chunk(chunk, first, **arguments)  # type: ignore[arg-type]
            finally:
                self.patch(scrub, "walk_valid", _record.walk_valid)
            self.assertEqual(walked, one_by_one)


class ParseRateTests(SynchronousTestCase):
    """
    C{--scrub-rate} values.
    """

    def test_values(self) -> None:
        """
        Sizes with suffixes, an optional C{/s}, and C{0} or C{off} for
        disabled; anything else is a C{ValueError} naming the value.
        """
        self.assertEqual(parse_scrub_rate("32MiB"), 32 << 20)
        self.assertEqual(parse_scrub_rate("8m/s"), 8 << 20)
        self.assertEqual(parse_scrub_rate("0"), 0)
        self.assertEqual(parse_scrub_rate("OFF"), 0)
        e = self.assertRaises(ValueError, parse_scrub_rate, "fast")
        self.assertIn("'fast'", str(e))
