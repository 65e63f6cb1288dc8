# -*- test-case-name: tests.test_insync -*-
"""
A failover master's in-sync set (docs/failover.md, "The in-sync set"):
the replicas, the master included, that hold every put the master has
answered C{PUT_OK}, so that any of them may become master without losing
one.  RocketMQ 5 calls it the SyncStateSet, Kafka the ISR.

The set lives in two places: here (what the master's acks say) and in
the coordinator (what a candidate checks before standing for election).
The rule that keeps them safe: B{a replica is waited for as soon as it is
known locally, and stops being waited for only once the coordinator has
stored the smaller set} (RocketMQ's union rule, apache/rocketmq#5663).  So
L{InSyncSet.effective} -- whose acks a put needs -- is the union of the
published set and the wanted one while a change is on its way.

    enters   its ack reaches both the highest offset any put was answered
             PUT_OK at and the master's max offset at its previous ack
             (caught up with what was sent one round trip ago)
    leaves   it disconnects, falls more than C{haSlaveFallbehindMax} bytes
             behind, or stays behind the master's max offset for more than
             C{catchup_timeout} seconds (seen by its acks and by L{check},
             which the coordinator calls every renewal)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.ha.interfaces import IInSyncObserver, provides

#: Seconds a member may stay behind the master's max offset before it
#: leaves the set (RocketMQ 5's haMaxTimeSlaveNotCatchup is 15 s, but there
#: puts wait for any replica: here every member holds puts up, which wait at
#: most slaveTimeout, 3 s; a stalled member is noticed within this plus one
#: renewal interval and dropped before the puts it holds up time out).
DEFAULT_CATCHUP_TIMEOUT = 1.0

#: Seconds between tries to publish the set while the coordinator does not
#: answer.
PUBLISH_RETRY = 0.2


@dataclass
class _Progress:
    ack: int
    #: The master's max offset at the previous ack.
    previous_max: int
    #: Since when it has been behind the master's max offset (seen by an
    #: ack or a check), or None while caught up.
    behind_since: float | None


class InSyncSet:
    """
    @ivar wanted: the set the acks call for (the master included).
    @ivar published: the set the coordinator holds.
    """

    _log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        me: str,
        publish: Callable[[tuple[str, ...]], Deferred[bool]],
        *,
        fallbehind_max: int,
        catchup_timeout: float = DEFAULT_CATCHUP_TIMEOUT,
        published: tuple[str, ...] = (),
        observers: Sequence[IInSyncObserver] = (),
    ) -> None:
        """
        @param publish: stores a set in the coordinator; fires C{True} once
            stored, C{False} (or fails) when it could not be (this node is
            no longer the leader, the coordinator is unreachable).
        @param published: the set the coordinator holds now (after an
            election: the new master alone).
        @param observers: told when the effective set changes (the quorum
            moves: the master's L{rmqha.ha.group.HAService}) and, once,
            when a publish is refused (no longer the leader: the
            coordinator).
        """
        self._clock = clock
        self.me = me
        self._publish = publish
        self._fallbehind_max = fallbehind_max
        self._catchup_timeout = catchup_timeout
        self.published: frozenset[str] = frozenset(published) | {me}
        self.wanted: frozenset[str] = self.published
        self._progress: dict[str, _Progress] = {}
        # (Members published but not connected yet -- carried over from the
        # previous epoch -- have the catch-up timeout to connect from here.)
        self._started = clock.seconds()
        self._publishing = False
        self._stopped = False
        self._retry: IDelayedCall | None = None
        #: Who is told of changes and of the loss (L{IInSyncObserver}).
        self.observers: tuple[IInSyncObserver, ...] = tuple(
            provides(IInSyncObserver, o, "observers") for o in observers
        )

    def _changed(self) -> None:
        for observer in self.observers:
            observer.in_sync_changed()

    @property
    def effective(self) -> frozenset[str]:
        """
        The replicas whose acks a put waits for: the union of the wanted and
        the published sets.
        """
        # (Asked per put: no new set while no change is pending, the usual
        # case.)
        wanted, published = self.wanted, self.published
        return wanted if wanted == published else wanted | published

    def acked(self, node: str, ack: int, max_offset: int, acked_end: int) -> None:
        """
        Replica C{node} acknowledged C{ack} while the master's log ended at
        C{max_offset} and the highest put answered C{PUT_OK} ended at
        C{acked_end}.
        """
        now = self._clock.seconds()
        progress = self._progress.get(node)
        if progress is None:
            progress = self._progress[node] = _Progress(ack, max_offset, None)
        caught_up = ack >= max_offset or ack >= progress.previous_max
        if ack >= max_offset:
            progress.behind_since = None
        elif progress.behind_since is None:
            progress.behind_since = now
        progress.ack = ack
        progress.previous_max = max_offset
        if node not in self.wanted and caught_up and ack >= acked_end:
            self._want(self.wanted | {node}, f"{node} caught up at offset {ack}")
        elif node in self.wanted and node != self.me:
            self._check(node, progress, max_offset, now)

    def gone(self, node: str) -> None:
        """
        Replica C{node} has no connection left.
        """
        self._progress.pop(node, None)
        if node in self.wanted and node != self.me:
            self._want(self.wanted - {node}, f"{node} disconnected")

    def check(self, max_offset: int) -> None:
        """
        Drop members that fell behind (call now and then, and as the log
        grows).
        """
        now = self._clock.seconds()
        for node in sorted(self.wanted - {self.me}):
            progress = self._progress.get(node)
            if progress is None:
                if now - self._started > self._catchup_timeout:
                    self._want(self.wanted - {node}, f"{node} is not connected")
            else:
                self._check(node, progress, max_offset, now)

    def _check(self, node: str, progress: _Progress, max_offset: int, now: float) -> None:
        behind = max_offset - progress.ack
        if behind > self._fallbehind_max:
            self._want(
                self.wanted - {node},
                f"{node} is {behind} bytes behind (haSlaveFallbehindMax {self._fallbehind_max})",
            )
        elif behind <= 0:
            progress.behind_since = None
        elif progress.behind_since is None:
            progress.behind_since = now
        elif now - progress.behind_since > self._catchup_timeout:
            self._want(
                self.wanted - {node},
                f"{node} has been behind for {now - progress.behind_since:.1f} s",
            )

    def _want(self, wanted: frozenset[str], why: str) -> None:
        if wanted == self.wanted:
            return
        before = self.effective
        self.wanted = wanted
        self._log.info(
            "in-sync set: {why}; now {members}",
            why=why,
            members=",".join(sorted(wanted)),
        )
        if self.effective != before:
            self._changed()
        self._flush()

    def _flush(self) -> None:
        if (
            self._publishing
            or self._stopped
            or self._retry is not None
            or self.wanted == self.published
        ):
            return
        self._publishing = True
        sending = self.wanted
        d = self._publish(tuple(sorted(sending)))

        def done(stored: bool | Failure) -> None:
            self._publishing = False
            if self._stopped:
                return
            if stored is True:
                before = self.effective
                self.published = sending
                if self.effective != before:
                    self._changed()
                self._flush()
            elif isinstance(stored, Failure):
                # The coordinator did not answer: the union rule keeps
                # every put safe meanwhile; try again shortly (the lease
                # decides whether this node stays master).
                self._log.warn(
                    "could not publish the in-sync set {members}: {why}; retrying",
                    members=",".join(sorted(sending)),
                    why=stored.getErrorMessage(),
                )
                self._retry = self._clock.callLater(PUBLISH_RETRY, self._retried)
            else:
                for observer in self.observers:
                    observer.in_sync_lost(
                        "the coordinator refused the in-sync set: not the leader any more"
                    )

        d.addBoth(done)

    def _retried(self) -> None:
        self._retry = None
        self._flush()

    def stop(self) -> None:
        self._stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
