# -*- test-case-name: tests.test_coordinator -*-
"""
A master's part in a switchover (C{rmqha cluster switchover}; docs/failover.md,
"Operating it"): stop taking puts, wait until the target holds every put,
then step down so that the target, first in the ranking, is elected.

The coordinator (L{rmqha.coord.node.Coordinator}) owns the leadership and
steps down; L{Handover} holds the switchover in progress, writes it into
the fence (puts are refused while it lasts), and says at each decision
what the master waits for or that it hands over now.
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.logger import Logger

from rmqha.broker import Broker
from rmqha.coord.dcs import IDCS, DCSError, Switchover
from rmqha.ha.fence import Fence
from rmqha.ha.insync import InSyncSet
from rmqha.ha.masterside import MasterSide


@dataclass(frozen=True)
class Step:
    """
    Where a switchover stands.

    @ivar note: what the master waits for (for /status), if it waits.
    @ivar hand_over: why the master steps down now, if it does.
    """

    note: str | None = None
    hand_over: str | None = None


class Handover:
    """
    The switchover this master is handing over in, if any (the fence's
    C{handing_over}), and the steps towards it.
    """

    _log = Logger()

    def __init__(self, dcs: IDCS, fence: Fence, broker: Broker, node_id: str) -> None:
        self._dcs = dcs
        self._fence = fence
        self._broker = broker
        self._node_id = node_id
        self._switch: Switchover | None = None

    @property
    def switch(self) -> Switchover | None:
        """
        The switchover this master is handing over in, if any.
        """
        return self._switch

    def _set(self, switch: Switchover | None) -> None:
        self._switch = switch
        self._fence.handing_over = switch.target if switch is not None else None

    def end(self) -> None:
        """
        This master no longer leads (or no switchover is pending): take
        puts again should it lead.
        """
        self._set(None)

    async def advance(self, switch: Switchover | None, in_sync: InSyncSet | None) -> Step:
        """
        The leading master's view names C{switch} (or none): clear one not
        meant for this master, wait for the target to be in the published
        in-sync set, then stop taking puts until the target holds every
        one, then hand over.
        """
        if switch is None:
            self.end()
            return Step()
        if switch.leader != self._node_id or switch.target == self._node_id:
            try:
                await self._dcs.clear_switchover(switch)
            except DCSError:
                pass
            return Step()
        side = self._broker.role_service
        if in_sync is None or not isinstance(side, MasterSide) or side.factory is None:
            return Step()
        target = switch.target
        if target not in in_sync.published:
            return Step(note=f"switchover to {target}: waiting for it to be in sync")
        # Stop taking puts, let the target catch up with the last of them,
        # then hand the key over (the target goes first in the ranking).
        self._set(switch)
        acks = side.replicas.node_acks()
        if acks.get(target, -1) < self._broker.commitlog.max_offset:
            return Step(note=f"switchover to {target}: waiting for it to hold every put")
        self._log.info("switchover: handing over to {target}", target=target)
        return Step(hand_over=f"switchover to {target}")
