"""
Tests for L{rmqha.store._prefault}: the pages ahead of the put position
faulted in off the put thread (issue 15, target 4).
"""

from __future__ import annotations

import mmap
import os
import resource
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.store import _record
from rmqha.store._prefault import AHEAD, IDLE_CPUS, WINDOW, IdleGauge, Prefaulter, idle_ticks
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog


class _Recorder:
    """
    A fake engine that records what it is asked (mapping, position,
    target) and populates nothing.
    """

    def __init__(self, working: bool = True) -> None:
        self.asks: list[tuple[Any, int, int]] = []
        self.releases = 0
        self.working = working

    def ask(self, mm: mmap.mmap, position: int, target: int) -> bool:
        self.asks.append((mm, position, target))
        return self.working

    def release(self) -> None:
        self.releases += 1

    def stop(self) -> None:
        self.working = False

    def cpu_time(self) -> float:
        return 0.0


class PrefaultTests(SynchronousTestCase):
    """
    What a commit log's puts ask the pre-faulting for.
    """

    def log(self, segment_size: int, working: bool = True) -> tuple[CommitLog, _Recorder]:
        log = CommitLog.open(self.mktemp(), segment_size=segment_size)
        self.addCleanup(log.close)
        recorder = _Recorder(working)
        log._prefault = Prefaulter(recorder)
        return log, recorder

    def test_puts_keep_the_pages_ahead_populated(self) -> None:
        """
        The first put asks for the pages from its end to 2 x AHEAD past
        it; later puts ask again only once they are AHEAD past where they
        last asked, each time for 2 x AHEAD past themselves.
        """
        log, recorder = self.log(16 * AHEAD)
        log.put(Message("T", b"x" * 1000))
        first = log.max_offset
        mm = log._segments[-1].mm
        self.assertEqual(recorder.asks, [(mm, first, first + 2 * AHEAD)])
        body = b"y" * (64 * 1024)
        while log.max_offset + len(body) + 256 <= first + AHEAD:
            log.put(Message("T", body))
        self.assertEqual(len(recorder.asks), 1)
        log.put(Message("T", body))
        self.assertEqual(
            recorder.asks[1:], [(mm, log.max_offset, log.max_offset + 2 * AHEAD)]
        )

    def test_bounded_by_the_segment(self) -> None:
        """
        In a segment smaller than the window, nothing past its end is
        asked for, and once its end is, no put of it asks again.
        """
        size = 1 << 20
        log, recorder = self.log(size)
        log.put(Message("T", b"x" * 1000))
        log.put(Message("T", b"x" * 1000))
        log.put_batch([Message("T", b"x" * 1000)] * 3)
        self.assertEqual(len(recorder.asks), 1)
        self.assertEqual(recorder.asks[0][2], size)

    def test_roll_moves_to_the_new_segment(self) -> None:
        """
        A roll releases the mapping before unmapping it (the old segment
        ends unmapped) and the next put asks for the new segment's pages.
        """
        size = 256 * 1024
        log, recorder = self.log(size)
        body = b"z" * (60 * 1024)
        log.put(Message("T", body))
        first = log._segments[-1]
        while len(log._segments) == 1:
            log.put(Message("T", body))
        self.assertIsNone(first._mm)
        self.assertEqual(recorder.releases, 1)
        new = log._segments[-1]
        self.assertEqual(
            recorder.asks[-1], (new.mm, log.max_offset - new.start, size)
        )

    def test_an_engine_that_cannot(self) -> None:
        """
        An engine that cannot (no MADV_POPULATE_WRITE) is asked once per
        segment, and puts go on as before.
        """
        log, recorder = self.log(16 * AHEAD, working=False)
        body = b"y" * (64 * 1024)
        while log.max_offset <= 3 * AHEAD:
            log.put(Message("T", body))
        self.assertEqual(len(recorder.asks), 1)

    def test_an_engine_that_raises(self) -> None:
        """
        An engine that raises (a mapping it cannot hold) fails no put: the
        put's record, bookkeeping and append observers are all done, and
        that segment is not asked about again.
        """
        log, recorder = self.log(16 * AHEAD)

        def broken(mm: mmap.mmap, position: int, target: int) -> bool:
            recorder.asks.append((mm, position, target))
            raise BufferError("cannot hold it")

        recorder.ask = broken  # type: ignore[method-assign]
        seen: list[int] = []
        log.observe_appends(seen.append)
        result = log.put(Message("T", b"x" * 1000))
        log.put(Message("T", b"x" * 1000))
        self.assertEqual(seen, [result.next_offset, log.max_offset])
        self.assertEqual(len(recorder.asks), 1)

    def test_truncate_and_close_release(self) -> None:
        """
        Cutting the log back (a master turned slave) and closing it release
        the mapping first; close stops the engine.
        """
        log, recorder = self.log(1 << 20)
        log.put(Message("T", b"x" * 1000))
        log.put(Message("T", b"x" * 1000))
        log.truncate_replica(log.min_offset)
        self.assertEqual(recorder.releases, 1)
        log.close()
        self.assertFalse(recorder.working)

    def test_pure_path_has_none(self) -> None:
        """
        Without the accelerator (C{RMQHA_PURE=1}) there is no
        pre-faulting: puts fault their pages in themselves.
        """
        self.patch(_record, "_accel", None)
        log = CommitLog.open(self.mktemp(), segment_size=1 << 20)
        self.addCleanup(log.close)
        self.assertIsNone(log._prefault)
        log.put(Message("T", b"x"))


