# -*- test-case-name: tests.test_group,tests.test_roles,tests.test_store_faults,tests.test_admin -*-
"""
A master's put path: store a message, then wait for what its role
requires (the replicas' verdict, and the disk's with SYNC_FLUSH), and
count how every put ended.

L{PutPath} is the broker's part that L{rmqha.broker.Broker.put} hands
messages to; its figures (L{PutPath.put_statuses}, L{PutPath.puts},
L{PutPath.put_bytes}, L{PutPath.replication_wait}) are what the admin
view shows.
"""

from __future__ import annotations

import errno
from typing import Any, Callable, Sequence

from twisted.internet.defer import Deferred, FirstError, gatherResults, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.ha.fence import OPEN
from rmqha.ha.group import Histogram, PutMessageResult, PutStatus, timed_out_as
from rmqha.ha.master import EARLY_BYTES
from rmqha.ha.masterside import MasterSide
from rmqha.ha.replica import Replica
from rmqha.store._record import END_FILE_MIN_BLANK_LENGTH, Message, MessageRejected
from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import AppendResult
from rmqha.store.errors import SegmentCreateError, StoreError
from rmqha.store.service import CommitLogService

__all__ = ["NotMasterError", "NotStoredError", "PutPath", "master_refusal"]

#: OS errors meaning the disk (or the user's quota) is full.
_DISK_FULL = frozenset([errno.ENOSPC, errno.EDQUOT])


