# -*- test-case-name: tests.test_group -*-
"""
Synchronous double write: RocketMQ's C{GroupTransferService}, as Deferreds.

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

import enum
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from rmqha.commitlog import AppendResult

__all__ = ["PutStatus", "PutMessageResult", "GroupTransferService"]


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

    @property
    def quorum_offset(self) -> int:
        return self._quorum_offset

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
