# -*- test-case-name: tests.test_storeservice -*-
"""
The commit log as a Twisted service: opened when the service starts,
flushed periodically off the reactor thread (RocketMQ's
C{FlushRealTimeService}), flushed and closed cleanly when it stops.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Callable

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorThreads, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rmqha.store.interfaces import IAppendedTo
from rmqha.store import _guard
from rmqha.store import _record as _codec
from rmqha.store._prefault import PrefaultFigures
from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import CommitLog
from rmqha.store.consumequeue import DEFAULT_DISPATCH_STEP

__all__ = ["CommitLogService", "StoreStatus", "DEFAULT_FLUSH_INTERVAL"]

#: RocketMQ's C{flushIntervalCommitLog}: 500 ms.
DEFAULT_FLUSH_INTERVAL = 0.5
#: RocketMQ's C{flushCommitLogLeastPages}: 4 pages of 4 KiB.
DEFAULT_FLUSH_LEAST_BYTES = 4 * 4096
#: RocketMQ's C{flushCommitLogThoroughInterval}: 10 s.
DEFAULT_FLUSH_THOROUGH_INTERVAL = 10.0
#: How often the segment files the log holds are looked at (an C{fstat}
#: each; L{CommitLog.check}): a file truncated, removed or replaced under
#: the broker is found at most this long after, if nothing else found it.
DEFAULT_CHECK_INTERVAL = 0.5
#: How long after an append its records are dispatched to the consume
#: queues: RocketMQ's reput thread polls every 1 ms.  Steps that follow a
#: step (a catch-up) run at the next reactor turn.
DISPATCH_DELAY = 0.001
#: The same while no consumer waits for new messages (no pull held, or
#: no remoting port at all): dispatch runs on the put thread, and a step
#: costs about 6 µs plus 2 µs for each queue it touches whatever the
#: records in it, which a step per millisecond paid on nearly every SYNC
#: put.  A pull that parks makes it L{DISPATCH_DELAY} again
#: (L{CommitLogService.reader_parked}).
DISPATCH_IDLE_DELAY = 0.01
#: After a dispatch step met bytes that are not a record (damage, or a
#: log changed under its queues), how long until it tries again: the
#: bytes may be repaired meanwhile (a scrub's repair from a replica, a
#: cut back), and the queues' readers are waiting.
DISPATCH_RETRY = 10.0
#: RocketMQ's C{flushIntervalConsumeQueue}: 1 s.
DEFAULT_CONSUME_QUEUE_FLUSH_INTERVAL = 1.0


@dataclass(frozen=True)
class StoreStatus:
    """
    The commit log's offsets as they stand, read-only
    (L{CommitLogService.status}; the admin interface shows them).

    @ivar min_offset: the oldest offset held.
    @ivar max_offset: one past the last byte.
    @ivar flushed_offset: known to be on disk up to here.
    @ivar prefault: what the pre-faulting ahead of the puts has done, or
        C{None} where there is none (docs/store.md).
    """

    min_offset: int
    max_offset: int
    flushed_offset: int
    prefault: PrefaultFigures | None = None


@implementer(IAppendedTo)
class CommitLogService(Service):
    """
    Owns one L{CommitLog}.

    With C{ASYNC_FLUSH} a L{LoopingCall} on the injected reactor asks the
    log every C{flush_interval} seconds for a flush plan (at least
    C{flush_least_bytes} dirty, or anything dirty once
    C{flush_thorough_interval} has passed since the last flush) and runs
    its C{fdatasync}s on a thread, so puts continue meanwhile; one flush at
    a time.  With C{SYNC_FLUSH} the service does group commit: callers wait
    on L{when_flushed}, and one flush serves every put made before it
    started (puts arriving during a flush ride the next one).  Either
    way, every C{check_interval} it has the log look at the segment files
    it holds (L{CommitLog.check}: truncated, removed, replaced?).

    @ivar commitlog: the open log while the service runs, else C{None}.
    """

    _log = Logger()

    def __init__(
        self,
        open_commitlog: Callable[[], CommitLog],
        reactor: IReactorTime,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        flush_least_bytes: int = DEFAULT_FLUSH_LEAST_BYTES,
        flush_thorough_interval: float = DEFAULT_FLUSH_THOROUGH_INTERVAL,
        run_in_thread: Callable[[Callable[[], None]], Deferred[None]] | None = None,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        dispatch_step: int = DEFAULT_DISPATCH_STEP,
        consume_queue_flush_interval: float = DEFAULT_CONSUME_QUEUE_FLUSH_INTERVAL,
        sync_in_thread: Callable[[Callable[[], None]], Deferred[None]] | None = None,
    ) -> None:
        """
        @param open_commitlog: opens the log; called by C{startService}.
        @param check_interval: seconds between two looks at the segment
            files the log holds (L{CommitLog.check}): a file changed under
            the broker is found that long after at most.
        @param run_in_thread: runs a flush and returns a Deferred; defaults
            to the reactor's thread pool (tests pass a synchronous one).
        @param dispatch_step: commit-log bytes one consume-queue dispatch
            step reads at most (one step per reactor turn).
        @param consume_queue_flush_interval: seconds between two syncs of
            the consume queues and the checkpoint.
        @param sync_in_thread: runs a consume-queue sync and returns a
            Deferred; defaults to the reactor's thread pool, or running it
            at once on a reactor without threads (a test's clock).
        """
        if flush_interval <= 0:
            raise ValueError(f"flush interval {flush_interval!r} must be positive")
        self._open_commitlog = open_commitlog
        self._reactor = reactor
        self._flush_interval = flush_interval
        self._flush_least_bytes = flush_least_bytes
        self._flush_thorough_interval = flush_thorough_interval
        if run_in_thread is None:
            run_in_thread = self._default_run_in_thread
        self._run_in_thread = run_in_thread
        self._loop: LoopingCall | None = None
        self._check_interval = check_interval
        self._check_loop: LoopingCall | None = None
        self._flushing = False
        self._waiters: list[Deferred[None]] = []
        #: Called after every flush that advanced the flushed offset.
        self.flush_observers: list[Callable[[], None]] = []
        # (offset, sequence, Deferred) waiting for the flushed offset.
        self._flush_waiters: list[tuple[int, int, Deferred[None]]] = []
        self._flush_sequence = 0
        self._last_flush = 0.0
        self.commitlog: CommitLog | None = None
        # Whether exclusive work (a cut back) is using the log now.
        self._exclusive = False
        # Consume-queue dispatch: one bounded step per reactor turn.
        self._dispatch_step = dispatch_step
        self._dispatch_call: IDelayedCall | None = None
        #: How far dispatch may go: a failover SYNC master's acknowledged
        #: offset (L{rmqha.ha.group.HAService.visible_end}), or C{None}
        #: (the log's last whole record).  Call L{dispatch_soon} when it
        #: moves.
        self.dispatch_limit: Callable[[], int | None] | None = None
        # Readers waiting for new messages now (pulls held on the remoting
        # port, L{reader_parked}): dispatch in L{DISPATCH_DELAY} while any
        # does, else in L{DISPATCH_IDLE_DELAY}.
        self._readers = 0
        self._dispatch_failed = False
        self._stop_observing: Callable[[], None] | None = None
        self._cq_interval = consume_queue_flush_interval
        self._cq_loop: LoopingCall | None = None
        self._cq_syncing = False
        if sync_in_thread is None:
            if IReactorThreads.providedBy(reactor):
                sync_in_thread = self._default_run_in_thread
            else:
                sync_in_thread = _run_now
        self._sync_in_thread = sync_in_thread

    @property
    def max_offset(self) -> int:
        """
        The open log's max offset, 0 while it is not open (L{IAppendedTo}:
        what a master's parts, built before the log is opened, read).
        """
        commitlog = self.commitlog
        return commitlog.max_offset if commitlog is not None else 0

    def in_thread(self, work: Callable[[], None]) -> Deferred[None]:
        """
        Run C{work} -- disk work on the log -- where flushes run (the
        reactor's thread pool, or what the service was given).
        """
        return self._run_in_thread(work)

    def _default_run_in_thread(self, f: Callable[[], None]) -> Deferred[None]:
        reactor: Any = self._reactor
        assert IReactorThreads.providedBy(reactor), "needs a reactor with threads"
        return deferToThreadPool(reactor, reactor.getThreadPool(), f)

    def startService(self) -> None:
        self._opened(self._open_commitlog())
        Service.startService(self)

    def _opened(self, commitlog: CommitLog) -> None:
        """
        C{commitlog} is open: log it, start the flush and check loops.
        """
        self.commitlog = commitlog
        if commitlog.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            commitlog.sync_flush_inline = False
        self._log.info(
            "commit log {dir}: {segments} segments, offsets {min}..{max}, "
            "last shutdown {shutdown}, {flush}, {codec} codec, {guard}",
            dir=commitlog.commitlog_dir,
            segments=len(commitlog.segments),
            min=commitlog.min_offset,
            max=commitlog.max_offset,
            shutdown="clean" if commitlog.recovery.clean_shutdown else "NOT clean",
            flush=commitlog.flush_disk_type.value,
            # (An operator can tell a build without the accelerator.)
            codec="compiled" if _codec._accel is not None else "pure-Python",
            # (Without the compiled module, a segment file cut under the
            # broker can still kill it: docs/store.md.)
            guard=(
                "mappings guarded against SIGBUS"
                if _guard.AVAILABLE
                else "mappings NOT guarded against SIGBUS (no compiled module)"
            ),
        )
        self._last_flush = self._reactor.seconds()
        if self.commitlog.flush_disk_type is FlushDiskType.ASYNC_FLUSH:
            self._loop = LoopingCall(self.flush_now)
            self._loop.clock = self._reactor
            self._loop.start(self._flush_interval, now=False).addErrback(
                lambda f: self._log.failure("flush loop stopped", f)
            )
        if not commitlog.read_only:
            # A segment file truncated, removed or replaced under the
            # broker (docs/store.md): puts do not look, this does.
            self._check_loop = LoopingCall(self._check)
            self._check_loop.clock = self._reactor
            self._check_loop.start(self._check_interval, now=False).addErrback(
                lambda f: self._log.failure("segment file checks stopped", f)
            )
        if commitlog.consume_queues is not None:
            # Consume queues follow the appends (puts and a slave's
            # append_at alike), a bounded step per reactor turn.
            self._dispatch_failed = False
            self._stop_observing = commitlog.observe_appends(self._appended)
            self._cq_loop = LoopingCall(self.sync_consume_queues)
            self._cq_loop.clock = self._reactor
            self._cq_loop.start(self._cq_interval, now=False).addErrback(
                lambda f: self._log.failure("consume-queue syncs stopped", f)
            )
            self._appended(commitlog.max_offset)

    def _appended(self, end: int) -> None:
        """
        The log grew: dispatch in L{DISPATCH_DELAY} while a reader waits,
        else in L{DISPATCH_IDLE_DELAY} (once, however many appends come
        meanwhile: one step serves them all).
        """
        if self._dispatch_call is None:
            self._dispatch_call = self._reactor.callLater(self._dispatch_delay(), self._dispatch)

    def _dispatch_delay(self) -> float:
        return DISPATCH_DELAY if self._readers else DISPATCH_IDLE_DELAY

    def reader_parked(self) -> None:
        """
        A reader waits for new messages now (a pull parked): until it
        leaves (L{reader_left}), appends are dispatched within
        L{DISPATCH_DELAY}, and records not yet dispatched go within it
        too, not L{DISPATCH_IDLE_DELAY}.  (Not a retry after a failed
        step: that keeps its pace.)
        """
        self._readers += 1
        call = self._dispatch_call
        if (
            call is not None
            and call.active()
            and not self._dispatch_failed
            and call.getTime() > self._reactor.seconds() + DISPATCH_DELAY
        ):
            call.reset(DISPATCH_DELAY)

    def reader_left(self) -> None:
        """A reader L{reader_parked} stopped waiting (answered, or gone)."""
        if self._readers > 0:
            self._readers -= 1

    def dispatch_soon(self) -> None:
        """
        L{dispatch_limit} moved: dispatch as after an append.
        """
        if self.commitlog is not None and self._stop_observing is not None:
            self._appended(self.commitlog.max_offset)

    def _dispatch(self) -> None:
        """
        One consume-queue dispatch step; another at the next turn while
        records are left.
        """
        self._dispatch_call = None
        commitlog = self.commitlog
        if commitlog is None:
            return
        try:
            limit = self.dispatch_limit
            more = commitlog.dispatch(self._dispatch_step, None if limit is None else limit())
        except Exception:
            if not self._dispatch_failed and commitlog.damage is None:
                # (Said once; a damaged log said why itself.)
                self._log.failure(
                    "consume-queue dispatch stopped; trying again every {retry:g} s", retry=DISPATCH_RETRY
                )
            self._dispatch_failed = True
            self._dispatch_call = self._reactor.callLater(DISPATCH_RETRY, self._dispatch)
            return
        if self._dispatch_failed and commitlog.damage is None:
            self._dispatch_failed = False
            queues = commitlog.consume_queues
            self._log.info(
                "consume-queue dispatch resumed (dispatched up to {offset})",
                offset=queues.dispatched if queues is not None else None,
            )
        if more:
            self._dispatch_call = self._reactor.callLater(0, self._dispatch)

    def sync_consume_queues(self) -> Deferred[None]:
        """
        Sync the consume queues written since the last sync and the
        checkpoint, on a thread (RocketMQ's C{FlushConsumeQueueService},
        every C{flushIntervalConsumeQueue}).
        """
        commitlog = self.commitlog
        queues = commitlog.consume_queues if commitlog is not None else None
        if queues is None or commitlog is None or self._cq_syncing:
            return succeed(None)
        plan = queues.sync_plan(commitlog.flushed_offset)
        if plan is None:
            return succeed(None)
        self._cq_syncing = True

        def over(result: object) -> None:
            self._cq_syncing = False
            if isinstance(result, Failure):
                self._log.failure("syncing the consume queues failed", result)

        return self._sync_in_thread(plan).addBoth(over)

    def _stop_dispatch(self) -> None:
        if self._stop_observing is not None:
            self._stop_observing()
            self._stop_observing = None
        if self._dispatch_call is not None and self._dispatch_call.active():
            self._dispatch_call.cancel()
        self._dispatch_call = None
        if self._cq_loop is not None and self._cq_loop.running:
            self._cq_loop.stop()
        self._cq_loop = None

    def reopen(self, between: Callable[[], object]) -> Deferred[None]:
        """
        Close the log, run C{between} (a re-bootstrap moves the store
        aside), and open the log again: the closing flush, C{between} and
        the opening (recovery included) run in a thread, as flushes do, so
        the reactor goes on meanwhile (a coordinator's lease renewals among
        it).  The service keeps running; L{commitlog} is C{None} until the
        new log is open.  Flushes asked for meanwhile run after.

        @return: fires once the new log is open, or fails as closing,
            C{between} or opening failed (the service then has no log).
        """
        for loop in (self._loop, self._check_loop):
            if loop is not None and loop.running:
                loop.stop()
        self._loop = self._check_loop = None
        self._stop_dispatch()
        opened: list[CommitLog] = []

        def work() -> None:
            if old is not None:
                old.close()  # flushes what is left
            between()
            opened.append(self._open_commitlog())

        # (From now on nothing here reads the old log; the waits for its
        # flushes end when its close has flushed it.)
        old, self.commitlog = self.commitlog, None
        waiters = [w[2] for w in sorted(self._flush_waiters, key=lambda w: w[:2])]
        self._flush_waiters = []

        def finish(_: object) -> None:
            for waiter in waiters:
                waiter.callback(None)
            self._opened(opened[0])

        def failed(failure: Failure) -> Failure:
            for waiter in waiters:
                if not waiter.called:
                    waiter.errback(failure)
            return failure

        return self.exclusive(work, finish).addErrback(failed)

    def flush_now(self, thorough: bool = False) -> Deferred[None]:
        """
        Start a flush unless one is running.

        @param thorough: flush however little is dirty.
        @return: fires when this (or the running) flush is over; a failed
            flush is logged, not raised, and the next tick tries again.
        """
        commitlog = self.commitlog
        if commitlog is None or commitlog.closed:
            return succeed(None)
        if self._flushing:
            waiter: Deferred[None] = Deferred()
            self._waiters.append(waiter)
            return waiter
        now = self._reactor.seconds()
        if now - self._last_flush >= self._flush_thorough_interval:
            thorough = True
        plan = commitlog.flush_plan(0 if thorough else self._flush_least_bytes)
        if plan is None:
            return succeed(None)
        self._last_flush = now
        self._flushing = True

        def failed(failure: Failure) -> None:
            commitlog.flush_abandoned(plan)
            self._log.failure(
                "flushing the commit log up to offset {target} failed",
                failure,
                target=plan.target,
            )

        def finished(_: None) -> None:
            self._flushing = False
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.callback(None)
            if self._flush_waiters and commitlog.damage is None:
                # Puts that came during this flush: the next one is theirs.
                # (Not on a damaged log: no flush counts there, and the
                # waiters end with their timeout, FLUSH_DISK_TIMEOUT.)
                self.flush_now(thorough=True)

        def done(_: None) -> None:
            commitlog.flush_done(plan)
            self._release_flush_waiters()
            for observer in list(self.flush_observers):
                observer()

        d = self._run_in_thread(plan.execute)
        d.addCallbacks(done, failed)
        d.addCallback(finished)
        return d

    def exclusive(
        self, work: Callable[[], Any], finish: Callable[[Any], Any] | None = None
    ) -> Deferred[Any]:
        """
        Run C{work} -- disk work on the open log, such as a cut back with
        its quarantine copy -- in a thread, as flushes run, so the reactor
        goes on meanwhile (a coordinator's lease renewals among it): after
        the running flush, with no flush and no file check starting until
        it is over, so that it is the only thread touching the log.
        Flushes asked for meanwhile run after it.

        @param finish: called on the reactor with what C{work} returned,
            while the log is still held (what must not run in a thread:
            L{CommitLog.cut_quarantined}); its result is the result.
        @return: fires with what C{work} (or C{finish}) returned, or fails
            as it failed.
        """
        ready: Deferred[None]
        if self._flushing:
            ready = Deferred()
            self._waiters.append(ready)
        else:
            ready = succeed(None)

        def start(_: object) -> Deferred[Any]:
            # (Nothing flushes or checks until it is over: flush_now queues.)
            self._flushing = self._exclusive = True
            return self._run_in_thread(work)

        def over(outcome: object) -> object:
            self._flushing = self._exclusive = False
            waiters, self._waiters = self._waiters, []
            if waiters or self._flush_waiters:
                # What asked for a flush meanwhile gets one now (and is
                # answered even when there is nothing to flush).
                def answer(_: object) -> None:
                    for waiter in waiters:
                        waiter.callback(None)

                self.flush_now(thorough=True).addBoth(answer)
            return outcome

        d = ready.addCallback(start)
        if finish is not None:
            d.addCallback(finish)
        return d.addBoth(over)

    def _check(self) -> object:
        """
        The periodic look at the segment files, unless exclusive work is
        using the log.
        """
        commitlog = self.commitlog
        if commitlog is None or self._exclusive:
            return None
        return commitlog.check()

    def status(self) -> StoreStatus:
        """
        The open log's offsets now.

        @raise RuntimeError: the log is not open.
        """
        commitlog = self.commitlog
        if commitlog is None:
            raise RuntimeError("the broker is not running")
        return StoreStatus(
            commitlog.min_offset,
            commitlog.max_offset,
            commitlog.flushed_offset,
            commitlog.prefault_figures(),
        )

    def when_flushed(self, offset: int) -> Deferred[None]:
        """
        Fires once everything before C{offset} is on disk, starting a flush
        if none is running (group commit).  Cancelling withdraws the wait.
        """
        commitlog = self.commitlog
        if commitlog is None or commitlog.flushed_offset >= offset:
            return succeed(None)

        def cancel(d: Deferred[None]) -> None:
            self._flush_waiters = [w for w in self._flush_waiters if w[2] is not d]
            heapq.heapify(self._flush_waiters)

        d: Deferred[None] = Deferred(cancel)
        self._flush_sequence += 1
        heapq.heappush(self._flush_waiters, (offset, self._flush_sequence, d))
        if not self._flushing:
            self.flush_now(thorough=True)
        return d

    def _release_flush_waiters(self) -> None:
        commitlog = self.commitlog
        if commitlog is None:
            return
        flushed = commitlog.flushed_offset
        waiters = self._flush_waiters
        while waiters and waiters[0][0] <= flushed:
            heapq.heappop(waiters)[2].callback(None)

    def stopService(self) -> Deferred[None]:
        """
        Stop the flush loop, wait for a running flush, then flush
        what is left and close the log (which removes the C{abort} marker).
        """
        Service.stopService(self)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._check_loop is not None and self._check_loop.running:
            self._check_loop.stop()
        self._check_loop = None
        self._stop_dispatch()
        if self._flushing:
            waiting: Deferred[None] = Deferred()
            self._waiters.append(waiting)
        else:
            waiting = succeed(None)

        def close(_: object) -> None:
            commitlog, self.commitlog = self.commitlog, None
            if commitlog is not None:
                commitlog.close()  # flushes what is left
            waiters, self._flush_waiters = self._flush_waiters, []
            for _offset, _sequence, waiter in sorted(waiters, key=lambda w: w[:2]):
                waiter.callback(None)

        return waiting.addCallback(close)


def _run_now(work: Callable[[], None]) -> Deferred[None]:
    """
    Run C{work} at once (no threads to run it in).
    """
    try:
        work()
    except BaseException:
        return fail()
    return succeed(None)
