# -*- test-case-name: tests.test_coordinator -*-
"""
The role a failover coordinator gives its broker while it does not lead:
follow the elected master, or stand by; one change awaited at a time.

L{RoleChanges} asks the broker (L{rmqha.broker.Broker.become_slave},
L{rmqha.broker.Broker.stand_by}) and tells the coordinator
(L{rmqha.coord.node.Coordinator}) when a change has settled, through the
callable it was built with, so that the group is looked at again.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure

from rmqha.broker import Broker
from rmqha.coord.dcs import Leader
from rmqha.ha.roles import Superseded


class RoleChanges:
    """
    @ivar following: the HA address of the master this node follows.
    @ivar changing: the role change under way, if any.
    """

    _log = Logger()

    def __init__(
        self,
        broker: Broker,
        dial: Callable[[str, str], str | IStreamClientEndpoint],
        settled: Callable[[], object],
    ) -> None:
        """
        @param dial: the client endpoint for a master's advertised HA
            address and node id.
        @param settled: called once each change has ended (done, failed or
            superseded).
        """
        self._broker = broker
        self._dial = dial
        self._settled = settled
        self.following: str | None = None
        self._following_epoch = 0
        self.changing: Deferred[Any] | None = None

    def follow(self, leader: Leader) -> None:
        """
        Follow C{leader}, unless this node already does (at its epoch).
        """
        if (
            self.following == leader.ha
            and self._following_epoch == leader.epoch
            and self._broker.role_service is not None
        ):
            return
        # (A new epoch of the same master is followed afresh too: the
        # slave checks epochs again and adopts the new list.)
        self.following = leader.ha
        self._following_epoch = leader.epoch
        self._log.info(
            "following master {master} (epoch {epoch}) at {address}",
            master=leader.node_id,
            epoch=leader.epoch,
            address=leader.ha,
        )
        self._change(
            self._broker.become_slave(
                self._dial(leader.ha, leader.node_id), leader=(leader.node_id, leader.epoch)
            )
        )

    def stand_by(self) -> None:
        """
        Follow nobody: keep what was replicated, take no role.
        """
        self.following = None
        self._change(self._broker.stand_by())

    def leading(self) -> None:
        """
        This node takes office: it follows nobody (the coordinator makes
        the broker master itself).
        """
        self.following = None

    def _change(self, d: Deferred[Any]) -> None:
        self.changing = d

        def done(result: object) -> None:
            self.changing = None
            if isinstance(result, Failure) and not result.check(Superseded):
                self._log.failure("role change failed", result)
            self._settled()

        d.addBoth(done)
