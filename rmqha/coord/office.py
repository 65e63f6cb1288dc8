# -*- test-case-name: tests.test_coordinator,tests.test_insync -*-
"""
A failover master's in-sync set as its coordinator keeps it: made when the
node takes office, published in the DCS under its leadership, ended when
it steps down (docs/failover.md, "The in-sync set").

L{InSyncOffice} is what the set observes besides the master's HA service:
etcd refusing the set ends the leadership, through the step-down the
coordinator (L{rmqha.coord.node.Coordinator}) gave it when it was built.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from rmqha.coord.dcs import IDCS, InSync, Leader, in_sync_members
from rmqha.ha.insync import InSyncSet
from rmqha.ha.interfaces import IInSyncObserver
from rmqha.ha.masterside import MasterSide


@implementer(IInSyncObserver)
class InSyncOffice:
    """
    @ivar in_sync: the master's in-sync set, while this node leads.
    """

    def __init__(
        self,
        reactor: IReactorTime,
        dcs: IDCS,
        catchup_timeout: float,
        *,
        leader: Callable[[], Leader | None],
        step_down: Callable[[str], object],
    ) -> None:
        """
        @param leader: this node's leadership now (the coordinator's), under
            which the set is published.
        @param step_down: ends the leadership, with why.
        """
        self._reactor = reactor
        self._dcs = dcs
        self._catchup_timeout = catchup_timeout
        self._leader = leader
        self._step_down = step_down
        self.in_sync: InSyncSet | None = None

    def open(self, won: Leader, carried: tuple[str, ...], side: MasterSide, fallbehind_max: int) -> None:
        """
        This node took office at C{won.epoch}, with an in-sync set of
        itself and C{carried} (what the campaign wrote), and its broker's
        master side is C{side}: make the set and give it to C{side}'s HA
        service.
        """
        in_sync = self.in_sync = InSyncSet(
            self._reactor,
            won.node_id,
            self._publish,
            fallbehind_max=fallbehind_max,
            catchup_timeout=self._catchup_timeout,
            published=in_sync_members(won.node_id, carried),
            observers=(side.ha, self),
        )
        side.ha.use_in_sync(in_sync)

    def close(self) -> None:
        """
        This node stepped down: the set ends.
        """
        if self.in_sync is not None:
            self.in_sync.stop()
            self.in_sync = None

    def in_sync_changed(self) -> None:
        """
        The in-sync set changed: the master's HA service moves its quorum
        (it observes the set too); nothing here.
        """

    def in_sync_lost(self, why: str) -> None:
        """
        etcd refused the in-sync set: this node is no longer the leader.
        """
        self._step_down(why)

    def _publish(self, members: tuple[str, ...]) -> Deferred[bool]:
        leader = self._leader()
        if leader is None:
            return Deferred.fromCoroutine(_false())
        d = self._dcs.publish_in_sync(InSync(leader.epoch, members), leader)
        return d.addCallback(lambda written: written is not None)


async def _false() -> bool:
    return False
