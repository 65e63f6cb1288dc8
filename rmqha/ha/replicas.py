# -*- test-case-name: tests.test_master,tests.test_group,tests.test_wiring -*-
"""
A master's replicating connections as the rest of the master sees them.

L{Replicas} holds the connections (L{rmqha.ha.master.MasterConnection})
and answers what they have acknowledged (L{IReplicaAcks}): the
L{rmqha.ha.group.HAService} reads it, the connections write it.

L{EarlyFrames} decides when appended bytes are sent to the slaves: the
first append of a reactor turn at once, the rest of the turn together at
its end, and, while the slaves' acks release waiting puts, what those
puts' callbacks append in one go at the release's end -- or earlier, in
pieces, once there are enough of them.  It is the
L{IReleaseListener} the waiting puts are released with.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterator, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from rmqha.ha.auth import GroupAuth
from rmqha.ha.fence import OPEN
from rmqha.ha.interfaces import (
    IAppendedTo,
    IFence,
    IReleaseListener,
    IReplicaAcks,
    provides,
)



class MasterConnection(Protocol):
    """
    What the registry reads of a master's connection to a slave
    (L{rmqha.ha.master.MasterConnection}).
    """

    peer: str
    peer_host: str
    identity: str | None
    replica_id: str | None
    refused_node: bool
    ack_offset: int | None

    @property
    def failover_node(self) -> str | None: ...

    @property
    def replicating(self) -> bool: ...

    @property
    def replica(self) -> str: ...

    def drop(self, why: str, last_words: bytes | None = None, **fields: Any) -> None: ...

    def delivers_acks(self, now: float, max_offset: int, timeout: float) -> bool: ...

    def delivers_until(self, now: float, timeout: float) -> float: ...

    def data_available(self) -> None: ...

    def early_at(self) -> int | None: ...

__all__ = ["DEFAULT_LINK_TIMEOUT", "EarlyFrames", "Replicas"]

#: Seconds a replica may owe an ack (the master's log ends past its last
#: one) and still count as connected: a link cut without a reset (a
#: partition, a paused peer) delivers nothing but stays open until the
#: housekeeping timeout (20 s); it stops counting this long after an ack
#: is owed (docs/sync.md, "Who counts as connected").  The same second as
#: the in-sync set's catch-up timeout
#: (L{rmqha.ha.insync.DEFAULT_CATCHUP_TIMEOUT}).
DEFAULT_LINK_TIMEOUT = 1.0

# (No connection wants the released puts sent early.)
_NEVER = 1 << 63
_FOREVER = float("inf")


@implementer(IReplicaAcks)
class Replicas:
    """
    The master's slave connections and their acks.

    @ivar connections: every open connection (control sessions included).
    """

    _log = Logger(namespace="rmqha.ha.master.MasterFactory")

    def __init__(
        self,
        clock: IReactorTime,
        appended: IAppendedTo,
        *,
        fence: IFence = OPEN,
        auth: GroupAuth | None = None,
        link_timeout: float = DEFAULT_LINK_TIMEOUT,
    ) -> None:
        """
        @param appended: the master's log (how far a link owes acks).
        @param fence: whose acks count (failover mode).
        @param auth: how slaves prove their node ids (failover), for the
            warning about a replica that only declares one.
        @param link_timeout: seconds an ack may be owed before a replica's
            link stops counting as connected
            (L{MasterConnection.delivers_acks}).
        """
        self._clock = clock
        self._appended = provides(IAppendedTo, appended, "appended")
        self._fence = provides(IFence, fence, "fence")
        self._auth = auth
        self._link_timeout = link_timeout
        self.connections: set[MasterConnection] = set()
        # live_count's last pass, while it holds (every SYNC put asks):
        # (until, lowest ack, count) -- see _count_live.
        self._live_memo: tuple[float, int, int] | None = None

    @property
    def link_timeout(self) -> float:
        """
        Seconds an ack may be owed before a replica's link stops counting
        as connected (L{MasterConnection.delivers_acks}).
        """
        return self._link_timeout

    @link_timeout.setter
    def link_timeout(self, seconds: float) -> None:
        self._link_timeout = seconds
        self.changed()

    def changed(self) -> None:
        """
        A connection acknowledged, started replicating or stopped: what
        L{live_count} remembers of its last pass no longer holds.  The
        connections call it (through their factory, for acks).
        """
        self._live_memo = None

    def counted_node(self, connection: MasterConnection) -> str | None:
        """
        Failover mode: the node C{connection}'s acks count for, if any:
        its node id as the group requires it proven
        (L{MasterConnection.failover_node}), if the fence accepts that
        node (a live member: docs/failover.md, "Who counts").
        """
        node = connection.failover_node
        if node is None:
            declared = connection.replica_id
            if declared is not None and not connection.refused_node:
                connection.refused_node = True
                self._log.warn(
                    "slave {peer} declares node id {node} {why}: it may copy the log, "
                    "but its acks never count",
                    peer=connection.peer,
                    node=declared,
                    why=f"without proving it ({self._auth.mode} required)"
                    if self._auth is not None
                    else f"but its TLS certificate is {connection.identity}'s",
                )
            return None
        if self._fence.accepts_node(node, connection.peer_host):
            return node
        if not connection.refused_node:
            connection.refused_node = True
            self._log.warn(
                "slave {peer} is node {node}, which is not a live member of the "
                "group: its acks do not count",
                peer=connection.peer,
                node=node,
            )
        return None

    def replace_older(self, connection: MasterConnection) -> None:
        """
        C{connection} is replicating: drop any other connection of the
        same replica (L{MasterConnection.replica}), so each replica counts
        once in the quorum.
        """
        replica = connection.replica
        for other in list(self.connections):
            if other is not connection and other.replicating and other.replica == replica:
                other.drop(
                    "replaced by a newer connection of {replica} from {newer}",
                    replica=replica,
                    newer=connection.peer,
                )

    def serves(self, node: str) -> bool:
        """
        Whether some connection is node C{node}'s (proven).
        """
        return any(c.failover_node == node for c in self.connections)

    # -- IReplicaAcks -------------------------------------------------------

    def ack_offsets(self) -> list[int]:
        """
        The ack of every replicating slave that has acknowledged anything:
        one per replica (L{replace_older}).
        """
        return [
            c.ack_offset
            for c in self.connections
            if c.ack_offset is not None and c.replicating
        ]

    def node_acks(self) -> dict[str, int]:
        """
        Failover mode: the highest ack of each replicating counted node.
        """
        acks: dict[str, int] = {}
        for c in self.connections:
            node = self.counted_node(c)
            if node is not None and c.ack_offset is not None and c.replicating:
                acks[node] = max(acks.get(node, -1), c.ack_offset)
        return acks

    def _delivering(self) -> Iterator[MasterConnection]:
        """
        The replicating connections whose links deliver acks
        (L{MasterConnection.delivers_acks}).
        """
        now = self._clock.seconds()
        end = self._appended.max_offset
        timeout = self.link_timeout
        return (c for c in list(self.connections) if c.delivers_acks(now, end, timeout))

    def live_count(self, past: int = -1) -> int:
        """
        How many slaves' links deliver acks (one per replica) with an ack
        past offset C{past} (any ack: -1).
        """
        # (Every SYNC put asks this as it waits: the answer of the last
        # pass over the links, while it holds, costs a clock reading.)
        now = self._clock.seconds()
        memo = self._live_memo
        if memo is not None and now < memo[0] and past < memo[1]:
            return memo[2]
        return self._count_live(now, past)

    def _count_live(self, now: float, past: int) -> int:
        """
        L{live_count}'s pass over the links, remembered while its answer
        cannot change: B{every} link that delivers acks keeps delivering
        until the earliest moment one of them would have owed an ack for
        C{link_timeout} (counted from now for a link that owes none now:
        it owes from when the log next grows, later), and any C{past}
        below the lowest of their acks counts all of them.  What else
        changes the answer -- an ack, a link that starts replicating or
        stops -- calls L{changed}, which forgets it.  (The log's end is
        not watched: a master's log only grows, which moves no link from
        owing to not owing.)
        """
        end = self._appended.max_offset
        timeout = self._link_timeout
        count = delivering = 0
        lowest = _NEVER
        until = _FOREVER
        for c in self.connections:
            ack = c.ack_offset
            if ack is None or not c.delivers_acks(now, end, timeout):
                continue
            delivering += 1
            if ack > past:
                count += 1
            if ack < lowest:
                lowest = ack
            # (A microsecond early: delivers_acks compares now - owed with
            # the timeout, this the sum, and floats may round apart.)
            mine = c.delivers_until(now, timeout) - 1e-6
            if mine < until:
                until = mine
        self._live_memo = (until, lowest, delivering)
        return count

    def live_nodes(self) -> set[str]:
        """
        Failover mode: the counted nodes whose links deliver acks.
        """
        return {node for c in self._delivering() if (node := self.counted_node(c)) is not None}

    # -- waking the connections ---------------------------------------------

    def wake(self) -> None:
        """
        The log grew: every connection sends what it can.
        """
        for connection in list(self.connections):
            connection.data_available()

    def next_early(self) -> int:
        """
        The log's end from which some connection is to be sent released
        puts early (L{rmqha.ha.master.Transfer.early_at}).
        """
        at = _NEVER
        for connection in self.connections:
            mine = connection.early_at()
            if mine is not None and mine < at:
                at = mine
        return at

    def wake_early(self, end: int) -> None:
        """
        Wake the connections whose early point C{end} has reached.
        """
        for connection in list(self.connections):
            at = connection.early_at()
            if at is not None and end >= at:
                connection.data_available()


class _Release(enum.Enum):
    """
    Where L{EarlyFrames} is in a release of waiting puts.
    """

    #: No release runs.
    NONE = "none"
    #: A release fires puts: their appends wait for its end (or the early
    #: point).
    RUNNING = "running"
    #: The release fires its last put: that put's first append goes at
    #: once.
    LAST = "last"


@implementer(IReleaseListener)
class EarlyFrames:
    """
    When appended bytes are sent to the slaves (the early-frames policy).

    Outside a release, the first append of a reactor turn is sent at once
    (a lone put does not wait a turn) and the appends that follow in the
    same turn together on the next turn, so a burst travels in frames of up
    to a batch, not one frame per message.

    The re-entrancy rule, the only one: B{a release's puts append from
    inside the release} (their callbacks run there), so while a release
    runs (L{release}), appends are not sent one by one: they are sent when
    the release returns, or earlier in pieces once a connection's early
    point is reached (L{Replicas.next_early}); and the first append of the
    last put it fires goes at once, with every unsent append before it (as
    a lone put would: nothing later in the release to wait for).  A
    release asked for from inside a release is the running one.  (The
    put path holds the puts those callbacks make while more are to fire
    -- L{gathering} -- and stores them together, at the release's end
    -- L{at_release_end} -- or in batches that append as one.)
    """

    _log = Logger(namespace="rmqha.ha.master.MasterFactory")

    def __init__(self, clock: IReactorTime, replicas: Replicas, appended: IAppendedTo) -> None:
        self._clock = clock
        self._replicas = replicas
        self._appended = provides(IAppendedTo, appended, "appended")
        # The end-of-turn call, while one is pending.
        self._turn: IDelayedCall | None = None
        # Appended since the connections were last woken.
        self._pending = False
        self._release = _Release.NONE
        # (While a release runs: the log's end from which some connection
        # is sent early.)
        self._early_at = _NEVER
        # (While a release runs: what to call once its puts have fired:
        # at_release_end.)
        self._at_end: list[Callable[[], object]] = []

    @property
    def releasing(self) -> bool:
        """
        Whether a release of waiting puts runs now (the code running is a
        released put's callback, or the release itself).
        """
        return self._release is not _Release.NONE

    @property
    def gathering(self) -> bool:
        """
        Whether puts made now have later ones to travel with: a release of
        waiting puts runs and the put whose callback runs is not the last
        it fires (the put path gathers them, to store at the release's
        end: L{at_release_end}).  The last put's callback's first put goes
        at once, as a lone put's would.
        """
        return self._release is _Release.RUNNING

    def at_release_end(self, call: Callable[[], object]) -> None:
        """
        While a release runs: call C{call} once every put it releases has
        been fired, before what they appended is sent (the put path
        stores there the puts those callbacks made: docs/sync.md, "Puts
        released together are stored together").  What C{call} itself
        releases or registers runs in the same release.  A C{call} that
        raises is logged.
        """
        if self._release is _Release.NONE:
            raise RuntimeError("no release runs")
        self._at_end.append(call)

    def appended(self, end: int | None = None) -> None:
        """
        The log grew (to C{end}, if known): send it now or later (see the
        class).
        """
        replicas = self._replicas
        if not replicas.connections:
            return
        release = self._release
        if release is _Release.LAST:
            # The last put this release fires: nothing after it to batch
            # with, so its first append goes at once, with all the
            # release's unsent appends, before that put even returns (the
            # rest of its callback's appends, at the end).
            self._release = _Release.RUNNING
            self._pending = False
            replicas.wake()
            return
        if release is _Release.RUNNING:
            self._pending = True
            if end is None:
                end = self._appended.max_offset
            if end >= self._early_at:
                replicas.wake_early(end)
                self._early_at = replicas.next_early()
            return
        if self._turn is None:
            self._turn = self._clock.callLater(0, self._end_of_turn)
            replicas.wake()
        else:
            self._pending = True

    def _end_of_turn(self) -> None:
        self._turn = None
        if self._pending:
            self._pending = False
            self._replicas.wake()

    def release(self, fire: Callable[[], object]) -> None:
        """
        Run C{fire} (the release of waiting puts) under the rule of the
        class: what its puts' callbacks append is sent as the last of them
        appends, or when C{fire} returns, still in this reactor turn.
        """
        if self._release is not _Release.NONE:
            return
        self._release = _Release.RUNNING
        self._early_at = self._replicas.next_early()
        try:
            fire()
        finally:
            try:
                while self._at_end:
                    calls, self._at_end = self._at_end, []
                    for call in calls:
                        try:
                            call()
                        except Exception:
                            self._log.failure("the end of a release failed")
            finally:
                self._release = _Release.NONE
        if self._pending:
            self._pending = False
            self._replicas.wake()

    def last_of_release(self) -> None:
        """
        The release is about to fire its last put (L{IReleaseListener}).
        """
        if self._release is _Release.RUNNING:
            self._release = _Release.LAST

    def firing_last(self) -> bool:
        """
        Whether the release is firing its last put: when that put answers
        several (puts stored together, which waited once), it calls
        L{more_to_fire} first and L{last_of_release} again before its last
        answer.
        """
        return self._release is _Release.LAST

    def more_to_fire(self) -> None:
        """
        The last put of the release answers more than one: not the last
        answer yet (see L{firing_last}).
        """
        if self._release is _Release.LAST:
            self._release = _Release.RUNNING

    def stop(self) -> None:
        """
        The master stops: nothing more is sent at a turn's end.
        """
        if self._turn is not None and self._turn.active():
            self._turn.cancel()
        self._turn = None
        self._pending = False