class EngineTests(SynchronousTestCase):
    """
    The accelerator's C{Prefault}: pages faulted in, writable, on its own
    thread, no byte written, the mapping held until released.
    """

    def setUp(self) -> None:
        if _record._accel is None:
            raise SkipTest("the compiled accelerator is not built")
        path = self.mktemp()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.addCleanup(os.close, fd)
        self.size = 4 << 20
        os.posix_fallocate(fd, 0, self.size)
        self.mm = mmap.mmap(fd, self.size)
        self.addCleanup(self.mm.close)
        # (Cleanups run last first: the engine lets go of the mapping
        # before it is closed.)
        self.engine = _record._accel.Prefault()
        self.addCleanup(self.engine.stop)

    def populated(self, position: int, target: int) -> int:
        self.assertTrue(self.engine.ask(self.mm, position, target))
        done = self.engine.wait()
        if not self.engine.working:
            raise SkipTest("this kernel has no MADV_POPULATE_WRITE")
        return int(done)

    def test_writes_nothing(self) -> None:
        """
        Populating over written bytes and zeros leaves every byte as it
        was.
        """
        self.mm[100:105] = b"hello"
        self.assertGreaterEqual(self.populated(0, 1 << 20), 1 << 20)
        self.assertEqual(self.mm[100:105], b"hello")
        self.assertEqual(self.mm[:100], bytes(100))
        self.assertEqual(self.mm[105 : 1 << 20], bytes((1 << 20) - 105))
        self.assertTrue(self.engine.running)

    def test_then_writes_do_not_fault(self) -> None:
        """
        Writing into populated pages takes (almost) no page fault on the
        writing thread; writing into pages never touched does.
        """
        half = self.size // 2
        self.populated(0, half)

        def faults_writing(start: int, end: int) -> int:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            for position in range(start, end, mmap.PAGESIZE):
                self.mm[position] = 1
            return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

        populated = faults_writing(0, half)
        untouched = faults_writing(half, self.size)
        self.assertGreater(untouched, 0)
        # (0 in practice; writeback cleaning a page in between may cost one.)
        self.assertLessEqual(populated, untouched // 4)

    def test_cpu_time(self) -> None:
        """
        The engine reports its thread's CPU time: none before it starts,
        some once it has populated pages.
        """
        self.assertEqual(self.engine.cpu_time(), 0.0)
        self.populated(0, self.size)
        self.assertGreater(self.engine.cpu_time(), 0.0)

    def test_holds_the_mapping_until_released(self) -> None:
        """
        While the engine holds a mapping it cannot be closed under it
        (BufferError); after release it can; stop ends the thread and
        later asks do nothing.
        """
        self.populated(0, 1 << 20)
        with self.assertRaises(BufferError):
            self.mm.close()
        self.engine.release()
        self.engine.stop()
        self.assertFalse(self.engine.running)
        self.assertFalse(self.engine.ask(self.mm, 0, 4096))
        self.mm.close()

    def test_forked_child(self) -> None:
        """
        In a child forked while the engine's thread runs (there is no
        thread there), the engine starts afresh: it populates, releases and
        stops without waiting for a thread that is not there.
        """
        self.populated(0, 1 << 20)
        pid = os.fork()
        if pid == 0:  # the child: report by exit status only
            status = 1
            try:
                self.engine.ask(self.mm, 1 << 20, 2 << 20)
                done = self.engine.wait()
                self.engine.release()
                self.engine.stop()
                status = 0 if done >= 2 << 20 or not self.engine.working else 2
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertTrue(self.engine.running)

    def test_bad_arguments(self) -> None:
        """
        Positions must be ints >= 0; a target past the mapping is cut to
        its end; a read-only buffer is refused (BufferError).
        """
        with self.assertRaises(TypeError):
            self.engine.ask(self.mm, -1, 10)
        with self.assertRaises(BufferError):
            self.engine.ask(b"read only", 0, 4)
        self.assertLessEqual(self.populated(0, 10 * self.size), self.size)


def _stat(*cpus: tuple[int, int]) -> str:
    """
    A C{/proc/stat} text whose C{cpuN} lines have C{(busy, idle)} ticks
    (the busy ones as user time, a tick of iowait in the idle).
    """
    lines = ["cpu  1 2 3 4 5 6 7 8 9 10"]
    for n, (busy, idle) in enumerate(cpus):
        lines.append(f"cpu{n} {busy} 0 0 {idle - 1} 1 0 0 0 0 0")
    lines += ["intr 1 2 3", "ctxt 5", "cpuweird is no longer a cpu line"]
    return "\n".join(lines) + "\n"


class IdleTicksTests(SynchronousTestCase):
    """
    L{idle_ticks}: what C{/proc/stat} says of the CPUs counted.
    """

    def test_counts_the_cpus_asked_for(self) -> None:
        text = _stat((10, 90), (70, 30), (0, 100))
        self.assertEqual(idle_ticks(text, None), (220, 300, 3))
        self.assertEqual(idle_ticks(text, frozenset({0, 2})), (190, 200, 2))

    def test_a_line_it_does_not_know(self) -> None:
        """
        A C{cpuN} line with too few columns is named in the error.
        """
        error = self.assertRaises(ValueError, idle_ticks, "cpu0 1 2 3\n", None)
        self.assertIn("cpu0 1 2 3", str(error))


class IdleGaugeTests(SynchronousTestCase):
    """
    L{IdleGauge}: whether a CPU is spare, from the ticks between two
    readings at least L{WINDOW} apart.
    """

    def gauge(self, *texts: str) -> tuple[IdleGauge, list[float], list[int]]:
        now = [0.0]
        reads = [0]
        queue = list(texts)

        def read() -> str:
            reads[0] += 1
            text = queue.pop(0)
            if text == "gone":
                raise OSError("no /proc/stat")
            return text

        return IdleGauge(read, lambda: now[0], None, hz=100), now, reads

    def test_first_reading_says_yes(self) -> None:
        """
        With nothing to compare, the gauge says a CPU is spare (the pages
        are asked for, as before it existed).
        """
        gauge, _, _ = self.gauge(_stat((0, 0), (0, 0)))
        self.assertTrue(gauge.idle(0.0))

    def test_busy_cpus(self) -> None:
        """
        Two CPUs with less than L{IDLE_CPUS} of one idle between readings:
        no CPU is spare; with more, one is.
        """
        gauge, now, _ = self.gauge(
            _stat((0, 0), (0, 0)),
            _stat((100, 0), (90, 10)),
            _stat((200, 0), (120, 70)),
        )
        gauge.idle(0.0)
        now[0] += WINDOW
        self.assertLess(10 / 100, IDLE_CPUS)
        self.assertFalse(gauge.idle(0.0))
        now[0] += WINDOW
        self.assertTrue(gauge.idle(0.0))

    def test_own_time_counts_as_spare(self) -> None:
        """
        The CPU the pre-faulting itself used would be idle without it: it
        counts as spare, so a busy thread does not switch itself off.
        """
        gauge, now, _ = self.gauge(_stat((0, 0), (0, 0)), _stat((100, 0), (90, 10)))
        gauge.idle(0.0)
        now[0] += WINDOW
        # 0.1 CPU idle, 0.3 s of the thread's own over 1 s: 0.4 spare.
        self.assertLess(0.1, IDLE_CPUS)
        self.assertTrue(gauge.idle(0.3))

    def test_own_time_started_afresh(self) -> None:
        """
        A thread whose count started afresh (a forked child's) adds
        nothing: the gauge goes by the idle ticks alone.
        """
        gauge, now, _ = self.gauge(_stat((0, 0), (0, 0)), _stat((100, 0), (30, 70)))
        gauge.idle(5.0)
        now[0] += WINDOW
        # 0.7 CPU idle: spare, whatever the count's drop.
        self.assertTrue(gauge.idle(0.1))

    def test_quota(self) -> None:
        """
        Under a cgroup CPU quota the spare CPU is at most what the quota
        left (the thread's own use counted as spare), whatever the host's
        idle CPUs; a quota whose use cannot be read is left out.
        """

        class Limit:
            cpus = 1.0

            def __init__(self) -> None:
                self.used: float | None = 10.0

            def used_seconds(self) -> float | None:
                return self.used

        def second(used: float | None, own: float) -> bool:
            """
            The gauge's answer after one second in which the host had 1.8
            CPUs idle, the cgroup then used C{used} (C{None}: unreadable)
            and the thread C{own} seconds.
            """
            now = [0.0]
            texts = [_stat((0, 0), (0, 0)), _stat((10, 90), (10, 90))]
            limit = Limit()
            gauge = IdleGauge(
                lambda: texts.pop(0), lambda: now[0], None, hz=100, limit=limit  # type: ignore[arg-type]
            )
            gauge.idle(0.0)
            now[0] += 1.0
            limit.used = None if used is None else 10.0 + used
            return gauge.idle(own)

        # The cgroup used 0.9 of its 1 CPU: 0.1 spare.
        self.assertFalse(second(0.9, 0.0))
        # Of those 0.9, 0.5 were the thread's own: 0.6 spare.
        self.assertTrue(second(0.9, 0.5))
        # Unreadable use: the host's idle CPUs alone.
        self.assertTrue(second(None, 0.0))

    def test_read_at_most_once_a_window(self) -> None:
        """
        Between readings the last answer stands and nothing is read.
        """
        gauge, now, reads = self.gauge(_stat((0, 0)), _stat((100, 0)), _stat((100, 100)))  # (one CPU)
        gauge.idle(0.0)
        now[0] += WINDOW
        self.assertFalse(gauge.idle(0.0))
        now[0] += WINDOW / 2
        self.assertFalse(gauge.idle(0.0))
        self.assertEqual(reads[0], 2)
        now[0] += WINDOW / 2
        self.assertTrue(gauge.idle(0.0))
        self.assertEqual(reads[0], 3)

    def test_cannot_tell(self) -> None:
        """
        When C{/proc/stat} cannot be read or understood, the gauge says
        yes (as before it existed) and starts afresh.
        """
        gauge, now, _ = self.gauge(
            _stat((0, 0)), _stat((100, 0)), "gone", "cpu0 x\n", _stat((100, 0))
        )
        gauge.idle(0.0)
        now[0] += WINDOW
        self.assertFalse(gauge.idle(0.0))
        for _ in range(3):
            now[0] += WINDOW
            self.assertTrue(gauge.idle(0.0))

    def test_reads_this_machine(self) -> None:
        """
        The default reader understands this machine's C{/proc/stat}.
        """
        if not os.path.exists("/proc/stat"):
            raise SkipTest("no /proc/stat here")
        with open("/proc/stat") as f:
            idle, total, counted = idle_ticks(f.read(), None)
        self.assertGreater(counted, 0)
        self.assertGreaterEqual(total, idle)


class _Gauge:
    def __init__(self) -> None:
        self.spare = True
        self.owns: list[float] = []

    def idle(self, own: float) -> bool:
        self.owns.append(own)
        return self.spare


class PrefaulterGaugeTests(SynchronousTestCase):
    """
    The pre-faulting asks for pages only while a CPU is spare.
    """

    def test_no_spare_cpu(self) -> None:
        """
        Without a spare CPU nothing is asked; the gauge is asked again
        L{AHEAD} further on, and once a CPU is spare the pages are asked
        for from there.  The gauge is told the engine's CPU time.
        """
        recorder = _Recorder()
        gauge = _Gauge()
        prefault = Prefaulter(recorder, gauge)  # type: ignore[arg-type]
        gauge.spare = False
        mm = object()
        prefault.ahead(mm, 1000, 64 * AHEAD)  # type: ignore[arg-type]
        self.assertEqual(recorder.asks, [])
        self.assertEqual(prefault.ask_at, 1000 + AHEAD)
        gauge.spare = True
        prefault.ahead(mm, 1000 + AHEAD + 10, 64 * AHEAD)  # type: ignore[arg-type]
        self.assertEqual(recorder.asks, [(mm, 1000 + AHEAD + 10, 1000 + 3 * AHEAD + 10)])
        self.assertEqual(gauge.owns, [0.0, 0.0])
        self.assertEqual(prefault.figures(), (1, 1, 0.0))

    def test_made_with_a_gauge(self) -> None:
        """
        A commit log's pre-faulting (with the accelerator) asks only with a
        CPU to spare.
        """
        if _record._accel is None:
            raise SkipTest("the compiled accelerator is not built")
        log = CommitLog.open(self.mktemp(), segment_size=1 << 20)
        self.addCleanup(log.close)
        assert log._prefault is not None
        self.assertIsInstance(log._prefault.gauge, IdleGauge)
