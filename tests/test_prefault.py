"""
Tests for L{rmqha.store._prefault}: the pages ahead of the put position
faulted in off the put thread (issue 15, target 4).
"""

from __future__ import annotations

import mmap
import os
import resource
from typing import Any, Callable

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rmqha.store import _record
from rmqha.store._prefault import AHEAD, CHUNK, Prefaulter
from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog


class _Recorder:
    """
    A C{populate} that records what it was asked for (and by which
    mapping), populating nothing.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[Any, int, int]] = []

    def __call__(self, mm: mmap.mmap, position: int, length: int) -> int:
        self.calls.append((mm, position, length))
        return length


def _by_hand(populate: Callable[[mmap.mmap, int, int], int]) -> Prefaulter:
    """
    A prefaulter whose worker never starts: tests run its steps.
    """
    return Prefaulter(populate, start=lambda run: None)


def _drain(prefaulter: Prefaulter) -> None:
    while prefaulter.work_once():
        pass


class PrefaultTests(SynchronousTestCase):
    """
    What a commit log's puts ask the pre-faulting for.
    """

    def log(self, segment_size: int) -> tuple[CommitLog, _Recorder]:
        log = CommitLog.open(self.mktemp(), segment_size=segment_size)
        self.addCleanup(log.close)
        recorder = _Recorder()
        log._prefault = _by_hand(recorder)
        return log, recorder

    def test_puts_keep_the_pages_ahead_populated(self) -> None:
        """
        The first put asks for the pages from its page to 2 x AHEAD past
        its end, populated in chunks of at most CHUNK, from a page, in order;
        later puts ask again only once they are AHEAD past where they last
        asked, and never for more than the segment.
        """
        size = 16 * AHEAD
        log, recorder = self.log(size)
        log.put(Message("T", b"x" * 1000))
        first_end = log.max_offset
        _drain(log._prefault)  # type: ignore[arg-type]
        mm = log._segments[-1].mm
        self.assertEqual({c[0] for c in recorder.calls}, {mm})
        self.assertEqual(recorder.calls[0][1], 0)
        position = 0
        for _, start, length in recorder.calls:
            self.assertEqual(start, position)
            self.assertLessEqual(length, CHUNK)
            position += length
        self.assertEqual(position, first_end + 2 * AHEAD)
        # Puts within the first AHEAD bytes ask for nothing more.
        recorder.calls.clear()
        body = b"y" * (64 * 1024)
        while log.max_offset + len(body) + 256 < AHEAD:
            log.put(Message("T", body))
        _drain(log._prefault)  # type: ignore[arg-type]
        self.assertEqual(recorder.calls, [])
        # Past it, the window moves on from where it was.
        while log.max_offset <= first_end + AHEAD:
            log.put(Message("T", body))
        _drain(log._prefault)  # type: ignore[arg-type]
        self.assertEqual(recorder.calls[0][1], first_end + 2 * AHEAD)
        last = recorder.calls[-1]
        self.assertEqual(last[1] + last[2], log.max_offset + 2 * AHEAD)

    def test_bounded_by_the_segment(self) -> None:
        """
        In a segment smaller than the window, nothing past its end is
        asked for, and once all of it is, no put asks again.
        """
        size = 1 << 20
        log, recorder = self.log(size)
        log.put(Message("T", b"x" * 1000))
        log.put(Message("T", b"x" * 1000))
        _drain(log._prefault)  # type: ignore[arg-type]
        self.assertEqual(sum(c[2] for c in recorder.calls), size)
        recorder.calls.clear()
        log.put(Message("T", b"x" * 1000))
        _drain(log._prefault)  # type: ignore[arg-type]
        self.assertEqual(recorder.calls, [])

    def test_roll_moves_to_the_new_segment(self) -> None:
        """
        A roll releases the old mapping before unmapping it (the old
        segment ends unmapped) and the next put asks for the new
        segment's pages from the page it ended in.
        """
        size = 256 * 1024
        log, recorder = self.log(size)
        body = b"z" * (60 * 1024)
        log.put(Message("T", body))
        first = log._segments[-1]
        while len(log._segments) == 1:
            log.put(Message("T", body))
        self.assertIsNone(first._mm)
        recorder.calls.clear()
        _drain(log._prefault)  # type: ignore[arg-type]
        new = log._segments[-1].mm
        self.assertEqual({c[0] for c in recorder.calls}, {new})
        end = log.max_offset - log._segments[-1].start
        self.assertEqual(recorder.calls[0][1], end - end % mmap.PAGESIZE)
        self.assertEqual(sum(c[2] for c in recorder.calls), size - recorder.calls[0][1])

    def test_a_kernel_without_populate(self) -> None:
        """
        A C{populate} that cannot (returns 0) turns the pre-faulting off:
        no put asks again, and puts go on as before.
        """
        log = CommitLog.open(self.mktemp(), segment_size=16 * AHEAD)
        self.addCleanup(log.close)
        calls: list[int] = []

        def cannot(mm: mmap.mmap, position: int, length: int) -> int:
            calls.append(position)
            return 0

        log._prefault = prefault = _by_hand(cannot)
        log.put(Message("T", b"x" * 1000))
        _drain(prefault)
        self.assertFalse(prefault.working)
        while log.max_offset <= 2 * AHEAD:
            log.put(Message("T", b"y" * (64 * 1024)))
        _drain(prefault)
        self.assertEqual(calls, [0])

    def test_close_stops_the_worker(self) -> None:
        """
        A commit log's worker thread (started by its first put) has ended
        when C{close} returns... or is about to: it is told to stop and
        holds no mapping.
        """
        if _record._accel is None:
            raise SkipTest("pre-faulting needs the compiled accelerator")
        threads: list[Any] = []
        log = CommitLog.open(self.mktemp(), segment_size=1 << 20)
        prefault = log._prefault
        assert prefault is not None
        start = prefault._start
        prefault._start = lambda run: threads.append(start(run))
        log.put(Message("T", b"x" * 1000))
        self.assertEqual(len(threads), 1)
        log.close()
        threads[0].join(10)
        self.assertFalse(threads[0].is_alive())
        self.assertIsNone(prefault._mm)

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


class PopulateTests(SynchronousTestCase):
    """
    The accelerator's C{populate}: pages faulted in, writable, no byte
    written.
    """

    def setUp(self) -> None:
        if _record._accel is None:
            raise SkipTest("the compiled accelerator is not built")
        self.populate = _record._accel.populate
        path = self.mktemp()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.addCleanup(os.close, fd)
        self.size = 4 << 20
        os.posix_fallocate(fd, 0, self.size)
        self.mm = mmap.mmap(fd, self.size)
        self.addCleanup(self.mm.close)

    def test_writes_nothing(self) -> None:
        """
        Populating over written bytes and zeros leaves every byte as it
        was.
        """
        self.mm[100:105] = b"hello"
        got = self.populate(self.mm, 0, 1 << 20)
        if got == 0:
            raise SkipTest("this kernel has no MADV_POPULATE_WRITE")
        self.assertEqual(got, 1 << 20)
        self.assertEqual(self.mm[100:105], b"hello")
        self.assertEqual(self.mm[:100], bytes(100))
        self.assertEqual(self.mm[105 : 1 << 20], bytes((1 << 20) - 105))

    def test_then_writes_do_not_fault(self) -> None:
        """
        Writing into populated pages takes no page fault on the writing
        thread; writing into pages never touched does.
        """
        half = self.size // 2
        if self.populate(self.mm, 0, half) == 0:
            raise SkipTest("this kernel has no MADV_POPULATE_WRITE")

        def faults_writing(start: int, end: int) -> int:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            for position in range(start, end, mmap.PAGESIZE):
                self.mm[position] = 1
            return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

        self.assertEqual(faults_writing(0, half), 0)
        self.assertGreater(faults_writing(half, self.size), 0)

    def test_outside_the_mapping(self) -> None:
        """
        A range past the mapping's end is refused with a clear error,
        nothing done.
        """
        with self.assertRaises(ValueError) as caught:
            self.populate(self.mm, self.size - 4096, 8192)
        self.assertIn("outside the mapping", str(caught.exception))
        with self.assertRaises(TypeError):
            self.populate(self.mm, -1, 10)
