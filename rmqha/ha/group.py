# -*- test-case-name: tests.test_group -*-
"""
Synchronous double write: RocketMQ's C{HAService} quorum and
C{GroupTransferService}, as Deferreds.

L{HAService} is fed the slaves' acks by the master factory
(L{rmqha.ha.master.MasterFactory}) and decides each SYNC_MASTER put:
C{IN_SYNC_REPLICAS_NOT_ENOUGH} or C{SLAVE_NOT_AVAILABLE} at once when too
few replicas are in sync, else a wait in the L{GroupTransferService}.

A SYNC_MASTER put waits until enough slaves hold it.  "Enough" is counted
over distinct slave connections, each by its own acknowledgement: the
put's end offset must be at most the I{quorum offset}, the k-th highest
ack among the connected slaves (k = inSyncReplicas - 1).  RocketMQ 4.x
compared against one maximum shared by all connections, so one fast (or
fake) slave's ack counted for every other (#1155, #3015, #5128).

Waiters sit in a heap keyed by end offset, so a put costs O(log n) and a
quorum advance pops exactly the waiters it satisfies, in offset order, on
the reactor's next turn (so a callback cannot re-enter the protocol that
delivered the ack).  Each waiter has a deadline on the injected clock.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from rmqha.store.commitlog import AppendResult

__all__ = [
    "PutStatus",
    "PutMessageResult",
    "GroupTransferService",
    "HAService",
    "Histogram",
    "REPLICATION_WAIT_BUCKETS",
]


class PutStatus(enum.Enum):
    """
    RocketMQ's C{PutMessageStatus} values a put can end with here.
    """

    #: Stored (and, on a SYNC_MASTER, held by enough slaves).
    PUT_OK = "PUT_OK"
    #: Stored; not on disk within C{syncFlushTimeout} (SYNC_FLUSH).
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    #: Stored; the slaves did not acknowledge it within C{slaveTimeout}.
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    #: Stored; too few slaves connected and caught up to wait for.
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    #: Stored; fewer in-sync replicas than C{minInSyncReplicas}.
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    #: Not stored: this broker does not take puts (a slave).
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    #: Not stored: the next segment could not be created (disk full).
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    #: Not stored: the store failed otherwise (an I/O error, named).
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


@dataclass(frozen=True)
class PutMessageResult:
    """
    How a put ended.  The message is stored whatever the status (a put
    that stores nothing raises L{rmqha.broker.NotStoredError} instead).
    """

    status: PutStatus
    append: AppendResult

    @property
    def offset(self) -> int:
        return self.append.offset

    @property
    def next_offset(self) -> int:
        return self.append.next_offset

    @property
    def msg_id(self) -> str:
        return self.append.msg_id


@dataclass(order=True)
class _Waiter:
    end_offset: int
    sequence: int
    deferred: Deferred[PutStatus] = field(compare=False)
    done: bool = field(default=False, compare=False)


class GroupTransferService:
    """
    Puts waiting for the quorum offset to reach them.
    """

    def __init__(self, clock: IReactorTime, timeout: float) -> None:
        """
        @param timeout: RocketMQ's C{slaveTimeout}, in seconds.
        """
        if timeout <= 0:
            raise ValueError(f"slaveTimeout {timeout} must be positive")
        self._clock = clock
        self._timeout = timeout
        self._heap: list[_Waiter] = []
        self._sequence = itertools.count()
        self._quorum_offset = -1
        self._fire_call: IDelayedCall | None = None
        self._dead = 0
        self._stopped = False

    @property
    def waiting(self) -> int:
        """
        Puts still waiting.
        """
        return len(self._heap) - self._dead

    def wait_for(self, end_offset: int) -> Deferred[PutStatus]:
        """
        Fires with C{PUT_OK} once the quorum offset reaches C{end_offset},
        or C{FLUSH_SLAVE_TIMEOUT} after the timeout.  Cancelling it
        withdraws the wait.
        """
        if self._stopped:
            return succeed(PutStatus.SLAVE_NOT_AVAILABLE)
        if end_offset <= self._quorum_offset:
            return succeed(PutStatus.PUT_OK)

        def cancel(_: Deferred[PutStatus]) -> None:
            if not waiter.done:
                waiter.done = True
                self._dead += 1
                self._compact()

        d: Deferred[PutStatus] = Deferred(cancel)
        waiter = _Waiter(end_offset, next(self._sequence), d)
        heapq.heappush(self._heap, waiter)
        d.addTimeout(self._timeout, self._clock, onTimeoutCancel=_timed_out)
        return d

    def quorum_changed(self, offset: int) -> None:
        """
        The k-th highest slave ack is now C{offset}: waiters at or below it
        are fired on the reactor's next turn.
        """
        self._quorum_offset = offset
        heap = self._heap
        if heap and heap[0].end_offset <= offset and self._fire_call is None:
            self._fire_call = self._clock.callLater(0, self._fire)

    def _fire(self) -> None:
        self._fire_call = None
        heap = self._heap
        while heap and heap[0].end_offset <= self._quorum_offset:
            waiter = heapq.heappop(heap)
            if waiter.done:
                self._dead -= 1
                continue
            waiter.done = True
            waiter.deferred.callback(PutStatus.PUT_OK)

    def _compact(self) -> None:
        # Cancelled waiters stay in the heap until popped; rebuild when
        # they are most of it, so memory tracks the live waiters.
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [w for w in self._heap if not w.done]
            heapq.heapify(self._heap)
            self._dead = 0

    def stop(self) -> None:
        """
        Resolve every waiter with C{SLAVE_NOT_AVAILABLE}: replication is
        stopping before they were acknowledged.
        """
        self._stopped = True
        if self._fire_call is not None and self._fire_call.active():
            self._fire_call.cancel()
        self._fire_call = None
        waiters, self._heap, self._dead = self._heap, [], 0
        for waiter in sorted(waiters):
            if not waiter.done:
                waiter.done = True
                waiter.deferred.callback(PutStatus.SLAVE_NOT_AVAILABLE)


def timed_out_as(status: PutStatus) -> Callable[[Any, float], Any]:
    """
    An C{onTimeoutCancel} for C{Deferred.addTimeout} that turns the
    timeout into C{status}.
    """

    def translate(result: Any, timeout: float) -> Any:
        if isinstance(result, Failure) and result.check(CancelledError):
            return status
        return result

    return translate


_timed_out = timed_out_as(PutStatus.FLUSH_SLAVE_TIMEOUT)


#: Upper bounds (seconds) of the replication-wait histogram's buckets.
REPLICATION_WAIT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0,
)


class Histogram:
    """
    Counts of observations per cumulative bucket, plus their sum (what a
    Prometheus histogram exposes).
    """

    def __init__(self, bounds: tuple[float, ...] = REPLICATION_WAIT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


class HAService:
    """
    A master's replicas as the put path sees them: the slaves' acks (one
    per replica, issue 12) give the quorum offset, the k-th highest ack
    (k = inSyncReplicas - 1), which releases the waiting puts.

    @ivar group: the waiting puts.
    """

    def __init__(
        self,
        clock: IReactorTime,
        *,
        sync: bool,
        in_sync_replicas: int,
        min_in_sync_replicas: int,
        slave_fallbehind_max: int,
        slave_timeout: float,
        replication_wait: Histogram | None = None,
    ) -> None:
        """
        @param sync: a SYNC_MASTER (puts wait for replicas); an
            ASYNC_MASTER's puts never wait.
        @param replication_wait: where the seconds puts waited are counted.
        """
        self._clock = clock
        self.sync = sync
        self._in_sync_replicas = in_sync_replicas
        self._min_in_sync_replicas = min_in_sync_replicas
        self._fallbehind_max = slave_fallbehind_max
        self.group = GroupTransferService(clock, slave_timeout)
        self.replication_wait = replication_wait or Histogram()
        #: The ack of every replicating slave, one per replica: set by
        #: the master factory that feeds this service.
        self.ack_offsets: Callable[[], list[int]] = list

    def acks_changed(self) -> None:
        """
        A slave acknowledged or went away: move the quorum offset.
        """
        needed = self._in_sync_replicas - 1
        if needed <= 0:
            return
        ordered = sorted(self.ack_offsets(), reverse=True)
        self.group.quorum_changed(ordered[needed - 1] if len(ordered) >= needed else -1)

    def wait_for(self, end: int) -> Deferred[PutStatus]:
        """
        The replicas' verdict on a put ending at C{end}.
        """
        if not self.sync or self._in_sync_replicas <= 1:
            return succeed(PutStatus.PUT_OK)
        in_sync = 1 + sum(1 for ack in self.ack_offsets() if end - ack < self._fallbehind_max)
        if in_sync < self._min_in_sync_replicas:
            return succeed(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        if in_sync < self._in_sync_replicas:
            return succeed(PutStatus.SLAVE_NOT_AVAILABLE)
        started = self._clock.seconds()

        def observe(status: PutStatus) -> PutStatus:
            self.replication_wait.observe(self._clock.seconds() - started)
            return status

        return self.group.wait_for(end).addCallback(observe)

    def stop(self) -> None:
        """
        The master side is stopping: every waiting put ends with
        C{SLAVE_NOT_AVAILABLE}, and later ones too.
        """
        self.group.stop()