class NotStoredError(Exception):
    """
    A put that stored nothing, with the RocketMQ status saying why (a
    L{PutMessageResult} always means "stored").

    @ivar status: the L{PutStatus}.
    @ivar errno: for a store failure, the OS error number (C{ENOSPC}:
        the disk is full), else C{None}.
    """

    def __init__(self, status: PutStatus, text: str, error_number: int | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.errno = error_number

    @property
    def disk_full(self) -> bool:
        """
        Whether the store failed for want of space (C{ENOSPC}, C{EDQUOT}).
        """
        return self.errno in _DISK_FULL


class NotMasterError(NotStoredError):
    """
    Messages are put on the master only.
    """

    def __init__(self, text: str) -> None:
        super().__init__(PutStatus.SERVICE_NOT_AVAILABLE, text)


def _slave_refusal(side: object) -> str:
    """
    Why a put on a slave is refused, naming the master where the slave
    knows it (its C{--master}, or the elected master it follows).
    """
    if isinstance(side, Replica):
        return f"this node is a slave; the master is at {side.master_address} (its HA address)"
    return "messages are put on the master, this is a slave"


#: Puts made while a release runs are stored together, a batch once they
#: hold this many bytes (the early frames' size: such a batch may go to the
#: slave as a frame while the release goes on), or half a segment; a
#: batch is at most twice that.
GROUP_BYTES = EARLY_BYTES

#: What a grouped put is answered with: its result, or the error that
#: kept it from being stored.
_Answer = Callable[[Any], object]


class _Group:
    """
    Puts made on one master side while a release of waiting puts runs,
    not stored yet (L{PutPath._join}).
    """

    __slots__ = ("side", "limit", "messages", "answers", "size")

    def __init__(self, side: MasterSide, limit: int) -> None:
        self.side = side
        # (Stored once it holds this many bytes; no record above it joins.)
        self.limit = limit
        self.messages: list[Message] = []
        self.answers: list[_Answer] = []
        self.size = 0


def _settles(d: Deferred[PutMessageResult]) -> _Answer:
    """
    A grouped put's answer for the L{Deferred} L{PutPath.put} returned: a
    result fires it, an error fails it; nothing once it has fired (a
    cancelled put: the message is stored all the same).
    """

    def settle(outcome: Any) -> None:
        if d.called:
            return
        if isinstance(outcome, BaseException):
            d.errback(Failure(outcome))
        else:
            d.callback(outcome)

    return settle


def master_refusal(side: object) -> str | None:
    """
    Why C{side}, a broker's role service, takes no puts now (a slave, a
    master not yet open, a fenced failover master), or C{None}.
    """
    if not isinstance(side, MasterSide) or side.factory is None:
        return _slave_refusal(side)
    return side.fence.refusing()


class PutPath:
    """
    Puts on a master: the checks before a put is stored, the store, the
    wait for the replicas (and the disk), the count of every outcome.

    @ivar put_statuses: how many puts ended with each status.
    @ivar puts: messages stored on this broker as a master.
    @ivar put_bytes: their bytes.
    @ivar replication_wait: seconds SYNC_MASTER puts waited for replicas.
    """

    _log = Logger(namespace="rmqha.broker.Broker")

    def __init__(self, reactor: Any, store: CommitLogService, sync_flush_timeout: float) -> None:
        """
        @param store: the store puts go to.
        @param sync_flush_timeout: C{syncFlushTimeout}, seconds: with
            SYNC_FLUSH, a put not on disk by then is C{FLUSH_DISK_TIMEOUT}.
        """
        self._reactor = reactor
        self._store = store
        self._sync_flush_timeout = sync_flush_timeout
        self.put_statuses: dict[PutStatus, int] = {s: 0 for s in PutStatus}
        self.puts = 0
        self.put_bytes = 0
        self.replication_wait = Histogram()
        # Whether the last put failed in the store (logged once).
        self._store_failing = False
        # Puts made while a release runs, to be stored together (_join).
        self._group: _Group | None = None

    def put(self, side: object, message: Message) -> Deferred[PutMessageResult]:
        """
        Store C{message} on C{side}, the broker's role service (a master's
        L{MasterSide}; anything else refuses it), and replicate it.

        On an ASYNC_MASTER the result is C{PUT_OK} at once.  On a
        SYNC_MASTER: C{IN_SYNC_REPLICAS_NOT_ENOUGH} or
        C{SLAVE_NOT_AVAILABLE} at once when too few slaves are connected and
        within C{haSlaveFallbehindMax}; otherwise C{PUT_OK} when
        C{inSyncReplicas - 1} distinct slaves have acknowledged the put's
        end offset, or C{FLUSH_SLAVE_TIMEOUT} after C{slaveTimeout}.  The
        message is stored in every case.

        @raise NotMasterError: this broker is a slave (nothing is stored).
        @raise NotStoredError: the store could not take the message
            (C{CREATE_MAPEDFILE_FAILED}: no new segment, the disk is full;
            C{UNKNOWN_ERROR}: another I/O error); nothing is stored and
            the next put goes where this one would have.
        @raise MessageRejected: the message breaks a limit (nothing stored).

        A put made while a release of waiting puts runs (from a released
        put's callback) is stored with the others made there when the
        release ends (docs/sync.md, "Puts released together are stored
        together"): the same refusals are raised now, and a failure to
        store them then fails this L{Deferred} with the error a put stored
        then would have raised (L{NotStoredError}, or the store's own: a
        closed log).
        """
        if isinstance(side, MasterSide) and (side.early.gathering or self._group is not None):
            d: Deferred[PutMessageResult] = Deferred()
            if self._gathered(side, message, _settles(d)):
                return d
        master, append, flush_disk_type = self._store_one(side, message)
        if flush_disk_type is not FlushDiskType.SYNC_FLUSH:
            # (_verdict's common case inline.)
            ha = master.ha
            if not ha.sync:
                # An ASYNC_MASTER's put is PUT_OK at once, in failover mode
                # too (HAService.wait_for's answer, without its checks).
                return succeed(ha.group.finish(PutStatus.PUT_OK, append))
            return ha.wait_for(append.next_offset, append)
        return self._verdict(master, flush_disk_type, append)

    def put_then(
        self, side: object, message: Message, answer: Callable[[PutMessageResult], object]
    ) -> PutMessageResult | None:
        """
        L{put} without a L{Deferred}, for callers that chain no callbacks
        (a L{Deferred} fired for every put costs a bound reactor ~2 us, a
        coroutine awaiting it ~3 us: docs/sync.md, "Puts without a
        Deferred"): the result when it is known now -- C{answer} is then
        never called -- else C{None}, and C{answer} is called with the
        result later, once, where a callback may run.  The same checks,
        results and errors as L{put}; a wait for the disk (SYNC_FLUSH)
        that fails, as when the store is closed under it, answers
        C{FLUSH_DISK_TIMEOUT} (the message is stored, not known on disk)
        and is logged.  A put made while a release runs is stored when it
        ends, as L{put}'s is: C{None} is returned, and if those puts cannot
        be stored then C{answer} is called with the exception that L{put}
        would have raised (L{NotStoredError}, L{NotMasterError}, or the
        store's own), instead of a result.
        """
        if isinstance(side, MasterSide) and self._gathered(side, message, answer):
            return None
        master, append, flush_disk_type = self._store_one(side, message)
        ha = master.ha
        if flush_disk_type is not FlushDiskType.SYNC_FLUSH:
            now: PutMessageResult | None
            if not ha.sync:
                now = ha.group.finish(PutStatus.PUT_OK, append)
            else:
                now = ha.wait_then(append.next_offset, append, answer)
            return now
        early: list[PutMessageResult] = []

        def failed(failure: Failure) -> PutMessageResult:
            self._log.failure("a SYNC_FLUSH put's wait failed", failure)
            return self.result(PutStatus.FLUSH_DISK_TIMEOUT, append)

        def deliver(result: PutMessageResult) -> None:
            if waiting:
                answer(result)
            else:
                early.append(result)

        waiting = False
        self._verdict(master, flush_disk_type, append).addErrback(failed).addCallback(deliver)
        if early:
            return early[0]
        waiting = True
        return None

    def _store_one(
        self, side: object, message: Message
    ) -> tuple[MasterSide, AppendResult, FlushDiskType]:
        """
        A put's checks and its store (see L{put} for what each refusal
        raises): the master side that took it, its append, and the log's
        flush type.
        """
        master = self._admit(side)
        if self._group is not None:
            self._store_group()  # (first: puts are stored in the order made)
        factory = master.factory
        assert factory is not None  # (_admit refuses a side without one)
        commitlog = factory.commitlog
        try:
            append = commitlog.put(message)
        except OSError as e:
            raise self._not_stored(e) from e
        if self._store_failing:
            self._store_failing = False
            self._log.info("the commit log takes puts again")
        self.puts += 1
        self.put_bytes += append.size
        return master, append, commitlog.flush_disk_type

    def _verdict(
        self, side: MasterSide, flush_disk_type: FlushDiskType, append: AppendResult
    ) -> Deferred[PutMessageResult]:
        """
        What the put (or the batch) ending with C{append} is answered: the
        replicas' verdict, and with SYNC_FLUSH the disk's too.
        """
        end = append.next_offset
        if flush_disk_type is not FlushDiskType.SYNC_FLUSH:
            # The replicas' verdict, as the put's result (made by result,
            # with no callback of its own; MasterSide.wait_for's own call
            # skipped, once per put).
            return side.ha.wait_for(end, append)
        # Disk and replicas are waited for at the same time; the disk's
        # verdict comes first, as in RocketMQ's asyncPutMessage.
        flushed: Deferred[PutStatus] = self._store.when_flushed(end).addCallback(
            lambda _: PutStatus.PUT_OK
        )
        flushed.addTimeout(
            self._sync_flush_timeout,
            self._reactor,
            onTimeoutCancel=timed_out_as(PutStatus.FLUSH_DISK_TIMEOUT),
        )
        waits = [flushed, side.ha.wait_for(end)]
        # (A failed wait fails the put with its own error, once: not
        # wrapped in a FirstError, not logged again as unhandled.)
        return gatherResults(waits, consumeErrors=True).addCallbacks(
            lambda statuses: self.result(
                next((s for s in statuses if s is not PutStatus.PUT_OK), PutStatus.PUT_OK),
                append,
            ),
            lambda failure: failure.value.subFailure if failure.check(FirstError) else failure,
        )

    def _admit(self, side: object) -> MasterSide:
        """
        The checks before a put is stored: C{side} as the master side that
        takes it, or the refusal raised (and counted).
        """
        if not isinstance(side, MasterSide) or side.factory is None:
            self.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE] += 1
            raise NotMasterError(_slave_refusal(side))
        # (The fixed roles' fence refuses nothing; an ASYNC_MASTER's HA
        # refuses nothing: HAService.refusal.)
        fence = side.fence
        if fence is not OPEN and (refusal := fence.refusing()) is not None:
            self.put_statuses[PutStatus.SERVICE_NOT_AVAILABLE] += 1
            raise NotMasterError(refusal)
        ha = side.ha
        if ha.sync and (too_few := ha.refusal()) is not None:
            self.put_statuses[PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH] += 1
            raise NotStoredError(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, too_few)
        return side

    def put_batch(
        self, side: object, messages: Sequence[Message]
    ) -> Deferred[tuple[PutStatus, list[AppendResult]]]:
        """
        Store C{messages} on C{side} as one batch, all or nothing
        (L{CommitLog.put_batch}: consecutive records in one segment), and
        wait for the batch as L{put} waits for one message, once, for its
        end: the status is the batch's, counted once.

        @raise NotMasterError: as L{put}.
        @raise NotStoredError: as L{put}.
        @raise MessageRejected: a message breaks a limit (nothing stored).
        """
        if not messages:
            raise ValueError("a batch needs at least one message")
        side = self._admit(side)
        if self._group is not None:
            self._store_group()  # (first: puts are stored in the order made)
        appends = self._store_batch(side, messages)
        assert side.factory is not None
        waited = self._verdict(side, side.factory.commitlog.flush_disk_type, appends[-1])
        return waited.addCallback(lambda result: (result.status, appends))

    def _store_batch(self, side: MasterSide, messages: Sequence[Message]) -> list[AppendResult]:
        """
        Store C{messages} as one batch on C{side}, admitted, and count
        them.

        @raise NotStoredError: the store failed (see L{put}).
        @raise MessageRejected: a message breaks a limit (nothing stored).
        """
        assert side.factory is not None  # (_admit refuses a side without one)
        try:
            appends = side.factory.commitlog.put_batch(messages)
        except OSError as e:
            raise self._not_stored(e) from e
        if self._store_failing:
            self._store_failing = False
            self._log.info("the commit log takes puts again")
        self.puts += len(appends)
        self.put_bytes += sum(a.size for a in appends)
        return appends

    # -- puts made while a release runs --------------------------------------

    def _gathered(self, side: MasterSide, message: Message, answer: _Answer) -> bool:
        """
        Whether this put made on C{side} is held with the others made in
        its release (L{_join}): while the release has more puts to fire
        after the one whose callback runs; from the last one's callback,
        joined to the held puts and stored with them at once (sent at
        once, as the last put's first append is: nothing later in the
        release to travel with).
        """
        early = side.early
        if early.gathering:
            return self._join(side, message, answer)
        if self._group is None or not early.releasing:
            return False
        if self._join(side, message, answer):
            self._store_group()
            return True
        return False

    def _join(self, side: MasterSide, message: Message, answer: _Answer) -> bool:
        """
        A put made while C{side}'s release of waiting puts runs: checked
        now as any put (its refusals raised), then held to be stored with
        the others made in this release when it ends, or once they reach
        L{GROUP_BYTES} -- one batch, one frame, one wait (docs/sync.md,
        "Puts released together are stored together").  C{False}: this
        put is to be stored now instead (a SYNC_FLUSH log, whose puts each
        wait for the disk; a record larger than a group), after those
        held.
        """
        master = self._admit(side)
        factory = master.factory
        assert factory is not None  # (_admit refuses a side without one)
        commitlog = factory.commitlog
        size = commitlog.record_size(message)
        group = self._group
        if group is None or group.side is not master:
            if group is not None:
                self._store_group()  # (another master side: a role changed in the release)
                group = None
            if commitlog.flush_disk_type is FlushDiskType.SYNC_FLUSH:
                return False
            limit = min(GROUP_BYTES, (commitlog.segment_size - END_FILE_MIN_BLANK_LENGTH) // 2)
        else:
            limit = group.limit
        if size > limit:
            return False  # (_store_one stores the held puts first)
        if group is None:
            group = self._group = _Group(master, limit)
            master.early.at_release_end(self._store_group)
        group.messages.append(message)
        group.answers.append(answer)
        group.size += size
        if group.size >= limit:
            # (At least the early frames' size: stored, it may be sent.)
            self._store_group()
        return True

    def _store_group(self) -> None:
        """
        Store the held puts (L{_join}) as one batch and wait once, for its
        end: each put is answered with its own result and the batch's
        status, or, if they could not be stored, with the error.
        """
        group = self._group
        if group is None:
            return
        self._group = None
        answers = group.answers
        try:
            # (Checked again: the release's callbacks may have stopped this
            # master, or its lease may have run out, since.)
            side = self._admit(group.side)
            appends = self._store_batch(side, group.messages)
        except Exception as e:
            # (What a put stored now would have raised: each is answered
            # with it.)
            if isinstance(e, NotStoredError):
                # (_admit and _not_stored counted one put; each was refused.)
                self.put_statuses[e.status] += len(answers) - 1
            elif not isinstance(e, (StoreError, MessageRejected)):
                self._log.failure(
                    "storing {count} puts made in a release failed", count=len(answers)
                )
            for answer in answers:
                self._answer(answer, e)
            return
        last = appends[-1]
        started = self._reactor.seconds()
        waited = False

        def answered(result: PutMessageResult) -> None:
            status = result.status
            if len(answers) > 1:
                if waited:
                    # (The batch's wait was observed once; every put waited.)
                    self.replication_wait.observe_many(
                        self._reactor.seconds() - started, len(answers) - 1
                    )
                # (If this is the release's last wait, its last answer is
                # the release's last: the early frames' rule is for that.)
                early = side.early
                releases_last = early.firing_last()
                if releases_last:
                    early.more_to_fire()
                # (PutPath.result for each, counted at once.)
                self.put_statuses[status] += len(answers) - 1
                for answer, append in zip(answers, appends[:-1]):
                    try:
                        answer(PutMessageResult(status, append))
                    except Exception:
                        self._log.failure("a put's answer failed")
                if releases_last:
                    early.last_of_release()
            self._answer(answers[-1], result)

        now = side.ha.wait_then(last.next_offset, last, answered)
        if now is not None:
            answered(now)
        else:
            waited = True

    def _answer(self, answer: _Answer, outcome: Any) -> None:
        try:
            answer(outcome)
        except Exception:
            self._log.failure("a put's answer failed")

    def _not_stored(self, error: OSError) -> NotStoredError:
        """
        What a put that failed in the store answers; logged once until a
        put succeeds again (a full disk fails every put).
        """
        if isinstance(error, SegmentCreateError):
            status = PutStatus.CREATE_MAPEDFILE_FAILED
        else:
            status = PutStatus.UNKNOWN_ERROR
        self.put_statuses[status] += 1
        cause = "disk full: " if error.errno in _DISK_FULL else ""
        what = error.strerror or str(error)
        if error.filename:
            what = f"{error.filename}: {what}"
        text = f"{cause}{what}; the message was not stored"
        if not self._store_failing:
            self._store_failing = True
            self._log.error("puts fail: {why} ({status})", why=text, status=status.value)
        return NotStoredError(status, text, error.errno)

    def result(self, status: PutStatus, append: AppendResult) -> PutMessageResult:
        """
        A put's result, counted: what its wait fires with (the master
        side's C{finish}).
        """
        self.put_statuses[status] += 1
        return PutMessageResult(status, append)
