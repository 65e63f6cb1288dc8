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
from rmqha.ha.masterside import MasterSide
from rmqha.ha.replica import Replica
from rmqha.store._record import Message
from rmqha.store._segments import FlushDiskType
from rmqha.store.commitlog import AppendResult
from rmqha.store.errors import SegmentCreateError
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
        """
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
        and is logged.
        """
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
        assert side.factory is not None
        commitlog = side.factory.commitlog
        try:
            appends = commitlog.put_batch(messages)
        except OSError as e:
            raise self._not_stored(e) from e
        if self._store_failing:
            self._store_failing = False
            self._log.info("the commit log takes puts again")
        self.puts += len(appends)
        self.put_bytes += sum(a.size for a in appends)
        waited = self._verdict(side, commitlog.flush_disk_type, appends[-1])
        return waited.addCallback(lambda result: (result.status, appends))

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
