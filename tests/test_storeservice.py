"""
Tests for L{rmqha.store.service}: the commit log's lifecycle and flush
policy as a Twisted service, driven by a fake clock.
"""

from __future__ import annotations

import os
from typing import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rmqha.store._record import Message
from rmqha.store.commitlog import CommitLog, FlushDiskType
from rmqha.store.service import CommitLogService


class _Threads:
    """
    Stands in for the reactor's thread pool: flushes run when the test
    says so, so "a flush is in progress" can be observed.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[[], None], Deferred[None]]] = []

    def __call__(self, f: Callable[[], None]) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self.pending.append((f, d))
        return d

    def run_all(self) -> None:
        pending, self.pending = self.pending, []
        for f, d in pending:
            try:
                result = f()
            except Exception:
                d.errback(Failure())
            else:
                d.callback(result)


def _message(n: int = 0, size: int = 100) -> Message:
    return Message("TopicTest", bytes([n % 256]) * size)


def _fill_to(commitlog: CommitLog, offset: int) -> None:
    while commitlog.max_offset < offset:
        commitlog.put(_message())


class CommitLogServiceTests(SynchronousTestCase):
    """
    L{CommitLogService} opens, flushes and closes its commit log.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        self.threads = _Threads()
        self.store = self.mktemp()

    def _service(
        self, flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    ) -> CommitLogService:
        service = CommitLogService(
            lambda: CommitLog.open(
                self.store,
                segment_size=64 * 1024,
                clock=self.clock.seconds,
                flush_disk_type=flush_disk_type,
            ),
            self.clock,
            flush_interval=0.5,
            flush_least_bytes=4096,
            flush_thorough_interval=10.0,
            run_in_thread=self.threads,
        )
        self.addCleanup(self._stop, service)
        return service

    def _started(
        self, flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    ) -> tuple[CommitLogService, CommitLog]:
        service = self._service(flush_disk_type)
        service.startService()
        assert service.commitlog is not None
        return service, service.commitlog

    def _stop(self, service: CommitLogService) -> None:
        if service.running:
            d = service.stopService()
            self.threads.run_all()
            self.successResultOf(d)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_exclusive_work_runs_alone_in_a_thread(self) -> None:
        """
        Exclusive disk work (a cut back) waits for the running flush, runs
        in the thread pool -- the reactor goes on -- with no flush and no
        file check starting meanwhile; a flush asked for meanwhile runs
        after it, and its waiter fires then; the work's result (or error)
        is the Deferred's.
        """
        service, commitlog = self._started()
        _fill_to(commitlog, 8192)
        self.clock.advance(0.5)  # (the periodic flush starts)
        ran: list[str] = []
        done = service.exclusive(lambda: ran.append("cut") or "quarantine/x.bin")
        self.assertEqual(len(self.threads.pending), 1)  # (the flush only)
        self.threads.run_all()  # the flush ends; the work starts
        self.assertEqual((ran, len(self.threads.pending)), ([], 1))
        _fill_to(commitlog, 16384)
        flushed = service.flush_now(thorough=True)
        checks: list[int] = []
        self.patch(commitlog, "check", lambda: checks.append(1))
        self.clock.advance(5)  # (timers run: the reactor is free)
        self.assertEqual((len(self.threads.pending), checks), (1, []))
        self.assertNoResult(flushed)
        self.threads.run_all()
        self.assertEqual(ran, ["cut"])
        self.assertEqual(self.successResultOf(done), "quarantine/x.bin")
        self.assertEqual(len(self.threads.pending), 1)  # the flush asked meanwhile
        self.threads.run_all()
        self.successResultOf(flushed)
        self.clock.advance(1)
        self.assertTrue(checks)

        def fails() -> None:
            raise OSError(28, "No space left on device")

        failed = service.exclusive(fails)
        self.threads.run_all()
        self.failureResultOf(failed, OSError)
        self.clock.advance(1)
        self.threads.run_all()

    def test_exclusive_answers_waiters_with_nothing_to_flush(self) -> None:
        """
        Whoever waited for the log while exclusive work ran (a stop, a
        flush asked for) is answered when it ends, even when there is then
        nothing to flush (a waiter left unanswered hung a broker's stop).
        """
        service, commitlog = self._started()
        done = service.exclusive(lambda: None)
        waiter = service.flush_now(thorough=True)
        self.assertNoResult(waiter)
        self.threads.run_all()
        self.successResultOf(done)
        self.threads.run_all()
        self.successResultOf(waiter)

    def test_reopen_runs_in_a_thread(self) -> None:
        """
        A re-bootstrap's reopen closes the log, runs what goes between
        (the move aside) and opens the log again, all in the thread pool:
        the reactor's timers run meanwhile, no flush or file check starts,
        the service keeps running without a log, and a put's wait for a
        flush ends once the closing flush is done.
        """
        service, commitlog = self._started(FlushDiskType.SYNC_FLUSH)
        _fill_to(commitlog, 4096)
        waiting = service.when_flushed(commitlog.max_offset)
        self.threads.run_all()  # (the flush it started)
        _fill_to(commitlog, 8192)
        waiting = service.when_flushed(commitlog.max_offset)
        aside = self.store + ".aside"
        done = service.reopen(lambda: os.rename(self.store, aside))
        self.assertIsNone(service.commitlog)
        self.assertTrue(service.running)
        self.assertNoResult(waiting)
        self.threads.run_all()  # (the running flush ends; the reopen starts)
        self.clock.advance(5)
        self.assertTrue(os.path.isdir(self.store))  # (not moved yet)
        self.threads.run_all()
        self.successResultOf(done)
        self.successResultOf(waiting)
        self.assertTrue(commitlog.closed)
        self.assertTrue(os.path.isdir(aside))
        assert service.commitlog is not None
        self.assertEqual(service.commitlog.max_offset, 0)
        # (The new log is served: its flushes run.)
        _fill_to(service.commitlog, 4096)
        flushed = service.when_flushed(service.commitlog.max_offset)
        self.threads.run_all()
        self.successResultOf(flushed)

    def test_reopen_failure(self) -> None:
        """
        A reopen whose move fails fails with its error; the service then
        has no log, and the waits for the old log's flushes fail too.
        """
        service, commitlog = self._started(FlushDiskType.SYNC_FLUSH)
        _fill_to(commitlog, 4096)
        waiting = service.when_flushed(commitlog.max_offset)
        self.threads.run_all()
        _fill_to(commitlog, 8192)
        waiting = service.when_flushed(commitlog.max_offset)

        def fails() -> None:
            raise OSError(28, "No space left on device")

        done = service.reopen(fails)
        self.threads.run_all()
        self.threads.run_all()
        self.failureResultOf(done, OSError)
        self.failureResultOf(waiting, OSError)
        self.assertIsNone(service.commitlog)

    def test_start_opens_and_stop_closes(self) -> None:
        """
        The log is opened by C{startService} (so a daemonised twistd takes
        the store lock in the process that runs) and closed by
        C{stopService}, which removes the C{abort} marker.
        """
        service = self._service()
        self.assertIsNone(service.commitlog)
        service.startService()
        self.assertIsNotNone(service.commitlog)
        self.assertTrue(os.path.exists(os.path.join(self.store, "abort")))
        self.successResultOf(service.stopService())
        self.assertIsNone(service.commitlog)
        self.assertFalse(os.path.exists(os.path.join(self.store, "abort")))

    def test_start_logs_the_store_and_the_codec(self) -> None:
        """
        Opening logs the store's directory, extent, last shutdown, flush
        type and which codec encodes and checks its records: the compiled
        one where it is in use, else the pure-Python one (so an operator
        can tell a build without the accelerator from its log); and
        whether the segment mappings are guarded against SIGBUS (they are
        with the compiled module, whichever codec: docs/store.md).
        """
        from twisted.logger import capturedLogs, formatEvent

        from rmqha.store import _guard, _record

        lines = []
        for accel, guarded in ((None, False), (None, True), (_record._accel, True)):
            self.patch(_record, "_accel", accel)
            self.patch(_guard, "AVAILABLE", guarded)
            service = self._service()
            with capturedLogs() as events:
                service.startService()
            lines.append(formatEvent(events[0]))
            self._stop(service)
        unguarded, pure, default = lines
        self.assertEqual(
            unguarded,
            f"commit log {os.path.abspath(os.path.join(self.store, 'commitlog'))}: 0 segments, offsets 0..0, "
            "last shutdown clean, ASYNC_FLUSH, pure-Python codec, mappings NOT guarded "
            "against SIGBUS (no compiled module)",
        )
        self.assertTrue(
            pure.endswith(", pure-Python codec, mappings guarded against SIGBUS"), pure
        )
        if _record.ACCELERATED:
            self.assertTrue(
                default.endswith(", compiled codec, mappings guarded against SIGBUS"), default
            )

    def test_periodic_flush_needs_least_bytes(self) -> None:
        """
        Each tick flushes only when at least C{flush_least_bytes} are dirty
        (RocketMQ's C{flushCommitLogLeastPages}), on the thread runner.
        """
        service, commitlog = self._started()
        commitlog.put(_message(size=100))
        self.clock.advance(0.5)
        self.assertEqual(self.threads.pending, [])
        self.assertEqual(commitlog.flushed_offset, 0)
        _fill_to(commitlog, 4096)
        self.clock.advance(0.5)
        self.assertEqual(len(self.threads.pending), 1)
        self.assertEqual(commitlog.flushed_offset, 0)
        self.threads.run_all()
        self.assertEqual(commitlog.flushed_offset, commitlog.max_offset)

    def test_thorough_flush_after_interval(self) -> None:
        """
        Once C{flush_thorough_interval} has passed since the last flush,
        even a few dirty bytes are flushed.
        """
        service, commitlog = self._started()
        commitlog.put(_message(size=10))
        self.clock.advance(9.5)
        self.assertEqual(self.threads.pending, [])
        self.clock.advance(0.5)
        self.threads.run_all()
        self.assertEqual(commitlog.flushed_offset, commitlog.max_offset)

    def test_one_flush_at_a_time(self) -> None:
        """
        While a flush runs on the thread, ticks and explicit flushes start
        no second one; they wait for the running one.  Puts go on, and the
        flushed offset is what the running flush covered.
        """
        service, commitlog = self._started()
        _fill_to(commitlog, 8192)
        first_target = commitlog.max_offset
        self.clock.advance(0.5)
        self.assertEqual(len(self.threads.pending), 1)
        _fill_to(commitlog, 16384)
        waiter = service.flush_now(thorough=True)
        self.clock.advance(0.5)
        self.assertEqual(len(self.threads.pending), 1)
        self.assertNoResult(waiter)
        self.threads.run_all()
        self.successResultOf(waiter)
        self.assertEqual(commitlog.flushed_offset, first_target)
        self.clock.advance(0.5)
        self.threads.run_all()
        self.assertEqual(commitlog.flushed_offset, commitlog.max_offset)

    def test_failed_flush_is_logged_and_retried(self) -> None:
        """
        A flush that fails (an C{fdatasync} error) does not advance the
        flushed offset; it is logged and the next tick tries again.
        """
        service, commitlog = self._started()
        _fill_to(commitlog, 8192)
        self.clock.advance(0.5)
        (f, d), = self.threads.pending
        self.threads.pending = []
        d.errback(Failure(OSError(5, "Input/output error")))
        self.assertEqual(commitlog.flushed_offset, 0)
        self.assertEqual(len(self.flushLoggedErrors(OSError)), 1)
        self.clock.advance(0.5)
        self.threads.run_all()
        self.assertEqual(commitlog.flushed_offset, commitlog.max_offset)

    def test_stop_waits_for_running_flush(self) -> None:
        """
        C{stopService} waits for a flush in progress before the final flush
        and close, so a descriptor is never closed under a running
        C{fdatasync}.
        """
        service, commitlog = self._started()
        _fill_to(commitlog, 8192)
        self.clock.advance(0.5)
        stopped = service.stopService()
        self.assertNoResult(stopped)
        self.assertFalse(commitlog.closed)
        self.threads.run_all()
        self.successResultOf(stopped)
        self.assertTrue(commitlog.closed)

    def test_flush_observers(self) -> None:
        """
        Observers are called after each flush that completed, not after a
        failed one.
        """
        service, commitlog = self._started()
        calls = []
        service.flush_observers.append(lambda: calls.append(commitlog.flushed_offset))
        _fill_to(commitlog, 8192)
        service.flush_now(thorough=True)
        self.assertEqual(calls, [])
        self.threads.run_all()
        self.assertEqual(calls, [commitlog.max_offset])
        commitlog.put(_message())
        service.flush_now(thorough=True)
        (f, d), = self.threads.pending
        self.threads.pending = []
        d.errback(Failure(OSError(5, "Input/output error")))
        self.flushLoggedErrors(OSError)
        self.assertEqual(len(calls), 1)

    def test_sync_flush_group_commit(self) -> None:
        """
        With C{SYNC_FLUSH} the service does group commit: puts do not flush
        inline; waiters on when_flushed are served by one flush for all
        puts made before it; puts during that flush ride the next one.  No
        periodic flush is scheduled (only the look at the segment files).
        """
        service, commitlog = self._started(FlushDiskType.SYNC_FLUSH)
        self.assertEqual(
            [call.func.f for call in self.clock.getDelayedCalls()], [service._check]
        )
        ends = [commitlog.put(_message(i)).next_offset for i in range(3)]
        self.assertEqual(commitlog.flushed_offset, 0)
        waiting = [service.when_flushed(end) for end in ends]
        self.assertEqual(len(self.threads.pending), 1)
        late = commitlog.put(_message(9)).next_offset
        late_waiter = service.when_flushed(late)
        self.assertEqual(len(self.threads.pending), 1)
        self.threads.run_all()
        for d in waiting:
            self.successResultOf(d)
        self.assertNoResult(late_waiter)
        self.assertEqual(len(self.threads.pending), 1)
        self.threads.run_all()
        self.successResultOf(late_waiter)
        self.assertEqual(commitlog.flushed_offset, commitlog.max_offset)
        self.successResultOf(service.when_flushed(late))

    def test_open_failure_propagates(self) -> None:
        """
        An error opening the store surfaces from C{startService} and
        leaves the service stopped with no timers.
        """
        service = CommitLogService(
            lambda: CommitLog.open(self.store, read_only=True),
            self.clock,
            run_in_thread=lambda f: succeed(f()),
        )
        self.assertRaises(Exception, service.startService)
        self.assertFalse(service.running)
        self.assertEqual(self.clock.getDelayedCalls(), [])
