"""
Tests for L{rmqha.store.consumequeue}: RocketMQ 4.9.8's consume-queue
format, dispatch in bounded steps, recovery, truncation with the log, the
checkpoint, reads, and byte-for-byte agreement with the queues the Java
transcription of the 4.9.8 store writer builds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from typing import Any

from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.store._record import SysFlag
from rmqha.store import _recovery, consumequeue
from rmqha.store._recovery import verify_store
from rmqha.store.commitlog import CommitLog, Message
from rmqha.store.consumequeue import (
    ConsumeQueues,
    UNIT_SIZE,
    ConsumeQueue,
    QueueCheck,
    ConsumeQueueError,
    Unit,
    java_string_hash,
    read_checkpoint,
    tags_code,
    verify_consume_queues,
    verify_store_queues,
    write_mark,
)
from rmqha.store.service import DISPATCH_DELAY, DISPATCH_IDLE_DELAY, CommitLogService
from tests._helpers import copy_store, fixed_clock

PAD = (0, 0x7FFFFFFF, 0)
SEGMENT = 64 * 1024


def _message(i: int, queue_id: int = 0, tags: str | None = "TagA", **kw: object) -> Message:
    properties = {"TAGS": tags} if tags else {}
    return Message(
        topic=str(kw.pop("topic", "T")),
        body=b"m%d" % i,
        queue_id=queue_id,
        properties=properties,
        **kw,  # type: ignore[arg-type]
    )


def _units(path: str) -> list[tuple[int, int, int]]:
    with open(path, "rb") as f:
        data = f.read()
    return [struct.unpack_from(">qiq", data, i) for i in range(0, len(data), UNIT_SIZE)]


class FormatTests(SynchronousTestCase):
    """
    The tag hash and the unit layout.
    """

    def test_java_string_hash(self) -> None:
        """
        Java's C{String.hashCode}, signed, over UTF-16 code units.
        """
        self.assertEqual(java_string_hash("TagA"), 2598919)
        self.assertEqual(java_string_hash(""), 0)
        self.assertEqual(java_string_hash("polygenelubricants"), -(2**31))
        # U+1F600 is two UTF-16 units (0xD83D, 0xDE00).
        self.assertEqual(java_string_hash("\U0001f600"), 0xD83D * 31 + 0xDE00)
        self.assertEqual(java_string_hash("é"), 0xE9)

    def test_tags_code(self) -> None:
        """
        The TAGS hash sign-extended; 0 without tags; the schedule topic's
        DELAY level gives the delivery time (level clamped to the table).
        """
        self.assertEqual(tags_code("T", {"TAGS": "TagA"}, 5), 2598919)
        self.assertEqual(tags_code("T", {"TAGS": "polygenelubricants"}, 5), -(2**31))
        self.assertEqual(tags_code("T", {}, 5), 0)
        self.assertEqual(tags_code("T", {"DELAY": "3"}, 5), 0)
        self.assertEqual(tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "3"}, 5), 10_005)
        self.assertEqual(
            tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "99", "TAGS": "x"}, 5), 7_200_005
        )
        self.assertEqual(tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "0", "TAGS": "TagA"}, 5), 2598919)

    def test_unit_bytes(self) -> None:
        """
        A put's unit is (commit-log offset, size, tag hash), big-endian, in
        C{consumequeue/<topic>/<queueId>/<20 digits>}; files have their full
        size; prepared and rolled-back transaction records get none.
        """
        log = CommitLog.open(self.mktemp(), consume_queues=True, clock=fixed_clock, consume_queue_units=10, segment_size=SEGMENT)
        self.addCleanup(log.close)
        first = log.put(_message(0))
        log.put(_message(1, sysflag=SysFlag.TRANSACTION_PREPARED_TYPE))
        log.put(_message(2, sysflag=SysFlag.TRANSACTION_ROLLBACK_TYPE))
        third = log.put(_message(3, tags=None))
        self.assertFalse(log.dispatch(1 << 20))
        path = os.path.join(log.store_dir, "consumequeue", "T", "0", "0" * 20)
        self.assertEqual(os.path.getsize(path), 200)
        with open(path, "rb") as f:
            self.assertEqual(
                f.read(40),
                struct.pack(">qiq", first.offset, first.size, 2598919)
                + struct.pack(">qiq", third.offset, third.size, 0),
            )
        assert log.consume_queues is not None
        self.assertEqual(log.consume_queues.max_offset("T", 0), 2)
        self.assertEqual(log.consume_queues.dispatched, log.max_offset)

    def test_pre_blank(self) -> None:
        """
        A queue whose first unit is at logical offset 25 starts with the
        file holding it, padded before it with (0, Integer.MAX_VALUE, 0)
        units (fillPreBlank).
        """
        directory = self.mktemp()
        queue = ConsumeQueue(directory, "T", 0, 10 * UNIT_SIZE)
        self.addCleanup(queue.close)
        self.assertTrue(queue.put(1000, 100, 7, 25))
        queue.write_pending()
        self.assertEqual(os.listdir(directory), ["00000000000000000400"])
        units = _units(os.path.join(directory, "00000000000000000400"))
        self.assertEqual(units[:6], [PAD] * 5 + [(1000, 100, 7)])
        self.assertEqual(queue.max_offset, 26)
        self.assertEqual(queue.units(25, 5), [Unit(1000, 100, 7)])
        # The same record again (a re-dispatch): nothing added.
        self.assertFalse(queue.put(1000, 100, 7, 25))


class DispatchTests(SynchronousTestCase):
    """
    Dispatch follows the appends in bounded steps, one per reactor turn.
    """

    def service(
        self, clock: Clock, flushes: bool = False, **options: Any
    ) -> tuple[CommitLogService, CommitLog, ConsumeQueues]:
        """
        A started L{CommitLogService} on C{clock} over a new store with
        consume queues, its log and queues; C{flushes}: its flushes run
        inline (else one fails the test).
        """
        def run_in_thread(f: Any) -> Any:
            if not flushes:
                self.fail("no flush expected")
            return succeed(f())

        directory = self.mktemp()
        service = CommitLogService(
            lambda: CommitLog.open(directory, consume_queues=True, clock=fixed_clock, segment_size=SEGMENT),
            clock,
            run_in_thread=run_in_thread,
            **options,
        )
        service.startService()
        self.addCleanup(service.stopService)
        log = service.commitlog
        assert log is not None and log.consume_queues is not None
        return service, log, log.consume_queues

    def test_steps_per_turn(self) -> None:
        """
        Appends schedule a step 1 ms later (one for all of them); a step reads at
        most the step's bytes (plus one record); steps follow each other,
        one per turn, until the queues reach the log's end; the observer
        hears "queue grew to N" once per step and queue.
        """
        clock = Clock()
        service, log, queues = self.service(clock, dispatch_step=1000)
        heard: list[tuple[str, int, int]] = []
        marks: list[int] = []

        def grew(topic: str, queue_id: int, count: int) -> None:
            heard.append((topic, queue_id, count))
            if not marks or marks[-1] != queues.dispatched:
                marks.append(queues.dispatched)

        queues.observe_growth(grew)
        sizes = [log.put(_message(i, queue_id=i % 2)).size for i in range(40)]
        # Not inline in the puts: at the next turn.
        self.assertEqual(queues.dispatched, 0)
        self.assertEqual(
            [c.func.__name__ for c in clock.getDelayedCalls() if not hasattr(c.func, "f")],
            ["_dispatch"],
        )
        # 10 ms after while no reader waits (DISPATCH_IDLE_DELAY; 1 ms,
        # RocketMQ's reput interval, while one does: below); Clock.advance
        # runs each step's successor (at the next turn: delay 0) too: all
        # of them.
        clock.advance(0)
        self.assertEqual(queues.dispatched, 0)
        clock.advance(DISPATCH_DELAY)
        self.assertEqual(queues.dispatched, 0)
        clock.advance(DISPATCH_IDLE_DELAY - DISPATCH_DELAY)
        self.assertEqual(queues.dispatched, log.max_offset)
        steps = [b - a for a, b in zip([0] + marks, marks)]
        self.assertGreater(len(steps), sum(sizes) // (1000 + max(sizes)))
        for step in steps:
            self.assertLessEqual(step, 1000 + max(sizes))
        self.assertEqual(queues.max_offset("T", 0), 20)
        self.assertEqual(queues.max_offset("T", 1), 20)
        self.assertEqual(heard[-1][2], 20)
        self.assertEqual(sorted({(t, q) for t, q, _ in heard}), [("T", 0), ("T", 1)])
        # Nothing left: no step scheduled.
        self.assertFalse(
            [c for c in clock.getDelayedCalls() if not hasattr(c.func, "f")]
        )

    def test_dispatch_limit(self) -> None:
        """
        With a C{dispatch_limit} (a failover SYNC master: what its in-sync
        replicas hold), dispatch stops before the first record reaching
        past it, even one longer than a step, and schedules nothing more;
        C{dispatch_soon} after the limit moves dispatches further, and no
        limit dispatches to the log's end.
        """
        clock = Clock()
        service, log, queues = self.service(clock, dispatch_step=100)
        limit = [0]
        service.dispatch_limit = lambda: limit[0]
        ends = [log.put(Message(topic="T", body=b"x%d" % i * 100, queue_id=0)).next_offset for i in range(6)]
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual((queues.dispatched, queues.max_offset("T", 0)), (0, 0))
        # The limit inside record 2 (longer than a step): records 0 and 1.
        limit[0] = ends[2] - 1
        service.dispatch_soon()
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual((queues.dispatched, queues.max_offset("T", 0)), (ends[1], 2))
        self.assertFalse([c for c in clock.getDelayedCalls() if not hasattr(c.func, "f")])
        limit[0] = ends[4]
        service.dispatch_soon()
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual((queues.dispatched, queues.max_offset("T", 0)), (ends[4], 5))
        service.dispatch_limit = None
        service.dispatch_soon()
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual((queues.dispatched, queues.max_offset("T", 0)), (log.max_offset, 6))

    def test_dispatch_tries_again(self) -> None:
        """
        A dispatch step that meets bytes that are not a record (here the
        queues' own error, as from damage) stops, says so once, and tries
        again every L{DISPATCH_RETRY} seconds, however many appends come
        meanwhile; once the bytes read as records it goes on and says it
        resumed.
        """
        from rmqha.store.service import DISPATCH_RETRY
        from tests._helpers import LoggedEvents

        logged = LoggedEvents(self)
        clock = Clock()
        service, log, queues = self.service(clock, flushes=True)
        real = queues.dispatch
        broken = [True]
        calls = []

        def dispatch(end: int, limit: int = 0) -> bool:
            calls.append(end)
            if broken[0]:
                raise ConsumeQueueError(f"commit-log offset {queues.dispatched}: not a record")
            return real(end, limit)

        queues.dispatch = dispatch  # type: ignore[method-assign]
        log.put(Message(topic="T", body=b"one", queue_id=0))
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual(len(calls), 1)
        for _ in range(5):
            log.put(Message(topic="T", body=b"more", queue_id=0))
            clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual(len(calls), 1)  # (no step per append while failing)
        clock.advance(DISPATCH_RETRY)
        self.assertEqual(len(calls), 2)
        stopped = [t for t in logged.texts() if "consume-queue dispatch stopped" in t]
        self.assertEqual(len(stopped), 1)
        self.assertEqual(len(self.flushLoggedErrors(ConsumeQueueError)), 1)
        broken[0] = False
        clock.advance(DISPATCH_RETRY)
        self.assertEqual((queues.dispatched, queues.max_offset("T", 0)), (log.max_offset, 6))
        self.assertTrue([t for t in logged.texts() if "consume-queue dispatch resumed" in t])
        log.put(Message(topic="T", body=b"after", queue_id=0))
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual(queues.max_offset("T", 0), 7)

    def test_dispatch_hurries_for_waiting_readers(self) -> None:
        """
        While a reader waits (C{reader_parked}: a pull held on the
        remoting port, until C{reader_left}) appends are dispatched within
        1 ms; otherwise within 10 ms, many in one step (a step per
        millisecond cost nearly every SYNC put one); a pull that parks
        brings a pending step forward to 1 ms.
        """
        clock = Clock()
        service, log, queues = self.service(clock, flushes=True)
        steps = []
        real = queues.dispatch

        def counted(end: int, limit: int = 0) -> bool:
            steps.append(end)
            return real(end, limit)

        queues.dispatch = counted  # type: ignore[method-assign]
        for i in range(5):
            log.put(Message(topic="T", body=b"m%d" % i, queue_id=0))
            clock.advance(DISPATCH_DELAY)
        self.assertEqual((len(steps), queues.max_offset("T", 0)), (0, 0))
        clock.advance(DISPATCH_IDLE_DELAY)
        self.assertEqual((len(steps), queues.max_offset("T", 0)), (1, 5))
        service.reader_parked()
        log.put(Message(topic="T", body=b"m5", queue_id=0))
        clock.advance(DISPATCH_DELAY)
        self.assertEqual((len(steps), queues.max_offset("T", 0)), (2, 6))
        service.reader_left()
        log.put(Message(topic="T", body=b"m6", queue_id=0))
        clock.advance(DISPATCH_DELAY)
        self.assertEqual((len(steps), queues.max_offset("T", 0)), (2, 6))
        # A pull parks while a step is 9 ms away: it comes within 1 ms.
        service.reader_parked()
        clock.advance(DISPATCH_DELAY)
        self.assertEqual((len(steps), queues.max_offset("T", 0)), (3, 7))
        service.reader_left()
        service.reader_left()  # (never below none)
        log.put(Message(topic="T", body=b"m7", queue_id=0))
        clock.advance(DISPATCH_DELAY)
        self.assertEqual(len(steps), 3)

    def test_step_budget_ending_before_a_blank(self) -> None:
        """
        A dispatch step whose budget runs out less than a header short of
        a segment's BLANK (the next read too short to hold the header)
        steps over the BLANK to the next segment, as a read that holds it
        does: the BLANK is never dispatched as a message.  (It was: a unit
        of the BLANK's size in a queue of topic "" and id 0, the file
        C{consumequeue/0/00000000000000000000}, seen once in 24 runs of
        tests/integration/test_consumequeue_crash.py under load.)
        """
        for short in range(1, 8):
            log = CommitLog.open(
                self.mktemp(), consume_queues=True, clock=fixed_clock, segment_size=4096
            )
            self.addCleanup(log.close)
            appends = []
            while log.max_offset < 4096 + 600:
                appends.append(log.put(_message(len(appends), queue_id=len(appends) % 2)))
            blank_at = max(a.next_offset for a in appends if a.offset < 4096)
            self.assertLess(blank_at, 4096)
            per_queue = [sum(1 for i in range(len(appends)) if i % 2 == q) for q in (0, 1)]
            while log.dispatch(blank_at + short):
                pass
            queues = log.consume_queues
            assert queues is not None
            self.assertEqual(queues.dispatched, log.max_offset)
            self.assertEqual(sorted(os.listdir(os.path.join(log.store_dir, "consumequeue"))), ["T"])
            self.assertEqual(
                [queues.max_offset("T", q) for q in (0, 1)], per_queue, f"{short} bytes left"
            )
            copy = copy_store(self, log.store_dir)
            shutil.rmtree(os.path.join(copy, "consumequeue"))
            os.remove(os.path.join(copy, "rmqha", "cq-dispatched"))
            with CommitLog.open(copy, consume_queues=True, clock=fixed_clock) as rebuilt:
                while rebuilt.dispatch(1 << 20):
                    pass
            for q in (0, 1):
                name = os.path.join("consumequeue", "T", str(q), "0" * 20)
                self.assertEqual(
                    _units(os.path.join(copy, name)), _units(os.path.join(log.store_dir, name))
                )

    def test_dispatch_limit_in_one_step(self) -> None:
        """
        A step that dispatches records and then meets a record reaching
        past its limit writes their units and tells the observers (held
        pulls wake), and says nothing is left.
        """
        log = CommitLog.open(self.mktemp(), consume_queues=True, clock=fixed_clock, segment_size=SEGMENT)
        self.addCleanup(log.close)
        queues = log.consume_queues
        assert queues is not None
        heard: list[tuple[str, int, int]] = []
        queues.observe_growth(lambda topic, queue_id, count: heard.append((topic, queue_id, count)))
        ends = [log.put(Message(topic="T", body=b"x%d" % i * 100, queue_id=0)).next_offset for i in range(4)]
        self.assertFalse(log.dispatch(1 << 20, ends[2] - 1))
        self.assertEqual((queues.dispatched, heard), (ends[1], [("T", 0, 2)]))
        written = _units(os.path.join(log.store_dir, "consumequeue", "T", "0", "0" * 20))
        self.assertEqual(written[:3], [(0, ends[0], 0), (ends[0], ends[1] - ends[0], 0), (0, 0, 0)])

    def test_replica_append(self) -> None:
        """
        A slave's log, written by append_at, gets the same queues as its
        master's, byte for byte.
        """
        master = CommitLog.open(self.mktemp(), consume_queues=True, clock=fixed_clock, segment_size=4096)
        self.addCleanup(master.close)
        for i in range(60):
            master.put(_message(i, queue_id=i % 3, tags=f"t{i % 4}"))
        slave = CommitLog.open(self.mktemp(), consume_queues=True, clock=fixed_clock, segment_size=4096)
        self.addCleanup(slave.close)
        offset = 0
        while offset < master.max_offset:
            data = master.read(offset, 333)
            slave.append_at(offset, data)
            offset += len(data)
            slave.dispatch(500)
        while master.dispatch(500) or slave.dispatch(500):
            pass
        for queue_id in range(3):
            relative = os.path.join("consumequeue", "T", str(queue_id), "0" * 20)
            with open(os.path.join(master.store_dir, relative), "rb") as f:
                expected = f.read()
            with open(os.path.join(slave.store_dir, relative), "rb") as f:
                self.assertEqual(f.read(), expected)
        self.assertEqual(verify_consume_queues(slave), [])

    def test_timestamp_search(self) -> None:
        """
        SEARCH_OFFSET_BY_TIMESTAMP as getOffsetInQueueByTime: the unit
        whose record has that store timestamp, else the nearer neighbour in
        its file; before everything the first, after everything the last.
        """
        now = [100.0]
        log = CommitLog.open(self.mktemp(), consume_queues=True, clock=lambda: now[0], consume_queue_units=4, segment_size=SEGMENT)
        self.addCleanup(log.close)
        for i in range(10):
            now[0] = 100.0 + i  # store timestamps 100000, 101000, ...
            log.put(_message(i))
        log.dispatch(1 << 20)
        queues = log.consume_queues
        assert queues is not None

        def stamp(offset: int, size: int) -> int:
            return next(log.records(offset, offset + size)).store_timestamp  # type: ignore[union-attr]

        search = lambda ms: queues.offset_by_time("T", 0, ms, stamp)  # noqa: E731
        self.assertEqual(search(103_000), 3)
        self.assertEqual(search(101_400), 1)
        self.assertEqual(search(101_600), 2)
        # The search stays in one file (as RocketMQ's): the first whose last
        # record is at or after the time.
        self.assertEqual(search(103_400), 4)
        self.assertEqual(search(0), 0)
        self.assertEqual(search(999_999), 9)
        self.assertEqual(search(107_000), 7)
        self.assertEqual(queues.offset_by_time("nope", 0, 1, stamp), 0)

    def test_reads(self) -> None:
        """
        Max and min logical offsets, units from an offset (bounded, never
        across a file), the list of topics and queues.
        """
        log = CommitLog.open(self.mktemp(), consume_queues=True, clock=fixed_clock, consume_queue_units=4, segment_size=SEGMENT)
        self.addCleanup(log.close)
        results = [log.put(_message(i, topic="A" if i % 3 else "B")) for i in range(12)]
        log.dispatch(1 << 20)
        queues = log.consume_queues
        assert queues is not None
        self.assertEqual(queues.topics(), {"A": [0], "B": [0]})
        self.assertEqual(queues.max_offset("A", 0), 8)
        self.assertEqual(queues.min_offset("A", 0), 0)
        a = [r for i, r in enumerate(results) if i % 3]
        self.assertEqual(
            queues.units("A", 0, 2, 10),
            [Unit(a[2].offset, a[2].size, 2598919), Unit(a[3].offset, a[3].size, 2598919)],
        )
        self.assertEqual(len(queues.units("A", 0, 4, 3)), 3)
        self.assertEqual(queues.units("A", 0, 8, 3), [])
        self.assertEqual(queues.units("A", 1, 0, 3), [])
        self.assertEqual(queues.max_offset("C", 0), 0)


class RecoveryTests(SynchronousTestCase):
    """
    Opening recovers the queues, cuts them at the log's end and builds
    what they miss.
    """

    def _store(self, count: int = 30) -> tuple[str, list[int]]:
        directory = self.mktemp()
        with CommitLog.open(directory, consume_queues=True, clock=fixed_clock, consume_queue_units=8, segment_size=SEGMENT) as log:
            ends = [log.put(_message(i, queue_id=i % 2)).offset for i in range(count)]
        return directory, ends

    def _queue_bytes(self, directory: str) -> dict[str, str]:
        """
        Every consume-queue file under C{directory}: its SHA-256.
        """
        result = {}
        root = os.path.join(directory, "consumequeue")
        for path, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(path, name), "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                result[os.path.relpath(os.path.join(path, name), root)] = digest
        return result

    def test_old_store_builds_queues(self) -> None:
        """
        A store without queues (written before them) gets them at open,
        the same as they were built along the puts.
        """
        directory, _ = self._store()
        expected = self._queue_bytes(directory)
        shutil.rmtree(os.path.join(directory, "consumequeue"))
        os.remove(os.path.join(directory, "rmqha", "cq-dispatched"))
        with CommitLog.open(directory, consume_queues=True, consume_queue_units=8):
            pass
        self.assertEqual(self._queue_bytes(directory), expected)

    def test_torn_unit_rebuilt(self) -> None:
        """
        A unit torn by a crash (its size never written) ends the queue at
        recovery (CQ.recover); dispatch from the last synced mark writes it
        again.
        """
        directory, ends = self._store()
        expected = self._queue_bytes(directory)
        path = os.path.join(directory, "consumequeue", "T", "1", "00000000000000000160")
        with open(path, "r+b") as f:  # unit 14 of queue 1: the last
            f.seek((14 - 8) * UNIT_SIZE + 8)
            f.write(b"\0" * 12)
        with open(os.path.join(directory, "rmqha", "cq-dispatched"), "wb") as f:
            f.write(struct.pack(">q", ends[20]))
        with CommitLog.open(directory, consume_queues=True) as log:
            assert log.consume_queues is not None
            self.assertEqual(log.consume_queues.max_offset("T", 1), 15)
        self.assertEqual(self._queue_bytes(directory), expected)

    def test_units_past_the_log_cut(self) -> None:
        """
        Units pointing past the recovered end of the log
        (truncateDirtyLogicFiles) are cut and zeroed, files left without
        units removed; here the log lost its last records to a torn tail.
        """
        directory, ends = self._store(40)
        crashed = copy_store(self, directory)
        # Tear the commit log at record 21: everything after it is a torn
        # tail (zeros from its middle on).
        segment = os.path.join(crashed, "commitlog", "0" * 20)
        with open(segment, "r+b") as f:
            f.seek(ends[21] + 30)
            f.write(b"\0" * (ends[-1] + 200 - ends[21] - 30))
        with CommitLog.open(crashed, consume_queues=True, clock=fixed_clock) as log:
            self.assertEqual(log.max_offset, ends[21])
            queues = log.consume_queues
            assert queues is not None
            self.assertEqual(queues.max_offset("T", 0), 11)
            self.assertEqual(queues.max_offset("T", 1), 10)
            self.assertEqual(verify_consume_queues(log), [])
        queue0 = os.path.join(crashed, "consumequeue", "T", "0")
        self.assertEqual(sorted(os.listdir(queue0)), ["0" * 20, "00000000000000000160"])
        self.assertEqual(
            _units(os.path.join(queue0, "00000000000000000160"))[3:], [(0, 0, 0)] * 5
        )

    def test_cut_back_cuts_queues(self) -> None:
        """
        A slave's cut back (truncate_replica) cuts the queues with the log;
        dispatch resumes from the cut, and the next records take the cut
        units' places.
        """
        log = CommitLog.open(self.mktemp(), consume_queues=True, clock=fixed_clock, consume_queue_units=8, segment_size=SEGMENT)
        self.addCleanup(log.close)
        results = [log.put(_message(i, queue_id=i % 2)) for i in range(30)]
        log.dispatch(1 << 20)
        log.truncate_replica(results[11].offset)
        queues = log.consume_queues
        assert queues is not None
        self.assertEqual(queues.dispatched, results[11].offset)
        self.assertEqual((queues.max_offset("T", 0), queues.max_offset("T", 1)), (6, 5))
        self.assertEqual(verify_consume_queues(log), [])

    def test_log_replaced(self) -> None:
        """
        Queues left from another commit log (the log was replaced under
        them) are moved into the quarantine, not deleted, and built again
        from the log.
        """
        directory, _ = self._store()
        other = self.mktemp()
        with CommitLog.open(other, consume_queues=True, clock=fixed_clock, segment_size=SEGMENT) as log:
            for i in range(25):
                log.put(_message(i, topic="Other", queue_id=i % 3))
        os.rename(os.path.join(directory, "commitlog"), os.path.join(directory, "old"))
        os.rename(os.path.join(other, "commitlog"), os.path.join(directory, "commitlog"))
        before = self._queue_bytes(directory)
        with CommitLog.open(directory, consume_queues=True) as log:
            assert log.consume_queues is not None
            self.assertEqual(log.consume_queues.topics(), {"Other": [0, 1, 2]})
            self.assertEqual(verify_consume_queues(log), [])
        quarantine = os.path.join(directory, "rmqha", "quarantine")
        [aside] = [n for n in os.listdir(quarantine) if not n.endswith(".cq-dispatched")]
        self.assertTrue(aside.startswith("consumequeue-"))
        moved = {}
        for path, _, files in os.walk(os.path.join(quarantine, aside)):
            for name in files:
                with open(os.path.join(path, name), "rb") as f:
                    moved[os.path.relpath(os.path.join(path, name), os.path.join(quarantine, aside))] = hashlib.sha256(f.read()).hexdigest()
        self.assertEqual(moved, before)

    def test_wrong_file_size(self) -> None:
        """
        A consume-queue file of another size than its queue's is refused,
        naming the file.
        """
        directory, _ = self._store()
        path = os.path.join(directory, "consumequeue", "T", "0", "00000000000000000160")
        with open(path, "ab") as f:
            f.write(b"x")
        error = self.assertRaises(
            ConsumeQueueError, CommitLog.open, directory, consume_queues=True
        )
        self.assertIn(path, str(error))
        self.assertIn("161 bytes, but consume-queue files are 160 bytes", str(error))

    def test_checkpoint(self) -> None:
        """
        The checkpoint is one 4096-byte page: physicMsgTimestamp and
        logicsMsgTimestamp are the last record's store timestamp once it is
        flushed and dispatched; indexMsgTimestamp stays 0 (no index).
        """
        directory, _ = self._store(3)
        path = os.path.join(directory, "checkpoint")
        self.assertEqual(os.path.getsize(path), 4096)
        stamp = int(fixed_clock() * 1000)
        self.assertEqual(read_checkpoint(path), (stamp, stamp, 0))


class VerifyTests(SynchronousTestCase):
    """
    C{store check}'s look at the queues: one line per bad unit or record.
    """

    def test_findings(self) -> None:
        """
        A unit with the wrong size, one with the wrong tag hash, and a
        record without its unit are each named with file and unit.
        """
        directory = self.mktemp()
        with CommitLog.open(directory, consume_queues=True, clock=fixed_clock, consume_queue_units=8, segment_size=SEGMENT) as log:
            for i in range(12):
                log.put(_message(i))
        path = os.path.join(directory, "consumequeue", "T", "0", "00000000000000000160")
        with open(path, "r+b") as f:
            f.seek(1 * UNIT_SIZE + 8)
            f.write(struct.pack(">i", 5))
            f.seek(2 * UNIT_SIZE + 12)
            f.write(struct.pack(">q", 1))
            f.seek(3 * UNIT_SIZE)
            f.write(b"\0" * UNIT_SIZE)
        log = CommitLog.open(directory, read_only=True)
        self.addCleanup(log.close)
        findings = verify_consume_queues(log)
        self.assertEqual(len(findings), 3, findings)
        self.assertIn(f"{path} unit 1 (queue offset 9): size 5", findings[0])
        self.assertIn(f"{path} unit 2 (queue offset 10): tag hash 1", findings[1])
        self.assertIn("queue offset 11", findings[2])
        self.assertIn("has no unit", findings[2])


    def test_stray_file_named_and_left(self) -> None:
        """
        A file where a queue id directory belongs (what a BLANK dispatched
        as a message of topic "" left: C{consumequeue/0/<20 digits>}) is a
        finding of C{store check}; opening the store warns of it, reads
        nothing of it and leaves it; the real queues are unchanged.
        """
        from twisted.logger import globalLogPublisher

        directory = self.mktemp()
        with CommitLog.open(directory, consume_queues=True, clock=fixed_clock, segment_size=SEGMENT) as log:
            for i in range(4):
                log.put(_message(i))
        stray = os.path.join(directory, "consumequeue", "0", "0" * 20)
        os.makedirs(os.path.dirname(stray))
        with open(stray, "wb") as f:
            f.write(struct.pack(">qiq", 4980492, 244, 0) + b"\0" * (UNIT_SIZE * 63))
        with CommitLog.open(directory, read_only=True) as log:
            findings = verify_consume_queues(log)
        self.assertEqual(len(findings), 1, findings)
        self.assertIn(f"{stray}: a file where a queue id directory belongs", findings[0])
        (again,) = verify_store_queues(directory, log.max_offset)
        self.assertTrue(again.endswith(findings[0].split(directory, 1)[1]), again)
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        with CommitLog.open(directory, consume_queues=True, clock=fixed_clock) as log:
            log.put(_message(4))
            while log.dispatch(1 << 20):
                pass
            assert log.consume_queues is not None
            self.assertEqual(log.consume_queues.max_offset("T", 0), 5)
        self.assertTrue(os.path.isfile(stray))
        self.assertTrue(
            any(
                e.get("path") == os.path.abspath(stray) and "queue id directory" in e.get("what", "")
                for e in events
            ),
            events,
        )


class FastVerifyTests(SynchronousTestCase):
    """
    C{store check}'s look at the queues compares the units the log calls
    for with the queue files' bytes a chunk of the log at a time, and looks
    unit by unit only where they differ: each kind of finding is still
    found and named, whatever the chunk (L{tests.test_pure_path} runs these
    again on the pure-Python path).
    """

    def _store(self) -> str:
        """
        Two topics of two queues, 8 units a file, records the compiled
        decode leaves to Python among them (the schedule topic, a
        non-ASCII tag) and prepared transaction records (no unit), in
        2 KiB segments (BLANKs between).
        """
        directory = os.path.abspath(self.mktemp())
        with CommitLog.open(
            directory, consume_queues=True, clock=fixed_clock, consume_queue_units=8,
            segment_size=2048,
        ) as log:
            for i in range(60):
                topic = "SCHEDULE_TOPIC_XXXX" if i % 13 == 5 else f"T{i % 2}"
                tags = "标签" if i % 7 == 3 else f"Tag{i % 3}"
                message = _message(i, queue_id=(i // 2) % 2, tags=tags, topic=topic)
                if topic.startswith("SCHEDULE"):
                    message.properties["DELAY"] = "3"
                if i % 17 == 4:
                    message = _message(i, topic="T0", sysflag=SysFlag.TRANSACTION_PREPARED_TYPE)
                log.put(message)
            self.assertGreater(log.max_offset, 3 * 2048)
        return directory

    def _verify(self, directory: str, limit: int = 1000) -> list[str]:
        log = CommitLog.open(directory, read_only=True)
        self.addCleanup(log.close)
        findings = verify_consume_queues(log, limit)
        self.assertEqual(verify_store_queues(directory, log.max_offset, limit), findings)
        # What store check runs: the same findings from the record check's
        # walk, in its 8 MiB blocks and in blocks of a few records.
        for block in (None, 300):
            if block is not None:
                self.patch(_recovery, "_WALK_BLOCK", block)
            check = QueueCheck(directory, limit)
            try:
                report = verify_store(directory, on_block=check.feed)
                self.assertTrue(report.ok, report)
                self.assertEqual(check.finish(report.end_offset), findings)
            finally:
                check.close()
        return findings

    def _unit(self, directory: str, topic: str, queue_id: int, n: int) -> tuple[str, int]:
        """
        The file and byte position of unit C{n} of a queue (8 a file).
        """
        start = n // 8 * 8 * UNIT_SIZE
        return (
            os.path.join(directory, "consumequeue", topic, str(queue_id), "%020d" % start),
            n * UNIT_SIZE - start,
        )

    def _records(self, directory: str) -> list[tuple[int, str, int, int, int]]:
        """
        (offset, topic, queue id, queue offset, size) of the records with units.
        """
        with CommitLog.open(directory, read_only=True) as log:
            return [
                (r.offset, r.topic, r.queue_id, r.queue_offset, r.size)  # type: ignore[union-attr]
                for r in log.records(with_body=False)
                if r.sysflag & 0xC != 0x4  # type: ignore[union-attr]
            ]

    def _patch(self, path: str, at: int, data: bytes) -> None:
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(data)

    def test_sound(self) -> None:
        """
        Queues as dispatch built them: no finding, with 8 MiB chunks or
        chunks that cut records (and records longer than a chunk).
        """
        directory = self._store()
        # Sound queues are read as bytes: a unit is read one by one only to
        # look past each queue's last record (T0, T1, SCHEDULE_TOPIC_XXXX:
        # 6 queues; _verify checks four ways).
        looked: list[int] = []
        unit = consumequeue._QueueFiles.unit

        def counted(files: consumequeue._QueueFiles, logical: int) -> object:
            looked.append(logical)
            return unit(files, logical)

        self.patch(consumequeue._QueueFiles, "unit", counted)
        self.assertEqual(self._verify(directory), [])
        self.assertEqual(len(looked), 4 * 6, looked)
        for chunk in (100, 333):
            self.patch(consumequeue, "CHECK_CHUNK", chunk)
            self.assertEqual(self._verify(directory), [])

    def test_each_finding(self) -> None:
        """
        A wrong size, a wrong tag hash, a missing unit, a unit pointing at
        another topic's record, and a unit after a queue's last record:
        each one line naming file and unit, in commit-log order, with
        whole chunks or small ones.
        """
        directory = self._store()
        records = self._records(directory)
        t0 = [r for r in records if r[1] == "T0" and r[2] == 0]
        t1 = [r for r in records if r[1] == "T1" and r[2] == 1]
        size_at, size_pos = self._unit(directory, "T0", 0, t0[1][3])
        self._patch(size_at, size_pos + 8, struct.pack(">i", 5))
        tag_at, tag_pos = self._unit(directory, "T1", 1, t1[2][3])
        self._patch(tag_at, tag_pos + 12, struct.pack(">q", 1))
        gone_at, gone_pos = self._unit(directory, "T0", 0, t0[9][3])
        self._patch(gone_at, gone_pos, bytes(UNIT_SIZE))
        other = t1[10]
        moved_at, moved_pos = self._unit(directory, "T1", 1, t1[11][3])
        self._patch(moved_at, moved_pos, struct.pack(">qiq", t0[3][0], t0[3][4], 0))
        last = t0[-1][3] + 1
        extra_at, extra_pos = self._unit(directory, "T0", 0, last)
        self._patch(extra_at, extra_pos, struct.pack(">qiq", other[0], other[4], 0))
        expected = [
            f"{size_at} unit {size_pos // UNIT_SIZE} (queue offset {t0[1][3]}): size 5, "
            f"but the record at commit-log offset {t0[1][0]} is {t0[1][4]} bytes",
            f"{tag_at} unit {tag_pos // UNIT_SIZE} (queue offset {t1[2][3]}): tag hash 1, "
            f"but the record at commit-log offset {t1[2][0]} hashes to ",
            f"record at commit-log offset {t0[9][0]} (T0, queue 0, queue offset "
            f"{t0[9][3]}) has no unit: {gone_at} unit {gone_pos // UNIT_SIZE}",
            f"{moved_at} unit {moved_pos // UNIT_SIZE} (queue offset {t1[11][3]}): points "
            f"at commit-log offset {t0[3][0]}, but the record with this queue offset is "
            f"at {t1[11][0]}",
            f"{extra_at} unit {extra_pos // UNIT_SIZE} (queue offset {last}): points at "
            f"commit-log offset {other[0]}, but T0 queue 0 has no record with this queue "
            f"offset in the log",
        ]
        for chunk in (None, 100, 333):
            if chunk is not None:
                self.patch(consumequeue, "CHECK_CHUNK", chunk)
            findings = self._verify(directory)
            self.assertEqual(len(findings), len(expected), findings)
            for line, start in zip(findings, expected):
                self.assertTrue(line.startswith(start), (line, start))
        self.assertEqual(self._verify(directory, limit=2), self._verify(directory)[:2])

    def test_missing_file(self) -> None:
        """
        A queue file removed: every record whose unit it held has none.
        """
        directory = self._store()
        records = [r for r in self._records(directory) if r[1:3] == ("T1", 1)]
        path, _ = self._unit(directory, "T1", 1, 8)
        os.remove(path)
        findings = self._verify(directory)
        self.assertEqual(
            [line.split(" has no unit: ")[1] for line in findings],
            [f"{path} unit {r[3] - 8}" for r in records if 8 <= r[3] < 16],
        )

    def test_damaged_log(self) -> None:
        """
        Fed from the walk of a damaged log (store check then reports the
        damage, not the queues), the check takes the stretches of records
        around the damage without an error of its own.
        """
        directory = self._store()
        records = self._records(directory)
        offset = records[20][0]
        path = os.path.join(directory, "commitlog", "%020d" % (offset - offset % 2048))
        self._patch(path, offset % 2048 + 8, b"\xff\xff\xff\xff")  # (the magic)
        for block in (None, 300):
            if block is not None:
                self.patch(_recovery, "_WALK_BLOCK", block)
            check = QueueCheck(directory)
            try:
                report = verify_store(directory, on_block=check.feed)
            finally:
                check.close()
            self.assertFalse(report.ok)
            self.assertEqual(report.damage[0].offset, offset)

    def test_open_store(self) -> None:
        """
        On a store with the C{abort} marker (open, or crashed), records at
        or after the dispatch mark without their unit are no finding; the
        same store closed cleanly, they are.
        """
        directory = self._store()
        with CommitLog.open(directory, segment_size=2048) as log:
            mark = log.max_offset
            for i in range(5):
                log.put(_message(100 + i, topic="T0"))  # (no consume queues: no units)
        findings = self._verify(directory)
        self.assertEqual(len(findings), 5, findings)
        self.assertTrue(all("has no unit" in line for line in findings), findings)
        with open(os.path.join(directory, "abort"), "wb"):
            pass
        write_mark(os.path.join(directory, "rmqha", "cq-dispatched"), mark)
        self.assertEqual(self._verify(directory), [])
        write_mark(os.path.join(directory, "rmqha", "cq-dispatched"), 0)
        self.assertEqual(self._verify(directory), [])
        write_mark(os.path.join(directory, "rmqha", "cq-dispatched"), mark + 1)
        findings = self._verify(directory)  # (the record at the old mark is before it)
        self.assertEqual(len(findings), 1, findings)
        self.assertIn(f"record at commit-log offset {mark} (T0, queue 0", findings[0])


class RocketMQStoreTests(SynchronousTestCase):
    """
    The queues of a store written by the Java transcription of RocketMQ
    4.9.8's store writer (C{tests/fixtures/RocketMQStoreWriter.java}): rmqha
    opens them as they are, and builds byte-identical ones from the same
    commit log.  Skipped without Java.
    """

    def _check(self, variant: str) -> None:
        from tests.test_rocketmq_store import copy_store as copy_java, java_store

        store = java_store(variant)
        java = RecoveryTests._queue_bytes(self, store.path)  # type: ignore[arg-type]
        self.assertTrue(java)
        # Opened as it is: the queues are RocketMQ's, untouched, and
        # nothing is left to dispatch.
        kept = copy_java(self, store)
        with CommitLog.open(kept, consume_queues=True, store_host=tuple(store.store_host)) as log:  # type: ignore[arg-type]
            queues = log.consume_queues
            assert queues is not None
            self.assertEqual(queues.dispatched, log.max_offset)
            self.assertEqual(verify_consume_queues(log), [])
            self.assertEqual(
                sum(queues.max_offset(t, q) for t, ids in queues.topics().items() for q in ids),
                len([m for m in store.messages if m["sysflag"] & 0xC not in (0x4, 0xC)]),
            )
        self.assertEqual(RecoveryTests._queue_bytes(self, kept), java)  # type: ignore[arg-type]
        # Built by rmqha from the same log: the same bytes.
        built = copy_java(self, store)
        shutil.rmtree(os.path.join(built, "consumequeue"))
        with CommitLog.open(built, consume_queues=True, consume_queue_units=100) as log:  # --cq-file-size 2000
            self.assertEqual(verify_consume_queues(log), [])
        self.assertEqual(RecoveryTests._queue_bytes(self, built), java)  # type: ignore[arg-type]

    def test_clean(self) -> None:
        self._check("clean")

    def test_crashed(self) -> None:
        self._check("crashed")


class CompiledTests(SynchronousTestCase):
    """
    The compiled decode (C{_speedups.cq_units}) and the pure-Python one
    build the same queues.
    """

    def test_same_queues(self) -> None:
        from rmqha.store import _record as codec

        if getattr(codec._accel, "cq_units", None) is None:
            raise SkipTest("no compiled accelerator (or RMQHA_PURE=1)")
        directory = self.mktemp()
        with CommitLog.open(directory, consume_queues=True, clock=fixed_clock, segment_size=SEGMENT) as log:
            for i in range(200):
                properties = {}
                if i % 3 == 0:
                    properties["TAGS"] = ["TagA", "标签", "", "a\u00e9"][i % 4]
                if i % 5 == 0:
                    properties["KEYS"] = "TAGS\x01no"[:4] + f"k{i}"
                topic = "SCHEDULE_TOPIC_XXXX" if i % 7 == 0 else f"T{i % 2}"
                if topic.startswith("SCHEDULE"):
                    properties["DELAY"] = str(i % 20)
                log.put(
                    Message(
                        topic=topic,
                        body=b"b" * (i % 40),
                        queue_id=i % 3,
                        properties=properties,
                        born_host=("2001:db8::1", 9) if i % 4 == 1 else None,
                        sysflag=SysFlag.TRANSACTION_PREPARED_TYPE if i % 11 == 0 else 0,
                    )
                )
        compiled = RecoveryTests._queue_bytes(self, directory)  # type: ignore[arg-type]
        pure = copy_store(self, directory)
        shutil.rmtree(os.path.join(pure, "consumequeue"))
        os.remove(os.path.join(pure, "rmqha", "cq-dispatched"))
        self.patch(codec, "_accel", None)
        with CommitLog.open(pure, consume_queues=True) as log:
            self.assertEqual(verify_consume_queues(log), [])
        self.assertEqual(RecoveryTests._queue_bytes(self, pure), compiled)  # type: ignore[arg-type]
        self.assertIn("SCHEDULE_TOPIC_XXXX/0/00000000000000000000", compiled)


class SettingTests(SynchronousTestCase):
    """
    C{mappedFileSizeConsumeQueue} / C{--consume-queue-file-size}.
    """

    def test_flag_and_key(self) -> None:
        """
        The flag and the broker.conf key set the file size in bytes; less
        than a unit is refused, naming the flag.
        """
        from rmqha.tap import Options

        options = Options()
        options.parseOptions(["--store-dir", "s", "--consume-queue-file-size", "100"])
        self.assertEqual(options.settings.consume_queue_file_size, 100)
        conf = self.mktemp()
        with open(conf, "w") as f:
            f.write("storePathRootDir=s\nmappedFileSizeConsumeQueue=6000000\n")
        options = Options()
        options.parseOptions(["--config", conf])
        self.assertEqual(options.settings.consume_queue_file_size, 6_000_000)
        from twisted.python.usage import UsageError

        error = self.assertRaises(
            UsageError,
            Options().parseOptions,
            ["--store-dir", "s", "--consume-queue-file-size", "19"],
        )
        self.assertIn("consume-queue-file-size", str(error))
