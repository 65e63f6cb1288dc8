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
quorum advance pops exactly the waiters it satisfies, in offset order.
They fire when the code that delivered the acks calls C{release}: the
master connection does at the end of its C{dataReceived}, after parsing,
so a callback never runs inside the parser (docs/sync.md, the firing
rule).  Deadlines are one queue watched by one timer on the injected
clock, not a timer per put.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections import deque
from typing import Any, Callable, NamedTuple

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from zope.interface import implementer

from rmqha._busypoll import IExpectsBytes
from rmqha.ha.fence import OPEN
from rmqha.ha.insync import InSyncSet
from rmqha.ha.interfaces import (
    IAppendedTo,
    IFence,
    IInSyncObserver,
    IReleaseListener,
    IReplicaAcks,
    provides,
)
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

    # Members are singletons compared by identity: hash them so too (each
    # put counts its status in a dict; Enum's own hash is Python code).
    __hash__ = object.__hash__


class PutMessageResult(NamedTuple):
    """
    How a put ended.  The message is stored whatever the status (a put
    that stores nothing raises L{rmqha.broker.NotStoredError} instead).

    (A named tuple, as L{AppendResult} is: one is made per put, and a
    frozen dataclass took twice as long to make, ~0.3 us more a put on
    the master's reactor thread.)
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


#: A put times out this close to its deadline (at most this early): the
#: one timer is set from float deadlines, whose differences can round.
_SLACK = 1e-6


class _Waiter:
    __slots__ = ("end_offset", "sequence", "started", "deadline", "fire", "done", "append")

    def __init__(
        self,
        end_offset: int,
        sequence: int,
        started: float,
        deadline: float,
        fire: Callable[[Any], object],
        append: AppendResult | None,
    ) -> None:
        self.end_offset = end_offset
        # (Arrival order: of two waits for one offset, or two deadlines
        # that come in one timer call, the earlier is answered first.)
        self.sequence = sequence
        self.started = started
        self.deadline = deadline
        # (A Deferred's callback, or an answer callback: wait_then.)
        self.fire = fire
        self.done = False
        self.append = append


#: What a wait for a put (its L{AppendResult} given) fires with: the put's
#: result, made from the status by the caller's function (the broker's,
#: which counts the statuses), so the put's Deferred needs no callback of
#: its own to turn the status into a result (a callback costs a put a
#: microsecond or two).
Finish = Callable[[PutStatus, AppendResult], Any]


class GroupTransferService:
    """
    Puts waiting for the quorum offset to reach them.

    Puts are stored, and wait, in offset order, and every put waits
    C{slaveTimeout}: a wait for an offset at or past every earlier one's
    (the common case, every wait a put makes) joins one queue that is in
    offset order and deadline order at once -- what an ack releases is
    its front, what times out is its front.  A wait for an offset behind
    an earlier one (a SYNC_FLUSH put that waited for the disk first, a
    caller's own wait) goes to a heap by offset, with its own queue by
    deadline.  A release fires the covered waiters of both in offset order
    (of two waits for one offset, the earlier first), and B{one} timer is
    set for the earliest deadline.  A put costs a queue append, no timer of
    its own.  Waiters that resolved stay where they are until they reach
    the front (or most of a structure is such waiters, when it is
    rebuilt), so memory tracks the live waiters.
    """

    _log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        timeout: float,
        observe: Callable[[float], object] | None = None,
        finish: Finish = PutMessageResult,
        listener: IReleaseListener | None = None,
    ) -> None:
        """
        @param timeout: RocketMQ's C{slaveTimeout}, in seconds.
        @param observe: called with the seconds each wait lasted when it
            ends (not when it is cancelled).
        @param finish: makes what a wait given a put's L{AppendResult}
            fires with, from its status (see L{wait_for}).
        @param listener: told by L{release} just before it fires the last
            waiter the quorum offset covers (what that put's callback
            appends has no later callback of this release to travel with:
            L{rmqha.ha.replicas.EarlyFrames}).
        """
        if timeout <= 0:
            raise ValueError(f"slaveTimeout {timeout} must be positive")
        self._clock = clock
        self._timeout = timeout
        self._observe = observe
        self.finish = finish
        self._listener = (
            provides(IReleaseListener, listener, "listener") if listener is not None else None
        )
        # Waits in offset order (= arrival and deadline order); the end
        # offset of the last one that joined it.
        self._queue: deque[_Waiter] = deque()
        self._tail = -1
        # Waits behind an earlier one's offset: by offset, and by deadline.
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._late: deque[_Waiter] = deque()
        self._sequence = itertools.count()
        self._quorum_offset = -1
        self._timer: IDelayedCall | None = None
        self._expiring = False
        self._live = 0
        self._stopped = False

    @property
    def waiting(self) -> int:
        """
        Puts still waiting.
        """
        return self._live

    def wait_for(self, end_offset: int, append: AppendResult | None = None) -> Deferred[Any]:
        """
        Fires with C{PUT_OK} once the quorum offset reaches C{end_offset}
        (see L{release}), or C{FLUSH_SLAVE_TIMEOUT} after the timeout; given
        the put's C{append}, with C{finish(status, append)} instead.
        Cancelling it withdraws the wait.
        """
        answer = self._answer_now(end_offset, append)
        if answer is not None:
            return succeed(answer)

        def cancel(_: Deferred[PutStatus]) -> None:
            if not waiter.done:
                waiter.done = True
                self._live -= 1
                self._compact()

        d: Deferred[Any] = Deferred(cancel)
        waiter = self._enqueue(end_offset, append, d.callback)
        return d

    def wait_then(
        self, end_offset: int, append: AppendResult, answer: Callable[[Any], object]
    ) -> Any:
        """
        L{wait_for} without a L{Deferred}: C{finish(status, append)} when
        the verdict is known now (C{answer} is never called then), else
        C{None}, and C{answer} is called with it later, once -- from
        L{release}, the timer or L{stop}, where a callback may run.  A
        wait here cannot be withdrawn.  An C{answer} that raises is
        logged; the other waiters are answered as if it had not.
        """
        now = self._answer_now(end_offset, append)
        if now is None:
            self._enqueue(end_offset, append, answer)
        return now

    def _answer_now(self, end_offset: int, append: AppendResult | None) -> Any:
        """
        The answer of a wait for C{end_offset} known without waiting (the
        service stopped; the quorum offset already past it), or C{None}.
        """
        if self._stopped:
            status = PutStatus.SLAVE_NOT_AVAILABLE
        elif end_offset <= self._quorum_offset:
            status = PutStatus.PUT_OK
        else:
            return None
        if self._observe is not None:
            self._observe(0.0)
        return status if append is None else self.finish(status, append)

    def _enqueue(
        self, end_offset: int, append: AppendResult | None, fire: Callable[[Any], object]
    ) -> _Waiter:
        now = self._clock.seconds()
        sequence = next(self._sequence)
        waiter = _Waiter(end_offset, sequence, now, now + self._timeout, fire, append)
        if end_offset >= self._tail:
            self._queue.append(waiter)
            self._tail = end_offset
        elif self._live == 0:
            # Every earlier wait has ended (what is left of them is only
            # awaiting removal): the queue starts again from this one.
            self._queue, self._heap, self._late = deque([waiter]), [], deque()
            self._tail = end_offset
        else:
            heapq.heappush(self._heap, (end_offset, sequence, waiter))
            self._late.append(waiter)
        self._live += 1
        if self._timer is None and not self._expiring:
            self._timer = self._clock.callLater(self._timeout - _SLACK, self._expire)
        return waiter

    @property
    def quorum_offset(self) -> int:
        return self._quorum_offset

    def quorum_changed(self, offset: int) -> None:
        """
        The k-th highest slave ack is now C{offset}.  Nothing fires yet:
        the caller calls L{release} when it is done with its own state.
        """
        self._quorum_offset = offset

    def release(self) -> None:
        """
        Fire C{PUT_OK} for every waiter the quorum offset covers, in offset
        order, now.  Call it where a callback may run: the master calls it
        at the end of the C{dataReceived} that delivered the acks, never
        from inside its parsing (docs/sync.md, "the firing rule").
        """
        # (Re-read on every step, the structures themselves included: a
        # callback may put, release, stop, which replaces them, or cancel
        # a wait, which may rebuild them: _compact.)
        # One clock reading for the waits these acks end (the histogram's
        # buckets are 100 us and more; a put's callbacks take microseconds).
        # (The common case of _resolve inlined, the names it needs taken
        # once: this loop runs once per SYNC put.)
        now: float | None = None
        listener = self._listener
        observe = self._observe
        finish = self.finish
        ok = PutStatus.PUT_OK
        while True:
            quorum = self._quorum_offset
            queue = self._queue
            heap = self._heap
            if queue and queue[0].end_offset <= quorum:
                # (Of two waits for one offset, the queue's came first: the
                # heap's came after a queued one for a later offset.)
                if heap and heap[0][0] < queue[0].end_offset:
                    waiter = heapq.heappop(heap)[2]
                else:
                    waiter = queue.popleft()
            elif heap and heap[0][0] <= quorum:
                waiter = heapq.heappop(heap)[2]
            else:
                break
            if waiter.done:
                continue
            waiter.done = True
            self._live -= 1
            if now is None:
                now = self._clock.seconds()
            if listener is not None and not (
                (queue and queue[0].end_offset <= quorum) or (heap and heap[0][0] <= quorum)
            ):
                listener.last_of_release()
            if observe is not None:
                observe(now - waiter.started)
            append = waiter.append
            try:
                waiter.fire(ok if append is None else finish(ok, append))
            except Exception:
                self._answer_failed()
        late = self._late
        while late and late[0].done:
            late.popleft()

    def _resolve(self, waiter: _Waiter, status: PutStatus, now: float | None = None) -> None:
        if self._observe is not None:
            self._observe((self._clock.seconds() if now is None else now) - waiter.started)
        append = waiter.append
        try:
            waiter.fire(status if append is None else self.finish(status, append))
        except Exception:
            self._answer_failed()

    def _answer_failed(self) -> None:
        # A wait_then answer that raised: logged, and the release (or
        # the timer, or the stop) goes on with the other waiters; the
        # replication connection whose ack released it never sees it.
        self._log.failure("a put's answer failed")

    def _expire(self) -> None:
        """
        The timer: time out every waiter whose deadline has come, then
        set the timer for the earliest deadline left.
        """
        self._timer = None
        self._expiring = True
        try:
            while True:
                # (Re-read each time: a callback may have stopped us,
                # replacing both queues.)
                queue, late = self._queue, self._late
                while queue and queue[0].done:
                    queue.popleft()
                while late and late[0].done:
                    late.popleft()
                limit = self._clock.seconds() + 2 * _SLACK
                first = queue[0] if queue and queue[0].deadline <= limit else None
                other = late[0] if late and late[0].deadline <= limit else None
                if other is not None and (first is None or other.sequence < first.sequence):
                    waiter = late.popleft()
                elif first is not None:
                    waiter = queue.popleft()
                else:
                    break
                waiter.done = True
                self._live -= 1
                self._resolve(waiter, PutStatus.FLUSH_SLAVE_TIMEOUT)
        finally:
            self._expiring = False
        self._compact()
        earliest = [q[0].deadline for q in (self._queue, self._late) if q]
        if earliest and self._timer is None and not self._stopped:
            delay = min(earliest) - self._clock.seconds() - _SLACK
            self._timer = self._clock.callLater(max(0.0, delay), self._expire)

    def _compact(self) -> None:
        # Resolved waiters stay in the structures until they reach the
        # front; rebuild them when they are most of any.
        live = self._live
        if max(len(self._queue), len(self._heap), len(self._late)) > 64 + 2 * live:
            self._queue = deque(w for w in self._queue if not w.done)
            self._heap = [entry for entry in self._heap if not entry[2].done]
            heapq.heapify(self._heap)
            self._late = deque(w for w in self._late if not w.done)

    def stop(self) -> None:
        """
        Resolve every waiter with C{SLAVE_NOT_AVAILABLE}: replication is
        stopping before they were acknowledged.
        """
        self._stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        queue, heap = self._queue, self._heap
        self._queue, self._heap, self._late, self._live = deque(), [], deque(), 0
        # In offset order; of two waits for one offset, the earlier first.
        waiters = [*queue, *(entry[2] for entry in heap)]
        for waiter in sorted(waiters, key=lambda w: (w.end_offset, w.sequence)):
            if not waiter.done:
                waiter.done = True
                self._resolve(waiter, PutStatus.SLAVE_NOT_AVAILABLE)


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

    def observe_many(self, value: float, times: int) -> None:
        """
        L{observe} C{value} C{times} times (puts stored together, which
        waited once).
        """
        self.total += value * times
        self.counts[bisect.bisect_left(self.bounds, value)] += times

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


@implementer(IInSyncObserver, IExpectsBytes)
class HAService:
    """
    A master's replicas as the put path sees them: the slaves' acks (one
    per replica, issue 12) give the quorum offset, the k-th highest ack
    (k = inSyncReplicas - 1), which releases the waiting puts.

    @ivar group: the waiting puts.
    @ivar acks: what the replicas have acknowledged.
    """

    def __init__(
        self,
        clock: IReactorTime,
        *,
        acks: IReplicaAcks,
        appended: IAppendedTo,
        sync: bool,
        in_sync_replicas: int,
        min_in_sync_replicas: int,
        slave_fallbehind_max: int,
        slave_timeout: float,
        replication_wait: Histogram | None = None,
        fence: IFence = OPEN,
        listener: IReleaseListener | None = None,
        finish: Finish = PutMessageResult,
    ) -> None:
        """
        @param acks: what the replicas have acknowledged (the master's
            L{rmqha.ha.replicas.Replicas}).
        @param appended: the master's log (failover mode: what a put ends
            at).
        @param sync: a SYNC_MASTER (puts wait for replicas); an
            ASYNC_MASTER's puts never wait.
        @param replication_wait: where the seconds puts waited are counted.
        @param fence: failover mode: whether this master may still answer
            C{PUT_OK} (its lease is good), checked as each put is released.
        @param listener: see L{GroupTransferService}.
        @param finish: see L{GroupTransferService}.
        """
        self._clock = clock
        self.acks = provides(IReplicaAcks, acks, "acks")
        self._appended = provides(IAppendedTo, appended, "appended")
        self._fence = provides(IFence, fence, "fence")
        self.sync = sync
        self._in_sync_replicas = in_sync_replicas
        self._min_in_sync_replicas = min_in_sync_replicas
        self._fallbehind_max = slave_fallbehind_max
        self.replication_wait = replication_wait or Histogram()
        self.group = GroupTransferService(
            clock,
            slave_timeout,
            observe=self.replication_wait.observe,
            finish=finish,
            listener=listener,
        )
        #: Failover mode (docs/failover.md): the in-sync set whose every
        #: member a SYNC put waits for, instead of inSyncReplicas - 1 acks.
        self.in_sync: InSyncSet | None = None
        #: The highest quorum offset so far: every put answered PUT_OK
        #: ends at or before it.
        self.acked_end = 0
        #: Called when L{acked_end} moves (the broker dispatches the
        #: consume queues up to L{visible_end}).
        self.on_acked_end: Callable[[], object] | None = None

    def expecting(self) -> bool:
        """
        Whether a slave's ack is expected within a moment: a SYNC put waits
        for one (L{rmqha._busypoll.IExpectsBytes}).
        """
        return self.sync and self.group.waiting > 0

    def use_in_sync(self, in_sync: InSyncSet) -> None:
        """
        Failover mode: wait for every member of C{in_sync} (and at least
        C{minInSyncReplicas} copies) instead of C{inSyncReplicas - 1}
        acks.  C{in_sync} must tell this service when it changes (one of
        its observers).
        """
        if self not in in_sync.observers:
            raise ValueError("the in-sync set must tell this HA service of its changes")
        self.in_sync = in_sync

    def in_sync_changed(self) -> None:
        """
        The in-sync set changed (L{IInSyncObserver}): the quorum moves.
        """
        self.acks_changed()
        self.release()

    def in_sync_lost(self, why: str) -> None:
        """
        The in-sync set was refused (L{IInSyncObserver}): nothing here;
        the coordinator steps down, which ends the waiting puts.
        """

    def replica_acked(self, node: str, ack: int) -> None:
        """
        Failover mode: the replica of node C{node} acknowledged C{ack}.
        """
        if self.in_sync is not None:
            self.in_sync.acked(node, ack, self._appended.max_offset, self.acked_end)

    def replica_gone(self, node: str) -> None:
        """
        Failover mode: node C{node} has no replicating connection left.
        """
        if self.in_sync is not None:
            self.in_sync.gone(node)

    def _failover_quorum(self, in_sync: InSyncSet) -> int:
        members = in_sync.effective
        if len(members) < self._min_in_sync_replicas:
            return -1
        acks = self.acks.node_acks()
        others = [acks.get(node, -1) for node in members if node != in_sync.me]
        if not others:
            # The master alone (minInSyncReplicas 1): its own copy is all.
            end: int = self._appended.max_offset
            return end
        return min(others)

    def acks_changed(self) -> None:
        """
        A slave acknowledged or went away: move the quorum offset.  The
        puts it covers fire at the next L{release}.
        """
        if self.in_sync is not None:
            quorum = self._failover_quorum(self.in_sync)
            self._acked_to(quorum)
            self.group.quorum_changed(quorum)
            return
        needed = self._in_sync_replicas - 1
        if needed <= 0:
            return
        acks = self.acks.ack_offsets()
        if needed == 1:
            self.group.quorum_changed(max(acks, default=-1))
            return
        ordered = sorted(acks, reverse=True)
        self.group.quorum_changed(ordered[needed - 1] if len(ordered) >= needed else -1)

    def _acked_to(self, end: int) -> None:
        if end > self.acked_end:
            self.acked_end = end
            if self.on_acked_end is not None:
                self.on_acked_end()

    def visible_end(self) -> int | None:
        """
        How far consumers may read the log: in failover mode on a
        SYNC_MASTER, L{acked_end} (what every in-sync member holds, and so
        survives a failover: a message read before its replicas hold it
        could be lost with this master, and another written at its place
        in its queue); otherwise C{None} (the whole log, as RocketMQ 4.9.8
        reads it; RocketMQ 5 reads up to its confirm offset unless
        C{readUnCommitted}).  Still so once stopped: a deposed master
        serves no more of its log until it follows the new one (whose
        checks cut what it must not keep).
        """
        if self.in_sync is None or not self.sync:
            return None
        return self.acked_end

    def release(self) -> None:
        """
        Fire the waiting puts the quorum offset covers (the firing rule:
        docs/sync.md).  In failover mode, only while this master's lease
        is good: puts it would release later end as time-outs or when the
        master steps down (never PUT_OK from a deposed master).
        """
        if self.in_sync is not None and not self._fence.may_acknowledge():
            return
        self.group.release()

    def wait_for(self, end: int, append: AppendResult | None = None) -> Deferred[Any]:
        """
        The replicas' verdict on a put ending at C{end}: its status, or,
        given the put's C{append}, C{group.finish(status, append)}.
        """
        status = self._status_now(end)
        if status is not None:
            return self._answer(status, append)
        return self.group.wait_for(end, append)

    def wait_then(self, end: int, append: AppendResult, answer: Callable[[Any], object]) -> Any:
        """
        L{wait_for} without a L{Deferred} (L{GroupTransferService.wait_then}):
        C{group.finish(status, append)} when the verdict is known now,
        else C{None} and C{answer} is called with it later.
        """
        status = self._status_now(end)
        if status is not None:
            return self.group.finish(status, append)
        return self.group.wait_then(end, append, answer)

    def _status_now(self, end: int) -> PutStatus | None:
        """
        The verdict on a put ending at C{end} that needs no wait for the
        replicas (not a SYNC_MASTER, too few in sync, the lease alone
        deciding), or C{None}: the put waits for the quorum offset.
        """
        if self.in_sync is not None:
            return self._failover_status(end, self.in_sync)
        if not self.sync or self._in_sync_replicas <= 1:
            return PutStatus.PUT_OK
        # (Who is in sync counts only links that deliver acks; the quorum
        # offset, which releases puts, counts every ack received.  An ack
        # must be past end - slaveFallbehindMax.)
        in_sync = 1 + self.acks.live_count(end - self._fallbehind_max)
        if in_sync < self._min_in_sync_replicas:
            return PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
        if in_sync < self._in_sync_replicas:
            return PutStatus.SLAVE_NOT_AVAILABLE
        return None

    @property
    def min_in_sync_replicas(self) -> int:
        """
        The copies every C{PUT_OK} needs, the master's included:
        C{minInSyncReplicas} on a SYNC_MASTER, 1 on an ASYNC_MASTER
        (whose puts never wait).
        """
        return self._min_in_sync_replicas if self.sync else 1

    def in_sync_replicas(self) -> int:
        """
        The copies a put ending at the log's end would count now, the
        master's included: in failover mode the in-sync set's members;
        otherwise the master and each replica whose link delivers acks
        within C{slaveFallbehindMax} of the end (as L{wait_for} counts
        them).  For monitoring: below L{min_in_sync_replicas}, SYNC puts
        are refused.
        """
        if self.in_sync is not None:
            return len(self.in_sync.effective)
        oldest = self._appended.max_offset - self._fallbehind_max
        return 1 + self.acks.live_count(oldest)

    def _answer(self, status: PutStatus, append: AppendResult | None) -> Deferred[Any]:
        return succeed(status if append is None else self.group.finish(status, append))

    def refusal(self) -> str | None:
        """
        Before a put is stored, on a SYNC_MASTER: why it must not be, or
        C{None}.  minInSyncReplicas is a floor for every C{PUT_OK}: when
        even the replicas that could hold the put now -- the in-sync set
        (failover) and every replica whose link delivers acks -- cannot
        reach it, the put could only time out, so it is refused unstored
        (C{IN_SYNC_REPLICAS_NOT_ENOUGH}; a producer's retry makes no
        duplicate, as RocketMQ 5 and Kafka refuse before appending).
        """
        needed = self._min_in_sync_replicas
        if needed <= 1 or not self.sync:
            return None
        in_sync = self.in_sync
        if in_sync is None:
            live = self.acks.live_count()
            if live + 1 >= needed:
                return None
            return (
                f"{live} replica(s) deliver acks, minInSyncReplicas is {needed}: "
                "not stored"
            )
        members = in_sync.effective
        if len(members) >= needed:
            return None
        live_nodes = self.acks.live_nodes()
        if len(members | live_nodes) >= needed:
            return None  # (a replica catching up may enter the set in time)
        return (
            f"in-sync set {','.join(sorted(members))} and {len(live_nodes)} other "
            f"replica(s) delivering acks, minInSyncReplicas is {needed}: not stored"
        )

    def _failover_status(self, end: int, in_sync: InSyncSet) -> PutStatus | None:
        if not self.sync:
            return PutStatus.PUT_OK
        members = in_sync.effective
        # (The master alone holds it now, enough only with
        # minInSyncReplicas 1: the floor holds for every PUT_OK.)
        alone = self._min_in_sync_replicas <= 1 and len(members) == 1 and in_sync.me in members
        if alone or end <= self.group.quorum_offset:
            # Held by every member already: only the lease decides.
            if not self._fence.may_acknowledge():
                return PutStatus.SLAVE_NOT_AVAILABLE
            if alone:
                self._acked_to(end)
                self.replication_wait.observe(0.0)
                return PutStatus.PUT_OK
        return None

    def stop(self) -> None:
        """
        The master side is stopping: every waiting put ends with
        C{SLAVE_NOT_AVAILABLE}, and later ones too.
        """
        if self.in_sync is not None:
            self.in_sync.stop()
        self.group.stop()
